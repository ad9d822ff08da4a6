//! PostgreSQL lease hand-over by grant (`handover=grant`, the default): the release gives the
//! lock to the queue's head with a short claim, the head holds as soon as the notification
//! arrives; a grant whose notification is lost, a granted waiter that crashed or was
//! cancelled, and the fencing order across grants. Each test takes a lock table of its own on
//! the shared server (`LOCK_TEST_POSTGRES_URL`) and drops it at the end.

use std::time::Duration;

mod support;

use conformance::interop::{eventually, poll_until};
use faultkit::{Proxy, ProxyMode, Wire, rewrite_url};
use lockcore::{LockGuard, LockOptions, Locker, Result};
use support::{client, pg_url, scaled, unique, with_params};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The claim a release grants a waiter whose TTL is longer (lock-sql's queue entry TTL).
const CLAIM: Duration = Duration::from_secs(6);

/// How long a queued waiter behind another sleeps at most between its polls.
const QUEUE_POLL: Duration = Duration::from_secs(2);

/// The lease TTL of these tests: far longer than the claim, so that a hand-over that waited
/// for a TTL shows.
const TTL: Duration = Duration::from_secs(60);

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(TTL)
        .wait_timeout(scaled(Duration::from_secs(40)))
}

/// A lock table of this test's own, its URL (plain TCP, for the proxy) and a session on it.
struct Table {
    name: String,
    url: String,
    pool: sqlx::PgPool,
}

