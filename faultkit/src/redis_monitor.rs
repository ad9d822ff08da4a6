//! `MONITOR` on one Redis server: every command it runs, with its arguments, as a test reads
//! them (who sent which script with which token), where `INFO commandstats` only counts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::util::{Error, Result};

/// A `redis-cli MONITOR` running against one server, collecting the commands it prints.
/// Killed on drop.
#[derive(Debug)]
pub struct RedisMonitor {
    port: u16,
    commands: Arc<Mutex<Vec<Vec<String>>>>,
    _child: tokio::process::Child,
    reader: tokio::task::JoinHandle<()>,
}

impl RedisMonitor {
    /// Starts `MONITOR` on `127.0.0.1:port` and returns once the server confirmed it: every
    /// command the server runs from then on is collected.
    ///
    /// Cancel safety: a dropped start kills `redis-cli`.
    pub async fn start(port: u16, timeout: Duration) -> Result<Self> {
        let mut child = tokio::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "MONITOR"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::msg(format!("redis-cli MONITOR: {e}")))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::msg("redis-cli MONITOR: no stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(timeout, lines.next_line())
            .await
            .map_err(|_| Error::msg(format!("redis-cli MONITOR: no OK in {timeout:?}")))?
            .map_err(|e| Error::msg(format!("redis-cli MONITOR: {e}")))?;
        if first.as_deref() != Some("OK") {
            return Err(Error::msg(format!(
                "redis-cli MONITOR answered {first:?}, not OK"
            )));
        }
        let commands: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
        let sink = commands.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(args) = parse_line(&line) {
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push(args);
                }
            }
        });
        Ok(RedisMonitor {
            port,
            commands,
            _child: child,
            reader,
        })
    }

    /// How many commands were collected so far.
    pub fn len(&self) -> usize {
        self.commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Whether nothing was collected yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The commands collected from the `from`-th on, each as its arguments (the command name
    /// lowercased, as the server prints it).
    pub fn commands_from(&self, from: usize) -> Vec<Vec<String>> {
        let all = self.commands.lock().unwrap_or_else(|e| e.into_inner());
        all.get(from..).unwrap_or_default().to_vec()
    }

    /// Sends a marker command to the server and waits until this monitor has printed it: every
    /// command the server ran before is collected by then. Returns how many were collected
    /// before the marker.
    ///
    /// Cancel safe.
    pub async fn sync(&self, timeout: Duration) -> Result<usize> {
        let marker = format!("faultkit-monitor-sync-{:016x}", fastrand::u64(..));
        crate::redis::cli(self.port, &["ECHO", &marker], timeout).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            {
                let all = self.commands.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(i) = all.iter().rposition(|c| {
                    c.first().is_some_and(|n| n == "echo") && c.get(1) == Some(&marker)
                }) {
                    return Ok(i);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::msg(format!(
                    "MONITOR on port {} did not print the marker in {timeout:?}",
                    self.port
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for RedisMonitor {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The arguments of one `MONITOR` line (`1700000000.000000 [0 127.0.0.1:5000] "SET" "k" "v"`),
/// unescaped; `None` for a line that is not a command.
fn parse_line(line: &str) -> Option<Vec<String>> {
    let rest = &line[line.find("] ")? + 2..];
    let mut args = Vec::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => arg.push('\n'),
                    'r' => arg.push('\r'),
                    't' => arg.push('\t'),
                    'x' => {
                        let hex: String = chars.by_ref().take(2).collect();
                        arg.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
                    }
                    other => arg.push(other),
                },
                other => arg.push(other),
            }
        }
        args.push(arg);
    }
    if let Some(name) = args.first_mut() {
        *name = name.to_ascii_lowercase();
    }
    (!args.is_empty()).then_some(args)
}

#[cfg(test)]
mod tests {
    use super::parse_line;

    #[test]
    fn a_monitor_line_is_split_into_unescaped_arguments() {
        let line =
            r#"1764130000.123456 [0 127.0.0.1:50000] "EVALSHA" "ab12" "2" "k\"1" "a\\b" "\x01z""#;
        assert_eq!(
            parse_line(line).expect("a command"),
            ["evalsha", "ab12", "2", "k\"1", "a\\b", "\u{1}z"]
        );
        assert_eq!(parse_line("OK"), None);
    }
}
