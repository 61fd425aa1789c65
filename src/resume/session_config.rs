//! The session's mode, model and config options across a restore (pure).
//!
//! An ACP agent reports them in the `session/new`, `session/load` and `session/resume` answers
//! (`modes`, `models`, `configOptions`) and changes them with `session/update`s
//! (`current_mode_update`, `config_option_update`). What was last reported is saved in
//! ExecutorRunning `status.sessionConfig`; after a restore, [`set_back`] decides which of the
//! saved values must be set again because the restored session reports something else.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::api::{ConfigOptionValue, SessionConfigSpec, SessionConfigState};
use crate::jsonrpc::method;

/// What one `session/new`, `load` or `resume` answer says about the session's configuration:
/// the current values, and what the agent lets a client set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReportedConfig {
    pub state: SessionConfigState,
    /// `modes.availableModes[].id`; `None` when the answer has no `modes` (modes unsupported).
    pub modes: Option<Vec<String>>,
    /// `models.availableModels[].modelId`; `None` when the answer has no `models`.
    pub models: Option<Vec<String>>,
    /// The selectable values of each select config option, by option id (grouped options
    /// flattened). An option without a list of values (a boolean) is never set back.
    pub options: BTreeMap<String, Vec<String>>,
}

/// One call that puts a saved value back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetBack {
    Mode(String),
    Model(String),
    ConfigOption { id: String, value: String },
}

impl SetBack {
    /// The ACP method.
    pub fn method(&self) -> &'static str {
        match self {
            Self::Mode(_) => method::SESSION_SET_MODE,
            Self::Model(_) => method::SESSION_SET_MODEL,
            Self::ConfigOption { .. } => method::SESSION_SET_CONFIG_OPTION,
        }
    }

    /// The request's params for `session_id`.
    pub fn params(&self, session_id: &str) -> Value {
        match self {
            Self::Mode(mode) => json!({"sessionId": session_id, "modeId": mode}),
            Self::Model(model) => json!({"sessionId": session_id, "modelId": model}),
            Self::ConfigOption { id, value } => {
                json!({"sessionId": session_id, "configId": id, "value": value})
            }
        }
    }

    /// What the state becomes once the agent accepted this call.
    pub fn apply(&self, state: &mut SessionConfigState) {
        match self {
            Self::Mode(mode) => state.mode = Some(mode.clone()),
            Self::Model(model) => state.model = Some(model.clone()),
            Self::ConfigOption { id, value } => set_option(state, id, value),
        }
    }
}

fn set_option(state: &mut SessionConfigState, id: &str, value: &str) {
    match state.config_options.iter_mut().find(|o| o.id == id) {
        Some(option) => option.value = value.to_owned(),
        None => state.config_options.push(ConfigOptionValue {
            id: id.to_owned(),
            value: value.to_owned(),
        }),
    }
}

