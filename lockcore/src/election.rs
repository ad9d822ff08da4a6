//! Leader election on one name, over the backend's own lock: the leader holds the name's lock,
//! its value (the candidate's address, say) is the lock's holder label, its term the lock's
//! fencing token. So every backend elects with the qualities of its locks: the old leader's
//! lease runs out (and its lost signal fires, at its validity deadline) before the server frees
//! the name for the next one, and a store can refuse a deposed leader's writes by term.
//!
//! A backend whose server has an election recipe of its own stores the value where that
//! recipe's clients read it, and reports it back as [`LockInfo::value`](crate::LockInfo::value)
//! (see [`AcquireRequest::campaign`](crate::backend::AcquireRequest::campaign)): on etcd,
//! `concurrency.Election` clients (`etcdctl elect`) see locksmith's leader and its value, and
//! [`Locker::leader`] sees theirs.

use std::time::Duration;

use crate::{
    AutoRenew, Error, Fencing, Holder, IntoLockName, LockGuard, LockName, LockOptions, Locker,
    LostSignal, Result,
};

/// How [`Locker::campaign`] waits and keeps its leadership: the lease's TTL, the wait for
/// election, the renewal. There is no mode: a leadership is exclusive by construction (a
/// campaign given [`LockOptions`] with `shared()` or `permits(2)` used to elect every
/// candidate), and no maximum hold time unless one is asked for: a leader renews until it
/// resigns or is lost.
///
/// The defaults: TTL [`DEFAULT_TTL`](crate::DEFAULT_TTL) (30 s), wait until elected, renewed with
/// [`AutoRenew::forever`].
///
/// ```compile_fail
/// # async fn f(locker: lockcore::Locker) {
/// // A campaign takes no lock options, so no mode: this does not compile.
/// let _ = locker
///     .campaign("leader", "10.0.0.1", &lockcore::LockOptions::new().shared())
///     .await;
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct CampaignOptions(
    /// The settings of the lock a campaign takes, kept with the lock options' own setters:
    /// only those below can change it, none of them its mode.
    LockOptions,
);

impl Default for CampaignOptions {
    fn default() -> Self {
        CampaignOptions(LockOptions::new().auto_renew(AutoRenew::forever()))
    }
}

impl CampaignOptions {
    /// TTL 30 s, wait until elected, renewed until resigned or lost.
    pub fn new() -> Self {
        Self::default()
    }

    /// The leadership lease's TTL: a leader that neither renews nor resigns is deposed after it.
    pub fn ttl(self, ttl: Duration) -> Self {
        CampaignOptions(self.0.ttl(ttl))
    }

    /// How long [`Locker::campaign`] waits to be elected before returning
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) (as [`LockOptions::wait_timeout`]).
    pub fn wait_timeout(self, wait: Duration) -> Self {
        CampaignOptions(self.0.wait_timeout(wait))
    }

    /// Waits to be elected without a deadline (the default).
    pub fn wait_forever(self) -> Self {
        CampaignOptions(self.0.wait_forever())
    }

    /// How the leadership is renewed: [`AutoRenew::forever`] by default;
    /// [`AutoRenew::until`] deposes the leader at a maximum hold time.
    pub fn auto_renew(self, renew: AutoRenew) -> Self {
        CampaignOptions(self.0.auto_renew(renew))
    }

    /// No renewal: the leader is deposed one TTL after its election (or its last extend by
    /// hand through [`Leadership::guard`]).
    pub fn no_auto_renew(self) -> Self {
        CampaignOptions(self.0.no_auto_renew())
    }

    /// The TTL.
    pub fn ttl_value(&self) -> Duration {
        self.0.ttl_value()
    }

    /// The wait timeout, `None` for no deadline.
    pub fn wait_value(&self) -> Option<Duration> {
        self.0.wait_value()
    }

    /// The renewal policy (`None`: no renewal).
    pub fn auto_renew_value(&self) -> Option<&AutoRenew> {
        self.0.auto_renew_value()
    }

    /// The exclusive lock a campaign takes: its value as the holder label, and a fencing token
    /// wherever the backend gives them (the term; observers read the value from the metadata
    /// that a backend may store only with a token, PostgreSQL's row lock).
    fn lock_options(&self, value: &str) -> LockOptions {
        self.0.clone().label(value).fencing(Fencing::IfAvailable)
    }
}

/// This client's leadership of a name, from [`Locker::campaign`]. Dropped without
/// [`Leadership::resign`], it resigns in the background.
#[must_use = "dropping a Leadership resigns at once"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    value: String,
}

