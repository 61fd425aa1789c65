//! Keeping the repository credentials away from the agent.
//!
//! They reach agentctl as `KANDEV_GIT_*` variables (see [`super::checkout`]) and are removed
//! from the agent's environment, but a process's initial environment stays readable in
//! `/proc/<pid>/environ` to every process of the same user, and the agent runs as agentctl's
//! user. So an agentctl that holds them makes itself non-dumpable as it starts, before it clones
//! or starts the agent: the kernel then lets only a process with `CAP_SYS_PTRACE` read its
//! environment or memory (agent pods have no capabilities). What agentctl starts with `execve`
//! (git for the clone, then the agent) is dumpable again, as usual; the agent never had the
//! variables.

use super::checkout::{
    ENV_GIT_CA_BUNDLE, ENV_GIT_KNOWN_HOSTS, ENV_GIT_PASSWORD, ENV_GIT_SSH_KEY, ENV_GIT_USERNAME,
};

/// Every variable that carries a repository credential.
pub const CREDENTIAL_VARIABLES: [&str; 5] = [
    ENV_GIT_USERNAME,
    ENV_GIT_PASSWORD,
    ENV_GIT_SSH_KEY,
    ENV_GIT_KNOWN_HOSTS,
    ENV_GIT_CA_BUNDLE,
];

/// Whether this process's environment holds a repository credential.
fn holds_credentials() -> bool {
    CREDENTIAL_VARIABLES
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}

/// When the environment holds a repository credential: makes this process non-dumpable and
/// returns whether the kernel now says so (`Some(true)`); `None` when there is nothing to hide.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn seal_if_holding_credentials() -> Option<bool> {
    if !holds_credentials() {
        return None;
    }
    // SAFETY: PR_SET_DUMPABLE and PR_GET_DUMPABLE only set and read a flag of this process;
    // they take no pointers.
    let sealed = unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
            && libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 0
    };
    Some(sealed)
}

#[cfg(not(target_os = "linux"))]
pub fn seal_if_holding_credentials() -> Option<bool> {
    holds_credentials().then_some(false)
}