impl Table {
    async fn new() -> Option<Table> {
        let base = pg_url("strategy=lease&sslmode=disable")?;
        let name = format!("hpgn_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let url = with_params(&base, &format!("table={name}"));
        let plain = base.split('?').next().unwrap().to_owned();
        let pool = sqlx::PgPool::connect(&plain).await.unwrap();
        Some(Table { name, url, pool })
    }

    /// The queue's live head asking for a grant, once it is there: (its token, its attempt).
    async fn head_asking(&self, name: &str) -> (String, i64) {
        let sql = format!(
            "SELECT waiter, ask FROM {}_waits WHERE name = $1 AND mode = 'x' \
             AND ask IS NOT NULL AND expires > clock_timestamp() ORDER BY enqueued, waiter LIMIT 1",
            self.name
        );
        let (pool, sql) = (&self.pool, &sql);
        poll_until(scaled(Duration::from_secs(10)), || async move {
            sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))
                .bind(name)
                .fetch_optional(pool)
                .await
                .unwrap()
        })
        .await
        .expect("no waiter asking for a grant in the queue")
    }

    /// How many live exclusive entries the queue has.
    async fn queued(&self, name: &str) -> i64 {
        let sql = format!(
            "SELECT count(*) FROM {}_waits WHERE name = $1 AND mode = 'x' \
             AND expires > clock_timestamp()",
            self.name
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Until `n` exclusive waiters are queued.
    async fn until_queued(&self, name: &str, n: i64) {
        assert!(
            eventually(scaled(Duration::from_secs(10)), || async {
                self.queued(name).await >= n
            })
            .await,
            "{n} waiters never queued"
        );
    }

    /// The lock row: (owner, fence, expiry and acquisition in seconds on the server's clock).
    async fn row(&self, name: &str) -> (Option<String>, i64, f64, f64) {
        let sql = format!(
            "SELECT CASE WHEN expires_at > clock_timestamp() THEN owner END, fence, \
               EXTRACT(EPOCH FROM expires_at)::float8, EXTRACT(EPOCH FROM acquired_at)::float8 \
             FROM {} WHERE name = $1",
            self.name
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// What a release granting the queue's head does, without its notification (a grant
    /// whose message is lost, or not delivered yet): the row to the head (with its claim, the
    /// fence bumped), its entry a granted one. Returns (the head's token, the fence, the
    /// claim's end in seconds on the server's clock).
    async fn grant_silently(&self, name: &str) -> (String, i64, f64) {
        let t = &self.name;
        let sql = format!(
            "WITH w AS (SELECT waiter, claim FROM {t}_waits WHERE name = $1 AND mode = 'x' \
               AND ask IS NOT NULL AND expires > clock_timestamp() \
               ORDER BY enqueued, waiter LIMIT 1), \
             r AS (UPDATE {t} l SET owner = w.waiter, fence = l.fence + 1, \
               expires_at = clock_timestamp() + w.claim * interval '1 microsecond', \
               acquired_at = clock_timestamp() FROM w WHERE l.name = $1 \
               RETURNING w.waiter, l.fence, l.expires_at), \
             g AS (UPDATE {t}_waits q SET mode = 'g', granted = r.fence, expires = r.expires_at \
               FROM r WHERE q.name = $1 AND q.waiter = r.waiter) \
             SELECT waiter, fence, EXTRACT(EPOCH FROM expires_at)::float8 FROM r"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn drop_it(self) {
        let t = &self.name;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {t}, {t}_shares, {t}_waits; \
             DROP FUNCTION IF EXISTS {t}_sacq2(text, text, float8, text, int8, text); \
             DROP FUNCTION IF EXISTS {t}_srel1(text, text, text); \
             DROP FUNCTION IF EXISTS {t}_lheld1(text, bool)"
        )))
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

/// A proxy counting the requests of `url`'s clients, and `url` through it.
async fn proxied(url: &str) -> (Proxy, String) {
    let u = url::Url::parse(url).unwrap();
    let port = u.port().unwrap();
    let target = format!("{}:{port}", u.host_str().unwrap()).parse().unwrap();
    let proxy = Proxy::start_with_wire(target, Wire::Postgres)
        .await
        .unwrap();
    let through = rewrite_url(url, port, proxy.port());
    assert_ne!(through, url, "{url} names no loopback endpoint");
    (proxy, through)
}

/// Until a client behind `proxy` sends a request (a waiter's poll): its next one is a poll
/// period away.
async fn after_a_request(proxy: &Proxy) {
    let seen = proxy.requests();
    assert!(
        proxy
            .wait_requests(seen + 1, scaled(Duration::from_secs(10)))
            .await,
        "the waiter sent no request"
    );
}

fn waiting(locker: &Locker, name: &str) -> JoinHandle<Result<LockGuard>> {
    let (locker, name) = (locker.clone(), name.to_owned());
    tokio::spawn(async move { locker.lock(name.as_str(), &opts()).await })
}

/// The waiter holds as soon as the release's grant arrives: no request of its own between
/// the release and its `lock()` returning (counted by a proxy in front of it alone), its
/// validity counted from before the release (its last refused attempt's send), no longer than
/// the claim until its renewal, and the fence the one after the releaser's.
#[tokio::test]
async fn a_grant_costs_the_waiter_no_request() {
    let Some(table) = Table::new().await else {
        return;
    };
    let (proxy, through) = proxied(&table.url).await;
    let holder = client(&table.url).await;
    let waiter = client(&through).await;
    let name = unique("grant");
    let g = holder.lock(name.as_str(), &opts()).await.unwrap();
    let w = waiting(&waiter, &name);
    let (token, _) = table.head_asking(&name).await;
    // The head polls every 500 ms: released right after a poll, none comes in between.
    after_a_request(&proxy).await;
    let before = proxy.requests();
    let released_at = Instant::now();
    let released_fence = g.fencing_token().unwrap();
    g.release().await.unwrap();
    let wg = w.await.unwrap().unwrap();
    let sent = proxy.requests() - before;
    assert_eq!(wg.token().to_hex(), token);
    assert_eq!(
        sent, 0,
        "the granted waiter sent {sent} requests to take the lock"
    );
    assert!(
        wg.acquired_at() < released_at,
        "the validity counts from after the release: an attempt took the lock, not the grant"
    );
    assert!(wg.valid_until() <= wg.acquired_at() + CLAIM);
    assert_eq!(wg.fencing_token(), Some(released_fence + 1));
    // Renewed to the TTL within the claim, and held throughout.
    assert!(
        eventually(scaled(Duration::from_secs(10)), || async {
            wg.valid_until() >= wg.acquired_at() + CLAIM
        })
        .await,
        "the granted lease was not renewed"
    );
    assert!(wg.is_valid());
    let (owner, fence, ..) = table.row(&name).await;
    assert_eq!(owner.as_deref(), Some(token.as_str()));
    assert_eq!(Some(fence as u64), wg.fencing_token());
    wg.release().await.unwrap();
    table.drop_it().await;
}

/// A grant whose notification is lost: the waiter's poll finds the row already its own and
/// takes it (a fence above the granted one, the lease's full TTL), within a poll period.
#[tokio::test]
async fn a_lost_grant_is_found_by_the_poll() {
    let Some(table) = Table::new().await else {
        return;
    };
    let holder = client(&table.url).await;
    let waiter = client(&table.url).await;
    let name = unique("lost-grant");
    let g = holder.lock(name.as_str(), &opts()).await.unwrap();
    let w = waiting(&waiter, &name);
    table.head_asking(&name).await;
    let (token, fence, _) = table.grant_silently(&name).await;
    g.abandon();
    let granted_at = Instant::now();
    let wg = w.await.unwrap().unwrap();
    let took = granted_at.elapsed();
    assert_eq!(wg.token().to_hex(), token);
    assert!(
        took < scaled(QUEUE_POLL + Duration::from_secs(3)),
        "the lost grant was found after {took:?}"
    );
    assert!(wg.fencing_token().unwrap() > fence as u64);
    assert!(wg.valid_until() > wg.acquired_at() + CLAIM);
    let (owner, row_fence, ..) = table.row(&name).await;
    assert_eq!(owner.as_deref(), Some(token.as_str()));
    assert_eq!(Some(row_fence as u64), wg.fencing_token());
    wg.release().await.unwrap();
    table.drop_it().await;
}

/// A waiter that crashed while queued (cut off before the release granted it the lock), and
/// one that crashed once granted (cut off as soon as it held): each costs the next waiter the
/// claim at most, never the lease's TTL.
#[tokio::test]
async fn a_crashed_granted_waiter_costs_the_next_the_claim_at_most() {
    let Some(table) = Table::new().await else {
        return;
    };
    let holder = client(&table.url).await;
    let name = unique("crashed-grant");
    let g = holder.lock(name.as_str(), &opts()).await.unwrap();
    // Crashed while queued: the head, cut off before the release.
    let (cut, through) = proxied(&table.url).await;
    let crashed = client(&through).await;
    let c = waiting(&crashed, &name);
    let (crashed_token, _) = table.head_asking(&name).await;
    let next = client(&table.url).await;
    let n = waiting(&next, &name);
    table.until_queued(&name, 2).await;
    cut.set_mode(ProxyMode::Blackhole);
    let released_at = Instant::now();
    g.release().await.unwrap();
    let (owner, ..) = table.row(&name).await;
    assert_eq!(
        owner,
        Some(crashed_token),
        "the release did not grant the head"
    );
    let ng = n.await.unwrap().unwrap();
    let took = released_at.elapsed();
    assert!(
        took < scaled(CLAIM + QUEUE_POLL + Duration::from_secs(3)) && took < TTL,
        "a waiter that crashed while queued held the next back {took:?}"
    );
    c.abort();
    // Crashed once granted: it holds (by the grant), then is cut off before renewing.
    let (cut2, through2) = proxied(&table.url).await;
    let granted = client(&through2).await;
    let gw = waiting(&granted, &name);
    table.head_asking(&name).await;
    let last = client(&table.url).await;
    let l = waiting(&last, &name);
    table.until_queued(&name, 2).await;
    // Right after the head's poll (the next is 500 ms away): it holds by the grant.
    after_a_request(&cut2).await;
    ng.release().await.unwrap();
    let gg = gw.await.unwrap().unwrap();
    cut2.set_mode(ProxyMode::Blackhole);
    let cut_at = Instant::now();
    assert!(
        gg.valid_until() <= gg.acquired_at() + CLAIM,
        "the waiter renewed before it was cut off"
    );
    let lg = l.await.unwrap().unwrap();
    let took = cut_at.elapsed();
    assert!(
        took < scaled(CLAIM + QUEUE_POLL + Duration::from_secs(3)) && took < TTL,
        "a granted waiter that crashed held the next back {took:?}"
    );
    assert!(lg.fencing_token() > gg.fencing_token());
    // The cut-off holder's lease ran out on its own clock.
    tokio::time::timeout(scaled(Duration::from_secs(10)), gg.lost().lost())
        .await
        .expect("the cut-off holder was never told it lost the lock");
    lg.release().await.unwrap();
    drop((cut, cut2));
    table.drop_it().await;
}

/// A waiter cancelled after a release granted it the lock but before it heard of it gives the
/// lock back at once (its queue clean-up), granting it to the next waiter: the next holds
/// before the cancelled one's claim would have run out.
#[tokio::test]
async fn a_waiter_cancelled_between_grant_and_notification_gives_it_back() {
    let Some(table) = Table::new().await else {
        return;
    };
    let holder = client(&table.url).await;
    let (proxy, through) = proxied(&table.url).await;
    let cancelled = client(&through).await;
    let next = client(&table.url).await;
    let name = unique("cancel-grant");
    let g = holder.lock(name.as_str(), &opts()).await.unwrap();
    let c = waiting(&cancelled, &name);
    let (token, _) = table.head_asking(&name).await;
    let n = waiting(&next, &name);
    table.until_queued(&name, 2).await;
    // Right after the head's poll (the next is 500 ms away): granted without a word, and the
    // head's lock() dropped.
    let (_, ask) = table.head_asking(&name).await;
    after_a_request(&proxy).await;
    // And its attempt answered by the server (its entry names a later attempt): granted while
    // that attempt was still on its way, the head would hold by its own attempt, not the grant.
    let (pool, table_name) = (&table.pool, &table.name);
    let answered = format!("SELECT ask FROM {table_name}_waits WHERE name = $1 AND waiter = $2");
    let later = poll_until(scaled(Duration::from_secs(10)), || async {
        let now: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(answered.clone()))
            .bind(&name)
            .bind(&token)
            .fetch_optional(pool)
            .await
            .unwrap()
            .flatten();
        now.filter(|&a| a > ask)
    });
    later.await.expect("the head's poll was never answered");
    let (granted_to, fence, claim_end) = table.grant_silently(&name).await;
    c.abort();
    assert_eq!(granted_to, token);
    g.abandon();
    let ng = n.await.unwrap().unwrap();
    let (owner, row_fence, _, acquired) = table.row(&name).await;
    assert_eq!(owner, Some(ng.token().to_hex()));
    assert_eq!(Some(row_fence as u64), ng.fencing_token());
    assert!(row_fence > fence);
    assert!(
        acquired < claim_end,
        "the next waiter held only when the cancelled one's claim ran out"
    );
    ng.release().await.unwrap();
    drop(cancelled);
    table.drop_it().await;
}

/// Fencing tokens strictly increase across a chain of hand-overs, in the queue's order; the
/// hand-overs are grants (heard on the table's channel), each naming the fence its waiter then
/// holds.
#[tokio::test]
async fn fences_increase_across_grants_in_queue_order() {
    let Some(table) = Table::new().await else {
        return;
    };
    let mut listener = sqlx::postgres::PgListener::connect_with(&table.pool)
        .await
        .unwrap();
    listener.listen(&table.name).await.unwrap();
    let holder = client(&table.url).await;
    let name = unique("grant-chain");
    let g = holder.lock(name.as_str(), &opts()).await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..4 {
        let locker = client(&table.url).await;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = {
            let (locker, name) = (locker.clone(), name.clone());
            tokio::spawn(async move {
                let guard = locker.lock(name.as_str(), &opts()).await.unwrap();
                let _ = rx.await;
                guard
            })
        };
        table.until_queued(&name, i + 1).await;
        waiters.push((locker, task, tx));
    }
    let mut fences = vec![g.fencing_token().unwrap()];
    let mut held = std::collections::HashMap::new();
    g.release().await.unwrap();
    for (_locker, task, tx) in waiters {
        let _ = tx.send(());
        let guard = task.await.unwrap();
        fences.push(guard.fencing_token().unwrap());
        held.insert(guard.token().to_hex(), guard.fencing_token().unwrap());
        guard.release().await.unwrap();
    }
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences out of order: {fences:?}"
    );
    // The grants sent meanwhile (all there: each was committed before its waiter held).
    let mut grants = 0;
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(200), listener.recv()).await {
        let Some(grant) = n.payload().strip_prefix('\u{3}') else {
            continue;
        };
        let parts: Vec<&str> = grant.split(' ').collect();
        let fence: u64 = parts[2].parse().unwrap();
        assert_eq!(held.get(parts[0]), Some(&fence), "a grant named {grant:?}");
        grants += 1;
    }
    assert!(grants >= 1, "no hand-over of the chain was a grant");
    table.drop_it().await;
}

/// A queue table made by an earlier version (without the grant's columns) gets them on the
/// first connect, and its waiters are then granted the lock.
#[tokio::test]
async fn an_earlier_queue_table_gets_the_grant_columns() {
    let Some(table) = Table::new().await else {
        return;
    };
    let t = &table.name;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {t}_waits (name TEXT NOT NULL, waiter TEXT NOT NULL, \
           mode TEXT NOT NULL, enqueued TIMESTAMPTZ NOT NULL, expires TIMESTAMPTZ NOT NULL, \
           PRIMARY KEY (name, waiter))"
    )))
    .execute(&table.pool)
    .await
    .unwrap();
    let holder = client(&table.url).await;
    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT attname::text FROM pg_attribute WHERE attrelid = $1::regclass \
         AND attname IN ('ask', 'claim', 'holder', 'granted') AND NOT attisdropped ORDER BY 1",
    )
    .bind(format!("{t}_waits"))
    .fetch_all(&table.pool)
    .await
    .unwrap();
    assert_eq!(columns, ["ask", "claim", "granted", "holder"]);
    let waiter = client(&table.url).await;
    let name = unique("upgraded");
    let g = holder.lock(name.as_str(), &opts()).await.unwrap();
    let w = waiting(&waiter, &name);
    let (token, _) = table.head_asking(&name).await;
    g.release().await.unwrap();
    let wg = w.await.unwrap().unwrap();
    assert_eq!(wg.token().to_hex(), token);
    wg.release().await.unwrap();
    table.drop_it().await;
}