impl Leadership {
    /// The term: the lock's fencing token, above every earlier leader's (where the backend
    /// gives fencing tokens).
    pub fn term(&self) -> Option<u64> {
        self.guard.fencing_token()
    }

    /// The value this leader campaigned with.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Fires when the leadership is lost (its lease lost or run out): stop acting as leader.
    pub fn lost(&self) -> LostSignal {
        self.guard.lost()
    }

    /// Whether this client is surely still the leader (its lease valid, not known lost).
    pub fn is_leader(&self) -> bool {
        self.guard.is_valid()
    }

    /// The lock behind the leadership.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Steps down: the next candidate can be elected at once.
    ///
    /// Cancel safety: as [`LockGuard::release`].
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

/// The leader of a name as any client sees it ([`Locker::leader`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The value it campaigned with (`None` when its holder metadata is missing).
    pub value: Option<String>,
    /// Its term, where the backend gives fencing tokens.
    pub term: Option<u64>,
    /// Who it is: host, process id, when elected (`None` where the backend stores the value
    /// alone, as etcd does for its election recipe: see
    /// [`LockInfo::value`](crate::LockInfo::value)).
    pub holder: Option<Holder>,
}

/// Watches a name's leader by reading it every `every` ([`Locker::watch_leader`]).
#[derive(Debug)]
pub struct LeaderWatch {
    locker: Locker,
    name: LockName,
    every: Duration,
    last: Option<Option<Leader>>,
}

impl LeaderWatch {
    /// The next change of leader (a new term or value, or the name becoming free): the first
    /// call returns the current state. Changes closer together than `every` show as one: the
    /// term numbers then jump.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// As [`Locker::leader`].
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        loop {
            let now = self.locker.leader(self.name.clone()).await?;
            let same = self
                .last
                .as_ref()
                .is_some_and(|last| key(last) == key(&now));
            if !same {
                self.last = Some(now.clone());
                return Ok(now);
            }
            tokio::time::sleep(self.every).await;
        }
    }

    /// The changes of leader as a [`Stream`](futures::Stream): each item is what
    /// [`LeaderWatch::changed`] returns, the first the current state. The stream ends after the
    /// first error (a backend that cannot be read is not retried here).
    ///
    /// Changes are found by reading the leader every `every` (the contract has no way for a
    /// backend to push them); changes closer together than `every` show as one.
    ///
    /// ```
    /// # async fn f(locker: lockcore::Locker) -> lockcore::Result<()> {
    /// use futures::StreamExt;
    /// let changes = locker
    ///     .watch_leader("scheduler", std::time::Duration::from_millis(200))?
    ///     .into_stream();
    /// let mut changes = std::pin::pin!(changes);
    /// while let Some(leader) = changes.next().await {
    ///     match leader? {
    ///         Some(l) => println!("leader {:?} (term {:?})", l.value, l.term),
    ///         None => println!("no leader"),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_stream(self) -> impl futures::Stream<Item = Result<Option<Leader>>> + Send {
        futures::stream::unfold(Some(self), |watch| async move {
            let mut watch = watch?;
            match watch.changed().await {
                Ok(leader) => Some((Ok(leader), Some(watch))),
                Err(e) => Some((Err(e), None)),
            }
        })
    }
}

fn key(l: &Option<Leader>) -> Option<(Option<u64>, Option<&str>)> {
    l.as_ref().map(|l| (l.term, l.value.as_deref()))
}

impl Locker {
    /// Campaigns for the leadership of `name` with `value` (the candidate's address, at most
    /// 256 bytes, no control characters: it is stored as the lock's holder label, readable by
    /// every client; on etcd the leader key's value, as etcd's own election stores it): waits
    /// as [`Locker::lock`] does for the name's exclusive lock (the options' wait timeout and
    /// TTL apply), and returns once elected. The leadership is renewed until it is resigned or
    /// lost, with no maximum hold time unless the [`CampaignOptions`] ask for one. It asks for
    /// a fencing token wherever the backend gives them: it is the term.
    ///
    /// Cancel safety: as [`Locker::lock`]; a candidate dropped while waiting leaves nothing.
    ///
    /// # Errors
    /// As [`Locker::lock`]; `InvalidConfig` for a bad value, before any I/O.
    pub async fn campaign(
        &self,
        name: impl IntoLockName,
        value: &str,
        options: &CampaignOptions,
    ) -> Result<Leadership> {
        let options = options.lock_options(value);
        let mut pending = self.request(name, &options)?;
        pending.request.campaign = true;
        let guard = self.wait_for(pending, &options).await?;
        Ok(Leadership {
            guard,
            value: value.to_owned(),
        })
    }

