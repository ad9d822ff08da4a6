//! Per-acquisition options.

use std::time::Duration;

use crate::{Capabilities, Error, LockMode, MAX_PERMITS, MAX_TTL, Result};

/// The default lease TTL: 30 seconds, as Redisson's lock watchdog.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The maximum hold time of the renewal every guard gets when the options name none: one hour,
/// longer than most jobs run, short enough that a stuck holder frees the lock within the hour.
/// An explicit [`LockOptions::auto_renew`] (or [`LockOptions::no_auto_renew`]) wins.
///
/// (`lock()` has no default wait deadline: like tokio's `Mutex`, Redisson, Curator, `flock` and
/// `etcdctl lock`, it waits until acquired unless [`LockOptions::wait_timeout`] asks for one.)
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(3600);
/// How long `lock()` keeps retrying when the lock service cannot be reached, by default: 30
/// seconds of nothing but [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable), whether
/// the server refuses connections at once or answers nothing at all
/// ([`LockOptions::retry_unavailable_for`]).
pub const DEFAULT_RETRY_UNAVAILABLE: Duration = Duration::from_secs(30);

/// How `lock()` waits, what lease it asks for and whether it renews it.
///
/// The defaults: TTL [`DEFAULT_TTL`] (30 s), `lock()` waits until acquired (no deadline), and
/// every guard ([`Locker::lock`](crate::Locker::lock), [`Locker::try_lock`](crate::Locker::try_lock),
/// [`Locker::with_lock`](crate::Locker::with_lock)) renewed while it exists, up to
/// [`DEFAULT_MAX_HOLD`] (one hour); [`LockOptions::no_auto_renew`] opts out.
///
/// ```
/// use std::time::Duration;
/// use lockcore::{AutoRenew, LockOptions};
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait_timeout(Duration::from_secs(5))
///     .auto_renew(AutoRenew::until(Duration::from_secs(600)));
/// assert_eq!(opts.ttl_value(), Duration::from_secs(10));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LockOptions {
    ttl: Duration,
    wait: Option<Duration>,
    /// `None`: no renewal ([`LockOptions::no_auto_renew`]).
    auto_renew: Option<AutoRenew>,
    fencing: Fencing,
    require_fair: bool,
    label: Option<String>,
    mode: LockMode,
    retry_unavailable: Duration,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: DEFAULT_TTL,
            wait: None,
            auto_renew: Some(AutoRenew::until(DEFAULT_MAX_HOLD)),
            fencing: Fencing::IfAvailable,
            require_fair: false,
            label: None,
            mode: LockMode::Exclusive,
            retry_unavailable: DEFAULT_RETRY_UNAVAILABLE,
        }
    }
}

