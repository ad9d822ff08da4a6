//! Faults and limits: server crashes (own instances), connection limits, an unreachable
//! database, pool exhaustion, request counts through a counting proxy.

use std::time::Duration;

mod support;

use faultkit::{MariaDb, Postgres, Proxy, ProxyMode, Wire, require_installed, rewrite_url};
use lock_sql::SqlBackend;
use lockcore::{ErrorKind, LockName, LockOptions};
use support::{client, scaled, unique, with_params};

fn addr_of(url: &str) -> std::net::SocketAddr {
    let u = url::Url::parse(url).unwrap();
    format!("{}:{}", u.host_str().unwrap(), u.port().unwrap())
        .parse()
        .unwrap()
}

/// A proxy counting the requests of `url`'s clients, and `url` through it.
async fn counting_proxy(url: &str, wire: Wire) -> (Proxy, String) {
    let target = addr_of(url);
    let proxy = Proxy::start_with_wire(target, wire).await.unwrap();
    let through = rewrite_url(url, target.port(), proxy.port());
    assert_ne!(through, url, "{url} names no loopback endpoint");
    (proxy, through)
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin/postgres";

/// Shared-server URLs: PostgreSQL and MariaDB, plain TCP (for the proxy).
fn shared() -> Vec<(&'static str, String, Wire)> {
    let mut v = Vec::new();
    if let Some(pg) = conformance::require_env("LOCK_TEST_POSTGRES_URL") {
        v.push((
            "postgres",
            with_params(&pg, "sslmode=disable"),
            Wire::Postgres,
        ));
    }
    if let Some(my) = conformance::require_env("LOCK_TEST_MYSQL_URL") {
        v.push(("mysql", with_params(&my, "ssl-mode=disabled"), Wire::MySql));
    }
    v
}

/// PostgreSQL row-lock fencing tokens come from a committed counter (written with a WAL flush,
/// whatever the server's `synchronous_commit`): after a crash and restart the next holder's
/// token is larger than every token handed out before (regression: `nextval` in a
/// rolled-back transaction could be handed out again after a crash). A lease taken just before
/// the crash is still held after it.
#[tokio::test]
async fn pg_tokens_and_leases_survive_a_crash_restart() {
    if !require_installed(PG_BIN) {
        return;
    }
    // As scripts/servers.sh runs it (asynchronous commit): the test sees what the library
    // forces.
    let mut pg = Postgres::start_with(&[("max_connections", "50"), ("synchronous_commit", "off")])
        .await
        .unwrap();
    let row = with_params(&pg.url(), "strategy=row-lock");
    let lease = with_params(&pg.url(), "strategy=lease");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .wait_timeout(scaled(Duration::from_secs(20)));
    let name = unique("crash");
    let mut last = 0;
    for round in 0..3 {
        let a = client(&row).await;
        let l = client(&lease).await;
        let g = a.lock(name.as_str(), &opts).await.unwrap();
        let t = g.fencing_token().unwrap();
        assert!(t > last, "round {round}: token {t} after {last}");
        last = t;
        let lname = format!("{name}-lease-{round}");
        let lg = l.lock(lname.as_str(), &opts).await.unwrap();
        // At once (kill -9, crash recovery): nothing else gets a chance to flush the WAL.
        pg.restart(true).await.unwrap();
        let b = client(&lease).await;
        assert!(
            b.try_lock(lname.as_str(), &opts).await.unwrap().is_none(),
            "round {round}: the lease taken before the crash was lost"
        );
        g.abandon();
        lg.abandon();
    }
    let c = client(&row).await;
    let g = c.lock(name.as_str(), &opts).await.unwrap();
    assert!(g.fencing_token().unwrap() > last);
    g.release().await.unwrap();
}

/// Many holders on one client: a held row lock keeps a connection outside `pool_max`, so 100
/// holders on a client with `pool_max=4` all get their locks (regression: holders past the
/// pool waited 30 s and failed). When the server refuses more connections
/// (`max_connections`), the error is `Unavailable`, not `Backend`.
#[tokio::test]
async fn hundred_holders_and_the_server_connection_limit() {
    let mut servers: Vec<(&str, String, Box<dyn std::any::Any>)> = Vec::new();
    if require_installed(PG_BIN) {
        // No connections reserved for superusers: the test's user reaches the limit.
        let pg = Postgres::start_with(&[
            ("max_connections", "110"),
            ("superuser_reserved_connections", "0"),
        ])
        .await
        .unwrap();
        servers.push(("postgres", pg.url(), Box::new(pg)));
    }
    if require_installed("mariadbd") {
        let my = MariaDb::start_with(&["--max-connections=110"])
            .await
            .unwrap();
        servers.push(("mysql", my.url(), Box::new(my)));
    }
    for (label, url, _server) in &servers {
        let url = with_params(url, "strategy=row-lock&pool_max=4");
        let c = client(&url).await;
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(60))
            .wait_timeout(scaled(Duration::from_secs(20)));
        let base = unique("many");
        let t0 = std::time::Instant::now();
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let c = c.clone();
                let opts = opts.clone();
                let name = format!("{base}-{i}");
                tokio::spawn(async move { c.lock(name.as_str(), &opts).await })
            })
            .collect();
        let mut guards = Vec::new();
        for t in tasks {
            guards.push(t.await.unwrap().unwrap_or_else(|e| panic!("{label}: {e}")));
        }
        eprintln!("{label}: 100 holders in {:?}", t0.elapsed());
        // More, until the server says no: that is Unavailable.
        let err = loop {
            match c
                .try_lock(format!("{base}-x{}", guards.len()).as_str(), &opts)
                .await
            {
                Ok(Some(g)) => guards.push(g),
                Ok(None) => panic!("{label}: a fresh name was busy"),
                Err(e) => break e,
            }
            assert!(guards.len() < 200, "{label}: the server never refused");
        };
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{label}: {err}");
        eprintln!("{label}: refused after {} holders: {err}", guards.len());
        for g in guards {
            g.release().await.unwrap();
        }
    }
}

