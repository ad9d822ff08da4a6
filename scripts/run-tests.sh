#!/usr/bin/env bash
# Builds every test binary of the workspace once, then runs them side by side.
#
#   scripts/run-tests.sh [CARGO ARGS...] [-- TEST ARGS...]
#
# Most of the suite's time is waiting (TTLs, expiries, fault recovery), not CPU, and
# `cargo test` runs one test binary after another: here up to LOCKSMITH_TEST_JOBS binaries
# (default 4) run at once, the longest first, each with its own log, printed whole when it ends
# (never interleaved). Doctests run as one more job. The binaries keep apart by themselves:
# every test takes unique lock names on the shared servers, and a test that stops, restarts or
# partitions a server starts its own (faultkit, free ports).
#
# At the end: a table of wall time per binary (slowest first) and the binaries that failed.
# Exit status: 0 when every binary passed.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

JOBS=${LOCKSMITH_TEST_JOBS:-4}
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || {
  echo "run-tests: LOCKSMITH_TEST_JOBS must be a positive integer, not '$JOBS'" >&2
  exit 2
}
# The longest one job may run, in seconds: a job still running then is killed (with its child
# processes) and fails, so a hang costs one job, named, never the whole run's time budget. The
# slowest job takes about 10 minutes on a 2-core machine.
JOB_LIMIT=${LOCKSMITH_TEST_JOB_LIMIT:-1200}
[[ $JOB_LIMIT =~ ^[1-9][0-9]*$ ]] || {
  echo "run-tests: LOCKSMITH_TEST_JOB_LIMIT must be a positive number of seconds, not '$JOB_LIMIT'" >&2
  exit 2
}

CARGO_ARGS=()
BIN_ARGS=()
seen_sep=0
for a in "$@"; do
  if ((seen_sep)); then
    BIN_ARGS+=("$a")
  elif [[ $a == -- ]]; then
    seen_sep=1
  else
    CARGO_ARGS+=("$a")
  fi
done
# Without -p/--package, the whole workspace.
if [[ " ${CARGO_ARGS[*]-} " != *" -p "* && " ${CARGO_ARGS[*]-} " != *" --package"* ]]; then
  CARGO_ARGS=(--workspace "${CARGO_ARGS[@]}")
fi

now_us() { echo "${EPOCHREALTIME//[!0-9]/}"; }
secs() { printf '%d.%01d' $(($1 / 1000000)) $((($1 % 1000000) / 100000)); }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/locksmith-tests.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# ---------------------------------------------------------------------------- build
echo "==> building the test binaries: cargo test ${CARGO_ARGS[*]} --all-features --no-run"
t0=$(now_us)
if ! cargo test "${CARGO_ARGS[@]}" --all-features --no-run --message-format=json-render-diagnostics \
  >"$WORK/build.json"; then
  echo "run-tests: the build failed" >&2
  exit 101
fi
BUILD_US=$(($(now_us) - t0))

# One line per test binary: label, package dir, executable. Cargo's JSON keeps its field order
# (manifest_path, target{kind, ..., name}, ..., executable), so sed can read it without jq.
sed -n 's/^{"reason":"compiler-artifact".*"manifest_path":"\([^"]*\)\/Cargo.toml","target":{"kind":\["\([^"]*\)"\][^}]*"name":"\([^"]*\)".*"profile":{[^}]*"test":true[^}]*}.*"executable":"\([^"]*\)".*/\1\t\2\t\3\t\4/p' \
  "$WORK/build.json" | sort -u >"$WORK/binaries.tsv"

LABELS=()
DIRS=()
EXES=()
while IFS=$'\t' read -r dir kind name exe; do
  rel=${dir#"$ROOT"/}
  [[ $rel == "$dir" ]] && rel=$(basename "$dir")
  case $kind in
    lib) label="$rel (unit)" ;;
    bin) label="$rel bin $name" ;;
    *) label="$rel/tests/$name" ;;
  esac
  LABELS+=("$label")
  DIRS+=("$dir")
  EXES+=("$exe")
done <"$WORK/binaries.tsv"

