//! Names of what the operator creates for a session — pods, claims, the ExecutorRunning, the
//! NetworkPolicy — and the labels they carry (the pod's own contract with agentctl is in
//! `pod_contract/`).
//! Pure and deterministic: a restarted operator must find what it created before by name.

use kube::ResourceExt;

use super::TaskSession;

/// Label on every pod the operator manages.
pub const MANAGED_LABEL: &str = "kandev.dev/managed";
/// Label naming the TaskSession a managed pod belongs to.
pub const SESSION_LABEL: &str = "kandev.dev/session";

/// Label carrying a short hash of the resume request a pod was created for, so that a restarted
/// operator adopts that pod instead of creating a second one (DESIGN §3 step 3).
pub const REQUEST_LABEL: &str = "kandev.dev/request";

/// Label on a session's history reader pod (value `history`): a pod that only mounts the
/// workspace read-only so `kubectl kandev history` can read the transcript while no agent pod
/// runs. It is never an agent pod: the resume rules do not see it.
pub const ROLE_LABEL: &str = "kandev.dev/role";
/// [`ROLE_LABEL`]'s value on a history reader pod.
pub const READER_ROLE: &str = "history";

/// Whether `labels` mark a history reader pod ([`ROLE_LABEL`]).
pub fn is_reader(labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(ROLE_LABEL)).map(String::as_str) == Some(READER_ROLE)
}

/// The name of a session's history reader pod (at most one at a time).
pub fn reader_pod_name(session: &str) -> String {
    suffixed(session, "-history")
}

/// `<session><suffix>`, the session's name cut to fit 253 characters (never ending in '.' or
/// '-' before the suffix).
fn suffixed(session: &str, suffix: &str) -> String {
    let prefix = if session.len() > 253 - suffix.len() {
        session[..253 - suffix.len()].trim_end_matches(['.', '-'])
    } else {
        session
    };
    format!("{prefix}{suffix}")
}

/// A stable, short, label-safe hash (FNV-1a 64, hex) — names must not depend on process state.
pub fn short_hash(text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")[..10].to_string()
}

/// A label value (≤ 63 chars) naming the session: the name itself when it fits.
pub fn session_label_value(session: &str) -> String {
    if session.len() <= 63 {
        session.to_string()
    } else {
        format!("{}-{}", &session[..52], short_hash(session))
    }
}

/// The pod name for one launch: deterministic in (session, request), so a create that races
/// with a restart answers AlreadyExists and the existing pod is adopted.
pub fn pod_name(session: &str, request: &str) -> String {
    let suffix = short_hash(request);
    let max_prefix = 253 - suffix.len() - 7;
    let prefix = if session.len() > max_prefix {
        // A cut name may end in '.' or '-', which "<prefix>-agent-…" must not follow.
        session[..max_prefix].trim_end_matches(['.', '-'])
    } else {
        session
    };
    format!("{prefix}-agent-{suffix}")
}

/// The name of the PVC created from `spec.workspace.template`.
pub fn workspace_claim_name(ts: &TaskSession) -> String {
    ts.spec
        .workspace
        .claim_name
        .clone()
        .unwrap_or_else(|| format!("{}-workspace", ts.name_any()))
}

/// The name of a session's ExecutorRunning (one per session, owned by it).
pub fn executor_name(ts: &TaskSession) -> String {
    ts.name_any()
}

/// The name of a session's egress NetworkPolicy (one per session, owned by it).
pub fn network_policy_name(session: &str) -> String {
    suffixed(session, "-agent-egress")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_names_are_deterministic_per_request_and_valid() {
        assert_eq!(pod_name("demo", "t1"), pod_name("demo", "t1"));
        assert_ne!(pod_name("demo", "t1"), pod_name("demo", "t2"));
        let long = "a".repeat(253);
        assert!(pod_name(&long, "t1").len() <= 253);
        // Cut where the name has a '.': the pod name is still a DNS-1123 subdomain.
        let dotted = format!("{}.{}", "a".repeat(235), "b".repeat(17));
        let name = pod_name(&dotted, "t1");
        assert!(!name.contains(".-") && !name.contains("-."), "{name}");
        assert_eq!(session_label_value("demo"), "demo");
        assert_eq!(session_label_value(&long).len(), 63);
    }
}
