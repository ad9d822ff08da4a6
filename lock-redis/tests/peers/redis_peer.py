#!/usr/bin/python3
"""A peer lock client for lock-redis's interop tests, driven line by line on stdin.

    redis_peer.py redis-py|redisson REDIS_URL NAME

`redis-py` is redis-py's own `redis.lock.Lock` (Debian python3-redis 4.3.4). `redisson` is
Redisson's RLock protocol (Redisson is Java from Maven, which this machine cannot reach): the
Lua scripts below are copied verbatim from Redisson 4.7.0 (github.com/redisson/redisson, tag
redisson-4.7.0, RedissonLock.java tryLockInnerAsync / unlockInnerAsync, renewal/LockTask.java),
run through redis-py, with Redisson's waiting (subscribe to the lock's channel, try, wait for
the unlock message or the holder's TTL).

Commands: `try TTL_MS`, `hold TTL_MS` (blocking), `wait TTL_MS` (prints `waiting` after a first
failed try, then blocks), `release`, `loop SECONDS TTL_MS`, `quit`. Answers: `acquired T [how]`,
`busy`, `waiting`, `released T` (T taken before the release was sent), `window T0 T1`,
`done N`, `error ...`. Times are Unix seconds.
"""

import sys
import threading
import time
import uuid

import redis
from redis.lock import Lock


def say(*words):
    print(*words, flush=True)


def now():
    return "%.6f" % time.time()


# --- Redisson 4.7.0, verbatim (RedissonLock.java, renewal/LockTask.java) ---------------------

REDISSON_TRY_LOCK = (
    "if ((redis.call('exists', KEYS[1]) == 0) "
    + "or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then "
    + "redis.call('hincrby', KEYS[1], ARGV[2], 1); "
    + "redis.call('pexpire', KEYS[1], ARGV[1]); "
    + "return nil; "
    + "end; "
    + "return redis.call('pttl', KEYS[1]);"
)

REDISSON_UNLOCK = (
    "local val = redis.call('get', KEYS[3]); "
    + "if val ~= false then "
    + "return tonumber(val);"
    + "end; "
    + "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then "
    + "return nil;"
    + "end; "
    + "local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); "
    + "if (counter > 0) then "
    + "redis.call('pexpire', KEYS[1], ARGV[2]); "
    + "redis.call('set', KEYS[3], 0, 'px', ARGV[5]); "
    + "return 0; "
    + "else "
    + "redis.call('del', KEYS[1]); "
    + "redis.call(ARGV[4], KEYS[2], ARGV[1]); "
    + "redis.call('set', KEYS[3], 1, 'px', ARGV[5]); "
    + "return 1; "
    + "end; "
)

REDISSON_RENEW = (
    "local result = {} "
    + "for i = 1, #KEYS, 1 do "
    + "if (redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1) then "
    + "redis.call('pexpire', KEYS[i], ARGV[1]); "
    + "table.insert(result, 1); "
    + "else "
    + "table.insert(result, 0); "
    + "end; "
    + "end; "
    + "return result;"
)


def prefix_name(prefix, name):
    """RedissonObject.prefixName."""
    if "{" in name:
        return prefix + ":" + name
    return prefix + ":{" + name + "}"


