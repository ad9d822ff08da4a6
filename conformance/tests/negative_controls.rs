//! Negative controls: deliberately broken backends that make the classic mistakes. Each must
//! fail exactly the scenarios named here, which proves the suite catches those mistakes. A
//! correct backend over the same toy store passes everything, so the store is not the cause.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use conformance::{Harness, Status, run_all};
use lockcore::backend::{AcquireRequest, Acquired, Backend, Lease};
use lockcore::{Capabilities, Error, Instant, LockName, Locker, Result};

/// The mistake a backend makes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Flaw {
    /// None: the control of the controls.
    None,
    /// `SETNX` then `EXPIRE` as two steps; a holder that dies in between leaves a lock forever.
    SetnxThenExpire,
    /// Every holder stores the same value, so anyone's release or extend hits anyone's lock.
    FixedValue,
    /// Release reads the value, then deletes in a second step after a pause.
    ReadThenDelete,
    /// Extend claims success without renewing: the lease runs out under a live holder.
    NeverRenewed,
    /// A waiter retries at once, again and again, instead of sleeping or being notified.
    SpinningWaiter,
}

/// A toy key-value store with expiry, standing in for a Redis server.
#[derive(Default)]
struct ToyStore {
    map: Mutex<HashMap<String, (String, Option<Instant>)>>,
}

impl ToyStore {
    fn with<T>(&self, key: &str, f: impl FnOnce(&mut Option<(String, Option<Instant>)>) -> T) -> T {
        let mut map = self.map.lock().unwrap();
        let mut entry = map
            .remove(key)
            .filter(|(_, exp)| exp.is_none_or(|e| e > Instant::now()));
        let out = f(&mut entry);
        if let Some(e) = entry {
            map.insert(key.to_string(), e);
        }
        out
    }
    fn set_nx(&self, key: &str, value: &str, ttl: Option<Duration>) -> bool {
        self.with(key, |e| {
            if e.is_some() {
                return false;
            }
            *e = Some((value.to_string(), ttl.map(|t| Instant::now() + t)));
            true
        })
    }
    fn expire(&self, key: &str, ttl: Duration) {
        self.with(key, |e| {
            if let Some((_, exp)) = e {
                *exp = Some(Instant::now() + ttl);
            }
        })
    }
    fn get(&self, key: &str) -> Option<String> {
        self.with(key, |e| e.as_ref().map(|(v, _)| v.clone()))
    }
    fn del(&self, key: &str) -> bool {
        self.with(key, |e| e.take().is_some())
    }
    fn compare_and_delete(&self, key: &str, value: &str) -> bool {
        self.with(key, |e| {
            if e.as_ref().is_some_and(|(v, _)| v == value) {
                *e = None;
                true
            } else {
                false
            }
        })
    }
    fn compare_and_expire(&self, key: &str, value: &str, ttl: Duration) -> bool {
        self.with(key, |e| match e {
            Some((v, exp)) if v == value => {
                *exp = Some(Instant::now() + ttl);
                true
            }
            _ => false,
        })
    }
}

#[derive(Debug)]
struct FlawedBackend {
    store: Arc<ToyStoreHandle>,
    flaw: Flaw,
    caps: Capabilities,
}

/// `Debug` for the store without printing its contents.
struct ToyStoreHandle(ToyStore);

impl std::fmt::Debug for ToyStoreHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ToyStore")
    }
}

#[async_trait]
impl Backend for FlawedBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let key = req.name.escaped();
        let value = match self.flaw {
            Flaw::FixedValue => "locked".to_string(),
            _ => req.token.to_hex(),
        };
        let sent = Instant::now();
        let store = &self.store.0;
        if self.flaw == Flaw::SetnxThenExpire {
            if !store.set_nx(&key, &value, None) {
                return Ok(None);
            }
            // The second round trip: a holder cancelled or crashed here never sets the expiry.
            tokio::time::sleep(Duration::from_millis(20)).await;
            store.expire(&key, req.ttl);
        } else if !store.set_nx(&key, &value, Some(req.ttl)) {
            return Ok(None);
        }
        let lease = FlawedLease {
            store: self.store.clone(),
            key,
            value,
            flaw: self.flaw,
        };
        Ok(Some(Acquired::new(lease, sent)))
    }

    async fn acquire(
        &self,
        req: &AcquireRequest,
        deadline: Option<Instant>,
    ) -> Result<Option<Acquired>> {
        // A tight poll, so that a waiter takes over within a few milliseconds of an expiry.
        loop {
            if let Some(a) = self.try_acquire(req).await? {
                return Ok(Some(a));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            if self.flaw == Flaw::SpinningWaiter {
                tokio::task::yield_now().await;
                continue;
            }
            let wake = now + Duration::from_millis(2);
            tokio::time::sleep_until(deadline.map_or(wake, |d| d.min(wake))).await;
        }
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        Ok(self.store.0.del(&name.escaped()))
    }

    fn describe(&self) -> String {
        format!("toy://{:?}", self.flaw)
    }
}

