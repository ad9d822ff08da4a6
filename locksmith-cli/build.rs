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
    if let Some(git_dir) = git(&root, &["rev-parse", "--absolute-git-dir"]) {
        let git_dir = PathBuf::from(git_dir);
        println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
        println!(
            "cargo:rerun-if-changed={}",
            git_dir.join("packed-refs").display()
        );
        if let Some(head_ref) = git(&root, &["symbolic-ref", "-q", "HEAD"]) {
            println!(
                "cargo:rerun-if-changed={}",
                git_dir.join(head_ref).display()
            );
        }
    }
    println!(
        "cargo:rerun-if-changed={}",
        root.join("Cargo.toml").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        root.join("Cargo.lock").display()
    );
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let dir = entry.path();
            if dir.join("Cargo.toml").is_file() {
                println!(
                    "cargo:rerun-if-changed={}",
                    dir.join("Cargo.toml").display()
                );
                println!("cargo:rerun-if-changed={}", dir.join("src").display());
            }
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
