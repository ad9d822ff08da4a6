//! The shared conformance suite against Redlock over the test servers' 5 independent masters
//! (`LOCK_TEST_REDLOCK_URL`, or built from `LOCK_TEST_REDLOCK_URLS`).

use std::sync::Arc;

use conformance::{Harness, Target};
use lock_redlock::RedlockBackend;
use lockcore::{LockName, Locker, Result};

/// Clients from one URL; revocation through a separate admin client, as an operator would.
struct RedlockHarness {
    url: String,
}

#[lockcore::backend::async_trait]
impl Harness for RedlockHarness {
    fn label(&self) -> String {
        "redlock".to_owned()
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(RedlockBackend::connect(&self.url).await?))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    async fn revoke(&self, name: &LockName) -> Result<()> {
        // The harness holds configuration only (each trial has its own runtime): connect here.
        let admin = RedlockBackend::connect(&self.url).await?;
        admin.force_release(name).await?;
        Ok(())
    }
}

/// `LOCK_TEST_REDLOCK_URLS` (the masters as `redis://` URLs) as one `redlock://` URL.
fn from_node_list(urls: &str) -> String {
    let hosts: Vec<&str> = urls
        .split(',')
        .map(|u| u.trim_start_matches("redis://").trim_end_matches('/'))
        .collect();
    format!("redlock://{}", hosts.join(","))
}

fn main() -> std::process::ExitCode {
    let make = |url| Arc::new(RedlockHarness { url }) as Arc<dyn Harness>;
    // scripts/servers.sh exports both; older environments only have the node list.
    let target = match (
        std::env::var("LOCK_TEST_REDLOCK_URL"),
        std::env::var("LOCK_TEST_REDLOCK_URLS"),
    ) {
        (Err(_), Ok(urls)) if !urls.is_empty() => {
            Target::fixed("redlock", from_node_list(&urls), make)
        }
        _ => Target::new("redlock", "LOCK_TEST_REDLOCK_URL", make),
    };
    conformance::run_tests(vec![target])
}
