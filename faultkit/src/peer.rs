//! Another lock client as a real process, for the interop tests of the backends (Curator,
//! go-zookeeper, kazoo, `etcdctl lock`, redis-py, the `mariadb` client, a sqlx program), and
//! the check that its critical sections and locksmith's never overlapped.
//!
//! The peer takes commands on its stdin and answers in lines on its stdout, read in order; a
//! line starting with `error` fails the wait that reads it. Its times are on the system clock
//! ([`now_unix_micros`](crate::now_unix_micros), the clock the test reads too: one machine),
//! written as whole microseconds or as Unix seconds with a fraction ([`unix_micros`]). A
//! contention loop reports each critical section as `window <start> <end>` and ends with
//! `done <count>` (either case).
//!
//! A peer program that cannot be started is an error naming it and the Debian package that
//! brings it: an interop test fails on it, it never skips.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::util::{Error, Result};

/// How to start a peer: [`PeerCommand::new`], then [`PeerCommand::spawn`].
#[derive(Clone, Debug)]
pub struct PeerCommand {
    label: String,
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    package: Option<String>,
}

impl PeerCommand {
    /// The peer called `label` in messages (`Curator`, `redis-py`), run as `program`.
    pub fn new(label: &str, program: &str) -> Self {
        PeerCommand {
            label: label.to_owned(),
            program: program.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            package: None,
        }
    }

    /// Adds arguments.
    pub fn args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for the peer.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The Debian package that brings `program` (`scripts/install-servers.sh` installs it),
    /// named when it cannot be started. Every program from the system should say it.
    pub fn package(mut self, package: &str) -> Self {
        self.package = Some(package.to_owned());
        self
    }

    /// Starts the peer, stdin and stdout piped, stderr inherited (it shows in the test's
    /// output). Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// When the program cannot be started: the message names it and its package.
    pub fn spawn(self) -> Result<PeerProcess> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            let install = match &self.package {
                Some(package) => {
                    format!("; install the Debian package {package} (scripts/install-servers.sh)")
                }
                None => String::new(),
            };
            Error::msg(format!(
                "cannot start the {} peer ({}): {e}{install}",
                self.label, self.program
            ))
        })?;
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut out = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = out.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(PeerProcess {
            label: self.label,
            child,
            stdin,
            lines,
            seen: Vec::new(),
        })
    }
}

/// A running peer process (killed on drop).
#[derive(Debug)]
pub struct PeerProcess {
    label: String,
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl PeerProcess {
    /// Writes `line` and a newline to the peer's stdin.
    ///
    /// Cancel safety: a dropped call may have written part of the line.
    ///
    /// # Errors
    /// When the peer closed its stdin (it exited).
    pub async fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| Error::msg(format!("the {} peer: stdin closed", self.label)))?;
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Reads lines until one starting with `prefix` and returns it, within `timeout`. Every
    /// line read is kept in [`PeerProcess::seen`].
    ///
    /// Cancel safe (lines not read stay queued).
    ///
    /// # Errors
    /// When the timeout passes, the peer exits, or a line starting with `error` comes first.
    pub async fn expect(&mut self, prefix: &str, timeout: Duration) -> Result<String> {
        self.read_until(prefix, timeout, |line| line.starts_with(prefix))
            .await
    }

    /// Reads a contention loop's report up to its `done <count>` line, within `timeout`, and
    /// returns the critical sections of side `side` from the `window <start> <end>` lines.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// As [`PeerProcess::expect`]; when a time does not parse, or the count is not the number
    /// of windows (a critical section went unreported).
    pub async fn loop_windows(&mut self, side: &str, timeout: Duration) -> Result<Vec<Window>> {
        let done = self
            .read_until("done", timeout, |line| first_word_is(line, "done"))
            .await?;
        let windows = self.windows(side, 1, 2)?;
        let count = done.split_whitespace().nth(1);
        if count != Some(windows.len().to_string().as_str()) {
            return Err(Error::msg(format!(
                "the {} peer said {done:?} after {} windows",
                self.label,
                windows.len()
            )));
        }
        Ok(windows)
    }

