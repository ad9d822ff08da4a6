#!/usr/bin/env bash
# Side by side on the same servers, in one run: locksmith's `bench` figures against its Redis
# peers, each through its own client with its default options (issue 38):
#   - python-redis-lock (PyPI): 4 processes hand one lock around (its waiters BLPOP a signal
#     list the release pushes): rate and fairness;
#   - rslock (crates.io), on one Redis and on the 5 Redlock masters: uncontended lock + unlock
#     p50, and 4 processes looping acquire + unlock (it re-grabs: rate and fairness);
#   - a bare PUBLISH received by another process (rslock-bench's `pubsub` mode, no lock): the
#     floor of any hand-over by message on this machine, beside a PING round trip;
#   - locksmith (`locksmith bench`, release build) on the same URLs.
# Prints one table with the ratios and issue 38's goals. Not part of the test command.
#
#   scripts/bench-peers.sh                     the test servers (scripts/servers.sh env)
#   REDIS_URL=redis://h:6379 REDLOCK_URLS=redis://h1:6379,...,redis://h5:6379 scripts/bench-peers.sh
#
# REDLOCK_URLS (rslock's form, five redis:// URLs) gives locksmith's redlock:// URL too; empty
# skips Redlock. BENCH_PEERS_SECS (default 10) is each run's length. Installs what it needs:
# a venv with python-redis-lock under target/peers/venv (Debian's python3-venv if venv is
# missing), and builds scripts/peers/rslock-bench (its own workspace and Cargo.lock) and the
# locksmith command with --release. URLs go to the programs through their environment, not argv.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$root/target/peers"
mkdir -p "$out"
secs="${BENCH_PEERS_SECS:-10}"
procs=4

if [[ -z "${REDIS_URL:-}" && -z "${LOCK_TEST_REDIS_URL:-}" ]]; then
    eval "$(bash "$root/scripts/servers.sh" env)"
fi
redis_url="${REDIS_URL:-${LOCK_TEST_REDIS_URL:?no Redis URL: set REDIS_URL}}"
redlock_urls="${REDLOCK_URLS-${LOCK_TEST_REDLOCK_URLS:-}}"
redlock_url=""
if [[ -n "$redlock_urls" ]]; then
    # redis://a:1,redis://b:2,... -> redlock://a:1,b:2,... (plain URLs: no password, db or TLS)
    redlock_url="redlock://$(echo "$redlock_urls" | sed -e 's#redis://##g' -e 's#/\([,]\|$\)#\1#g')"
fi

say() { echo "[bench-peers] $*" >&2; }

# --- installs and builds ----------------------------------------------------------------------
venv="$out/venv"
if [[ ! -x "$venv/bin/python" ]]; then
    say "creating $venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
        rm -rf "$venv"
        say "python3 -m venv failed: installing Debian's python3-venv"
        apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$venv"
    fi
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check "python-redis-lock==4.0.1" "redis>=4,<8"
say "building rslock-bench and locksmith (--release)"
cargo build -q --release --locked --manifest-path scripts/peers/rslock-bench/Cargo.toml \
    --target-dir "$out/rslock-target"
cargo build -q --release -p locksmith-cli
rslock="$out/rslock-target/release/rslock-bench"
locksmith="$root/target/release/locksmith"

# --- the runs -------------------------------------------------------------------------------
load() { cut -d' ' -f1 /proc/loadavg; }
results="$out/results.txt"
: >"$results"
record() { echo "$1 $2" >>"$results"; }
load_start="$(load)"
started="$(date -u '+%Y-%m-%d %H:%M UTC')"

# The server's count of script calls (EVALSHA: python-redis-lock's release is one) around the
# python-redis-lock run: an outside view of its hand-over count (server-wide: other clients of
# the server are in it too).
evalsha_calls() {
    "$venv/bin/python" - <<'EOF'
import os, redis
stats = redis.StrictRedis.from_url(os.environ["PEERS_REDIS_URL"]).info("commandstats")
print(stats.get("cmdstat_evalsha", {}).get("calls", 0))
EOF
}
export PEERS_REDIS_URL="$redis_url"
say "python-redis-lock: $procs processes, ${secs} s"
before="$(evalsha_calls)"
record prl "$("$venv/bin/python" scripts/peers/python_redis_lock_bench.py contend "$procs" "$secs")"
record prl_evalsha "$(($(evalsha_calls) - before))"

