//! Another lock client as a real process, for the interop tests of the backends: a Curator,
//! kazoo or `etcdctl lock` on the same lock as locksmith. The peer speaks in lines on stdout:
//! `HELD <t>` once it holds, `RELEASED <t>` as it lets go, `WINDOW <start> <end>` for each
//! critical section of a contention loop and `DONE <count>` at the end, times in microseconds
//! of the system clock ([`now_us`], the clock the test reads too: one machine).
//!
//! A peer program that cannot be started fails the test (a panic naming the program and the
//! package that brings it): an interop test never skips.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Microseconds since the Unix epoch on the system clock.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

/// A critical section `[start, end]` in microseconds of [`now_us`].
pub type Window = (u64, u64);

/// A running peer process (killed when dropped).
pub struct Peer {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Peer {
    /// Starts `program args...` with piped stdin/stdout (stderr goes to the test's output).
    ///
    /// # Panics
    /// When the program cannot be started; `install` says what brings it (a Debian package).
    pub fn spawn(label: &str, program: &str, args: &[String], install: &str) -> Peer {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start the {label} peer ({program}): {e}; install {install} (scripts/install-servers.sh)")
            });
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        Peer {
            label: label.to_owned(),
            child,
            stdin,
            stdout,
        }
    }

    /// The next line of output, within `within`.
    ///
    /// # Panics
    /// When the peer ends, says nothing in time, or prints something else than `prefix ...`.
    pub async fn expect(&mut self, prefix: &str, within: Duration) -> Vec<String> {
        let line = self.line(prefix, within).await;
        let mut words = line.split_whitespace().map(str::to_owned);
        assert_eq!(
            words.next().as_deref(),
            Some(prefix),
            "the {} peer said {line:?}",
            self.label
        );
        words.collect()
    }

    /// The next line of output, within `within` (`what`: what the line should say, for the
    /// panic message).
    ///
    /// # Panics
    /// When the peer ends or says nothing in time.
    pub async fn line(&mut self, what: &str, within: Duration) -> String {
        match tokio::time::timeout(within, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => {
                let status = self.child.wait().await;
                panic!("the {} peer ended before {what}: {status:?}", self.label)
            }
            Ok(Err(e)) => panic!("reading the {} peer's output: {e}", self.label),
            Err(_) => panic!(
                "the {} peer said nothing within {within:?} (waiting for {what})",
                self.label
            ),
        }
    }

    /// Waits for `HELD <t>` and returns `t`.
    pub async fn held(&mut self, within: Duration) -> u64 {
        let words = self.expect("HELD", within).await;
        words[0].parse().expect("HELD <microseconds>")
    }

    /// Sends a line on stdin (a `hold` peer releases on it).
    pub async fn send_line(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(b"\n").await.expect("writing to the peer");
        stdin.flush().await.expect("writing to the peer");
    }

    /// Reads `WINDOW` lines up to `DONE`, and waits for the process to end successfully.
    pub async fn windows(&mut self, within: Duration) -> Vec<Window> {
        let end = tokio::time::Instant::now() + within;
        let mut out = Vec::new();
        loop {
            let left = end.saturating_duration_since(tokio::time::Instant::now());
            let line = match tokio::time::timeout(left, self.stdout.next_line()).await {
                Ok(Ok(Some(line))) => line,
                Ok(Ok(None)) => panic!("the {} peer ended without DONE", self.label),
                Ok(Err(e)) => panic!("reading the {} peer's output: {e}", self.label),
                Err(_) => panic!(
                    "the {} peer's loop did not end within {within:?}",
                    self.label
                ),
            };
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["WINDOW", s, e] => out.push((s.parse().unwrap(), e.parse().unwrap())),
                ["DONE", _] => break,
                _ => panic!("the {} peer said {line:?}", self.label),
            }
        }
        self.finish(end.saturating_duration_since(tokio::time::Instant::now()))
            .await;
        out
    }

    /// Waits for the process to end, and asserts that it succeeded.
    pub async fn finish(&mut self, within: Duration) {
        self.stdin = None;
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the {} peer did not exit within {within:?}", self.label))
            .expect("waiting for the peer");
        assert!(status.success(), "the {} peer failed: {status}", self.label);
    }

    /// The process id (to signal the peer).
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }
}

/// Asserts that no window of `ours` overlaps one of `theirs` (each side's windows are
/// disjoint by construction), and that both sides made progress.
///
/// # Panics
/// On an overlap (both windows are named) or an empty side.
pub fn assert_disjoint(peer: &str, ours: &[Window], theirs: &[Window]) {
    assert!(
        !ours.is_empty(),
        "locksmith never held the lock against {peer}"
    );
    assert!(
        !theirs.is_empty(),
        "{peer} never held the lock against locksmith"
    );
    let mut all: Vec<(Window, &str)> = ours
        .iter()
        .map(|w| (*w, "locksmith"))
        .chain(theirs.iter().map(|w| (*w, peer)))
        .collect();
    all.sort_unstable();
    for pair in all.windows(2) {
        let ((a, who_a), (b, who_b)) = (pair[0], pair[1]);
        assert!(
            a.1 < b.0,
            "two holders: {who_a} held {a:?} and {who_b} held {b:?} (microseconds)"
        );
    }
}
