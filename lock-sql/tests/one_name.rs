//! One name, one lock (issue 33): every way of taking a name on the SQL backends excludes every
//! other way, whatever retries, late answers and strategies come between. Each test stages its
//! sequence on the real servers (LOCK_TEST_* from scripts/servers.sh env; unset means skip,
//! unless LOCK_TEST_REQUIRE_ALL is set).

use std::time::Duration;

mod support;

use lock_sql::SqlBackend;
use lockcore::backend::{AcquireRequest, Backend};
use lockcore::{ErrorKind, LockMode, LockName, OwnerToken};
use support::{client, lease_variants, my_url, pg_url, scaled, unique, with_params};

fn request(name: &LockName, mode: LockMode, ttl: Duration) -> AcquireRequest {
    let mut req = AcquireRequest::new(name.clone(), OwnerToken::random(), ttl);
    req.mode = mode;
    req
}

/// Waits (polling `inspect`) until nobody holds `name`: a lease left to run out.
async fn until_free(backend: &SqlBackend, name: &LockName) {
    let bound = tokio::time::Instant::now() + scaled(Duration::from_secs(20));
    loop {
        let info = backend.inspect(name).await.expect("inspect");
        if !info.held && info.shares.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < bound,
            "{name}: still held: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An attempt re-sent with the same owner token (its first try committed, its reply was lost,
/// its lease ran out, and another holder came in a mode that excludes it) re-checks everything
/// the first try checked: it does not take the name beside that holder. Regression (MariaDB
/// lease): the exclusive upsert retook its own row whatever the live shares, and cleared
/// `shares_until`, so a writer held beside a reader, and the next writer too.
#[tokio::test]
async fn a_retried_attempt_rechecks_what_the_first_checked() {
    let cases = [
        (LockMode::Exclusive, LockMode::Shared),
        (LockMode::Exclusive, LockMode::Permit { limit: 2 }),
        (LockMode::Exclusive, LockMode::Exclusive),
        (LockMode::Shared, LockMode::Exclusive),
        (LockMode::Permit { limit: 1 }, LockMode::Permit { limit: 1 }),
        (LockMode::Permit { limit: 2 }, LockMode::Exclusive),
    ];
    for (label, url) in lease_variants() {
        let backend = SqlBackend::connect(&url).await.expect("connect");
        let other = SqlBackend::connect(&url).await.expect("connect");
        for (retried, intruder) in cases {
            let name = LockName::new(unique("retry-recheck")).unwrap();
            let case = format!("{label}: {retried} retried past a {intruder} holder");
            // The first try commits; its reply is lost (the lease is never released).
            let first = request(&name, retried, Duration::from_millis(300));
            let won = backend.try_acquire(&first).await.expect("first try");
            assert!(won.is_some(), "{case}: the first try took nothing");
            std::mem::forget(won);
            until_free(&backend, &name).await;
            // Another holder comes once the lease ran out.
            let held = request(&name, intruder, Duration::from_secs(30));
            let intruding = other.try_acquire(&held).await.expect("intruder");
            assert!(intruding.is_some(), "{case}: the intruder took nothing");
            // The same request again, same token.
            match backend.try_acquire(&first).await {
                Ok(None) => {}
                Err(e) if e.kind() == ErrorKind::Conflict => {}
                Ok(Some(_)) => panic!("{case}: the retry holds beside the intruder"),
                Err(e) => panic!("{case}: {e}"),
            }
            // The intruder still holds alone: a second writer gets nothing either.
            let second = request(&name, LockMode::Exclusive, Duration::from_secs(30));
            match other.try_acquire(&second).await {
                Ok(None) => {}
                Err(e) if e.kind() == ErrorKind::Conflict => {}
                Ok(Some(_)) => panic!("{case}: a second writer holds beside the intruder"),
                Err(e) => panic!("{case}: {e}"),
            }
            intruding.unwrap().lease.release().await.expect("release");
        }
    }
}

fn opts() -> lockcore::LockOptions {
    lockcore::LockOptions::new().ttl(Duration::from_secs(30))
}

/// What a `try_lock` of a name held another way must answer: contention, promptly.
async fn busy(locker: &lockcore::Locker, name: &str, o: &lockcore::LockOptions, case: &str) {
    let started = tokio::time::Instant::now();
    match locker.try_lock(name, o).await {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{case}: granted beside the holder"),
        Err(e) => panic!("{case}: {e} (contention is Ok(None))"),
    }
    let took = started.elapsed();
    assert!(
        took < scaled(Duration::from_secs(2)),
        "{case}: contention took {took:?}"
    );
}

/// (case, the lease holder's options, the row-lock holder's options, whether they hold
/// together).
type Case<'a> = (
    &'a str,
    &'a lockcore::LockOptions,
    &'a lockcore::LockOptions,
    bool,
);

/// Every case in both orders, on a fresh name each: the second is busy at once while the first
/// holds (or holds beside it, for readers), the first keeps renewing, and the second takes the
/// name once the first released it.
async fn lease_and_row_lock_exclude(lease_url: &str, row_url: &str, cases: &[Case<'_>]) {
    let lease = client(lease_url).await;
    let row = client(row_url).await;
    for &(case, lease_opts, row_opts, together) in cases {
        for lease_first in [true, false] {
            let name = unique("lease-row");
            let case = format!("{case}, lease first: {lease_first}");
            let (first, first_opts, second, second_opts) = if lease_first {
                (&lease, lease_opts, &row, row_opts)
            } else {
                (&row, row_opts, &lease, lease_opts)
            };
            let held = first
                .try_lock(name.as_str(), first_opts)
                .await
                .expect("first")
                .expect("the first holder gets a free name");
            if together {
                let beside = second
                    .try_lock(name.as_str(), second_opts)
                    .await
                    .expect("second");
                assert!(beside.is_some(), "{case}: readers hold together");
                beside.unwrap().release().await.unwrap();
            } else {
                busy(second, &name, second_opts, &case).await;
            }
            // The first holder keeps its lock meanwhile (a lease's renewal is not blocked).
            held.extend(Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("{case}: the holder's renewal failed: {e}"));
            held.release().await.unwrap();
            let after = second
                .try_lock(name.as_str(), second_opts)
                .await
                .expect("after");
            assert!(after.is_some(), "{case}: free once the first released");
            after.unwrap().release().await.unwrap();
        }
    }
}

/// The lease and row-lock strategies on one table (the default `locksmith_locks`) exclude each
/// other per name, in both orders, writers and readers alike; lease readers and row-lock
/// readers hold together. Regression: nothing connected them (two holders of one name).
#[tokio::test]
async fn pg_lease_and_row_lock_on_one_table_exclude_each_other() {
    let (Some(lease_url), Some(row_url)) = (pg_url("strategy=lease"), pg_url("strategy=row-lock"))
    else {
        return;
    };
    let x = opts();
    let r = opts().shared();
    let p = opts().permits(2);
    let cases: [Case<'_>; 7] = [
        ("lease x, row x", &x, &x, false),
        ("lease r, row x", &r, &x, false),
        ("lease x, row r", &x, &r, false),
        ("lease p, row r", &p, &r, false),
        ("lease p, row x", &p, &x, false),
        ("lease r, row r", &r, &r, true),
        ("lease x, row x (again)", &x, &x, false),
    ];
    lease_and_row_lock_exclude(&lease_url, &row_url, &cases).await;
}

/// MariaDB: the lease (exclusive, shared, permits) and the row lock (exclusive only, with a
/// fencing token or without: two different statements) on one table exclude each other per
/// name, in both orders. Regression: the lease was the lock row, the row lock `GET_LOCK`, and
/// neither looked at the other (two holders of one name). The leases of a user who may not
/// create the share procedures (their statements instead) too.
#[tokio::test]
async fn mysql_lease_and_row_lock_on_one_table_exclude_each_other() {
    let Some(row_url) = my_url("strategy=row-lock") else {
        return;
    };
    let plain = conformance::require_env("LOCK_TEST_MYSQL_PLAIN_URL")
        .map(|u| with_params(&u, "strategy=lease"));
    let x = opts();
    let r = opts().shared();
    let p = opts().permits(2);
    let bare = opts().no_fencing();
    let cases: [Case<'_>; 7] = [
        ("lease x, row x", &x, &x, false),
        ("lease r, row x", &r, &x, false),
        ("lease p, row x", &p, &x, false),
        ("lease x, row x without a token", &x, &bare, false),
        ("lease r, row x without a token", &r, &bare, false),
        ("lease p, row x without a token", &p, &bare, false),
        ("lease x, row x (again)", &x, &x, false),
    ];
    for lease_url in my_url("strategy=lease").into_iter().chain(plain) {
        lease_and_row_lock_exclude(&lease_url, &row_url, &cases).await;
    }
}

/// MariaDB: a set of leases (one transaction, `try_lock_all`) and a row lock of one of its
/// names exclude each other, in both orders; so do a row lock's set (one name at a time) and a
/// lease of a member.
#[tokio::test]
async fn mysql_lease_sets_and_row_locks_exclude_each_other() {
    let (Some(lease_url), Some(row_url)) = (my_url("strategy=lease"), my_url("strategy=row-lock"))
    else {
        return;
    };
    let lease = client(&lease_url).await;
    let row = client(&row_url).await;
    let o = opts();
    for (label, sets, single) in [("lease set", &lease, &row), ("row-lock set", &row, &lease)] {
        let names: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|n| unique(&format!("set-row-{n}")))
            .collect();
        // The single holder first: the set is not taken.
        let held = single.try_lock(names[1].as_str(), &o).await.unwrap();
        let held = held.expect("a free name");
        let set = sets.try_lock_all(names.clone(), &o).await.unwrap();
        assert!(set.is_none(), "{label}: taken beside a holder of a member");
        held.release().await.unwrap();
        // The set first: no member is free to the other strategy.
        let set = sets.try_lock_all(names.clone(), &o).await.unwrap();
        let set = set.unwrap_or_else(|| panic!("{label}: a free set was not taken"));
        for name in &names {
            busy(single, name, &o, &format!("{label}: member {name}")).await;
        }
        set.release().await.unwrap();
        let after = single.try_lock(names[0].as_str(), &o).await.unwrap();
        assert!(after.is_some(), "{label}: free once the set was released");
        after.unwrap().release().await.unwrap();
    }
}

/// A lease holder and a row-lock holder of one name never hold at once while both wait for
/// it in turns (the shape of two `locksmith run` commands, one per strategy, in a loop).
async fn lease_and_row_lock_take_turns(lease_url: String, row_url: String) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let name = unique("lease-row-turns");
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for url in [lease_url, row_url] {
        let locker = client(&url).await;
        let (name, inside) = (name.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let o = opts().wait_timeout(scaled(Duration::from_secs(60)));
            for _ in 0..12 {
                let g = locker.lock(name.as_str(), &o).await.expect("lock");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release");
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("a locker's loop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_and_row_lock_waiters_take_turns() {
    if let (Some(lease_url), Some(row_url)) =
        (pg_url("strategy=lease"), pg_url("strategy=row-lock"))
    {
        lease_and_row_lock_take_turns(lease_url, row_url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_lease_and_row_lock_waiters_take_turns() {
    if let (Some(lease_url), Some(row_url)) =
        (my_url("strategy=lease"), my_url("strategy=row-lock"))
    {
        lease_and_row_lock_take_turns(lease_url, row_url).await;
    }
}

/// `PgXactLock` on the default table is never held beside a lease holder of its name, in both
/// orders. A lease holder keeps renewing while a transaction lock waits for the name; a lease
/// `try_lock` on a name a transaction lock holds is `Ok(None)` at once. Regression: the
/// transaction lock was granted beside the lease, the lease's renewal then blocked on the
/// transaction's row lock (lost), and a lease try_lock waited 5 s for `Unavailable`.
#[tokio::test]
async fn pg_xact_lock_and_leases_exclude_each_other() {
    use sqlx::Connection;
    let Some(lease_url) = pg_url("strategy=lease") else {
        return;
    };
    let plain = conformance::require_env("LOCK_TEST_POSTGRES_URL").unwrap();
    let lease = client(&lease_url).await;
    let xact = lock_sql::PgXactLock::new(lock_sql::DEFAULT_TABLE).unwrap();
    let mut conn = sqlx::PgConnection::connect(&plain).await.unwrap();
    for lease_opts in [opts(), opts().shared(), opts().permits(3)] {
        let case = format!("{:?}", lease_opts.mode_value());
        // Lease first.
        let name = unique("xact-lease");
        let held = lease.try_lock(name.as_str(), &lease_opts).await.unwrap();
        let held = held.expect("a free name");
        let mut tx = conn.begin().await.unwrap();
        assert_eq!(
            xact.try_lock(&mut tx, name.as_str()).await.unwrap(),
            None,
            "{case}: a transaction lock beside a lease holder"
        );
        tx.rollback().await.unwrap();
        let mut tx = conn.begin().await.unwrap();
        let e = xact
            .lock(
                &mut tx,
                name.as_str(),
                Some(scaled(Duration::from_millis(600))),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{case}: {e}");
        held.extend(Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{case}: the lease's renewal failed: {e}"));
        // The wait ran out in a savepoint: the transaction goes on, and takes the name once
        // the lease is released.
        held.release().await.unwrap();
        let token = xact
            .lock(&mut tx, name.as_str(), Some(scaled(Duration::from_secs(5))))
            .await
            .unwrap();
        assert!(token > 0);
        // Transaction lock first: the lease is busy at once, in every mode.
        busy(&lease, &name, &lease_opts, &case).await;
        tx.commit().await.unwrap();
        let after = lease.try_lock(name.as_str(), &lease_opts).await.unwrap();
        assert!(after.is_some(), "{case}: free once the transaction ended");
        after.unwrap().release().await.unwrap();
    }
}

/// An `interop=` row lock (`interop_url`) against the default layout's leases (every mode) and
/// row locks (exclusive, with a token or without; shared where `row_readers`) on the server of
/// `url`, in both orders.
async fn interop_and_the_default_layout_exclude(
    url: fn(&str) -> Option<String>,
    interop_url: &str,
    row_readers: bool,
) {
    let x = opts();
    let r = opts().shared();
    let p = opts().permits(2);
    let bare = opts().no_fencing();
    let leases: [Case<'_>; 3] = [
        ("lease x, interop", &x, &x, false),
        ("lease r, interop", &r, &x, false),
        ("lease p, interop", &p, &x, false),
    ];
    let mut row_locks: Vec<Case<'_>> = vec![
        ("row x, interop", &x, &x, false),
        ("row x without a token, interop", &bare, &x, false),
        ("row x, interop without a token", &x, &bare, false),
    ];
    if row_readers {
        row_locks.push(("row r, interop", &r, &x, false));
    }
    lease_and_row_lock_exclude(&url("strategy=lease").unwrap(), interop_url, &leases).await;
    lease_and_row_lock_exclude(&url("strategy=row-lock").unwrap(), interop_url, &row_locks).await;
}

/// MariaDB: a row lock under `interop=get_lock` (the peers' `GET_LOCK(name)`) and the default
/// layout's leases (every mode) and row locks (with a token or without) of one name exclude
/// each other, in both orders. Regression: the interop holder took only the peer's key, which
/// the default layout neither takes nor looks at (two holders of one name).
#[tokio::test]
async fn mysql_interop_get_lock_and_the_default_layout_exclude_each_other() {
    if let Some(interop_url) = my_url("strategy=row-lock&interop=get_lock") {
        interop_and_the_default_layout_exclude(my_url, &interop_url, false).await;
    }
}

/// PostgreSQL: a row lock under `interop=sqlx` (sqlx's `PgAdvisoryLock` key) and the default
/// layout's leases (every mode), row locks (exclusive, shared, without a token) and
/// `PgXactLock` of one name exclude each other, in both orders. Regression: the interop holder
/// took only sqlx's key, which the default layout neither takes nor looks at (two holders).
#[tokio::test]
async fn pg_interop_sqlx_and_the_default_layout_exclude_each_other() {
    use sqlx::Connection;
    let Some(interop_url) = pg_url("strategy=row-lock&interop=sqlx") else {
        return;
    };
    interop_and_the_default_layout_exclude(pg_url, &interop_url, true).await;
    let x = opts();
    // PgXactLock on the default table, both orders.
    let interop = client(&interop_url).await;
    let xact = lock_sql::PgXactLock::new(lock_sql::DEFAULT_TABLE).unwrap();
    let plain = conformance::require_env("LOCK_TEST_POSTGRES_URL").unwrap();
    let mut conn = sqlx::PgConnection::connect(&plain).await.unwrap();
    let name = unique("xact-interop");
    let held = interop.try_lock(name.as_str(), &x).await.unwrap();
    let held = held.expect("a free name");
    let mut tx = conn.begin().await.unwrap();
    assert_eq!(
        xact.try_lock(&mut tx, name.as_str()).await.unwrap(),
        None,
        "a transaction lock beside an interop holder"
    );
    tx.rollback().await.unwrap();
    held.release().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let token = xact.try_lock(&mut tx, name.as_str()).await.unwrap();
    assert!(token.is_some(), "free once the interop holder released");
    busy(&interop, &name, &x, "interop beside a transaction lock").await;
    tx.commit().await.unwrap();
    let after = interop.try_lock(name.as_str(), &x).await.unwrap();
    assert!(after.is_some(), "free once the transaction ended");
    after.unwrap().release().await.unwrap();
}

/// An interop holder and default-layout holders (a lease, a row lock) of one name never hold at
/// once while they wait for it in turns, on PostgreSQL (`interop=sqlx`) and MariaDB
/// (`interop=get_lock`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_and_default_layout_waiters_take_turns() {
    let pairs = [
        (
            pg_url("strategy=row-lock&interop=sqlx"),
            pg_url("strategy=lease"),
        ),
        (
            pg_url("strategy=row-lock&interop=sqlx"),
            pg_url("strategy=row-lock"),
        ),
        (
            my_url("strategy=row-lock&interop=get_lock"),
            my_url("strategy=lease"),
        ),
        (
            my_url("strategy=row-lock&interop=get_lock"),
            my_url("strategy=row-lock"),
        ),
    ];
    for (interop, default) in pairs {
        if let (Some(interop), Some(default)) = (interop, default) {
            lease_and_row_lock_take_turns(default, interop).await;
        }
    }
}