# Doctests as one more job (rustdoc compiles them, so it is the CPU-heavy one: start it early).
DOC_JOB=-1
if [[ ${LOCKSMITH_TEST_NO_DOC:-0} != 1 ]]; then
  DOC_JOB=${#LABELS[@]}
  LABELS+=("doctests")
  DIRS+=("$ROOT")
  EXES+=("")
fi

# Expected seconds per binary, from the last run on this machine (target/test-times.tsv) or,
# on a fresh clone, from the table below (measured on a 2-core machine; only the order matters).
declare -A EXPECT=(
  ["conformance/tests/negative_controls"]=540
  ["lock-sql/tests/conformance"]=356
  ["lock-redis/tests/conformance"]=156
  ["faults/tests/matrix"]=96
  ["lock-zk/tests/conformance"]=84
  ["lock-etcd/tests/conformance"]=82
  ["locksmith-cli/tests/primitives"]=54
  ["locksmith-cli/tests/run"]=29
  ["lock-redis/tests/redis"]=27
  ["lock-redlock/tests/conformance"]=50
  ["locksmith-cli/tests/cli"]=24
  ["conformance/tests/memory"]=23
  ["lock-sql/tests/sql"]=20
  ["lock-sql/tests/pg_handover"]=13
  ["lock-zk/tests/interop"]=20
  ["lock-etcd/tests/faults"]=17
  ["locksmith-cli/tests/at_risk"]=16
  ["lock-redlock/tests/faults"]=14
  ["lock-redlock/tests/handover_model"]=12
  ["lock-redis/tests/lease_memory"]=11
  ["doctests"]=90
)
TIMES_FILE=$ROOT/target/test-times.tsv
if [[ -f $TIMES_FILE ]]; then
  while IFS=$'\t' read -r s label; do
    [[ $s =~ ^[0-9]+$ ]] && EXPECT[$label]=$s
  done <"$TIMES_FILE"
fi
ORDER=()
for i in "${!LABELS[@]}"; do
  printf '%s\t%s\n' "${EXPECT[${LABELS[$i]}]:-10}" "$i"
done | sort -k1,1nr -k2,2n >"$WORK/order"
while IFS=$'\t' read -r _ i; do ORDER+=("$i"); done <"$WORK/order"

# ---------------------------------------------------------------------------- run
run_job() { # INDEX
  local i=$1 rc=0 t
  t=$(now_us)
  if ((i == DOC_JOB)); then
    timeout --kill-after=30 "$JOB_LIMIT" cargo test "${CARGO_ARGS[@]}" --all-features --doc -- "${BIN_ARGS[@]}" \
      >"$WORK/$i.log" 2>&1 || rc=$?
  else
    local timing=()
    # libtest prints each test's time with --report-time, an unstable option it accepts when
    # RUSTC_BOOTSTRAP is set at run time; libtest-mimic binaries (the conformance suites) do
    # not know it and print `test-time:` lines themselves.
    if "${EXES[$i]}" --help 2>/dev/null | grep -q -- '--report-time'; then
      timing=(-Zunstable-options --report-time)
    fi
    (
      cd "${DIRS[$i]}" &&
        RUSTC_BOOTSTRAP=1 CARGO_MANIFEST_DIR=${DIRS[$i]} CARGO_PKG_NAME=$(basename "${DIRS[$i]}") \
          exec timeout --kill-after=30 "$JOB_LIMIT" "${EXES[$i]}" "${timing[@]}" "${BIN_ARGS[@]}"
    ) >"$WORK/$i.log" 2>&1 </dev/null || rc=$?
  fi
  printf '%s %s\n' "$rc" $(($(now_us) - t)) >"$WORK/$i.done"
}

declare -A PID_JOB=()
RESULTS=()
FAILED=()
finish_job() { # PID
  local i=${PID_JOB[$1]} rc us
  unset "PID_JOB[$1]"
  read -r rc us <"$WORK/$i.done"
  echo
  echo "==> ${LABELS[$i]}: $([[ $rc == 0 ]] && echo ok || echo "FAILED (exit $rc)") in $(secs "$us") s"
  cat "$WORK/$i.log"
  # timeout(1) exits 124 when it stopped the job (137 when it had to kill it).
  if [[ $rc == 124 || $rc == 137 ]] && ((us >= JOB_LIMIT * 1000000)); then
    echo "==> ${LABELS[$i]}: still running after LOCKSMITH_TEST_JOB_LIMIT=${JOB_LIMIT} s: stopped; the tests above without a result hung"
  fi
  RESULTS+=("$us"$'\t'"$i"$'\t'"$rc")
  [[ $rc == 0 ]] || FAILED+=("${LABELS[$i]}")
}

echo "==> running ${#ORDER[@]} test jobs, up to $JOBS at once"
t0=$(now_us)
for i in "${ORDER[@]}"; do
  while ((${#PID_JOB[@]} >= JOBS)); do
    wait -n -p done_pid "${!PID_JOB[@]}"
    finish_job "$done_pid"
  done
  run_job "$i" &
  PID_JOB[$!]=$i
done
while ((${#PID_JOB[@]} > 0)); do
  wait -n -p done_pid "${!PID_JOB[@]}"
  finish_job "$done_pid"
done
RUN_US=$(($(now_us) - t0))

# ---------------------------------------------------------------------------- where the time went
mkdir -p "$ROOT/target"
: >"$WORK/times"
echo
echo "==> where the test time went (wall seconds per job, $JOBS at once; build $(secs "$BUILD_US") s, run $(secs "$RUN_US") s)"
printf '%s\n' "${RESULTS[@]}" | sort -k1,1nr | while IFS=$'\t' read -r us i rc; do
  printf '    %8s s  %s%s\n' "$(secs "$us")" "${LABELS[$i]}" "$([[ $rc == 0 ]] || echo '  FAILED')"
  printf '%d\t%s\n' $(((us + 999999) / 1000000)) "${LABELS[$i]}" >>"$WORK/times"
done
cp "$WORK/times" "$TIMES_FILE"
# The slowest tests: libtest's `test NAME ... ok <1.234s>` and the conformance suites'
# `test-time:<TAB>NAME<TAB>1.234` lines.
for i in "${!LABELS[@]}"; do
  [[ -f $WORK/$i.log ]] || continue
  sed -n -e 's/^test \(.*\) \.\.\. [A-Za-z]* <\([0-9.]*\)s>$/\2\t\1/p' \
    -e 's/^test-time:\t\([^\t]*\)\t\([0-9.]*\)$/\2\t\1/p' "$WORK/$i.log" |
    sed "s|\$|\t${LABELS[$i]}|"
done | sort -t$'\t' -k1,1nr | head -n 20 >"$WORK/slow"
if [[ -s $WORK/slow ]]; then
  echo "==> the 20 slowest tests (seconds, test, binary)"
  while IFS=$'\t' read -r s name label; do
    printf '    %8s s  %s  (%s)\n' "$s" "$name" "$label"
  done <"$WORK/slow"
fi

if ((${#FAILED[@]})); then
  echo "==> failed: ${FAILED[*]}"
  exit 1
fi
exit 0
