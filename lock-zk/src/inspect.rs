//! `inspect`: the contenders of a lock in one listing, then the head's data and stat.
//!
//! The holder's metadata is its node's data ([`Holder::encode`], written by the create that
//! enqueues it: no extra request); when it was acquired is the node's creation time on the
//! server's clock (`ctime`), the fencing token its creation zxid, the waiters the contenders
//! behind it. A ZooKeeper lock has no TTL of its own (it lives with the holder's session).

use std::time::{Duration, UNIX_EPOCH};

use lockcore::{Holder, LockInfo, LockName, Result};
use zookeeper_client as zk;

use crate::backend::{ZkBackend, queue};
use crate::errors::{map_err, retry};

impl ZkBackend {
    /// See [`Backend::inspect`](lockcore::backend::Backend::inspect): a listing, and a read of
    /// the head contender's node (again if that node left between the two).
    pub(crate) async fn inspect_lock(&self, name: &LockName) -> Result<LockInfo> {
        let client = self.live_session(None).await?.client.clone();
        let parent = self.parent_path(name);
        loop {
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
            let Some(head) = contenders.first() else {
                return Ok(LockInfo::free(name.clone(), Some(0)));
            };
            let path = format!("{parent}/{head}");
            let (data, stat) = match retry(|| client.get_data(&path)).await {
                Ok(d) => d,
                // The holder left between the listing and the read: look again.
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map_err(format!("reading {path}"), e)),
            };
            let holder = std::str::from_utf8(&data)
                .ok()
                .and_then(Holder::decode)
                .map(|h| {
                    let ctime = u64::try_from(stat.ctime).unwrap_or(0);
                    h.at_server_time(UNIX_EPOCH + Duration::from_millis(ctime))
                });
            return Ok(LockInfo::held(name.clone())
                .with_fencing_token(u64::try_from(stat.czxid).ok())
                .with_holder(holder)
                .with_waiters(Some(contenders.len() - 1)));
        }
    }
}