    /// The critical sections of side `side` in the lines read so far whose first word is
    /// `window` (either case), with the start and end times in fields `start` and `end` (0 is
    /// the first word).
    ///
    /// # Errors
    /// When a time does not parse.
    pub fn windows(&self, side: &str, start: usize, end: usize) -> Result<Vec<Window>> {
        self.seen
            .iter()
            .filter(|line| first_word_is(line, "window"))
            .map(|line| {
                Ok(Window {
                    side: side.to_owned(),
                    start_us: unix_micros_at(line, start)?,
                    end_us: unix_micros_at(line, end)?,
                })
            })
            .collect()
    }

    /// Whether a line is waiting to be read now (without waiting for one).
    pub fn has_output(&self) -> bool {
        !self.lines.is_empty()
    }

    /// Every line read so far.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// The process id (to signal the peer), while it runs.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Closes the peer's stdin and waits for it to exit, within `timeout`.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// When it does not exit in time, or exits with a failure.
    pub async fn wait(&mut self, timeout: Duration) -> Result<()> {
        self.stdin.take();
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .map_err(|_| {
                Error::msg(format!(
                    "the {} peer did not exit within {timeout:?}",
                    self.label
                ))
            })??;
        if !status.success() {
            return Err(Error::msg(format!(
                "the {} peer failed: {status}",
                self.label
            )));
        }
        Ok(())
    }

    /// Reads lines (kept in `seen`) until `wanted` says yes, within `timeout`; `what` names the
    /// line for the error.
    async fn read_until(
        &mut self,
        what: &str,
        timeout: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let line = match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => line,
                Ok(None) => {
                    // Its stdout is closed: it has exited, or soon will.
                    let status = tokio::time::timeout_at(deadline, self.child.wait()).await;
                    return Err(Error::msg(format!(
                        "the {} peer exited ({status:?}) before printing `{what}` (printed: {:?})",
                        self.label, self.seen
                    )));
                }
                Err(_) => {
                    return Err(Error::msg(format!(
                        "the {} peer printed no `{what}` within {timeout:?} (printed: {:?})",
                        self.label, self.seen
                    )));
                }
            };
            self.seen.push(line.clone());
            if wanted(&line) {
                return Ok(line);
            }
            if line.starts_with("error") {
                return Err(Error::msg(format!("the {} peer: {line}", self.label)));
            }
        }
    }
}

fn first_word_is(line: &str, word: &str) -> bool {
    line.split_whitespace()
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case(word))
}

/// One critical section: who held the lock, from when to when (microseconds since the Unix
/// epoch, taken after the acquisition returned and before the release was sent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// The client that held it.
    pub side: String,
    /// Taken after the acquisition returned.
    pub start_us: u64,
    /// Taken before the release was sent.
    pub end_us: u64,
}

impl Window {
    /// A critical section of `side`.
    pub fn new(side: &str, start_us: u64, end_us: u64) -> Self {
        Window {
            side: side.to_owned(),
            start_us,
            end_us,
        }
    }
}

/// Checks that no two windows overlap and that every side in `sides` made progress: at least
/// `min_each` windows (and at least one). Sorted by start, each window must start strictly
/// after the previous one ended: the times are taken inside the hold, so even equal times mean
/// the second acquisition returned before the first release was sent.
///
/// # Errors
/// Naming the first overlapping pair, a window ending before it starts, a window of a side not
/// in `sides`, or the side that made too little progress.
pub fn check_windows(windows: &[Window], sides: &[&str], min_each: usize) -> Result<()> {
    if let Some(w) = windows.iter().find(|w| w.end_us < w.start_us) {
        return Err(Error::msg(format!(
            "a window that ends before it starts: {w:?}"
        )));
    }
    if let Some(w) = windows.iter().find(|w| !sides.contains(&w.side.as_str())) {
        return Err(Error::msg(format!("a window of an unknown side: {w:?}")));
    }
    let mut sorted = windows.to_vec();
    sorted.sort_by_key(|w| (w.start_us, w.end_us));
    for pair in sorted.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.start_us <= a.end_us {
            return Err(Error::msg(format!(
                "two holders: {a:?} and {b:?} (the second started {} µs before the first ended)",
                a.end_us - b.start_us
            )));
        }
    }
    let min_each = min_each.max(1);
    for side in sides {
        let n = windows.iter().filter(|w| w.side == *side).count();
        if n < min_each {
            return Err(Error::msg(format!(
                "`{side}` held the lock {n} times, fewer than {min_each}"
            )));
        }
    }
    Ok(())
}

