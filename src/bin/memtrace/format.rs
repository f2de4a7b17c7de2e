//! Text formatting shared by every output: byte sizes, percentages, times and dates, and
//! escaping for XML/HTML markup.

use memtrace_rs::trace::Timestamp;

/// A byte count in binary units with one decimal (`0 B`, `812 B`, `1.5 KiB`, `3.2 GiB`).
/// Beyond 1024 EiB it is written in scientific notation (`1.2e30 B`); an infinite count is
/// `inf B` and NaN is `n/a`.
pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if b.is_nan() {
        return "n/a".to_string();
    }
    if b.is_infinite() {
        return format!("{b} B");
    }
    let magnitude = b.abs();
    if magnitude < 1024.0 {
        return format!("{:.0} B", b);
    }
    let mut value = b / 1024.0;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.abs() >= 1024.0 {
        return format!("{b:.1e} B");
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// An estimate as a whole number (`1572864`), in scientific notation from 10^18 on
/// (`1.2e300`) so that absurd estimates stay short; `inf` when infinite, `NaN` for NaN.
pub fn whole(v: f64) -> String {
    if v.is_finite() && v.abs() >= 1e18 {
        format!("{v:e}")
    } else {
        format!("{v:.0}")
    }
}

/// A signed byte difference: `+1.5 KiB`, `-812 B`, `0 B`.
pub fn signed_bytes(b: f64) -> String {
    if b > 0.0 {
        format!("+{}", bytes(b))
    } else {
        bytes(b)
    }
}

/// `part` as a percentage of `whole` with two decimals; `-` when `whole` is zero or the
/// ratio is not a finite number (e.g. both infinite).
pub fn percent(part: f64, whole: f64) -> String {
    let ratio = 100.0 * (part / whole);
    if whole == 0.0 || !ratio.is_finite() {
        "-".to_string()
    } else {
        format!("{ratio:.2}%")
    }
}

/// A duration in microseconds as seconds with six decimals (`1.234567 s`).
pub fn seconds(us: u64) -> String {
    format!("{}.{:06} s", us / 1_000_000, us % 1_000_000)
}

/// A timestamp (µs since the Unix epoch) as an ISO 8601 UTC date and time with microseconds.
pub fn utc(time: Timestamp) -> String {
    let secs = time / 1_000_000;
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:06} UTC",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60,
        time % 1_000_000
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Escape `&`, `<`, `>`, `"` and `'` for XML and HTML text and attribute values.
pub fn escape_markup(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_units() {
        assert_eq!(bytes(0.0), "0 B");
        assert_eq!(bytes(1023.4), "1023 B");
        assert_eq!(bytes(1536.0), "1.5 KiB");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
        assert_eq!(signed_bytes(-2048.0), "-2.0 KiB");
        assert_eq!(signed_bytes(2048.0), "+2.0 KiB");
        assert_eq!(bytes(1023.0 * 1024f64.powi(6)), "1023.0 EiB");
        assert_eq!(bytes(2e30), "2.0e30 B");
        assert_eq!(bytes(-2e30), "-2.0e30 B");
        assert_eq!(bytes(f64::MAX), "1.8e308 B");
        assert_eq!(bytes(f64::INFINITY), "inf B");
        assert_eq!(signed_bytes(f64::INFINITY), "+inf B");
        assert_eq!(bytes(f64::NEG_INFINITY), "-inf B");
        assert_eq!(bytes(f64::NAN), "n/a");
        assert_eq!(whole(1_572_864.4), "1572864");
        assert_eq!(whole(1.5e300), "1.5e300");
        assert_eq!(whole(f64::INFINITY), "inf");
    }

    #[test]
    fn dates_and_times() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000000 UTC");
        assert_eq!(utc(1_586_965_711_174_340), "2020-04-15 15:48:31.174340 UTC");
        assert_eq!(utc(951_782_400_000_000), "2000-02-29 00:00:00.000000 UTC");
        assert_eq!(seconds(851_795), "0.851795 s");
        assert_eq!(percent(1.0, 0.0), "-");
        assert_eq!(percent(1.0, 3.0), "33.33%");
        assert_eq!(percent(f64::INFINITY, f64::INFINITY), "-");
        assert_eq!(percent(1.0, 1e-320), "-");
    }

    #[test]
    fn markup() {
        assert_eq!(escape_markup("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
