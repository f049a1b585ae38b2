//! Cron expressions: parsing (with errors that name the field) and the next scheduled time after
//! an instant, in an IANA time zone, through daylight-saving changes.
//!
//! Times are matched in civil (wall-clock) time of the zone and then mapped to instants:
//! - a civil time that occurs twice (fall-back) maps to its first occurrence only, so nothing
//!   fires twice on that day;
//! - a civil time that does not exist (spring-forward) maps to the first instant after the gap
//!   (03:00 for a 02:30 job in Europe/Berlin), so a daily job still runs that day; the several
//!   times of the gap and the time at its end collapse into that one firing.
//!
//! This mapping is monotonic (a later civil time never maps to an earlier instant), which is what
//! makes "the first matching civil time whose instant is after `t`" the next firing.

use std::fmt;

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ToSpan};

/// How far ahead the next firing is looked for. A valid schedule fires at least every 8 years
/// (29 February in a century year that is not a leap year); 100 years leaves room for day-of-week
/// intersections and bounds the work.
const HORIZON_YEARS: i16 = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

/// One field of an expression: its name, value range and names for values.
#[derive(Debug, Clone, Copy)]
struct Field {
    name: &'static str,
    min: u8,
    max: u8,
    names: &'static [&'static str],
    /// `?` means `*` here (day fields only, as in Quartz).
    question_mark: bool,
}

const SECOND: Field = Field {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
    question_mark: false,
};
const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
    question_mark: false,
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
    question_mark: false,
};
const DAY_OF_MONTH: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
    question_mark: true,
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
    question_mark: false,
};
/// 0-7 where both 0 and 7 are Sunday; 7 is folded onto 0 after parsing.
const DAY_OF_WEEK: Field = Field {
    name: "day of week",
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
    question_mark: true,
};

const MONTH_NAMES: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A parsed schedule in its time zone. Each field is a bit set of the values it matches.
#[derive(Debug, Clone)]
pub struct Schedule {
    seconds: u64,
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    /// Vixie cron: when either day field starts with `*`, a day must match both fields;
    /// otherwise it must match either.
    day_fields_intersect: bool,
    zone: TimeZone,
}

impl Schedule {
    /// Parses `expression` (5 or 6 fields, or a macro) in the IANA zone `time_zone`. The error
    /// names the field (`field 3 (day of month): 32 out of range 1-31`), and a schedule that can
    /// never fire (`0 0 31 2 *`) is an error too.
    pub fn parse(expression: &str, time_zone: &str) -> Result<Schedule, ParseError> {
        let zone = TimeZone::get(time_zone)
            .map_err(|_| ParseError(format!("timeZone: {time_zone:?} is not an IANA time zone")))?;
        let expanded = expand_macro(expression.trim())?;
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (layout, fields): (&[Field], &[&str]) = match fields.len() {
            5 => (&[MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK], &fields),
            6 => (
                &[SECOND, MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK],
                &fields,
            ),
            n => {
                return Err(ParseError(format!(
                    "expected 5 fields (minute hour day-of-month month day-of-week) or 6 (second \
                     first), got {n}"
                )));
            }
        };
        let mut sets = Vec::with_capacity(6);
        for (index, (field, text)) in layout.iter().zip(fields).enumerate() {
            let set = parse_field(text, field)
                .map_err(|e| ParseError(format!("field {} ({}): {e}", index + 1, field.name)))?;
            sets.push(set);
        }
        let offset = fields.len() - 5;
        let seconds = if offset == 1 { sets[0] } else { 1 };
        let mut days_of_week = sets[offset + 4];
        if days_of_week & (1 << 7) != 0 {
            days_of_week = (days_of_week & !(1 << 7)) | 1;
        }
        let starts_with_star = |text: &str| text.starts_with('*') || text.starts_with('?');
        let schedule = Schedule {
            seconds,
            minutes: sets[offset],
            hours: sets[offset + 1],
            days_of_month: sets[offset + 2],
            months: sets[offset + 3],
            days_of_week,
            day_fields_intersect: starts_with_star(fields[offset + 2])
                || starts_with_star(fields[offset + 4]),
            zone,
        };
        schedule.check_some_day_exists(offset)?;
        Ok(schedule)
    }

