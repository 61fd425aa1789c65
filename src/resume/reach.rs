//! DESIGN §3 status case 1 says "running **and reachable**": a pod that Kubernetes reports
//! Running is not enough. Two things make a Running agentctl pod count as lost:
//!
//! - **`AgentUnreachable`** (kandev's "stale execution"): the pod has not been `Ready` for the
//!   configured time, continuously. Its kubelet decides `Ready` with the pod's readiness probe
//!   (`agentctl events --once`, which serve answers over its socket), so knowing costs the
//!   operator no exec and no API request: the pod watch brings it.
//! - **`NodeLost`**: the pod's node is gone, or has not been Ready for the configured grace
//!   period, so its kubelet may never confirm that the pod stopped.
//!
//! Either way the operator first writes the status that explains it, then deletes the pod (a
//! lost node's pod with grace period 0: its kubelet cannot confirm anything); the session is
//! lost only once the pod is gone, so two agentctls never share the workspace. Pure: the
//! reconciler gathers [`ReachFacts`] from its pod and node caches, [`judge`] decides.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

/// Why a pod that Kubernetes reports Running counts as lost. Its [`LossCause::reason`] is the
/// reason of the `AgentRunning` and `NeedsResume` conditions and of the Warning Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossCause {
    AgentUnreachable,
    NodeLost,
}

impl LossCause {
    pub const ALL: [LossCause; 2] = [Self::AgentUnreachable, Self::NodeLost];

    /// The condition and Event reason.
    pub fn reason(self) -> &'static str {
        match self {
            Self::AgentUnreachable => "AgentUnreachable",
            Self::NodeLost => "NodeLost",
        }
    }

    /// The cause a condition reason names, if any.
    pub fn from_reason(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.reason() == reason)
    }

    /// Whether the pod is deleted with grace period 0: a lost node's kubelet never confirms a
    /// graceful deletion, so the pod would stay Terminating (and a relaunch would wait for it)
    /// until the node came back. An unreachable agentctl on a live node gets the pod's own
    /// grace period (the kubelet kills a frozen process at its end).
    pub fn force_delete(self) -> bool {
        self == Self::NodeLost
    }
}

/// The node of a running pod, as the operator's node cache shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    /// Nodes are not watched (`--node-lost-seconds 0`), the cache is not ready, or the pod has
    /// no node: nothing is concluded.
    Unknown,
    Ready,
    /// The node's `Ready` condition is not True, since then (when it says).
    NotReady {
        since: Option<Timestamp>,
    },
    /// The node does not exist; the pod was scheduled to it at `scheduled` (when it says).
    Missing {
        scheduled: Option<Timestamp>,
    },
}

/// Everything [`judge`] looks at for one running pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReachFacts {
    /// The pod's name and node, for the messages.
    pub pod: String,
    pub node_name: String,
    /// Since when the pod has not been `Ready` ([`not_ready_since`]; `None`: it is Ready, or
    /// nothing is known).
    pub not_ready_since: Option<Timestamp>,
    /// `None`: unreachable agents are never declared lost.
    pub unreachable_after: Option<Duration>,
    pub node: NodeHealth,
    /// `None`: lost nodes are not looked at.
    pub node_lost_after: Option<Duration>,
}

/// What [`judge`] concludes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Nothing wrong is known.
    Reachable,
    /// Something is wrong but its time is not up: look again after this long.
    Suspect { recheck: Duration },
    /// The pod counts as lost once it is deleted and gone.
    Lost { cause: LossCause, message: String },
}

