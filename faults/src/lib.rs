//! locksmith's fault scenarios (issue 10): every backend under holder crashes and pauses, server
//! restarts, failovers, partitions and slow replies, on real topologies started by
//! [`faultkit`]. The `locksmith-holder` binary of this crate is the holder process.
#![deny(missing_docs)]

/// The path of the `locksmith-holder` binary built with this crate (for tests and tools in this
/// workspace): next to the running test binary's `deps/` directory.
pub fn holder_program() -> std::path::PathBuf {
    if let Some(p) = option_env!("CARGO_BIN_EXE_locksmith-holder") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().unwrap_or(std::path::Path::new("."));
    let dir = if dir.ends_with("deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    dir.join("locksmith-holder")
}