/// Waiters queued on one busy name do not take the connections other names need, and
/// `try_lock` never waits for the pool (regression: with every pooled connection in a lock
/// wait, other names and try_lock waited 30 s for the pool and failed).
#[tokio::test]
async fn waiters_on_a_busy_name_do_not_starve_other_names() {
    for (label, url, _) in shared() {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let url = if label == "postgres" {
            with_params(&url, "strategy=row-lock&pool_max=2")
        } else {
            with_params(
                &url,
                &format!("strategy=row-lock&pool_max=2&table=starve_{tag}"),
            )
        };
        let url_c = if label == "postgres" {
            with_params(&url, &format!("application_name=starve{tag}"))
        } else {
            url.clone()
        };
        let holder = client(&url).await;
        let c = client(&url_c).await;
        let busy = unique("busy");
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait_timeout(scaled(Duration::from_secs(60)));
        let g = holder.lock(busy.as_str(), &opts).await.unwrap();
        let waiters: Vec<_> = (0..20)
            .map(|_| {
                let c = c.clone();
                let busy = busy.clone();
                let opts = opts.clone();
                tokio::spawn(async move { c.lock(busy.as_str(), &opts).await })
            })
            .collect();
        // Until the waiters are queued (a server-side waiter stands for them): the test is
        // about what the queued ones do to other names.
        let t_wait = std::time::Instant::now();
        while server_side_waiters(label, &url, &tag).await < 1 {
            assert!(
                t_wait.elapsed() < scaled(Duration::from_secs(10)),
                "{label}: no waiter reached the server"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let t0 = std::time::Instant::now();
        let other = c
            .lock(
                unique("other").as_str(),
                &opts.clone().wait_timeout(scaled(Duration::from_secs(5))),
            )
            .await
            .unwrap_or_else(|e| panic!("{label}: other name starved: {e}"));
        assert!(
            c.try_lock(busy.as_str(), &opts).await.unwrap().is_none(),
            "{label}"
        );
        assert!(
            t0.elapsed() < scaled(Duration::from_secs(5)),
            "{label}: {:?}",
            t0.elapsed()
        );
        // One server-side waiter for the 20 local ones.
        let n = server_side_waiters(label, &url, &tag).await;
        assert!(n <= 1, "{label}: {n} server-side waiters");
        other.release().await.unwrap();
        g.release().await.unwrap();
        for w in waiters {
            let g = w.await.unwrap().unwrap();
            g.release().await.unwrap();
        }
        if label == "mysql" {
            let pool = sqlx::MySqlPool::connect(url.split('?').next().unwrap())
                .await
                .unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE starve_{tag}")))
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
    }
}

/// How many of the server's sessions wait for a row lock of the test's client (PostgreSQL:
/// tagged `application_name=starve{tag}`; MariaDB: `GET_LOCK` waits on its own table
/// `starve_{tag}`, since a prepared statement's text shows no bound name).
async fn server_side_waiters(label: &str, url: &str, tag: &str) -> i64 {
    let base = url.split('?').next().unwrap();
    if label == "postgres" {
        let pool = sqlx::PgPool::connect(base).await.unwrap();
        let n = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
        )
        .bind(format!("starve{tag}"))
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        n
    } else {
        let pool = sqlx::MySqlPool::connect(base).await.unwrap();
        let n = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock' AND INFO LIKE CONCAT('%.starve\\_', ?, '.%')",
        )
        .bind(tag)
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        n
    }
}

/// A database that stops answering (a silent network) cannot hold `lock()` past its deadline
/// or `try_lock` past `op_timeout_ms` (regression: lease statements had no client-side timeout
/// and waited on the pool for 30 s).
#[tokio::test]
async fn an_unreachable_database_cannot_hold_calls_past_their_bound() {
    for (label, url, wire) in shared() {
        for strategy in ["lease", "row-lock"] {
            let (proxy, through) = counting_proxy(&url, wire).await;
            let purl = with_params(&through, &format!("strategy={strategy}&op_timeout_ms=500"));
            let c = client(&purl).await;
            let name = unique("silent");
            let g = c
                .lock(
                    name.as_str(),
                    &LockOptions::new().ttl(Duration::from_secs(5)),
                )
                .await
                .unwrap();
            g.release().await.unwrap();
            // Silent: nothing passes, nothing is closed.
            proxy.set_mode(ProxyMode::Blackhole);
            let t0 = std::time::Instant::now();
            let wait = Duration::from_secs(1);
            let r = c
                .lock(
                    unique("silent").as_str(),
                    &LockOptions::new()
                        .ttl(Duration::from_secs(5))
                        .wait_timeout(wait),
                )
                .await;
            let took = t0.elapsed();
            assert!(
                r.is_err(),
                "{label} {strategy}: acquired through a silent network"
            );
            assert!(
                took < wait + scaled(Duration::from_secs(2)),
                "{label} {strategy}: lock() took {took:?} with a {wait:?} deadline"
            );
            let t0 = std::time::Instant::now();
            let e = c
                .try_lock(unique("silent").as_str(), &LockOptions::new())
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{label} {strategy}: {e}");
            assert!(
                t0.elapsed() < scaled(Duration::from_secs(3)),
                "{label} {strategy}: try_lock took {:?}",
                t0.elapsed()
            );
            proxy.set_mode(ProxyMode::Pass);
        }
    }
}

/// Requests per operation, counted on the wire after a warm-up (prepared statements cached):
/// a row-lock acquire is one request and a release one, also after a wait in the server's
/// queue (regression: PostgreSQL pinged again after every wait over 20 ms; MariaDB took 4
/// round trips per acquire); a failed lease attempt is one request (regression: MySQL took
/// two statements per attempt).
#[tokio::test]
async fn requests_per_operation() {
    for (label, url, wire) in shared() {
        let opts = LockOptions::new().ttl(Duration::from_secs(60));
        // Row lock, uncontended.
        let (proxy, through) = counting_proxy(&url, wire).await;
        let c = client(&with_params(&through, "strategy=row-lock")).await;
        let name = unique("rt");
        // Warm-up: both statements prepared (try, and wait with a deadline).
        let waiting = opts.clone().wait_timeout(scaled(Duration::from_secs(20)));
        for _ in 0..3 {
            let g = c.try_lock(name.as_str(), &opts).await.unwrap().unwrap();
            g.release().await.unwrap();
            let g = c.lock(name.as_str(), &waiting).await.unwrap();
            g.release().await.unwrap();
        }
        let before = proxy.requests();
        for _ in 0..10 {
            let g = c.try_lock(name.as_str(), &opts).await.unwrap().unwrap();
            g.release().await.unwrap();
        }
        let per = (proxy.requests() - before) as f64 / 10.0;
        assert!(
            per <= 2.0,
            "{label} row-lock: {per} requests per acquire+release"
        );
        // Row lock after a wait: the waiter's acquire is one request.
        let holder = client(&with_params(&url, "strategy=row-lock")).await;
        let g = holder.lock(name.as_str(), &opts).await.unwrap();
        let before = proxy.requests();
        let w = {
            let c = c.clone();
            let name = name.clone();
            let opts = opts.clone().wait_timeout(scaled(Duration::from_secs(20)));
            tokio::spawn(async move { c.lock(name.as_str(), &opts).await })
        };
        // Released once the waiter's blocking request has passed the proxy (not after a guess).
        let deadline = std::time::Instant::now() + scaled(Duration::from_secs(10));
        while proxy.requests() == before {
            assert!(
                std::time::Instant::now() < deadline,
                "{label}: the waiter sent no request"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        g.release().await.unwrap();
        let g = w.await.unwrap().unwrap();
        let acquire = proxy.requests() - before;
        g.release().await.unwrap();
        assert_eq!(
            acquire, 1,
            "{label} row-lock: requests for a waited acquire"
        );
        // Lease: a failed attempt is one request.
        let (proxy, through) = counting_proxy(&url, wire).await;
        let c = client(&with_params(&through, "strategy=lease")).await;
        let other = client(&with_params(&url, "strategy=lease")).await;
        let name = unique("rt-lease");
        let g = other.lock(name.as_str(), &opts).await.unwrap();
        for _ in 0..3 {
            assert!(c.try_lock(name.as_str(), &opts).await.unwrap().is_none());
        }
        let before = proxy.requests();
        for _ in 0..10 {
            assert!(c.try_lock(name.as_str(), &opts).await.unwrap().is_none());
        }
        let per = (proxy.requests() - before) as f64 / 10.0;
        assert!(
            per <= 1.0,
            "{label} lease: {per} requests per failed attempt"
        );
        g.release().await.unwrap();
        eprintln!("{label}: ok");
    }
}

/// What a PostgreSQL row lock costs with the default options, counted on a private server (so
/// no other client's work shows): an acquire (tried, or waited for while free) is one request
/// and one transaction that writes (the fencing token's committed counter: the one write an
/// acquisition must make, see the `row-lock default cost` note in `pg::rowlock`), a release
/// one request that writes nothing, and an acquire without a token (`no_fencing`) writes
/// nothing. Writing transactions are counted by the server's transaction ids (a read-only
/// transaction takes none; autovacuum, whose ANALYZE would take some, is off).
#[tokio::test]
async fn pg_row_lock_default_cost() {
    if !require_installed(PG_BIN) {
        return;
    }
    let pg = Postgres::start_with(&[("autovacuum", "off"), ("synchronous_commit", "off")])
        .await
        .unwrap();
    let url = with_params(&pg.url(), "sslmode=disable");
    let (proxy, through) = counting_proxy(&url, Wire::Postgres).await;
    let c = client(&with_params(&through, "strategy=row-lock")).await;
    let mut probe = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    // Takes a transaction id of its own: the ids between two calls are the writers between.
    let mut xid = async || -> i64 {
        sqlx::query_scalar("SELECT txid_current()")
            .fetch_one(&mut probe)
            .await
            .unwrap()
    };
    let name = unique("cost");
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let waiting = opts.clone().wait_timeout(scaled(Duration::from_secs(20)));
    let bare = opts.clone().no_fencing();
    // Warm-up: every statement prepared (try and wait, with and without a token), the lock
    // row made.
    for o in [&opts, &bare] {
        for _ in 0..2 {
            let g = c.try_lock(name.as_str(), o).await.unwrap().unwrap();
            g.release().await.unwrap();
            let w = o.clone().wait_timeout(scaled(Duration::from_secs(20)));
            c.lock(name.as_str(), &w)
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
    }
    const N: u64 = 10;
    let mut last = 0;
    for (what, o, waits, writes) in [
        ("try_lock", &opts, false, 1),
        ("lock", &waiting, true, 1),
        ("try_lock without a token", &bare, false, 0),
    ] {
        let (x0, r0) = (xid().await, proxy.requests());
        for _ in 0..N {
            let g = if waits {
                c.lock(name.as_str(), o).await.unwrap()
            } else {
                c.try_lock(name.as_str(), o).await.unwrap().unwrap()
            };
            if let Some(t) = g.fencing_token() {
                assert!(t > last, "{what}: token {t} after {last}");
                last = t;
            }
            g.release().await.unwrap();
        }
        let (x1, r1) = (xid().await, proxy.requests());
        assert_eq!(r1 - r0, 2 * N, "{what}: requests for {N} acquire+release");
        assert_eq!(
            (x1 - x0 - 1) as u64,
            writes * N,
            "{what}: writing transactions for {N} acquire+release"
        );
    }
}

/// A failed PostgreSQL lease attempt writes nothing: the held row keeps its version and is not
/// locked (regression: the upsert locked the row even when it took nothing).
#[tokio::test]
async fn pg_failed_lease_attempt_is_not_a_write() {
    let Some(pg) = conformance::require_env("LOCK_TEST_POSTGRES_URL") else {
        return;
    };
    let url = with_params(&pg, "strategy=lease");
    let a = client(&url).await;
    let b = client(&url).await;
    let name = unique("noread");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let g = a.lock(name.as_str(), &opts).await.unwrap();
    let pool = sqlx::PgPool::connect(&pg).await.unwrap();
    let version = || async {
        sqlx::query_as::<_, (String, String)>(
            "SELECT xmin::text, xmax::text FROM locksmith_locks WHERE name = $1",
        )
        .bind(&name)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let v0 = version().await;
    for _ in 0..3 {
        assert!(b.try_lock(name.as_str(), &opts).await.unwrap().is_none());
    }
    assert_eq!(
        version().await,
        v0,
        "a failed attempt wrote or locked the row"
    );
    g.release().await.unwrap();
}

/// A PostgreSQL lease release sends `NOTIFY` only when a waiter announced itself (regression:
/// every release notified, serialising commits on the notification queue), and to an exclusive
/// waiter only: the queue's head, named by its token (`handover=wake`; a grant's notification
/// is `pg_handover`'s).
#[tokio::test]
async fn pg_release_notifies_only_when_someone_waits() {
    let Some(pg) = conformance::require_env("LOCK_TEST_POSTGRES_URL") else {
        return;
    };
    let url = with_params(&pg, "strategy=lease&handover=wake");
    let a = client(&url).await;
    let b = client(&url).await;
    let mut listener = sqlx::postgres::PgListener::connect(&pg).await.unwrap();
    listener.listen("locksmith_locks").await.unwrap();
    let name = unique("notify");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_timeout(scaled(Duration::from_secs(20)));
    // Nobody waits: no notification for this name.
    let g = a.lock(name.as_str(), &opts).await.unwrap();
    g.release().await.unwrap();
    let quiet = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            let n = listener.recv().await.unwrap();
            if n.payload() == name {
                return;
            }
        }
    })
    .await;
    assert!(quiet.is_err(), "a release without waiters sent NOTIFY");
    // Someone waits: the release wakes it.
    let g = a.lock(name.as_str(), &opts).await.unwrap();
    let w = {
        let name = name.clone();
        let opts = opts.clone();
        tokio::spawn(async move { b.lock(name.as_str(), &opts).await })
    };
    // Until the waiter is in the queue (an exclusive waiter's announcement): its token.
    let pool = sqlx::PgPool::connect(&pg).await.unwrap();
    let t0 = std::time::Instant::now();
    let token = loop {
        let queued: Option<String> = sqlx::query_scalar(
            "SELECT waiter FROM locksmith_locks_waits WHERE name = $1 \
             AND expires > clock_timestamp()",
        )
        .bind(&name)
        .fetch_optional(&pool)
        .await
        .unwrap();
        if let Some(token) = queued {
            break token;
        }
        assert!(
            t0.elapsed() < scaled(Duration::from_secs(10)),
            "the waiter never announced itself"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    g.release().await.unwrap();
    let called = format!("\u{1}{token}");
    tokio::time::timeout(scaled(Duration::from_secs(5)), async {
        loop {
            let n = listener.recv().await.unwrap();
            if n.payload() == called {
                return;
            }
        }
    })
    .await
    .expect("no NOTIFY for a waiter");
    w.await.unwrap().unwrap().release().await.unwrap();
}

/// MariaDB revoke kills the session that holds the lock now, found on the server: a name
/// released by a connection that went on to hold another name is not held, and revoking it
/// leaves the other lock alone (regression: the connection id recorded at the last win was
/// killed, taking the other lock with it).
#[tokio::test]
async fn revoke_kills_the_current_holder_only() {
    for (label, url, _) in shared() {
        let url = with_params(&url, "strategy=row-lock");
        let c = client(&url).await;
        let admin = SqlBackend::connect(&url).await.unwrap();
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let x = unique("revoke-x");
        let y = unique("revoke-y");
        c.lock(x.as_str(), &opts)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        // The same client: its idle connection (the one that held x) now holds y.
        let gy = c.lock(y.as_str(), &opts).await.unwrap();
        assert!(
            !admin.revoke(&LockName::new(&x).unwrap()).await.unwrap(),
            "{label}: x is not held"
        );
        // A round trip on y's holding session proves it alive: `KILL CONNECTION` shuts the
        // victim's socket before it returns, so a killed session fails this extend.
        gy.extend(Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{label}: revoking x took y: {e}"));
        assert!(gy.lost().reason().is_none(), "{label}: revoking x took y");
        assert!(
            admin.revoke(&LockName::new(&y).unwrap()).await.unwrap(),
            "{label}"
        );
        tokio::time::timeout(scaled(Duration::from_secs(5)), gy.lost().lost())
            .await
            .expect("lost after revoke");
    }
}

/// A `lock()` whose deadline passes while its attempt is on the way to the server returns at
/// its deadline, and what that attempt wins on the server afterwards is released by the client,
/// not left held by nobody for its TTL (regression: the statement was abandoned at the caller's
/// deadline, its connection closed; the server ran it after the holder's release, and the lock
/// stayed taken for a whole TTL by a client that had timed out and exited). Requests to the
/// server are delayed by a proxy so that the holder's release lands first.
#[tokio::test]
async fn a_late_attempt_of_a_timed_out_wait_is_released() {
    for (label, url, wire) in shared() {
        let (proxy, through) = counting_proxy(&url, wire).await;
        let holder = client(&with_params(&url, "strategy=lease")).await;
        let late = client(&with_params(&through, "strategy=lease&op_timeout_ms=30000")).await;
        let name = unique("late");
        let opts = LockOptions::new().ttl(Duration::from_secs(60));
        // Connections open and statements prepared before the delay starts.
        late.lock(name.as_str(), &opts)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let g = holder
            .try_lock(name.as_str(), &opts.clone().require_fencing(true))
            .await
            .unwrap()
            .expect("free");
        let first = g.fencing_token().expect("a token");
        let delay = scaled(Duration::from_secs(2));
        proxy.set_latency(faultkit::Direction::ToServer, delay);
        let wait = Duration::from_millis(300);
        let t0 = std::time::Instant::now();
        let e = late
            .lock(name.as_str(), &opts.clone().wait_timeout(wait))
            .await
            .expect_err("held");
        let took = t0.elapsed();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{label}: {e}");
        assert!(
            took < wait + delay / 2,
            "{label}: lock() returned {took:?} after a {wait:?} deadline"
        );
        // Before the late attempt reaches the server.
        g.release().await.unwrap();
        // The late attempt ran (it won the free lock) and was released: nothing is held.
        late.flush().await;
        proxy.set_latency(faultkit::Direction::ToServer, Duration::ZERO);
        let g = holder
            .try_lock(name.as_str(), &opts.clone().require_fencing(true))
            .await
            .unwrap()
            .unwrap_or_else(|| {
                panic!("{label}: the timed-out client's late attempt left the lock held")
            });
        let now = g.fencing_token().expect("a token");
        assert!(
            now >= first + 2,
            "{label}: the late attempt did not win in between (tokens {first} then {now}): the \
             test proved nothing"
        );
        g.release().await.unwrap();
    }
}