say "rslock on one Redis: uncontended p50, then $procs processes (${secs} s each)"
record rslock_p50 "$(RSLOCK_BENCH_URLS="$redis_url" "$rslock" p50 "$secs")"
record rslock "$(RSLOCK_BENCH_URLS="$redis_url" "$rslock" contend "$procs" "$secs")"
# The floor of any hand-over by message on this machine: a PUBLISH until another (idle)
# process's task has it, no lock at all, beside a PING round trip.
say "a bare PUBLISH to another process (the floor of a hand-over by message), ${secs} s"
record pubsub "$(RSLOCK_BENCH_URLS="$redis_url" "$rslock" pubsub "$secs")"
locksmith_urls=("$redis_url")
if [[ -n "$redlock_urls" ]]; then
    say "rslock on the Redlock masters: uncontended p50, then $procs processes (${secs} s each)"
    record rslock_rl_p50 "$(RSLOCK_BENCH_URLS="$redlock_urls" "$rslock" p50 "$secs")"
    record rslock_rl "$(RSLOCK_BENCH_URLS="$redlock_urls" "$rslock" contend "$procs" "$secs")"
    locksmith_urls+=("$redlock_url")
fi

say "locksmith bench (default options) on ${locksmith_urls[*]%%\?*}"
"$locksmith" bench --secs "$secs" --processes "$procs" --fair-processes "$procs" \
    --fair-secs "$secs" --markdown "$out/locksmith.md" "${locksmith_urls[@]}" >&2

# --- the table ------------------------------------------------------------------------------
python3 - "$results" "$out/locksmith.md" "$started" "$load_start" "$(load)" "$secs" <<'EOF'
import re, sys

results_path, md_path, started, load_start, load_end, secs = sys.argv[1:]
peers = {}
for line in open(results_path):
    key, _, rest = line.strip().partition(" ")
    words = rest.split()
    if len(words) == 1:
        peers[key] = {"value": float(words[0])}
        continue
    fields, i = {}, 0
    while i < len(words):
        if words[i] == "counts":
            j = i + 1
            while j < len(words) and words[j].isdigit():
                j += 1
            fields["counts"] = words[i + 1 : j]
            i = j
        else:
            fields[words[i]] = float(words[i + 1])
            i += 2
    peers[key] = fields

# locksmith's rows, from the Markdown table `locksmith bench --markdown` wrote.
rows = [l.strip().strip("|").split("|") for l in open(md_path) if l.startswith("|")]
header = [c.strip() for c in rows[0]]
ls = {}
for r in rows[2:]:
    cells = dict(zip(header, (c.strip() for c in r)))
    ls[cells["backend"]] = cells

def num(cell):
    m = re.match(r"-?[0-9.]+", cell or "")
    return float(m.group()) if m else None

def row_of(prefix):
    return next((v for k, v in ls.items() if k.startswith(prefix)), None)

redis, redlock = row_of("redis"), row_of("redlock")
table = [("figure", "locksmith", "peer", "ratio", "goal", "met")]

def add(figure, mine, peer, ratio, goal, met, digits=1):
    fmt = lambda v: "-" if v is None else (f"{v:,.{digits}f}" if isinstance(v, float) else str(v))
    table.append((figure, fmt(mine), fmt(peer),
                   "-" if ratio is None else f"{ratio:.2f}x", goal,
                   "-" if met is None else ("yes" if met else "NO")))

def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b

