//! The bounded line codec on arbitrary bytes: the first two bytes choose the limit and the read
//! size, the rest is the stream. No panic, no kept line over the limit, and the stream's bytes
//! are all accounted for (lines, their terminators, over-long lengths).
#![no_main]

use kandev_operator::jsonrpc::codec::{Frame, LineReader};
use libfuzzer_sys::fuzz_target;
use tokio::io::BufReader;

fuzz_target!(|data: &[u8]| {
    let [limit, chunk, stream @ ..] = data else {
        return;
    };
    let limit = usize::from(*limit);
    let chunk = usize::from(*chunk).max(1);
    let mut reader = LineReader::new(BufReader::with_capacity(chunk, stream), limit);
    let mut accounted = 0usize;
    loop {
        let frame = futures::executor::block_on(reader.next_line()).expect("reading a slice");
        let len = match frame {
            Frame::Eof => break,
            Frame::Line => {
                assert!(reader.line().len() <= limit);
                reader.line().len()
            }
            Frame::TooLong { len } => {
                assert!(len > limit && reader.line().is_empty());
                len
            }
        };
        accounted += len;
    }
    // Every byte is in a line, or a terminator (`\n`, or the `\r` before one, or a final `\r`).
    let newlines = stream.iter().filter(|b| **b == b'\n').count();
    assert!(accounted <= stream.len() && stream.len() - accounted <= 2 * newlines + 1);
});
