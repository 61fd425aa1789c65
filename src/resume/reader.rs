//! The history reader pod: what `kubectl kandev history` reads through while no agent pod runs
//! (a lost, suspended, failed, completed or cancelled session). It mounts the workspace
//! read-only, holds no credentials and starts no agent; it lives while the history request
//! annotation's token is set and not answered, and never beside an agent pod. Pure: the
//! reconciler gathers the facts and applies the step.

use crate::api::HistoryOutcome;

/// How the session's workspace PVC stands, for a reader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReaderWorkspace {
    /// The claim exists, is not being deleted, and is the volume the session last ran on (or
    /// no volume was recorded yet).
    Present,
    /// Why there is nothing to mount.
    Gone(String),
}

/// The reader pod as the caches show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaderPod {
    /// Pending or running, not being deleted: it serves any open request, whichever token it
    /// was created for.
    Live,
    /// Its process ended (Succeeded or Failed), and it is not being deleted.
    Ended,
    /// Being deleted: a new reader waits until it is gone (one pod name).
    Leaving,
}

/// What one reconcile knows about a history request.
#[derive(Clone, Debug)]
pub struct ReaderFacts<'a> {
    /// The annotation's token.
    pub request: Option<&'a str>,
    /// The token of the last request the operator answered without a read.
    pub answered: Option<&'a str>,
    /// An agent pod of the session exists (any phase), or a launch is in flight.
    pub agent: bool,
    pub workspace: ReaderWorkspace,
    pub reader: Option<ReaderPod>,
    /// The request token the reader pod was created for (its annotation).
    pub reader_token: Option<&'a str>,
}

/// What to do about the reader pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReaderStep {
    Nothing,
    /// Create the reader pod for the request.
    Create,
    /// Delete the reader pod (no request wants it any more).
    Delete,
    /// Answer the request without a read (recorded in `status.historyRequest`), and delete the
    /// reader pod if there is one.
    Answer {
        outcome: HistoryOutcome,
        message: String,
        delete: bool,
    },
}

/// Whether a history request is set and not answered yet.
pub fn reader_open(request: Option<&str>, answered: Option<&str>) -> bool {
    request.is_some_and(|r| Some(r) != answered)
}

/// The step for one reconcile (see the module's rules). An ended reader expires the request
/// it was created for; one left over from an earlier request is replaced, so a new token read
/// right after the last one never inherits its ending pod.
pub fn reader_step(facts: &ReaderFacts) -> ReaderStep {
    let deletable = matches!(facts.reader, Some(ReaderPod::Live | ReaderPod::Ended));
    if !reader_open(facts.request, facts.answered) {
        return if deletable {
            ReaderStep::Delete
        } else {
            ReaderStep::Nothing
        };
    }
    let answer = |outcome, message: &str| ReaderStep::Answer {
        outcome,
        message: message.to_string(),
        delete: deletable,
    };
    if facts.agent {
        return answer(
            HistoryOutcome::AgentRunning,
            "an agent pod of the session runs or starts: the history is read through it",
        );
    }
    if let ReaderWorkspace::Gone(why) = &facts.workspace {
        return answer(HistoryOutcome::WorkspaceGone, why);
    }
    match facts.reader {
        None => ReaderStep::Create,
        Some(ReaderPod::Live | ReaderPod::Leaving) => ReaderStep::Nothing,
        Some(ReaderPod::Ended) if facts.reader_token != facts.request => ReaderStep::Delete,
        Some(ReaderPod::Ended) => answer(
            HistoryOutcome::Expired,
            "the history reader pod ended while the request was still set; set a new token to read again",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step without its message: (what, outcome, delete).
    fn shape(step: &ReaderStep) -> (&'static str, Option<HistoryOutcome>, bool) {
        match step {
            ReaderStep::Nothing => ("nothing", None, false),
            ReaderStep::Create => ("create", None, false),
            ReaderStep::Delete => ("delete", None, true),
            ReaderStep::Answer {
                outcome, delete, ..
            } => ("answer", Some(*outcome), *delete),
        }
    }

    #[test]
    fn reader_steps() {
        use HistoryOutcome::*;
        use ReaderPod::*;
        let present = ReaderWorkspace::Present;
        let gone = ReaderWorkspace::Gone("PVC ws does not exist".into());
        let facts = |request, answered, agent, workspace: &ReaderWorkspace, reader| ReaderFacts {
            request,
            answered,
            agent,
            workspace: workspace.clone(),
            reader,
            reader_token: request,
        };
        let earlier = |reader| ReaderFacts {
            reader_token: Some("t"),
            ..facts(Some("u"), Some("t"), false, &present, reader)
        };
        #[rustfmt::skip]
        let rows = [
            ("no request",                facts(None, None, false, &present, None),                   ("nothing", None, false)),
            ("request withdrawn",         facts(None, None, false, &present, Some(Live)),             ("delete", None, true)),
            ("withdrawn, reader ended",   facts(None, None, false, &present, Some(Ended)),            ("delete", None, true)),
            ("withdrawn, reader leaving", facts(None, None, false, &present, Some(Leaving)),          ("nothing", None, false)),
            ("new request",               facts(Some("t"), None, false, &present, None),              ("create", None, false)),
            ("new after an answered one", facts(Some("u"), Some("t"), false, &present, None),         ("create", None, false)),
            ("reader runs",               facts(Some("t"), None, false, &present, Some(Live)),        ("nothing", None, false)),
            ("answered already",          facts(Some("t"), Some("t"), false, &present, None),         ("nothing", None, false)),
            ("answered, reader left",     facts(Some("t"), Some("t"), false, &present, Some(Live)),   ("delete", None, true)),
            ("an agent pod",              facts(Some("t"), None, true, &present, None),               ("answer", Some(AgentRunning), false)),
            ("a launch beside a reader",  facts(Some("t"), None, true, &present, Some(Live)),         ("answer", Some(AgentRunning), true)),
            ("no workspace",              facts(Some("t"), None, false, &gone, None),                 ("answer", Some(WorkspaceGone), false)),
            ("workspace gone under it",   facts(Some("t"), None, false, &gone, Some(Live)),           ("answer", Some(WorkspaceGone), true)),
            ("reader ended by itself",    facts(Some("t"), None, false, &present, Some(Ended)),       ("answer", Some(Expired), true)),
            ("expired, reader leaving",   facts(Some("t"), Some("t"), false, &present, Some(Leaving)), ("nothing", None, false)),
            ("an earlier reader runs",    earlier(Some(Live)),                                        ("nothing", None, false)),
            ("an earlier reader ended",   earlier(Some(Ended)),                                       ("delete", None, true)),
            ("an earlier reader leaving", earlier(Some(Leaving)),                                     ("nothing", None, false)),
            ("an agent beside one ending", facts(Some("t"), None, true, &present, Some(Leaving)),     ("answer", Some(AgentRunning), false)),
        ];
        for (what, facts, want) in rows {
            let step = reader_step(&facts);
            assert_eq!(shape(&step), want, "{what}");
            if let ReaderStep::Answer { message, .. } = &step {
                assert!(!message.is_empty(), "{what}");
            }
        }
    }
}