if redis:
    p50 = num(redis["p50 µs"])
    peer = peers.get("rslock_p50", {}).get("p50_us")
    r = ratio(p50, peer)
    add("Redis uncontended p50 µs (rslock)", p50, peer, r, "<= 1.15x", r is not None and r <= 1.15)
    procs = num(redis["procs/s"])
    prl = peers.get("prl", {}).get("per_sec")
    r = ratio(procs, prl)
    add(f"Redis {len(peers.get('prl', {}).get('counts', []))}-process hand-overs/s (python-redis-lock)",
        procs, prl, r, "> 1x", r is not None and r > 1)
    r = ratio(procs, 3418.0)
    add("Redis 4-process hand-overs/s (issue 38's 3,418)", procs, 3418.0, r, ">= 2x",
        r is not None and r >= 2)
    rs = peers.get("rslock", {}).get("per_sec")
    add("Redis 4-process rate (rslock re-grabbing)", procs, rs, ratio(procs, rs), "-", None)
    fair = num(redis["fair min/share"])
    add("Redis fewest/fair share, locksmith vs python-redis-lock", fair,
        peers.get("prl", {}).get("min_share"), None, "fair", None, digits=2)
    add("Redis fewest/fair share, rslock", None,
        peers.get("rslock", {}).get("min_share"), None, "-", None, digits=2)
    hx = num(redis["hand-over x rtt"])
    add("Redis hand-over p50 over rtt", hx, None, None, "<= 1.5", hx is not None and hx <= 1.5, digits=2)
    ps = peers.get("pubsub", {})
    if ps:
        ho = num(redis["hand-over µs"])
        add("Redis hand-over p50 µs (floor: a bare PUBLISH to another process)", ho,
            ps.get("p50_us"), ratio(ho, ps.get("p50_us")), "-", None)
        add("  that floor over its own PING rtt", ratio(ps.get("p50_us"), ps.get("rtt_us")), None,
            None, "-", None, digits=2)
    sent = num(redis["sent/hand-over"])
    add("Redis requests sent per hand-over, 100 waiters (steady window)", sent, None, None, "<= 2",
        sent is not None and sent <= 2, digits=2)
    add("  and sent once per waiter (start-up and tear-down)", num(redis.get("sent once/waiter")),
        None, None, "-", None)
if redlock:
    p50 = num(redlock["p50 µs"])
    peer = peers.get("rslock_rl_p50", {}).get("p50_us")
    add("Redlock uncontended p50 µs (rslock)", p50, peer, ratio(p50, peer), "-", None)
    procs = num(redlock["procs/s"])
    rs = peers.get("rslock_rl", {}).get("per_sec")
    r = ratio(procs, rs)
    add("Redlock 4-process hand-overs/s (rslock unfair)", procs, rs, r, ">= 1x",
        r is not None and r >= 1)
    add("Redlock fewest/fair share, locksmith vs rslock", num(redlock["fair min/share"]),
        peers.get("rslock_rl", {}).get("min_share"), None, "-", None, digits=2)
    sent = num(redlock["sent/hand-over"])
    add("Redlock requests sent per hand-over, 100 waiters (steady window)", sent, None, None,
        "<= 10", sent is not None and sent <= 10, digits=2)
    add("  and sent once per waiter (start-up and tear-down)",
        num(redlock.get("sent once/waiter")), None, None, "-", None)

widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
print(f"\nSide by side, {started}, {secs} s runs, load average (1 min) {load_start} at the start, "
      f"{load_end} at the end (a busy machine moves every figure: compare ratios within one run)")
for i, r in enumerate(table):
    print("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
    if i == 0:
        print("  ".join("-" * w for w in widths))
for key, label in [("prl", "python-redis-lock"), ("rslock", "rslock on Redis"),
                   ("rslock_rl", "rslock on Redlock")]:
    if key in peers:
        print(f"{label}: per-process counts {' '.join(peers[key]['counts'])}")
if "prl_evalsha" in peers and "prl" in peers:
    handed = sum(int(c) for c in peers["prl"]["counts"])
    print(f"outside view: the server counted {int(peers['prl_evalsha']['value'])} EVALSHA during "
          f"the python-redis-lock run, which counted {handed} hand-overs (one release script "
          f"each; server-wide, so other clients add to it)")
print(f"locksmith's own table: {md_path}")
EOF
