//! What a scenario is ([`Scenario`]) and what its body gets ([`Ctx`]).

use std::sync::Arc;
use std::time::Duration;

use lockcore::{Capabilities, LockName, LockOptions, Locker};

use crate::harness::{BoxFuture, Harness};

/// Why a scenario did not pass.
pub type Failure = String;

/// The outcome of a scenario body.
pub type Outcome = std::result::Result<(), Failure>;

/// One scenario: a name, what it proves, when it applies, and its body.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// A stable identifier (also the test name).
    pub name: &'static str,
    /// One line: what it proves.
    pub summary: &'static str,
    /// `Err(reason)` when the backend (or harness) cannot support it: reported unsupported.
    pub applies: fn(&Capabilities, &dyn Harness) -> Result<(), &'static str>,
    /// The body.
    pub run: for<'a> fn(&'a Ctx) -> BoxFuture<'a, Outcome>,
}

/// What a scenario body gets: the harness, the capabilities and helpers for names and time.
pub struct Ctx {
    pub(crate) harness: Arc<dyn Harness>,
    pub(crate) caps: Capabilities,
    pub(crate) prefix: String,
    pub(crate) scale: f64,
    observed: std::sync::Mutex<Option<String>>,
}

impl Ctx {
    /// Makes a context; `scale` stretches every time bound (>= 1 on slow machines).
    pub fn new(harness: Arc<dyn Harness>, caps: Capabilities, scenario: &str, scale: f64) -> Self {
        Ctx {
            harness,
            caps,
            prefix: format!("lsc-{:08x}-{scenario}-", fastrand::u32(..)),
            scale: scale.max(0.1),
            observed: std::sync::Mutex::new(None),
        }
    }

    /// Records what the scenario measured, for the report beside its status (a figure a
    /// backend is not held to, such as its requests per hand-over without a queue).
    pub(crate) fn observe(&self, what: String) {
        *self.observed.lock().unwrap_or_else(|p| p.into_inner()) = Some(what);
    }

    /// What the scenario recorded with [`Ctx::observe`].
    pub(crate) fn observed(&self) -> Option<String> {
        self.observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A lock name unique to this run and scenario.
    pub fn name(&self, suffix: &str) -> LockName {
        LockName::new(format!("{}{suffix}", self.prefix)).expect("scenario names are valid")
    }

    /// A new independent client.
    ///
    /// Cancel safe.
    pub async fn client(&self) -> Result<Locker, Failure> {
        self.harness
            .client()
            .await
            .map_err(|e| format!("connecting a client failed: {e}"))
    }

    /// `N` new independent clients ([`Ctx::client`]).
    ///
    /// Cancel safe.
    pub async fn clients<const N: usize>(&self) -> Result<[Locker; N], Failure> {
        let mut clients = Vec::with_capacity(N);
        for _ in 0..N {
            clients.push(self.client().await?);
        }
        Ok(clients
            .try_into()
            .unwrap_or_else(|_| unreachable!("N clients made")))
    }

    /// A client for a holder the scenario will crash ([`Ctx::crashable_client`]) and `N`
    /// other clients.
    ///
    /// Cancel safe.
    pub async fn crashable_and_clients<const N: usize>(
        &self,
    ) -> Result<(Locker, [Locker; N]), Failure> {
        Ok((self.crashable_client().await?, self.clients().await?))
    }

    /// A new client for a holder the scenario will crash ([`Harness::crashable_client`]).
    ///
    /// Cancel safe.
    pub async fn crashable_client(&self) -> Result<Locker, Failure> {
        self.harness
            .crashable_client()
            .await
            .map_err(|e| format!("connecting a client to crash failed: {e}"))
    }

    /// The scenario TTL: `base` scaled, and at least the harness's floor.
    pub fn ttl(&self, base: Duration) -> Duration {
        base.mul_f64(self.scale)
            .max(self.harness.min_scenario_ttl())
    }

    /// A generous time bound (scaled) for "happens promptly" assertions.
    pub fn bound(&self, base: Duration) -> Duration {
        base.mul_f64(self.scale)
    }

    /// Without renewal (guards renew by default): the scenarios test the lease itself, and many
    /// hold a guard while its lease runs out (expiry, lost signal, takeover, stale extend);
    /// those that test renewal ask for it with `.auto_renew(..)`.
    pub(super) fn opts(&self, ttl: Duration) -> LockOptions {
        LockOptions::new()
            .ttl(ttl)
            .wait_timeout(self.bound(Duration::from_secs(30)))
            .no_auto_renew()
    }

    /// [`Ctx::opts`] asking for a fencing token where the backend declares them
    /// (`Fencing::Required`): a scenario that checks tokens asks for them, whatever the
    /// default gives (a backend may skip a token nobody asked for).
    pub(super) fn fenced_opts(&self, ttl: Duration) -> LockOptions {
        self.opts(ttl).require_fencing(self.caps.fencing)
    }
}
