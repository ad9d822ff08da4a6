//! A `Locker` whose runtime has shut down (the `static` locker shared by `#[tokio::test]`s,
//! each with its own runtime) fails at once with `RuntimeGone`, from another runtime: before,
//! memory and the PostgreSQL row lock granted guards that were never renewed, and Redis gave a
//! broken pipe on `try_lock` and hung in `lock()` (issue 35). On memory, and on the shared
//! Redis and PostgreSQL servers (`LOCK_TEST_REDIS_URL`, `LOCK_TEST_POSTGRES_URL`) when set.

use std::time::Duration;

use locksmith::{ErrorKind, LockOptions, Locker};

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn a_locker_outliving_its_runtime_fails_at_once(url: &str) {
    let first = current_thread();
    let locker: Locker = first.block_on(locksmith::connect(url)).unwrap();
    drop(first);
    let name = format!("dead-runtime-{:08x}", fastrand::u32(..));
    let opts = LockOptions::new().wait_timeout(Duration::from_secs(1));
    let at_once = Duration::from_secs(5).mul_f64(conformance::time_scale());
    current_thread().block_on(async {
        let tried = tokio::time::timeout(at_once, locker.try_lock(name.as_str(), &opts))
            .await
            .expect("try_lock answers at once");
        assert_eq!(
            tried.as_ref().map(Option::is_some).map_err(|e| e.kind()),
            Err(ErrorKind::RuntimeGone),
            "{url}: try_lock"
        );
        let waited = tokio::time::timeout(at_once, locker.lock(name.as_str(), &opts))
            .await
            .expect("lock answers at once");
        assert_eq!(
            waited.map(|_| ()).map_err(|e| e.kind()),
            Err(ErrorKind::RuntimeGone),
            "{url}: lock"
        );
        let error = tried.err().unwrap();
        assert!(format!("{error}").contains("runtime"), "{error}");
        // A locker made on this runtime works.
        let fresh = locksmith::connect(url).await.unwrap();
        let g = fresh.try_lock(name.as_str(), &opts).await.unwrap().unwrap();
        g.release().await.unwrap();
    });
}

#[test]
fn memory_locker_outliving_its_runtime_fails_at_once() {
    a_locker_outliving_its_runtime_fails_at_once("memory://dead-runtime");
}

#[cfg(feature = "redis")]
#[test]
fn redis_locker_outliving_its_runtime_fails_at_once() {
    match std::env::var("LOCK_TEST_REDIS_URL") {
        Ok(url) => a_locker_outliving_its_runtime_fails_at_once(&url),
        Err(_) => eprintln!("skipped: LOCK_TEST_REDIS_URL is not set"),
    }
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_row_lock_locker_outliving_its_runtime_fails_at_once() {
    match std::env::var("LOCK_TEST_POSTGRES_URL") {
        Ok(url) => a_locker_outliving_its_runtime_fails_at_once(&url),
        Err(_) => eprintln!("skipped: LOCK_TEST_POSTGRES_URL is not set"),
    }
}
