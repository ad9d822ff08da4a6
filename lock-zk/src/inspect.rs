//! `inspect`: the contenders of a lock in one listing, then every holder's data and stat (the
//! head alone for a writer; every reader before the first writer; the first `limit` permits).
//!
//! The holder's metadata is its node's data ([`Holder::encode`], written by the create that
//! enqueues it: no extra request); when it was acquired is the node's creation time on the
//! server's clock (`ctime`), the fencing token its creation zxid, the waiters the contenders
//! that do not hold yet. A ZooKeeper lock has no TTL of its own (it lives with the holder's session).

use std::time::{Duration, UNIX_EPOCH};

use lockcore::{Holder, LockInfo, LockName, Result, Share};
use zookeeper_client as zk;

use crate::backend::{ZkBackend, queue};
use crate::contenders::{self, Role};
use crate::errors::{RETRY_PAUSE, is_retryable, map_err, retry};

impl ZkBackend {
    /// See [`Backend::inspect`](lockcore::backend::Backend::inspect): a listing, and a read of
    /// every holder's node, sent together (again if one left between the listing and the
    /// reads).
    pub(crate) async fn inspect_lock(&self, name: &LockName) -> Result<LockInfo> {
        let client = self.live_session(None).await?.client.clone();
        let parent = self.parent_path(name);
        'list: loop {
            let children = match retry(|| client.list_children(&parent)).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => return Ok(LockInfo::free(name.clone(), Some(0))),
                Err(e) => return Err(map_err(format!("listing {parent}"), e)),
            };
            let contenders = {
                let foreign = self.foreign();
                queue(&children, &parent, &foreign)
                    .into_iter()
                    .map(|(_, c)| c.to_owned())
                    .collect::<Vec<_>>()
            };
            let roles: Vec<Role> = contenders.iter().map(|c| contenders::role(c)).collect();
            let held = contenders::holders(&roles);
            let Some(&head) = roles.first() else {
                return Ok(LockInfo::free(name.clone(), Some(0)));
            };
            let paths: Vec<String> = contenders[..held]
                .iter()
                .map(|c| format!("{parent}/{c}"))
                .collect();
            let reads = futures::future::join_all(paths.iter().map(|p| client.get_data(p))).await;
            let mut shares = Vec::with_capacity(held);
            for (read, path) in reads.into_iter().zip(&paths) {
                let (data, stat) = match read {
                    Ok(d) => d,
                    // A holder left between the listing and the read: look again.
                    Err(zk::Error::NoNode) => continue 'list,
                    Err(e) if is_retryable(&e) => {
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue 'list;
                    }
                    Err(e) => return Err(map_err(format!("reading {path}"), e)),
                };
                let holder = std::str::from_utf8(&data)
                    .ok()
                    .and_then(Holder::decode)
                    .map(|h| {
                        let ctime = u64::try_from(stat.ctime).unwrap_or(0);
                        h.at_server_time(UNIX_EPOCH + Duration::from_millis(ctime))
                    });
                // No TTL of its own: the node lives with its holder's session.
                shares.push(Share::new(u64::try_from(stat.czxid).ok(), None, holder));
            }
            let info = LockInfo::held(name.clone())
                .with_waiters(Some(contenders.len() - held))
                .with_mode(Some(head.mode()));
            return Ok(match head {
                Role::Writer => {
                    let first = shares.swap_remove(0);
                    info.with_fencing_token(first.fencing_token)
                        .with_holder(first.holder)
                }
                Role::Reader | Role::Permit(_) => info.with_shares(shares),
            });
        }
    }
}
