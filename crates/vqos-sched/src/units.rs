//! Parsing and printing of rates (`940Mbit`, `unlimited`), sizes (`64KiB`, `1500B`) and
//! durations (`30ms`, `2s`).
//!
//! Rates are decimal bits per second (`1Kbit` = 1 000 bit/s), as in `tc` and the papers. Sizes
//! are bytes: `KB`/`MB`/`GB` are decimal (1 000), `KiB`/`MiB`/`GiB` binary (1 024); units are
//! case-insensitive and a bare number is bytes.

use thiserror::Error;

/// Nanoseconds in one second.
pub const NS_PER_SEC: u64 = 1_000_000_000;

/// Why a rate or a duration could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UnitError {
    /// The text has no number in front of its unit.
    #[error("Invalid {what} '{text}': expected a number followed by a unit ({units})")]
    Malformed {
        /// "rate" or "duration".
        what: &'static str,
        /// The offending text.
        text: String,
        /// The units accepted.
        units: &'static str,
    },
    /// The value does not fit in 64 bits of the base unit.
    #[error("Invalid {what} '{text}': too large")]
    Overflow {
        /// "rate" or "duration".
        what: &'static str,
        /// The offending text.
        text: String,
    },
}

const RATE_UNITS: &str = "bit, Kbit, Mbit, Gbit, or 'unlimited'";
const TIME_UNITS: &str = "ns, us, ms, s, m, h";
const SIZE_UNITS: &str = "B, KB, MB, GB, KiB, MiB, GiB";

/// Splits `"12.5Mbit"` into `(12.5 as a decimal, "Mbit")`, parsing the number exactly as an
/// integer numerator over a power of ten so that `0.1Gbit` is exactly 100 000 000 bit/s.
fn split_decimal(text: &str) -> Option<(u128, u32, &str)> {
    let t = text.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    if num.is_empty() || num == "." {
        return None;
    }
    let mut parts = num.splitn(2, '.');
    let int = parts.next().unwrap_or("");
    let frac = parts.next().unwrap_or("");
    if frac.contains('.') || frac.len() > 9 {
        return None;
    }
    let digits = format!("{int}{frac}");
    let value: u128 = digits.parse().ok()?;
    Some((value, frac.len() as u32, unit.trim()))
}

fn scale(value: u128, frac_digits: u32, mult: u128) -> Option<u64> {
    let v = value.checked_mul(mult)? / 10u128.pow(frac_digits);
    u64::try_from(v).ok()
}

/// Parses a rate: `Some(bps)`, or `None` for `unlimited`.
///
/// A bare number is bits per second. `0` is a valid rate (no reservation).
pub fn parse_rate(text: &str) -> Result<Option<u64>, UnitError> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    let bad = || UnitError::Malformed {
        what: "rate",
        text: text.to_string(),
        units: RATE_UNITS,
    };
    let (value, frac, unit) = split_decimal(t).ok_or_else(bad)?;
    let mult: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "bit" | "bps" => 1,
        "kbit" => 1_000,
        "mbit" => 1_000_000,
        "gbit" => 1_000_000_000,
        _ => return Err(bad()),
    };
    scale(value, frac, mult)
        .map(Some)
        .ok_or_else(|| UnitError::Overflow {
            what: "rate",
            text: text.to_string(),
        })
}

/// Parses a size in bytes (`64KiB`, `1.5MB`, `1500`). Bits (`Kbit`) are refused: a size
/// is bytes.
pub fn parse_bytes(text: &str) -> Result<u64, UnitError> {
    let bad = || UnitError::Malformed {
        what: "size",
        text: text.to_string(),
        units: SIZE_UNITS,
    };
    let (value, frac, unit) = split_decimal(text).ok_or_else(bad)?;
    let mult: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" | "byte" | "bytes" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    scale(value, frac, mult).ok_or_else(|| UnitError::Overflow {
        what: "size",
        text: text.to_string(),
    })
}

