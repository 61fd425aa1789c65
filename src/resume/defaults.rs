//! The operator's default deadlines, in one place: the operator's flags default to them, and
//! the kubectl plugin's waits are checked against what they add up to.

use std::time::Duration;

/// `--launch-deadline-seconds`: from an agent pod's creation to agentctl answering in it.
pub const LAUNCH_DEADLINE: Duration = Duration::from_secs(120);
/// `--acp-timeout-seconds`: opening the exec, and `initialize`.
pub const ACP_TIMEOUT: Duration = Duration::from_secs(30);
/// `--acp-restore-timeout-seconds`: the whole restore (resume → load → new).
pub const RESTORE_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest a launch (a resume) takes before the operator says how it ended: a previous
/// pod's deletion and its own pod's start (a launch deadline each), the exec's opening and
/// `initialize`, then the restore.
pub fn launch_within(
    launch_deadline: Duration,
    acp_timeout: Duration,
    restore: Duration,
) -> Duration {
    launch_deadline * 2 + acp_timeout * 2 + restore
}
