//! Records the commit the binary is built from, for the report's provenance: a binary run
//! from another checkout, or after the checkout moved on, must not claim that checkout's commit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.parent().unwrap_or(&manifest).to_path_buf();
    // Run again when HEAD moves (a commit, a checkout) or a source the binary is built from
    // changes (the -dirty mark); not on every build.
    let rerun = |path: PathBuf| println!("cargo:rerun-if-changed={}", path.display());
    if let Some(git_dir) = git(&root, &["rev-parse", "--absolute-git-dir"]) {
        let git_dir = PathBuf::from(git_dir);
        rerun(git_dir.join("HEAD"));
        rerun(git_dir.join("packed-refs"));
        if let Some(head_ref) = git(&root, &["symbolic-ref", "-q", "HEAD"]) {
            rerun(git_dir.join(head_ref));
        }
    }
    rerun(root.join("Cargo.toml"));
    rerun(root.join("Cargo.lock"));
    for dir in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let dir = dir.path();
        if dir.join("Cargo.toml").is_file() {
            rerun(dir.join("Cargo.toml"));
            rerun(dir.join("src"));
        }
    }
    let commit = git(&root, &["rev-parse", "--short=12", "HEAD"]).map(|commit| {
        let dirty = git(&root, &["status", "--porcelain", "--untracked-files=no"])
            .is_some_and(|s| !s.is_empty());
        if dirty {
            format!("{commit}-dirty")
        } else {
            commit
        }
    });
    println!(
        "cargo:rustc-env=LOCKSMITH_BUILD_COMMIT={}",
        commit.unwrap_or_default()
    );
}
