//! Why a launch stops before its restore, and what the API server's refusal of one of its
//! objects means: the reconciler finds the cause, these functions turn it into the
//! [`LaunchEnd`] that [`super::launch_ended`] applies.

use super::launch_begin::UNKNOWN_PROFILE;
use super::launch_end::{LaunchEnd, what_is_kept};
use super::stall::LaunchStall;
use super::status::PodLiveness;
use crate::api::RESUME_ANNOTATION;

/// What the API server's refusal of a create or an apply means for the launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 409 on a create: the object exists (an earlier run of the step made it, or another).
    Exists,
    /// Retrying the same object cannot help until the spec or the settings change: 422 Invalid,
    /// 400 BadRequest, or a 403 an admission check gave (Pod Security, a
    /// ValidatingAdmissionPolicy, a webhook), not RBAC (`User "…" cannot create …`).
    Final,
    /// Anything else: an error of the reconcile, retried with backoff.
    Retry,
}

/// The meaning of an API error `code` with its `message`.
pub fn refusal(code: u16, message: &str) -> Refusal {
    match code {
        409 => Refusal::Exists,
        400 | 422 => Refusal::Final,
        403 if !message.contains("\" cannot ") => Refusal::Final,
        _ => Refusal::Retry,
    }
}

/// Why a launch stops before its restore.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchStop<'a> {
    /// No running agentctl in `pod` within the launch deadline.
    Stalled {
        pod: &'a str,
        stall: &'a LaunchStall,
    },
    /// agentctl in `pod` could not prepare the workspace from the repository.
    CheckoutFailed {
        pod: &'a str,
        stall: &'a LaunchStall,
    },
    /// `pod` was deleted or died before the restore ran.
    LostWhileStarting { pod: &'a str, lost: PodLiveness },
    /// The API server refused an object of the launch for good ([`Refusal::Final`]); its words.
    InvalidSpec { refusal: &'a str },
    /// The launch's pod name is taken by a pod this session does not control.
    PodNameTaken { pod: &'a str },
    /// The operator does not know the session's agent profile.
    UnknownProfile {
        agent: &'a str,
        known: &'a [&'a str],
    },
    /// A session that ran before finds its workspace gone (the reason).
    WorkspaceLost { reason: &'a str },
}

/// The end of a launch that stopped for `stop`. Nothing but a lost workspace proves the session
/// cannot go on (an unknown profile may be added to the operator): the others are "not done" (the token kept, a new
/// resume token retries) and say what is kept. `has_token`: a resume token is saved.
pub fn launch_stopped(stop: LaunchStop, has_token: bool) -> LaunchEnd {
    let kept = what_is_kept(true, has_token);
    let retry = format!("Set a new {RESUME_ANNOTATION} token to retry");
    let not_done =
        |pod: Option<&str>, reason: &str, event, stalled, message: String| LaunchEnd::NotDone {
            pod: pod.map(str::to_string),
            reason: reason.to_string(),
            event,
            stalled,
            message,
        };
    match stop {
        LaunchStop::Stalled { pod, stall } => {
            let message = format!("{}; {kept}. {retry}", stall.message);
            not_done(Some(pod), stall.reason, "LaunchStalled", true, message)
        }
        LaunchStop::CheckoutFailed { pod, stall } => {
            let message = format!("{}; {kept}. {retry}", stall.message);
            not_done(Some(pod), stall.reason, "CheckoutFailed", true, message)
        }
        LaunchStop::LostWhileStarting { pod, lost } => {
            let message = format!("agentctl pod {pod} was lost while starting ({lost:?}); {kept}");
            not_done(Some(pod), "PodLost", "LaunchFailed", false, message)
        }
        LaunchStop::InvalidSpec { refusal } => {
            let message = format!(
                "{refusal}. Fix the TaskSession spec (or the operator's pod settings), then set a new {RESUME_ANNOTATION} token; {kept}"
            );
            not_done(None, "InvalidSpec", "InvalidSpec", true, message)
        }
        LaunchStop::PodNameTaken { pod } => {
            let message = format!(
                "pod {pod} exists but is not controlled by this TaskSession; delete it, or set a new {RESUME_ANNOTATION} token. {kept}"
            );
            not_done(None, "PodNameTaken", "PodNameTaken", true, message)
        }
        LaunchStop::UnknownProfile { agent, known } => {
            let message = format!(
                "unknown agent profile {agent:?} (known: {}): add it to the operator (chart value agentProfiles, --agent-profiles), then set a new {RESUME_ANNOTATION} token; {kept}",
                known.join(", ")
            );
            not_done(None, UNKNOWN_PROFILE, UNKNOWN_PROFILE, true, message)
        }
        LaunchStop::WorkspaceLost { reason } => LaunchEnd::Failed {
            pod: None,
            code: "WorkspaceLost",
            event: "WorkspaceLost",
            reason: reason.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals() {
        let rbac = "pods is forbidden: User \"system:serviceaccount:k:k\" cannot create resource \"pods\" in API group \"\" in the namespace \"x\"";
        let pod_security = "pods \"a\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true";
        let policy = "pods \"a\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'p' denied request: the kandev operator may only create pods labelled kandev.dev/managed=true";
        let cases = [
            ("exists", 409, "already exists", Refusal::Exists),
            (
                "invalid",
                422,
                "spec.containers: Invalid value",
                Refusal::Final,
            ),
            ("bad request", 400, "bad", Refusal::Final),
            ("pod security", 403, pod_security, Refusal::Final),
            ("admission policy", 403, policy, Refusal::Final),
            ("RBAC", 403, rbac, Refusal::Retry),
            ("server error", 500, "etcd timeout", Refusal::Retry),
            ("throttled", 429, "too many requests", Refusal::Retry),
            ("not found", 404, "namespace gone", Refusal::Retry),
        ];
        for (name, code, message, want) in cases {
            assert_eq!(refusal(code, message), want, "{name}");
        }
    }

    /// One line per [`LaunchEnd`]: the variant, its reason, its Event, its pod and message.
    fn summary(end: &LaunchEnd) -> String {
        match end {
            LaunchEnd::NotDone {
                pod,
                reason,
                event,
                stalled,
                message,
            } => format!("not done {reason} {event} stalled={stalled} pod={pod:?}: {message}"),
            LaunchEnd::Failed {
                pod,
                code,
                event,
                reason,
            } => format!("failed {code} {event} pod={pod:?}: {reason}"),
            LaunchEnd::Running { .. } => "running".into(),
        }
    }

    #[test]
    fn stops() {
        let pull = LaunchStall {
            reason: "ImagePullBackOff",
            message: "image x cannot be pulled".into(),
        };
        let checkout = LaunchStall {
            reason: "CheckoutFailed",
            message: "git clone failed".into(),
        };
        let known = ["claude-code", "codex"];
        let cases = [
            (
                "stalled, with a token",
                LaunchStop::Stalled {
                    pod: "p",
                    stall: &pull,
                },
                true,
                "not done ImagePullBackOff LaunchStalled stalled=true pod=Some(\"p\"): image x cannot be pulled; the resume token is kept. Set a new kandev.dev/resume-requested-at token to retry",
            ),
            (
                "stalled, a first launch",
                LaunchStop::Stalled {
                    pod: "p",
                    stall: &pull,
                },
                false,
                "not done ImagePullBackOff LaunchStalled stalled=true pod=Some(\"p\"): image x cannot be pulled; nothing is lost. Set a new kandev.dev/resume-requested-at token to retry",
            ),
            (
                "checkout failed",
                LaunchStop::CheckoutFailed {
                    pod: "p",
                    stall: &checkout,
                },
                true,
                "not done CheckoutFailed CheckoutFailed stalled=true pod=Some(\"p\"): git clone failed; the resume token is kept. Set a new kandev.dev/resume-requested-at token to retry",
            ),
            (
                "lost while starting",
                LaunchStop::LostWhileStarting {
                    pod: "p",
                    lost: PodLiveness::Terminating,
                },
                true,
                "not done PodLost LaunchFailed stalled=false pod=Some(\"p\"): agentctl pod p was lost while starting (Terminating); the resume token is kept",
            ),
            (
                "refused by the API server: no pod to delete",
                LaunchStop::InvalidSpec {
                    refusal: "the API server refused agentctl pod p: bad",
                },
                false,
                "not done InvalidSpec InvalidSpec stalled=true pod=None: the API server refused agentctl pod p: bad. Fix the TaskSession spec (or the operator's pod settings), then set a new kandev.dev/resume-requested-at token; nothing is lost",
            ),
            (
                "a name taken: the other pod is not ours to delete",
                LaunchStop::PodNameTaken { pod: "p" },
                true,
                "not done PodNameTaken PodNameTaken stalled=true pod=None: pod p exists but is not controlled by this TaskSession; delete it, or set a new kandev.dev/resume-requested-at token. the resume token is kept",
            ),
            (
                "unknown profile",
                LaunchStop::UnknownProfile {
                    agent: "amp2",
                    known: &known,
                },
                true,
                "not done UnknownProfile UnknownProfile stalled=true pod=None: unknown agent profile \"amp2\" (known: claude-code, codex): add it to the operator (chart value agentProfiles, --agent-profiles), then set a new kandev.dev/resume-requested-at token; the resume token is kept",
            ),
            (
                "workspace lost",
                LaunchStop::WorkspaceLost {
                    reason: "workspace PVC \"w\" no longer exists",
                },
                true,
                "failed WorkspaceLost WorkspaceLost pod=None: workspace PVC \"w\" no longer exists",
            ),
        ];
        for (name, stop, has_token, want) in cases {
            assert_eq!(summary(&launch_stopped(stop, has_token)), want, "{name}");
        }
    }
}
