//! Human durations for the command line: `500ms`, `30s`, `5m`, `1h`, `1d`, combined (`1m30s`),
//! and `0`.

use std::time::Duration;

/// How long `run` waits for a busy lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Until the lock is free.
    Forever,
    /// Up to this long; zero means a single attempt.
    For(Duration),
}

/// Parses `--wait`: a duration or `forever`.
pub fn parse_wait(s: &str) -> Result<Wait, String> {
    if s.trim().eq_ignore_ascii_case("forever") {
        Ok(Wait::Forever)
    } else {
        parse_duration(s).map(Wait::For)
    }
}

/// Parses a duration: one or more `<integer><unit>` parts with units `ms`, `s`, `m`, `h`, `d`
/// (`1h30m`), or a bare `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    let bad = |why: &str| {
        format!("invalid duration {text:?}: {why} (examples: 500ms, 30s, 5m, 1h, 1m30s)")
    };
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad("it is empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad("expected a whole number before each unit"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| bad("the number is too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(|| bad("too large"))?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(|| bad("too large"))?),
            "d" => Duration::from_secs(n.checked_mul(86_400).ok_or_else(|| bad("too large"))?),
            "" => return Err(bad("a number needs a unit (ms, s, m, h or d)")),
            _ => return Err(bad(&format!("unknown unit {unit:?}"))),
        };
        total = total
            .checked_add(part)
            .ok_or_else(|| bad("it is too large"))?;
    }
    Ok(total)
}

/// A duration as the parser would accept it, for messages.
pub fn show(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0".into()
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_combinations() {
        let cases = [
            ("0", 0),
            ("500ms", 500),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("2d", 172_800_000),
            ("1m30s", 90_000),
            (" 1h5m ", 3_900_000),
            ("0s", 0),
            ("1s500ms", 1500),
        ];
        for (text, ms) in cases {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
    }

    #[test]
    fn rejects_garbage_clearly() {
        for text in [
            "",
            "10",
            "s",
            "5x",
            "-1s",
            "1.5s",
            "forever",
            "1 s",
            "30 s",
            "ms",
            "1sm",
            "99999999999999999999s",
            "18446744073709551615d",
        ] {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains("invalid duration"), "{text}: {err}");
            assert!(err.contains("examples"), "{text}: {err}");
        }
        assert!(parse_duration("10").unwrap_err().contains("needs a unit"));
        assert!(
            parse_duration("5x")
                .unwrap_err()
                .contains("unknown unit \"x\"")
        );
    }

    #[test]
    fn wait_values() {
        assert_eq!(parse_wait("forever"), Ok(Wait::Forever));
        assert_eq!(parse_wait("FOREVER"), Ok(Wait::Forever));
        assert_eq!(parse_wait("0"), Ok(Wait::For(Duration::ZERO)));
        assert_eq!(parse_wait("10s"), Ok(Wait::For(Duration::from_secs(10))));
        assert!(parse_wait("never").is_err());
    }

    #[test]
    fn shows_durations() {
        assert_eq!(show(Duration::from_secs(3600)), "1h");
        assert_eq!(show(Duration::from_secs(90)), "90s");
        assert_eq!(show(Duration::from_millis(1500)), "1500ms");
        assert_eq!(show(Duration::ZERO), "0");
    }
}