#[derive(Debug)]
struct FlawedLease {
    store: Arc<ToyStoreHandle>,
    key: String,
    value: String,
    flaw: Flaw,
}

fn not_held() -> Error {
    Error::not_held("not this owner's lease")
}

#[async_trait]
impl Lease for FlawedLease {
    fn fencing_token(&self) -> Option<u64> {
        None
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        if self.flaw == Flaw::NeverRenewed {
            return Ok(ttl);
        }
        if self.store.0.compare_and_expire(&self.key, &self.value, ttl) {
            Ok(ttl)
        } else {
            Err(not_held())
        }
    }

    async fn release(&self) -> Result<()> {
        let store = &self.store.0;
        if self.flaw == Flaw::ReadThenDelete {
            if store.get(&self.key).as_deref() != Some(&self.value) {
                return Err(not_held());
            }
            // The second round trip: by now the lease may have run out and been taken over.
            tokio::time::sleep(Duration::from_millis(50)).await;
            store.del(&self.key);
            return Ok(());
        }
        if store.compare_and_delete(&self.key, &self.value) {
            Ok(())
        } else {
            Err(not_held())
        }
    }
}

struct FlawedHarness {
    store: Arc<ToyStoreHandle>,
    flaw: Flaw,
}

#[async_trait]
impl Harness for FlawedHarness {
    fn label(&self) -> String {
        format!("{:?}", self.flaw)
    }

    async fn client(&self) -> Result<Locker> {
        let mut caps = Capabilities::default();
        caps.force_release = true;
        Ok(Locker::new(FlawedBackend {
            store: self.store.clone(),
            flaw: self.flaw,
            caps,
        }))
    }

    fn can_revoke(&self) -> bool {
        true
    }
}

/// Runs the whole suite against a backend with `flaw` and returns the failing scenarios.
fn failing(flaw: Flaw) -> BTreeSet<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let harness = Arc::new(FlawedHarness {
        store: Arc::new(ToyStoreHandle(ToyStore::default())),
        flaw,
    });
    let report = rt.block_on(run_all(harness, false, |_| {}));
    let mut failed = BTreeSet::new();
    for r in report.results {
        match r.status {
            Status::Fail => {
                eprintln!(
                    "{flaw:?} fails {}: {}",
                    r.scenario,
                    r.reason.unwrap_or_default()
                );
                failed.insert(r.scenario);
            }
            Status::Pass | Status::Unsupported => {}
            Status::Skipped => panic!("{} was skipped", r.scenario),
        }
    }
    failed
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn correct_toy_backend_passes_everything() {
    assert_eq!(failing(Flaw::None), set(&[]));
}

#[test]
fn setnx_then_expire_is_caught() {
    assert_eq!(
        failing(Flaw::SetnxThenExpire),
        set(&["cancelled_acquire_leaves_nothing"])
    );
}

#[test]
fn fixed_lock_value_is_caught() {
    assert_eq!(
        failing(Flaw::FixedValue),
        set(&[
            "extend_after_expiry_not_held",
            // The lost guard's release on drop frees the next holder's lock.
            "lost_signal_on_expiry",
            "release_racing_expiry_keeps_next_holder",
            "stale_release_keeps_new_holder",
        ])
    );
}

#[test]
fn read_then_delete_release_is_caught() {
    assert_eq!(
        failing(Flaw::ReadThenDelete),
        set(&[
            // The watchdog's release at the validity deadline reads the value, pauses past the
            // expiry, and deletes the next holder's lock.
            "auto_renew_stops_at_max_hold",
            "release_racing_expiry_keeps_next_holder",
        ])
    );
}

#[test]
fn lease_never_renewed_is_caught() {
    assert_eq!(
        failing(Flaw::NeverRenewed),
        set(&[
            "auto_renew_keeps_lock",
            "auto_renew_stops_at_max_hold",
            "extend_after_expiry_not_held",
            "lost_signal_on_revoke",
        ])
    );
}

#[test]
fn spinning_waiter_is_caught() {
    assert_eq!(
        failing(Flaw::SpinningWaiter),
        set(&["waiter_does_not_spin"])
    );
}
