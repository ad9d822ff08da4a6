//! `locksmith run` under a paused lock server, on every backend with a server: the command is
//! dead before its lock can pass to the next holder, even when it ignores SIGTERM for longer
//! than the TTL.
//!
//! Each test starts its own server (faultkit: free ports, throw-away data) and SIGSTOPs it for
//! longer than the TTL while a `locksmith run --ttl 2s --kill-grace 10s` holder runs a command
//! that ignores SIGTERM. The holder cannot renew; the lease is at risk, then ends on the server.
//! The test checks, from outside both processes, that the command is gone while the server is
//! still paused (before any other client can be granted the lock), and a second `locksmith run`
//! started during the pause checks, as its own command's first step, that the first command is
//! not alive. SQLite has no server to pause (its file is the lock, on one host).

use std::process::Child;
use std::time::{Duration, Instant};

mod support;
use support::*;

/// The holder's TTL: short, so the pause outlives it by far.
const TTL: &str = "2s";
/// How long the server stays paused: more than the TTL and its margins, so that the lease ends
/// on the server during the pause.
const PAUSE: Duration = Duration::from_secs(5);

/// What the paused server looks like to the test.
trait Pausable {
    fn pause(&mut self);
    fn resume(&mut self);
}

impl Pausable for Vec<&mut faultkit::ServerProcess> {
    fn pause(&mut self) {
        for p in self.iter() {
            p.pause().unwrap();
        }
    }
    fn resume(&mut self) {
        for p in self.iter() {
            p.resume().unwrap();
        }
    }
}

/// Runs the scenario on `url` with `server` the processes to pause.
fn command_dies_before_the_lock_passes(url: &str, tag: &str, server: &mut dyn Pausable) {
    let dir = TempDir::new(tag);
    let a_pid = dir.path("a.pid");
    let held = dir.path("held");
    // Ignores SIGTERM (so do its children: the disposition is inherited) and runs forever.
    let a_script = format!(
        "echo $$ > {pid}; trap '' TERM; echo > {held}; while :; do sleep 0.05; done",
        pid = a_pid.display(),
        held = held.display()
    );
    let a = run_cmd(
        url,
        &[
            "--ttl",
            TTL,
            "--kill-grace",
            "10s",
            "job",
            "--",
            "sh",
            "-c",
            &a_script,
        ],
    )
    .spawn()
    .unwrap();
    let a = KillOnDrop(Some(a));
    wait_file(&held, bound(30.0));
    let a_sh = read_pid(&a_pid);

    eprintln!("{tag}: holder's command runs (pid {a_sh}); pausing the server");
    server.pause();
    let paused_at = Instant::now();
    // The next holder queues while the server is paused, so it takes the lock as early as the
    // server lets anyone have it. Its command's first act: is the first command alive?
    let b_out = dir.path("b.out");
    let b_script = format!(
        "s=$(sed 's/.*) //' /proc/{a_sh}/stat 2>/dev/null | cut -c1); \
         case \"$s\" in ''|Z|X) echo ok ;; *) echo \"overlap: state $s\" ;; esac > {out}",
        out = b_out.display()
    );
    let b = run_cmd(
        url,
        &[
            "--ttl",
            TTL,
            "--wait",
            "60s",
            "--connect-timeout",
            "60s",
            "job",
            "--",
            "sh",
            "-c",
            &b_script,
        ],
    )
    .spawn()
    .unwrap();
    let b = KillOnDrop(Some(b));

    // The command must be gone while the server is still paused: the lease cannot have passed
    // to anyone yet, and it ends within the TTL after the last renewal.
    let dead = wait_ended(a_sh, PAUSE.saturating_sub(Duration::from_millis(500)));
    let died_after = paused_at.elapsed();
    eprintln!("{tag}: command ended: {dead} ({died_after:?} into the pause); resuming");
    server.resume();
    let a_out = wait_output(a.take(), bound(60.0));
    assert!(
        dead,
        "{tag}: the command (ignoring SIGTERM) was still running {died_after:?} into a {PAUSE:?} \
         server pause with a {TTL} TTL; locksmith said: {}",
        stderr(&a_out)
    );
    assert_eq!(code(&a_out), 70, "{tag}: {}", stderr(&a_out));
    let said = stderr(&a_out);
    assert!(
        said.contains("at risk") || said.contains("lost"),
        "{tag}: locksmith should say why it stopped the command: {said}"
    );

    let b_out_proc = wait_output(b.take(), bound(60.0));
    assert_eq!(code(&b_out_proc), 0, "{tag}: {}", stderr(&b_out_proc));
    let seen = std::fs::read_to_string(&b_out).unwrap();
    assert_eq!(
        seen.trim(),
        "ok",
        "{tag}: the next holder's command ran beside the first one"
    );
}

/// Kills the `locksmith` child if the test fails before waiting for it.
struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    fn take(mut self) -> Child {
        self.0.take().unwrap()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn redis_pause() {
    let rt = runtime();
    let mut redis = rt.block_on(faultkit::RedisServer::start()).unwrap();
    let url = redis.url();
    command_dies_before_the_lock_passes(&url, "redis", &mut vec![redis.process()]);
}

#[test]
fn redlock_majority_pause() {
    let rt = runtime();
    let mut masters: Vec<faultkit::RedisServer> = (0..5)
        .map(|_| rt.block_on(faultkit::RedisServer::start()).unwrap())
        .collect();
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    // Three of five: no majority can renew.
    let mut paused: Vec<&mut faultkit::ServerProcess> =
        masters.iter_mut().take(3).map(|m| m.process()).collect();
    command_dies_before_the_lock_passes(&url, "redlock", &mut paused);
}

#[test]
fn postgres_pause_row_lock_and_lease() {
    let rt = runtime();
    let mut pg = rt.block_on(faultkit::Postgres::start()).unwrap();
    let url = pg.url();
    for strategy in ["row-lock", "lease"] {
        command_dies_before_the_lock_passes(
            &format!("{url}?strategy={strategy}"),
            &format!("postgres-{strategy}"),
            &mut vec![pg.process()],
        );
    }
}

#[test]
fn mariadb_pause_row_lock_and_lease() {
    let rt = runtime();
    let mut my = rt.block_on(faultkit::MariaDb::start()).unwrap();
    let url = my.url();
    for strategy in ["row-lock", "lease"] {
        command_dies_before_the_lock_passes(
            &format!("{url}?strategy={strategy}"),
            &format!("mariadb-{strategy}"),
            &mut vec![my.process()],
        );
    }
}

#[test]
fn zookeeper_pause() {
    let rt = runtime();
    let mut zk = rt.block_on(faultkit::ZooKeeper::single()).unwrap();
    let url = zk.url();
    command_dies_before_the_lock_passes(&url, "zookeeper", &mut vec![zk.member(0)]);
}

#[test]
fn etcd_pause() {
    let rt = runtime();
    let mut etcd = rt.block_on(faultkit::Etcd::single()).unwrap();
    let url = format!("etcd://127.0.0.1:{}", etcd.client_port(0));
    command_dies_before_the_lock_passes(&url, "etcd", &mut vec![etcd.member(0)]);
}
