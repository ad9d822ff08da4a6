//! A fencing-checked resource: what a storage service that honours fencing tokens does.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::util::Result;

/// What a [`FencedResource`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FenceStats {
    /// Writes accepted.
    pub accepted: u64,
    /// Writes rejected (their token was below the highest seen).
    pub rejected: u64,
    /// Writes from a writer that was not the current holder, rejected: fencing at work.
    pub stale_rejected: u64,
    /// Writes from a writer that was not the current holder, accepted: a safety violation of the
    /// resource (possible with no token, or with tokens that repeat or go backwards).
    pub stale_accepted: u64,
    /// Writes that carried no token (the resource cannot check them; it accepts them).
    pub unfenced: u64,
    /// The highest token seen.
    pub highest: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    holder: Option<String>,
    stats: FenceStats,
}

/// Accepts a write only when its fencing token is at least the highest it has seen (writes
/// without a token are accepted: the resource cannot check them, and counts them as unfenced).
/// The test tells it who holds the lock now ([`FencedResource::set_holder`]); writes by anyone
/// else are *stale*, counted as rejected or accepted.
///
/// Holder processes reach it over TCP ([`FencedResource::serve`]): one line
/// `WRITE <writer> <token or ->` answered by `OK` or `STALE`.
#[derive(Clone, Debug, Default)]
pub struct FencedResource {
    state: Arc<Mutex<State>>,
}

impl FencedResource {
    /// An empty resource.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names the writer that holds the lock now (after the test saw it acquire).
    pub fn set_holder(&self, writer: &str) {
        self.lock().holder = Some(writer.to_string());
    }

    /// A write by `writer` carrying `token`; whether it was accepted.
    pub fn write(&self, writer: &str, token: Option<u64>) -> bool {
        let mut s = self.lock();
        let stale = s.holder.as_deref().is_some_and(|h| h != writer);
        let ok = match (token, s.stats.highest) {
            (None, _) => {
                s.stats.unfenced += 1;
                true
            }
            (Some(t), Some(h)) if t < h => false,
            (Some(t), _) => {
                s.stats.highest = Some(t);
                true
            }
        };
        if ok {
            s.stats.accepted += 1;
        } else {
            s.stats.rejected += 1;
        }
        match (stale, ok) {
            (true, true) => s.stats.stale_accepted += 1,
            (true, false) => s.stats.stale_rejected += 1,
            _ => {}
        }
        ok
    }

    /// The counts so far.
    pub fn stats(&self) -> FenceStats {
        self.lock().stats
    }

    /// Serves the resource on a free port of 127.0.0.1 (one line per write, see the type's
    /// docs); the task stops when the handle is aborted or dropped with its runtime.
    ///
    /// Cancel safe.
    pub async fn serve(&self) -> Result<(SocketAddr, JoinHandle<()>)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let me = self.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((sock, _)) = listener.accept().await {
                let me = me.clone();
                conns.spawn(async move {
                    let (r, mut w) = sock.into_split();
                    let mut lines = BufReader::new(r).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let mut it = line.split_whitespace();
                        let answer = match (it.next(), it.next(), it.next()) {
                            (Some("WRITE"), Some(writer), Some(token)) => {
                                if me.write(writer, token.parse().ok()) {
                                    "OK\n"
                                } else {
                                    "STALE\n"
                                }
                            }
                            _ => "ERR\n",
                        };
                        if w.write_all(answer.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok((addr, task))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_equal_or_higher_tokens_and_counts_stale_writes() {
        let r = FencedResource::new();
        r.set_holder("a");
        assert!(r.write("a", Some(5)));
        r.set_holder("b");
        assert!(r.write("b", Some(6)));
        assert!(!r.write("a", Some(5)), "a stale token is rejected");
        assert!(
            r.write("b", Some(6)),
            "the holder writes again with its token"
        );
        assert!(r.write("a", None), "no token: cannot check");
        let s = r.stats();
        assert_eq!(
            (
                s.accepted,
                s.rejected,
                s.stale_rejected,
                s.stale_accepted,
                s.unfenced
            ),
            (4, 1, 1, 1, 1)
        );
        assert_eq!(s.highest, Some(6));
    }
}