impl LockOptions {
    /// TTL 30 s, `lock()` waits until acquired, the guard renewed while it exists up to
    /// [`DEFAULT_MAX_HOLD`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease TTL: a holder that neither renews nor releases loses the lock after it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long `lock()` waits for a held lock before returning
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout). Zero makes it a single attempt. Without
    /// it, `lock()` waits until acquired.
    pub fn wait_timeout(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// How long `lock()` keeps retrying while the lock service cannot be reached: once no
    /// attempt has heard from the server for this long (each failed with
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable): refused, reset, or no answer
    /// within the backend's response timeout), the wait ends with the last such error, deadline
    /// or not; an attempt that hears nothing for this long is cut off. [`DEFAULT_RETRY_UNAVAILABLE`]
    /// (30 s) by default; zero is refused with `InvalidConfig`.
    pub fn retry_unavailable_for(mut self, limit: Duration) -> Self {
        self.retry_unavailable = limit;
        self
    }

    /// How long `lock()` retries an unreachable lock service
    /// ([`LockOptions::retry_unavailable_for`]).
    pub fn retry_unavailable_value(&self) -> Duration {
        self.retry_unavailable
    }

    /// `lock()` waits without a deadline (drop the future to give up): the default, to undo a
    /// [`LockOptions::wait_timeout`].
    pub fn wait_forever(mut self) -> Self {
        self.wait = None;
        self
    }

    /// Renews the lease in the background until the guard is released or dropped, or until the
    /// maximum hold time of `renew` has passed (the default renews every third of the TTL up to
    /// [`DEFAULT_MAX_HOLD`]).
    pub fn auto_renew(mut self, renew: AutoRenew) -> Self {
        self.auto_renew = Some(renew);
        self
    }

    /// No renewal: the lease ends one TTL after it was acquired (or last extended by hand), even
    /// while the guard exists. For holders that extend by hand, or tests that let a lease lapse.
    pub fn no_auto_renew(mut self) -> Self {
        self.auto_renew = None;
        self
    }

    /// Refuse with [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) unless the backend
    /// gives fencing tokens (`true`: [`Fencing::Required`]); `false` asks for the default,
    /// [`Fencing::IfAvailable`].
    pub fn require_fencing(mut self, yes: bool) -> Self {
        self.fencing = if yes {
            Fencing::Required
        } else {
            Fencing::IfAvailable
        };
        self
    }

    /// Whether the guard needs a fencing token (see [`Fencing`]; the default is
    /// [`Fencing::IfAvailable`]).
    pub fn fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// No fencing token is wanted ([`Fencing::NotWanted`]): a backend whose tokens cost a
    /// durable write per acquisition (PostgreSQL's row lock) may skip it, and the guard's
    /// [`fencing_token`](crate::LockGuard::fencing_token) may then be `None`.
    pub fn no_fencing(self) -> Self {
        self.fencing(Fencing::NotWanted)
    }

    /// Whether a fencing token is asked for ([`LockOptions::fencing`]).
    pub fn fencing_value(&self) -> Fencing {
        self.fencing
    }

    /// Refuse with [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) unless waiters are
    /// served first come, first served.
    pub fn require_fair(mut self, yes: bool) -> Self {
        self.require_fair = yes;
        self
    }

    /// A label stored with the lock's holder metadata (host, process id, when acquired), for
    /// operators: [`Locker::inspect`](crate::Locker::inspect) and `locksmith status` show it
    /// (say, `"nightly backup, job 4711"`). At most
    /// [`MAX_LABEL_LEN`](crate::inspect::MAX_LABEL_LEN) bytes, no control characters; anything
    /// else is refused by [`LockOptions::validate`] with
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) before any I/O. Readable by
    /// anyone who can read the lock: no secrets.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// What the acquisition asks for ([`LockOptions::mode`]).
    pub fn mode_value(&self) -> LockMode {
        self.mode
    }

    /// What to ask for: the lock alone (the default), a share of it, or one of N permits (see
    /// [`LockMode`]). Checked against the backend's [`Capabilities::shared`] and
    /// [`Capabilities::permits`] before any request is sent.
    pub fn mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// A shared acquisition: a read-write lock's reader ([`LockMode::Shared`]).
    pub fn shared(self) -> Self {
        self.mode(LockMode::Shared)
    }

    /// One of `limit` permits of a semaphore ([`LockMode::Permit`]); every client of the name
    /// must give the same `limit`.
    pub fn permits(self, limit: u32) -> Self {
        self.mode(LockMode::Permit { limit })
    }

    /// The label set with [`LockOptions::label`].
    pub fn label_value(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// The lease TTL.
    pub fn ttl_value(&self) -> Duration {
        self.ttl
    }

    /// The wait timeout of `lock()`, `None` for no deadline.
    pub fn wait_value(&self) -> Option<Duration> {
        self.wait
    }

    /// The auto-renewal policy of the guards (`None`: no renewal).
    pub fn auto_renew_value(&self) -> Option<&AutoRenew> {
        self.auto_renew.as_ref()
    }

    /// Checks the options against the contract and the backend's capabilities, before any I/O.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for a TTL of zero, above
    /// [`MAX_TTL`], outside the backend's range, a bad [label](LockOptions::label) or not above the backend's drift margin (the
    /// guard would be born lost), a permit limit of 0 or above [`MAX_PERMITS`], a zero
    /// [`LockOptions::retry_unavailable_for`], or a bad renewal policy (including one whose first renewal
    /// would come after the lease's validity ends);
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) for a required feature the backend
    /// lacks.
    pub fn validate(&self, caps: &Capabilities) -> Result<()> {
        if self.ttl.is_zero() {
            return Err(Error::invalid_config("ttl must be greater than zero"));
        }
        if self.ttl > MAX_TTL {
            return Err(Error::invalid_config(format!(
                "ttl {:?} is above the maximum of {:?}",
                self.ttl, MAX_TTL
            )));
        }
        if self.ttl < caps.min_ttl || self.ttl > caps.max_ttl {
            return Err(Error::invalid_config(format!(
                "ttl {:?} is outside this backend's range {:?}..={:?}",
                self.ttl, caps.min_ttl, caps.max_ttl
            )));
        }
        if self.retry_unavailable.is_zero() {
            return Err(Error::invalid_config(
                "retry_unavailable_for must be greater than zero",
            ));
        }
        if self.wait.is_some_and(|w| w > MAX_TTL * 52) {
            return Err(Error::invalid_config(
                "wait timeout is too large; use wait_forever()",
            ));
        }
        let margin = caps.drift_margin(self.ttl);
        if margin >= self.ttl {
            return Err(Error::invalid_config(format!(
                "ttl {:?} is not above this backend's drift margin of {margin:?}: the lease would be lost on arrival",
                self.ttl
            )));
        }
        if let Some(renew) = self.auto_renew_value() {
            renew.validate()?;
            let renew_at = self.ttl.mul_f64(renew.fraction());
            let valid_for = self.ttl - margin;
            if renew_at >= valid_for {
                return Err(Error::invalid_config(format!(
                    "auto-renewal (on by default) would renew {renew_at:?} after acquiring, after the lease's validity ends ({valid_for:?}: ttl {:?} minus a drift margin of {margin:?}); use a longer ttl, a smaller interval fraction, or no_auto_renew()",
                    self.ttl
                )));
            }
        }
        if let Some(label) = &self.label {
            crate::inspect::validate_label(label)?;
        }
        if let LockMode::Permit { limit } = self.mode
            && !(1..=MAX_PERMITS).contains(&limit)
        {
            return Err(Error::invalid_config(format!(
                "a semaphore's permit limit must be 1 to {MAX_PERMITS}, not {limit}"
            )));
        }
        self.mode.supported_by(caps).map_err(Error::unsupported)?;
        if self.fencing == Fencing::Required && !caps.fencing {
            return Err(Error::unsupported("this backend gives no fencing tokens"));
        }
        if self.require_fair && !caps.fair {
            return Err(Error::unsupported(
                "this backend does not serve waiters in FIFO order",
            ));
        }
        Ok(())
    }
}

