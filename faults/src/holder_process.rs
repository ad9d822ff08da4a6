//! Which program the scenarios start as the holder process (the `locksmith-holder` binary, or
//! the CLI's hidden `holder` subcommand).

static HOLDER: std::sync::OnceLock<(std::path::PathBuf, Vec<String>)> = std::sync::OnceLock::new();

/// Makes the scenarios start holders as `program prefix... <holder flags>` (the CLI passes its
/// own executable and `["holder"]`). Without it they run [`holder_program`]. Only the first
/// call counts.
pub fn set_holder_command(program: std::path::PathBuf, prefix: Vec<String>) {
    let _ = HOLDER.set((program, prefix));
}

/// The holder command the scenarios use: see [`set_holder_command`].
pub fn holder_command() -> (std::path::PathBuf, Vec<String>) {
    HOLDER
        .get()
        .cloned()
        .unwrap_or_else(|| (holder_program(), Vec::new()))
}

/// The path of the `locksmith-holder` binary: the one Cargo built for this crate's tests, else
/// the one next to the running executable (`target/<profile>/`, also from `deps/`).
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