/// Microseconds since the Unix epoch from a peer's time: whole microseconds
/// (`1764100000123456`, as the ZooKeeper and etcd peers write) or Unix seconds with a fraction
/// of at most six digits (`1764100000.123456`, as redis-py, MariaDB's `SYSDATE(6)` and the sqlx
/// peer write). Read exactly, not through a float.
///
/// # Errors
/// When the text is neither.
pub fn unix_micros(text: &str) -> Result<u64> {
    let bad = || Error::msg(format!("not a Unix time: {text:?}"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let trimmed = text.trim();
    match trimmed.split_once('.') {
        None if digits(trimmed) => trimmed.parse().map_err(|_| bad()),
        Some((secs, frac)) if digits(secs) && digits(frac) && frac.len() <= 6 => {
            let secs: u64 = secs.parse().map_err(|_| bad())?;
            let frac: u64 = format!("{frac:0<6}").parse().map_err(|_| bad())?;
            secs.checked_mul(1_000_000)
                .and_then(|us| us.checked_add(frac))
                .ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

/// The time in field `field` of a peer's line (0 is the first word), as [`unix_micros`].
///
/// # Errors
/// When the line has no such field, or it is not a time.
pub fn unix_micros_at(line: &str, field: usize) -> Result<u64> {
    let text = line
        .split_whitespace()
        .nth(field)
        .ok_or_else(|| Error::msg(format!("no field {field} in {line:?}")))?;
    unix_micros(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_and_progress_are_caught() {
        let w = Window::new;
        let ok = [w("a", 0, 10), w("b", 11, 20), w("a", 25, 30)];
        check_windows(&ok, &["a", "b"], 1).unwrap();
        check_windows(&ok, &["a", "b"], 0).unwrap();
        assert!(check_windows(&ok, &["a", "b"], 2).is_err());
        assert!(
            check_windows(&ok, &["a", "b", "c"], 0).is_err(),
            "no progress"
        );
        assert!(check_windows(&ok, &["a"], 1).is_err(), "unknown side");
        let touching = [w("a", 0, 10), w("b", 10, 20)];
        assert!(check_windows(&touching, &["a", "b"], 1).is_err());
        let bad = [w("a", 0, 10), w("b", 9, 20)];
        assert!(check_windows(&bad, &["a", "b"], 1).is_err());
        assert!(check_windows(&[w("a", 5, 4), w("b", 6, 7)], &["a", "b"], 1).is_err());
    }

    #[test]
    fn peer_times_parse_exactly() {
        assert_eq!(unix_micros("1.5").unwrap(), 1_500_000);
        assert_eq!(
            unix_micros("1764100000.123457").unwrap(),
            1_764_100_000_123_457
        );
        assert_eq!(
            unix_micros("1764100000123457").unwrap(),
            1_764_100_000_123_457
        );
        for bad in ["x", "", "1.", ".5", "1.1234567", "-1", "1e6", "1.-5"] {
            assert!(unix_micros(bad).is_err(), "{bad:?}");
        }
        assert_eq!(unix_micros_at("window\t1\t2.5\t0", 2).unwrap(), 2_500_000);
        assert!(unix_micros_at("window 1", 2).is_err());
    }
}
