//! Bucket weights of a queue and the `weightSchedule` windows that override them and, where a
//! window says so, the queue's limits (DESIGN §4).
//!
//! A window is a wall-clock range in its own IANA time zone, `from` inclusive, `to` exclusive; `from`
//! later than `to` wraps midnight, `from == to` covers the whole day. Being wall-clock, a window follows
//! the zone's DST changes: "22:00"–"06:00" in Europe/Berlin is 21:00Z–05:00Z in winter and
//! 20:00Z–04:00Z in summer, and a boundary inside a skipped hour (spring forward) is crossed with the
//! jump. The first window (in list order) that contains the instant is in force; what it leaves out
//! (its weights, a limit) is the queue's own.

use std::collections::BTreeMap;
use std::fmt;

use jiff::Timestamp;
use jiff::civil::Time;
use jiff::tz::TimeZone;

use crate::api::Priority;

/// Relative dispatch shares of the four buckets. 0 = the bucket is dispatched only through max-wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weights {
    pub critical: u32,
    pub high: u32,
    pub normal: u32,
    pub low: u32,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            critical: 4,
            high: 3,
            normal: 2,
            low: 1,
        }
    }
}

impl Weights {
    pub fn of(&self, priority: Priority) -> u32 {
        match priority {
            Priority::Critical => self.critical,
            Priority::High => self.high,
            Priority::Normal => self.normal,
            Priority::Low => self.low,
        }
    }
}

/// The limits a window overrides; `None` (or a type it does not name) keeps the queue's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowLimits {
    pub concurrency: Option<u32>,
    pub type_concurrency: BTreeMap<String, u32>,
    pub retry_rate_per_minute: Option<u32>,
}

/// One `weightSchedule` entry, parsed and with its time zone resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightWindow {
    from: Time,
    to: Time,
    time_zone: TimeZone,
    /// The zone as the spec names it, for the status.
    time_zone_name: String,
    weights: Option<Weights>,
    limits: WindowLimits,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightWindowError {
    /// `from` or `to` is not a wall-clock time "HH:MM".
    InvalidTime { value: String },
    /// The time zone is not a known IANA name.
    UnknownTimeZone { name: String },
}

impl fmt::Display for WeightWindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidTime { value } => {
                write!(f, "weight window time {value:?} is not a time \"HH:MM\"")
            }
            Self::UnknownTimeZone { name } => {
                write!(
                    f,
                    "weight window time zone {name:?} is not a known IANA time zone"
                )
            }
        }
    }
}

impl std::error::Error for WeightWindowError {}

impl WeightWindow {
    /// Parses `from` and `to` ("HH:MM", 24-hour) and resolves `time_zone` (e.g. "Europe/Berlin").
    pub fn parse(
        from: &str,
        to: &str,
        time_zone: &str,
        weights: Weights,
    ) -> Result<Self, WeightWindowError> {
        Self::parse_with(from, to, time_zone, Some(weights), WindowLimits::default())
    }

    /// [`WeightWindow::parse`] for a window that may leave the weights alone and override limits.
    pub fn parse_with(
        from: &str,
        to: &str,
        time_zone: &str,
        weights: Option<Weights>,
        limits: WindowLimits,
    ) -> Result<Self, WeightWindowError> {
        let zone = TimeZone::get(time_zone).map_err(|_| WeightWindowError::UnknownTimeZone {
            name: time_zone.to_string(),
        })?;
        Ok(Self {
            from: parse_clock_time(from)?,
            to: parse_clock_time(to)?,
            time_zone: zone,
            time_zone_name: time_zone.to_string(),
            weights,
            limits,
        })
    }

    /// The window's own weights; `None`: the queue's weights stay in force inside it.
    pub fn weights(&self) -> Option<&Weights> {
        self.weights.as_ref()
    }

    pub fn limits(&self) -> &WindowLimits {
        &self.limits
    }

