//! How sqlx's errors map onto lockcore's kinds, and the owner check of a lease row's update.

use lockcore::{Error, Result};

use crate::config::Parsed;

/// Maps a sqlx error: refused credentials are `Auth`; connection-level failures, and the server
/// refusing or ending a session for want of resources (too many connections, shutting down, the
/// session killed), are `Unavailable`; the rest `Backend`. Any URL or secret parameter in the
/// text is redacted in case a driver echoes it.
pub(crate) fn map_err(config: &Parsed, what: &str, e: sqlx::Error) -> Error {
    let text = config.scrub(e.to_string());
    let msg = format!("{what}: {text}");
    if is_auth_code(&e) {
        return Error::new(lockcore::ErrorKind::Auth, msg);
    }
    if is_unavailable_code(&e) {
        return Error::new(lockcore::ErrorKind::Unavailable, msg);
    }
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => Error::new(lockcore::ErrorKind::Unavailable, msg),
        sqlx::Error::Configuration(_) => Error::invalid_config(msg),
        _ => Error::new(lockcore::ErrorKind::Backend, msg),
    }
}

/// Server errors that mean "not now" rather than "wrong": PostgreSQL classes 08 (connection
/// exception) and 53 (insufficient resources, e.g. 53300 too many connections) and 57P01..57P05
/// (shutdown, crash, cannot connect now, session timeouts); MySQL/MariaDB 1040 / 1203 (too many
/// connections), 1053 (shutdown), 1927 (connection killed).
pub(crate) fn is_unavailable_code(e: &sqlx::Error) -> bool {
    let Some(d) = e.as_database_error() else {
        return false;
    };
    // Unused where only SQLite is built (no server error means "not now" there).
    let _ = d;
    #[cfg(feature = "mysql")]
    if let Some(m) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return matches!(m.number(), 1040 | 1203 | 1053 | 1927);
    }
    #[cfg(feature = "postgres")]
    if d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some()
    {
        let code = d.code().unwrap_or_default();
        return code.starts_with("08")
            || code.starts_with("53")
            || matches!(&*code, "57P01" | "57P02" | "57P03" | "57P04" | "57P05");
    }
    false
}

/// Server errors that refuse the credentials: PostgreSQL class 28 (28P01 invalid password,
/// 28000 invalid authorization: no `pg_hba.conf` entry, unknown role); MySQL/MariaDB 1045
/// (access denied: user or password) and 1698 (access denied to a user that authenticates
/// otherwise, such as by socket).
pub(crate) fn is_auth_code(e: &sqlx::Error) -> bool {
    let Some(d) = e.as_database_error() else {
        return false;
    };
    // Unused where only SQLite is built (SQLite has no credentials).
    let _ = d;
    #[cfg(feature = "mysql")]
    if let Some(m) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return matches!(m.number(), 1045 | 1698);
    }
    #[cfg(feature = "postgres")]
    if d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some()
    {
        return d.code().unwrap_or_default().starts_with("28");
    }
    false
}

/// The database error's code (SQLSTATE on PostgreSQL, the result code on SQLite).
#[allow(dead_code)]
pub(crate) fn db_code(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

/// The outcome of an owner-checked update or delete of a lease row: exactly one row means it
/// was still the caller's; none means it expired or another holder has it, and nothing changed.
pub(crate) fn owner_checked(rows: u64) -> Result<()> {
    if rows == 1 {
        Ok(())
    } else {
        Err(lockcore::Error::not_held(
            "the lease expired or belongs to another holder",
        ))
    }
}
