//! "Who holds this lock?": the holder metadata written at acquire ([`Holder`]) and what
//! [`Locker::inspect`](crate::Locker::inspect) reports ([`LockInfo`]).
//!
//! Every acquisition carries a [`Holder`] (host, process id, when acquired, and the optional
//! [label](crate::LockOptions::label) the application set). Backends that declare
//! [`Capabilities::inspect`](crate::Capabilities::inspect) store it with the lock, in the same
//! request that takes it, in one encoding ([`Holder::encode`], a small JSON object, readable with
//! the server's own tools), and read it back for anyone who asks.

use std::borrow::Cow;
use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{Error, LockMode, LockName, Result};

/// The longest [label](crate::LockOptions::label) accepted, in bytes.
pub const MAX_LABEL_LEN: usize = 256;

/// Whose clock [`Holder::acquired_at`] was read on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AcquiredClock {
    /// The lock server's clock (ZooKeeper's node creation time, the SQL server's `now()`).
    Server,
    /// The holder's wall clock, written with the metadata (servers that keep no time with the
    /// lock: Redis, etcd, memory).
    Holder,
}

impl AcquiredClock {
    /// `"server"` or `"holder"`.
    pub fn as_str(self) -> &'static str {
        match self {
            AcquiredClock::Server => "server",
            AcquiredClock::Holder => "holder",
        }
    }
}

/// Who holds (or held) a lock: written at acquire, readable by anyone through
/// [`Locker::inspect`](crate::Locker::inspect).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's host name (as the holder's OS reports it; `"unknown"` when it cannot).
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// When the lock was acquired, on the clock [`Holder::clock`] names.
    pub acquired_at: SystemTime,
    /// Whose clock `acquired_at` is on.
    pub clock: AcquiredClock,
    /// The application's label ([`LockOptions::label`](crate::LockOptions::label)).
    pub label: Option<String>,
}

/// The stored form, versioned so that later fields can be added. Short keys: it rides along
/// every acquire.
#[derive(Serialize, Deserialize)]
struct Stored<'a> {
    v: u32,
    #[serde(borrow)]
    host: Cow<'a, str>,
    pid: u32,
    /// Unix milliseconds on the holder's clock.
    at: u64,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    label: Option<Cow<'a, str>>,
}

fn host_name() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let from_file = |p: &str| std::fs::read_to_string(p).ok();
        from_file("/proc/sys/kernel/hostname")
            .or_else(|| from_file("/etc/hostname"))
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .map(|h| h.trim().chars().filter(|c| !c.is_control()).collect())
            .filter(|h: &String| !h.is_empty())
            .unwrap_or_else(|| "unknown".to_owned())
    })
}

impl Holder {
    /// This process, now (on its own clock), with `label`.
    pub fn current(label: Option<String>) -> Self {
        Holder {
            host: host_name().to_owned(),
            pid: std::process::id(),
            acquired_at: SystemTime::now(),
            clock: AcquiredClock::Holder,
            label,
        }
    }

    /// The stored form: a small JSON object (`{"v":1,"host":..,"pid":..,"at":<unix ms>,"label":..}`).
    pub fn encode(&self) -> String {
        let at = self
            .acquired_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis().min(u128::from(u64::MAX)) as u64);
        serde_json::to_string(&Stored {
            v: 1,
            host: Cow::Borrowed(&self.host),
            pid: self.pid,
            at,
            label: self.label.as_deref().map(Cow::Borrowed),
        })
        .unwrap_or_default()
    }

    /// Reads the stored form back; `None` for anything else (a lock written by an older
    /// version or another client, without metadata).
    pub fn decode(stored: &str) -> Option<Holder> {
        let s: Stored<'_> = serde_json::from_str(stored).ok()?;
        Some(Holder {
            host: s.host.into_owned(),
            pid: s.pid,
            acquired_at: UNIX_EPOCH + Duration::from_millis(s.at),
            clock: AcquiredClock::Holder,
            label: s.label.map(Cow::into_owned),
        })
    }

    /// The same holder, acquired at `at` on the server's clock.
    pub fn at_server_time(mut self, at: SystemTime) -> Self {
        self.acquired_at = at;
        self.clock = AcquiredClock::Server;
        self
    }
}

