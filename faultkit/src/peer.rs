//! Driving a peer lock client *process* (redis-py, the `mariadb` client, a sqlx program) line by
//! line, and checking that the critical sections of two clients never overlapped.
//!
//! The interop tests run the real peer as a process of its own: commands go to its stdin, its
//! answers come back as stdout lines. Lines are read in order; a line starting with `error`
//! fails the wait that reads it.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::util::{Error, Result};

/// A running peer process (killed on drop).
#[derive(Debug)]
pub struct PeerProcess {
    what: String,
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl PeerProcess {
    /// Starts `program` with `args` (and `env`), stdin and stdout piped, stderr inherited. Must
    /// be called inside a tokio runtime.
    ///
    /// # Errors
    /// When the program cannot be started (not installed): the message names it.
    pub fn spawn(program: &str, args: &[String], env: &[(&str, &str)]) -> Result<Self> {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| {
            Error::msg(format!(
                "cannot start the peer `{program}`: {e} (scripts/install-servers.sh installs it)"
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
            what: program.to_owned(),
            child,
            stdin,
            lines,
            seen: Vec::new(),
        })
    }

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
            .ok_or_else(|| Error::msg(format!("{}: stdin closed", self.what)))?;
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Closes the peer's stdin (end of its commands).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Reads lines until one starting with `prefix` and returns it, within `timeout`. Other
    /// lines are kept in [`PeerProcess::seen`].
    ///
    /// Cancel safe (lines not read stay queued).
    ///
    /// # Errors
    /// When the timeout passes, the peer exits, or a line starting with `error` comes first.
    pub async fn expect(&mut self, prefix: &str, timeout: Duration) -> Result<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let line = match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => line,
                Ok(None) => {
                    return Err(Error::msg(format!(
                        "{}: exited before printing `{prefix}` (printed: {:?})",
                        self.what, self.seen
                    )));
                }
                Err(_) => {
                    return Err(Error::msg(format!(
                        "{}: no `{prefix}` within {timeout:?} (printed: {:?})",
                        self.what, self.seen
                    )));
                }
            };
            self.seen.push(line.clone());
            if line.starts_with(prefix) {
                return Ok(line);
            }
            if line.starts_with("error") {
                return Err(Error::msg(format!("{}: {line}", self.what)));
            }
        }
    }

    /// Whether a line is waiting to be read now (without waiting for one).
    pub fn has_output(&self) -> bool {
        !self.lines.is_empty()
    }

    /// Every line read so far.
    pub fn seen(&self) -> &[String] {
        &self.seen
    }

    /// Waits for the peer to exit and returns whether it succeeded, within `timeout`.
    ///
    /// Cancel safe.
    ///
    /// # Errors
    /// When it does not exit in time.
    pub async fn wait(&mut self, timeout: Duration) -> Result<bool> {
        self.stdin.take();
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .map_err(|_| Error::msg(format!("{}: did not exit within {timeout:?}", self.what)))??;
        Ok(status.success())
    }
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

/// Checks that no two windows overlap (sorted by start, each starts at or after the previous
/// one's end) and that every side in `sides` has at least `min_each` windows.
///
/// # Errors
/// Naming the first overlapping pair, or the side that made too little progress.
pub fn check_windows(windows: &[Window], sides: &[&str], min_each: usize) -> Result<()> {
    let mut sorted = windows.to_vec();
    sorted.sort_by_key(|w| (w.start_us, w.end_us));
    for pair in sorted.windows(2) {
        if pair[1].start_us < pair[0].end_us {
            return Err(Error::msg(format!(
                "critical sections overlap: {:?} and {:?} ({} µs)",
                pair[0],
                pair[1],
                pair[0].end_us - pair[1].start_us
            )));
        }
    }
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

/// Microseconds since the Unix epoch from a peer's `seconds.fraction` text (`1764100000.123456`).
///
/// # Errors
/// When the text is not such a number.
pub fn unix_micros(text: &str) -> Result<u64> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| Error::msg(format!("not a Unix time: {text:?}")))?;
    Ok((secs * 1e6).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(side: &str, start_us: u64, end_us: u64) -> Window {
        Window {
            side: side.into(),
            start_us,
            end_us,
        }
    }

    #[test]
    fn overlap_and_progress_are_caught() {
        let ok = [w("a", 0, 10), w("b", 10, 20), w("a", 25, 30)];
        check_windows(&ok, &["a", "b"], 1).unwrap();
        assert!(check_windows(&ok, &["a", "b"], 2).is_err());
        let bad = [w("a", 0, 10), w("b", 9, 20)];
        assert!(check_windows(&bad, &["a", "b"], 1).is_err());
        assert_eq!(unix_micros("1.5").unwrap(), 1_500_000);
        assert!(unix_micros("x").is_err());
    }
}
