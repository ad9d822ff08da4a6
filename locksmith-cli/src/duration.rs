//! Human durations for the command line: `500ms`, `30s`, `5m`, `1h`, `1d`, combined (`1m30s`),
//! with fractions (`1.5s`), and bare seconds (`0.5`, `30`).

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

/// Parses a duration: one or more `<number><unit>` parts with units `ms`, `s`, `m`, `h`, `d`
/// (`1h30m`), where a number may have a fraction (`1.5s`, `0.25h`); or a bare number of
/// seconds (`0.5`, `30`), as `flock -w` and `sleep` take it.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    let bad = |why: &str| {
        format!("invalid duration {text:?}: {why} (examples: 0.5, 30, 500ms, 1.5s, 5m, 1h, 1m30s)")
    };
    if text.is_empty() {
        return Err(bad("it is empty"));
    }
    let number_len = |s: &str| {
        s.find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len())
    };
    if number_len(text) == text.len() {
        // A bare number: seconds.
        return nanos(text, 1_000_000_000).ok_or_else(|| bad("not a number of seconds"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = number_len(rest);
        if digits == 0 {
            return Err(bad("expected a number before each unit"));
        }
        let number = &rest[..digits];
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let unit_nanos: u128 = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            _ => return Err(bad(&format!("unknown unit {unit:?}"))),
        };
        let part = nanos(number, unit_nanos).ok_or_else(|| bad("not a number, or too large"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| bad("it is too large"))?;
    }
    Ok(total)
}

/// `number` (digits with at most one `.` and at most 9 fraction digits) times `unit` nanoseconds,
/// exactly; `None` when malformed or too large for a `Duration`.
fn nanos(number: &str, unit: u128) -> Option<Duration> {
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && frac.is_empty())
        || frac.len() > 9
        || !whole
            .bytes()
            .chain(frac.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let scale = 10u128.pow(u32::try_from(frac.len()).ok()?);
    let total = whole
        .checked_mul(unit)?
        .checked_add(frac_value.checked_mul(unit)? / scale)?;
    let secs = u64::try_from(total / 1_000_000_000).ok()?;
    Some(Duration::new(
        secs,
        u32::try_from(total % 1_000_000_000).ok()?,
    ))
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
            // Fractions and bare seconds, as flock -w and sleep take them.
            ("0.5", 500),
            ("30", 30_000),
            ("1.5s", 1500),
            (".25s", 250),
            ("0.1", 100),
            ("1.5m", 90_000),
            ("0.5h1.5s", 1_801_500),
            ("2.", 2000),
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
            "s",
            "5x",
            "-1s",
            "-1",
            ".",
            "1..5s",
            "1.2.3",
            "1.0000000001s",
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