/// Checks a label: at most [`MAX_LABEL_LEN`] bytes, no control characters.
pub(crate) fn validate_label(label: &str) -> Result<()> {
    if label.len() > MAX_LABEL_LEN {
        return Err(Error::invalid_config(format!(
            "lock label is {} bytes long; at most {MAX_LABEL_LEN} are allowed",
            label.len()
        )));
    }
    if let Some(c) = label.chars().find(|c| c.is_control()) {
        return Err(Error::invalid_config(format!(
            "lock label contains the control character {c:?}"
        )));
    }
    Ok(())
}

/// What [`Locker::inspect`](crate::Locker::inspect) saw: one read of the lock's state as the
/// server had it (it may change the moment after).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock inspected.
    pub name: LockName,
    /// Someone holds it.
    pub held: bool,
    /// The holder's fencing token, where the backend gives them.
    pub fencing_token: Option<u64>,
    /// The holder's remaining TTL as the server sees it; `None` when free, or when the lease
    /// has no TTL of its own on this backend (it lives with a session or connection).
    pub ttl_left: Option<Duration>,
    /// Who holds it; `None` when free, or when the holder wrote no metadata (an older client,
    /// another client of the server, a bare [`value`](LockInfo::value)).
    pub holder: Option<Holder>,
    /// The holder's bare value, where it stored one in place of holder metadata: the proposal
    /// of an etcd `concurrency.Election` leader, whichever client campaigned (locksmith's
    /// campaigns on etcd store their value so, see
    /// [`AcquireRequest::campaign`](crate::backend::AcquireRequest::campaign)).
    /// [`Locker::leader`](crate::Locker::leader) reports it as the leader's value. `None`
    /// otherwise.
    pub value: Option<String>,
    /// Acquisitions queued waiting for it, where the backend knows (`None` where it does not).
    pub waiters: Option<usize>,
    /// The mode it is held in, where the backend says (`None` when free).
    pub mode: Option<LockMode>,
    /// Every holder, where several hold it at once (shared holders, permits), in grant order;
    /// the fields above describe the first. Empty for a lock held alone.
    pub shares: Vec<Share>,
}

/// One of several holders of a lock (see [`LockInfo::shares`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Share {
    /// Its fencing token, where the backend gives them.
    pub fencing_token: Option<u64>,
    /// Its remaining TTL as the server sees it.
    pub ttl_left: Option<Duration>,
    /// Who holds it, where it stored its metadata.
    pub holder: Option<Holder>,
}

impl Share {
    /// A holder's share.
    pub fn new(
        fencing_token: Option<u64>,
        ttl_left: Option<Duration>,
        holder: Option<Holder>,
    ) -> Self {
        Share {
            fencing_token,
            ttl_left,
            holder,
        }
    }
}

impl LockInfo {
    /// A free lock with `waiters` queued (normally none).
    pub fn free(name: LockName, waiters: Option<usize>) -> Self {
        LockInfo {
            name,
            held: false,
            fencing_token: None,
            ttl_left: None,
            holder: None,
            value: None,
            waiters,
            mode: None,
            shares: Vec::new(),
        }
    }

    /// A held lock; set the rest with the `with_` methods.
    pub fn held(name: LockName) -> Self {
        LockInfo {
            held: true,
            ..Self::free(name, None)
        }
    }

    /// With the holder's fencing token.
    pub fn with_fencing_token(mut self, token: Option<u64>) -> Self {
        self.fencing_token = token;
        self
    }

    /// With the remaining TTL.
    pub fn with_ttl_left(mut self, ttl: Option<Duration>) -> Self {
        self.ttl_left = ttl;
        self
    }

    /// With the holder's metadata.
    pub fn with_holder(mut self, holder: Option<Holder>) -> Self {
        self.holder = holder;
        self
    }

    /// With the holder's bare value (see [`LockInfo::value`]).
    pub fn with_value(mut self, value: Option<String>) -> Self {
        self.value = value;
        self
    }

