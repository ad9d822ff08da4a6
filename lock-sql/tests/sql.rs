//! Backend-specific tests: server-side kills, hostile names, config validation, DB-clock expiry.
//! Server URLs come from LOCK_TEST_* (scripts/servers.sh env); unset means skip, unless
//! LOCK_TEST_REQUIRE_ALL is set.

use std::time::Duration;

use lock_sql::SqlBackend;
use lockcore::{ErrorKind, LockName, LockOptions, Locker, LostReason};
use support::{
    client, pg_url, sqlite_url, two_clients, unique, variants, variants_of, with_params,
};

mod support;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn config_is_validated_before_connecting() {
    for bad in [
        "postgres://u:pw@127.0.0.1:1/db?table=locks;%20drop",
        "postgres://u:pw@127.0.0.1:1/db?table=locks; drop",
        "mysql://u:pw@127.0.0.1:1/db?strategy=nope",
        "sqlite:///tmp/x.db?strategy=row-lock",
        "postgres://u:pw@[bad/db",
        "ftp://x/y",
    ] {
        let e = SqlBackend::connect(bad).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{bad}: {e}");
        assert!(!e.to_string().contains("pw@"), "{e}");
    }
}

/// A password never shows in `describe()`, `Debug` or an error, wherever the URL carries it:
/// in the user info or as `?password=` (regression: the query form was shown as is, and the
/// test panicked on a URL without a password).
#[tokio::test]
async fn passwords_never_show() {
    let Some(pg) = conformance::require_env("LOCK_TEST_POSTGRES_URL") else {
        return;
    };
    let url = url::Url::parse(&pg).unwrap();
    let pw = url.password().unwrap_or("").to_owned();
    // The same credentials, the password moved into the query string.
    let mut in_query = url.clone();
    in_query.set_password(None).unwrap();
    if !pw.is_empty() {
        in_query.query_pairs_mut().append_pair("password", &pw);
    }
    for u in [url.as_str(), in_query.as_str()] {
        let b = SqlBackend::connect(u).await.unwrap();
        if !pw.is_empty() {
            let shown = format!("{} {b:?}", lockcore::backend::Backend::describe(&b));
            assert!(!shown.contains(&pw), "{shown}");
        }
    }
    // A wrong password, in either place: the error does not echo it.
    let mut wrong = url.clone();
    wrong.set_password(Some("not-the-pw-zz9")).unwrap();
    let mut wrong_q = url.clone();
    wrong_q.set_password(None).unwrap();
    wrong_q
        .query_pairs_mut()
        .append_pair("password", "not-the-pw-zz9");
    for u in [wrong, wrong_q] {
        let shown = match SqlBackend::connect(u.as_str()).await {
            // A server that does not check passwords lets it in: describe() must still hide it.
            Ok(b) => format!("{} {b:?}", lockcore::backend::Backend::describe(&b)),
            Err(e) => format!("{e} {e:?}"),
        };
        assert!(!shown.contains("not-the-pw-zz9"), "{shown}");
    }
}

#[tokio::test]
async fn basic_exclusion_fencing_and_hostile_names() {
    for (label, url) in variants() {
        let (a, b) = two_clients(&url).await;
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(5))
            .wait_timeout(WAIT);
        let base = unique("hostile");
        let names = [
            format!("'; DROP TABLE x; --{base}"),
            format!("'; DROP TABLE x; -- {base}"),
            format!("\"; DELETE FROM locksmith_locks; --{base}"),
            format!("{base}%_*\\"),
        ];
        let mut guards = Vec::new();
        for n in &names {
            let g = a
                .try_lock(n.as_str(), &opts)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{label}: {n}"));
            assert!(
                b.try_lock(n.as_str(), &opts).await.unwrap().is_none(),
                "{label}: {n}"
            );
            guards.push(g);
        }
        let mut fences = Vec::new();
        for g in guards {
            fences.push(g.fencing_token().unwrap());
            g.release().await.unwrap();
        }
        // Same name again: the fencing token grows.
        let g = b.lock(names[0].as_str(), &opts).await.unwrap();
        assert!(g.fencing_token().unwrap() > fences[0], "{label}");
        g.release().await.unwrap();
        // Released twice is NotHeld (through extend on a fresh guard after release elsewhere).
        let g = a.lock(names[1].as_str(), &opts).await.unwrap();
        g.extend(Duration::from_secs(3)).await.unwrap();
        g.release().await.unwrap();
        eprintln!("{label}: ok, fences {fences:?}");
    }
}

/// Row-lock: the holding connection is killed on the server; the holder's lost signal fires
/// (ConnectionLost) and the waiter gets the lock with a larger fencing token.
#[tokio::test]
async fn killed_holder_connection_fires_lost_and_fencing_grows() {
    for (label, url) in variants_of("row-lock") {
        let (holder, waiter) = two_clients(&url).await;
        let admin = SqlBackend::connect(&url).await.unwrap();
        let name = unique("kill");
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait_timeout(WAIT);
        let g = holder.lock(name.as_str(), &opts).await.unwrap();
        let f1 = g.fencing_token().unwrap();
        let lost = g.lost();
        let w = tokio::spawn({
            let name = name.clone();
            let opts = opts.clone();
            async move { waiter.lock(name.as_str(), &opts).await }
        });
        until_a_lock_wait(&url).await;
        assert!(
            admin.revoke(&LockName::new(&name).unwrap()).await.unwrap(),
            "{label}: nothing killed"
        );
        let t0 = std::time::Instant::now();
        let reason = tokio::time::timeout(Duration::from_secs(10), lost.lost())
            .await
            .expect("lost signal");
        // The stated window: a health ping every min(ttl/4, 500 ms), plus its round trip.
        let took = t0.elapsed();
        assert!(
            took < Duration::from_millis(500)
                + Duration::from_secs(2).mul_f64(conformance::time_scale()),
            "{label}: the holder learned of the kill after {took:?}"
        );
        assert_eq!(reason, LostReason::ConnectionLost, "{label}");
        let g2 = tokio::time::timeout(WAIT, w)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            g2.fencing_token().unwrap() > f1,
            "{label}: {f1} then {:?}",
            g2.fencing_token()
        );
        assert_eq!(
            g.release().await.unwrap_err().kind(),
            ErrorKind::NotHeld,
            "{label}"
        );
        g2.release().await.unwrap();
        eprintln!("{label}: killed holder lost its lock; fence {f1} -> larger");
    }
}

/// Row-lock: a holder abandoned with its connection left open (a wedged process) loses the lock
/// through the server-side idle-transaction guard, about ttl + 1 s later.
#[tokio::test]
async fn abandoned_row_lock_is_freed_by_the_server_guard() {
    for (label, url) in variants_of("row-lock") {
        let ttl = Duration::from_secs(1);
        let (took, _, g2) = taken_over_after_abandon(&url, "abandon", ttl).await;
        // Guard = ttl + 1 s (MariaDB rounds to whole seconds and checks with its own slack).
        assert!(took >= ttl, "{label}: freed after {took:?}, before the ttl");
        assert!(
            took < ttl + Duration::from_secs(5),
            "{label}: freed after {took:?}"
        );
        g2.release().await.unwrap();
        eprintln!("{label}: abandoned holder freed after {took:?}");
    }
}

/// A holder of a new name of `prefix` for `ttl` abandons it (a wedged process: nothing
/// released, nothing renewed); another client, which finds it busy at once, waits for it.
/// How long the other waited from the abandon, the first holder's fence, the other's guard.
async fn taken_over_after_abandon(
    url: &str,
    prefix: &str,
    ttl: Duration,
) -> (Duration, Option<u64>, lockcore::LockGuard) {
    let (a, b) = two_clients(url).await;
    let name = unique(prefix);
    let opts = LockOptions::new().ttl(ttl).wait_timeout(WAIT);
    let g = a.lock(name.as_str(), &opts).await.unwrap();
    let fence = g.fencing_token();
    let t0 = tokio::time::Instant::now();
    g.abandon();
    assert!(b.try_lock(name.as_str(), &opts).await.unwrap().is_none());
    let g2 = b.lock(name.as_str(), &opts).await.unwrap();
    (t0.elapsed(), fence, g2)
}

/// Lease: an expired lease is taken over, judged on the database clock; the row's expiry is
/// ttl after the database's now.
#[tokio::test]
async fn lease_takeover_after_expiry_uses_db_clock() {
    for (label, url) in variants_of("lease") {
        let ttl = Duration::from_millis(800);
        let (took, f1, g2) = taken_over_after_abandon(&url, "expiry", ttl).await;
        assert!(
            took >= ttl - Duration::from_millis(50),
            "{label}: taken over after {took:?}"
        );
        assert!(
            took < ttl + Duration::from_secs(3),
            "{label}: taken over after {took:?}"
        );
        assert!(g2.fencing_token().unwrap() > f1.unwrap(), "{label}");
        // The first holder's lease is gone: its token no longer matches.
        g2.release().await.unwrap();
        eprintln!("{label}: taken over after {took:?}");
    }
}

