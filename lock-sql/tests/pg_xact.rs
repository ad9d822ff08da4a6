//! `PgXactLock`: a lock inside the application's own PostgreSQL transaction, on the real server
//! (`LOCK_TEST_POSTGRES_URL`): it excludes the row-lock strategy on the same table and name,
//! ends with commit or rollback, shares the row-lock strategy's fencing counter, and a wait
//! that runs out leaves the caller's transaction usable.
#![cfg(feature = "postgres")]

use std::time::Duration;

use lock_sql::{PgXactLock, SqlBackend};
use lockcore::{ErrorKind, LockOptions, Locker};
use sqlx::{Connection, PgConnection};

fn name(prefix: &str) -> String {
    format!("{prefix}-{:08x}", fastrand::u32(..))
}

fn scaled(ms: u64) -> Duration {
    Duration::from_millis(ms).mul_f64(conformance::time_scale())
}

/// The server URL, the row-lock locker on a fresh table, and the transaction lock on it.
async fn setup() -> Option<(String, Locker, PgXactLock)> {
    let url = conformance::require_env("LOCK_TEST_POSTGRES_URL")?;
    let table = format!("xact_{:08x}", fastrand::u32(..));
    let sep = if url.contains('?') { '&' } else { '?' };
    let backend = SqlBackend::connect(&format!("{url}{sep}strategy=row-lock&table={table}"))
        .await
        .expect("row-lock backend");
    Some((url, Locker::new(backend), PgXactLock::new(&table).unwrap()))
}

async fn conn(url: &str) -> PgConnection {
    PgConnection::connect(url).await.expect("a connection")
}

fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(10))
}

#[tokio::test]
async fn excludes_row_locks_until_commit_and_shares_their_fencing_counter() {
    let Some((url, rows, xact)) = setup().await else {
        return;
    };
    let n = name("commit");
    // A row-lock holder first: its token, then the transaction lock's, then the next holder's.
    // Readers too: a row-lock reader keeps the transaction lock out, and is kept out by it.
    let r = rows.try_lock(n.as_str(), &opts().shared()).await.unwrap();
    let r = r.expect("a row-lock reader");
    let read_token = r.fencing_token().unwrap();
    let mut c = conn(&url).await;
    let mut tx = c.begin().await.unwrap();
    assert_eq!(
        xact.try_lock(&mut tx, n.as_str()).await.unwrap(),
        None,
        "a row-lock reader's name is busy for a transaction lock"
    );
    r.release().await.unwrap();
    let g = rows.try_lock(n.as_str(), &opts()).await.unwrap().unwrap();
    let t0 = g.fencing_token().unwrap();
    assert!(
        t0 > read_token,
        "tokens increase across modes: {read_token} then {t0}"
    );
    assert_eq!(
        xact.try_lock(&mut tx, n.as_str()).await.unwrap(),
        None,
        "a row-lock holder's name is busy for a transaction lock"
    );
    g.release().await.unwrap();
    let t1 = xact
        .lock(&mut tx, n.as_str(), Some(scaled(5_000)))
        .await
        .unwrap();
    assert!(t1 > t0, "tokens increase across both kinds: {t0} then {t1}");
    for mode in [opts(), opts().shared()] {
        assert!(
            rows.try_lock(n.as_str(), &mode).await.unwrap().is_none(),
            "a row lock ({:?}) was granted while a transaction held the name",
            mode.mode_value()
        );
    }
    tx.commit().await.unwrap();
    let g = rows
        .try_lock(n.as_str(), &opts())
        .await
        .unwrap()
        .expect("free once the transaction committed");
    let t2 = g.fencing_token().unwrap();
    assert!(t2 > t1, "the committed token stays: {t1} then {t2}");
    g.release().await.unwrap();
}

/// Takes the lock in a new transaction, reads the balance, writes `balance + delta` stamped
/// with the token, and commits or rolls back: (token, balance it read).
async fn transfer(
    url: &str,
    xact: &PgXactLock,
    n: &str,
    table: &str,
    delta: i64,
    commit: bool,
) -> (u64, i64) {
    let mut c = conn(url).await;
    let mut tx = c.begin().await.unwrap();
    let token = xact.lock(&mut tx, n, None).await.unwrap();
    let read: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT balance FROM {table}")))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET balance = $1, fence = $2 WHERE fence < $2"
    )))
    .bind(read + delta)
    .bind(token as i64)
    .execute(&mut *tx)
    .await
    .unwrap();
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    (token, read)
}