    /// With the number of queued waiters.
    pub fn with_waiters(mut self, waiters: Option<usize>) -> Self {
        self.waiters = waiters;
        self
    }

    /// Held in `mode`.
    pub fn with_mode(mut self, mode: Option<LockMode>) -> Self {
        self.mode = mode;
        self
    }

    /// Held by several at once: every share, in grant order. The first one's fields also fill
    /// the holder fields, for readers that know of one holder only.
    pub fn with_shares(mut self, shares: Vec<Share>) -> Self {
        if let Some(first) = shares.first() {
            self.fencing_token = first.fencing_token;
            self.ttl_left = first.ttl_left;
            self.holder = first.holder.clone();
        }
        self.shares = shares;
        self
    }
}

impl fmt::Display for LockInfo {
    /// One line per field, as `locksmith status` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "lock:     {}\nstate:    {}",
            self.name,
            if self.held { "held" } else { "free" }
        )?;
        if let Some(h) = &self.holder {
            writeln!(f, "host:     {}\npid:      {}", h.host, h.pid)?;
            if let Some(l) = &h.label {
                writeln!(f, "label:    {l}")?;
            }
            let ms = h
                .acquired_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            writeln!(f, "acquired: {ms} (unix ms, {} clock)", h.clock.as_str())?;
        } else if self.held {
            writeln!(f, "holder:   unknown (no metadata stored)")?;
        }
        if let Some(v) = &self.value {
            writeln!(f, "value:    {v}")?;
        }
        if let Some(t) = self.fencing_token {
            writeln!(f, "token:    {t}")?;
        }
        if let Some(t) = self.ttl_left {
            writeln!(f, "ttl left: {:.3}s", t.as_secs_f64())?;
        }
        if let Some(w) = self.waiters {
            writeln!(f, "waiters:  {w}")?;
        }
        if let Some(m) = self.mode {
            writeln!(f, "mode:     {m}")?;
        }
        if !self.shares.is_empty() {
            writeln!(f, "holders:  {}", self.shares.len())?;
        }
        for (i, s) in self.shares.iter().enumerate() {
            write!(f, "  {}.", i + 1)?;
            match &s.holder {
                Some(h) => write!(f, " host {} pid {}", h.host, h.pid)?,
                None => write!(f, " holder unknown")?,
            }
            if let Some(l) = s.holder.as_ref().and_then(|h| h.label.as_deref()) {
                write!(f, " label {l:?}")?;
            }
            if let Some(t) = s.fencing_token {
                write!(f, " token {t}")?;
            }
            if let Some(t) = s.ttl_left {
                write!(f, " ttl left {:.3}s", t.as_secs_f64())?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_round_trips_and_rejects_foreign_values() {
        let h = Holder::current(Some("nightly \"backup\" ünï".into()));
        let back = Holder::decode(&h.encode()).unwrap();
        assert_eq!(back.host, h.host);
        assert_eq!(back.pid, std::process::id());
        assert_eq!(back.label, h.label);
        let drift = h.acquired_at.duration_since(back.acquired_at).unwrap();
        assert!(drift < Duration::from_millis(1));
        assert_eq!(back.clock, AcquiredClock::Holder);
        assert!(Holder::decode("0123456789abcdef0123456789abcdef").is_none());
        assert!(Holder::decode("").is_none());
        let no_label = Holder::current(None);
        assert!(!no_label.encode().contains("label"));
        assert_eq!(Holder::decode(&no_label.encode()).unwrap().label, None);
    }

    #[test]
    fn labels_are_bounded_and_printable() {
        assert!(validate_label("deploy #42 (ci)").is_ok());
        assert!(validate_label(&"x".repeat(MAX_LABEL_LEN)).is_ok());
        let long = validate_label(&"x".repeat(MAX_LABEL_LEN + 1)).unwrap_err();
        assert_eq!(long.kind(), crate::ErrorKind::InvalidConfig);
        let ctl = validate_label("a\nb").unwrap_err();
        assert_eq!(ctl.kind(), crate::ErrorKind::InvalidConfig);
    }
}