/// A row lock stays held while its health check runs (regression: renewals and pings must not
/// end the holding transaction).
#[tokio::test]
async fn row_lock_survives_health_checks_and_renewals() {
    for (label, url) in variants_of("row-lock") {
        let (a, b) = two_clients(&url).await;
        let name = unique("held");
        let ttl = Duration::from_millis(600);
        let opts = LockOptions::new()
            .ttl(ttl)
            .wait_timeout(WAIT)
            .auto_renew(lockcore::AutoRenew::until(Duration::from_secs(10)));
        let g = a.lock(name.as_str(), &opts).await.unwrap();
        for i in 0..8 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            assert!(
                b.try_lock(name.as_str(), &opts).await.unwrap().is_none(),
                "{label}: taken at step {i}, lost={:?}",
                g.lost().reason()
            );
        }
        g.release().await.unwrap();
    }
}

/// A waiter granted the lock after a long wait gets a guard valid from the grant, not from the
/// moment it started waiting (regression: the guard was born expired).
#[tokio::test]
async fn waiter_validity_counts_from_the_grant() {
    for (label, url) in variants_of("row-lock") {
        let (a, b) = two_clients(&url).await;
        let name = unique("held");
        let ttl = Duration::from_millis(400);
        let opts = LockOptions::new()
            .ttl(ttl)
            .wait_timeout(WAIT)
            .auto_renew(lockcore::AutoRenew::until(ttl * 3));
        let g = a.try_lock(name.as_str(), &opts).await.unwrap().unwrap();
        let start = g.acquired_at();
        tokio::time::sleep_until(start + ttl * 3 / 2).await;
        assert!(
            b.try_lock(name.as_str(), &LockOptions::new().ttl(ttl))
                .await
                .unwrap()
                .is_none()
        );
        let g2 = b
            .lock(
                name.as_str(),
                &LockOptions::new().ttl(ttl).wait_timeout(WAIT),
            )
            .await
            .unwrap();
        let at = g2.acquired_at() - start;
        assert!(
            at >= ttl * 3 - Duration::from_millis(100),
            "{label}: taken after {at:?}"
        );
        assert!(g2.is_valid(), "{label}");
        g2.release().await.unwrap();
    }
}

/// Waits (up to 30 s) until the server shows a transaction queued for a row lock: the waiter
/// is then surely waiting in the server's queue.
async fn until_a_lock_wait(url: &str) {
    let base = url.split('?').next().unwrap_or(url);
    let (pg, my) = if base.starts_with("postgres") {
        (Some(sqlx::PgPool::connect(base).await.unwrap()), None)
    } else {
        (None, Some(sqlx::MySqlPool::connect(base).await.unwrap()))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = match (&pg, &my) {
            (Some(pool), _) => sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
            )
            .fetch_one(pool)
            .await
            .unwrap(),
            // A GET_LOCK wait shows as the state `User lock`.
            (_, Some(pool)) => sqlx::query_scalar(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'",
            )
            .fetch_one(pool)
            .await
            .unwrap(),
            _ => unreachable!("one pool is connected"),
        };
        if waiting > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no waiter queued on the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The capability notes state what is supported and the limits: the row-lock loss window, and
/// that MySQL row-lock is tested on MariaDB only; every variant offers force_release, and the
/// public `revoke` follows that capability.
#[tokio::test]
async fn capability_notes_state_the_limits() {
    for (label, url) in variants() {
        let b = SqlBackend::connect(&url).await.unwrap();
        let caps = lockcore::backend::Backend::capabilities(&b).clone();
        let notes = caps.notes.join("\n");
        if label.ends_with("row-lock") {
            assert!(notes.contains("loss window"), "{label}: {notes}");
        }
        if label == "mysql-row-lock" {
            assert!(notes.contains("MariaDB"), "{label}: {notes}");
        }
        let r = b.revoke(&LockName::new(unique("nobody")).unwrap()).await;
        assert_eq!(r.is_ok(), caps.force_release, "{label}: {r:?}");
    }
}

/// A backend on the application's own SQLite pool (no second pool) shares the locks of the
/// database file with a backend connected by URL; an in-memory pool is refused.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_backend_from_an_existing_pool_shares_the_file() {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let dir = std::env::temp_dir().join(format!("lock-sql-pool-{:016x}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("app.db");
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(&file)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let from_pool = Locker::new(
        SqlBackend::from_sqlite_pool(pool.clone(), "app_locks")
            .await
            .unwrap(),
    );
    let by_url = Locker::new(
        SqlBackend::connect(&format!("sqlite://{}?table=app_locks", file.display()))
            .await
            .unwrap(),
    );
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let g = from_pool.try_lock("job", &opts).await.unwrap().unwrap();
    assert!(g.fencing_token().is_some());
    assert!(by_url.try_lock("job", &opts).await.unwrap().is_none());
    g.release().await.unwrap();
    let g = by_url.try_lock("job", &opts).await.unwrap().unwrap();
    g.release().await.unwrap();
    // The application's pool is the one the table was created in.
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM app_locks")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    from_pool.flush().await;
    by_url.flush().await;

    let memory = SqlitePoolOptions::new()
        .connect_with(SqliteConnectOptions::new().in_memory(true))
        .await
        .unwrap();
    let err = SqlBackend::from_sqlite_pool(memory, "t").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let err = SqlBackend::from_sqlite_pool(pool, "bad;name")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A backend on the settings of the application's own PostgreSQL pool (no URL or password
/// given again) reaches the same server and contends with a backend connected by URL.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_backend_from_an_existing_pool_contends_with_the_url_one() {
    let Some(url) = conformance::require_env("LOCK_TEST_POSTGRES_URL") else {
        return;
    };
    let pool = sqlx::PgPool::connect_lazy(&url).unwrap();
    let from_pool = Locker::new(
        SqlBackend::from_pg_pool(&pool, lock_sql::Strategy::RowLock, "locksmith_locks")
            .await
            .unwrap(),
    );
    assert!(!from_pool.describe().contains("locksmith-pw"));
    let by_url = Locker::new(
        SqlBackend::connect(&format!("{url}?strategy=row-lock"))
            .await
            .unwrap(),
    );
    exclude_each_other(&from_pool, &by_url, "row-lock").await;
    let err = SqlBackend::from_pg_pool(&pool, lock_sql::Strategy::Lease, "bad;name")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    from_pool.flush().await;
    by_url.flush().await;
}

/// `a` takes a new name, `b` finds it busy; once `a` released it, `b` takes it.
async fn exclude_each_other(a: &Locker, b: &Locker, label: &str) {
    let name = unique("from-pool");
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let g = a.try_lock(name.as_str(), &opts).await.unwrap().unwrap();
    let busy = b.try_lock(name.as_str(), &opts).await.unwrap();
    assert!(busy.is_none(), "{label}");
    g.release().await.unwrap();
    let opts = opts.wait_timeout(Duration::from_secs(10));
    let g = b.lock(name.as_str(), &opts).await.unwrap();
    g.release().await.unwrap();
}

/// As for PostgreSQL: a backend on the settings of the application's own MySQL/MariaDB pool
/// reaches the same server, never shows the password, and contends with a backend by URL.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_backend_from_an_existing_pool_contends_with_the_url_one() {
    let Some(url) = conformance::require_env("LOCK_TEST_MYSQL_URL") else {
        return;
    };
    let password = url::Url::parse(&url).unwrap().password().map(str::to_owned);
    let pool = sqlx::MySqlPool::connect_lazy(&url).unwrap();
    for (strategy, query) in [
        (lock_sql::Strategy::RowLock, "strategy=row-lock"),
        (lock_sql::Strategy::Lease, "strategy=lease"),
    ] {
        let from_pool = Locker::new(
            SqlBackend::from_mysql_pool(&pool, strategy, "locksmith_locks")
                .await
                .unwrap(),
        );
        if let Some(pw) = &password {
            assert!(!from_pool.describe().contains(pw.as_str()));
            assert!(!format!("{from_pool:?}").contains(pw.as_str()));
        }
        let by_url = Locker::new(
            SqlBackend::connect(&format!("{url}?{query}"))
                .await
                .unwrap(),
        );
        exclude_each_other(&from_pool, &by_url, query).await;
        from_pool.flush().await;
        by_url.flush().await;
    }
    let err = SqlBackend::from_mysql_pool(&pool, lock_sql::Strategy::Lease, "bad;name")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}

/// Starts a `try_acquire` of `name` (30 s TTL), polls it once (its statement goes out) and
/// drops it unless it finished in that poll. Returns the request's background (its clean-up)
/// and the result if it finished.
async fn poll_once_then_drop(
    backend: &SqlBackend,
    name: &LockName,
) -> (
    lockcore::backend::Background,
    Option<lockcore::Result<Option<lockcore::backend::Acquired>>>,
) {
    let background = lockcore::backend::Background::new();
    let req = lockcore::backend::AcquireRequest::new(
        name.clone(),
        lockcore::OwnerToken::random(),
        Duration::from_secs(30),
    )
    .with_background(background.clone());
    let attempt = lockcore::backend::Backend::try_acquire(backend, &req);
    let polled = tokio::time::timeout(Duration::ZERO, attempt).await.ok();
    (background, polled)
}

