//! What a line will cost once it is parsed, read from its bytes before anyone parses it.
//!
//! A line's bytes are bounded by the codec's limit, but what parsing makes of them is not: a
//! parsed value (`serde_json::Value`, 72 bytes, in a vector that grows by doubling, or a map
//! entry with its key) costs far more than the one or two bytes `0,` it was written as. An agent
//! that answers with a 7 MiB array of zeros would make a 7 MiB line cost some 380 MiB. So the
//! codec counts a line's values in one pass over its bytes (no allocation) and refuses a line
//! whose parse would cost more than [`COST_MULTIPLE`] times the line limit: the most that the
//! memory budget reserves for one line (`acp::budget`).
//!
//! The cost of a line is its buffer, a copy of its text (strings and keys are copied out),
//! [`VALUE_COST`] bytes for every value (object, array, string, key, number, literal) and
//! [`CONTAINER_COST`] more for every object and array. The figures are measured, not assumed:
//! `tests/parse_cost.rs` parses dense arrays, many small objects, deep nesting, wide objects and
//! ACP-shaped lines under a counting allocator and checks that none costs more than this
//! estimate.

/// Bytes that one parsed JSON value costs beyond its text, at the peak of its parse: a
/// `serde_json::Value` (72 bytes with `preserve_order`, which this crate relies on) in a vector
/// at the moment it doubles (the old and the new buffer: 3 × 72), and a little for the
/// allocator's headers.
pub const VALUE_COST: usize = 224;

/// Bytes that an object or an array costs beyond [`VALUE_COST`]: its first allocation, which
/// has room for several entries however few it holds (an array's four values, an object's
/// three entries of hash, key and value, and its index table).
pub const CONTAINER_COST: usize = 384;

/// A line may cost at most this many times the line limit once parsed, its own buffer included:
/// what the memory budget reserves for each line of a connection.
pub const COST_MULTIPLE: usize = 3;

/// What a JSON text will be parsed into, counted without parsing it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// Objects, arrays, strings, object keys, numbers and literals.
    pub values: usize,
    /// Objects and arrays (counted in `values` too).
    pub containers: usize,
}

/// Counts the values of a JSON text in one pass over its bytes; for a text that is not JSON,
/// about as many as a parser would have built before it gave up.
pub fn count(line: &[u8]) -> Count {
    let mut count = Count::default();
    let mut in_string = false;
    let mut escaped = false;
    let mut in_scalar = false;
    for &b in line {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                in_scalar = false;
                count.values += 1;
            }
            b'{' | b'[' => {
                in_scalar = false;
                count.values += 1;
                count.containers += 1;
            }
            b'}' | b']' | b',' | b':' | b' ' | b'\t' | b'\r' | b'\n' => in_scalar = false,
            _ if !in_scalar => {
                in_scalar = true;
                count.values += 1;
            }
            _ => {}
        }
    }
    count
}

/// The estimated peak cost of parsing a line of `len` bytes holding `count`, its buffer
/// included.
pub fn cost(len: usize, count: Count) -> usize {
    len.saturating_mul(2)
        .saturating_add(count.values.saturating_mul(VALUE_COST))
        .saturating_add(count.containers.saturating_mul(CONTAINER_COST))
}

/// Below this, a line's parse is cheap whatever its limit (the limits of the wire are 1 MiB and
/// more; small ones are for tests).
pub const MIN_BOUND: usize = 64 * 1024;

/// The most a line read under `limit` may cost to parse.
pub fn bound(limit: usize) -> usize {
    limit.saturating_mul(COST_MULTIPLE).max(MIN_BOUND)
}

/// `Some(cost)` when `line`, read under `limit`, would cost more than [`bound`] to parse. A line
/// too short to reach the bound even if it were nothing but nested arrays is not scanned at all.
pub fn too_costly(line: &[u8], limit: usize) -> Option<usize> {
    // A value takes at least one byte and one separator (an array `[` and its `]`).
    let most = line.len() / 2 + 1;
    let worst = Count {
        values: most,
        containers: most,
    };
    if cost(line.len(), worst) <= bound(limit) {
        return None;
    }
    let cost = cost(line.len(), count(line));
    (cost > bound(limit)).then_some(cost)
}

/// `bytes` in MiB with one decimal, for messages (`798.0 MiB`).
pub fn in_mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_as_a_parser_would_build_them() {
        #[rustfmt::skip]
        let rows: Vec<(&str, usize, usize)> = vec![
            ("", 0, 0),
            ("0", 1, 0),
            ("[]", 1, 1),
            ("[0,0,0]", 4, 1),
            ("[ 0 , -1.5e3 , true , null ]", 5, 1),
            ("{\"a\":0}", 3, 1),
            ("{\"a\": {\"b\": [1, \"x\"]}}", 7, 3),
            ("\"a,b:[{\"", 1, 0),
            ("\"esc \\\" [0,0] \\\\\" ", 1, 0),
            ("[\"\\\\\",0]", 3, 1),
            ("[[[[]]]]", 4, 4),
            ("{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"sessionId\":\"s\"}}", 9, 2),
            ("not json at all", 4, 0),
        ];
        for (line, values, containers) in rows {
            assert_eq!(
                count(line.as_bytes()),
                Count { values, containers },
                "{line:?}"
            );
        }
    }

    #[test]
    fn dense_lines_are_refused_and_text_passes() {
        let limit = 1 << 20;
        let zeros = format!("[{}0]", "0,".repeat(200_000));
        assert!(
            too_costly(zeros.as_bytes(), limit).is_some(),
            "400 KB of zeros"
        );
        let objects = format!("[{}{{}}]", "{\"a\":0},".repeat(40_000));
        assert!(
            too_costly(objects.as_bytes(), limit).is_some(),
            "small objects"
        );
        let deep = format!("{}{}", "[".repeat(300_000), "]".repeat(300_000));
        assert!(too_costly(deep.as_bytes(), limit).is_some(), "deep nesting");
        let text = format!("{{\"text\":\"{}\"}}", "x".repeat(limit - 20));
        assert_eq!(
            too_costly(text.as_bytes(), limit),
            None,
            "a full line of text"
        );
        // A realistic dense line: 300 KB of file paths, one value per 37 bytes.
        let paths = format!(
            "[{}\"end\"]",
            "\"src/controller/reconcile/launch.rs\",".repeat(8_000)
        );
        assert!(paths.len() < limit);
        assert_eq!(too_costly(paths.as_bytes(), limit), None, "file paths");
    }

    #[test]
    fn short_lines_are_not_scanned() {
        let limit = 1 << 20;
        // Even nothing but arrays would fit: the quick bound lets it through unscanned.
        let short = "[],".repeat(1_000);
        let most = short.len() / 2 + 1;
        let worst = Count {
            values: most,
            containers: most,
        };
        assert!(cost(short.len(), worst) <= bound(limit));
        assert_eq!(too_costly(short.as_bytes(), limit), None);
    }

    #[test]
    fn messages_give_mib() {
        assert_eq!(in_mib(836_761_664), "798.0 MiB");
        assert_eq!(in_mib(bound(8 * 1024 * 1024)), "24.0 MiB");
        assert_eq!(in_mib(MIN_BOUND), "0.1 MiB");
    }
}
