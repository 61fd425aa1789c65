//! The parse cost model of the line codec (`src/jsonrpc/cost.rs`), measured: each shape of line
//! an agent could send is parsed into `serde_json::Value` (what a message's params and result
//! become) under a counting allocator, and the peak of what the parse held, with the allocator's
//! own header on every allocation, must stay within the estimate the codec refuses lines by.
#![allow(clippy::expect_used)] // test code: a failed expectation is the test failing

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kandev_operator::jsonrpc::cost;

/// glibc's malloc: a 16-byte header on every chunk, chunks in steps of 16, at least 32.
fn chunk(size: usize) -> usize {
    (size + 8).div_ceil(16).max(2) * 16
}

struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only the counters are ours.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let held = HELD.fetch_add(chunk(layout.size()), Ordering::Relaxed) + chunk(layout.size());
        PEAK.fetch_max(held, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: ptr came from alloc/realloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A realloc may copy: the old and the new block are held at once.
        let held = HELD.fetch_add(chunk(new_size), Ordering::Relaxed) + chunk(new_size);
        PEAK.fetch_max(held, Ordering::Relaxed);
        // SAFETY: as GlobalAlloc::realloc requires, passed on.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        HELD.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What parsing `line` into a `Value` held at its peak, beyond what was held before.
fn parse_peak(line: &[u8]) -> usize {
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let value: Result<serde_json::Value, _> = serde_json::from_slice(line);
    let peak = PEAK.load(Ordering::Relaxed) - before;
    drop(value);
    peak
}

fn shapes(n: usize) -> Vec<(&'static str, String)> {
    vec![
        ("zeros", format!("[{}0]", "0,".repeat(n))),
        ("small objects", format!("[{}{{}}]", "{\"a\":0},".repeat(n))),
        ("objects of many keys", format!("{{{}\"z\":0}}", (0..n).map(|i| format!("\"k{i}\":0,")).collect::<String>())),
        ("empty arrays", format!("[{}[]]", "[],".repeat(n))),
        ("empty strings", format!("[{}\"\"]", "\"\",".repeat(n))),
        ("short strings", format!("[{}\"x\"]", "\"abcdefghijklmnopqrstuvw\",".repeat(n))),
        ("nesting 100 deep", format!("[{}0]", format!("{}0{},", "[".repeat(100), "]".repeat(100)).repeat(n / 100 + 1))),
        ("nested objects", format!("[{}0]", format!("{}0{},", "{\"a\":[".repeat(50), "]}".repeat(50)).repeat(n / 100 + 1))),
        ("one-value arrays", format!("[{}0]", "[0],".repeat(n))),
        ("acp updates", format!("[{}0]", "{\"sessionUpdate\":\"agent_message_chunk\",\"content\":{\"type\":\"text\",\"text\":\"hello\"}},".repeat(n / 4))),
    ]
}

/// Each shape at several sizes: its parse never holds more than the codec's estimate (without
/// the line's own buffer, which the caller holds already). Prints the measured bytes per value.
#[test]
fn every_shape_parses_within_the_estimate() {
    let mut worst = 0.0f64;
    for n in [1_000, 10_000, 100_000, 300_000] {
        for (shape, line) in shapes(n) {
            let count = cost::count(line.as_bytes());
            let values = count.values;
            let peak = parse_peak(line.as_bytes());
            let estimate = cost::cost(line.len(), count) - line.len();
            let per_value = (peak.saturating_sub(line.len())) as f64 / values as f64;
            worst = worst.max(per_value);
            eprintln!(
                "{shape:>22} n={n:>7}: {:>9} bytes, {values:>8} values, parse peak {peak:>10} = {:.1}× the line, {per_value:.1} B/value beyond the text; estimate {estimate}",
                line.len(),
                peak as f64 / line.len() as f64,
            );
            assert!(
                peak <= estimate,
                "{shape} n={n}: the parse held {peak} bytes, more than the estimate {estimate}"
            );
        }
    }
    eprintln!(
        "worst: {worst:.1} bytes per value beyond the text (VALUE_COST {}, CONTAINER_COST {})",
        cost::VALUE_COST,
        cost::CONTAINER_COST
    );
}

/// The estimate's derivation still holds for this build's `serde_json`: a value in an array at
/// the moment the array doubles is held three times (the old and the new buffer).
#[test]
fn a_value_costs_what_the_model_says() {
    let value = std::mem::size_of::<serde_json::Value>();
    assert!(
        3 * value <= cost::VALUE_COST,
        "serde_json::Value is {value} bytes: VALUE_COST must be at least three of them"
    );
}