/// An acquisition dropped the moment its statement is on its way leaves nothing held, on every
/// variant. SQLite's worker thread runs the statement even after the caller is gone; a clean-up
/// released at the drop could run first, find nothing, and leave the lock held for its TTL (a
/// full run's `sqlite-lease::grant_at_drop_leaves_nothing` did, once); so could a lease sent to
/// the caller after its last poll and before its drop (2 of 3 full runs, before
/// `acquire_detached` released an unclaimed outcome). Each round polls the attempt once, drops
/// it, waits for the background clean-up, and asks another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_dropped_after_its_first_poll_leaves_nothing_held() {
    for (label, url) in variants() {
        // A file of its own: the shared test file is busy with other test binaries, whose
        // contention (SQLITE_BUSY) would stretch the waits below.
        let url = if label == "sqlite-lease" {
            let dir =
                std::env::temp_dir().join(format!("lock-sql-drop-{:016x}", fastrand::u64(..)));
            std::fs::create_dir_all(&dir).unwrap();
            format!("sqlite://{}/locks.db", dir.display())
        } else {
            url
        };
        let backend = SqlBackend::connect(&url).await.unwrap();
        let other = Locker::new(SqlBackend::connect(&url).await.unwrap());
        for round in 0..20 {
            let name =
                LockName::new(format!("dropped-{label}-{round}-{}", fastrand::u32(..))).unwrap();
            let (background, polled) = poll_once_then_drop(&backend, &name).await;
            if let Some(won) = polled {
                // Done in one poll: released like any lease.
                if let Some(a) = won.unwrap() {
                    a.lease.release().await.unwrap();
                }
            }
            background.idle().await;
            // Free well before the 30 s TTL: a row lock frees once the server sees the dropped
            // statement's connection close, a moment later; 10 s leaves room for a busy machine.
            let g = other
                .lock(
                    &name,
                    &LockOptions::new()
                        .ttl(Duration::from_secs(30))
                        .wait_timeout(Duration::from_secs(10)),
                )
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{label} round {round}: an acquisition dropped after its first poll \
                         left the lock held: {e}"
                    )
                });
            g.release().await.unwrap();
        }
    }
}

