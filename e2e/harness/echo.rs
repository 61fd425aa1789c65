//! `ndjson-echo`: answers each JSON line on stdin with one JSON line on stdout.
//!
//! It never waits for stdin EOF: kwok does not close an exec'd process's stdin, so a client
//! ends the conversation with `{"bye":true}`.

use std::io::{self, BufRead, Write};

use serde_json::{Value, json};

use crate::plan::{ENV_POD_NAME, ENV_POD_UID};

/// What the process answers to one input line; `None` ends the conversation after `bye`.
pub fn answer(line: &str, seq: u64, pid: u32, pod: &Value, pod_uid: &Value) -> (Value, bool) {
    match serde_json::from_str::<Value>(line) {
        Ok(v) if v == json!({"bye": true}) => (json!({"bye": true}), true),
        Ok(v) => (
            json!({"echo": v, "pid": pid, "pod": pod, "podUid": pod_uid, "seq": seq}),
            false,
        ),
        Err(e) => (
            json!({"error": format!("invalid JSON: {e}"), "pid": pid, "seq": seq}),
            false,
        ),
    }
}

fn env_value(name: &str) -> Value {
    std::env::var(name)
        .map(Value::String)
        .unwrap_or(Value::Null)
}

pub fn run() -> io::Result<()> {
    let pid = std::process::id();
    let pod = env_value(ENV_POD_NAME);
    let pod_uid = env_value(ENV_POD_UID);
    let stdin = io::stdin();
    let mut stdout = io::stdout().lock();
    let mut seq = 0u64;
    let mut line = String::new();
    loop {
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            return Ok(()); // EOF (a local test); kwok never sends it.
        }
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        seq += 1;
        let (reply, bye) = answer(trimmed, seq, pid, &pod, &pod_uid);
        serde_json::to_writer(&mut stdout, &reply)?;
        stdout.write_all(b"\n")?;
        stdout.flush()?;
        if bye {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn answers() {
        let pod = json!("p");
        let uid = json!("u");
        let (v, bye) = answer(r#"{"a":[1,2]}"#, 3, 42, &pod, &uid);
        assert!(!bye);
        assert_eq!(
            serde_json::to_string(&v).expect("json"),
            r#"{"echo":{"a":[1,2]},"pid":42,"pod":"p","podUid":"u","seq":3}"#
        );
        assert_eq!(
            answer(r#"{"bye":true}"#, 4, 42, &pod, &uid),
            (json!({"bye": true}), true)
        );
        assert_eq!(answer(r#"{"bye":false}"#, 5, 42, &pod, &uid).1, false);
        assert!(answer("nope", 6, 42, &pod, &uid).0["error"].is_string());
    }
}
