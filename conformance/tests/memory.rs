//! Every scenario against the in-memory reference backend: the suite is first proven here.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{Harness, ReplyLoser, RequestCount, Target, run_tests};
use lockcore::memory::MemoryBackend;
use lockcore::{Locker, Result};

struct MemoryHarness {
    store: String,
}

#[async_trait]
impl Harness for MemoryHarness {
    fn label(&self) -> String {
        "memory".into()
    }

    async fn client(&self) -> Result<Locker> {
        Ok(Locker::new(MemoryBackend::connect(&self.store)))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    fn can_open_other_namespace(&self) -> bool {
        true
    }

    /// Another store of this process.
    async fn client_in_other_namespace(&self) -> Result<Locker> {
        Ok(Locker::new(MemoryBackend::connect(&format!(
            "{}-other",
            self.store
        ))))
    }

    fn can_delay_replies(&self) -> bool {
        true
    }

    async fn client_with_reply_delay(&self, delay: Duration) -> Result<Locker> {
        Ok(Locker::new(
            MemoryBackend::connect(&self.store).with_reply_delay(delay),
        ))
    }

    fn can_count_requests(&self) -> bool {
        true
    }

    async fn client_counting_requests(&self) -> Result<(Locker, RequestCount)> {
        let b = MemoryBackend::connect(&self.store);
        let counted = b.clone();
        Ok((
            Locker::new(b),
            RequestCount::new(move || counted.requests()),
        ))
    }

    fn can_lose_replies(&self) -> bool {
        true
    }

    async fn client_losing_replies(&self) -> Result<(Locker, Arc<dyn ReplyLoser>)> {
        let b = MemoryBackend::connect(&self.store);
        Ok((Locker::new(b.clone()), Arc::new(MemoryLosingReplies(b))))
    }
}

/// Loses a memory client's replies in-process.
struct MemoryLosingReplies(MemoryBackend);

impl ReplyLoser for MemoryLosingReplies {
    fn lose_next_reply(&self, pattern: &[u8]) {
        self.0.lose_next_reply_about(pattern);
    }

    fn disarm(&self) -> u64 {
        self.0.disarm_reply_loss()
    }
}

fn main() -> std::process::ExitCode {
    // The memory backend needs no server: its URL names a store of this process.
    run_tests(vec![Target::fixed(
        "memory",
        "memory://conformance",
        |url| {
            let store = url.trim_start_matches("memory://").to_string();
            Arc::new(MemoryHarness { store })
        },
    )])
}