    pub fn time_zone(&self) -> &TimeZone {
        &self.zone
    }

    /// The first scheduled instant strictly after `after`; `None` when there is none within the
    /// horizon (never for a schedule `parse` accepted, short of year 9999).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let start = after.to_zoned(self.zone.clone()).datetime();
        let start_time = Time::new(start.hour(), start.minute(), start.second(), 0).ok()?;
        let limit = start.date().checked_add(HORIZON_YEARS.years()).ok()?;
        let mut date = start.date();
        let mut from = start_time;
        while date <= limit {
            if !has(self.months, date.month() as u8) {
                date = date.first_of_month().checked_add(1.month()).ok()?;
                from = Time::midnight();
                continue;
            }
            if self.day_matches(date) {
                for time in self.times_from(from) {
                    let civil = date.to_datetime(time);
                    if let Some(instant) = self.instant(civil)
                        && instant > after
                    {
                        return Some(instant);
                    }
                }
            }
            date = date.tomorrow().ok()?;
            from = Time::midnight();
        }
        None
    }

    /// Whether the civil time matches every field (whole seconds; sub-seconds are ignored).
    pub fn matches(&self, civil: DateTime) -> bool {
        has(self.months, civil.month() as u8)
            && self.day_matches(civil.date())
            && has(self.hours, civil.hour() as u8)
            && has(self.minutes, civil.minute() as u8)
            && has(self.seconds, civil.second() as u8)
    }

    fn day_matches(&self, date: Date) -> bool {
        let dom = has(self.days_of_month, date.day() as u8);
        let dow = has(
            self.days_of_week,
            date.weekday().to_sunday_zero_offset() as u8,
        );
        if self.day_fields_intersect {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The matching times of day at or after `from`, ascending.
    fn times_from(&self, from: Time) -> impl Iterator<Item = Time> + '_ {
        let (h0, m0, s0) = (from.hour() as u8, from.minute() as u8, from.second() as u8);
        bits_from(self.hours, h0).flat_map(move |h| {
            let m_start = if h == h0 { m0 } else { 0 };
            bits_from(self.minutes, m_start).flat_map(move |m| {
                let s_start = if h == h0 && m == m0 { s0 } else { 0 };
                bits_from(self.seconds, s_start)
                    .filter_map(move |s| Time::new(h as i8, m as i8, s as i8, 0).ok())
            })
        })
    }

    /// The instant a civil time of the zone fires at: its first occurrence when it occurs twice,
    /// the end of the gap when it does not occur.
    fn instant(&self, civil: DateTime) -> Option<Timestamp> {
        match self.zone.to_ambiguous_timestamp(civil).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(civil).ok(),
            AmbiguousOffset::Fold { before, .. } => before.to_timestamp(civil).ok(),
            AmbiguousOffset::Gap { after, .. } => {
                // Read with the later offset the civil time lies before the transition; the
                // transition itself is the first instant after the gap.
                let inside = after.to_timestamp(civil).ok()?;
                self.zone
                    .following(inside)
                    .next()
                    .map(|transition| transition.timestamp())
            }
        }
    }

    /// When the day fields must both match, some allowed month must have an allowed day
    /// (`0 0 31 2 *` never fires). Otherwise every allowed weekday fires, so a day always exists.
    fn check_some_day_exists(&self, offset: usize) -> Result<(), ParseError> {
        if !self.day_fields_intersect {
            return Ok(());
        }
        let longest = |month: u8| match month {
            2 => 29,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let possible = (1..=12u8)
            .filter(|m| has(self.months, *m))
            .any(|m| (1..=longest(m)).any(|d| has(self.days_of_month, d)));
        if possible {
            return Ok(());
        }
        let days: Vec<String> = bits_from(self.days_of_month, 1)
            .map(|d| d.to_string())
            .collect();
        let months: Vec<&str> = bits_from(self.months, 1)
            .map(|m| MONTH_NAMES[m as usize - 1])
            .collect();
        Err(ParseError(format!(
            "field {} (day of month) and field {} (month): the schedule never fires, {} has no day {}",
            offset + 3,
            offset + 4,
            months.join(", "),
            days.join(", ")
        )))
    }
}

