//! Operator and measurement requests: force release, a round trip, the bare primitive, the
//! queue's length, the servers' request counts (`mntr`).

use std::collections::HashSet;
use std::time::Duration;

use lockcore::{Error, IntoLockName, Result};
use zookeeper_client as zk;

use crate::backend::{ZkBackend, queue};
use crate::contenders::{self, Role};
use crate::errors::{map_err, retry};

impl ZkBackend {
    /// Deletes the holders' contender nodes of `name` (an exclusive holder's, the readers'
    /// ahead of the first writer, a semaphore's first `limit`), as an operator's override: a
    /// holder's lease is refused at its next renewal, and the waiters, left in the queue, are
    /// handed the lock as on a release. (Deleting the waiters' nodes too let a waiter granted
    /// between two deletions hold a lock whose node was then gone.) Returns how many nodes
    /// were deleted. Needs an identity allowed to delete them (the same
    /// digest user).
    ///
    /// Prefer [`Locker::force_release`](lockcore::Locker::force_release), the same on every
    /// backend (it returns whether something was deleted).
    ///
    /// Cancel safety: dropping the future may leave some nodes deleted and others not.
    ///
    /// # Errors
    /// `InvalidName`; `Unavailable`, `Auth` (NoAuth) or `Backend` from ZooKeeper.
    pub async fn force_release(&self, name: impl IntoLockName) -> Result<usize> {
        let parent = self.lock_path(name)?;
        let client = self.live_session(None).await?.client.clone();
        let children = match retry(|| client.list_children(&parent)).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(0),
            Err(e) => return Err(map_err("listing contenders", e)),
        };
        let queued = queue(&children, &parent, &HashSet::new());
        let roles: Vec<Role> = queued.iter().map(|(_, c)| contenders::role(c)).collect();
        let held = contenders::holders(&roles);
        let mut deleted = 0;
        for &(_, child) in &queued[..held] {
            let path = format!("{parent}/{child}");
            match retry(|| client.delete(&path, None)).await {
                Ok(()) => deleted += 1,
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map_err("deleting a contender node", e)),
            }
        }
        Ok(deleted)
    }

    /// The request of `Backend::round_trip`.
    pub(crate) async fn exists_root(&self) -> Result<()> {
        // `exists` on the root: the cheapest read that reaches the server.
        self.session()
            .client
            .check_stat("/")
            .await
            .map(drop)
            .map_err(|e| map_err("exists /", e))
    }

    /// The bare primitive of `Backend::bare_cycle`.
    pub(crate) async fn bare_create_delete(&self, name: &lockcore::LockName) -> Result<()> {
        let client = self.live_session(None).await?.client.clone();
        let parent = self.parent_path(name);
        let opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let prefix = format!("{parent}/_bare-");
        loop {
            match client.create(&prefix, &[], &opts).await {
                Ok((_, seq)) => {
                    let path = format!("{prefix}{seq}");
                    return client
                        .delete(&path, None)
                        .await
                        .map_err(|e| map_err("deleting the bare node", e));
                }
                Err(zk::Error::NoNode) => self.ensure_parent(&client, &parent).await?,
                Err(e) => return Err(map_err("creating the bare node", e)),
            }
        }
    }

    /// The `mntr` sum of `Backend::server_requests`.
    pub(crate) async fn packets_received(&self) -> Result<u64> {
        let mut total = 0;
        let mut last_err = None;
        let mut answered = false;
        for host in &self.inner.config.hosts {
            match four_letter(host, "mntr").await {
                Ok(text) => match mntr_value(&text, "zk_packets_received") {
                    Some(n) => {
                        total += n;
                        answered = true;
                    }
                    None => {
                        last_err = Some(Error::new(
                            lockcore::ErrorKind::Unsupported,
                            format!(
                                "{host}: mntr has no zk_packets_received (is mntr in 4lw.commands.whitelist?)"
                            ),
                        ))
                    }
                },
                Err(e) => last_err = Some(e),
            }
        }
        match (answered, last_err) {
            (true, _) => Ok(total),
            (false, Some(e)) => Err(e),
            (false, None) => Err(Error::new(
                lockcore::ErrorKind::Unavailable,
                "no ZooKeeper server answered mntr",
            )),
        }
    }

    /// The count of `Backend::queued_waiters`: the contenders that do not hold yet.
    pub(crate) async fn count_waiters(&self, name: &lockcore::LockName) -> Result<usize> {
        let client = self.live_session(None).await?.client.clone();
        let parent = self.parent_path(name);
        match retry(|| client.list_children(&parent)).await {
            Ok(children) => {
                let foreign = self.foreign();
                let roles: Vec<Role> = queue(&children, &parent, &foreign)
                    .iter()
                    .map(|(_, c)| contenders::role(c))
                    .collect();
                Ok(roles.len() - contenders::holders(&roles))
            }
            Err(zk::Error::NoNode) => Ok(0),
            Err(e) => Err(map_err(format!("listing {parent}"), e)),
        }
    }
}

/// Sends a four-letter command to `host` and returns the answer.
pub(crate) async fn four_letter(host: &str, command: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(host).await?;
        stream.write_all(command.as_bytes()).await?;
        let mut out = Vec::new();
        stream.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    match tokio::time::timeout(Duration::from_secs(5), io).await {
        Ok(Ok(out)) => Ok(String::from_utf8_lossy(&out).into_owned()),
        Ok(Err(e)) => Err(Error::unavailable(format!("{command} to {host}"), e)),
        Err(_) => Err(Error::new(
            lockcore::ErrorKind::Unavailable,
            format!("{command} to {host}: no answer within 5 s"),
        )),
    }
}

/// The value of `key` in `mntr` output (`key<TAB>value` lines).
pub(crate) fn mntr_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once('\t')?;
        (k.trim() == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mntr_parsing() {
        let text = "zk_version\t3.8.0\nzk_packets_received\t1234\nzk_packets_sent\t99\n";
        assert_eq!(mntr_value(text, "zk_packets_received"), Some(1234));
        assert_eq!(mntr_value(text, "zk_missing"), None);
    }
}
