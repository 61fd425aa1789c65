//! The launch-time fields of a TaskSession: what an agentctl pod takes from the spec when it is
//! created and never again (image, repository, credentials, resources, capabilities, idle,
//! permissions, sessionConfig). A pod records a fingerprint of each in its annotation
//! [`LAUNCH_SPEC_ANNOTATION`]; comparing it with the spec says which changes wait for the next
//! launch (`SpecApplied=False/PendingRestart`). Pure.

use serde_json::Value;

use super::TaskSessionSpec;
use super::names::short_hash;

/// The agentctl pod's record of the launch-time fields it was created from:
/// `field=fingerprint` pairs joined by `,`, in [`LAUNCH_FIELDS`] order.
pub const LAUNCH_SPEC_ANNOTATION: &str = "kandev.dev/launch-spec";

/// The spec fields (as in the CRD) that a pod takes at its creation.
pub const LAUNCH_FIELDS: [&str; 8] = [
    "image",
    "repository",
    "credentials",
    "resources",
    "capabilities",
    "idle",
    "permissions",
    "sessionConfig",
];

/// The fingerprints of `spec`'s launch-time fields, as a pod records them.
pub fn launch_spec_record(spec: &TaskSessionSpec) -> String {
    let json = serde_json::to_value(spec).unwrap_or(Value::Null);
    LAUNCH_FIELDS
        .iter()
        .map(|field| {
            let value = json.get(field).unwrap_or(&Value::Null);
            format!("{field}={}", short_hash(&value.to_string()))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The launch-time fields whose value in `spec` differs from the pod's `recorded` one, in
/// [`LAUNCH_FIELDS`] order. A field the record does not name (a pod of an older operator) is
/// not judged.
pub fn changed_launch_fields(recorded: &str, spec: &TaskSessionSpec) -> Vec<&'static str> {
    let now = launch_spec_record(spec);
    let pairs = |record: &str| -> Vec<(String, String)> {
        record
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let (was, now) = (pairs(recorded), pairs(&now));
    LAUNCH_FIELDS
        .into_iter()
        .filter(|field| {
            let of = |pairs: &[(String, String)]| {
                pairs
                    .iter()
                    .find(|(k, _)| k == field)
                    .map(|(_, v)| v.clone())
            };
            matches!((of(&was), of(&now)), (Some(a), Some(b)) if a != b)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(extra: Value) -> TaskSessionSpec {
        let mut base = json!({
            "taskId": "t-1",
            "agent": "claude-code",
            "workspace": {"template": {"size": "1Gi"}},
        });
        if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        serde_json::from_value(base).expect("spec")
    }

    #[test]
    fn changes_of_launch_time_fields_are_named() {
        let base = spec(json!({}));
        let recorded = launch_spec_record(&base);
        assert_eq!(recorded.split(',').count(), LAUNCH_FIELDS.len());
        #[rustfmt::skip]
        let rows: [(&str, Value, Vec<&str>); 6] = [
            ("nothing changed",          json!({}),                                          vec![]),
            ("the task description",     json!({"taskDescription": "more"}),                 vec![]),
            ("the image",                json!({"image": "agent:2"}),                         vec!["image"]),
            ("image and resources",      json!({"image": "agent:2", "resources": {"limits": {"cpu": "2"}}}), vec!["image", "resources"]),
            ("idle suspension",          json!({"idle": {"suspendAfter": "5m"}}),             vec!["idle"]),
            ("the session's mode",       json!({"sessionConfig": {"mode": "plan"}}),          vec!["sessionConfig"]),
        ];
        for (what, extra, want) in rows {
            assert_eq!(
                changed_launch_fields(&recorded, &spec(extra)),
                want,
                "{what}"
            );
        }
        // A record without a field (an older pod) does not judge it; garbage judges nothing.
        let older = recorded.replace(",sessionConfig=", ",unknown=");
        let changed = spec(json!({"sessionConfig": {"mode": "plan"}}));
        assert!(changed_launch_fields(&older, &changed).is_empty());
        assert!(changed_launch_fields("", &changed).is_empty());
        assert!(changed_launch_fields("image", &spec(json!({"image": "x"}))).is_empty());
    }
}
