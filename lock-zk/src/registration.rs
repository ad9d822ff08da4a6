//! This backend's entry in the `locksmith` facade's registry.

use lockcore::Locker;
use lockcore::registry::{HarnessHints, OtherNamespace, Registration};

use crate::{Config, ZkBackend};

/// ZooKeeper for the `locksmith` facade: connect from a URL or a [`Config`], and the
/// conformance harness's hints.
pub const REGISTRATION: Registration<Config> = Registration {
    connect: |url| Box::pin(async move { Ok(Locker::new(ZkBackend::connect(url).await?)) }),
    connect_config: |config| {
        Box::pin(async move { Ok(Locker::new(ZkBackend::from_config(config).await?)) })
    },
    harness: HarnessHints {
        other_namespace: OtherNamespace::Param {
            key: "namespace",
            value: "lsc-other",
        },
        ..HarnessHints::DEFAULT
    },
};
