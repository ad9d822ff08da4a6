//! This backend's entry in the `locksmith` facade's registry.

use lockcore::Locker;
use lockcore::registry::{HarnessHints, OtherNamespace, Registration};

use crate::{Config, RedlockBackend};

/// Redlock over independent Redis masters for the `locksmith` facade: connect from a URL or a
/// [`Config`], and the conformance harness's hints.
pub const REGISTRATION: Registration<Config> = Registration {
    connect: |url| Box::pin(async move { Ok(Locker::new(RedlockBackend::connect(url).await?)) }),
    connect_config: |config| {
        Box::pin(async move { Ok(Locker::new(RedlockBackend::from_config(config).await?)) })
    },
    harness: HarnessHints {
        other_namespace: OtherNamespace::Param {
            key: "namespace",
            value: "lsc-other",
        },
        // A vote that comes back late is still a vote when replies are delayed on purpose.
        reply_timeout_param: Some("node_timeout_ms"),
        ..HarnessHints::DEFAULT
    },
};
