//! Names and namespaces: hostile names, exact byte strings, independent namespaces.

use std::time::Duration;

use lockcore::{LockName, LockOptions, Locker};

use super::context::{Ctx, Outcome};
use super::support::{check, must_be_held, must_try, ok_or};

/// Names that naive key, path or SQL building gets wrong; pairs that collide under naive
/// escaping sit side by side.
const HOSTILE: &[&str] = &[
    "../x",
    "..",
    ".",
    "a/b",
    "a%2Fb",
    "a_2Fb",
    "/",
    "'",
    "\"",
    "'; DROP TABLE locks; --",
    "{tag}",
    "{tag}x",
    "x{tag}",
    "*",
    "?",
    "[a]",
    "%",
    "%%",
    "\\",
    "a b",
    "lock:1",
    "lock",
    "ünïcødé",
    "锁",
    "🔒",
    "NULL",
    "x-y",
    "x_y",
    "X",
];

pub(super) async fn hostile_names(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(20)));
    // Each hostile string starts a name and its first path segment (`../tag`, `//tag`), and is
    // the last segment of another (`tag/..`, `tag/.`): where a naive mapping to paths or keys
    // resolves, strips or rejects them. The run's unique tag keeps the names this run's own.
    let tag = ctx.prefix.trim_end_matches('-');
    let max = ctx.harness.max_name_len();
    let long = "n".repeat(max - ctx.prefix.len());
    let names: Vec<String> = HOSTILE
        .iter()
        .map(|h| format!("{h}/{tag}"))
        .chain(HOSTILE.iter().map(|h| format!("{tag}/{h}")))
        .chain([format!("{}{long}", ctx.prefix)])
        .collect();
    hold_all_distinct(ctx, &a, &b, &names, &opts).await?;
    if max < lockcore::MAX_NAME_LEN {
        // A target that limits names refuses a longer one, typed, and takes nothing.
        let name = format!("{}{long}n", ctx.prefix);
        match a.try_lock(name.as_str(), &opts).await {
            Err(e) if e.kind() == lockcore::ErrorKind::InvalidName => {}
            Err(e) => return Err(format!("a name over {max} bytes: {e}")),
            Ok(_) => return Err(format!("a name over {max} bytes was taken")),
        }
    }
    Ok(())
}

/// Takes every name with `a`, all held at once (each new one getting its own lock shows no two
/// collide; each is a valid name, so `InvalidName` is a failure), checks `b` finds each held,
/// then releases them one by one, checking the others stay held.
async fn hold_all_distinct(
    _ctx: &Ctx,
    a: &Locker,
    b: &Locker,
    names: &[String],
    opts: &LockOptions,
) -> Outcome {
    let mut held = Vec::new();
    for name in names {
        let name = LockName::new(name).map_err(|e| format!("{name:?}: {e}"))?;
        match a.try_lock(&name, opts).await {
            Ok(Some(g)) => held.push(g),
            Ok(None) => {
                let before: Vec<&str> = held.iter().map(|g| g.name().as_str()).collect();
                return Err(format!(
                    "{name:?} collided with a name held before it (one of {before:?})"
                ));
            }
            Err(e) => return Err(format!("{name:?} is a valid name, but: {e}")),
        }
    }
    for g in &held {
        must_be_held(
            b,
            g.name(),
            opts,
            &format!("{:?} from another client", g.name()),
        )
        .await?;
    }
    while let Some(g) = held.pop() {
        let name = g.name().clone();
        ok_or(g.release().await, &format!("release of {name:?}"))?;
        if let Some(other) = held.first() {
            must_be_held(
                b,
                other.name(),
                opts,
                &format!("{:?} after releasing {name:?}", other.name()),
            )
            .await?;
        }
    }
    Ok(())
}

pub(super) async fn names_are_exact_byte_strings(ctx: &Ctx) -> Outcome {
    let [a, b] = ctx.clients().await?;
    let opts = ctx.opts(ctx.ttl(Duration::from_secs(20)));
    let room = ctx.harness.max_name_len() - ctx.prefix.len();
    let long = |last: char| format!("{}{last}", "L".repeat(room - 1));
    let suffixes: Vec<String> = [
        // Case.
        "Case",
        "case",
        "CASE",
        // Unicode normalisation: NFC, NFD, compatibility.
        "caf\u{e9}",
        "cafe\u{301}",
        "\u{fb01}x",
        "fix",
        // Whitespace and zero-width characters are part of the name.
        "x",
        "x ",
        " x",
        "x\u{200b}",
        // Prefixes of each other.
        "ab",
        "abc",
    ]
    .iter()
    .map(|s| s.to_string())
    // Two longest names that differ only in the last byte.
    .chain([long('1'), long('2')])
    .collect();
    let names: Vec<String> = suffixes
        .iter()
        .map(|s| format!("{}{s}", ctx.prefix))
        .collect();
    hold_all_distinct(ctx, &a, &b, &names, &opts).await
}

pub(super) async fn namespaces_are_independent(ctx: &Ctx) -> Outcome {
    let [a, a2] = ctx.clients().await?;
    let other = || async {
        ctx.harness
            .client_in_other_namespace()
            .await
            .map_err(|e| format!("connecting a client in the other namespace failed: {e}"))
    };
    let (o, o2) = (other().await?, other().await?);
    let name = ctx.name("x");
    let opts = ctx.fenced_opts(ctx.ttl(Duration::from_secs(10)));
    let ga = must_try(&a, &name, &opts, "the holder in the first namespace").await?;
    let go = match o.try_lock(&name, &opts).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            return Err(
                "try_lock in the other namespace found the name held by the first namespace's holder: the namespaces exclude each other"
                    .into(),
            );
        }
        Err(e) => return Err(format!("try_lock in the other namespace failed: {e}")),
    };
    must_be_held(&a2, &name, &opts, "the first namespace, both holding").await?;
    must_be_held(&o2, &name, &opts, "the other namespace, both holding").await?;
    let first_token = ga.fencing_token();
    let mut other_tokens = vec![go.fencing_token()];
    ok_or(go.release().await, "the other namespace's release")?;
    must_be_held(
        &a2,
        &name,
        &opts,
        "the first namespace, after the other namespace released the same name",
    )
    .await?;
    // The other namespace takes the name a few times while the first holds it: a counter
    // shared in a way that breaks monotonicity shows in either namespace's tokens.
    for round in 0..3 {
        let g = must_try(
            &o,
            &name,
            &opts,
            &format!("the other namespace, round {round}"),
        )
        .await?;
        other_tokens.push(g.fencing_token());
        ok_or(g.release().await, "the other namespace's release")?;
    }
    ok_or(ga.release().await, "the first namespace's release")?;
    let again = must_try(&a2, &name, &opts, "the first namespace, again").await?;
    let first_again = again.fencing_token();
    ok_or(again.release().await, "the first namespace's release")?;
    if ctx.caps.fencing {
        let other: Vec<u64> = other_tokens.iter().map(|t| t.unwrap_or(0)).collect();
        check!(
            other.windows(2).all(|w| w[0] < w[1]),
            "fencing tokens in the other namespace did not increase: {other:?}"
        );
        let (t1, t2) = (first_token.unwrap_or(0), first_again.unwrap_or(0));
        check!(
            t1 < t2,
            "fencing tokens in the first namespace went from {t1} to {t2} while the other namespace took the same name (its tokens: {other:?})"
        );
    }
    Ok(())
}