/// The SQLite race itself, staged: another connection holds the database's write lock while an
/// acquisition is polled once and dropped, so its statement waits in SQLite's busy handler on
/// the worker thread; a clean-up started at the drop would wait beside it, and the first to
/// wake when the write lock goes would win. The clean-up must follow the statement, whatever
/// the order: the lock is free once the background work is done.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_acquisition_dropped_while_the_database_is_busy_leaves_nothing_held() {
    use sqlx::Connection;
    let dir = std::env::temp_dir().join(format!("lock-sql-busy-{:016x}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("locks.db");
    let url = format!("sqlite://{}", file.display());
    let backend = SqlBackend::connect(&url).await.unwrap();
    let other = Locker::new(SqlBackend::connect(&url).await.unwrap());
    let mut blocker = sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    for round in 0..10 {
        let name = LockName::new(format!("busy-{round}")).unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut blocker)
            .await
            .unwrap();
        let (background, polled) = poll_once_then_drop(&backend, &name).await;
        assert!(
            polled.is_none(),
            "the attempt finished while the database was locked"
        );
        // The fault, not synchronisation: the write lock held a while longer, while the
        // attempt's statement (and any clean-up) wait for it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        sqlx::raw_sql("COMMIT").execute(&mut blocker).await.unwrap();
        background.idle().await;
        let g = other
            .try_lock(&name, &LockOptions::new().ttl(Duration::from_secs(30)))
            .await
            .unwrap();
        assert!(
            g.is_some(),
            "round {round}: an acquisition dropped while the database was busy left the lock \
             held (for its 30 s TTL)"
        );
        g.unwrap().release().await.unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Shares on every lease variant: `inspect` lists each reader (token, metadata) in the shared
/// mode and an exclusive holder in the exclusive one; a mutex asked of a semaphore is a
/// conflict; a revoke frees the readers.
#[tokio::test]
async fn shares_show_in_inspect_and_go_with_a_revoke() {
    for (label, url) in variants() {
        if label.contains("row-lock") {
            continue;
        }
        let (a, b, w) = (client(&url).await, client(&url).await, client(&url).await);
        let name = LockName::new(unique("rw")).unwrap();
        let read = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .label("reader")
            .shared();
        let r1 = a.try_lock(&name, &read).await.unwrap().expect(label);
        let r2 = b.try_lock(&name, &read).await.unwrap().expect(label);
        let info = w.inspect(&name).await.unwrap();
        assert!(info.held, "{label}");
        assert_eq!(info.mode, Some(lockcore::LockMode::Shared), "{label}");
        let tokens: Vec<_> = info.shares.iter().map(|s| s.fencing_token).collect();
        assert_eq!(
            tokens,
            vec![r1.fencing_token(), r2.fencing_token()],
            "{label}"
        );
        for s in &info.shares {
            let holder = s.holder.as_ref().expect(label);
            assert_eq!(holder.label.as_deref(), Some("reader"), "{label}");
            assert!(
                s.ttl_left.is_some_and(|t| t > Duration::from_secs(20)),
                "{label}"
            );
        }
        assert!(w.force_release(&name).await.unwrap(), "{label}");
        let g = w
            .try_lock(&name, &LockOptions::new())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{label}: a writer after the readers were revoked"));
        let info = a.inspect(&name).await.unwrap();
        assert_eq!(info.mode, Some(lockcore::LockMode::Exclusive), "{label}");
        assert_eq!(info.fencing_token, g.fencing_token(), "{label}");
        g.release().await.unwrap();
        // The revoked readers learn it at their next renewal or release.
        assert!(r1.release().await.is_err(), "{label}");
        drop(r2);

        let sem = LockName::new(unique("sem")).unwrap();
        let permit = LockOptions::new().ttl(Duration::from_secs(30)).permits(2);
        let p = a.try_lock(&sem, &permit).await.unwrap().expect(label);
        let err = w.try_lock(&sem, &LockOptions::new()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{label}: {err}");
        let err = w
            .lock(&sem, &LockOptions::new().wait_timeout(WAIT))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{label}: {err}");
        p.release().await.unwrap();
        let g = w.try_lock(&sem, &LockOptions::new()).await.unwrap();
        assert!(g.is_some(), "{label}: a mutex once no permit is held");
        drop(g);
        for c in [a, b, w] {
            c.flush().await;
        }
    }
}

/// PostgreSQL lease: `force_release` tells the revoked holders' clients at once (a `NOTIFY`
/// naming their owner tokens, heard by every lease client's listener): an exclusive holder's,
/// every reader's and a permit's lost signal fires within a second (scaled; the TTL is 30 s,
/// so no renewal explains it), with the reason a refused renewal gives. A lease of the same
/// client that was not revoked keeps going, and a waiter queued on the revoked name is woken
/// by the same revoke. (Before the notices, every one of them learnt it at its next renewal,
/// 10 s later.)
#[tokio::test]
async fn revoked_postgres_leases_hear_it_at_once() {
    let Some(url) = pg_url("strategy=lease") else {
        return;
    };
    let (a, b) = two_clients(&url).await;
    let admin = client(&url).await;
    let ttl = Duration::from_secs(30);
    let bound = support::scaled(Duration::from_secs(1));
    let heard = |lost: lockcore::LostSignal, what: &'static str| async move {
        let reason = tokio::time::timeout(bound, lost.lost())
            .await
            .unwrap_or_else(|_| panic!("{what}: not told of the revoke within {bound:?}"));
        assert_eq!(reason, LostReason::RenewalRefused, "{what}");
    };

    // An exclusive holder, a lease of the same client beside it, and a waiter behind it.
    let x = LockName::new(unique("revoked-x")).unwrap();
    let kept = LockName::new(unique("revoked-kept")).unwrap();
    let g = a
        .try_lock(&x, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .unwrap();
    let other = a
        .try_lock(&kept, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let (b, x) = (b.clone(), x.clone());
        async move {
            b.lock(&x, &LockOptions::new().ttl(ttl).wait_timeout(WAIT))
                .await
        }
    });
    tokio::time::timeout(WAIT, async {
        while admin.inspect(&x).await.unwrap().waiters != Some(1) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the waiter queued");
    assert!(admin.force_release(&x).await.unwrap());
    heard(g.lost(), "the exclusive holder").await;
    assert!(!g.is_valid());
    let next = tokio::time::timeout(WAIT, waiter)
        .await
        .expect("the waiter woke")
        .unwrap()
        .expect("the waiter got the revoked lock");
    assert!(next.fencing_token() > g.fencing_token());
    assert!(other.is_valid(), "a lease the revoke did not name");
    assert_eq!(other.lost().reason(), None);

    // Readers in two clients, and a permit.
    let y = LockName::new(unique("revoked-y")).unwrap();
    let read = LockOptions::new().ttl(ttl).shared();
    let r1 = a.try_lock(&y, &read).await.unwrap().unwrap();
    let r2 = b.try_lock(&y, &read).await.unwrap().unwrap();
    assert!(admin.force_release(&y).await.unwrap());
    heard(r1.lost(), "the first reader").await;
    heard(r2.lost(), "the second reader").await;
    let p = LockName::new(unique("revoked-p")).unwrap();
    let permit = a
        .try_lock(&p, &LockOptions::new().ttl(ttl).permits(3))
        .await
        .unwrap()
        .unwrap();
    assert!(admin.force_release(&p).await.unwrap());
    heard(permit.lost(), "the permit").await;

    assert!(other.is_valid(), "a lease no revoke named");
    assert!(
        !admin.force_release(&y).await.unwrap(),
        "nothing left to revoke"
    );
    next.release().await.unwrap();
    other.release().await.unwrap();
}

/// A lock table made before shares existed gets their columns and table on connect, and
/// readers and writers then work on it.
#[tokio::test]
async fn an_older_lock_table_gets_the_share_columns() {
    let t = "locksmith_old_shape";
    for (label, url) in variants() {
        if label.contains("row-lock") {
            continue;
        }
        let (drop_old, create_old) = if label.starts_with("pg") {
            (
                format!("DROP TABLE IF EXISTS {t}, {t}_shares"),
                format!(
                    "CREATE TABLE {t} (name TEXT PRIMARY KEY, owner TEXT, \
                       fence BIGINT NOT NULL DEFAULT 0, \
                       expires_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch')"
                ),
            )
        } else if label.starts_with("mysql") {
            (
                format!("DROP TABLE IF EXISTS {t}, {t}_shares"),
                format!(
                    "CREATE TABLE {t} (name VARBINARY(320) NOT NULL PRIMARY KEY, \
                       owner CHAR(32) NULL, fence BIGINT UNSIGNED NOT NULL DEFAULT 0, \
                       expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:01', \
                       holder BIGINT UNSIGNED NULL) ENGINE=InnoDB"
                ),
            )
        } else {
            (
                format!("DROP TABLE IF EXISTS {t}; DROP TABLE IF EXISTS {t}_shares"),
                format!(
                    "CREATE TABLE {t} (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
                       fence INTEGER NOT NULL DEFAULT 0, expires_at REAL NOT NULL DEFAULT 0)"
                ),
            )
        };
        let plain = url.split('?').next().unwrap().to_owned();
        let ddl = format!("{drop_old}; {create_old}");
        if label.starts_with("pg") {
            let pool = sqlx::PgPool::connect(&plain).await.unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
                .execute(&pool)
                .await
                .unwrap();
        } else if label.starts_with("mysql") {
            let pool = sqlx::MySqlPool::connect(&plain).await.unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
                .execute(&pool)
                .await
                .unwrap();
        } else {
            let pool = sqlx::SqlitePool::connect(&plain).await.unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
                .execute(&pool)
                .await
                .unwrap();
        }
        let url = with_params(&url, &format!("table={t}"));
        let (a, b) = (client(&url).await, client(&url).await);
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let r = a.try_lock("old", &opts.clone().shared()).await.unwrap();
        let r = r.unwrap_or_else(|| panic!("{label}: a reader on the older table"));
        assert!(b.try_lock("old", &opts).await.unwrap().is_none(), "{label}");
        let read_token = r.fencing_token();
        r.release().await.unwrap();
        let g = b.try_lock("old", &opts).await.unwrap();
        let g = g.unwrap_or_else(|| panic!("{label}: a writer once the reader left"));
        assert!(g.fencing_token() > read_token, "{label}");
        g.release().await.unwrap();
    }
}

/// A shares table made as a rowid table (before it was `WITHOUT ROWID`) is rebuilt without
/// rowid on connect, its live shares and its triggers kept: a share held before keeps a
/// writer out, and a new share gets a fence above it.
#[tokio::test]
async fn a_rowid_shares_table_is_rebuilt_with_its_shares() {
    let t = "locksmith_rowid_shares";
    let st = format!("{t}_shares");
    let plain = sqlite_url().split('?').next().unwrap().to_owned();
    // The file may not exist yet (this test run alone on a fresh temp file).
    let opts = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(&plain)
        .unwrap()
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    let now = "((julianday('now') - 2440587.5) * 86400.0)";
    let ddl = format!(
        "DROP TABLE IF EXISTS {t}; DROP TABLE IF EXISTS {st}; \
         CREATE TABLE {t} (name TEXT NOT NULL PRIMARY KEY, owner TEXT, \
           fence INTEGER NOT NULL DEFAULT 0, expires_at REAL NOT NULL DEFAULT 0, holder TEXT, \
           shares_until REAL, writer_until REAL); \
         CREATE TABLE {st} (name TEXT NOT NULL, token TEXT NOT NULL, mode TEXT NOT NULL, \
           expires_at REAL NOT NULL, fence INTEGER NOT NULL, holder TEXT, \
           PRIMARY KEY (name, token)); \
         INSERT INTO {t} (name, fence, shares_until) VALUES ('kept', 5, {now} + 30); \
         INSERT INTO {st} (name, token, mode, expires_at, fence) \
           VALUES ('kept', 'earlier', 'shared', {now} + 30, 5);"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&pool)
        .await
        .unwrap();
    let url = with_params(&sqlite_url(), &format!("table={t}"));
    let (a, b) = (client(&url).await, client(&url).await);
    let schema: Vec<(String, String)> =
        sqlx::query_as("SELECT type, name FROM sqlite_master WHERE tbl_name = ?1 ORDER BY name")
            .bind(&st)
            .fetch_all(&pool)
            .await
            .unwrap();
    let names: Vec<&str> = schema.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            st.as_str(),
            "locksmith_rowid_shares_sins1",
            "locksmith_rowid_shares_supd1"
        ],
        "no key index of its own, the triggers: {schema:?}"
    );
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    assert!(
        b.try_lock("kept", &opts).await.unwrap().is_none(),
        "the share kept holds writers off"
    );
    let r = a.try_lock("kept", &opts.clone().shared()).await.unwrap();
    let r = r.expect("a reader beside the kept share");
    assert!(r.fencing_token() > Some(5), "{:?}", r.fencing_token());
    r.release().await.unwrap();
    pool.close().await;
}

/// A share's renewal counts for writers too (the lease row's `shares_until` follows it): a
/// reader extended past its first TTL still keeps a writer out after that TTL has run out,
/// and an extend after a revoke is refused.
#[tokio::test]
async fn an_extended_share_keeps_writers_out_past_its_first_ttl() {
    for (label, url) in variants() {
        if label.contains("row-lock") {
            continue;
        }
        let (a, w) = (client(&url).await, client(&url).await);
        let name = LockName::new(unique("ext")).unwrap();
        let ttl = Duration::from_millis(800);
        let read = LockOptions::new().ttl(ttl).no_auto_renew().shared();
        let r = a.try_lock(&name, &read).await.unwrap().expect(label);
        r.extend(Duration::from_secs(30)).await.unwrap();
        let info = w.inspect(&name).await.unwrap();
        assert!(
            info.ttl_left.is_some_and(|t| t > Duration::from_secs(20)),
            "{label}: {info:?}"
        );
        // A writer keeps trying until well past the share's first TTL: refused every time.
        let write = LockOptions::new().ttl(Duration::from_secs(10));
        let past_first_ttl = tokio::time::Instant::now() + ttl + Duration::from_millis(200);
        loop {
            assert!(
                w.try_lock(&name, &write).await.unwrap().is_none(),
                "{label}: a writer beside a reader extended past its first TTL"
            );
            if tokio::time::Instant::now() >= past_first_ttl {
                break;
            }
        }
        assert!(w.force_release(&name).await.unwrap(), "{label}");
        let err = r.extend(Duration::from_secs(30)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotHeld, "{label}: {err}");
        let g = w.try_lock(&name, &write).await.unwrap().expect(label);
        g.release().await.unwrap();
        drop(r);
        a.flush().await;
        w.flush().await;
    }
}

/// Polls `queued_waiters` (faultkit's poll) until it reports `n`, within a scaled bound.
async fn until_queued(locker: &Locker, name: &str, n: usize) {
    let name = LockName::new(name).unwrap();
    let bound = Duration::from_secs(10).mul_f64(conformance::time_scale());
    faultkit::wait_until(&format!("{n} waiters queued"), bound, || async {
        Ok(locker.backend().queued_waiters(&name).await.unwrap() == n)
    })
    .await
    .unwrap();
}

/// PostgreSQL row lock without a fencing token: no token, and the lock row's counter is not
/// bumped (nothing written: inspect still shows the last token taken), so the next holder that
/// asks gets exactly the next token.
#[tokio::test]
async fn pg_row_lock_without_fencing_bumps_no_counter() {
    let Some(url) = pg_url("strategy=row-lock") else {
        return;
    };
    let (a, b) = (client(&url).await, client(&url).await);
    let name = unique("nofence");
    let fenced = LockOptions::new().require_fencing(true).wait_timeout(WAIT);
    let g = a.lock(name.as_str(), &fenced).await.unwrap();
    let first = g.fencing_token().expect("a token asked for");
    g.release().await.unwrap();
    for round in 0..3 {
        let g = a
            .lock(name.as_str(), &fenced.clone().no_fencing())
            .await
            .unwrap();
        assert_eq!(g.fencing_token(), None, "round {round}");
        // Held (the advisory lock) and excluding, with the counter as the first holder left it.
        assert!(
            b.try_lock(name.as_str(), &fenced).await.unwrap().is_none(),
            "round {round}: a lock held without a token did not exclude"
        );
        let info = b.inspect(name.as_str()).await.unwrap();
        assert!(info.held, "round {round}");
        assert_eq!(info.fencing_token, Some(first), "round {round}");
        g.release().await.unwrap();
    }
    // A reader without a token writes nothing either.
    let r = a
        .lock(name.as_str(), &fenced.clone().no_fencing().shared())
        .await
        .unwrap();
    assert_eq!(r.fencing_token(), None, "a reader that asked for no token");
    r.release().await.unwrap();
    let g = b.lock(name.as_str(), &fenced).await.unwrap();
    assert_eq!(g.fencing_token(), Some(first + 1));
    g.release().await.unwrap();
}

/// The advisory key of `$1` in the default lock table, as lock-sql's docs give it for `psql`
/// peers: `hashtextextended(name, seed)`, the seed the FNV-1a of `locksmith_locks`.
const PG_KEY: &str = "hashtextextended($1, -6380568882776862090)";

/// A plain session on the PostgreSQL test database, as `psql` would open one.
async fn pg_session() -> sqlx::PgConnection {
    use sqlx::Connection;
    let url = conformance::require_env("LOCK_TEST_POSTGRES_URL").expect("a PostgreSQL URL");
    sqlx::PgConnection::connect(&url).await.unwrap()
}

/// `SELECT <f>(<key of name>)` on a plain session: whether an advisory-lock function
/// answered true.
async fn pg_advisory(conn: &mut sqlx::PgConnection, f: &str, name: &str) -> bool {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {f}({PG_KEY})")))
        .bind(name)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// PostgreSQL row-lock readers and plain sessions on the documented key: a plain
/// `pg_advisory_lock_shared` reader holds beside a locksmith reader, a plain
/// `pg_advisory_lock` writer is kept out (refused at once, or queued), a locksmith reader
/// coming after the queued plain writer waits (no starving it), and while the plain writer
/// holds, locksmith's readers and writers are kept out. `inspect` tells the modes apart.
#[tokio::test]
async fn pg_row_lock_readers_and_plain_sessions_on_the_documented_key() {
    let Some(url) = pg_url("strategy=row-lock") else {
        return;
    };
    let (a, b) = (client(&url).await, client(&url).await);
    let name = unique("rw-plain");
    let read = LockOptions::new().ttl(Duration::from_secs(30)).shared();
    let write = LockOptions::new().ttl(Duration::from_secs(30));
    let r = a
        .try_lock(name.as_str(), &read)
        .await
        .unwrap()
        .expect("a reader");
    let mut plain_reader = pg_session().await;
    assert!(
        pg_advisory(&mut plain_reader, "pg_try_advisory_lock_shared", &name).await,
        "a plain reader beside a locksmith reader"
    );
    let info = b.inspect(name.as_str()).await.unwrap();
    assert!(info.held, "{info:?}");
    assert_eq!(info.mode, Some(lockcore::LockMode::Shared), "{info:?}");
    assert_eq!(info.shares.len(), 2, "two reader sessions: {info:?}");
    let mut plain_writer = pg_session().await;
    assert!(
        !pg_advisory(&mut plain_writer, "pg_try_advisory_lock", &name).await,
        "a plain writer beside readers"
    );
    let writer = tokio::spawn({
        let name = name.clone();
        async move {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT pg_advisory_lock({PG_KEY})"
            )))
            .bind(&name)
            .execute(&mut plain_writer)
            .await
            .unwrap();
            plain_writer
        }
    });
    until_queued(&b, &name, 1).await;
    assert!(
        b.try_lock(name.as_str(), &read).await.unwrap().is_none(),
        "a locksmith reader joined the readers ahead of a waiting plain writer"
    );
    r.release().await.unwrap();
    assert!(pg_advisory(&mut plain_reader, "pg_advisory_unlock_shared", &name).await);
    let mut plain_writer = tokio::time::timeout(WAIT, writer)
        .await
        .expect("the plain writer got the lock once the readers left")
        .unwrap();
    for (what, opts) in [("reader", &read), ("writer", &write)] {
        assert!(
            a.try_lock(name.as_str(), opts).await.unwrap().is_none(),
            "a locksmith {what} beside a plain writer"
        );
    }
    let info = b.inspect(name.as_str()).await.unwrap();
    assert!(info.held, "{info:?}");
    assert_eq!(info.mode, Some(lockcore::LockMode::Exclusive), "{info:?}");
    assert!(pg_advisory(&mut plain_writer, "pg_advisory_unlock", &name).await);
    let r = a.try_lock(name.as_str(), &read).await.unwrap();
    r.expect("a reader once the plain writer left")
        .release()
        .await
        .unwrap();
}