    /// `from`, `to` ("HH:MM") and the time zone as the spec gives them.
    pub fn describe(&self) -> (String, String, &str) {
        let clock = |t: Time| format!("{:02}:{:02}", t.hour(), t.minute());
        (clock(self.from), clock(self.to), &self.time_zone_name)
    }

    /// Whether the wall clock of the window's zone at `now` is inside the window.
    pub fn contains(&self, now: Timestamp) -> bool {
        let local = self.time_zone.to_datetime(now).time();
        if self.from < self.to {
            self.from <= local && local < self.to
        } else if self.from > self.to {
            local >= self.from || local < self.to
        } else {
            true
        }
    }
}

fn parse_clock_time(value: &str) -> Result<Time, WeightWindowError> {
    let invalid = || WeightWindowError::InvalidTime {
        value: value.to_string(),
    };
    let (hour, minute) = value.split_once(':').ok_or_else(invalid)?;
    let two_digits = |part: &str| part.len() == 2 && part.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(hour) || !two_digits(minute) {
        return Err(invalid());
    }
    let hour: i8 = hour.parse().map_err(|_| invalid())?;
    let minute: i8 = minute.parse().map_err(|_| invalid())?;
    Time::new(hour, minute, 0, 0).map_err(|_| invalid())
}

/// The index of the window in force at `now`: the first that contains it.
pub fn window_in_force(schedule: &[WeightWindow], now: Timestamp) -> Option<usize> {
    schedule.iter().position(|window| window.contains(now))
}

