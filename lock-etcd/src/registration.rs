//! This backend's entry in the `locksmith` facade's registry.

use std::time::Duration;

use lockcore::Locker;
use lockcore::registry::{HarnessHints, OtherNamespace, Registration};

use crate::{Config, EtcdBackend};

/// etcd v3 for the `locksmith` facade: connect from a URL or a [`Config`], and the conformance
/// harness's hints.
pub const REGISTRATION: Registration<Config> = Registration {
    connect: |url| Box::pin(async move { Ok(Locker::new(EtcdBackend::connect(url).await?)) }),
    connect_config: |config| {
        Box::pin(async move { Ok(Locker::new(EtcdBackend::from_config(config).await?)) })
    },
    harness: HarnessHints {
        // The key prefix is the path; kept under `locksmith/`, where a role may be limited to it.
        other_namespace: OtherNamespace::Path("/locksmith/lsc-other"),
        // etcd grants leases in whole seconds: a shorter TTL would be granted a longer one.
        min_scenario_ttl: Duration::from_secs(1),
        ..HarnessHints::DEFAULT
    },
};
