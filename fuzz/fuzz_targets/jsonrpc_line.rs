//! agentctl's JSON-RPC classifier on arbitrary text: no panic, and every error answer it makes
//! is itself a well-formed JSON-RPC response.
#![no_main]

use kandev_operator::jsonrpc::{Message, parse_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    if let Err(invalid) = parse_line(&line) {
        let answer = invalid.to_error_message().to_string();
        assert!(matches!(parse_line(&answer), Ok(Message::Response { .. })));
    }
});
