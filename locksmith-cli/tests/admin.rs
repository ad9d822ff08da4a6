//! `locksmith status` and `locksmith unlock --force`, black-box against the shared servers: a
//! `locksmith run --label ..` process holds a lock, and other processes inspect and free it.
//! Every backend that can inspect is covered; one that cannot (MariaDB under `interop=get_lock`,
//! whose peers write no lock row) says so (exit 2).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::*;

/// `locksmith ARGS` with the URL in `LOCKSMITH_URL`.
fn locksmith(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args(args)
        .env("LOCKSMITH_URL", url)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn server_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: start the test servers (scripts/servers.sh) and eval its env")
    })
}

fn unique(tag: &str) -> String {
    format!(
        "admin-{tag}-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    )
}

/// `status --json`, parsed, with its exit code.
fn status_json(url: &str, name: &str) -> (i32, serde_json::Value) {
    let out = locksmith(url, &["status", "--json", name]);
    let v = serde_json::from_str(stdout(&out).trim())
        .unwrap_or_else(|e| panic!("status --json printed no JSON ({e}): {out:?}"));
    (code(&out), v)
}

/// The whole operator's round on `url`: free, held (who, token, TTL), unlock refused without
/// --force, unlock with it (the holder's `run` ends with exit 70, lock lost), free again.
fn status_and_unlock(url: &str, tag: &str, fencing: bool) {
    let dir = TempDir::new(tag);
    let name = unique(tag);

    let (c, free) = status_json(url, &name);
    assert_eq!(c, 1, "a free lock exits 1: {free}");
    assert_eq!(free["held"], false);
    assert!(free["holder"].is_null());

    let held_file = dir.path("held");
    let holder = Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args([
            "run",
            "--ttl",
            "3s",
            "--kill-grace",
            "2s",
            "--label",
            "nightly report #7",
            &name,
            "--",
            "sh",
            "-c",
            &format!("echo > {}; exec sleep 300", held_file.display()),
        ])
        .env("LOCKSMITH_URL", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_file(&held_file, bound(30.0));

    let (c, info) = status_json(url, &name);
    assert_eq!(c, 0, "a held lock exits 0: {info}");
    assert_eq!(info["held"], true);
    assert_eq!(info["name"], name.as_str());
    let h = &info["holder"];
    assert_eq!(
        h["pid"],
        holder.id(),
        "the pid of the holding locksmith: {info}"
    );
    assert_eq!(h["host"], locksmith::Holder::current(None).host.as_str());
    assert_eq!(h["label"], "nightly report #7");
    let acquired = h["acquired_at_unix_ms"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        acquired <= now + 2_000 && acquired + bound(60.0).as_millis() as u64 >= now,
        "acquired at {acquired}, now {now}"
    );
    assert_eq!(info["fencing_token"].is_u64(), fencing, "{info}");
    if let Some(left) = info["ttl_left_secs"].as_f64() {
        assert!(
            left > 0.0 && left <= 5.0,
            "ttl left {left} of a 3 s lease: {info}"
        );
    }

    let text = locksmith(url, &["status", &name]);
    assert_eq!(code(&text), 0);
    for want in ["held", "nightly report #7", &holder.id().to_string()] {
        assert!(
            stdout(&text).contains(want),
            "{want:?} missing: {}",
            stdout(&text)
        );
    }

    let refused = locksmith(url, &["unlock", &name]);
    assert_eq!(code(&refused), 2, "{refused:?}");
    assert!(stderr(&refused).contains("--force"), "{}", stderr(&refused));
    assert_eq!(
        status_json(url, &name).0,
        0,
        "a refused unlock changed nothing"
    );

    let unlocked = locksmith(url, &["unlock", "--force", &name]);
    assert_eq!(code(&unlocked), 0, "{unlocked:?}");
    let out = wait_output(holder, bound(30.0));
    assert_eq!(
        code(&out),
        70,
        "the holder's run must end with lock lost: {}",
        stderr(&out)
    );

    // Free (a row lock's session ends a moment after it is told to).
    let deadline = Instant::now() + bound(10.0);
    loop {
        let (c, v) = status_json(url, &name);
        if c == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still held after unlock --force: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(code(&locksmith(url, &["unlock", "--force", &name])), 1);
}

#[test]
fn status_and_unlock_on_redis() {
    status_and_unlock(&server_url("LOCK_TEST_REDIS_URL"), "redis", true);
}

#[test]
fn status_and_unlock_on_redlock() {
    status_and_unlock(&server_url("LOCK_TEST_REDLOCK_URL"), "redlock", false);
}

#[test]
fn status_and_unlock_on_postgres_lease() {
    let url = format!("{}?strategy=lease", server_url("LOCK_TEST_POSTGRES_URL"));
    status_and_unlock(&url, "pg-lease", true);
}

#[test]
fn status_and_unlock_on_postgres_row_lock() {
    let url = format!("{}?strategy=row-lock", server_url("LOCK_TEST_POSTGRES_URL"));
    status_and_unlock(&url, "pg-row", true);
}

#[test]
fn status_and_unlock_on_mariadb_lease() {
    let url = format!("{}?strategy=lease", server_url("LOCK_TEST_MYSQL_URL"));
    status_and_unlock(&url, "my-lease", true);
}

#[test]
fn status_and_unlock_on_mariadb_row_lock() {
    let url = format!("{}?strategy=row-lock", server_url("LOCK_TEST_MYSQL_URL"));
    status_and_unlock(&url, "my-row", true);
}

#[test]
fn status_and_unlock_on_zookeeper() {
    status_and_unlock(&server_url("LOCK_TEST_ZK_URL"), "zk", true);
}

#[test]
fn status_and_unlock_on_etcd() {
    status_and_unlock(&server_url("LOCK_TEST_ETCD_URL"), "etcd", true);
}

#[test]
fn status_and_unlock_on_sqlite() {
    let dir = TempDir::new("sqlite-admin");
    status_and_unlock(&dir.sqlite(), "sqlite", true);
}

/// A backend that cannot inspect says so (MariaDB under `interop=get_lock`: its peers write no
/// lock row): exit 2, the reason on stderr, nothing on stdout.
#[test]
fn status_on_a_backend_without_inspect_exits_2() {
    let url = format!(
        "{}?strategy=row-lock&interop=get_lock",
        server_url("LOCK_TEST_MYSQL_URL")
    );
    let out = locksmith(&url, &["status", "job"]);
    assert_eq!(code(&out), 2, "{out:?}");
    assert!(stderr(&out).contains("cannot inspect"), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
}

/// Bad input: an invalid name is exit 2 with the reason; a missing URL is a usage error.
#[test]
fn status_and_unlock_refuse_bad_input() {
    let dir = TempDir::new("bad-input");
    let out = locksmith(&dir.sqlite(), &["unlock", "--force", "bad\u{7}name"]);
    assert_eq!(code(&out), 2, "{out:?}");
    assert!(
        stderr(&out).contains("control character"),
        "{}",
        stderr(&out)
    );
    let no_url = Command::new(env!("CARGO_BIN_EXE_locksmith"))
        .args(["status", "job"])
        .env_remove("LOCKSMITH_URL")
        .output()
        .unwrap();
    assert_eq!(code(&no_url), 2);
}

/// Two `locksmith run --shared` processes hold one name: `status` lists both (their pids, the
/// mode), `--json` gives `mode` and `holders`; a plain `run -n` of the name is refused as busy
/// while they hold it, and `--permits` on it is a conflict (exit 78).
#[test]
fn status_lists_every_shared_holder() {
    let url = server_url("LOCK_TEST_REDIS_URL");
    let dir = TempDir::new("shared-status");
    let name = unique("shared");
    let mut holders = Vec::new();
    for i in 0..2 {
        let held = dir.path(&format!("held-{i}"));
        let child = Command::new(env!("CARGO_BIN_EXE_locksmith"))
            .args([
                "run",
                "--shared",
                "--ttl",
                "5s",
                "--label",
                &format!("reader {i}"),
                &name,
            ])
            .args([
                "--",
                "sh",
                "-c",
                &format!("echo > {}; exec sleep 300", held.display()),
            ])
            .env("LOCKSMITH_URL", &url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_file(&held, bound(30.0));
        holders.push(child);
    }
    let (c, info) = status_json(&url, &name);
    assert_eq!(c, 0, "held by readers: {info}");
    assert_eq!(info["mode"], "shared", "{info}");
    let listed = info["holders"].as_array().expect("a holders array");
    assert_eq!(listed.len(), 2, "{info}");
    let mut pids: Vec<u64> = listed
        .iter()
        .map(|h| h["holder"]["pid"].as_u64().unwrap())
        .collect();
    pids.sort_unstable();
    let mut want: Vec<u64> = holders.iter().map(|c| u64::from(c.id())).collect();
    want.sort_unstable();
    assert_eq!(pids, want, "{info}");
    let text = locksmith(&url, &["status", &name]);
    for want in ["mode:     shared", "holders:  2", "reader 0", "reader 1"] {
        assert!(
            stdout(&text).contains(want),
            "{want:?} missing: {}",
            stdout(&text)
        );
    }
    let writer = locksmith(&url, &["run", "-n", &name, "--", "true"]);
    assert_eq!(code(&writer), 75, "a writer beside readers: {writer:?}");
    let permit = locksmith(&url, &["run", "-n", "--permits", "2", &name, "--", "true"]);
    assert_eq!(
        code(&permit),
        78,
        "a semaphore use of a read-write lock: {permit:?}"
    );
    assert!(stderr(&permit).contains("conflict"), "{}", stderr(&permit));
    for h in holders {
        send(h.id(), rustix::process::Signal::TERM);
        let out = wait_output(h, bound(30.0));
        assert_eq!(code(&out), 128 + 15, "{}", stderr(&out));
    }
}
