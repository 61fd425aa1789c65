//! RFC 3339 timestamps for events and history entries, without a date-time dependency: the
//! supervisor only ever needs "now, in UTC, to the millisecond".

use std::time::{SystemTime, UNIX_EPOCH};

/// The current UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`. A clock before 1970 (a broken node)
/// yields the epoch rather than a panic.
pub fn now_rfc3339() -> String {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_unix_millis(since_epoch.as_millis())
}

/// Formats milliseconds since the Unix epoch as an RFC 3339 UTC timestamp.
pub fn format_unix_millis(millis: u128) -> String {
    let total_secs = millis / 1000;
    let ms = millis % 1000;
    let days = (total_secs / 86_400) as i64;
    let secs_of_day = total_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        secs_of_day / 3600,
        (secs_of_day % 3600) / 60,
        secs_of_day % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day), after Howard Hinnant's
/// `civil_from_days` algorithm.
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

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn known_instants() {
        // (millis since epoch, expected)
        let rows: [(u128, &str); 5] = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"), // leap day of a 400-year leap year
            (1_709_251_199_999, "2024-02-29T23:59:59.999Z"),
            (1_735_689_600_123, "2025-01-01T00:00:00.123Z"),
            (4_102_444_800_000, "2100-01-01T00:00:00.000Z"),
        ];
        for (millis, expected) in rows {
            assert_eq!(format_unix_millis(millis), expected);
        }
    }

    #[test]
    fn now_has_the_rfc3339_shape() {
        let now = now_rfc3339();
        assert_eq!(now.len(), 24, "{now}");
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T', "{now}");
    }
}
