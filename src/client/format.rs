//! Times and durations as both front ends show them (no client required): kubectl-style ages
//! and durations, UTC times, and the duration inputs (`10m`, `1h30m`, `600`).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::error::ClientError;

/// Shown for an empty cell.
pub const NONE: &str = "-";

/// kubectl's HumanDuration: `45s`, `3m12s`, `25m`, `5h3m`, `2d4h`, `400d`, `3y12d`.
pub fn human(d: SignedDuration) -> String {
    let seconds = d.as_secs();
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// How long ago `then` was, like kubectl's AGE column.
pub fn age(now: Timestamp, then: Timestamp) -> String {
    human(now.duration_since(then))
}

/// A future time as `in 5s`; a past one as `5s ago` (a due retry not yet picked up).
pub fn relative(now: Timestamp, then: Timestamp) -> String {
    let d = then.duration_since(now);
    if d.is_negative() {
        format!("{} ago", human(-d))
    } else {
        format!("in {}", human(d))
    }
}

/// A run time: tenths of a second below 10 s (`1.4s`), kubectl's style above.
pub fn run_time(d: SignedDuration) -> String {
    if d.is_negative() {
        return NONE.into();
    }
    if d.as_secs() < 10 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    human(d)
}

/// A time for tables: UTC, to the second (`2025-01-31T12:00:05Z`).
pub fn time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A duration flag: whole seconds (`600`) or a duration (`10m`, `1h30m`, `90s`).
pub fn parse_duration(flag: &str, text: &str) -> Result<Duration, ClientError> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let parsed: Result<SignedDuration, _> = text.parse();
    match parsed {
        Ok(d) if !d.is_negative() => Ok(d.unsigned_abs()),
        _ => Err(ClientError::Usage(format!(
            "--{flag} {text:?}: not a duration (use seconds like 600, or 90s, 10m, 1h30m)"
        ))),
    }
}

/// A duration flag in whole seconds, at least 1 (API fields count `*Seconds`).
pub fn parse_seconds(flag: &str, text: &str) -> Result<i64, ClientError> {
    let d = parse_duration(flag, text)?;
    let seconds = d.as_secs();
    if seconds == 0 || d.subsec_nanos() != 0 {
        return Err(ClientError::Usage(format!(
            "--{flag} {text:?}: must be a whole number of seconds, at least 1"
        )));
    }
    i64::try_from(seconds).map_err(|_| ClientError::Usage(format!("--{flag} {text:?}: too long")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: i64) -> SignedDuration {
        SignedDuration::from_secs(s)
    }

    #[test]
    fn human_durations_match_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (0, "0s"),
            (45, "45s"),
            (119, "119s"),
            (120, "2m"),
            (192, "3m12s"),
            (25 * 60, "25m"),
            (3 * 3600 + 3 * 60, "3h3m"),
            (5 * 3600, "5h"),
            (30 * 3600, "30h"),
            (2 * 86400 + 4 * 3600, "2d4h"),
            (400 * 86400, "400d"),
            (3 * 365 * 86400 + 12 * 86400, "3y12d"),
            (10 * 365 * 86400, "10y"),
        ];
        for (s, want) in cases {
            assert_eq!(human(secs(s)), want, "{s}s");
        }
    }

    #[test]
    fn relative_times_say_in_or_ago() {
        let now: Timestamp = "2025-01-01T00:00:00Z".parse().unwrap();
        let later: Timestamp = "2025-01-01T00:00:07Z".parse().unwrap();
        assert_eq!(relative(now, later), "in 7s");
        assert_eq!(relative(later, now), "7s ago");
        assert_eq!(age(later, now), "7s");
    }

    #[test]
    fn run_times_have_tenths_below_ten_seconds() {
        assert_eq!(run_time(SignedDuration::from_millis(1450)), "1.4s");
        assert_eq!(run_time(secs(75)), "75s");
        assert_eq!(run_time(secs(-1)), NONE);
    }

    #[test]
    fn duration_flags_take_seconds_or_units() {
        assert_eq!(
            parse_duration("timeout", "600").unwrap(),
            Duration::from_secs(600)
        );
        assert_eq!(
            parse_duration("timeout", "10m").unwrap(),
            Duration::from_secs(600)
        );
        assert_eq!(
            parse_duration("timeout", "1h30m").unwrap(),
            Duration::from_secs(5400)
        );
        assert!(parse_duration("timeout", "soon").is_err());
        assert!(parse_duration("timeout", "-5s").is_err());
        assert_eq!(parse_seconds("hard-timeout", "2m").unwrap(), 120);
        assert!(parse_seconds("hard-timeout", "0").is_err());
        assert!(parse_seconds("hard-timeout", "1.5s").is_err());
        let e = parse_duration("timeout", "soon").unwrap_err().to_string();
        assert!(e.contains("--timeout"), "{e}");
    }
}
