//! The conformance suite against etcd: the shared single node (`LOCK_TEST_ETCD_URL`) and the
//! TLS + RBAC variant (`LOCK_TEST_ETCD_TLS_URL`, `etcds://user:password@...?ca=...`).

use std::sync::Arc;
use std::time::Duration;

use conformance::{Harness, Target};
use lock_etcd::EtcdBackend;
use lockcore::backend::async_trait;
use lockcore::{Locker, Result};

/// etcd leases are whole seconds; the test servers' minimum lease TTL is 1 s.
const MIN_TTL: Duration = Duration::from_secs(1);

struct EtcdHarness {
    label: &'static str,
    url: String,
}

#[async_trait]
impl Harness for EtcdHarness {
    fn label(&self) -> String {
        self.label.into()
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(EtcdBackend::connect(&self.url).await?))
    }

    /// An operator's admin delete of the lock's keys (`force_release` from another client).
    fn can_revoke(&self) -> bool {
        true
    }

    fn min_scenario_ttl(&self) -> Duration {
        MIN_TTL
    }
}

fn main() -> std::process::ExitCode {
    let target = |label: &'static str, var: &str| {
        Target::new(label, var, move |url| {
            Arc::new(EtcdHarness { label, url }) as Arc<dyn Harness>
        })
    };
    conformance::run_tests(vec![
        target("etcd", "LOCK_TEST_ETCD_URL"),
        target("etcd-tls", "LOCK_TEST_ETCD_TLS_URL"),
    ])
}