/// PostgreSQL row-lock readers arriving together: each takes the lock row's counter in its
/// own commit (the bumps wait for each other's commit on the row, not for each other's hold),
/// so all hold at once, each with a token of its own, and the next writer's is above them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_row_lock_readers_arriving_together_all_hold_with_tokens_of_their_own() {
    let Some(url) = pg_url("strategy=row-lock") else {
        return;
    };
    let name = unique("readers");
    let read = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .require_fencing(true)
        .shared();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client(&url).await);
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(clients.len()));
    let tasks: Vec<_> = clients
        .iter()
        .map(|c| {
            let (c, name, read, start) = (c.clone(), name.clone(), read.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                c.try_lock(name.as_str(), &read).await
            })
        })
        .collect();
    let mut readers = Vec::new();
    for t in tasks {
        let r = t.await.unwrap().unwrap();
        readers.push(r.expect("a reader beside readers"));
    }
    let mut tokens: Vec<u64> = readers.iter().map(|r| r.fencing_token().unwrap()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        readers.len(),
        "readers shared a token: {tokens:?}"
    );
    let info = clients[0].inspect(name.as_str()).await.unwrap();
    assert_eq!(info.shares.len(), readers.len(), "{info:?}");
    for r in readers {
        r.release().await.unwrap();
    }
    let write = LockOptions::new().require_fencing(true);
    let w = clients[0].try_lock(name.as_str(), &write).await.unwrap();
    let w = w.expect("a writer once the readers left");
    assert!(w.fencing_token().unwrap() > *tokens.last().unwrap());
    w.release().await.unwrap();
}

/// PostgreSQL row lock: a holder asking for the other mode of its own lock is not granted it
/// (no upgrade, no downgrade: the contract's rule for every backend, where modes are
/// contention and locks are not reentrant): `try_lock` finds it busy, `lock` times out.
#[tokio::test]
async fn pg_row_lock_holder_gets_no_other_mode_of_its_own_lock() {
    let Some(url) = pg_url("strategy=row-lock") else {
        return;
    };
    let a = client(&url).await;
    let name = unique("upgrade");
    let read = LockOptions::new().ttl(Duration::from_secs(30)).shared();
    let write = LockOptions::new().ttl(Duration::from_secs(30));
    let r = a
        .try_lock(name.as_str(), &read)
        .await
        .unwrap()
        .expect("a reader");
    assert!(
        a.try_lock(name.as_str(), &write).await.unwrap().is_none(),
        "a reader upgraded to the writer's lock"
    );
    let short = write
        .clone()
        .wait_timeout(Duration::from_millis(300).mul_f64(conformance::time_scale()));
    let err = a.lock(name.as_str(), &short).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    r.release().await.unwrap();
    // `lock`, not `try_lock`: the writer's wait cut off above may have been granted on its
    // connection just as it was given up, and that connection is closed in the background
    // (the cancelled wait leaves nothing held, within a bound, not at once).
    let settle = write
        .clone()
        .wait_timeout(Duration::from_secs(5).mul_f64(conformance::time_scale()));
    let w = a.lock(name.as_str(), &settle).await.expect("a writer");
    assert!(
        a.try_lock(name.as_str(), &read).await.unwrap().is_none(),
        "a writer took a reader's lock beside its own"
    );
    w.release().await.unwrap();
}