/// Formats a size exactly, in the largest binary unit that divides it: `64KiB`, `1GiB`,
/// `1500B` (so that [`parse_bytes`] reads back the same number).
pub fn format_bytes(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes > 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// Parses a duration into nanoseconds. A bare number is seconds.
pub fn parse_duration_ns(text: &str) -> Result<u64, UnitError> {
    let bad = || UnitError::Malformed {
        what: "duration",
        text: text.to_string(),
        units: TIME_UNITS,
    };
    let (value, frac, unit) = split_decimal(text).ok_or_else(bad)?;
    let mult: u128 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "" | "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(bad()),
    };
    scale(value, frac, mult).ok_or_else(|| UnitError::Overflow {
        what: "duration",
        text: text.to_string(),
    })
}

/// Formats a rate for humans: `940Mbit`, `1.5Gbit`, `unlimited`.
pub fn format_rate(bps: Option<u64>) -> String {
    match bps {
        None => "unlimited".to_string(),
        Some(b) if b >= 1_000_000_000 && b % 1_000_000 == 0 => trim_float(b as f64 / 1e9, "Gbit"),
        Some(b) if b >= 1_000_000 => trim_float(b as f64 / 1e6, "Mbit"),
        Some(b) if b >= 1_000 => trim_float(b as f64 / 1e3, "Kbit"),
        Some(b) => format!("{b}bit"),
    }
}

fn trim_float(v: f64, unit: &str) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("940Mbit"), Ok(Some(940_000_000)));
        assert_eq!(parse_rate("0.1Gbit"), Ok(Some(100_000_000)));
        assert_eq!(parse_rate("1.5Kbit"), Ok(Some(1_500)));
        assert_eq!(parse_rate("0"), Ok(Some(0)));
        assert_eq!(parse_rate("unlimited"), Ok(None));
        assert_eq!(parse_rate(" 10 Mbit "), Ok(Some(10_000_000)));
        assert!(parse_rate("Mbit").is_err());
        assert!(parse_rate("10Mbyte").is_err());
        assert!(parse_rate("1.2.3Mbit").is_err());
        assert!(parse_rate("-5Mbit").is_err());
        assert!(matches!(
            parse_rate("99999999999999999999Gbit"),
            Err(UnitError::Overflow { .. })
        ));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64KiB"), Ok(65_536));
        assert_eq!(parse_bytes("64kib"), Ok(65_536));
        assert_eq!(parse_bytes("1.5MB"), Ok(1_500_000));
        assert_eq!(parse_bytes("1500"), Ok(1_500));
        assert_eq!(parse_bytes("1500 B"), Ok(1_500));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert!(parse_bytes("64Kbit").is_err());
        assert!(parse_bytes("-1KiB").is_err());
        assert!(matches!(
            parse_bytes("99999999999GiB"),
            Err(UnitError::Overflow { .. })
        ));
        assert_eq!(
            parse_bytes("5Mbit").unwrap_err().to_string(),
            "Invalid size '5Mbit': expected a number followed by a unit (B, KB, MB, GB, KiB, \
             MiB, GiB)"
        );
        for b in [0u64, 1, 1500, 65_536, 3 << 20, 1 << 30, (1 << 30) + 1] {
            assert_eq!(parse_bytes(&format_bytes(b)), Ok(b), "{b}");
        }
        assert_eq!(format_bytes(65_536), "64KiB");
        assert_eq!(format_bytes(1500), "1500B");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("30ms"), Ok(30_000_000));
        assert_eq!(parse_duration_ns("2s"), Ok(2_000_000_000));
        assert_eq!(parse_duration_ns("0.5s"), Ok(500_000_000));
        assert_eq!(parse_duration_ns("50us"), Ok(50_000));
        assert_eq!(parse_duration_ns("5min"), Ok(300_000_000_000));
        assert_eq!(parse_duration_ns("2m"), Ok(120_000_000_000));
        assert_eq!(parse_duration_ns("1h"), Ok(3_600_000_000_000));
        assert!(parse_duration_ns("5d").is_err());
    }

    #[test]
    fn format_roundtrip() {
        for r in [
            1u64,
            999,
            62_700_000,
            940_000_000,
            4_000_000_000,
            1_500_000_000,
        ] {
            let s = format_rate(Some(r));
            let back = parse_rate(&s).unwrap().unwrap();
            assert!(
                (back as f64 - r as f64).abs() / (r as f64) < 1e-3,
                "{r} -> {s}"
            );
        }
        assert_eq!(format_rate(None), "unlimited");
    }
}
