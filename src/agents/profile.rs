//! One agent's capabilities (DESIGN §3 "Agent capability registry") and the partial form
//! configuration files use to extend or override it.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::AgentRegistryError;
use crate::resume::NativeSessionResume;

/// The only placeholder `cliResume` understands.
const TOKEN_PLACEHOLDER: &str = "token";

/// What the operator needs to know about one agent. Data, not code branches: every
/// agent-specific decision reads a field here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentProfile {
    /// Profile name, as referenced by `TaskSession.spec.agent`.
    pub name: String,
    /// argv that starts the agent in ACP mode.
    pub launch: Vec<String>,
    /// Whether a saved session is restored over ACP (`session/resume` / `session/load`):
    /// `auto` trusts what the agent advertises in `initialize`.
    pub native_session_resume: NativeSessionResume,
    /// Wrap the first prompt after a fresh start in the recorded history.
    pub history_context_injection: bool,
    /// argv template with `{token}` that reopens the session in the agent's own CLI.
    pub cli_resume: Option<Vec<String>>,
    /// Extra environment for the agent process.
    pub env: BTreeMap<String, String>,
}

impl AgentProfile {
    /// This profile as a one-profile document in the configuration-file shape (JSON, which is
    /// also YAML), so it can be handed to another process (the operator passes it to agentctl).
    pub fn to_document(&self) -> String {
        let mut fields = serde_json::json!({
            "launch": self.launch,
            "nativeSessionResume": self.native_session_resume,
            "historyContextInjection": self.history_context_injection,
            "env": self.env,
        });
        if let Some(cli_resume) = &self.cli_resume {
            fields["cliResume"] = serde_json::json!(cli_resume);
        }
        serde_json::json!({ "profiles": { &self.name: fields } }).to_string()
    }

    /// The CLI command that reopens `token` in the agent's own CLI (for a human taking over),
    /// or `None` when the profile knows no such command. Every `{token}` is substituted, also
    /// inside a larger argument such as `--resume={token}`.
    pub fn cli_resume_command(&self, token: &str) -> Option<Vec<String>> {
        let placeholder = format!("{{{TOKEN_PLACEHOLDER}}}");
        self.cli_resume.as_ref().map(|template| {
            template
                .iter()
                .map(|arg| arg.replace(&placeholder, token))
                .collect()
        })
    }

    /// Rejects profiles that could only fail later, at pod launch, with a less clear message.
    pub(super) fn validate(&self) -> Result<(), AgentRegistryError> {
        let invalid = |problem: String| AgentRegistryError::InvalidProfile {
            profile: self.name.clone(),
            problem,
        };
        if self.name.trim().is_empty() {
            return Err(invalid("the profile name is empty".into()));
        }
        match self.launch.first() {
            None => return Err(invalid("`launch` is empty".into())),
            Some(program) if program.trim().is_empty() => {
                return Err(invalid("`launch` starts with an empty program name".into()));
            }
            Some(_) => {}
        }
        if let Some(placeholder) = self.launch.iter().flat_map(|arg| placeholders(arg)).next() {
            return Err(invalid(format!(
                "`launch` contains the placeholder {{{placeholder}}}, but launch supports none"
            )));
        }
        if let Some(template) = &self.cli_resume {
            if template
                .first()
                .is_some_and(|program| program.trim().is_empty())
            {
                return Err(invalid(
                    "`cliResume` starts with an empty program name".into(),
                ));
            }
            let found: Vec<&str> = template.iter().flat_map(|arg| placeholders(arg)).collect();
            if let Some(unknown) = found.iter().find(|name| **name != TOKEN_PLACEHOLDER) {
                return Err(invalid(format!(
                    "`cliResume` contains the unknown placeholder {{{unknown}}}; \
                     only {{token}} is supported"
                )));
            }
            if found.is_empty() {
                return Err(invalid(
                    "`cliResume` does not contain {token}, so it cannot name the session".into(),
                ));
            }
        }
        Ok(())
    }
}

/// `{name}` sequences in an argument, where `name` is an identifier. Other braces (a JSON
/// argument, say) are left alone.
fn placeholders(arg: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = arg;
    while let Some(open) = rest.find('{') {
        let after_open = &rest[open + 1..];
        let Some(close) = after_open.find('}') else {
            break;
        };
        let inner = &after_open[..close];
        let is_identifier =
            !inner.is_empty() && inner.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if is_identifier {
            found.push(inner);
            rest = &after_open[close + 1..];
        } else {
            rest = after_open;
        }
    }
    found
}

