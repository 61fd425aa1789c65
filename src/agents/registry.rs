//! The agent capability registry: built-in profiles from `profiles.yaml`, extended or
//! overridden by configuration (DESIGN §3 "Profiles can be extended by configuration").

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::AgentRegistryError;
use super::profile::{AgentProfile, ProfilePatch};

/// The built-in profiles, embedded so the operator needs no file to run.
const BUILTIN_PROFILES_YAML: &str = include_str!("profiles.yaml");

/// The shape of a profiles file (YAML, or JSON since JSON is valid YAML).
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct ProfilesFile {
    #[serde(default)]
    profiles: BTreeMap<String, ProfilePatch>,
}

/// Agent profiles by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentRegistry {
    profiles: BTreeMap<String, AgentProfile>,
}

impl AgentRegistry {
    /// The built-in profiles only. Fails only if the embedded file is broken, which the unit
    /// tests rule out; it still returns a `Result` so a bad edit can never panic the operator.
    pub fn builtin() -> Result<Self, AgentRegistryError> {
        let mut registry = Self {
            profiles: BTreeMap::new(),
        };
        registry.extend_from_yaml(BUILTIN_PROFILES_YAML, "built-in profiles")?;
        Ok(registry)
    }

    /// Built-ins extended/overridden by the profiles in `text` (YAML or JSON).
    pub fn from_yaml_str(text: &str) -> Result<Self, AgentRegistryError> {
        let mut registry = Self::builtin()?;
        registry.extend_from_yaml(text, "inline profiles")?;
        Ok(registry)
    }

    /// Built-ins extended/overridden by the profiles file at `path` (YAML or JSON).
    pub fn load_file(path: &Path) -> Result<Self, AgentRegistryError> {
        let text = std::fs::read_to_string(path).map_err(|source| AgentRegistryError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut registry = Self::builtin()?;
        registry.extend_from_yaml(&text, &path.display().to_string())?;
        Ok(registry)
    }

    pub fn get(&self, name: &str) -> Option<&AgentProfile> {
        self.profiles.get(name)
    }

    /// Profile names in order, e.g. for an "unknown agent; known: …" message.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.profiles.keys().map(String::as_str)
    }