/// PostgreSQL row-lock reader: readers' counter bumps wait for each other's commit on the lock
/// row. A reader whose attempt ends during that wait (the row held here by a plain
/// transaction) leaves nothing held: its session's shared advisory lock, taken before the row
/// wait, goes with its connection. Two ways to end there: a waiting `lock()` cut off at its
/// deadline, and a `try_lock` on sessions with a `lock_timeout` of their own (a server, role
/// or URL setting), which must not end the row wait with "busy" and put the connection back
/// in the pool with the lock still held.
#[tokio::test]
async fn pg_row_lock_reader_cut_off_at_the_counter_row_leaves_nothing_held() {
    let Some(url) = pg_url("strategy=row-lock") else {
        return;
    };
    let timed = with_params(&url, "options[lock_timeout]=200ms&op_timeout_ms=1500");
    let b = client(&url).await;
    let read = LockOptions::new().ttl(Duration::from_secs(30)).shared();
    for (case, url) in [("lock() cut off", &url), ("try_lock, lock_timeout", &timed)] {
        let a = client(url).await;
        let name = unique("rowwait");
        let g = a
            .try_lock(name.as_str(), &LockOptions::new())
            .await
            .unwrap();
        g.expect("the lock row made").release().await.unwrap();
        let mut blocker = pg_session().await;
        sqlx::raw_sql("BEGIN").execute(&mut blocker).await.unwrap();
        sqlx::query("SELECT 1 FROM locksmith_locks WHERE name = $1 FOR UPDATE")
            .bind(&name)
            .execute(&mut blocker)
            .await
            .unwrap();
        if url == &timed {
            // Held back past lock_timeout, then cut off by the operation timeout.
            let outcome = a.try_lock(name.as_str(), &read).await;
            assert!(
                !matches!(outcome, Ok(Some(_))),
                "{case}: a reader past a held counter row"
            );
        } else {
            let wait = Duration::from_millis(500).mul_f64(conformance::time_scale());
            let err = a
                .lock(name.as_str(), &read.clone().wait_timeout(wait))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Timeout, "{case}: {err}");
        }
        // The row is still held: only a writer that writes no counter can look.
        let probe = LockOptions::new().no_fencing();
        let bound = Duration::from_secs(10).mul_f64(conformance::time_scale());
        faultkit::wait_until(
            &format!("{case}: the reader's session to end"),
            bound,
            || {
                let (b, name, probe) = (&b, &name, &probe);
                async move {
                    Ok(match b.try_lock(name.as_str(), probe).await.unwrap() {
                        Some(g) => {
                            g.release().await.unwrap();
                            true
                        }
                        None => false,
                    })
                }
            },
        )
        .await
        .unwrap();
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut blocker)
            .await
            .unwrap();
        let r = a.try_lock(name.as_str(), &read).await.unwrap();
        r.unwrap_or_else(|| panic!("{case}: a reader once the row is free"))
            .release()
            .await
            .unwrap();
    }
}

/// PostgreSQL lease: a waiter whose `lock()` is dropped, or times out, leaves no queue entry
/// (removed in the background, which `flush` waits for), and the lock goes to the next waiter.
#[tokio::test]
async fn pg_lease_waiter_that_leaves_takes_its_queue_entry() {
    let Some(url) = pg_url("strategy=lease") else {
        return;
    };
    let (holder, w1, w2) = (client(&url).await, client(&url).await, client(&url).await);
    let name = unique("queue");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let g = holder
        .try_lock(name.as_str(), &opts)
        .await
        .unwrap()
        .unwrap();
    let dropped = tokio::spawn({
        let (w1, name, opts) = (w1.clone(), name.clone(), opts.clone());
        async move { w1.lock(name.as_str(), &opts).await }
    });
    until_queued(&holder, &name, 1).await;
    let next = tokio::spawn({
        let (w2, name, opts) = (w2.clone(), name.clone(), opts.clone());
        async move { w2.lock(name.as_str(), &opts).await }
    });
    until_queued(&holder, &name, 2).await;
    // The head goes: its entry with it; the second is now the head.
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    w1.flush().await;
    until_queued(&holder, &name, 1).await;
    // A wait that times out leaves too.
    let short = opts.clone().wait_timeout(Duration::from_millis(300));
    let err = w1.lock(name.as_str(), &short).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    w1.flush().await;
    until_queued(&holder, &name, 1).await;
    // The release names the head, which takes the lock at once (well before its 2 s poll).
    let released = tokio::time::Instant::now();
    g.release().await.unwrap();
    let g2 = tokio::time::timeout(WAIT, next)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(
        took < Duration::from_millis(1500).mul_f64(conformance::time_scale()),
        "the queue's head took {took:?} to get a released lock"
    );
    until_queued(&holder, &name, 0).await;
    g2.release().await.unwrap();
}

/// PostgreSQL lease: an entry left by a crashed waiter (nobody removes it) holds a freed lock
/// back from the waiters behind it only until the entry expires, on the server's clock.
#[tokio::test]
async fn pg_lease_crashed_waiters_entry_expires_on_its_own() {
    let Some(url) = pg_url("strategy=lease") else {
        return;
    };
    let base = url.split('?').next().unwrap().to_owned();
    let pool = sqlx::PgPool::connect(&base).await.unwrap();
    let (holder, waiter) = (client(&url).await, client(&url).await);
    let name = unique("crashed");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    // Creates the tables.
    let g = holder
        .try_lock(name.as_str(), &opts)
        .await
        .unwrap()
        .unwrap();
    // A waiter that crashed at the head of the queue: an entry expiring in 1 s.
    sqlx::query(
        "INSERT INTO locksmith_locks_waits (name, waiter, mode, enqueued, expires) \
         VALUES ($1, 'crashed', 'x', clock_timestamp(), clock_timestamp() + interval '1 second')",
    )
    .bind(&name)
    .execute(&pool)
    .await
    .unwrap();
    g.release().await.unwrap();
    // Free, but the queue has a live head: a try_lock does not jump it.
    assert!(
        holder
            .try_lock(name.as_str(), &opts)
            .await
            .unwrap()
            .is_none()
    );
    let started = tokio::time::Instant::now();
    let g = waiter
        .lock(name.as_str(), &opts.clone().wait_timeout(WAIT))
        .await
        .unwrap();
    // The entry's second, then at most a safety poll (2 s), with room for a loaded machine.
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(6).mul_f64(conformance::time_scale()),
        "a crashed waiter's entry held the lock back {took:?}"
    );
    g.release().await.unwrap();
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM locksmith_locks_waits WHERE name = $1")
            .bind(&name)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(left, 0, "the expired entry was not cleared");
}

/// (label, url) of every lease variant whose server is configured, SQLite in a file of its own
/// (the shared test file is busy with other test binaries, whose write locks would stretch a
/// set's transaction into retries).
fn fresh_lease_variants() -> Vec<(&'static str, String)> {
    variants_of("-lease")
        .into_iter()
        .map(|(label, url)| {
            if label == "sqlite-lease" {
                let dir =
                    std::env::temp_dir().join(format!("lock-sql-set-{:016x}", fastrand::u64(..)));
                std::fs::create_dir_all(&dir).unwrap();
                (label, format!("sqlite://{}/locks.db", dir.display()))
            } else {
                (label, url)
            }
        })
        .collect()
}

/// A lease set is one transaction: with its middle member held by a peer (a second backend
/// instance: its own pool and connections), `try_lock_all` takes nothing, leaving the other
/// members free for the peer and its first member's counter untouched; once the member is free the set is taken whole, each member's
/// fencing token the next of its name's counter (as a single acquisition's: the rolled-back
/// attempt consumed none), and released whole.
#[tokio::test]
async fn a_lease_set_with_a_member_held_by_a_peer_takes_nothing() {
    for (label, url) in fresh_lease_variants() {
        let (a, peer) = (client(&url).await, client(&url).await);
        assert!(a.capabilities().atomic_multi.is_yes(), "{label}");
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let names: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|n| unique(&format!("set-{n}")))
            .collect();
        let held = peer
            .try_lock(names[1].as_str(), &opts)
            .await
            .unwrap()
            .unwrap();
        assert!(
            a.try_lock_all(names.clone(), &opts)
                .await
                .unwrap()
                .is_none(),
            "{label}: a set with a member held by a peer was taken"
        );
        // The others were left free: the peer takes each (and notes its token).
        let mut tokens = Vec::new();
        for (i, name) in names.iter().enumerate() {
            if i == 1 {
                tokens.push(held.fencing_token().unwrap());
                continue;
            }
            let g = peer
                .try_lock(name.as_str(), &opts)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{label}: {name} was left held by a lost set"));
            tokens.push(g.fencing_token().unwrap());
            g.release().await.unwrap();
        }
        // The lost set's transaction left no trace: its first member's counter was never
        // committed (a set taken one member at a time would have taken and released it).
        assert_eq!(tokens[0], 1, "{label}: the lost set's first member");
        held.release().await.unwrap();
        let set = a
            .try_lock_all(names.clone(), &opts)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{label}: a free set was not taken"));
        let next: Vec<_> = tokens.iter().map(|t| Some(t + 1)).collect();
        assert_eq!(set.fencing_tokens(), next, "{label}: the set's tokens");
        for name in &names {
            assert!(
                peer.try_lock(name.as_str(), &opts).await.unwrap().is_none(),
                "{label}: {name} of a held set was free"
            );
        }
        set.release().await.unwrap();
        let again = peer
            .try_lock_all(names.clone(), &opts)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{label}: a released set was not free"));
        again.release().await.unwrap();
    }
}

