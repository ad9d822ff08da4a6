//! What a client asks a server about itself rather than about a lock: `PING`, its version,
//! its `run_id`, its command counters; and the bare `SET NX PX` cycle the benchmark compares
//! with.

use lockcore::{Error, ErrorKind, Result};

use crate::conn::Conn;
use crate::error::map_err;

/// Sends `PING`.
///
/// Cancel safe.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn ping(conn: &mut Conn) -> Result<()> {
    redis::cmd("PING")
        .query_async::<()>(conn)
        .await
        .map_err(|e| map_err("PING failed", e))
}

/// The server's version from `INFO server` (`redis 7.0.15`; on a cluster, the node that answers).
///
/// Cancel safe.
///
/// # Errors
/// `Unavailable` or `Backend` when the command fails; `Backend` when the reply has no version.
pub async fn server_version(conn: &mut Conn) -> Result<String> {
    info_server_field(conn, "redis_version")
        .await
        .map(|v| format!("redis {v}"))
}

/// The server's `run_id` (`INFO server`): random for every redis-server process, so two
/// addresses whose servers report the same one reach the same process (what Redlock must know
/// to count each master's vote once, whatever names the configuration gives it).
///
/// Cancel safe.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails (a user without the right to run `INFO`:
/// `Backend`), or its `INFO server` has no `run_id`.
pub async fn server_run_id(conn: &mut Conn) -> Result<String> {
    info_server_field(conn, "run_id").await
}

/// The non-empty value of `field` in `INFO server`.
async fn info_server_field(conn: &mut Conn, field: &str) -> Result<String> {
    let text: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .map_err(|e| map_err("INFO server failed", e))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| Error::new(ErrorKind::Backend, format!("INFO server has no {field}")))
}

/// The number of commands the server has run since its start: the sum of `calls=` over
/// `INFO commandstats` (on a cluster, of the node the command is routed to).
///
/// Cancel safe.
///
/// # Errors
/// `Unavailable` or `Backend` when the server fails.
pub async fn server_requests(conn: &mut Conn) -> Result<u64> {
    let mut info = redis::cmd("INFO");
    info.arg("commandstats");
    let reply: redis::Value = match conn {
        Conn::Single(_) => info.query_async(conn).await,
        Conn::Cluster(c) => {
            use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
            c.route_command(
                info,
                RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
            )
            .await
        }
    }
    .map_err(|e| map_err("INFO commandstats failed", e))?;
    let mut texts = Vec::new();
    collect_text(reply, &mut texts);
    Ok(texts.iter().map(|t| command_calls(t, |_| true)).sum())
}

/// The calls an `INFO commandstats` text counts for the commands `counted` accepts (by name:
/// `get`, `evalsha`, ...).
pub fn command_calls(info: &str, counted: impl Fn(&str) -> bool) -> u64 {
    info.lines()
        .filter_map(|l| {
            let (command, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            if !counted(command) {
                return None;
            }
            stats
                .split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Every text in a reply (one `INFO` text, or one per node on a cluster).
fn collect_text(v: redis::Value, out: &mut Vec<String>) {
    use redis::Value as V;
    match v {
        V::BulkString(b) => out.push(String::from_utf8_lossy(&b).into_owned()),
        V::SimpleString(s) => out.push(s),
        V::VerbatimString { text, .. } => out.push(text),
        V::Array(items) | V::Set(items) => items.into_iter().for_each(|i| collect_text(i, out)),
        V::Map(pairs) => pairs.into_iter().for_each(|(_, v)| collect_text(v, out)),
        _ => {}
    }
}
