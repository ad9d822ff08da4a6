//! Where a report's or a bench file's figures come from: this tool's version, the commit it was
//! built from and its build profile.

use conformance::Provenance;

/// This tool's version, the git commit of the source tree it was built from (recorded by
/// `build.rs` at build time; `-dirty` with local changes) and the build profile.
pub(crate) fn provenance() -> Provenance {
    // The commit the binary was built from (build.rs), not the commit of whatever checkout it
    // runs beside; empty when it was built outside a git checkout.
    let git_commit = Some(env!("LOCKSMITH_BUILD_COMMIT"))
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    if profile == "debug" {
        eprintln!(
            "locksmith: warning: a debug build; its figures are not representative \
             (cargo run --release -p locksmith-cli -- report)"
        );
    }
    Provenance {
        tool: format!("locksmith {}", env!("CARGO_PKG_VERSION")),
        git_commit,
        profile: profile.to_owned(),
    }
}
