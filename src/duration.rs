//! Checked conversion of a number of seconds (from a goal file, a tool's config or a provider's
//! header) into a [`Duration`], and of an age as people write it (`30d`, `12h`, `45m`, `10s`:
//! retention in the config and on the command line) into milliseconds.
//!
//! It only converts and bounds; it does not decide defaults or what a limit means. Every
//! float-to-duration conversion on input goes through [`seconds`], so no input can panic
//! `Duration::from_secs_f64` or overflow an `Instant` later.

use std::time::Duration;

/// The largest number of seconds accepted anywhere (one year). Larger values are almost
/// certainly mistakes and would overflow clocks when added to `Instant::now()`.
pub const MAX_SECONDS: f64 = 366.0 * 24.0 * 3600.0;

/// A number of seconds that cannot be a duration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{field} must be a non-negative number of seconds no larger than {max} (one year), found {shown}",
    max = MAX_SECONDS,
    shown = show(*.value)
)]
pub struct DurationError {
    /// The field the number came from (`limits.timeout_s`, `tools[2]._http.timeout_s`...).
    pub field: String,
    /// The number found.
    pub value: f64,
}

crate::codes::has_code!(DurationError);

impl DurationError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        "duration.out_of_range"
    }
}

/// A number as a person would write it: `1e300` rather than three hundred digits.
pub fn show(v: f64) -> String {
    if v.is_finite() && v.abs() >= 1e9 {
        format!("{v:e}")
    } else {
        v.to_string()
    }
}

/// Converts `v` seconds read from `field` into a duration: refuses negative, NaN, infinite and
/// values above [`MAX_SECONDS`].
pub fn seconds(field: &str, v: f64) -> Result<Duration, DurationError> {
    let err = || DurationError {
        field: field.to_string(),
        value: v,
    };
    if !(0.0..=MAX_SECONDS).contains(&v) {
        return Err(err());
    }
    Duration::try_from_secs_f64(v).map_err(|_| err())
}

/// An age that cannot be read (`cli.bad_duration` on the command line, `config.invalid` in a
/// config file).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{text}` is not an age: write a whole number and a unit, e.g. 30d, 12h, 45m, 10s (at most {max_days} days)", max_days = MAX_AGE_DAYS)]
pub struct AgeError {
    /// What was written.
    pub text: String,
}

/// The longest age accepted, in days (a hundred years).
pub const MAX_AGE_DAYS: u64 = 36_500;

/// `30d`, `12h`, `45m`, `10s` (a whole number and one unit) as milliseconds; anything else,
/// or more than [`MAX_AGE_DAYS`], is refused.
pub fn age_ms(text: &str) -> Result<u64, AgeError> {
    let bad = || AgeError {
        text: text.to_string(),
    };
    let (num, unit) = text.split_at(
        text.trim_end_matches(|c: char| c.is_ascii_alphabetic())
            .len(),
    );
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let per: u64 = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1000,
        _ => return Err(bad()),
    };
    n.checked_mul(per)
        .filter(|ms| *ms <= MAX_AGE_DAYS * 86_400_000)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_people_write_them_and_nothing_else() {
        assert_eq!(age_ms("30d"), Ok(30 * 86_400_000));
        assert_eq!(age_ms("12h"), Ok(12 * 3_600_000));
        assert_eq!(age_ms("45m"), Ok(45 * 60_000));
        assert_eq!(age_ms("0s"), Ok(0));
        for bad in [
            "",
            "d",
            "30",
            "30x",
            "-1d",
            "+1d",
            " 1d",
            "1.5d",
            "1d2h",
            "30D",
            "99999999999999999999d",
            "36501d",
            "soon",
        ] {
            assert_eq!(age_ms(bad), Err(AgeError { text: bad.into() }), "{bad}");
        }
    }

    #[test]
    fn accepts_the_range_and_refuses_the_rest() {
        assert_eq!(seconds("x", 1.5), Ok(Duration::from_millis(1500)));
        assert_eq!(seconds("x", 0.0), Ok(Duration::ZERO));
        assert_eq!(
            seconds("x", MAX_SECONDS),
            Ok(Duration::from_secs(31_622_400))
        );
        for bad in [
            -1.0,
            -0.001,
            1e300,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            let e = seconds("limits.timeout_s", bad).unwrap_err();
            assert!(e.to_string().starts_with("limits.timeout_s must be"), "{e}");
            assert!(e.to_string().len() < 140, "{e}");
        }
    }
}
