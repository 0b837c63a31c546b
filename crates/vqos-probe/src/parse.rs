//! Parsing of the command line's durations and rates, with messages that say what is expected.

use std::time::Duration;

use crate::{ProbeError, MAX_RATE, MIN_INTERVAL};

fn invalid(msg: String) -> ProbeError {
    ProbeError::InvalidArgument(msg)
}

fn number(s: &str, what: &str, full: &str) -> Result<f64, ProbeError> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| invalid(format!("{what} `{full}`: `{s}` is not a number")))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(invalid(format!("{what} `{full}` must be positive")));
    }
    Ok(v)
}

/// Parses a duration with a unit: `10s`, `1.5s`, `500ms`, `250us` (or `µs`), `100ns`, `2m`,
/// `1h` — the workspace's one duration syntax (`vqos_sched::units::parse_duration_ns`), except
/// that a bare number is refused here (ambiguous on a command line) and so is zero.
pub fn parse_duration(s: &str) -> Result<Duration, ProbeError> {
    let t = s.trim();
    if !t.ends_with(|c: char| c.is_alphabetic()) {
        return Err(invalid(format!(
            "duration `{s}` needs a unit: ns, us, ms, s, m or h"
        )));
    }
    let ns = vqos_sched::units::parse_duration_ns(t).map_err(|e| invalid(e.to_string()))?;
    if ns == 0 {
        return Err(invalid(format!("duration `{s}` must be positive")));
    }
    Ok(Duration::from_nanos(ns))
}

/// Parses a rate `N/s` (or a bare `N`, per second) and returns the interval between requests.
/// N may be fractional (`0.5/s` = one request every 2 s) and at most [`MAX_RATE`].
pub fn parse_rate(s: &str) -> Result<Duration, ProbeError> {
    let t = s.trim();
    let num = t.strip_suffix("/s").unwrap_or(t);
    if num.contains('/') {
        return Err(invalid(format!(
            "rate `{s}`: only per second is supported, e.g. 1000/s"
        )));
    }
    let rate = number(num, "rate", s)?;
    if rate > MAX_RATE {
        return Err(invalid(format!(
            "rate `{s}` is above the maximum {MAX_RATE}/s"
        )));
    }
    Ok(Duration::from_nanos((1e9 / rate).round() as u64).max(MIN_INTERVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1ms").unwrap(), Duration::from_millis(1));
        assert_eq!(
            parse_duration(" 250us ").unwrap(),
            Duration::from_micros(250)
        );
        assert_eq!(parse_duration("250µs").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("100ns").unwrap(), Duration::from_nanos(100));
        for bad in ["", "10", "s", "0s", "-1s", "1x", "1..2s", "abc", "1e3s"] {
            let e = parse_duration(bad).unwrap_err().to_string();
            assert!(e.contains("duration"), "{bad}: {e}");
        }
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("1000/s").unwrap(), Duration::from_millis(1));
        assert_eq!(parse_rate("1000").unwrap(), Duration::from_millis(1));
        assert_eq!(parse_rate("0.5/s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_rate("1000000/s").unwrap(), Duration::from_micros(1));
        for bad in [
            "",
            "0",
            "0/s",
            "-5/s",
            "fast",
            "10/ms",
            "2000000/s",
            "inf/s",
            "NaN",
        ] {
            let e = parse_rate(bad).unwrap_err().to_string();
            assert!(e.contains("rate"), "{bad}: {e}");
        }
    }
}
