//! A toy lock service for the negative controls: an in-process "server" with leases and fencing
//! counters that can restart (keeping its locks, as a persistent server does) and whose
//! clients' links can be cut. Built correct, or with one deliberate flaw, to prove that the
//! fault scenarios catch that flaw.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith::backend::{AcquireRequest, Acquired, Backend, Lease};
use locksmith::{Capabilities, Error, Instant, Locker, OwnerToken, Result};

use crate::service::{Link, Service};

/// The deliberate flaw of a toy service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// None: a correct backend over a persistent server.
    None,
    /// The fencing counter lives in memory and starts from zero after a server restart.
    CounterResetsOnRestart,
    /// The client claims half a TTL more validity than the server grants: its lost signal
    /// fires after the server has already let another client in.
    LateLostSignal,
}

#[derive(Default)]
struct Store {
    locks: HashMap<String, (OwnerToken, Instant)>,
    fences: HashMap<String, u64>,
}

/// The toy service (see the module docs).
pub struct ToyService {
    store: Arc<Mutex<Store>>,
    flaw: Flaw,
    ttl: Duration,
}

impl ToyService {
    /// A toy service with `flaw`; the scenarios use a 300 ms TTL on it.
    pub fn new(flaw: Flaw) -> Self {
        ToyService {
            store: Arc::default(),
            flaw,
            ttl: Duration::from_millis(300),
        }
    }

    fn backend(&self) -> (ToyBackend, Arc<AtomicBool>) {
        let cut = Arc::new(AtomicBool::new(false));
        let mut caps = Capabilities::default();
        caps.fencing = true;
        caps.lost_detection = true;
        caps.expiry_after_ttl = true;
        (
            ToyBackend {
                store: self.store.clone(),
                flaw: self.flaw,
                cut: cut.clone(),
                caps,
            },
            cut,
        )
    }
}

struct CutFlag(Arc<AtomicBool>);

impl Link for CutFlag {
    fn cut(&self, cut: bool) {
        self.0.store(cut, Ordering::Release);
    }
}

#[async_trait::async_trait]
impl Service for ToyService {
    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn client(&self) -> std::result::Result<Locker, String> {
        Ok(Locker::new(self.backend().0))
    }

    async fn cuttable_client(&self) -> std::result::Result<(Locker, Box<dyn Link>), String> {
        let (b, cut) = self.backend();
        Ok((Locker::new(b), Box::new(CutFlag(cut))))
    }

    async fn restart(&mut self) -> Option<std::result::Result<(), String>> {
        if self.flaw == Flaw::CounterResetsOnRestart {
            self.store
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .fences
                .clear();
        }
        Some(Ok(()))
    }
}

#[derive(Clone)]
struct ToyBackend {
    store: Arc<Mutex<Store>>,
    flaw: Flaw,
    cut: Arc<AtomicBool>,
    caps: Capabilities,
}

impl std::fmt::Debug for ToyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ToyBackend({:?})", self.flaw)
    }
}

impl ToyBackend {
    /// A cut link holds the request until it heals (a blackhole).
    async fn link(&self) {
        while self.cut.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait::async_trait]
impl Backend for ToyBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Option<Acquired>> {
        let sent = Instant::now();
        self.link().await;
        let key = req.name.as_str().to_string();
        let fence = {
            let mut s = self.store();
            let now = Instant::now();
            if s.locks.get(&key).is_some_and(|(_, exp)| *exp > now) {
                return Ok(None);
            }
            s.locks.insert(key.clone(), (req.token, now + req.ttl));
            let f = s.fences.entry(key.clone()).or_default();
            *f += 1;
            *f
        };
        let lease = ToyLease {
            backend: self.clone(),
            key,
            token: req.token,
            fence,
        };
        let acquired = Acquired::new(lease, sent);
        Ok(Some(if self.flaw == Flaw::LateLostSignal {
            acquired.with_granted_ttl(req.ttl + req.ttl / 2)
        } else {
            acquired
        }))
    }

    fn describe(&self) -> String {
        format!("toy ({:?})", self.flaw)
    }
}

#[derive(Debug)]
struct ToyLease {
    backend: ToyBackend,
    key: String,
    token: OwnerToken,
    fence: u64,
}

#[async_trait::async_trait]
impl Lease for ToyLease {
    fn fencing_token(&self) -> Option<u64> {
        Some(self.fence)
    }

    async fn extend(&self, ttl: Duration) -> Result<Duration> {
        self.backend.link().await;
        let mut s = self.backend.store();
        let now = Instant::now();
        match s.locks.get_mut(&self.key) {
            Some((owner, exp)) if *owner == self.token && *exp > now => {
                *exp = now + ttl;
                Ok(if self.backend.flaw == Flaw::LateLostSignal {
                    ttl + ttl / 2
                } else {
                    ttl
                })
            }
            _ => Err(Error::not_held("not this owner's lease")),
        }
    }

    async fn release(&self) -> Result<()> {
        self.backend.link().await;
        let mut s = self.backend.store();
        match s.locks.get(&self.key) {
            Some((owner, exp)) if *owner == self.token && *exp > Instant::now() => {
                s.locks.remove(&self.key);
                Ok(())
            }
            _ => Err(Error::not_held("not this owner's lease")),
        }
    }
}