class RedissonLock:
    """RLock's protocol for one thread: field `<client id>:<thread id>`."""

    def __init__(self, r, name):
        self.r = r
        self.name = name
        self.id = str(uuid.uuid4())  # ServiceManager's id: a UUID
        self.channel = prefix_name("redisson_lock__channel", name)
        self.try_script = r.register_script(REDISSON_TRY_LOCK)
        self.unlock_script = r.register_script(REDISSON_UNLOCK)
        self.renew_script = r.register_script(REDISSON_RENEW)

    def lock_name(self):
        return "%s:%d" % (self.id, threading.get_ident())

    def try_acquire(self, ttl_ms):
        """None when acquired, else the holder's TTL in ms."""
        return self.try_script(keys=[self.name], args=[ttl_ms, self.lock_name()])

    def lock(self, ttl_ms, on_waiting=None):
        """Redisson's lock(): subscribe, try, wait for the unlock message or the TTL."""
        if self.try_acquire(ttl_ms) is None:
            return "free"
        p = self.r.pubsub()
        p.subscribe(self.channel)
        # As Redisson, the retry comes once the subscription is confirmed: a release after it
        # is announced to this waiter.
        while True:
            m = p.get_message(timeout=5.0)
            if m and m["type"] == "subscribe":
                break
        how = "retry"
        announced = False
        try:
            while True:
                ttl = self.try_acquire(ttl_ms)
                if ttl is None:
                    return how
                if on_waiting and not announced:
                    # Subscribed and still held: from here only a message or the TTL wakes it.
                    on_waiting()
                    announced = True
                limit = ttl / 1000.0 if ttl >= 0 else 1.0
                deadline = time.monotonic() + limit
                how = "ttl"
                while time.monotonic() < deadline:
                    m = p.get_message(timeout=max(0.0, deadline - time.monotonic()))
                    if m and m["type"] == "message" and m["data"] in (b"0", "0"):
                        how = "message"
                        break
        finally:
            p.close()

    def unlock(self):
        request_id = str(uuid.uuid4())
        latch = prefix_name("redisson_unlock_latch", self.name) + ":" + request_id
        r = self.unlock_script(
            keys=[self.name, self.channel, latch],
            args=[0, 30000, self.lock_name(), "publish", 1000],
        )
        self.r.delete(latch)
        if r is None:
            raise RuntimeError("attempt to unlock, not locked by current thread")


class RedisPyLock:
    def __init__(self, r, name):
        self.r = r
        self.name = name
        self.lock_obj = None

    def try_acquire(self, ttl_ms):
        lock = Lock(self.r, self.name, timeout=ttl_ms / 1000.0, thread_local=False)
        if lock.acquire(blocking=False):
            self.lock_obj = lock
            return None
        return 1

    def lock(self, ttl_ms, on_waiting=None, sleep=0.1):
        lock = Lock(self.r, self.name, timeout=ttl_ms / 1000.0, sleep=sleep, thread_local=False)
        if lock.acquire(blocking=False):
            self.lock_obj = lock
            return "free"
        if on_waiting:
            on_waiting()
        lock.acquire(blocking=True)
        self.lock_obj = lock
        return "poll"

    def unlock(self):
        lock, self.lock_obj = self.lock_obj, None
        lock.release()


def main():
    kind, url, name = sys.argv[1], sys.argv[2], sys.argv[3]
    r = redis.Redis.from_url(url)
    r.ping()
    peer = {"redis-py": RedisPyLock, "redisson": RedissonLock}[kind](r, name)
    say("ready", redis.__version__)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd, args = words[0], words[1:]
        try:
            if cmd == "try":
                if peer.try_acquire(int(args[0])) is None:
                    say("acquired", now(), "free")
                else:
                    say("busy")
            elif cmd == "hold":
                how = peer.lock(int(args[0]))
                say("acquired", now(), how)
            elif cmd == "wait":
                how = peer.lock(int(args[0]), on_waiting=lambda: say("waiting"))
                say("acquired", now(), how)
            elif cmd == "release":
                t = now()
                peer.unlock()
                say("released", t)
            elif cmd == "loop":
                end = time.monotonic() + float(args[0])
                ttl_ms = int(args[1])
                n = 0
                while time.monotonic() < end:
                    if kind == "redis-py":
                        peer.lock(ttl_ms, sleep=0.01)
                    else:
                        peer.lock(ttl_ms)
                    t0 = now()
                    time.sleep(0.005)
                    t1 = now()
                    peer.unlock()
                    say("window", t0, t1)
                    n += 1
                    time.sleep(0.01)
                say("done", n)
            elif cmd == "quit":
                return
            else:
                say("error", "unknown command", cmd)
        except Exception as e:  # reported to the test, which fails on it
            say("error", type(e).__name__, str(e).replace("\n", " "))


if __name__ == "__main__":
    main()