/// Decides whether a running pod is reachable. Its messages depend only on the facts, not on
/// `now`, so that a repeated pass writes nothing new. A lost node comes first (its agentctl is
/// unreachable too, and its pod needs the forced deletion); then agentctl's silence. A time
/// that is not known (a NotReady node without a transition time, a missing node of a pod
/// without a scheduling time) counts from `now`, so it never declares a loss early.
pub fn judge(facts: &ReachFacts, now: Timestamp) -> Reach {
    let elapsed = |since: Option<Timestamp>| {
        since.map_or(Duration::ZERO, |t| now.duration_since(t).unsigned_abs())
    };
    let mut recheck: Option<Duration> = None;
    let mut suspect = |left: Duration| {
        recheck = Some(recheck.map_or(left, |r: Duration| r.min(left)));
    };
    if let Some(grace) = facts.node_lost_after {
        let node = &facts.node_name;
        let lost = match facts.node {
            NodeHealth::Unknown | NodeHealth::Ready => None,
            NodeHealth::NotReady { since } => Some((
                elapsed(since),
                match since {
                    Some(since) => format!("node {node} has not been Ready since {since}"),
                    None => format!("node {node} is not Ready"),
                },
            )),
            NodeHealth::Missing { scheduled } => {
                Some((elapsed(scheduled), format!("node {node} no longer exists")))
            }
        };
        if let Some((for_how_long, what)) = lost {
            if for_how_long >= grace {
                return Reach::Lost {
                    cause: LossCause::NodeLost,
                    message: format!(
                        "{what} (grace period {}): agentctl pod {} counts as lost and is force-deleted",
                        secs(grace),
                        facts.pod
                    ),
                };
            }
            suspect(grace - for_how_long);
        }
    }
    if let (Some(limit), Some(since)) = (facts.unreachable_after, facts.not_ready_since) {
        let silent = elapsed(Some(since));
        if silent >= limit {
            return Reach::Lost {
                cause: LossCause::AgentUnreachable,
                message: format!(
                    "pod {} has not been Ready since {since} (its readiness probe, agentctl events --once, gets no answer from agentctl; limit {}): the pod counts as lost and is deleted",
                    facts.pod,
                    secs(limit)
                ),
            };
        }
        suspect(limit - silent);
    }
    match recheck {
        Some(recheck) => Reach::Suspect { recheck },
        None => Reach::Reachable,
    }
}

/// What a new resume request gets while the session's pod runs (DESIGN §3 case 1 is "running
/// and reachable").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunningRequest {
    /// The pod is Ready (or unreachable agents are not looked for) and its node is not in doubt:
    /// the request is handled as "already running".
    AlreadyRunning,
    /// The pod is suspect or counts as lost: the request waits, unhandled, until the pod is
    /// gone (then it resumes) or it is Ready again.
    Wait,
}

/// Decides [`RunningRequest`] from what is known at `now`.
pub fn running_request(facts: &ReachFacts, now: Timestamp) -> RunningRequest {
    match judge(facts, now) {
        Reach::Reachable => RunningRequest::AlreadyRunning,
        Reach::Lost { .. } | Reach::Suspect { .. } => RunningRequest::Wait,
    }
}

/// Since when `pod` has not been `Ready`, as its kubelet reports it: the `Ready` condition's
/// last transition when its status is not `True`, but never before `seen_alive` (when the
/// operator last had an answer from this pod's agentctl, e.g. its launch's restore: a probe's
/// first success may come a period after that). `None`: Ready, or no `Ready` condition yet.
pub fn not_ready_since(pod: &Pod, seen_alive: Option<Timestamp>) -> Option<Timestamp> {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))?;
    if ready.status == "True" {
        return None;
    }
    let since = ready.last_transition_time.as_ref().map(|t| t.0);
    match (since, seen_alive) {
        (Some(since), Some(alive)) => Some(since.max(alive)),
        (since, alive) => since.or(alive),
    }
}

/// `12s`, `5m0s`.
fn secs(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{}s", s / 60, s % 60)
    }
}

