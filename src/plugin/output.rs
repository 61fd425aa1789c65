//! `-o text|json|yaml|jsonpath=TEMPLATE`: how a verb that prints an object prints it.
//!
//! JSON and YAML are the object as is. `jsonpath=` takes kubectl's template syntax: literal text
//! with `{…}` expressions, where an expression is a path (`{.status.state}`,
//! `{.conditions[?(@.type=="Resumed")].reason}`, `{.metadata.annotations.kandev\.dev/x}`), a
//! quoted literal (`{"\n"}`, `{"\t"}`), or `{range PATH}…{end}`, which repeats its body for each
//! match. Paths are evaluated by `jsonpath-rust` (RFC 9535); this module only translates
//! kubectl's dialect (a leading `.`, `\.` inside keys) into it.

use std::fmt;
use std::str::FromStr;

use jsonpath_rust::JsonPath;
use serde_json::Value;

/// What `-o` asked for.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// A readable table or line (the default).
    #[default]
    Text,
    Json,
    Yaml,
    /// `jsonpath=TEMPLATE` (parsed when the flag is).
    JsonPath(Template),
}

/// The `-o` values shown in `--help` and completed by the shell.
pub const OUTPUT_VALUES: &[(&str, &str)] = &[
    ("text", "a readable table (default)"),
    ("json", "the object as JSON"),
    ("yaml", "the object as YAML"),
    (
        "jsonpath=",
        "fields picked with a kubectl JSONPath template",
    ),
];

/// An `-o` value that is not a format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error(
        "unknown output format {0:?}; allowed: text, json, yaml, jsonpath=TEMPLATE (e.g. -o jsonpath='{{.state}}{{\"\\n\"}}')"
    )]
    Unknown(String),
    /// An unclosed `{`, a `{range}` without `{end}`, a path that `jsonpath-rust` refuses.
    #[error("bad jsonpath template {template:?}: {why}")]
    BadTemplate {
        template: String,
        why: TemplateError,
    },
}

/// What is wrong with a jsonpath template, or with one of its paths against an object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("unclosed {{ at {0:?}")]
    UnclosedExpression(String),
    #[error("{{end}} without {{range}}")]
    EndWithoutRange,
    #[error("{{range}} without {{end}}")]
    RangeWithoutEnd,
    #[error("unknown escape \\{escape} in {expr}")]
    UnknownEscape { escape: String, expr: String },
    #[error("{0}: a trailing \\")]
    TrailingBackslash(String),
    #[error("{0}: an empty field name")]
    EmptyField(String),
    #[error("{0}: unclosed [")]
    UnclosedBracket(String),
    #[error("{0}: a path starts with . (e.g. {{.status.state}})")]
    NoLeadingDot(String),
    /// `jsonpath-rust` refused the translated path; its own words.
    #[error("{path}: {why}")]
    Query { path: String, why: String },
    #[error("{0} is not found")]
    NotFound(String),
}

impl TemplateError {
    fn query(path: &str) -> impl Fn(jsonpath_rust::parser::errors::JsonPathError) -> Self + '_ {
        move |e| Self::Query {
            path: path.to_string(),
            why: e.to_string(),
        }
    }
}

impl FromStr for OutputFormat {
    type Err = FormatError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "text" | "" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            "yaml" => Ok(Self::Yaml),
            _ => match value.split_once('=') {
                Some(("jsonpath", template)) => Template::parse(template).map(Self::JsonPath),
                _ => Err(FormatError::Unknown(value.to_string())),
            },
        }
    }
}

/// Why `-o` could not render the output.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("encoding the JSON output: {0}")]
    Json(#[source] serde_json::Error),
    #[error("encoding the YAML output: {0}")]
    Yaml(#[source] serde_yaml_ng::Error),
    /// A path of the template matched nothing, or could not be run.
    #[error("jsonpath template {template:?}: {why}")]
    Template {
        template: String,
        why: TemplateError,
    },
}

/// Renders `value` as JSON, YAML or a template. `Text` is the verb's own business: `None`.
pub fn render(value: &Value, format: &OutputFormat) -> Result<Option<String>, RenderError> {
    match format {
        OutputFormat::Text => Ok(None),
        OutputFormat::Json => serde_json::to_string_pretty(value)
            .map(|s| Some(s + "\n"))
            .map_err(RenderError::Json),
        OutputFormat::Yaml => serde_yaml_ng::to_string(value)
            .map(Some)
            .map_err(RenderError::Yaml),
        OutputFormat::JsonPath(template) => template.execute(value).map(Some),
    }
}

/// One piece of a parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Text(String),
    /// A path, already in RFC 9535 form (`$…`).
    Path(String),
    Range {
        path: String,
        body: Vec<Node>,
    },
}