/// Whether an acquisition wants a fencing token ([`LockOptions::fencing`]), carried to the
/// backend in [`AcquireRequest::fencing`](crate::backend::AcquireRequest::fencing).
///
/// A fencing token makes a paused or partitioned holder's late write harmless (the storage
/// refuses a token lower than one it has seen), but on some backends it costs a durable write
/// per acquisition: PostgreSQL's row lock otherwise takes a session advisory lock and writes
/// nothing, and commits (with a WAL flush) its counter only for a token. Every other backend
/// here makes its token in the same request as the lock and gives one either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fencing {
    /// The default: a token wherever the backend gives them
    /// ([`Capabilities::fencing`]), none elsewhere. Durable where the backend's tokens are
    /// (on PostgreSQL's row lock this is the committed counter, and its cost).
    #[default]
    IfAvailable,
    /// A token, or [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) from a backend
    /// without them, before any I/O.
    Required,
    /// No token is needed: the holder writes to nothing that checks tokens. A backend may then
    /// skip what only the token costs, and the guard may carry none
    /// ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token) `None`); mutual
    /// exclusion, expiry and the lost signal are unchanged. Tokens of later acquisitions that
    /// ask for them still only grow.
    NotWanted,
}

impl Fencing {
    /// Whether the backend must make a token (it should, and may skip the work otherwise).
    pub fn wanted(self) -> bool {
        self != Fencing::NotWanted
    }
}

/// Background renewal of a lease (a watchdog): bounded by a maximum hold time
/// ([`AutoRenew::until`], what every lock gets by default: [`DEFAULT_MAX_HOLD`]) so that a stuck
/// holder cannot keep a lock forever, or renewed until the guard is released or lost
/// ([`AutoRenew::forever`], what a [leadership](crate::Locker::campaign) gets by default).
#[derive(Clone, Debug, PartialEq)]
pub struct AutoRenew {
    /// `None`: no maximum ([`AutoRenew::forever`]).
    max_hold: Option<Duration>,
    interval_fraction: f64,
}

