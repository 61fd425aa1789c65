//! JSON-RPC 2.0 lines: one JSON message per line, classified into request / notification /
//! response, or rejected with the error the spec prescribes; and the messages we build.
//!
//! A message is kept as a raw JSON object (every field the peer sent survives, so agentctl can
//! forward what it does not understand); only the few fields routing needs are read: `id`,
//! `method`, `params`.

use serde_json::{Map, Value, json};

use super::JSONRPC_VERSION;
use super::code::{INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR};
use super::method::DISCONNECT;

/// One well-formed JSON-RPC message. `raw` is the whole object, for forwarding.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Request {
        id: Value,
        method: String,
        raw: Map<String, Value>,
    },
    Notification {
        method: String,
        raw: Map<String, Value>,
    },
    Response {
        id: Value,
        raw: Map<String, Value>,
    },
}

/// Why a line is not a usable JSON-RPC message, as the error to send back.
#[derive(Clone, Debug, PartialEq)]
pub struct Invalid {
    pub code: i64,
    pub message: String,
    /// The offending message's id when it could be read, else `null` (as the spec demands).
    pub id: Value,
}

impl Invalid {
    pub fn to_error_message(&self) -> Value {
        error_message(self.id.clone(), self.code, &self.message)
    }
}

/// Classifies one line. Only objects with `"jsonrpc":"2.0"` are accepted; batches (arrays)
/// are rejected as invalid requests because ACP never uses them.
pub fn parse_line(line: &str) -> Result<Message, Invalid> {
    let value: Value = serde_json::from_str(line).map_err(|error| Invalid {
        code: PARSE_ERROR,
        message: format!("Parse error: {error}"),
        id: Value::Null,
    })?;
    let Value::Object(raw) = value else {
        return Err(invalid(
            Value::Null,
            "expected one JSON-RPC object per line",
        ));
    };
    let id = match raw.get("id") {
        None => None,
        Some(id @ (Value::Null | Value::String(_) | Value::Number(_))) => Some(id.clone()),
        Some(_) => {
            return Err(invalid(
                Value::Null,
                "`id` must be a string, a number or null",
            ));
        }
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if raw.get("jsonrpc").and_then(Value::as_str) != Some(JSONRPC_VERSION) {
        return Err(invalid(reply_id, "`jsonrpc` must be \"2.0\""));
    }
    match (raw.get("method"), id) {
        (Some(Value::String(method)), Some(id)) => Ok(Message::Request {
            id,
            method: method.clone(),
            raw,
        }),
        (Some(Value::String(method)), None) => Ok(Message::Notification {
            method: method.clone(),
            raw,
        }),
        (Some(_), _) => Err(invalid(reply_id, "`method` must be a string")),
        (None, Some(id)) if raw.contains_key("result") || raw.contains_key("error") => {
            Ok(Message::Response { id, raw })
        }
        (None, _) => Err(invalid(
            reply_id,
            "neither a request (`method`) nor a response (`result` or `error`)",
        )),
    }
}

fn invalid(id: Value, detail: &str) -> Invalid {
    Invalid {
        code: INVALID_REQUEST,
        message: format!("Invalid Request: {detail}"),
        id,
    }
}

/// `{"jsonrpc":"2.0","id":…,"error":{"code":…,"message":…}}`
pub fn error_message(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": JSONRPC_VERSION, "id": id, "error": {"code": code, "message": message}})
}

/// The code and message of an answer's `error` member (`INTERNAL_ERROR` and "" where missing).
pub fn error_parts(error: Option<&Value>) -> (i64, String) {
    let code = error
        .and_then(|e| e.get("code"))
        .and_then(Value::as_i64)
        .unwrap_or(INTERNAL_ERROR);
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    (code, message)
}

/// `{"jsonrpc":"2.0","id":…,"result":…}`
pub fn result_message(id: Value, result: Value) -> Value {
    json!({"jsonrpc": JSONRPC_VERSION, "id": id, "result": result})
}

/// `{"jsonrpc":"2.0","id":…,"method":…,"params":…}`
pub fn request_message(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": JSONRPC_VERSION, "id": id, "method": method, "params": params})
}

/// Whether `line` is the `_kandev/disconnect` notification.
pub fn is_disconnect(line: &str) -> bool {
    matches!(parse_line(line), Ok(Message::Notification { method, .. }) if method == DISCONNECT)
}

/// `{"jsonrpc":"2.0","method":…,"params":…}`
pub fn notification_message(method: &str, params: Value) -> Value {
    json!({"jsonrpc": JSONRPC_VERSION, "method": method, "params": params})
}

/// One message as a line to write: its JSON and a newline.
pub fn encode_line(message: &Value) -> Vec<u8> {
    // Serializing a `Value` cannot fail, and compact JSON never contains a raw newline, so one
    // message is exactly one line.
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    line
}

/// A stable map key for a JSON-RPC id (`1` and `"1"` stay distinct).
pub fn id_key(id: &Value) -> String {
    id.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// Ok(kind) or Err((code, reply id)).
    type Expected = Result<&'static str, (i64, Value)>;

    #[test]
    fn classification_table() {
        #[rustfmt::skip]
        let rows: Vec<(&str, Expected)> = vec![
            (r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#, Ok("request")),
            (r#"{"jsonrpc":"2.0","id":"a","method":"x"}"#, Ok("request")),
            (r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#, Ok("request")),
            (r#"{"jsonrpc":"2.0","method":"session/cancel","params":{}}"#, Ok("notification")),
            (r#"{"jsonrpc":"2.0","id":3,"result":null}"#, Ok("response")),
            (r#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"m"}}"#, Ok("response")),
            ("not json", Err((PARSE_ERROR, Value::Null))),
            ("{\"jsonrpc\":\"2.0\",", Err((PARSE_ERROR, Value::Null))),
            ("", Err((PARSE_ERROR, Value::Null))),
            ("[1,2]", Err((INVALID_REQUEST, Value::Null))),
            ("42", Err((INVALID_REQUEST, Value::Null))),
            (r#"{"id":7,"method":"x"}"#, Err((INVALID_REQUEST, json!(7)))),
            (r#"{"jsonrpc":"1.0","id":"q","method":"x"}"#, Err((INVALID_REQUEST, json!("q")))),
            (r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#, Err((INVALID_REQUEST, Value::Null))),
            (r#"{"jsonrpc":"2.0","id":2,"method":5}"#, Err((INVALID_REQUEST, json!(2)))),
            (r#"{"jsonrpc":"2.0","id":2}"#, Err((INVALID_REQUEST, json!(2)))),
            (r#"{"jsonrpc":"2.0","result":1}"#, Err((INVALID_REQUEST, Value::Null))),
            (r#"{"hello":"world"}"#, Err((INVALID_REQUEST, Value::Null))),
        ];
        for (line, expected) in rows {
            let got = parse_line(line).map(|m| match m {
                Message::Request { .. } => "request",
                Message::Notification { .. } => "notification",
                Message::Response { .. } => "response",
            });
            let got = got.map_err(|e| (e.code, e.id));
            assert_eq!(got, expected, "{line}");
        }
    }

    #[test]
    fn disconnect_detection() {
        assert!(is_disconnect(
            r#"{"jsonrpc":"2.0","method":"_kandev/disconnect"}"#
        ));
        assert!(is_disconnect(
            r#"{"jsonrpc":"2.0","method":"_kandev/disconnect","params":{}}"#
        ));
        assert!(!is_disconnect(
            r#"{"jsonrpc":"2.0","id":1,"method":"_kandev/disconnect"}"#
        ));
        assert!(!is_disconnect("garbage"));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Any JSON value, a few levels deep.
        pub(crate) fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>()
                    .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
                    .prop_map(Value::from),
                "\\PC{0,12}".prop_map(Value::from),
            ];
            leaf.prop_recursive(3, 32, 5, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                    prop::collection::btree_map("[a-z]{0,6}", inner, 0..5)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// A JSON-RPC-shaped object: each of the fields that matter present or not, of the
        /// right type or not, plus unknown fields that must survive.
        fn message() -> impl Strategy<Value = Map<String, Value>> {
            let jsonrpc = prop_oneof![
                4 => Just(Some(Value::from("2.0"))),
                1 => Just(None),
                1 => json_value().prop_map(Some),
            ];
            let id = prop_oneof![
                Just(None),
                Just(Some(Value::Null)),
                any::<u32>().prop_map(|n| Some(Value::from(n))),
                "[a-z0-9-]{0,8}".prop_map(|s| Some(Value::from(s))),
                json_value().prop_map(Some),
            ];
            let method = prop_oneof![
                Just(None),
                "[a-z_/]{1,16}".prop_map(|m| Some(Value::from(m))),
                json_value().prop_map(Some),
            ];
            let outcome = prop_oneof![
                Just(None),
                json_value().prop_map(|v| Some(("result", v))),
                json_value().prop_map(|v| Some(("error", v))),
            ];
            let extra = prop::collection::btree_map("x-[a-z]{1,4}", json_value(), 0..3);
            (jsonrpc, id, method, outcome, extra).prop_map(
                |(jsonrpc, id, method, outcome, extra)| {
                    let mut object: Map<String, Value> = extra.into_iter().collect();
                    let fields = [("jsonrpc", jsonrpc), ("id", id), ("method", method)];
                    for (key, value) in fields
                        .into_iter()
                        .chain([outcome.map(|(k, v)| (k, Some(v)))].into_iter().flatten())
                    {
                        if let Some(value) = value {
                            object.insert(key.to_owned(), value);
                        }
                    }
                    object
                },
            )
        }

        /// The classification JSON-RPC 2.0 prescribes, written from the spec: the kind, or the
        /// error code and the id the error answer must carry.
        fn expected(object: &Map<String, Value>) -> Result<&'static str, (i64, Value)> {
            let id = object.get("id");
            let valid_id = matches!(
                id,
                None | Some(Value::Null | Value::String(_) | Value::Number(_))
            );
            if !valid_id {
                return Err((INVALID_REQUEST, Value::Null));
            }
            let reply_id = id.cloned().unwrap_or(Value::Null);
            if object.get("jsonrpc") != Some(&Value::from("2.0")) {
                return Err((INVALID_REQUEST, reply_id));
            }
            match (object.get("method"), id) {
                (Some(Value::String(_)), Some(_)) => Ok("request"),
                (Some(Value::String(_)), None) => Ok("notification"),
                (Some(_), _) => Err((INVALID_REQUEST, reply_id)),
                (None, Some(_))
                    if object.contains_key("result") || object.contains_key("error") =>
                {
                    Ok("response")
                }
                (None, _) => Err((INVALID_REQUEST, reply_id)),
            }
        }

        fn kind(message: &Message) -> &'static str {
            match message {
                Message::Request { .. } => "request",
                Message::Notification { .. } => "notification",
                Message::Response { .. } => "response",
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any text: no panic; an error is a parse error or an invalid request, and its
            /// answer is itself a well-formed JSON-RPC response.
            #[test]
            fn any_text_is_classified_or_answered(line in "\\PC{0,64}|\\{.{0,64}") {
                if let Err(invalid) = parse_line(&line) {
                    prop_assert!([PARSE_ERROR, INVALID_REQUEST].contains(&invalid.code));
                    let answer = invalid.to_error_message().to_string();
                    prop_assert!(matches!(parse_line(&answer), Ok(Message::Response { .. })), "{}", answer);
                }
            }

            /// Any JSON value that is not an object is an invalid request answered with id null.
            #[test]
            fn non_objects_are_invalid_requests(value in json_value().prop_filter("not an object", |v| !v.is_object())) {
                let invalid = parse_line(&value.to_string()).err();
                prop_assert_eq!(invalid.map(|i| (i.code, i.id)), Some((INVALID_REQUEST, Value::Null)));
            }

            /// A JSON-RPC-shaped object is classified as the spec says, keeps every field for
            /// forwarding, and its id and method come back unchanged.
            #[test]
            fn messages_are_classified_as_the_spec_says(object in message()) {
                let line = Value::Object(object.clone()).to_string();
                let parsed = parse_line(&line);
                prop_assert_eq!(
                    parsed.as_ref().map(kind).map_err(|i| (i.code, i.id.clone())),
                    expected(&object)
                );
                if let Ok(message) = parsed {
                    let (id, method, raw) = match message {
                        Message::Request { id, method, raw } => (Some(id), Some(method), raw),
                        Message::Notification { method, raw } => (None, Some(method), raw),
                        Message::Response { id, raw } => (Some(id), None, raw),
                    };
                    prop_assert_eq!(id.as_ref(), object.get("id"));
                    prop_assert_eq!(method.as_deref(), object.get("method").and_then(Value::as_str));
                    prop_assert_eq!(raw, object);
                }
            }
        }
    }
}
