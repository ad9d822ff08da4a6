//! MariaDB's schema: the lock table (columns added to one of an older release), the shares
//! table and the share procedures, created on connect where missing.

use super::*;

/// The holder-metadata columns, in `CREATE TABLE` and added to older tables.
pub(super) const META_COLUMNS: &str =
    "holder_meta TEXT CHARACTER SET utf8mb4 NULL, acquired_at DATETIME(6) NULL";

/// The shares' columns of the lease row (see [`crate::shares`]).
pub(super) const SHARE_COLUMNS: &str =
    "shares_until DATETIME(6) NULL, writer_until DATETIME(6) NULL";

/// Adds columns (`columns`, the first named `first`) to a table created before they existed:
/// the holder's metadata, the shares'. Probed first: an `ALTER TABLE` (even one with nothing
/// to do) waits for the metadata lock that row-lock waiters keep on the table while they wait.
/// Two clients adding them at once: the second finds them there (ER_DUP_FIELDNAME), which is
/// as good.
pub(super) async fn add_columns(
    conns: &MyConns,
    table: &str,
    first: &str,
    columns: &str,
) -> Result<()> {
    let t = table.to_owned();
    let first = first.to_owned();
    let present: i64 = conns
        .run(
            conns.bound(),
            "probing the lock table's columns",
            move |c| {
                sqlx::query_scalar(
                    "SELECT COUNT(*) FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
                )
                .bind(t.clone())
                .bind(first.clone())
                .fetch_one(c)
                .boxed()
            },
        )
        .await?;
    if present > 0 {
        return Ok(());
    }
    let alter = format!("ALTER TABLE {table} ADD COLUMN ({columns})");
    conns
        .run(
            conns.bound(),
            "adding columns to the lock table",
            move |c| {
                let alter = alter.clone();
                async move {
                    match sqlx::raw_sql(AssertSqlSafe(alter)).execute(c).await {
                        // ER_DUP_FIELDNAME: added meanwhile by another client.
                        Err(e) if error_number(&e) == Some(1060) => Ok(()),
                        r => r.map(|_| ()),
                    }
                }
                .boxed()
            },
        )
        .await
}

/// Creates the share procedures of lock table `t` (shares table `st`) where missing and says
/// whether both are there to call. A refusal (no `CREATE ROUTINE`; two clients creating
/// one at once) is no error: the probe after it decides, so procedures a privileged user
/// created serve a client that may not create them, and a client that finds none keeps the
/// statements (logged once at connect).
pub(super) async fn create_share_procedures(
    conns: &MyConns,
    t: &str,
    st: &str,
) -> Result<Option<ShareCalls>> {
    let mut refused = None;
    for ddl in crate::mysql::procs::ddl(t, st) {
        let outcome = conns
            .run(conns.bound(), "creating the share procedures", move |c| {
                sqlx::raw_sql(AssertSqlSafe(ddl.clone()))
                    .execute(c)
                    .map(|r| match r {
                        Ok(_) => Ok(None),
                        Err(sqlx::Error::Database(e)) => Ok(Some(e.message().to_owned())),
                        Err(e) => Err(e),
                    })
                    .boxed()
            })
            .await?;
        refused = refused.or(outcome);
    }
    let names = crate::mysql::procs::names(t);
    let present: i64 = conns
        .run(conns.bound(), "probing the share procedures", move |c| {
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() \
                 AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME IN (?, ?)",
            )
            .bind(names[0].clone())
            .bind(names[1].clone())
            .fetch_one(c)
            .boxed()
        })
        .await?;
    if present == 2 {
        return Ok(Some(ShareCalls::new(t)));
    }
    tracing::warn!(
        table = t,
        refused = refused.as_deref().unwrap_or(""),
        "the share procedures could not be created: shares and permits take a transaction of \
         several statements (about 3x slower); grant CREATE ROUTINE, or let a user who has it \
         connect once"
    );
    Ok(None)
}

/// Creates the lock table (columns of later releases added), and for leases the shares table
/// and the share procedures, where missing: the procedures' calls when they are there.
///
/// Cancel safety: dropping the future leaves at most some of them created (each idempotently).
pub(super) async fn create_schema(conns: &MyConns, config: &Parsed) -> Result<Option<ShareCalls>> {
    let t = &config.table;
    // VARBINARY: names compare byte for byte (no case folding, no PAD SPACE). Expiry is
    // kept in UTC_TIMESTAMP(6), independent of session time zones. The holder's metadata
    // (`lockcore::Holder`, JSON) is `holder_meta` with `acquired_at` on the server's clock
    // (`holder` is an older column, unused).
    let ddl = format!(
        "CREATE TABLE IF NOT EXISTS {t} (name VARBINARY(320) NOT NULL PRIMARY KEY, \
           owner CHAR(32) NULL, fence BIGINT UNSIGNED NOT NULL DEFAULT 0, \
           expires_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:01', \
           holder BIGINT UNSIGNED NULL, {META_COLUMNS}, {SHARE_COLUMNS}) ENGINE=InnoDB"
    );
    conns
        .run(conns.bound(), "creating the lock table", move |c| {
            sqlx::raw_sql(AssertSqlSafe(ddl.clone()))
                .execute(c)
                .map(|r| r.map(|_| ()))
                .boxed()
        })
        .await?;
    add_columns(conns, t, "holder_meta", META_COLUMNS).await?;
    // Every strategy's clients add them (to a table of an older release): an ALTER TABLE
    // run later by a lease client would queue behind row-lock holders' metadata locks, and
    // every statement on the table behind it.
    add_columns(conns, t, "shares_until", SHARE_COLUMNS).await?;
    let st = crate::shares::table(t);
    // Row-lock clients too: their check for a live lease reads it (see
    // `crate::mysql::exclusion`).
    {
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {st} (name VARBINARY(320) NOT NULL, \
               token VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
               mode VARCHAR(32) CHARACTER SET ascii NOT NULL, expires_at DATETIME(6) NOT NULL, \
               fence BIGINT UNSIGNED NOT NULL, holder TEXT CHARACTER SET utf8mb4 NULL, \
               PRIMARY KEY (name, token)) ENGINE=InnoDB"
        );
        conns
            .run(conns.bound(), "creating the shares table", move |c| {
                sqlx::raw_sql(AssertSqlSafe(ddl.clone()))
                    .execute(c)
                    .map(|r| r.map(|_| ()))
                    .boxed()
            })
            .await?;
    }
    let share_calls = if config.strategy == Strategy::Lease {
        create_share_procedures(conns, t, &st).await?
    } else {
        None
    };
    Ok(share_calls)
}
