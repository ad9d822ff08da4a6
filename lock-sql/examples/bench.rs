//! Latency and hand-over rate per variant: uncontended acquire+release p50/p99 over 1000
//! iterations against a `SELECT 1` round trip in the same run, and 4 clients looping
//! lock/release on one name for 3 s. URLs from LOCK_TEST_POSTGRES_URL / LOCK_TEST_MYSQL_URL /
//! LOCK_TEST_SQLITE_URL.

use std::time::{Duration, Instant};

use lock_sql::SqlBackend;
use lockcore::{LockOptions, Locker};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn bench(label: &str, url: &str) -> lockcore::Result<()> {
    let backend = SqlBackend::connect(url).await?;
    let mut pings = Vec::new();
    for _ in 0..1000 {
        let t = Instant::now();
        backend.ping().await?;
        pings.push(t.elapsed());
    }
    let locker = Locker::new(backend);
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let name = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let mut lat = Vec::new();
    for _ in 0..1000 {
        let t = Instant::now();
        let g = locker.lock(name.as_str(), &opts).await?;
        g.release().await?;
        lat.push(t.elapsed());
    }
    let name = format!("handover-{}", uuid::Uuid::new_v4().simple());
    let stop = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let l = Locker::new(SqlBackend::connect(url).await?);
        let name = name.clone();
        let opts = opts.clone().wait_timeout(Duration::from_secs(10));
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                let g = l.lock(name.as_str(), &opts).await?;
                g.release().await?;
                n += 1;
            }
            lockcore::Result::Ok(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task")?;
    }
    println!(
        "{label:16} SELECT 1 p50 {:>8.1?} | acquire+release p50 {:>8.1?} p99 {:>8.1?} ({:.1}x SELECT 1) | 4-client hand-overs {:.0}/s",
        pct(&mut pings, 0.5),
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut lat, 0.5).as_secs_f64() / pct(&mut pings, 0.5).as_secs_f64(),
        total as f64 / 3.0
    );
    Ok(())
}

#[tokio::main]
async fn main() -> lockcore::Result<()> {
    let env = |v: &str| std::env::var(v).ok().filter(|s| !s.is_empty());
    let with = |u: &str, p: &str| format!("{u}{}{p}", if u.contains('?') { '&' } else { '?' });
    if let Some(pg) = env("LOCK_TEST_POSTGRES_URL") {
        bench("pg row-lock", &with(&pg, "strategy=row-lock")).await?;
        bench("pg lease", &with(&pg, "strategy=lease")).await?;
    }
    if let Some(my) = env("LOCK_TEST_MYSQL_URL") {
        bench("mysql row-lock", &with(&my, "strategy=row-lock")).await?;
        bench("mysql lease", &with(&my, "strategy=lease")).await?;
    }
    let lite = env("LOCK_TEST_SQLITE_URL").unwrap_or_else(|| {
        format!(
            "sqlite://{}",
            std::env::temp_dir().join("lock-sql-bench.db").display()
        )
    });
    bench("sqlite lease", &lite).await?;
    Ok(())
}