    /// The current leader of `name` (`None` when there is none), read from the lock's holder
    /// metadata, or from its bare value ([`LockInfo::value`](crate::LockInfo::value): an etcd
    /// election leader's, whichever client it is). Reads only.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// As [`Locker::inspect`] (`Unsupported` where the backend cannot inspect its locks).
    pub async fn leader(&self, name: impl IntoLockName) -> Result<Option<Leader>> {
        let info = self.inspect(name).await?;
        Ok(info.held.then(|| Leader {
            value: info
                .holder
                .as_ref()
                .and_then(|h| h.label.clone())
                .or(info.value),
            term: info.fencing_token,
            holder: info.holder,
        }))
    }

    /// A watch of `name`'s leader, read every `every` (at least 10 ms).
    ///
    /// # Errors
    /// `InvalidName`, or `Unsupported` where the backend cannot inspect its locks.
    pub fn watch_leader(&self, name: impl IntoLockName, every: Duration) -> Result<LeaderWatch> {
        let name = name.into_lock_name()?;
        if !self.capabilities().inspect {
            return Err(Error::unsupported(format!(
                "{} cannot read who holds a lock, so it cannot show the leader",
                self.describe()
            )));
        }
        Ok(LeaderWatch {
            locker: self.clone(),
            name,
            every: every.max(Duration::from_millis(10)),
            last: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::memory::MemoryBackend;

    async fn next(
        changes: &mut (impl futures::Stream<Item = Result<Option<Leader>>> + Unpin),
    ) -> Option<Leader> {
        tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await
            .expect("a change within the bound")
            .expect("the stream goes on")
            .unwrap()
    }

    /// A campaign's lock: exclusive (a campaign has no mode to set), its value as the label,
    /// a fencing token where the backend gives one, renewed forever unless asked otherwise,
    /// and the TTL and wait the campaign options say.
    #[test]
    fn a_campaign_takes_an_exclusive_lock_labelled_with_its_value() {
        let defaults = CampaignOptions::new().lock_options("a:1");
        assert_eq!(defaults.mode_value(), crate::LockMode::Exclusive);
        assert_eq!(defaults.label_value(), Some("a:1"));
        assert_eq!(defaults.fencing_value(), Fencing::IfAvailable);
        assert_eq!(defaults.auto_renew_value(), Some(&AutoRenew::forever()));
        assert_eq!(defaults.wait_value(), None);
        assert_eq!(defaults.ttl_value(), crate::DEFAULT_TTL);
        let set = CampaignOptions::new()
            .ttl(Duration::from_secs(7))
            .wait_timeout(Duration::from_secs(3))
            .no_auto_renew()
            .lock_options("b:2");
        assert_eq!(set.ttl_value(), Duration::from_secs(7));
        assert_eq!(set.wait_value(), Some(Duration::from_secs(3)));
        assert_eq!(set.auto_renew_value(), None);
        assert_eq!(set.mode_value(), crate::LockMode::Exclusive);
    }

    /// Issue 37: leader changes as a `Stream`: the current state first, then each election and
    /// resignation.
    #[tokio::test]
    async fn leader_changes_come_as_a_stream() {
        let locker = Locker::new(MemoryBackend::connect("leader_changes_stream"));
        let opts = CampaignOptions::new().ttl(Duration::from_secs(10));
        let changes = locker
            .watch_leader("elected", Duration::from_millis(10))
            .unwrap()
            .into_stream();
        let mut changes = std::pin::pin!(changes);
        assert_eq!(next(&mut changes).await, None, "no leader at first");
        let first = locker.campaign("elected", "a:1", &opts).await.unwrap();
        let first_term = first.term();
        let seen = next(&mut changes).await.expect("a leader");
        assert_eq!(
            (seen.value.as_deref(), seen.term),
            (Some("a:1"), first_term)
        );
        first.resign().await.unwrap();
        assert_eq!(next(&mut changes).await, None, "resigned");
        let second = locker.campaign("elected", "b:2", &opts).await.unwrap();
        let seen = next(&mut changes).await.expect("a leader");
        assert_eq!(
            (seen.value.as_deref(), seen.term),
            (Some("b:2"), second.term())
        );
        assert!(second.term() > first_term);
        second.resign().await.unwrap();
    }
}