/// A profile as written in a profiles file: every field optional, so a file can override one
/// field of a built-in profile (`env` of `claude-code`, say) without restating the rest.
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ProfilePatch {
    launch: Option<Vec<String>>,
    native_session_resume: Option<NativeSessionResume>,
    history_context_injection: Option<bool>,
    /// An empty list removes an inherited `cliResume`.
    cli_resume: Option<Vec<String>>,
    /// Merged key by key into the inherited environment.
    env: Option<BTreeMap<String, String>>,
}

impl ProfilePatch {
    /// Applies the patch to `base`, or to an empty profile named `name` when the profile is new
    /// (`nativeSessionResume` then defaults to `false` and `historyContextInjection` to false,
    /// as before `auto` existed, and validation demands a `launch`).
    pub(super) fn apply(self, name: &str, base: Option<&AgentProfile>) -> AgentProfile {
        let mut profile = base.cloned().unwrap_or_else(|| AgentProfile {
            name: name.to_owned(),
            launch: Vec::new(),
            native_session_resume: NativeSessionResume::Never,
            history_context_injection: false,
            cli_resume: None,
            env: BTreeMap::new(),
        });
        if let Some(launch) = self.launch {
            profile.launch = launch;
        }
        if let Some(native) = self.native_session_resume {
            profile.native_session_resume = native;
        }
        if let Some(injection) = self.history_context_injection {
            profile.history_context_injection = injection;
        }
        if let Some(cli_resume) = self.cli_resume {
            profile.cli_resume = (!cli_resume.is_empty()).then_some(cli_resume);
        }
        if let Some(env) = self.env {
            profile.env.extend(env);
        }
        profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn profile(launch: &[&str], cli_resume: Option<&[&str]>) -> AgentProfile {
        let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        AgentProfile {
            name: "custom".into(),
            launch: owned(launch),
            native_session_resume: NativeSessionResume::Never,
            history_context_injection: false,
            cli_resume: cli_resume.map(owned),
            env: BTreeMap::new(),
        }
    }

    #[test]
    fn placeholder_scan() {
        let rows: [(&str, &[&str]); 7] = [
            ("{token}", &["token"]),
            ("--resume={token}", &["token"]),
            ("{a}{b_2}", &["a", "b_2"]),
            ("plain", &[]),
            (r#"{"json": 1}"#, &[]),
            ("{unclosed", &[]),
            ("{}", &[]),
        ];
        for (arg, expected) in rows {
            assert_eq!(placeholders(arg), expected, "{arg:?}");
        }
    }

    /// (launch, cliResume, expected problem fragment or None when valid)
    type ValidationRow = (
        &'static [&'static str],
        Option<&'static [&'static str]>,
        Option<&'static str>,
    );

    #[test]
    fn validation_table() {
        #[rustfmt::skip]
        let rows: [ValidationRow; 9] = [
            (&["agent", "--acp"], None, None),
            (&["agent"], Some(&["agent", "--resume", "{token}"]), None),
            (&["agent"], Some(&["agent", "--resume={token}"]), None),
            (&[], None, Some("`launch` is empty")),
            (&[" "], None, Some("empty program name")),
            (&["agent", "{token}"], None, Some("launch supports none")),
            (&["agent"], Some(&["agent", "{session}"]), Some("unknown placeholder {session}")),
            (&["agent"], Some(&["agent", "--continue"]), Some("does not contain {token}")),
            (&["agent"], Some(&["", "{token}"]), Some("empty program name")),
        ];
        for (launch, cli_resume, problem) in rows {
            let result = profile(launch, cli_resume).validate();
            match (problem, result) {
                (None, Ok(())) => {}
                (Some(fragment), Err(err)) => {
                    let message = err.to_string();
                    assert!(
                        message.contains("\"custom\""),
                        "names the profile: {message}"
                    );
                    assert!(
                        message.contains(fragment),
                        "{message} should mention {fragment}"
                    );
                }
                (expected, got) => panic!("{launch:?} {cli_resume:?}: {expected:?} vs {got:?}"),
            }
        }
    }

    #[test]
    fn cli_resume_substitutes_every_token() {
        let with = profile(&["a"], Some(&["amp", "threads", "continue", "{token}"]));
        assert_eq!(
            with.cli_resume_command("T-123"),
            Some(vec![
                "amp".into(),
                "threads".into(),
                "continue".into(),
                "T-123".into()
            ])
        );
        let embedded = profile(&["a"], Some(&["x", "--id={token}", "{token}"]));
        assert_eq!(
            embedded.cli_resume_command("7"),
            Some(vec!["x".into(), "--id=7".into(), "7".into()])
        );
        assert_eq!(profile(&["a"], None).cli_resume_command("T"), None);
    }
}
