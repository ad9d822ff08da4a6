//! The members listed in the URL: probed by TCP connect, so that the client's channel only
//! balances over those that answer, and kept current while the backend lives.

use std::time::Duration;

use crate::backend::Inner;

/// How often the members listed in the URL are probed (TCP connect), so that the client's
/// channel only balances over those that answer.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long a member has to accept a TCP connection to count as up.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// TCP-connects to every host at once; true for those that accept within `timeout`.
pub(crate) async fn probe(hosts: &[String], timeout: Duration) -> Vec<bool> {
    let mut set = tokio::task::JoinSet::new();
    for (i, host) in hosts.iter().enumerate() {
        let host = host.clone();
        set.spawn(async move {
            let ok = matches!(
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(host)).await,
                Ok(Ok(_))
            );
            (i, ok)
        });
    }
    let mut up = vec![false; hosts.len()];
    while let Some(joined) = set.join_next().await {
        if let Ok((i, ok)) = joined {
            up[i] = ok;
        }
    }
    up
}

/// Keeps the client's endpoints to the listed members that accept connections (never fewer
/// than one), until the backend is gone.
pub(crate) async fn track_members(
    inner: std::sync::Weak<Inner>,
    endpoints: Vec<String>,
    mut current: Vec<String>,
) {
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let client = strong.client.clone();
        let hosts = strong.config.hosts.clone();
        drop(strong);
        let up = probe(&hosts, PROBE_TIMEOUT).await;
        for (endpoint, up) in endpoints.iter().zip(up) {
            let listed = current.contains(endpoint);
            if up && !listed && client.add_endpoint(endpoint).await.is_ok() {
                tracing::debug!(%endpoint, "etcd member answers again");
                current.push(endpoint.clone());
            } else if !up
                && listed
                && current.len() > 1
                && client.remove_endpoint(endpoint).await.is_ok()
            {
                tracing::debug!(%endpoint, "etcd member does not answer; not used");
                current.retain(|e| e != endpoint);
            }
        }
    }
}
