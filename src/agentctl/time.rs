//! RFC 3339 timestamps for events and history entries: "now, in UTC, to the millisecond", by
//! `jiff` (the date-time crate k8s-openapi already brings).

use jiff::Timestamp;

/// The current UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn now_rfc3339() -> String {
    format_timestamp(Timestamp::now())
}

/// Formats an instant as an RFC 3339 UTC timestamp with exactly three fractional digits.
pub fn format_timestamp(at: Timestamp) -> String {
    format!("{at:.3}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn known_instants() {
        // (millis since epoch, expected)
        let rows: [(i64, &str); 6] = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"), // leap day of a 400-year leap year
            (1_709_251_199_999, "2024-02-29T23:59:59.999Z"),
            (1_735_689_600_123, "2025-01-01T00:00:00.123Z"),
            (4_102_444_800_000, "2100-01-01T00:00:00.000Z"),
            (-1, "1969-12-31T23:59:59.999Z"), // a node clock before 1970 still formats
        ];
        for (millis, expected) in rows {
            let at = Timestamp::from_millisecond(millis).expect("in range");
            assert_eq!(format_timestamp(at), expected);
        }
    }

    #[test]
    fn now_has_the_rfc3339_shape_and_parses_back() {
        let now = now_rfc3339();
        assert_eq!(now.len(), 24, "{now}");
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T', "{now}");
        let parsed: Timestamp = now.parse().expect("RFC 3339");
        assert_eq!(format_timestamp(parsed), now);
    }
}
