//! What a backend crate tells the `locksmith` facade about itself: one [`Registration`] per
//! backend, from which the facade's URL dispatch, its `Config` dispatch and the command line's
//! conformance harness all learn (so adding a backend touches one registration, not a list of
//! scheme matches in several crates).
//!
//! A backend crate exports a `pub const` of this type (`lock_redis::REGISTRATION`,
//! `lock_sql::POSTGRES`, ...); the facade lists it once, with its URL schemes and cargo feature,
//! in its registry.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::{Locker, Result};

/// A connection in progress: the future of a [`Locker`].
pub type Connecting<'a> = Pin<Box<dyn Future<Output = Result<Locker>> + Send + 'a>>;

/// One backend as the facade sees it: how to connect from a URL and from the backend's own
/// config type `C`, and what the conformance harness needs to know about its URLs.
///
/// ```
/// use lockcore::registry::{HarnessHints, Registration};
/// # struct MyConfig;
/// /// `mine://[store]`: the in-memory backend under another name.
/// const MINE: Registration<MyConfig> = Registration {
///     connect: |url| Box::pin(async move {
///         let store = url.split_once("://").map_or("", |(_, s)| s);
///         Ok(lockcore::Locker::new(lockcore::memory::MemoryBackend::connect(store)))
///     }),
///     connect_config: |_config| Box::pin(async {
///         Ok(lockcore::Locker::new(lockcore::memory::MemoryBackend::connect("mine")))
///     }),
///     harness: HarnessHints::DEFAULT,
/// };
/// # let _ = MINE;
/// ```
pub struct Registration<C> {
    /// Connects to the service a URL of one of the backend's schemes names (the backend's
    /// `connect(url)`). Cancel safety: as the backend's `connect`.
    pub connect: for<'a> fn(&'a str) -> Connecting<'a>,
    /// Validates the backend's own config type exactly as a URL is validated, then connects
    /// (the backend's `from_config`). Cancel safety: as the backend's `from_config`.
    pub connect_config: fn(C) -> Connecting<'static>,
    /// What the conformance harness of the `locksmith` command needs to know.
    pub harness: HarnessHints,
}

/// What the conformance harness (`locksmith report`) needs to know about a backend's URLs, for
/// the scenarios that need a second namespace, short TTLs or proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HarnessHints {
    /// How a URL of the same server but another namespace is made.
    pub other_namespace: OtherNamespace,
    /// The shortest TTL scenarios may use (etcd grants leases in whole seconds).
    pub min_scenario_ttl: Duration,
    /// Schemes whose clients cannot go through a proxy (a cluster client follows the nodes'
    /// announced addresses around it).
    pub unproxiable_schemes: &'static [&'static str],
    /// A query parameter (whole milliseconds) bounding how long the client waits for one
    /// server's reply, which a scenario delaying every reply sets to a multiple of the delay
    /// unless the URL sets it (Redlock's `node_timeout_ms`: a late vote is still a vote there).
    pub reply_timeout_param: Option<&'static str>,
}

impl HarnessHints {
    /// No second namespace, 300 ms scenarios, every scheme proxiable, no reply timeout.
    pub const DEFAULT: HarnessHints = HarnessHints {
        other_namespace: OtherNamespace::Unsupported,
        min_scenario_ttl: Duration::from_millis(300),
        unproxiable_schemes: &[],
        reply_timeout_param: None,
    };
}

/// How a URL of the same server but another lock namespace is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OtherNamespace {
    /// A query parameter set to this value (`namespace=`, `table=`).
    Param {
        /// The parameter.
        key: &'static str,
        /// The other namespace.
        value: &'static str,
    },
    /// The URL's path replaced by this one (etcd's key prefix).
    Path(&'static str),
    /// This text appended to the URL without its query (`memory://jobs` -> `memory://jobs-other`).
    Suffix(&'static str),
    /// The backend has no namespace setting.
    Unsupported,
}
