//! What every reconcile shares: the operator's settings, its API clients, the caches of the
//! child objects, the followers and the Events.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;

use super::events::Queue as EventQueue;
use super::expectations::Expectations;
use super::follower::{Followers, Probe};
use super::metrics::Deadlines;
use super::pod_index::PodIndex;
use super::pods::{self, PodSettings};
use crate::acp::AcpLimits;
use crate::acp::budget::MemoryBudget;
use crate::agents::AgentRegistry;
use crate::api::ExecutorRunning;
use crate::resume::defaults::launch_within;
use crate::resume::{RECHECK, Requeue};

/// Settings of the running operator.
#[derive(Clone, Debug)]
pub struct OperatorSettings {
    pub pod: PodSettings,
    /// Namespaces whose sessions this operator serves; empty: every namespace.
    pub watch_namespaces: Vec<String>,
    /// How often a steady session is re-evaluated even without a watch event.
    pub resync: Duration,
    /// Timeout of opening the exec into an agent pod and of `initialize`.
    pub acp_timeout: Duration,
    /// Timeout of the whole restore, `session/resume` → `session/load` → `session/new` (a load
    /// replays the whole transcript before it answers).
    pub restore_timeout: Duration,
    /// Memory bounds of each ACP connection (lines, replay budget).
    pub acp_limits: AcpLimits,
    /// The one budget every restore's lines are reserved from ([`crate::acp::budget`]).
    pub acp_memory: MemoryBudget,
    /// Sessions reconciled at the same time, at most.
    pub max_concurrent_reconciles: u16,
    /// From the agentctl pod's creation to agentctl answering exec, at most; then the launch is
    /// stalled.
    pub launch_deadline: Duration,
    /// How long a session that ends `Completed` lets a running prompt finish.
    pub end_grace: Duration,
    /// A running pod that has not been Ready (its readiness probe of agentctl fails) for this
    /// long counts as lost (`AgentUnreachable`); `None`: never.
    pub agent_unreachable_after: Option<Duration>,
    /// A running pod whose node is gone or not Ready for this long counts as lost
    /// (`NodeLost`); `None`: nodes are not watched.
    pub node_lost_after: Option<Duration>,
    /// Journal catch-ups (`agentctl events` execs) opened per second, at most, working
    /// sessions first; 0: no limit.
    pub catch_up_execs_per_second: u32,
    /// An idle session's journal is read at least this often, for prompts from clients that
    /// do not nudge; `None`: only when nudged.
    pub journal_catch_up_every: Option<Duration>,
}

impl OperatorSettings {
    /// How the event followers contact agentctl.
    pub fn probe(&self) -> Probe {
        Probe {
            catch_up_every: self.journal_catch_up_every,
            answer_within: self.acp_timeout,
            execs_per_second: self.catch_up_execs_per_second,
        }
    }

    /// The longest a session may go on doing the same thing without being at rest, by this
    /// operator's own deadlines, each with two rechecks more; past it `kandev_sessions_overdue`
    /// counts the session, which is stuck:
    /// - a new token on a running pod waits for the pod to be Ready again or to count as lost
    ///   (the readiness probe's failures, then the longest reachability limit);
    /// - a launch waits for a previous pod's deletion and for its own pod's start (a launch
    ///   deadline each), then the exec's opening, `initialize` and the restore;
    /// - an end lets a `Completed` prompt finish, cancels it, and waits for the pod to go.
    pub fn deadlines(&self) -> Deadlines {
        let settle = RECHECK * 2;
        let reach = [self.agent_unreachable_after, self.node_lost_after]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or_default();
        Deadlines {
            requested: reach + pods::NOT_READY_WITHIN + settle,
            launching: launch_within(self.launch_deadline, self.acp_timeout, self.restore_timeout)
                + settle,
            ending: self.end_grace + self.acp_timeout + self.launch_deadline + settle,
        }
    }
}

/// The operator's two API clients, built from one configuration.
#[derive(Clone)]
pub struct Clients {
    /// Requests (get, create, patch, delete, Events, the Lease): every answer has a deadline
    /// (the client's read timeout), so a stalled API server never blocks a reconcile for good.
    pub calls: Client,
    /// Long-lived streams: watches and exec into agent pods, idle for hours by design, so
    /// without a read timeout (watches have their own idle timeout, opening an exec its own
    /// deadline).
    pub streams: Client,
}

/// Shared by every reconcile.
pub struct Context {
    /// For requests; see [`Clients::calls`].
    pub client: Client,
    /// For exec into agent pods; see [`Clients::streams`].
    pub streams: Client,
    pub events: EventQueue,
    pub agents: AgentRegistry,
    pub settings: OperatorSettings,
    /// `agentctl events` followers of running pods.
    pub followers: Followers,
    /// Caches of the child objects, filled by the controller's watches: a reconcile reads
    /// ExecutorRunnings and pods from here, never from the API server.
    pub executors: Store<ExecutorRunning>,
    pub pods: Store<Pod>,
    /// The cached pods by session.
    pub pod_index: Arc<PodIndex>,
    /// Which PVCs exist (metadata only), for the workspace check before a launch.
    pub claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
    /// The nodes (without their image lists), when lost nodes are looked for.
    pub nodes: Option<Store<Node>>,
    /// Writes not yet seen in the caches, and retry backoff, per session.
    pub expectations: Expectations,
}

impl Context {
    /// The controller's action for a reconcile's requeue.
    pub(super) fn action(&self, requeue: Requeue) -> Action {
        match requeue {
            Requeue::Resync => Action::requeue(self.settings.resync),
            Requeue::After(delay) => Action::requeue(delay),
            Requeue::AwaitChange => Action::await_change(),
        }
    }
}