/// A config option's `currentValue` as a string (a value id, or `true`/`false`).
fn value_string(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn ids(list: Option<&Value>, field: &str) -> Vec<String> {
    list.and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.get(field)?.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The values of a select option, its groups flattened.
fn option_values(options: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for item in options.as_array().into_iter().flatten() {
        if let Some(value) = item.get("value").and_then(Value::as_str) {
            out.push(value.to_owned());
        }
        if item.get("options").is_some() {
            out.extend(option_values(&item["options"]));
        }
    }
    out
}

/// Reads `configOptions` into the state and the selectable values.
fn read_options(
    list: &Value,
    state: &mut SessionConfigState,
    options: &mut BTreeMap<String, Vec<String>>,
) {
    state.config_options.clear();
    for option in list.as_array().into_iter().flatten() {
        let (Some(id), Some(value)) = (
            option.get("id").and_then(Value::as_str),
            option.get("currentValue").and_then(value_string),
        ) else {
            continue;
        };
        set_option(state, id, &value);
        if let Some(values) = option.get("options") {
            options.insert(id.to_owned(), option_values(values));
        }
    }
}

/// What a `session/new`, `load` or `resume` result reports.
pub fn reported_config(result: &Value) -> ReportedConfig {
    let mut reported = ReportedConfig::default();
    if let Some(modes) = result.get("modes").filter(|m| m.is_object()) {
        reported.state.mode = modes
            .get("currentModeId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        reported.modes = Some(ids(modes.get("availableModes"), "id"));
    }
    if let Some(models) = result.get("models").filter(|m| m.is_object()) {
        reported.state.model = models
            .get("currentModelId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        reported.models = Some(ids(models.get("availableModels"), "modelId"));
    }
    if let Some(list) = result.get("configOptions") {
        read_options(list, &mut reported.state, &mut reported.options);
    }
    reported.state = reported.state.bounded();
    reported
}

/// Applies a `session/update`'s `update` object; true when the state changed.
pub fn apply_config_update(state: &mut SessionConfigState, update: &Value) -> bool {
    let before = state.clone();
    match update.get("sessionUpdate").and_then(Value::as_str) {
        Some("current_mode_update") => {
            if let Some(mode) = update.get("currentModeId").and_then(Value::as_str) {
                state.mode = Some(mode.to_owned());
            }
        }
        Some("config_option_update") => {
            if let Some(list) = update.get("configOptions") {
                read_options(list, state, &mut BTreeMap::new());
            }
        }
        _ => {}
    }
    *state = std::mem::take(state).bounded();
    *state != before
}

/// The calls that put `saved` back on a restored session that reports `reported`: only where
/// the values differ and the agent offers the saved value (a mode, model or option value the
/// agent no longer lists cannot be set, and is left as the agent has it).
pub fn set_back(saved: &SessionConfigState, reported: &ReportedConfig) -> Vec<SetBack> {
    let mut calls = Vec::new();
    if let (Some(mode), Some(modes)) = (&saved.mode, &reported.modes)
        && reported.state.mode.as_ref() != Some(mode)
        && modes.contains(mode)
    {
        calls.push(SetBack::Mode(mode.clone()));
    }
    if let (Some(model), Some(models)) = (&saved.model, &reported.models)
        && reported.state.model.as_ref() != Some(model)
        && models.contains(model)
    {
        calls.push(SetBack::Model(model.clone()));
    }
    for option in &saved.config_options {
        let current = reported
            .state
            .config_options
            .iter()
            .find(|o| o.id == option.id);
        let offered = reported
            .options
            .get(&option.id)
            .is_some_and(|values| values.contains(&option.value));
        if current.is_some_and(|c| c.value != option.value) && offered {
            calls.push(SetBack::ConfigOption {
                id: option.id.clone(),
                value: option.value.clone(),
            });
        }
    }
    calls
}

/// The configuration a launch asks agentctl to set: `saved` (what the restored session had;
/// `None` for a new session) with `spec` (`spec.sessionConfig`) laid over it. `None` when neither
/// says anything.
pub fn wanted_config(
    saved: Option<&SessionConfigState>,
    spec: Option<&SessionConfigSpec>,
) -> Option<SessionConfigState> {
    let mut wanted = saved.cloned().unwrap_or_default();
    if let Some(spec) = spec {
        let spec = spec.state();
        wanted.mode = spec.mode.or(wanted.mode);
        wanted.model = spec.model.or(wanted.model);
        for option in spec.config_options {
            match wanted.config_options.iter_mut().find(|o| o.id == option.id) {
                Some(current) => current.value = option.value,
                None => wanted.config_options.push(option),
            }
        }
    }
    (wanted != SessionConfigState::default()).then_some(wanted)
}

/// What of `wanted` the session that reported `reported` neither has nor offers, in words
/// (`mode "turbo" (offered: default, plan)`); empty when all of it is set or can be.
pub fn not_offered(wanted: &SessionConfigState, reported: &ReportedConfig) -> Vec<String> {
    let list = |values: &[String]| {
        if values.is_empty() {
            "none".to_string()
        } else {
            values.join(", ")
        }
    };
    let mut missing = Vec::new();
    let mut check = |what: &str,
                     want: &Option<String>,
                     have: &Option<String>,
                     offered: &Option<Vec<String>>| {
        let Some(want) = want.as_ref().filter(|w| have.as_ref() != Some(*w)) else {
            return;
        };
        match offered {
            Some(values) if values.contains(want) => {}
            Some(values) => missing.push(format!("{what} {want:?} (offered: {})", list(values))),
            None => missing.push(format!("{what} {want:?} (the agent offers no {what}s)")),
        }
    };
    check("mode", &wanted.mode, &reported.state.mode, &reported.modes);
    check(
        "model",
        &wanted.model,
        &reported.state.model,
        &reported.models,
    );
    for option in &wanted.config_options {
        let current = reported
            .state
            .config_options
            .iter()
            .find(|o| o.id == option.id);
        if current.is_some_and(|c| c.value == option.value) {
            continue;
        }
        match (current, reported.options.get(&option.id)) {
            (Some(_), Some(values)) if values.contains(&option.value) => {}
            (Some(_), Some(values)) => missing.push(format!(
                "option {} {:?} (offered: {})",
                option.id,
                option.value,
                list(values)
            )),
            _ => missing.push(format!(
                "option {} {:?} (the agent offers no such select option)",
                option.id, option.value
            )),
        }
    }
    missing
}

/// What a launch left of the session's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Configured {
    /// The configuration once agentctl's set calls are accepted.
    pub state: SessionConfigState,
    /// What of the wanted configuration the agent does not offer, in words; `None`: nothing.
    pub problem: Option<String>,
}

/// The session's configuration once the `calls` agentctl sends after `reported` are accepted.
pub fn configured(reported: &ReportedConfig, calls: &[SetBack]) -> SessionConfigState {
    let mut state = reported.state.clone();
    for call in calls {
        call.apply(&mut state);
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(
        mode: Option<&str>,
        model: Option<&str>,
        options: &[(&str, &str)],
    ) -> SessionConfigState {
        SessionConfigState {
            mode: mode.map(str::to_owned),
            model: model.map(str::to_owned),
            config_options: options
                .iter()
                .map(|(id, value)| ConfigOptionValue {
                    id: (*id).to_owned(),
                    value: (*value).to_owned(),
                })
                .collect(),
        }
    }

    fn answer() -> Value {
        json!({
            "sessionId": "s",
            "modes": {"currentModeId": "default", "availableModes": [
                {"id": "default", "name": "Default"}, {"id": "plan", "name": "Plan"}]},
            "models": {"currentModelId": "small", "availableModels": [
                {"modelId": "small", "name": "S"}, {"modelId": "large", "name": "L"}]},
            "configOptions": [
                {"id": "effort", "name": "Effort", "type": "select", "currentValue": "low",
                 "options": [{"value": "low", "name": "Low"}, {"group": "more", "name": "More",
                   "options": [{"value": "high", "name": "High"}]}]},
                {"id": "web", "name": "Web", "type": "boolean", "currentValue": false}
            ]
        })
    }

    #[test]
    fn a_result_is_read_with_what_can_be_set() {
        let reported = reported_config(&answer());
        assert_eq!(
            reported.state,
            state(
                Some("default"),
                Some("small"),
                &[("effort", "low"), ("web", "false")]
            )
        );
        assert_eq!(reported.modes, Some(vec!["default".into(), "plan".into()]));
        assert_eq!(reported.models, Some(vec!["small".into(), "large".into()]));
        assert_eq!(
            reported.options.get("effort"),
            Some(&vec!["low".to_owned(), "high".to_owned()])
        );
        assert!(!reported.options.contains_key("web"));
        assert_eq!(
            reported_config(&json!({"sessionId": "s"})),
            ReportedConfig::default()
        );
    }

    /// A hostile agent's report keeps its bounds (issue 30): at most CONFIG_ITEMS_MAX options,
    /// and an id, value, mode or model over AGENT_NAME_MAX dropped, never cut.
    #[test]
    fn a_report_keeps_its_bounds() {
        use crate::api::bounds::{AGENT_NAME_MAX, CONFIG_ITEMS_MAX};
        let long = "x".repeat(AGENT_NAME_MAX + 1);
        let options: Vec<Value> = [json!({"id": "big", "currentValue": long})]
            .into_iter()
            .chain((0..10_000).map(|n| json!({"id": format!("o{n}"), "currentValue": true})))
            .collect();
        let result = json!({"modes": {"currentModeId": long}, "models": {"currentModelId": "m"},
            "configOptions": options});
        let reported = reported_config(&result);
        assert_eq!(reported.state.mode, None);
        assert_eq!(reported.state.model.as_deref(), Some("m"));
        assert_eq!(reported.state.config_options.len(), CONFIG_ITEMS_MAX);
        assert_eq!(reported.state.config_options[0].id, "o0");
        let mut state = SessionConfigState::default();
        let update = json!({"sessionUpdate": "config_option_update", "configOptions": options});
        assert!(apply_config_update(&mut state, &update));
        assert_eq!(state.config_options.len(), CONFIG_ITEMS_MAX);
    }

    #[test]
    fn updates_change_the_state() {
        let cases = [
            (
                json!({"sessionUpdate": "current_mode_update", "currentModeId": "plan"}),
                true,
                state(Some("plan"), None, &[]),
            ),
            (
                json!({"sessionUpdate": "config_option_update", "configOptions": [
                {"id": "effort", "type": "select", "currentValue": "high", "options": []}]}),
                true,
                state(Some("default"), None, &[("effort", "high")]),
            ),
            (
                json!({"sessionUpdate": "current_mode_update", "currentModeId": "default"}),
                false,
                state(Some("default"), None, &[]),
            ),
            (
                json!({"sessionUpdate": "agent_message_chunk", "content": {}}),
                false,
                state(Some("default"), None, &[]),
            ),
        ];
        for (update, changed, want) in cases {
            let mut current = state(Some("default"), None, &[]);
            assert_eq!(
                apply_config_update(&mut current, &update),
                changed,
                "{update}"
            );
            assert_eq!(current, want, "{update}");
        }
    }

    #[test]
    fn set_back_table() {
        let reported = reported_config(&answer());
        let no_modes = reported_config(&json!({"configOptions": answer()["configOptions"]}));
        let cases: Vec<(&str, SessionConfigState, &ReportedConfig, Vec<SetBack>)> = vec![
            ("nothing saved", state(None, None, &[]), &reported, vec![]),
            (
                "same values",
                state(Some("default"), Some("small"), &[("effort", "low")]),
                &reported,
                vec![],
            ),
            (
                "all differ",
                state(Some("plan"), Some("large"), &[("effort", "high")]),
                &reported,
                vec![
                    SetBack::Mode("plan".into()),
                    SetBack::Model("large".into()),
                    SetBack::ConfigOption {
                        id: "effort".into(),
                        value: "high".into(),
                    },
                ],
            ),
            (
                "mode no longer offered",
                state(Some("yolo"), None, &[]),
                &reported,
                vec![],
            ),
            (
                "model no longer offered",
                state(None, Some("huge"), &[]),
                &reported,
                vec![],
            ),
            (
                "agent without modes",
                state(Some("plan"), None, &[]),
                &no_modes,
                vec![],
            ),
            (
                "unknown option",
                state(None, None, &[("colour", "red")]),
                &reported,
                vec![],
            ),
            (
                "value not offered",
                state(None, None, &[("effort", "max")]),
                &reported,
                vec![],
            ),
            (
                "boolean options are not set back",
                state(None, None, &[("web", "true")]),
                &reported,
                vec![],
            ),
        ];
        for (name, saved, reported, want) in cases {
            assert_eq!(set_back(&saved, reported), want, "{name}");
        }
    }

    #[test]
    fn set_back_requests_and_their_effect() {
        let calls = [
            (
                SetBack::Mode("plan".into()),
                "session/set_mode",
                json!({"sessionId": "s", "modeId": "plan"}),
            ),
            (
                SetBack::Model("large".into()),
                "session/set_model",
                json!({"sessionId": "s", "modelId": "large"}),
            ),
            (
                SetBack::ConfigOption {
                    id: "effort".into(),
                    value: "high".into(),
                },
                "session/set_config_option",
                json!({"sessionId": "s", "configId": "effort", "value": "high"}),
            ),
        ];
        let mut current = state(Some("default"), Some("small"), &[("effort", "low")]);
        for (call, method, params) in calls {
            assert_eq!(call.method(), method);
            assert_eq!(call.params("s"), params);
            call.apply(&mut current);
        }
        assert_eq!(
            current,
            state(Some("plan"), Some("large"), &[("effort", "high")])
        );
    }

    /// spec.sessionConfig over the saved configuration: the spec wins field by field, options
    /// by id; nothing wanted is `None`.
    #[test]
    fn the_spec_is_laid_over_the_saved_configuration() {
        let saved = state(
            Some("plan"),
            Some("small"),
            &[("effort", "low"), ("style", "terse")],
        );
        let spec = SessionConfigSpec {
            mode: Some("default".into()),
            model: None,
            options: [("effort".to_string(), "high".to_string())].into(),
        };
        assert_eq!(
            wanted_config(Some(&saved), Some(&spec)),
            Some(state(
                Some("default"),
                Some("small"),
                &[("effort", "high"), ("style", "terse")]
            ))
        );
        assert_eq!(wanted_config(Some(&saved), None), Some(saved.clone()));
        assert_eq!(
            wanted_config(None, Some(&spec)),
            Some(state(Some("default"), None, &[("effort", "high")]))
        );
        assert_eq!(wanted_config(None, None), None);
        assert_eq!(
            wanted_config(None, Some(&SessionConfigSpec::default())),
            None
        );
    }

    /// What the agent does not offer is named with what it offers; what it has or offers is not.
    #[test]
    fn what_the_agent_does_not_offer_is_named() {
        let reported = reported_config(&answer());
        let fine = state(Some("plan"), Some("large"), &[("effort", "high")]);
        assert_eq!(not_offered(&fine, &reported), Vec::<String>::new());
        let calls = set_back(&fine, &reported);
        let mut expected = fine.clone();
        expected.config_options.push(ConfigOptionValue {
            id: "web".into(),
            value: "false".into(),
        });
        assert_eq!(configured(&reported, &calls), expected);
        let wrong = state(
            Some("turbo"),
            Some("huge"),
            &[("effort", "max"), ("color", "red")],
        );
        assert_eq!(
            not_offered(&wrong, &reported),
            [
                r#"mode "turbo" (offered: default, plan)"#,
                r#"model "huge" (offered: small, large)"#,
                r#"option effort "max" (offered: low, high)"#,
                r#"option color "red" (the agent offers no such select option)"#,
            ]
        );
        let bare = reported_config(&json!({"sessionId": "s"}));
        assert_eq!(
            not_offered(&state(Some("plan"), None, &[]), &bare),
            [r#"mode "plan" (the agent offers no modes)"#]
        );
    }
}