#[tokio::test]
async fn an_update_commits_or_rolls_back_with_its_lock() {
    let Some((url, rows, xact)) = setup().await else {
        return;
    };
    let n = name("transfer");
    let table = format!("acct_{:08x}", fastrand::u32(..));
    let mut c = conn(&url).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (balance BIGINT NOT NULL, fence BIGINT NOT NULL); \
         INSERT INTO {table} VALUES (100, 0)"
    )))
    .execute(&mut c)
    .await
    .unwrap();
    // A holder in a transaction; a second transaction queues behind it in the server and must
    // read what the first committed (read-modify-write under the lock: no lost update).
    let mut a = conn(&url).await;
    let mut tx = a.begin().await.unwrap();
    let t1 = xact.lock(&mut tx, n.as_str(), None).await.unwrap();
    let (url2, x2, n2, table2) = (url.clone(), xact.clone(), n.clone(), table.clone());
    let second = tokio::spawn(async move { transfer(&url2, &x2, &n2, &table2, -10, true).await });
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET balance = balance - 50, fence = $1"
    )))
    .bind(t1 as i64)
    .execute(&mut *tx)
    .await
    .unwrap();
    assert!(
        !second.is_finished(),
        "the second transaction ran while the first held the lock"
    );
    tx.commit().await.unwrap();
    let (t2, read) = tokio::time::timeout(scaled(10_000), second)
        .await
        .expect("the waiting transaction got the lock after the commit")
        .unwrap();
    assert_eq!(
        read, 50,
        "the second holder read the first holder's committed update"
    );
    assert!(t2 > t1, "tokens {t1} then {t2}");
    // A rollback frees the lock and undoes the write; the next holder reads the old balance.
    let (_, read) = transfer(&url, &xact, &n, &table, -1_000, false).await;
    assert_eq!(read, 40);
    let (t4, read) = transfer(&url, &xact, &n, &table, 0, true).await;
    assert_eq!(read, 40, "the rolled-back write is gone");
    assert!(t4 > t2);
    assert!(rows.try_lock(n.as_str(), &opts()).await.unwrap().is_some());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&mut c)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_wait_that_runs_out_leaves_the_transaction_usable() {
    let Some((url, rows, xact)) = setup().await else {
        return;
    };
    let n = name("timeout");
    let g = rows.try_lock(n.as_str(), &opts()).await.unwrap().unwrap();
    let mut c = conn(&url).await;
    let mut tx = c.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '7s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = xact
        .lock(&mut tx, n.as_str(), Some(scaled(200)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    // Still usable, and its own lock_timeout is untouched.
    let lt: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(lt, "7s");
    tx.commit().await.unwrap();
    // And a successful wait puts the caller's setting back too.
    g.release().await.unwrap();
    let mut tx = c.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '7s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    xact.lock(&mut tx, n.as_str(), Some(scaled(5_000)))
        .await
        .unwrap();
    let lt: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(lt, "7s");
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn refuses_bad_input_before_any_io() {
    let Some((url, _rows, xact)) = setup().await else {
        return;
    };
    let mut c = conn(&url).await;
    // Outside a transaction the lock would end with its own statement.
    let err = xact.try_lock(&mut c, "x").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let mut tx = c.begin().await.unwrap();
    for bad in ["", "a\u{0}b", &"x".repeat(10_000)] {
        let err = xact.try_lock(&mut tx, bad).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{bad:?}: {err}");
    }
    tx.rollback().await.unwrap();
    for bad in ["t; drop table x", "1abc", ""] {
        assert_eq!(
            PgXactLock::new(bad).unwrap_err().kind(),
            ErrorKind::InvalidConfig
        );
    }
    // A table nobody created: a clear error naming the fix.
    let missing = PgXactLock::new("no_such_lock_table").unwrap();
    let mut tx = c.begin().await.unwrap();
    let err = missing.try_lock(&mut tx, "x").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
}
