//! The Locker's spans and metrics (lockcore::telemetry), captured by a tracing subscriber and a
//! `metrics` DebuggingRecorder around one scenario on the memory backend: acquire (acquired,
//! busy, timeout), wait with a hand-over, renewals (manual and automatic), a lost lease, release.
//! One test in its own binary: the recorder is process-global.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::memory::MemoryBackend;
use lockcore::{AutoRenew, ErrorKind, LockOptions, Locker, LostReason};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A span's name and fields.
type SpanFields = (String, BTreeMap<String, String>);

/// Every span opened: its name and fields (as text), by id.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<BTreeMap<u64, SpanFields>>>,
    events: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
    next: Arc<AtomicU64>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.spans
            .lock()
            .unwrap()
            .insert(id, (attrs.metadata().name().to_owned(), fields));
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some((_, fields)) = self.spans.lock().unwrap().get_mut(&span.into_u64()) {
            values.record(&mut Fields(fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        fields.insert("level".into(), event.metadata().level().to_string());
        self.events.lock().unwrap().push(fields);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Capture {
    /// The fields of every span named `name`.
    fn named(&self, name: &str) -> Vec<BTreeMap<String, String>> {
        self.spans
            .lock()
            .unwrap()
            .values()
            .filter(|(n, _)| n == name)
            .map(|(_, f)| f.clone())
            .collect()
    }

    fn has(&self, name: &str, want: &[(&str, &str)]) -> bool {
        self.named(name).iter().any(|f| {
            want.iter()
                .all(|(k, v)| f.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn spans_and_metrics_cover_acquire_wait_renew_lost_and_release() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let capture = Capture::default();
    let _subscriber = tracing::subscriber::set_default(capture.clone());

    // Handles are registered here: after the recorder.
    let locker = Locker::new(MemoryBackend::connect("telemetry"));
    let opts = LockOptions::new().ttl(Duration::from_secs(10));

    // try_lock: acquired, then busy.
    let first = locker.try_lock("a", &opts).await.unwrap().unwrap();
    assert!(locker.try_lock("a", &opts).await.unwrap().is_none());
    // A manual extend: a renewal.
    first.extend(Duration::from_secs(20)).await.unwrap();

    // lock() waits; the holder releases after 50 ms: a hand-over.
    let waiter = {
        let locker = locker.clone();
        let opts = opts.clone();
        tokio::spawn(async move { locker.lock("a", &opts).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();

    // lock() with a deadline while held: timeout.
    let err = locker
        .lock("a", &opts.clone().wait_timeout(Duration::from_millis(20)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    drop(second);

    // Auto-renewal up to a maximum hold time, then the lease is lost (max hold reached).
    let renewing = LockOptions::new()
        .ttl(Duration::from_millis(200))
        .auto_renew(AutoRenew::until(Duration::from_millis(500)));
    let held = locker.lock("b", &renewing).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), held.lost().lost())
        .await
        .expect("the lease ends at its maximum hold time");
    assert_eq!(reason, LostReason::MaxHoldReached);
    drop(held);
    tokio::time::timeout(Duration::from_secs(5), locker.flush())
        .await
        .unwrap();

    // Spans.
    for (mode, outcome) in [
        ("try", "acquired"),
        ("try", "busy"),
        ("wait", "acquired"),
        ("wait", "timeout"),
    ] {
        assert!(
            capture.has(
                "lock.acquire",
                &[
                    ("lock", "a"),
                    ("backend", "memory"),
                    ("mode", mode),
                    ("outcome", outcome)
                ]
            ),
            "lock.acquire {mode} {outcome}: {:?}",
            capture.named("lock.acquire")
        );
    }
    assert!(
        capture
            .named("lock.acquire")
            .iter()
            .any(|f| f.get("mode").map(String::as_str) == Some("wait")
                && f.get("outcome").map(String::as_str) == Some("acquired")
                && f["waited_ms"].parse::<u64>().unwrap() >= 50),
        "the hand-over's span says how long it waited"
    );
    assert!(capture.has("lock.wait", &[("lock", "a"), ("backend", "memory")]));
    assert!(capture.has(
        "lock.renew",
        &[("lock", "a"), ("auto", "false"), ("outcome", "renewed")]
    ));
    assert!(capture.has(
        "lock.renew",
        &[("lock", "b"), ("auto", "true"), ("outcome", "renewed")]
    ));
    assert!(capture.has("lock.release", &[("lock", "a"), ("outcome", "released")]));
    assert!(capture.has(
        "lock.lost",
        &[
            ("lock", "b"),
            ("backend", "memory"),
            ("reason", "max_hold_reached")
        ]
    ));
    assert_eq!(
        capture.named("lock.lost").len(),
        1,
        "a loss is reported once"
    );
    assert!(
        capture
            .events
            .lock()
            .unwrap()
            .iter()
            .any(
                |e| e.get("message").map(String::as_str) == Some("lease lost")
                    && e["level"] == "WARN"
            ),
        "the loss is a WARN event"
    );

    // Metrics.
    let mut metrics = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_, key) = key.into_parts();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        metrics.insert(format!("{} {}", key.name(), labels.join(",")), value);
    }
    let count = |name: &str| match metrics.get(name) {
        Some(DebugValue::Histogram(v)) => v.len() as u64,
        Some(DebugValue::Counter(n)) => *n,
        other => panic!(
            "{name}: {other:?} in {:?}",
            metrics.keys().collect::<Vec<_>>()
        ),
    };
    assert_eq!(
        count("locksmith_acquire_seconds backend=memory,mode=try,outcome=acquired"),
        1
    );
    assert_eq!(
        count("locksmith_acquire_seconds backend=memory,mode=try,outcome=busy"),
        1
    );
    assert_eq!(
        count("locksmith_acquire_seconds backend=memory,mode=wait,outcome=acquired"),
        2
    );
    assert_eq!(
        count("locksmith_acquire_seconds backend=memory,mode=wait,outcome=timeout"),
        1
    );
    assert_eq!(count("locksmith_wait_seconds backend=memory"), 2);
    assert_eq!(
        count("locksmith_handovers_total backend=memory"),
        1,
        "only the waiter for a holder"
    );
    assert!(count("locksmith_renewals_total backend=memory,outcome=renewed") >= 2);
    assert_eq!(
        count("locksmith_lost_total backend=memory,reason=max_hold_reached"),
        1
    );
    match metrics.get("locksmith_leases_held backend=memory") {
        Some(DebugValue::Gauge(g)) => assert_eq!(g.into_inner(), 0.0, "every guard is gone"),
        other => panic!("leases_held: {other:?}"),
    }
}