/// A parsed kubectl JSONPath template.
#[derive(Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    nodes: Vec<Node>,
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Template({:?})", self.source)
    }
}

impl Template {
    /// Parses `text`; an unclosed `{`, a `{range}` without `{end}` or a path that `jsonpath-rust`
    /// refuses are errors that name the template.
    pub fn parse(text: &str) -> Result<Self, FormatError> {
        let bad = |why: TemplateError| FormatError::BadTemplate {
            template: text.to_string(),
            why,
        };
        let mut stack: Vec<(String, Vec<Node>)> = Vec::new();
        let mut current: Vec<Node> = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                current.push(Node::Text(rest.to_string()));
                break;
            };
            if open > 0 {
                current.push(Node::Text(rest[..open].to_string()));
            }
            let close = expression_end(&rest[open + 1..])
                .ok_or_else(|| bad(TemplateError::UnclosedExpression(rest[open..].to_string())))?;
            let expr = rest[open + 1..open + 1 + close].trim();
            rest = &rest[open + 1 + close + 1..];
            if expr == "end" {
                let (path, outer) = stack
                    .pop()
                    .ok_or_else(|| bad(TemplateError::EndWithoutRange))?;
                let body = std::mem::replace(&mut current, outer);
                current.push(Node::Range { path, body });
            } else if let Some(path) = expr.strip_prefix("range ") {
                let path = translate_path(path.trim()).map_err(&bad)?;
                stack.push((path, std::mem::take(&mut current)));
            } else if let Some(literal) = quoted(expr) {
                current.push(Node::Text(literal.map_err(&bad)?));
            } else {
                current.push(Node::Path(translate_path(expr).map_err(&bad)?));
            }
        }
        if !stack.is_empty() {
            return Err(bad(TemplateError::RangeWithoutEnd));
        }
        let template = Self {
            source: text.to_string(),
            nodes: current,
        };
        // Every path must parse now, not when the object arrives after a long wait.
        template.check(&template.nodes).map_err(bad)?;
        Ok(template)
    }

    fn check(&self, nodes: &[Node]) -> Result<(), TemplateError> {
        for node in nodes {
            match node {
                Node::Text(_) => {}
                Node::Path(path) => {
                    Value::Null
                        .query(path)
                        .map_err(TemplateError::query(path))?;
                }
                Node::Range { path, body } => {
                    Value::Null
                        .query(path)
                        .map_err(TemplateError::query(path))?;
                    self.check(body)?;
                }
            }
        }
        Ok(())
    }

    /// Fills the template from `value`, like kubectl: several matches of one path are joined by
    /// a space, strings print bare, other values as compact JSON; a path that matches nothing
    /// is an error (kubectl's "is not found").
    pub fn execute(&self, value: &Value) -> Result<String, RenderError> {
        let mut out = String::new();
        execute(&self.nodes, value, &mut out).map_err(|why| RenderError::Template {
            template: self.source.clone(),
            why,
        })?;
        Ok(out)
    }
}

fn execute(nodes: &[Node], value: &Value, out: &mut String) -> Result<(), TemplateError> {
    for node in nodes {
        match node {
            Node::Text(text) => out.push_str(text),
            Node::Path(path) => {
                let found = value.query(path).map_err(TemplateError::query(path))?;
                if found.is_empty() {
                    return Err(TemplateError::NotFound(shown(path)));
                }
                let parts: Vec<String> = found.into_iter().map(scalar).collect();
                out.push_str(&parts.join(" "));
            }
            Node::Range { path, body } => {
                let found = value.query(path).map_err(TemplateError::query(path))?;
                // `range` over one array match iterates its elements, like kubectl.
                let items: Vec<&Value> = match found.as_slice() {
                    [Value::Array(items)] => items.iter().collect(),
                    _ => found,
                };
                for item in items {
                    execute(body, item, out)?;
                }
            }
        }
    }
    Ok(())
}

fn shown(path: &str) -> String {
    path.strip_prefix('$').unwrap_or(path).to_string()
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Where the expression that starts right after a `{` ends (its `}`), skipping quoted strings
/// (a `"}"` literal or a filter comparing with a string holding braces).
fn expression_end(text: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '}' => return Some(i),
            None => {}
        }
    }
    None
}