fn expand_macro(expression: &str) -> Result<String, ParseError> {
    if !expression.starts_with('@') {
        return Ok(expression.to_owned());
    }
    let expanded = match expression.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => {
            return Err(ParseError(format!(
                "unknown macro {expression:?} (known: @yearly, @annually, @monthly, @weekly, \
                 @daily, @midnight, @hourly)"
            )));
        }
    };
    Ok(expanded.to_owned())
}

fn has(set: u64, value: u8) -> bool {
    value < 64 && set & (1 << value) != 0
}

/// The members of `set` from `from` on, ascending.
fn bits_from(set: u64, from: u8) -> impl Iterator<Item = u8> {
    let mut rest = if from >= 64 {
        0
    } else {
        set & (u64::MAX << from)
    };
    std::iter::from_fn(move || {
        if rest == 0 {
            return None;
        }
        let bit = rest.trailing_zeros() as u8;
        rest &= rest - 1;
        Some(bit)
    })
}

/// A comma-separated list of `*`, `?`, values, ranges and steps.
fn parse_field(text: &str, field: &Field) -> Result<u64, String> {
    let mut set = 0u64;
    for item in text.split(',') {
        if item.is_empty() {
            return Err(format!("empty list item in {text:?}"));
        }
        set |= parse_item(item, field)?;
    }
    Ok(set)
}

fn parse_item(item: &str, field: &Field) -> Result<u64, String> {
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => {
            let step: u8 = step
                .parse()
                .map_err(|_| format!("step {step:?} is not a number"))?;
            if step == 0 {
                return Err("step 0".into());
            }
            if step > field.max {
                return Err(format!(
                    "step {step} is larger than the field's range {}-{}",
                    field.min, field.max
                ));
            }
            (range, Some(step))
        }
        None => (item, None),
    };
    // Sunday as 7 is folded onto 0 later; `*` for day of week spans 0-6.
    let top = if field.name == DAY_OF_WEEK.name {
        6
    } else {
        field.max
    };
    let (low, high) = if range == "*" || (range == "?" && field.question_mark) {
        (field.min, top)
    } else if range == "?" {
        return Err("`?` is only allowed in the day-of-month and day-of-week fields".into());
    } else if let Some((low, high)) = range.split_once('-') {
        let (low, high) = (value(low, field)?, value(high, field)?);
        if low > high {
            return Err(format!("range {low}-{high} goes backwards"));
        }
        (low, high)
    } else {
        let low = value(range, field)?;
        // `5/15` means `5-<max>/15`.
        (low, if step.is_some() { top.max(low) } else { low })
    };
    let step = step.unwrap_or(1);
    let mut set = 0u64;
    let mut v = low;
    loop {
        set |= 1 << v;
        match v.checked_add(step) {
            Some(next) if next <= high => v = next,
            _ => break,
        }
    }
    Ok(set)
}

fn value(text: &str, field: &Field) -> Result<u8, String> {
    if let Some(index) = field
        .names
        .iter()
        .position(|name| name.eq_ignore_ascii_case(text))
    {
        // Month names start at 1 (JAN), weekday names at 0 (SUN): the field's minimum.
        return Ok(index as u8 + field.min);
    }
    let number: u32 = text.parse().map_err(|_| {
        if field.names.is_empty() {
            format!("{text:?} is not a number")
        } else {
            format!(
                "{text:?} is neither a number nor one of {}",
                field.names.join(", ")
            )
        }
    })?;
    if number < u32::from(field.min) || number > u32::from(field.max) {
        return Err(format!("{number} out of range {}-{}", field.min, field.max));
    }
    Ok(number as u8)
}