/// The health of `pod`'s node from the node cache: `node` is the cached Node of that name
/// (`None`: not in the cache), `watched` whether the cache is in use and has listed once.
pub fn node_health(pod: &Pod, node: Option<&Node>, watched: bool) -> NodeHealth {
    let Some(_) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
        return NodeHealth::Unknown;
    };
    if !watched {
        return NodeHealth::Unknown;
    }
    let Some(node) = node else {
        let scheduled = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
            .and_then(|c| c.last_transition_time.as_ref())
            .or(pod.metadata.creation_timestamp.as_ref())
            .map(|t| t.0);
        return NodeHealth::Missing { scheduled };
    };
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => NodeHealth::Ready,
        Some(c) => NodeHealth::NotReady {
            since: c.last_transition_time.as_ref().map(|t| t.0),
        },
        // A node that never reported: not concluded (it may be joining).
        None => NodeHealth::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("timestamp")
    }

    fn facts(not_ready: Option<i64>, node: NodeHealth) -> ReachFacts {
        ReachFacts {
            pod: "s-agent-1".into(),
            node_name: "n1".into(),
            not_ready_since: not_ready.map(at),
            unreachable_after: Some(Duration::from_secs(60)),
            node,
            node_lost_after: Some(Duration::from_secs(30)),
        }
    }

    /// (not Ready since, node, now) → Ok(lost cause) | Err(recheck; zero: reachable)
    type Row = (Option<i64>, NodeHealth, i64, Result<LossCause, Duration>);

    #[test]
    fn reachability_table() {
        use LossCause::{AgentUnreachable, NodeLost};
        let not_ready = |since| NodeHealth::NotReady {
            since: Some(at(since)),
        };
        let missing = |at_: Option<i64>| NodeHealth::Missing {
            scheduled: at_.map(at),
        };
        let suspect = |s| Err(Duration::from_secs(s));
        #[rustfmt::skip]
        let table: &[Row] = &[
            // Healthy, or nothing known.
            (None, NodeHealth::Ready, 1000, suspect(0)),
            (None, NodeHealth::Unknown, 1000, suspect(0)),
            // Not Ready: suspect until the limit, lost from it on.
            (Some(100), NodeHealth::Ready, 130, suspect(30)),
            (Some(100), NodeHealth::Ready, 159, suspect(1)),
            (Some(100), NodeHealth::Ready, 160, Ok(AgentUnreachable)),
            (Some(100), NodeHealth::Unknown, 500, Ok(AgentUnreachable)),
            // A node NotReady: its grace period, then lost (before agentctl's own limit).
            (None, not_ready(100), 110, suspect(20)),
            (None, not_ready(100), 130, Ok(NodeLost)),
            (Some(100), not_ready(100), 130, Ok(NodeLost)),
            // Both suspect: the sooner one decides when to look again.
            (Some(100), not_ready(120), 140, suspect(10)),
            (Some(90), not_ready(120), 140, suspect(10)),
            // A NotReady node without a transition time counts from now.
            (None, NodeHealth::NotReady { since: None }, 10_000, suspect(30)),
            // A node that is gone: lost once the pod was scheduled longer ago than the grace
            // (a cache that has not seen a brand-new node yet is not a loss).
            (None, missing(Some(100)), 110, suspect(20)),
            (None, missing(Some(100)), 131, Ok(NodeLost)),
            (None, missing(None), 10_000, suspect(30)),
        ];
        for (not_ready, node, now, expected) in table {
            let got = judge(&facts(*not_ready, *node), at(*now));
            let row = format!("{not_ready:?} {node:?} at {now}");
            match (expected, &got) {
                (Ok(cause), Reach::Lost { cause: c, message }) => {
                    assert_eq!(c, cause, "{row}");
                    assert!(message.contains("s-agent-1"), "{row}: {message}");
                }
                (Err(d), Reach::Reachable) if d.is_zero() => {}
                (Err(d), Reach::Suspect { recheck }) => assert_eq!(recheck, d, "{row}"),
                _ => panic!("{row}: got {got:?}, want {expected:?}"),
            }
        }
    }

    /// (not Ready since, node, unreachable limit on, now, answer)
    type RequestRow = (Option<i64>, NodeHealth, bool, i64, RunningRequest);

    #[test]
    fn a_resume_request_on_a_running_pod_table() {
        use RunningRequest::{AlreadyRunning, Wait};
        #[rustfmt::skip]
        let table: &[RequestRow] = &[
            // Ready, or nothing known: already running.
            (None, NodeHealth::Ready, true, 100, AlreadyRunning),
            (None, NodeHealth::Unknown, true, 100, AlreadyRunning),
            // Not Ready, or its node in doubt: wait for the verdict.
            (Some(95), NodeHealth::Ready, true, 100, Wait),
            (Some(20), NodeHealth::Ready, true, 100, Wait),
            (None, NodeHealth::NotReady { since: Some(at(95)) }, true, 100, Wait),
            // Unreachable agents not looked for: running, unless the node is lost.
            (Some(0), NodeHealth::Ready, false, 100, AlreadyRunning),
            (None, NodeHealth::Missing { scheduled: Some(at(0)) }, false, 100, Wait),
        ];
        for (not_ready, node, limit, now, expected) in table {
            let mut f = facts(*not_ready, *node);
            if !limit {
                f.unreachable_after = None;
            }
            assert_eq!(
                running_request(&f, at(*now)),
                *expected,
                "{not_ready:?} {node:?} {limit} at {now}"
            );
        }
    }

    fn pod_ready(ready: Option<(&str, Option<i64>)>) -> Pod {
        Pod {
            status: Some(PodStatus {
                conditions: ready.map(|(status, since)| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: status.into(),
                        last_transition_time: since.map(|s| Time(at(s))),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn not_ready_since_from_the_ready_condition() {
        type Row<'a> = (Option<(&'a str, Option<i64>)>, Option<i64>, Option<i64>);
        #[rustfmt::skip]
        let table: &[Row] = &[
            // (Ready condition, seen alive, not Ready since)
            (Some(("True", Some(5))), Some(50), None),
            (None, Some(50), None),
            (Some(("False", Some(5))), None, Some(5)),
            (Some(("Unknown", Some(5))), None, Some(5)),
            // Not before the operator's own answer from agentctl (a launch's restore).
            (Some(("False", Some(5))), Some(50), Some(50)),
            (Some(("False", Some(60))), Some(50), Some(60)),
            (Some(("False", None)), Some(50), Some(50)),
            (Some(("False", None)), None, None),
        ];
        for (ready, alive, expected) in table {
            assert_eq!(
                not_ready_since(&pod_ready(*ready), alive.map(at)),
                expected.map(at),
                "{ready:?} {alive:?}"
            );
        }
    }

    #[test]
    fn disabled_checks_conclude_nothing() {
        let mut f = facts(Some(0), NodeHealth::NotReady { since: Some(at(0)) });
        f.unreachable_after = None;
        f.node_lost_after = None;
        assert_eq!(judge(&f, at(1_000_000)), Reach::Reachable);
    }

    #[test]
    fn messages_say_what_was_seen_and_what_is_done() {
        let Reach::Lost { message, .. } = judge(&facts(Some(0), NodeHealth::Ready), at(300)) else {
            panic!("lost");
        };
        assert!(
            message.contains("has not been Ready since 1970-01-01T00:00:00Z")
                && message.contains("limit 1m0s"),
            "{message}"
        );
        let Reach::Lost { message, .. } = judge(
            &facts(
                None,
                NodeHealth::Missing {
                    scheduled: Some(at(0)),
                },
            ),
            at(300),
        ) else {
            panic!("lost");
        };
        assert!(message.contains("node n1 no longer exists"), "{message}");
        assert!(message.contains("force-deleted"), "{message}");
    }

    #[test]
    fn causes_round_trip_through_their_reasons() {
        for cause in LossCause::ALL {
            assert_eq!(LossCause::from_reason(cause.reason()), Some(cause));
        }
        assert_eq!(LossCause::from_reason("PodNotRunning"), None);
        assert!(LossCause::NodeLost.force_delete());
        assert!(!LossCause::AgentUnreachable.force_delete());
    }

    fn node(ready: Option<(&str, i64)>) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: ready.map(|(status, since)| {
                    vec![NodeCondition {
                        type_: "Ready".into(),
                        status: status.into(),
                        last_transition_time: Some(Time(at(since))),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod_on(node: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                node_name: node.map(String::from),
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(at(7))),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn node_health_from_the_cache() {
        let on_n1 = pod_on(Some("n1"));
        #[rustfmt::skip]
        let table: &[(&Pod, Option<Node>, bool, NodeHealth)] = &[
            (&on_n1, Some(node(Some(("True", 1)))), true, NodeHealth::Ready),
            (&on_n1, Some(node(Some(("False", 3)))), true, NodeHealth::NotReady { since: Some(at(3)) }),
            (&on_n1, Some(node(Some(("Unknown", 4)))), true, NodeHealth::NotReady { since: Some(at(4)) }),
            (&on_n1, Some(node(None)), true, NodeHealth::Unknown),
            (&on_n1, None, true, NodeHealth::Missing { scheduled: Some(at(7)) }),
            // Not watched, or not scheduled: nothing is concluded.
            (&on_n1, None, false, NodeHealth::Unknown),
        ];
        for (pod, node, watched, expected) in table {
            assert_eq!(node_health(pod, node.as_ref(), *watched), *expected);
        }
        assert_eq!(node_health(&pod_on(None), None, true), NodeHealth::Unknown);
    }
}
