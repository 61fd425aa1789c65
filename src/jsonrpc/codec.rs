//! The one bounded line codec of the crate: every newline-delimited stream that an agent or a
//! client writes (ACP over stdio, sockets and exec, the `agentctl events` feed) is read with
//! [`LineReader`], so no peer can make us buffer more than one limited line.
//!
//! Lines that are passed on as they are (or fixed replies) are written with [`write_line`].
//!
//! Three layers read lines with it: the ACP client, agentctl (the agent's stdout, its clients,
//! `connect` and `events`) and the controller's event follower.
//!
//! A line longer than the limit is never buffered whole: the bytes past the limit are read and
//! dropped until the newline, and the caller learns how long the line was. A line within the
//! limit whose parse would cost more than the budget holds for it ([`super::cost`]: a dense
//! array, many small objects, deep nesting) is dropped too, before anyone parses it, and the
//! caller learns what it would have cost. What to do with such a peer is the caller's decision
//! (the ACP client and agentctl cut it off, the event follower skips the line).

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

const MIB: usize = 1024 * 1024;

/// The limit of every line outside a `session/load` replay.
pub const LINE_LIMIT: usize = MIB;

/// Default limit of a line read while a `session/load` is replaying the transcript (one update
/// may carry a whole tool result). Operator flag `--acp-replay-line-limit-mib`, agentctl flag
/// `--replay-line-limit-mib`.
pub const DEFAULT_REPLAY_LINE_LIMIT: usize = 8 * MIB;

/// Upper bound of the configurable replay line limit, in MiB: the operator runs in 256 Mi.
pub const MAX_REPLAY_LINE_LIMIT_MIB: u64 = 64;

/// A replay line limit given in MiB (flags), in bytes.
pub fn mib(value: u64) -> usize {
    usize::try_from(value)
        .unwrap_or(usize::MAX)
        .saturating_mul(MIB)
}

/// What [`LineReader::next_line`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A line; its bytes are in [`LineReader::line`] (without `\n` or `\r\n`).
    Line,
    /// A line of `len` bytes (without its terminator) exceeded the limit and was dropped.
    TooLong { len: usize },
    /// A line of `len` bytes within the limit would cost about `cost` bytes to parse, more than
    /// [`super::cost::bound`] of the limit, and was dropped unparsed.
    TooCostly { len: usize, cost: usize },
    /// The stream ended (a final line without a newline is returned as a [`Frame::Line`] first).
    Eof,
}

/// Reads newline-delimited lines of at most `limit` bytes each.
pub struct LineReader<R> {
    reader: R,
    buf: Vec<u8>,
    limit: usize,
}

/// A buffer grown by an unusually long line is given back once it exceeds this much.
const KEEP_CAPACITY: usize = 64 * 1024;

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(reader: R, limit: usize) -> Self {
        Self {
            reader,
            buf: Vec::new(),
            limit,
        }
    }

    /// Applies to the next line read (e.g. the larger limit while a replay runs).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The line of the last [`Frame::Line`].
    pub fn line(&self) -> &[u8] {
        &self.buf
    }

    /// The underlying reader (e.g. to hand the stream on after a first line).
    pub fn into_inner(self) -> R {
        self.reader
    }

    /// Waits until the next line has begun to arrive: false at EOF. A caller whose limit
    /// depends on what it sent (a replay) decides it after this, so a line that answers a
    /// request is never read under the limit from before the request.
    pub async fn ready(&mut self) -> std::io::Result<bool> {
        Ok(!self.reader.fill_buf().await?.is_empty())
    }

    /// Reads the next line. Cancel-safe only between lines: dropping the future mid-line loses
    /// that line's bytes read so far.
    pub async fn next_line(&mut self) -> std::io::Result<Frame> {
        self.buf.clear();
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf.shrink_to(KEEP_CAPACITY);
        }
        // One byte more than the limit fits, so a `\r` before the `\n` does not count.
        let keep = self.limit.saturating_add(1);
        let mut len = 0usize;
        let mut ends_cr = false;
        loop {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                return Ok(if len == 0 {
                    Frame::Eof
                } else {
                    self.finish(len, ends_cr)
                });
            }
            let (chunk, consumed, done) = match available.iter().position(|b| *b == b'\n') {
                Some(newline) => (&available[..newline], newline + 1, true),
                None => (available, available.len(), false),
            };
            len = len.saturating_add(chunk.len());
            if let Some(last) = chunk.last() {
                ends_cr = *last == b'\r';
            }
            if len <= keep {
                self.buf.extend_from_slice(chunk);
            } else if !self.buf.is_empty() {
                // Over the limit: drop what was kept, count the rest without keeping it.
                self.buf.clear();
                self.buf.shrink_to(KEEP_CAPACITY);
            }
            self.reader.consume(consumed);
            if done {
                return Ok(self.finish(len, ends_cr));
            }
        }
    }

    fn finish(&mut self, mut len: usize, ends_cr: bool) -> Frame {
        if ends_cr {
            self.buf.pop();
            len -= 1;
        }
        if len > self.limit {
            self.buf.clear();
            Frame::TooLong { len }
        } else if let Some(cost) = super::cost::too_costly(&self.buf, self.limit) {
            self.buf.clear();
            self.buf.shrink_to(KEEP_CAPACITY);
            Frame::TooCostly { len, cost }
        } else {
            Frame::Line
        }
    }
}