/// PostgreSQL lease: a set does not jump a queue. A member free but with a live waiter queued
/// (a peer's plain row in `<table>_waits`) loses the set exactly as it loses a `try_lock`;
/// once the entry is gone the set is taken.
#[tokio::test]
async fn pg_lease_set_does_not_jump_a_queue() {
    let Some(url) = pg_url("strategy=lease") else {
        return;
    };
    let base = url.split('?').next().unwrap().to_owned();
    let pool = sqlx::PgPool::connect(&base).await.unwrap();
    let a = client(&url).await;
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let names: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| unique(&format!("queued-set-{n}")))
        .collect();
    // Creates the tables.
    a.try_lock_all(names.clone(), &opts)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO locksmith_locks_waits (name, waiter, mode, enqueued, expires) \
         VALUES ($1, 'peer', 'x', clock_timestamp(), clock_timestamp() + interval '60 seconds')",
    )
    .bind(&names[1])
    .execute(&pool)
    .await
    .unwrap();
    assert!(
        a.try_lock(names[1].as_str(), &opts)
            .await
            .unwrap()
            .is_none(),
        "a try_lock jumped the queue"
    );
    assert!(
        a.try_lock_all(names.clone(), &opts)
            .await
            .unwrap()
            .is_none(),
        "a set jumped the queue of its middle member"
    );
    for name in [&names[0], &names[2]] {
        let g = a.try_lock(name.as_str(), &opts).await.unwrap();
        assert!(g.is_some(), "{name} was left held by a lost set");
        g.unwrap().release().await.unwrap();
    }
    sqlx::query("DELETE FROM locksmith_locks_waits WHERE name = $1 AND waiter = 'peer'")
        .bind(&names[1])
        .execute(&pool)
        .await
        .unwrap();
    let set = a.try_lock_all(names.clone(), &opts).await.unwrap();
    assert!(
        set.is_some(),
        "the set was not taken once the queue was empty"
    );
    set.unwrap().release().await.unwrap();
}

/// A set attempt dropped the moment its transaction is on its way leaves nothing held, on
/// every lease variant: rolled back when the caller left before the commit, released in the
/// background when after. Each round polls the attempt once, drops it, waits for the
/// background work, and asks another client for every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_attempt_dropped_after_its_first_poll_leaves_nothing_held() {
    for (label, url) in fresh_lease_variants() {
        let backend = SqlBackend::connect(&url).await.unwrap();
        let other = Locker::new(SqlBackend::connect(&url).await.unwrap());
        for round in 0..10 {
            let background = lockcore::backend::Background::new();
            let names: Vec<LockName> = (0..3)
                .map(|i| {
                    LockName::new(format!(
                        "dropped-set-{label}-{round}-{i}-{}",
                        fastrand::u32(..)
                    ))
                    .unwrap()
                })
                .collect();
            let reqs: Vec<_> = names
                .iter()
                .map(|name| {
                    lockcore::backend::AcquireRequest::new(
                        name.clone(),
                        lockcore::OwnerToken::random(),
                        Duration::from_secs(30),
                    )
                    .with_background(background.clone())
                })
                .collect();
            let attempt = lockcore::backend::Backend::try_acquire_all(&backend, &reqs);
            if let Ok(done) = tokio::time::timeout(Duration::ZERO, attempt).await
                && let lockcore::backend::SetAttempt::All(won) = done.unwrap()
            {
                for a in won {
                    a.lease.release().await.unwrap();
                }
            }
            background.idle().await;
            // Free well before the 30 s TTL; 10 s leaves room for a busy machine.
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(30))
                .wait_timeout(Duration::from_secs(10));
            for name in &names {
                let g = other.lock(name, &opts).await.unwrap_or_else(|e| {
                    panic!(
                        "{label} round {round}: a set attempt dropped after its first poll \
                         left {name:?} held: {e}"
                    )
                });
                g.release().await.unwrap();
            }
        }
    }
}

/// A fresh lock table name of `prefix` (unquoted identifiers fold to lower case).
fn unique_table(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Drops lock table `t`, its shares and queue tables and its share functions.
async fn drop_pg_lock_table(conn: &mut sqlx::PgConnection, t: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {t}, {t}_shares, {t}_waits; \
         DROP FUNCTION IF EXISTS {t}_sacq1(text, text, float8, text, int8, text); \
         DROP FUNCTION IF EXISTS {t}_sacq2(text, text, float8, text, int8, text); \
         DROP FUNCTION IF EXISTS {t}_srel1(text, text, text); \
         DROP FUNCTION IF EXISTS {t}_lheld1(text, bool)"
    )))
    .execute(conn)
    .await
    .unwrap();
}

/// The share functions' catalog rows of lock table `t`: (name, xmin), by name.
async fn pg_share_functions(conn: &mut sqlx::PgConnection, t: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT proname::text, xmin::text FROM pg_proc WHERE proname IN ($1, $2) ORDER BY 1",
    )
    .bind(format!("{t}_sacq2"))
    .bind(format!("{t}_srel1"))
    .fetch_all(conn)
    .await
    .unwrap()
}

/// PostgreSQL lease: clients connecting at once on a fresh lock table create its share
/// functions once (concurrent `CREATE FUNCTION`s of one name would fail), a later connect
/// leaves them as they are (never replaced under a client running them), and permits taken
/// through them at once by every client obey the limit, each with a token of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_share_functions_are_created_once_by_concurrent_connects() {
    let Some(base) = pg_url("strategy=lease") else {
        return;
    };
    let t = unique_table("locksmith_fn");
    let url = with_params(&base, &format!("table={t}"));
    let connects = (0..8).map(|_| SqlBackend::connect(&url));
    let lockers: Vec<Locker> = futures::future::join_all(connects)
        .await
        .into_iter()
        .map(|b| Locker::new(b.expect("a concurrent first connect")))
        .collect();
    let mut conn = pg_session().await;
    let created = pg_share_functions(&mut conn, &t).await;
    let names: Vec<&str> = created.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [format!("{t}_sacq2"), format!("{t}_srel1")]);
    let later = client(&url).await;
    assert_eq!(
        pg_share_functions(&mut conn, &t).await,
        created,
        "a later connect replaced the share functions"
    );

    let sem = unique("fnsem");
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).permits(3);
    let tries = lockers.iter().map(|l| l.try_lock(sem.as_str(), &opts));
    let held: Vec<_> = futures::future::join_all(tries)
        .await
        .into_iter()
        .filter_map(|r| r.expect("a permit attempt"))
        .collect();
    assert_eq!(held.len(), 3, "permits held out of a limit of 3");
    let mut tokens: Vec<_> = held.iter().map(|g| g.fencing_token().unwrap()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "tokens {tokens:?}");
    let info = later.inspect(sem.as_str()).await.unwrap();
    assert_eq!(info.shares.len(), 3, "{info:?}");
    for g in held {
        g.release().await.unwrap();
    }
    assert!(!later.inspect(sem.as_str()).await.unwrap().held);
    for l in lockers.iter().chain([&later]) {
        l.flush().await;
    }
    drop(lockers);
    drop(later);
    drop_pg_lock_table(&mut conn, &t).await;
}

/// PostgreSQL lease, rolling upgrade: a share taken by an older client's statements (a
/// transaction: the lease row locked, the live shares read, the share inserted with the row's
/// next fence) and the share function exclude each other on the lease row. A permit attempt
/// that waits for the row behind the older client's open transaction reads the share it
/// committed meanwhile (the function reads after the row lock, where one statement would
/// have read before it) and stays within the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_share_function_reads_an_older_clients_share_committed_while_it_waited() {
    use sqlx::Connection;
    let Some(base) = pg_url("strategy=lease") else {
        return;
    };
    let t = unique_table("locksmith_old_share");
    let url = with_params(&base, &format!("table={t}"));
    let (new, other) = (client(&url).await, client(&url).await);
    let name = unique("mixed");
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).permits(1);
    let mut old = pg_session().await;
    // The older client's share attempt, as its statements were, left open after the insert.
    let mut tx = old.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} AS l (name) VALUES ($1) ON CONFLICT (name) DO UPDATE SET name = l.name"
    )))
    .bind(&name)
    .execute(&mut *tx)
    .await
    .unwrap();
    let live: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {t}_shares WHERE name = $1 AND expires_at > clock_timestamp()"
    )))
    .bind(&name)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(live, 0);
    let old_fence: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "WITH n AS MATERIALIZED (SELECT clock_timestamp() + $3::float8 * interval '1 microsecond' AS until), \
         f AS (UPDATE {t} SET fence = fence + 1, \
           shares_until = greatest(shares_until, (SELECT until FROM n)) \
           WHERE name = $1 RETURNING fence) \
         INSERT INTO {t}_shares (name, token, mode, expires_at, fence, holder) \
         SELECT $1, $2, $4, n.until, f.fence, NULL FROM n, f RETURNING fence"
    )))
    .bind(&name)
    .bind("older-client")
    .bind(30e6_f64)
    .bind("permit:1")
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    // A new client's attempt now waits for the row.
    let attempt = tokio::spawn({
        let (name, opts) = (name.clone(), opts.clone());
        async move {
            new.try_lock(name.as_str(), &opts)
                .await
                .map(|g| g.is_some())
        }
    });
    let pg = conformance::require_env("LOCK_TEST_POSTGRES_URL").unwrap();
    let watch = sqlx::PgPool::connect(&pg).await.unwrap();
    let bound = Duration::from_secs(10).mul_f64(conformance::time_scale());
    let call = format!("%{t}_sacq2%");
    faultkit::wait_until("the share function waiting for the row", bound, || {
        let (watch, call) = (watch.clone(), call.clone());
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE $1",
            )
            .bind(call)
            .fetch_one(&watch)
            .await
            .unwrap();
            Ok(n == 1)
        }
    })
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert!(
        !attempt.await.unwrap().unwrap(),
        "a permit beyond the limit: the older client's share went unseen"
    );
    // The older share is listed, and the next token is past its fence.
    let info = other.inspect(name.as_str()).await.unwrap();
    let tokens: Vec<_> = info.shares.iter().map(|s| s.fencing_token).collect();
    assert_eq!(tokens, [Some(old_fence as u64)]);
    assert!(other.force_release(name.as_str()).await.unwrap());
    let g = other.try_lock(name.as_str(), &opts).await.unwrap();
    let g = g.expect("a permit once the older share was revoked");
    assert!(g.fencing_token() > Some(old_fence as u64));
    g.release().await.unwrap();
    other.flush().await;
    drop(other);
    drop_pg_lock_table(&mut old, &t).await;
}