impl AutoRenew {
    /// Renews every third of the TTL until `max_hold` has passed since the lock was acquired;
    /// after that the lease runs out at most one TTL later (never later than `max_hold`), and
    /// the guard's lost signal fires with
    /// [`LostReason::MaxHoldReached`](crate::LostReason::MaxHoldReached) (logged at `WARN`, as
    /// every loss is: see [`telemetry`](crate::telemetry)).
    pub fn until(max_hold: Duration) -> Self {
        AutoRenew {
            max_hold: Some(max_hold),
            interval_fraction: 1.0 / 3.0,
        }
    }

    /// Renews every third of the TTL for as long as the guard exists: no maximum hold time. The
    /// lease ends only when the guard is released or dropped, or lost (a refused renewal, the
    /// server unreachable past the validity deadline). For holders that must last (a leader, a
    /// singleton service); a stuck holder then keeps the lock until its process dies.
    pub fn forever() -> Self {
        AutoRenew {
            max_hold: None,
            interval_fraction: 1.0 / 3.0,
        }
    }

    /// Renews after this fraction of the TTL has passed since the last renewal (0.05 to 0.8).
    pub fn interval_fraction(mut self, fraction: f64) -> Self {
        self.interval_fraction = fraction;
        self
    }

    /// The maximum hold time (`None`: [`AutoRenew::forever`]).
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The renewal interval as a fraction of the TTL.
    pub fn fraction(&self) -> f64 {
        self.interval_fraction
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !(0.05..=0.8).contains(&self.interval_fraction) {
            return Err(Error::invalid_config(
                "auto-renew interval fraction must be between 0.05 and 0.8 of the ttl",
            ));
        }
        if self
            .max_hold
            .is_some_and(|hold| hold.is_zero() || hold > MAX_TTL * 52)
        {
            return Err(Error::invalid_config(
                "auto-renew max hold time must be above zero and at most a year",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn validation() {
        let caps = Capabilities::default();
        let kind = |o: LockOptions| o.validate(&caps).err().map(|e| e.kind());
        assert_eq!(kind(LockOptions::new()), None);
        assert_eq!(
            kind(LockOptions::new().ttl(Duration::ZERO)),
            Some(ErrorKind::InvalidConfig)
        );
        assert_eq!(
            kind(LockOptions::new().ttl(Duration::MAX)),
            Some(ErrorKind::InvalidConfig)
        );
        assert_eq!(
            kind(
                LockOptions::new()
                    .auto_renew(AutoRenew::until(Duration::from_secs(1)).interval_fraction(0.99))
            ),
            Some(ErrorKind::InvalidConfig)
        );
        assert_eq!(
            kind(LockOptions::new().require_fencing(true)),
            Some(ErrorKind::Unsupported)
        );
        let narrow = Capabilities {
            min_ttl: Duration::from_secs(2),
            ..Capabilities::default()
        };
        assert_eq!(
            LockOptions::new()
                .ttl(Duration::from_secs(1))
                .validate(&narrow)
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidConfig
        );
    }

    #[test]
    fn fencing_is_asked_for_by_default_and_can_be_declined() {
        assert_eq!(LockOptions::new().fencing_value(), Fencing::IfAvailable);
        assert!(Fencing::IfAvailable.wanted() && Fencing::Required.wanted());
        assert!(!LockOptions::new().no_fencing().fencing_value().wanted());
        assert_eq!(
            LockOptions::new().require_fencing(true).fencing_value(),
            Fencing::Required
        );
        assert_eq!(
            LockOptions::new()
                .require_fencing(true)
                .require_fencing(false)
                .fencing_value(),
            Fencing::IfAvailable
        );
        // Declining a token is fine on a backend without them; requiring one is not.
        let none = Capabilities::default();
        assert!(LockOptions::new().no_fencing().validate(&none).is_ok());
        let fenced = Capabilities {
            fencing: true,
            ..Capabilities::default()
        };
        assert!(
            LockOptions::new()
                .fencing(Fencing::Required)
                .validate(&fenced)
                .is_ok()
        );
    }
}