/// Writes `line` and its newline in one write, then flushes: the writing half of the codec, for
/// lines that are already encoded (a peer's line passed on, or a fixed reply).
pub async fn write_line<W: AsyncWrite + Unpin>(
    writer: &mut W,
    line: impl AsRef<[u8]>,
) -> std::io::Result<()> {
    let line = line.as_ref();
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line);
    bytes.push(b'\n');
    writer.write_all(&bytes).await?;
    writer.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use tokio::io::BufReader;

    type Frames = Vec<(Frame, String)>;

    /// Every frame of `data` read through a buffer of `chunk` bytes with `limit`.
    async fn frames(data: &[u8], chunk: usize, limit: usize) -> Frames {
        let mut reader = LineReader::new(BufReader::with_capacity(chunk, data), limit);
        let mut out = Vec::new();
        loop {
            let frame = reader.next_line().await.expect("read");
            if frame == Frame::Eof {
                return out;
            }
            out.push((frame, String::from_utf8_lossy(reader.line()).into_owned()));
        }
    }

    fn line(text: &str) -> (Frame, String) {
        (Frame::Line, text.to_owned())
    }

    fn too_long(len: usize) -> (Frame, String) {
        (Frame::TooLong { len }, String::new())
    }

    #[tokio::test]
    async fn framing_table() {
        #[rustfmt::skip]
        let rows: Vec<(&str, &[u8], Frames)> = vec![
            ("exact limit", b"12345678\n", vec![line("12345678")]),
            ("limit + 1", b"123456789\n", vec![too_long(9)]),
            ("CRLF is stripped, not counted", b"12345678\r\nab\r\n", vec![line("12345678"), line("ab")]),
            ("limit + 1 before CRLF", b"123456789\r\n", vec![too_long(9)]),
            ("no newline at EOF", b"a\ntail", vec![line("a"), line("tail")]),
            ("over-long at EOF", b"a\n0123456789abc", vec![line("a"), too_long(13)]),
            ("empty lines are lines", b"\n\r\nx\n", vec![line(""), line(""), line("x")]),
            ("nothing", b"", vec![]),
            ("oversized then next", b"short\n0123456789abcdef\nok\n", vec![line("short"), too_long(16), line("ok")]),
            ("several oversized in a row", b"0123456789\n0123456789\nz\n", vec![too_long(10), too_long(10), line("z")]),
            ("lone CR inside a line stays", b"a\rb\n", vec![line("a\rb")]),
        ];
        for (name, data, expected) in rows {
            // Split across reads at every size: one byte at a time, small, and all at once.
            for chunk in [1, 3, 4, 64] {
                assert_eq!(
                    frames(data, chunk, 8).await,
                    expected,
                    "{name} (reads of {chunk})"
                );
            }
        }
    }

    #[tokio::test]
    async fn limit_can_change_between_lines() {
        let data: &[u8] = b"0123456789\n0123456789\n";
        let mut reader = LineReader::new(BufReader::with_capacity(4, data), 8);
        assert_eq!(
            reader.next_line().await.expect("read"),
            Frame::TooLong { len: 10 }
        );
        reader.set_limit(16);
        assert!(reader.ready().await.expect("read"));
        assert_eq!(reader.next_line().await.expect("read"), Frame::Line);
        assert_eq!(reader.line(), b"0123456789");
        assert!(!reader.ready().await.expect("read"), "EOF");
    }

    #[tokio::test]
    async fn an_oversized_line_is_never_buffered() {
        // 64 MiB without a newline, then a short line: the buffer never grows past the limit.
        struct Endless(usize);
        impl tokio::io::AsyncRead for Endless {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                let n = buf.remaining().min(self.0);
                buf.put_slice(&vec![b'x'; n]);
                self.0 -= n;
                std::task::Poll::Ready(Ok(()))
            }
        }
        use tokio::io::AsyncReadExt;
        let source = Endless(64 * MIB).chain(&b"\nok\n"[..]);
        let mut reader = LineReader::new(BufReader::new(source), 1024);
        assert_eq!(
            reader.next_line().await.expect("read"),
            Frame::TooLong { len: 64 * MIB }
        );
        assert!(reader.buf.capacity() <= KEEP_CAPACITY);
        assert_eq!(reader.next_line().await.expect("read"), Frame::Line);
        assert_eq!(reader.line(), b"ok");
    }

    /// A dense line within the limit is dropped unparsed and named by its cost; the stream
    /// goes on with the next line.
    #[tokio::test]
    async fn a_line_too_dense_to_parse_is_dropped_and_reading_goes_on() {
        let dense = format!("[{}0]", "0,".repeat(2_000));
        let data = format!("{dense}\n{{\"text\":\"{}\"}}\nok\n", "x".repeat(8_000));
        let got = frames(data.as_bytes(), 1024, 8 * 1024).await;
        let cost =
            crate::jsonrpc::cost::cost(dense.len(), crate::jsonrpc::cost::count(dense.as_bytes()));
        assert_eq!(
            got[0],
            (
                Frame::TooCostly {
                    len: dense.len(),
                    cost
                },
                String::new()
            )
        );
        assert_eq!(got[1].0, Frame::Line, "a line of text as long is kept");
        assert_eq!(got[2], line("ok"));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// What the codec promises, written the obvious way: split at `\n`, drop one `\r`
        /// before it, keep a last line without a newline, report a line over `limit` by its
        /// length instead of its bytes, and one too dense to parse by what it would cost.
        fn model(data: &[u8], limit: usize) -> Frames {
            let mut parts: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
            if parts.last().is_some_and(|last| last.is_empty()) {
                parts.pop(); // the stream ended with a newline (or was empty)
            }
            parts
                .into_iter()
                .map(|part| {
                    let part = part.strip_suffix(b"\r").unwrap_or(part);
                    if part.len() > limit {
                        too_long(part.len())
                    } else if let Some(cost) = crate::jsonrpc::cost::too_costly(part, limit) {
                        (
                            Frame::TooCostly {
                                len: part.len(),
                                cost,
                            },
                            String::new(),
                        )
                    } else {
                        (Frame::Line, String::from_utf8_lossy(part).into_owned())
                    }
                })
                .collect()
        }

        /// Bytes rich in what matters to framing: newlines, carriage returns, invalid UTF-8.
        fn stream() -> impl Strategy<Value = Vec<u8>> {
            prop::collection::vec(
                prop_oneof![
                    3 => Just(b'\n'),
                    2 => Just(b'\r'),
                    1 => Just(0xff_u8),
                    10 => any::<u8>(),
                ],
                0..300,
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any bytes, any limit, any read size: the frames are the model's, no kept line
            /// is ever over the limit, and an over-long line leaves nothing behind.
            #[test]
            fn frames_match_the_model_and_never_exceed_the_limit(
                data in stream(),
                limit in 0usize..48,
                chunk in 1usize..24,
            ) {
                let mut reader = LineReader::new(BufReader::with_capacity(chunk, &data[..]), limit);
                let mut got = Vec::new();
                loop {
                    let frame = futures::executor::block_on(reader.next_line()).expect("read");
                    match frame {
                        Frame::Eof => break,
                        Frame::Line => prop_assert!(reader.line().len() <= limit),
                        Frame::TooLong { len } => {
                            prop_assert!(len > limit);
                            prop_assert!(reader.line().is_empty());
                        }
                        Frame::TooCostly { len, cost } => {
                            prop_assert!(len <= limit && cost > crate::jsonrpc::cost::bound(limit));
                            prop_assert!(reader.line().is_empty());
                        }
                    }
                    prop_assert!(reader.buf.len() <= limit.saturating_add(1));
                    got.push((frame, String::from_utf8_lossy(reader.line()).into_owned()));
                }
                prop_assert_eq!(got, model(&data, limit));
            }

            /// Lines within the limit come back byte for byte, whether ended by LF or CRLF.
            #[test]
            fn lines_within_the_limit_round_trip(
                lines in prop::collection::vec(
                    prop::collection::vec(any::<u8>().prop_filter("no newline", |b| *b != b'\n'), 0..40)
                        .prop_filter("a final CR belongs to the terminator", |l| l.last() != Some(&b'\r')),
                    0..12,
                ),
                crlf in any::<bool>(),
                chunk in 1usize..16,
            ) {
                let terminator: &[u8] = if crlf { b"\r\n" } else { b"\n" };
                let data: Vec<u8> = lines.iter().flat_map(|l| [&l[..], terminator].concat()).collect();
                let mut reader = LineReader::new(BufReader::with_capacity(chunk, &data[..]), 40);
                let mut got = Vec::new();
                while futures::executor::block_on(reader.next_line()).expect("read") == Frame::Line {
                    got.push(reader.line().to_vec());
                }
                prop_assert_eq!(got, lines);
            }
        }
    }

    #[test]
    fn mib_flags() {
        assert_eq!(mib(8), DEFAULT_REPLAY_LINE_LIMIT);
        assert_eq!(mib(1), LINE_LIMIT);
    }
}