/// The weights in force at `now`: those of the first window containing it, else `base` (also when
/// that window sets no weights).
pub fn effective_weights<'a>(
    base: &'a Weights,
    schedule: &'a [WeightWindow],
    now: Timestamp,
) -> &'a Weights {
    window_in_force(schedule, now)
        .and_then(|index| schedule[index].weights())
        .unwrap_or(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(utc: &str) -> Timestamp {
        utc.parse().expect("valid test timestamp")
    }

    const NIGHT: Weights = Weights {
        critical: 1,
        high: 1,
        normal: 1,
        low: 10,
    };

    fn berlin(from: &str, to: &str) -> WeightWindow {
        WeightWindow::parse(from, to, "Europe/Berlin", NIGHT).expect("valid window")
    }

    fn assert_switches(window: &WeightWindow, last_outside: &str, first_inside: &str) {
        let base = Weights::default();
        let schedule = std::slice::from_ref(window);
        assert_eq!(
            effective_weights(&base, schedule, at(last_outside)),
            &base,
            "{last_outside}"
        );
        assert_eq!(
            effective_weights(&base, schedule, at(first_inside)),
            &NIGHT,
            "{first_inside}"
        );
    }

    fn assert_ends(window: &WeightWindow, last_inside: &str, first_outside: &str) {
        assert!(window.contains(at(last_inside)), "{last_inside}");
        assert!(!window.contains(at(first_outside)), "{first_outside}");
    }

    #[test]
    fn night_window_across_spring_forward() {
        // 2026-03-29 02:00 CET becomes 03:00 CEST: the window opens at +01:00 and closes at +02:00.
        let night = berlin("22:00", "06:00");
        assert_switches(&night, "2026-03-28T20:59:59Z", "2026-03-28T21:00:00Z");
        assert_ends(&night, "2026-03-29T03:59:59Z", "2026-03-29T04:00:00Z");
        // A fixed +01:00 offset would still be inside at 04:30Z.
        assert!(!night.contains(at("2026-03-29T04:30:00Z")));
    }

    #[test]
    fn night_window_across_fall_back() {
        // 2026-10-25 03:00 CEST becomes 02:00 CET: the window opens at +02:00 and closes at +01:00.
        let night = berlin("22:00", "06:00");
        assert_switches(&night, "2026-10-24T19:59:59Z", "2026-10-24T20:00:00Z");
        assert_ends(&night, "2026-10-25T04:59:59Z", "2026-10-25T05:00:00Z");
    }

    #[test]
    fn window_inside_the_skipped_hour_never_opens_that_night() {
        let skipped = berlin("02:00", "03:00");
        for utc in [
            "2026-03-29T00:30:00Z", // 01:30 CET
            "2026-03-29T00:59:59Z", // 01:59:59 CET
            "2026-03-29T01:00:00Z", // 03:00 CEST
        ] {
            assert!(!skipped.contains(at(utc)), "{utc}");
        }
        // The night before it is an ordinary hour.
        assert_ends(&skipped, "2026-03-28T01:59:59Z", "2026-03-28T02:00:00Z");
    }

    #[test]
    fn window_inside_the_repeated_hour_lasts_two_hours() {
        let repeated = berlin("02:00", "03:00");
        assert_switches(&repeated, "2026-10-24T23:59:59Z", "2026-10-25T00:00:00Z");
        assert!(repeated.contains(at("2026-10-25T01:30:00Z"))); // 02:30 CET, the second time
        assert_ends(&repeated, "2026-10-25T01:59:59Z", "2026-10-25T02:00:00Z");
    }

    #[test]
    fn daytime_window_and_whole_day_window() {
        let utc_day = WeightWindow::parse("09:00", "17:00", "UTC", NIGHT).expect("valid window");
        assert_switches(&utc_day, "2026-06-01T08:59:59Z", "2026-06-01T09:00:00Z");
        assert_ends(&utc_day, "2026-06-01T16:59:59Z", "2026-06-01T17:00:00Z");
        let all_day = WeightWindow::parse("00:00", "00:00", "UTC", NIGHT).expect("valid window");
        assert!(all_day.contains(at("2026-06-01T00:00:00Z")));
        assert!(all_day.contains(at("2026-06-01T23:59:59Z")));
    }

    #[test]
    fn first_matching_window_wins() {
        let evening = Weights {
            critical: 9,
            ..Weights::default()
        };
        let schedule = [
            WeightWindow::parse("18:00", "20:00", "UTC", evening).expect("valid window"),
            WeightWindow::parse("12:00", "23:00", "UTC", NIGHT).expect("valid window"),
        ];
        let base = Weights::default();
        assert_eq!(
            effective_weights(&base, &schedule, at("2026-06-01T19:00:00Z")),
            &evening
        );
        assert_eq!(
            effective_weights(&base, &schedule, at("2026-06-01T21:00:00Z")),
            &NIGHT
        );
        assert_eq!(
            effective_weights(&base, &schedule, at("2026-06-01T11:00:00Z")),
            &base
        );
    }

    #[test]
    fn a_window_without_weights_keeps_the_base_weights_and_still_wins() {
        let limits_only = WindowLimits {
            concurrency: Some(2),
            ..WindowLimits::default()
        };
        let schedule = [
            WeightWindow::parse_with("09:00", "17:00", "UTC", None, limits_only)
                .expect("valid window"),
            WeightWindow::parse("00:00", "00:00", "UTC", NIGHT).expect("valid window"),
        ];
        let base = Weights::default();
        let noon = at("2026-06-01T12:00:00Z");
        assert_eq!(window_in_force(&schedule, noon), Some(0));
        assert_eq!(effective_weights(&base, &schedule, noon), &base);
        assert_eq!(
            effective_weights(&base, &schedule, at("2026-06-01T18:00:00Z")),
            &NIGHT
        );
        assert_eq!(
            schedule[0].describe(),
            ("09:00".to_string(), "17:00".to_string(), "UTC")
        );
    }

    #[test]
    fn rejects_bad_times_and_zones() {
        for bad in ["24:00", "7:00", "07:60", "0700", "07:00:00", "", "ab:cd"] {
            assert_eq!(
                WeightWindow::parse(bad, "06:00", "UTC", NIGHT),
                Err(WeightWindowError::InvalidTime {
                    value: bad.to_string()
                }),
                "{bad:?}"
            );
        }
        assert_eq!(
            WeightWindow::parse("22:00", "06:00", "Mars/Olympus", NIGHT),
            Err(WeightWindowError::UnknownTimeZone {
                name: "Mars/Olympus".to_string()
            })
        );
    }
}