/// The lease strategy's share attempt and release go as one query of several statements
/// (SQLite) or a server-side function (PostgreSQL): names and holder labels that would break
/// out of a quoted literal, non-ASCII text included, are stored and read back as given, and
/// exclude as names do.
#[tokio::test]
async fn shares_under_hostile_names_and_labels() {
    for (label, url) in variants() {
        if label.contains("row-lock") {
            continue;
        }
        let (a, b) = (client(&url).await, client(&url).await);
        let base = unique("hostile-share");
        let hostile_label = "r'); DELETE FROM locksmith_locks; -- \\ \"ü✓";
        for name in [
            format!("'; DROP TABLE x; --{base}"),
            format!("{base}\\'\"%_ ü✓"),
        ] {
            let name = LockName::new(name).unwrap();
            // Each mode, and another use of the name it refuses (a permit beside readers,
            // another permit limit).
            for (opts, other) in [
                (LockOptions::new().shared(), LockOptions::new().permits(2)),
                (LockOptions::new().permits(2), LockOptions::new().permits(3)),
            ] {
                let opts = opts.ttl(Duration::from_secs(30)).label(hostile_label);
                let s1 = a.try_lock(&name, &opts).await.unwrap().expect(label);
                let s2 = b.try_lock(&name, &opts).await.unwrap().expect(label);
                assert!(
                    s2.fencing_token() > s1.fencing_token(),
                    "{label}: {name}: one counter, each share its own token"
                );
                let info = a.inspect(&name).await.unwrap();
                assert_eq!(info.shares.len(), 2, "{label}: {name}");
                for s in &info.shares {
                    let holder = s.holder.as_ref().expect(label);
                    assert_eq!(holder.label.as_deref(), Some(hostile_label), "{label}");
                }
                let err = b.try_lock(&name, &other).await.unwrap_err();
                assert_eq!(err.kind(), ErrorKind::Conflict, "{label}: {name}: {err}");
                s1.release().await.unwrap();
                s2.release().await.unwrap();
                assert!(!a.inspect(&name).await.unwrap().held, "{label}: {name}");
            }
            let g = a
                .try_lock(&name, &LockOptions::new())
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{label}: {name}: free once the shares went"));
            g.release().await.unwrap();
        }
        eprintln!("{label}: ok");
    }
}

/// The share procedures visible to a MariaDB user (0 when it may neither create nor run them).
async fn mysql_share_procedures(url: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::MySqlConnection::connect(url).await.expect("connect");
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.ROUTINES \
         WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME IN \
           ('locksmith_locks_sacq2', 'locksmith_locks_sext2')",
    )
    .fetch_one(&mut c)
    .await
    .expect("probe")
}

/// On one MariaDB lock table, clients calling the share procedures and clients of a user who
/// may neither create nor run them (the transaction of statements) use the same names: their
/// readers share, a writer of either kind is kept out by readers of both and gets the name at
/// once after the last of them released (a release's one `DELETE` leaves `shares_until`
/// behind it), fences grow across all of them, and their permits count towards one limit.
#[tokio::test]
async fn mysql_share_procedures_and_statements_exclude_each_other() {
    let (Some(main), Some(plain)) = (
        conformance::require_env("LOCK_TEST_MYSQL_URL"),
        conformance::require_env("LOCK_TEST_MYSQL_PLAIN_URL"),
    ) else {
        return;
    };
    let calls = client(&with_params(&main, "strategy=lease")).await;
    let statements = client(&with_params(&plain, "strategy=lease")).await;
    assert_eq!(
        mysql_share_procedures(&main).await,
        2,
        "the main user's procedures"
    );
    assert_eq!(
        mysql_share_procedures(&plain).await,
        0,
        "the plain user must see no procedure (it takes the statement path)"
    );
    let ttl = Duration::from_secs(30);
    let read = LockOptions::new().ttl(ttl).no_auto_renew().shared();
    let write = LockOptions::new().ttl(ttl).no_auto_renew();
    for (first, second, label) in [
        (&calls, &statements, "procedures first"),
        (&statements, &calls, "statements first"),
    ] {
        let name = LockName::new(unique("mixed")).unwrap();
        let r1 = first.try_lock(&name, &read).await.unwrap().expect(label);
        let r2 = second.try_lock(&name, &read).await.unwrap().expect(label);
        let (f1, f2) = (r1.fencing_token().unwrap(), r2.fencing_token().unwrap());
        assert!(f2 > f1, "{label}: fences {f1}, {f2}");
        for writer in [first, second] {
            assert!(
                writer.try_lock(&name, &write).await.unwrap().is_none(),
                "{label}: a writer beside readers of both kinds"
            );
        }
        r1.release().await.unwrap();
        assert!(
            second.try_lock(&name, &write).await.unwrap().is_none(),
            "{label}: a writer beside the second reader"
        );
        r2.release().await.unwrap();
        let w = second
            .try_lock(&name, &write)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{label}: the name was not free after the last reader"));
        let fw = w.fencing_token().unwrap();
        assert!(fw > f2, "{label}: writer's fence {fw} after readers' {f2}");
        for reader in [first, second] {
            assert!(
                reader.try_lock(&name, &read).await.unwrap().is_none(),
                "{label}: a reader beside the writer"
            );
        }
        w.release().await.unwrap();
        // One limit for both kinds of permit holders.
        let permit = LockOptions::new().ttl(ttl).no_auto_renew().permits(2);
        let sem = LockName::new(unique("mixed-sem")).unwrap();
        let p1 = first.try_lock(&sem, &permit).await.unwrap().expect(label);
        let p2 = second.try_lock(&sem, &permit).await.unwrap().expect(label);
        for third in [first, second] {
            assert!(
                third.try_lock(&sem, &permit).await.unwrap().is_none(),
                "{label}: a third permit of two"
            );
        }
        p1.release().await.unwrap();
        let p3 = second.try_lock(&sem, &permit).await.unwrap().expect(label);
        p2.release().await.unwrap();
        p3.release().await.unwrap();
    }
    calls.flush().await;
    statements.flush().await;
}

/// Issue 37: a wrong password is `Auth` (it was `Backend`), and the error keeps the server's
/// words whole: the password was replaced wherever it occurred as a substring, so a one-letter
/// password `e` showed as `***rror communicating with databas***`.
#[tokio::test]
async fn a_wrong_one_letter_password_is_auth_with_the_message_intact() {
    for (var, words) in [
        ("LOCK_TEST_POSTGRES_URL", "password authentication failed"),
        ("LOCK_TEST_MYSQL_URL", "Access denied"),
    ] {
        let Some(good) = conformance::require_env(var) else {
            continue;
        };
        let mut url = url::Url::parse(&good).unwrap();
        let letter = if url.password() == Some("e") {
            "a"
        } else {
            "e"
        };
        url.set_password(Some(letter)).unwrap();
        let e = SqlBackend::connect(url.as_str()).await.unwrap_err();
        let shown = format!("{e:#}");
        assert_eq!(e.kind(), ErrorKind::Auth, "{var}: {shown}");
        assert!(shown.contains(words), "{var}: {shown}");
        // Stars only where a password field was blanked (`:***@`, `password=***`).
        for (i, _) in shown.match_indices("***") {
            let before = shown[..i].chars().last();
            assert!(matches!(before, Some(':' | '=')), "{var}: {shown}");
        }
    }
}

/// What reports and benchmarks ask of a server answers on every variant: its version, a round
/// trip, one cycle of the bare primitive, its request counter (which only grows); SQLite has no
/// server to count requests or a bare primitive to measure (`Unsupported`).
#[tokio::test]
async fn server_probes_answer_on_every_variant() {
    use lockcore::backend::Backend;
    for (label, url) in variants() {
        let b = SqlBackend::connect(&url).await.unwrap();
        let version = b.server_version().await;
        assert!(version.is_some_and(|v| !v.is_empty()), "{label}");
        b.round_trip().await.unwrap();
        let name = LockName::new(unique("probe")).unwrap();
        if label.starts_with("sqlite") {
            let kind = |r: lockcore::Result<()>| r.unwrap_err().kind();
            assert_eq!(kind(b.bare_cycle(&name).await), ErrorKind::Unsupported);
            let requests = b.server_requests().await.map(|_| ());
            assert_eq!(kind(requests), ErrorKind::Unsupported);
            continue;
        }
        let before = b.server_requests().await.unwrap();
        b.bare_cycle(&name).await.unwrap();
        b.bare_cycle(&name).await.unwrap();
        assert!(b.server_requests().await.unwrap() >= before, "{label}");
    }
}
