//! The contract between the operator and the agentctl pods it creates, in one place: the
//! container and its paths, every environment variable the operator sets and agentctl reads (its
//! clap `env =` attributes name these constants), the worktree agentctl reports in `initialize`,
//! the reasons a checkout ends with, and the lines of agentctl's event journal ([`events`]). The operator (`controller/pods.rs`, the rules in
//! `resume/`) and agentctl both take them from here; neither reaches into the other for them.

use serde::{Deserialize, Serialize};

pub mod events;

/// Name of the agentctl container.
pub const CONTAINER: &str = "agentctl";
/// Name of the init container that prepares the workspace from the repository
/// (`agentctl checkout`); the only one that gets the repository's credentials.
pub const CHECKOUT_CONTAINER: &str = "checkout";
/// Where agentctl's socket lives inside the pod (an emptyDir shared by `serve` and every exec).
pub const SOCKET_DIR: &str = "/run/kandev";
/// The container's termination message file (the kubelet's default path), where agentctl
/// writes why it could not prepare the workspace.
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// The agentctl pod's own name (downward API), for the event journal's entries.
pub const ENV_POD_NAME: &str = "KANDEV_POD_NAME";
/// The TaskSession's name (the history file's name).
pub const ENV_SESSION_NAME: &str = "KANDEV_SESSION_NAME";
/// agentctl's socket, where `serve` listens and every exec'd client connects.
pub const ENV_AGENTCTL_SOCKET: &str = "KANDEV_AGENTCTL_SOCKET";
/// The workspace directory.
pub const ENV_WORKSPACE: &str = "KANDEV_WORKSPACE";
/// The agent profile's name.
pub const ENV_AGENT_PROFILE: &str = "KANDEV_AGENT_PROFILE";
/// A file of agent profiles (agentctl run by hand).
pub const ENV_PROFILES_FILE: &str = "KANDEV_PROFILES_FILE";
/// The session's effective profile, as YAML: no configuration file in the pod.
pub const ENV_AGENT_PROFILE_DEFINITION: &str = "KANDEV_AGENT_PROFILE_DEFINITION";
/// A resume token for profiles that restore by command-line flags.
pub const ENV_RESUME_TOKEN: &str = "KANDEV_RESUME_TOKEN";
/// `spec.repository.url`: cloned into an empty workspace.
pub const ENV_REPOSITORY_URL: &str = "KANDEV_REPOSITORY_URL";
/// `spec.repository.branch`.
pub const ENV_REPOSITORY_BRANCH: &str = "KANDEV_REPOSITORY_BRANCH";
/// `spec.repository.baseBranch`.
pub const ENV_REPOSITORY_BASE_BRANCH: &str = "KANDEV_REPOSITORY_BASE_BRANCH";
/// Seconds of idleness after which `serve` suspends the session.
pub const ENV_SUSPEND_IDLE_AFTER: &str = "KANDEV_SUSPEND_IDLE_AFTER";
/// The session's permission policy for agentctl serve, as JSON ([`crate::api::EffectivePolicy`]).
pub const ENV_PERMISSIONS: &str = "KANDEV_PERMISSIONS";
/// The longest line of a `session/load` replay, in MiB.
pub const ENV_REPLAY_LINE_LIMIT_MIB: &str = "KANDEV_REPLAY_LINE_LIMIT_MIB";
/// agentctl's log format.
pub const ENV_LOG_FORMAT: &str = "KANDEV_LOG_FORMAT";
/// Environment variables holding the clone's credentials (set from a Secret by the operator);
/// only the pod's init container (`agentctl checkout`) gets them.
pub const ENV_GIT_USERNAME: &str = "KANDEV_GIT_USERNAME";
pub const ENV_GIT_PASSWORD: &str = "KANDEV_GIT_PASSWORD";
pub const ENV_GIT_SSH_KEY: &str = "KANDEV_GIT_SSH_KEY";
pub const ENV_GIT_KNOWN_HOSTS: &str = "KANDEV_GIT_KNOWN_HOSTS";
pub const ENV_GIT_CA_BUNDLE: &str = "KANDEV_GIT_CA_BUNDLE";

/// The `_meta` key of agentctl's `initialize` answer that carries the [`Worktree`].
pub const WORKTREE_META: &str = "kandev.dev/worktree";

/// The worktree agentctl reports in its `initialize` answer (`_meta["kandev.dev/worktree"]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Worktree {
    /// The branch checked out (`None`: a detached HEAD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// HEAD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Whether this process cloned the repository (false: an earlier clone, such as the one
    /// `agentctl checkout` made in the pod's init container before `serve` started).
    #[serde(default)]
    pub cloned: bool,
}

/// Why the workspace could not be prepared: the reason of the launch's `Stalled` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckoutReason {
    /// The workspace is not empty and is not a clone of this repository.
    WorkspaceMismatch,
    /// A later start found the workspace empty: the session's clone of an earlier start is
    /// gone (the volume was replaced or wiped), and it is never cloned again in its place.
    WorkspaceEmpty,
    /// The server refused the credentials (or there were none and it wants some).
    RepositoryAuthFailed,
    /// The repository could not be reached (DNS, connection, TLS, not found, timeout).
    RepositoryUnreachable,
    /// Cloned, but the branch could not be checked out (e.g. baseBranch does not exist).
    RepositoryCheckoutFailed,
}

impl CheckoutReason {
    pub const ALL: [CheckoutReason; 5] = [
        Self::WorkspaceMismatch,
        Self::WorkspaceEmpty,
        Self::RepositoryAuthFailed,
        Self::RepositoryUnreachable,
        Self::RepositoryCheckoutFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::WorkspaceMismatch => "WorkspaceMismatch",
            Self::WorkspaceEmpty => "WorkspaceEmpty",
            Self::RepositoryAuthFailed => "RepositoryAuthFailed",
            Self::RepositoryUnreachable => "RepositoryUnreachable",
            Self::RepositoryCheckoutFailed => "RepositoryCheckoutFailed",
        }
    }

    /// The reason a termination message starts with (`"<Reason>: <message>"`), if any.
    pub fn from_termination_message(message: &str) -> Option<(Self, &str)> {
        let (head, rest) = message.split_once(": ")?;
        let reason = Self::ALL.into_iter().find(|r| r.as_str() == head)?;
        Some((reason, rest.trim()))
    }
}

/// Which start of the session this is, as the operator knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CheckoutStart {
    /// No checkout of the session was recorded yet: an empty workspace is cloned into.
    #[default]
    First,
    /// The session's checkout was recorded on an earlier start: the workspace must hold it.
    Later,
}

impl std::fmt::Display for CheckoutReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
