"""A kazoo Lock client for lock-zk's interop tests (tests/interop.rs), run with Debian's
python3-kazoo. Its lines on stdout, times in microseconds of the system clock (the same clock
the test reads):

  kazoo_peer.py <hosts> <lock path> hold [--persistent] [--extra-lock-pattern P]
      HELD <t>      once acquire() returned (t taken inside the critical section)
      (waits for a line on stdin)
      RELEASED <t>  t taken before release() was called
  kazoo_peer.py <hosts> <lock path> loop <milliseconds> [--extra-lock-pattern P]
      WINDOW <start> <end>   per acquisition, until the time is up
      DONE <count>

--persistent acquires with ephemeral=False (a persistent node: a live holder all the same).
--read / --write use kazoo's ReadLock / WriteLock instead of Lock.
"""
import sys
import time

from kazoo.client import KazooClient


def now_us():
    return time.time_ns() // 1000


def main():
    args = sys.argv[1:]
    hosts, path, mode = args[0], args[1], args[2]
    rest = args[3:]
    patterns = []
    ephemeral = True
    millis = None
    recipe = "Lock"
    i = 0
    while i < len(rest):
        if rest[i] == "--persistent":
            ephemeral = False
        elif rest[i] == "--read":
            recipe = "ReadLock"
        elif rest[i] == "--write":
            recipe = "WriteLock"
        elif rest[i] == "--extra-lock-pattern":
            i += 1
            patterns.append(rest[i])
        else:
            millis = int(rest[i])
        i += 1
    zk = KazooClient(hosts=hosts, timeout=10.0)
    zk.start(timeout=30)
    lock = getattr(zk, recipe)(path, "kazoo-peer", extra_lock_patterns=patterns)
    if mode == "hold":
        lock.acquire(ephemeral=ephemeral)
        print("HELD", now_us(), flush=True)
        sys.stdin.readline()
        print("RELEASED", now_us(), flush=True)
        lock.release()
    else:
        end = time.monotonic() + millis / 1000.0
        count = 0
        while time.monotonic() < end:
            lock.acquire()
            start = now_us()
            time.sleep(0.002)
            stop = now_us()
            lock.release()
            print("WINDOW", start, stop, flush=True)
            count += 1
        print("DONE", count, flush=True)
    zk.stop()
    zk.close()


if __name__ == "__main__":
    main()