/// `"…"` as a literal with `\n`, `\t`, `\\`, `\"` escapes; `None` if `expr` is not quoted.
fn quoted(expr: &str) -> Option<Result<String, TemplateError>> {
    let inner = expr.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            other => {
                return Some(Err(TemplateError::UnknownEscape {
                    escape: other.map(String::from).unwrap_or_default(),
                    expr: expr.to_string(),
                }));
            }
        }
    }
    Some(Ok(out))
}

/// kubectl's path dialect to RFC 9535: `.a.b` → `$['a']['b']`, `\.` is a dot inside a key,
/// bracket parts (`[0]`, `[*]`, `[?(@.type=="X")]`) are kept, `..` stays a descendant step.
fn translate_path(path: &str) -> Result<String, TemplateError> {
    let path = path.strip_prefix('$').unwrap_or(path);
    if path.is_empty() || path == "." {
        return Ok("$".into());
    }
    let mut out = String::from("$");
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                let descendant = chars.peek() == Some(&'.');
                if descendant {
                    chars.next();
                    out.push_str("..");
                }
                let mut key = String::new();
                while let Some(&next) = chars.peek() {
                    match next {
                        '\\' => {
                            chars.next();
                            match chars.next() {
                                Some(escaped) => key.push(escaped),
                                None => {
                                    return Err(TemplateError::TrailingBackslash(path.to_string()));
                                }
                            }
                        }
                        '.' | '[' => break,
                        _ => {
                            key.push(next);
                            chars.next();
                        }
                    }
                }
                match key.as_str() {
                    "" if descendant => {}
                    "" => return Err(TemplateError::EmptyField(path.to_string())),
                    "*" => out.push_str(if descendant { "*" } else { "[*]" }),
                    _ => {
                        let escaped = key.replace('\\', "\\\\").replace('\'', "\\'");
                        out.push_str(&format!("['{escaped}']"));
                    }
                }
            }
            '[' => {
                out.push('[');
                let mut depth = 1;
                let mut quote: Option<char> = None;
                for next in chars.by_ref() {
                    out.push(next);
                    match (quote, next) {
                        (Some(q), c) if c == q => quote = None,
                        (Some(_), _) => {}
                        (None, '"' | '\'') => quote = Some(next),
                        (None, '[') => depth += 1,
                        (None, ']') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                if depth != 0 {
                    return Err(TemplateError::UnclosedBracket(path.to_string()));
                }
            }
            _ => {
                return Err(TemplateError::NoLeadingDot(path.to_string()));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn session() -> Value {
        json!({
            "name": "demo",
            "state": "WAITING_FOR_INPUT",
            "needsResume": false,
            "metadata": {"annotations": {"kandev.dev/resume-requested-at": "t1"}},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Running"},
                {"type": "Resumed", "status": "True", "reason": "SessionResumed"}
            ],
            "pods": []
        })
    }

    #[test]
    fn formats_parse_from_the_flag() {
        for (flag, want) in [
            ("text", OutputFormat::Text),
            ("json", OutputFormat::Json),
            ("yaml", OutputFormat::Yaml),
        ] {
            assert_eq!(flag.parse::<OutputFormat>(), Ok(want), "{flag}");
        }
        assert!(matches!(
            "jsonpath={.state}".parse::<OutputFormat>(),
            Ok(OutputFormat::JsonPath(_))
        ));
        for bad in [
            "wide",
            "jsonpath",
            "jsonpath={.state",
            "jsonpath={range .a}",
        ] {
            let err = bad.parse::<OutputFormat>().expect_err(bad).to_string();
            assert!(
                err.contains("jsonpath") || err.contains("allowed"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn paths_translate_to_rfc_9535() {
        for (kubectl, rfc) in [
            (".status.state", "$['status']['state']"),
            ("{.a}", ""), // not a path: braces are the template's, tested below
            (
                ".items[*].metadata.name",
                "$['items'][*]['metadata']['name']",
            ),
            (".conditions[0]", "$['conditions'][0]"),
            (
                r".metadata.annotations.kandev\.dev/resume-requested-at",
                "$['metadata']['annotations']['kandev.dev/resume-requested-at']",
            ),
            (
                r#".conditions[?(@.type=="Resumed")].reason"#,
                r#"$['conditions'][?(@.type=="Resumed")]['reason']"#,
            ),
            ("..name", "$..['name']"),
            (".", "$"),
            ("$.state", "$['state']"),
        ] {
            if rfc.is_empty() {
                assert!(translate_path(kubectl).is_err(), "{kubectl}");
            } else {
                assert_eq!(translate_path(kubectl).as_deref(), Ok(rfc), "{kubectl}");
            }
        }
        assert!(translate_path(".a[0").is_err());
        assert!(translate_path(".a..").is_ok());
        assert!(translate_path(".a.").is_err());
    }

    #[test]
    fn templates_fill_like_kubectl() {
        let value = session();
        for (template, want) in [
            ("{.state}", "WAITING_FOR_INPUT"),
            ("{.state}{\"\\n\"}", "WAITING_FOR_INPUT\n"),
            (
                "state={.state} needsResume={.needsResume}",
                "state=WAITING_FOR_INPUT needsResume=false",
            ),
            (
                r#"{.conditions[?(@.type=="Resumed")].reason}"#,
                "SessionResumed",
            ),
            ("{.conditions[*].type}", "Ready Resumed"),
            (
                r"{.metadata.annotations.kandev\.dev/resume-requested-at}",
                "t1",
            ),
            (
                "{range .conditions[*]}{.type}{\"\\t\"}{.status}{\"\\n\"}{end}",
                "Ready\tTrue\nResumed\tTrue\n",
            ),
            ("{range .conditions}{.type},{end}", "Ready,Resumed,"),
            ("{range .pods[*]}{.name}{end}", ""),
            (
                "{.conditions[0]}",
                r#"{"type":"Ready","status":"True","reason":"Running"}"#,
            ),
            ("no braces", "no braces"),
            ("{\"}\"}", "}"),
        ] {
            let parsed = Template::parse(template).unwrap_or_else(|e| panic!("{template}: {e}"));
            let got = parsed.execute(&value).map_err(|e| e.to_string());
            assert_eq!(got.as_deref(), Ok(want), "{template}");
        }
    }

    #[test]
    fn a_missing_field_is_an_error_naming_it() {
        let err = Template::parse("{.nope}")
            .expect("parse")
            .execute(&session())
            .expect_err("missing");
        assert!(err.to_string().contains("['nope'] is not found"), "{err}");
    }

    /// template → why it is refused (each message names the template, then the reason)
    #[test]
    fn bad_templates_are_refused_when_parsed() {
        let query = |path: &str| TemplateError::Query {
            path: path.into(),
            why: String::new(),
        };
        for (bad, want) in [
            (
                "{.state",
                TemplateError::UnclosedExpression("{.state".into()),
            ),
            ("{end}", TemplateError::EndWithoutRange),
            (
                "{range .conditions[*]}{.type}",
                TemplateError::RangeWithoutEnd,
            ),
            ("{state}", TemplateError::NoLeadingDot("state".into())),
            (
                "{\"\\q\"}",
                TemplateError::UnknownEscape {
                    escape: "q".into(),
                    expr: "\"\\q\"".into(),
                },
            ),
            ("{.a\\}", TemplateError::TrailingBackslash(".a\\".into())),
            ("{.a.}", TemplateError::EmptyField(".a.".into())),
            ("{.a[0}", TemplateError::UnclosedBracket(".a[0".into())),
            ("{.a[?(@.b==]}", query("$['a'][?(@.b==]")),
        ] {
            let err = Template::parse(bad).expect_err(bad);
            assert!(
                err.to_string().starts_with("bad jsonpath template"),
                "{bad}: {err}"
            );
            let FormatError::BadTemplate { template, mut why } = err else {
                panic!("{bad}: {err}");
            };
            assert_eq!(template, bad);
            // jsonpath-rust's own words are its business: only the path is compared.
            if let TemplateError::Query { why: words, .. } = &mut why {
                assert!(!words.is_empty(), "{bad}");
                words.clear();
            }
            assert_eq!(why, want, "{bad}");
        }
    }

    #[test]
    fn json_and_yaml_print_the_object() {
        let value = json!({"name": "demo", "state": "RUNNING"});
        assert_eq!(
            render(&value, &OutputFormat::Json).expect("json"),
            Some("{\n  \"name\": \"demo\",\n  \"state\": \"RUNNING\"\n}\n".to_string())
        );
        assert_eq!(
            render(&value, &OutputFormat::Yaml).expect("yaml"),
            Some("name: demo\nstate: RUNNING\n".to_string())
        );
        assert_eq!(render(&value, &OutputFormat::Text).expect("text"), None);
    }
}
