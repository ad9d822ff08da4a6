//! The names PostgreSQL's objects and keys take from the lock table's: the waiters' queue,
//! the share functions, the advisory keys' seed.

/// The queue of exclusive lease waiters beside lock table `t` (`<t>_waits`; within
/// PostgreSQL's 63 bytes as the shares table is).
pub(crate) fn queue_table(t: &str) -> String {
    let shares = crate::shares::table(t);
    let stem = shares.strip_suffix("_shares").unwrap_or(&shares);
    format!("{stem}_waits")
}

/// The version of each share function's protocol, part of its name: a change of its signature
/// or of what it does on the tables is a new version (a new function beside the old, which
/// older clients keep calling), never a replacement. The acquire is at 2: it takes the name's
/// advisory key for its transaction first (see `exclusion.rs`).
const SHARE_ACQUIRE_VERSION: u32 = 2;
const SHARE_RELEASE_VERSION: u32 = 1;

/// A share function beside lock table `t` (see [`crate::shares::routine`]): `sacq` or `srel`.
pub(crate) fn share_function(t: &str, what: &str) -> String {
    let version = if what == "sacq" {
        SHARE_ACQUIRE_VERSION
    } else {
        SHARE_RELEASE_VERSION
    };
    crate::shares::routine(t, what, version)
}

/// A stable 64-bit FNV-1a of the table name: the seed of the advisory-lock keys, so two lock
/// tables in one database never share a key.
pub(crate) fn table_seed(table: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in table.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}
