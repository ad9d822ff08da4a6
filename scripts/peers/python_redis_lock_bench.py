"""python-redis-lock's fair hand-over rate for scripts/bench-peers.sh.

    python_redis_lock_bench.py contend PROCS SECS
        PROCS processes loop acquire + release on one name for SECS, each through its own
        client and python-redis-lock's default options (no expiry, no renewal: a waiter
        BLPOPs the signal list that the release pushes to). Prints
        `per_sec X counts N N ... spread S min_share M`.
    python_redis_lock_bench.py worker START_UNIX SECS NAME   (internal) one process of it

The Redis URL comes from PEERS_REDIS_URL (never argv, which any user can read). Lock names
start with `peers-prl-` and a random suffix, so runs keep apart on shared servers.
"""

import os
import subprocess
import sys
import time
import uuid

import redis
import redis_lock


def url():
    u = os.environ.get("PEERS_REDIS_URL")
    if not u:
        sys.exit("python_redis_lock_bench: PEERS_REDIS_URL is not set")
    return u


def contend(procs, secs):
    name = "peers-prl-%s" % uuid.uuid4().hex[:12]
    start = time.time() + 1.5
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", repr(start), str(secs), name],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(procs)
    ]
    counts = []
    for c in children:
        out, _ = c.communicate(timeout=secs + 60)
        words = out.split()
        if c.returncode != 0 or len(words) != 2 or words[0] != "count":
            sys.exit("python_redis_lock_bench: a worker printed %r" % out)
        counts.append(int(words[1]))
    total = sum(counts)
    share = total / max(len(counts), 1)
    print(
        "per_sec %.0f counts %s spread %.2f min_share %.2f"
        % (
            total / secs,
            " ".join(map(str, counts)),
            max(counts) / max(min(counts), 1),
            min(counts) / share if share else 0.0,
        )
    )


def worker(start, secs, name):
    conn = redis.StrictRedis.from_url(url())
    conn.ping()  # connected before the start
    time.sleep(max(0.0, start - time.time()))
    deadline = time.time() + secs
    count = 0
    while True:
        lock = redis_lock.Lock(conn, name)
        # The defaults wait without a deadline; this bound only ends a run whose last release
        # was lost (BLPOP's timeout is in whole seconds).
        if not lock.acquire(timeout=max(1, int(deadline - time.time()) + 5)):
            break
        won_in_time = time.time() < deadline
        lock.release()
        if not won_in_time:
            break
        count += 1
    print("count %d" % count)


def main():
    args = sys.argv[1:]
    if args[:1] == ["contend"] and len(args) == 3:
        contend(int(args[1]), int(args[2]))
    elif args[:1] == ["worker"] and len(args) == 4:
        worker(float(args[1]), int(args[2]), args[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