    /// Merges a profiles document into the registry, field by field and by name. All or
    /// nothing: if any profile is invalid the registry is left unchanged.
    pub fn extend_from_yaml(&mut self, text: &str, origin: &str) -> Result<(), AgentRegistryError> {
        // An empty document (or one of only comments) parses as `None`: nothing to add.
        let file: Option<ProfilesFile> =
            serde_yaml_ng::from_str(text).map_err(|source| AgentRegistryError::Parse {
                origin: origin.to_owned(),
                source,
            })?;
        let mut merged = self.profiles.clone();
        for (name, patch) in file.unwrap_or_default().profiles {
            let base = merged.get(&name);
            if base.is_some() {
                tracing::debug!(profile = %name, origin, "overriding agent profile");
            }
            let profile = patch.apply(&name, base);
            profile.validate()?;
            merged.insert(name, profile);
        }
        self.profiles = merged;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resume::NativeSessionResume;
    use pretty_assertions::assert_eq;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn a_profile_round_trips_through_its_document() {
        let registry = AgentRegistry::builtin().expect("built-ins");
        for name in registry.names() {
            let profile = registry.get(name).expect("profile");
            let mut other = AgentRegistry {
                profiles: BTreeMap::new(),
            };
            other
                .extend_from_yaml(&profile.to_document(), "document")
                .expect("document parses");
            assert_eq!(other.get(name), Some(profile), "{name}");
        }
    }

    #[test]
    fn every_builtin_profile_loads() -> Result<(), AgentRegistryError> {
        let registry = AgentRegistry::builtin()?;
        // (name, launch, historyContextInjection, has cliResume); every built-in trusts what
        // the agent advertises (`nativeSessionResume: auto`).
        #[rustfmt::skip]
        let rows: [(&str, &[&str], bool, bool); 7] = [
            ("claude-code", &["claude-agent-acp"], false, true),
            ("codex", &["codex-acp"], false, true),
            ("copilot", &["copilot", "--acp"], false, true),
            ("auggie", &["auggie", "--acp"], true, true),
            ("gemini", &["gemini", "--acp"], false, true),
            ("amp", &["amp-acp"], true, true),
            ("opencode", &["opencode", "acp"], false, true),
        ];
        assert_eq!(registry.names().count(), rows.len());
        for (name, launch, injection, has_cli_resume) in rows {
            let Some(profile) = registry.get(name) else {
                panic!("built-in profile {name} missing");
            };
            assert_eq!(profile.name, name);
            assert_eq!(profile.launch, argv(launch), "{name}");
            assert_eq!(
                profile.native_session_resume,
                NativeSessionResume::Auto,
                "{name}"
            );
            assert_eq!(profile.history_context_injection, injection, "{name}");
            assert_eq!(profile.cli_resume.is_some(), has_cli_resume, "{name}");
        }
        Ok(())
    }

    #[test]
    fn design_cli_resume_examples() -> Result<(), AgentRegistryError> {
        // §3 registry: Claude Code `--resume <token>`, Amp `threads continue <id>`.
        let registry = AgentRegistry::builtin()?;
        let command = |name: &str| registry.get(name).and_then(|p| p.cli_resume_command("abc"));
        assert_eq!(
            command("claude-code"),
            Some(argv(&["claude", "--resume", "abc"]))
        );
        assert_eq!(
            command("amp"),
            Some(argv(&["amp", "threads", "continue", "abc"]))
        );
        assert_eq!(command("copilot"), Some(argv(&["copilot", "--resume=abc"])));
        Ok(())
    }

    #[test]
    fn override_merges_field_by_field() -> Result<(), AgentRegistryError> {
        let registry = AgentRegistry::from_yaml_str(
            r#"
profiles:
  claude-code:
    env: { IS_SANDBOX: "1" }
  amp:
    nativeSessionResume: false
    cliResume: []
  gemini:
    nativeSessionResume: true
"#,
        )?;
        let builtin = AgentRegistry::builtin()?;
        let claude = registry.get("claude-code");
        let builtin_claude = builtin.get("claude-code");
        // Untouched fields are inherited.
        assert_eq!(claude.map(|p| &p.launch), builtin_claude.map(|p| &p.launch));
        assert_eq!(
            claude.map(|p| &p.cli_resume),
            builtin_claude.map(|p| &p.cli_resume)
        );
        let env = claude.map(|p| p.env.clone()).unwrap_or_default();
        assert_eq!(env.get("IS_SANDBOX").map(String::as_str), Some("1"));
        // Overridden fields win; an empty cliResume removes the inherited one.
        let amp = registry.get("amp");
        assert_eq!(
            amp.map(|p| p.native_session_resume),
            Some(NativeSessionResume::Never)
        );
        assert_eq!(
            registry.get("gemini").map(|p| p.native_session_resume),
            Some(NativeSessionResume::Always)
        );
        assert_eq!(amp.map(|p| p.history_context_injection), Some(true));
        assert_eq!(amp.and_then(|p| p.cli_resume.clone()), None);
        // Other built-ins are untouched.
        assert_eq!(registry.get("codex"), builtin.get("codex"));
        Ok(())
    }

    #[test]
    fn custom_profile_is_added_from_json() -> Result<(), AgentRegistryError> {
        let registry = AgentRegistry::from_yaml_str(
            r#"{"profiles": {"my-agent": {"launch": ["my-agent", "--acp"],
                "cliResume": ["my-agent", "--resume", "{token}"], "env": {"MODE": "acp"}}}}"#,
        )?;
        let custom = registry.get("my-agent");
        assert_eq!(
            custom.map(|p| p.launch.clone()),
            Some(argv(&["my-agent", "--acp"]))
        );
        // A new profile claims no capabilities it did not state.
        assert_eq!(
            custom.map(|p| p.native_session_resume),
            Some(NativeSessionResume::Never)
        );
        assert_eq!(custom.map(|p| p.history_context_injection), Some(false));
        assert_eq!(
            custom.and_then(|p| p.cli_resume_command("s1")),
            Some(argv(&["my-agent", "--resume", "s1"]))
        );
        assert_eq!(registry.names().count(), 8);
        Ok(())
    }

    #[test]
    fn empty_document_adds_nothing() -> Result<(), AgentRegistryError> {
        for text in ["", "# only a comment\n", "profiles: {}"] {
            assert_eq!(
                AgentRegistry::from_yaml_str(text)?,
                AgentRegistry::builtin()?
            );
        }
        Ok(())
    }

    #[test]
    fn bad_documents_fail_with_a_clear_error() {
        // (document, fragments the message must contain)
        #[rustfmt::skip]
        let rows: [(&str, &[&str]); 7] = [
            // A new profile without launch names the profile.
            ("profiles: { my-agent: { nativeSessionResume: true } }", &["\"my-agent\"", "`launch` is empty"]),
            // An override that breaks a built-in names it too.
            ("profiles: { amp: { cliResume: [amp, '{thread}'] } }", &["\"amp\"", "{thread}"]),
            ("profiles: { codex: { launch: [] } }", &["\"codex\"", "`launch` is empty"]),
            // Typos are not silently ignored.
            ("profiles: { codex: { lanch: [x] } }", &["inline profiles", "lanch"]),
            ("agents: {}", &["inline profiles", "agents"]),
            ("profiles: { codex: { launch: 3 } }", &["inline profiles", "invalid type"]),
            ("profiles: { codex: { nativeSessionResume: sometimes } }", &["inline profiles", "auto, true or false"]),
        ];
        for (text, fragments) in rows {
            let message = match AgentRegistry::from_yaml_str(text) {
                Ok(_) => panic!("{text:?} should be rejected"),
                Err(err) => err.to_string(),
            };
            for fragment in fragments {
                assert!(message.contains(fragment), "{message:?} lacks {fragment:?}");
            }
        }
    }

    #[test]
    fn load_file_reads_yaml_and_reports_missing_files() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("agents.yaml");
        std::fs::write(&path, "profiles:\n  gemini:\n    launch: [gemini, --acp]\n")?;
        let registry = AgentRegistry::load_file(&path)?;
        assert_eq!(
            registry.get("gemini").map(|p| p.launch.clone()),
            Some(argv(&["gemini", "--acp"]))
        );

        let missing = dir.path().join("nope.yaml");
        let message = AgentRegistry::load_file(&missing)
            .err()
            .map(|e| e.to_string());
        assert!(message.is_some_and(|m| m.contains("nope.yaml")));

        std::fs::write(&path, "profiles: [")?;
        let message = AgentRegistry::load_file(&path).err().map(|e| e.to_string());
        assert!(message.is_some_and(|m| m.contains("agents.yaml")));
        Ok(())
    }
}
