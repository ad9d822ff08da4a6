//! The holder process: takes a lock on a URL and reports it as JSON lines on stdout, so tests
//! can SIGKILL, SIGSTOP and resume it.
//!
//! ```text
//! LOCKSMITH_HOLDER_URL=URL locksmith-holder --name NAME --ttl-ms MS [--wait-ms MS] [--renew]
//!                  [--extend] [--resource HOST:PORT] [--work-ms MS] [--id ID] [--url URL]
//!                  [--shared | --permits N]
//! ```
//!
//! The URL comes from the environment (`--url` also works by hand): a command line is
//! readable by every user of the machine, and the URL may carry a password.
//!
//! (The `faults` crate's `locksmith-holder` binary, and `locksmith holder ...`, a hidden
//! subcommand of the CLI, for the report's crash scenarios.) Prints one JSON line per
//! event ([`faultkit::HolderEvent`]): `connected`, `acquired` (fencing token, validity), then
//! loops: `checked` (is the lease valid?), a pause of `--work-ms` (the window a SIGSTOP lands
//! in), a `write` to the fenced resource with its token (if `--resource`), and an `extend` (if
//! `--extend`). A well-behaved holder: it stops writing once a check says its lease is not
//! valid. `lost` is printed the moment the lost signal fires.

use std::io::Write as _;
use std::time::Duration;

use faultkit::HolderEvent;
use lockcore::{AutoRenew, LockOptions, Locker};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn emit(e: HolderEvent) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", e.to_line());
    let _ = out.flush();
}

fn fail(msg: impl std::fmt::Display) -> ! {
    emit(HolderEvent {
        error: Some(msg.to_string()),
        ..HolderEvent::now("error")
    });
    std::process::exit(1);
}

struct Args {
    url: String,
    name: String,
    ttl: Duration,
    wait: Duration,
    work: Duration,
    renew: bool,
    extend: bool,
    resource: Option<String>,
    id: String,
    /// Shared (a reader) instead of exclusive.
    shared: bool,
    /// One of this many permits instead of exclusive.
    permits: Option<u32>,
}

fn parse(args: Vec<String>) -> Args {
    let mut a = Args {
        url: String::new(),
        name: String::new(),
        ttl: Duration::from_secs(10),
        wait: Duration::from_secs(30),
        work: Duration::from_millis(100),
        renew: false,
        extend: false,
        resource: None,
        id: "holder".into(),
        shared: false,
        permits: None,
    };
    let mut it = args.into_iter();
    let ms = |v: Option<String>| {
        Duration::from_millis(
            v.and_then(|v| v.parse().ok())
                .unwrap_or_else(|| fail("expected a number of milliseconds")),
        )
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--url" => a.url = it.next().unwrap_or_else(|| fail("--url needs a value")),
            "--name" => a.name = it.next().unwrap_or_else(|| fail("--name needs a value")),
            "--ttl-ms" => a.ttl = ms(it.next()),
            "--wait-ms" => a.wait = ms(it.next()),
            "--work-ms" => a.work = ms(it.next()),
            "--renew" => a.renew = true,
            "--extend" => a.extend = true,
            "--resource" => a.resource = it.next(),
            "--id" => a.id = it.next().unwrap_or_else(|| fail("--id needs a value")),
            "--shared" => a.shared = true,
            "--permits" => {
                a.permits = Some(
                    it.next()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| fail("--permits needs a number")),
                )
            }
            other => fail(format!("unknown argument {other}")),
        }
    }
    if a.url.is_empty() {
        a.url = std::env::var(faultkit::HOLDER_URL_ENV).unwrap_or_default();
    }
    if a.shared && a.permits.is_some() {
        fail("--shared and --permits exclude each other");
    }
    if a.url.is_empty() || a.name.is_empty() {
        fail(format!(
            "--name and a URL ({} or --url) are required",
            faultkit::HOLDER_URL_ENV
        ));
    }
    a
}

/// Runs a holder with `args` (the command line without the program name), connecting with
/// `connect` (the program's own: `locksmith::connect`, which knows every backend compiled in);
/// never returns while the lock is held: the holder loops until it is killed. Exits the
/// process on errors.
///
/// Cancel safety: dropping the future drops the guard (released in the background).
pub async fn holder_main<F, Fut>(args: Vec<String>, connect: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = lockcore::Result<Locker>>,
{
    // Die with the test that started us, even when it is killed.
    #[cfg(target_os = "linux")]
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let args = parse(args);
    let locker = connect(args.url.clone())
        .await
        .unwrap_or_else(|e| fail(format!("connect: {e}")));
    emit(HolderEvent::now("connected"));
    let mut opts = LockOptions::new().ttl(args.ttl).wait_timeout(args.wait);
    opts = if args.renew {
        opts.auto_renew(AutoRenew::until(Duration::from_secs(3600)))
    } else {
        // Without --renew the holder lets its lease run out (guards renew by default).
        opts.no_auto_renew()
    };
    if args.shared {
        opts = opts.shared();
    }
    if let Some(limit) = args.permits {
        opts = opts.permits(limit);
    }
    let guard = match locker.lock(args.name.as_str(), &opts).await {
        Ok(g) => g,
        Err(e) if e.kind() == lockcore::ErrorKind::Timeout => {
            // The wait's clean-up (a queue entry deleted) runs in the background: finished
            // before exiting, or the entry stays until its session or lease expires and the
            // next holder queues behind it.
            locker.flush().await;
            emit(HolderEvent::now("timeout"));
            std::process::exit(2);
        }
        Err(e) => fail(format!("lock: {e}")),
    };
    let fence = guard.fencing_token();
    emit(HolderEvent {
        fence,
        valid_for_us: Some(
            guard
                .valid_until()
                .saturating_duration_since(lockcore::Instant::now())
                .as_micros() as u64,
        ),
        ..HolderEvent::now("acquired")
    });
    let lost = guard.lost();
    tokio::spawn(async move {
        let reason = lost.lost().await;
        emit(HolderEvent {
            reason: Some(reason.to_string()),
            ..HolderEvent::now("lost")
        });
    });
    let mut resource = match &args.resource {
        Some(addr) => {
            let s = tokio::net::TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| fail(format!("resource {addr}: {e}")));
            let (r, w) = s.into_split();
            Some((BufReader::new(r).lines(), w))
        }
        None => None,
    };
    let token = fence.map(|f| f.to_string()).unwrap_or_else(|| "-".into());
    let mut writing = true;
    loop {
        let valid = guard.is_valid();
        emit(HolderEvent {
            valid: Some(valid),
            ..HolderEvent::now("checked")
        });
        writing &= valid;
        // The window between the check and the write: a pause here is what fencing is for.
        tokio::time::sleep(args.work).await;
        if let (true, Some((lines, w))) = (writing, resource.as_mut()) {
            let line = format!("WRITE {} {token}\n", args.id);
            if w.write_all(line.as_bytes()).await.is_err() {
                fail("resource closed");
            }
            let answer = lines.next_line().await.ok().flatten().unwrap_or_default();
            emit(HolderEvent {
                fence,
                accepted: Some(answer == "OK"),
                ..HolderEvent::now("write")
            });
        }
        if args.extend {
            let res = guard.extend(args.ttl).await;
            emit(HolderEvent {
                ok: Some(res.is_ok()),
                lost_before: Some(guard.lost().is_lost()),
                error: res.err().map(|e| e.to_string()),
                ..HolderEvent::now("extend")
            });
        }
    }
}
