//! This backend's entry in the `locksmith` facade's registry.

use lockcore::Locker;
use lockcore::registry::{HarnessHints, OtherNamespace, Registration};

use crate::{Config, RedisBackend};

/// Redis (single node, Cluster, Sentinel) for the `locksmith` facade: connect from a URL or a
/// [`Config`], and the conformance harness's hints.
pub const REGISTRATION: Registration<Config> = Registration {
    connect: |url| Box::pin(async move { Ok(Locker::new(RedisBackend::connect(url).await?)) }),
    connect_config: |config| {
        Box::pin(async move { Ok(Locker::new(RedisBackend::from_config(config).await?)) })
    },
    harness: HarnessHints {
        other_namespace: OtherNamespace::Param {
            key: "namespace",
            value: "lsc-other",
        },
        // A cluster client follows the nodes' announced addresses around a proxy.
        unproxiable_schemes: &["redis+cluster", "rediss+cluster"],
        ..HarnessHints::DEFAULT
    },
};
