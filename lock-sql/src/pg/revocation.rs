//! PostgreSQL lease revocation: a revoke tells the holders' clients at once. Its transaction
//! reads the owner tokens it takes away (the lease's holder, every live share), deletes them,
//! and sends a `NOTIFY` on the table's channel naming them ([`REVOKED_PREFIX`], then the
//! tokens separated by spaces), delivered at its commit. Every client's release listener
//! (started at connect under the lease strategy) hands such a notice to its
//! [`Revocations`](lockcore::backend::Revocations), which fires the lost signal of the leases
//! it holds among those named.
//!
//! Best effort, as release notifications are: a notice sent while a client's listener is
//! reconnecting is lost, and that holder's next renewal (refused) finds out instead. Clients
//! that predate these notices ignore them (a waiter acts only on its lock's name or its own
//! queue token, and no name starts with a control character).

use super::*;

/// A NOTIFY payload naming revoked owner tokens (after this byte, separated by spaces): not
/// a lock name (names have no control characters) nor a queued waiter ([`WAITER_PREFIX`]).
pub(super) const REVOKED_PREFIX: char = '\u{2}';

/// Owner tokens per notice: a payload must stay under 8000 bytes (33 a token).
const TOKENS_PER_NOTICE: usize = 200;

/// The notices naming `tokens` (owner tokens as hex digits), [`TOKENS_PER_NOTICE`] at most
/// each; none for no token.
fn notices(tokens: &[String]) -> Vec<String> {
    tokens
        .chunks(TOKENS_PER_NOTICE)
        .map(|chunk| format!("{REVOKED_PREFIX}{}", chunk.join(" ")))
        .collect()
}

/// The owner tokens a notice names, if `payload` is a revocation notice.
pub(super) fn revoked_tokens(payload: &str) -> Option<&str> {
    payload.strip_prefix(REVOKED_PREFIX)
}

impl PgBackend {
    /// Frees `name`'s lease and shares behind their holders, telling their clients: one
    /// transaction that locks the name's lease row (as every statement touching shares does,
    /// so no share is granted, extended or released meanwhile), reads the live holder's and
    /// shares' owner tokens, deletes the shares (the release function, which wakes waiters)
    /// and expires the lease (waking waiters as a release does), with a notice naming the
    /// tokens. Returns whether anything was held.
    ///
    /// Cancel safety: dropping the future may or may not have revoked the lock (the
    /// transaction commits or rolls back whole; its connection is closed).
    pub(super) async fn revoke_lease(&self, name: &LockName) -> Result<bool> {
        let sql = self.sql.clone();
        let name = name.as_str().to_owned();
        let table = self.config.table.clone();
        self.conns
            .run(self.conns.bound(), "revoking a lease", move |c| {
                let (sql, name, table) = (sql.clone(), name.clone(), table.clone());
                async move {
                    let mut tx = c.begin().await?;
                    let holder: Option<Option<String>> =
                        sqlx::query_scalar(AssertSqlSafe(sql.revoke_lock.clone()))
                            .bind(&name)
                            .fetch_optional(&mut *tx)
                            .await?;
                    // No row: never held (a share creates the row too).
                    let Some(holder) = holder else {
                        tx.rollback().await?;
                        return Ok(false);
                    };
                    let mut tokens: Vec<String> =
                        sqlx::query_scalar(AssertSqlSafe(sql.revoke_share_tokens.clone()))
                            .bind(&name)
                            .fetch_all(&mut *tx)
                            .await?;
                    let shares: i64 = sqlx::query_scalar(AssertSqlSafe(sql.share_release.clone()))
                        .bind(&name)
                        .bind(None::<String>)
                        .bind(&table)
                        .fetch_one(&mut *tx)
                        .await?;
                    tokens.extend(holder);
                    let leases: i64 = sqlx::query_scalar(AssertSqlSafe(sql.revoke_lease.clone()))
                        .bind(&name)
                        .bind(&table)
                        .bind(notices(&tokens))
                        .fetch_one(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(leases > 0 || shares > 0)
                }
                .boxed()
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_name_every_token_within_the_payload_limit() {
        assert!(notices(&[]).is_empty());
        let tokens: Vec<String> = (0..450u128).map(|i| format!("{i:032x}")).collect();
        let sent = notices(&tokens);
        assert_eq!(sent.len(), 3);
        let mut named = Vec::new();
        for notice in &sent {
            assert!(notice.len() < 8000, "{} bytes", notice.len());
            named.extend(
                revoked_tokens(notice)
                    .expect("a revocation notice")
                    .split(' '),
            );
        }
        assert_eq!(named, tokens.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(revoked_tokens("a-lock-name"), None);
        assert_eq!(
            revoked_tokens(&format!("{WAITER_PREFIX}{}", tokens[0])),
            None
        );
    }
}
