//! The workspace from a repository (`spec.repository`): on the first start `agentctl checkout`
//! clones the repository into the empty workspace and checks out the session's branch; on every
//! later start it finds that clone and leaves it alone (uncommitted work included). A non-empty
//! workspace that is not this repository is refused, and so is an empty one on a later start
//! (the operator says which start it is): the session's clone and work are gone, and a fresh
//! clone would pass as them.
//!
//! The clone runs `git` as a subprocess with a deadline and bounded output. Credentials come
//! from the environment (the operator fills it from the session's Secret): an HTTPS token
//! reaches git through a credential helper that reads the environment and answers only for the
//! repository's own host, an SSH key and `known_hosts` through files in a private temporary
//! directory and `GIT_SSH_COMMAND`. They are never in argv, and every git message is scrubbed of
//! them before it is logged or reported.
//!
//! No input the agent can write meets the credentials. The agent owns the workspace volume,
//! its HOME on it included, and the clone's `.git`. So every git command runs in an emptied
//! environment with a private, empty HOME, no system or global configuration, hooks and
//! fsmonitor off ([`sandboxed`]); only the clone gets the credentials, and it writes into a
//! directory it creates. A clone found on a later start is never handed to git at all: its
//! origin and HEAD are read from its files ([`super::gitfiles`]).
//!
//! The pure parts — what to do with a workspace, which branch to check out, classifying and
//! scrubbing git's errors — are separate functions, table-tested below.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::{AgentctlError, gitfiles};
pub use crate::api::pod_contract::{
    CheckoutReason, CheckoutStart, ENV_GIT_CA_BUNDLE, ENV_GIT_KNOWN_HOSTS, ENV_GIT_PASSWORD,
    ENV_GIT_SSH_KEY, ENV_GIT_USERNAME, WORKTREE_META, Worktree,
};

/// Where agentctl keeps its own files on the workspace volume; never part of the checkout.
pub const KANDEV_DIR: &str = ".kandev";
/// Entries of a workspace that do not make it "not empty": agentctl's own directory and the
/// `lost+found` of a freshly formatted volume.
const IGNORED_ENTRIES: &[&str] = &[KANDEV_DIR, "lost+found"];
/// The HTTPS user name when the Secret names none (what forges accept with a token).
const DEFAULT_USERNAME: &str = "x-access-token";
/// Most of a git command's stdout that is kept (refs, a commit id: tiny).
const STDOUT_LIMIT: usize = 64 * 1024;
/// The tail of a git command's stderr that is kept for the error message.
const STDERR_TAIL: usize = 4 * 1024;
/// Deadline of the local git commands (everything but the clone).
const LOCAL_TIMEOUT: Duration = Duration::from_secs(60);

/// The repository of the session, as agentctl gets it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Repository {
    pub url: String,
    pub branch: Option<String>,
    pub base_branch: Option<String>,
}

/// The clone's credentials (from the environment).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct GitCredentials {
    pub username: Option<String>,
    pub password: Option<String>,
    pub ssh_key: Option<String>,
    pub known_hosts: Option<String>,
    pub ca_bundle: Option<String>,
}

impl std::fmt::Debug for GitCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GitCredentials(***)")
    }
}

impl GitCredentials {
    /// The credentials in agentctl's environment (empty values count as unset).
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Self {
            username: var(ENV_GIT_USERNAME),
            password: var(ENV_GIT_PASSWORD),
            ssh_key: var(ENV_GIT_SSH_KEY),
            known_hosts: var(ENV_GIT_KNOWN_HOSTS),
            ca_bundle: var(ENV_GIT_CA_BUNDLE),
        }
    }

    /// Every secret value, for [`scrub`].
    fn secrets(&self) -> Vec<&str> {
        [&self.password, &self.ssh_key]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect()
    }
}

/// What a workspace holds, apart from [`IGNORED_ENTRIES`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkspaceState {
    Empty,
    /// A git repository whose `origin` is this URL (`None`: no origin).
    Clone {
        origin: Option<String>,
    },
    /// Something else; `entry` is one of its entries, for the message.
    Other {
        entry: String,
    },
}

/// What to do with the workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Clone,
    /// The clone of an earlier start: leave it exactly as it is.
    Keep,
    /// Refuse to start: the reason and why.
    Refuse(CheckoutReason, String),
}

/// Clone into an empty workspace on the first start, keep our own clone, refuse anything else.
pub fn decide(state: &WorkspaceState, url: &str, start: CheckoutStart) -> Decision {
    let mismatch = |why: String| Decision::Refuse(CheckoutReason::WorkspaceMismatch, why);
    match state {
        WorkspaceState::Empty if start == CheckoutStart::Later => Decision::Refuse(
            CheckoutReason::WorkspaceEmpty,
            format!(
                "the workspace is empty, but the session's clone of {url} was made on an earlier start: the clone and the agent's work on it are gone, and a new clone is never made in their place"
            ),
        ),
        WorkspaceState::Empty => Decision::Clone,
        WorkspaceState::Clone { origin: Some(o) } if same_url(o, url) => Decision::Keep,
        WorkspaceState::Clone { origin: Some(o) } => mismatch(format!(
            "the workspace is a clone of {}, not of {url}",
            strip_userinfo(o)
        )),
        WorkspaceState::Clone { origin: None } => mismatch(format!(
            "the workspace is a git repository without an origin, not a clone of {url}"
        )),
        WorkspaceState::Other { entry } => mismatch(format!(
            "the workspace is not empty (it holds {entry:?}) and is not a clone of {url}"
        )),
    }
}

/// The same repository, ignoring a trailing `/` or `.git`.
fn same_url(a: &str, b: &str) -> bool {
    let norm = |u: &str| {
        let u = u.trim().trim_end_matches('/');
        u.strip_suffix(".git").unwrap_or(u).to_string()
    };
    norm(a) == norm(b)
}

/// The branch to check out after the clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchPlan {
    /// The local branch.
    pub branch: String,
    /// The remote branch it starts from (without `origin/`).
    pub from: String,
    /// Whether `branch` is new (not on the remote yet).
    pub created: bool,
}

/// Why the branch of a fresh clone could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    #[error(
        "branch {branch:?} does not exist yet and its base branch {base:?} does not exist either"
    )]
    NoBase { branch: String, base: String },
    #[error(
        "branch {branch:?} does not exist yet and the repository has no default branch to create it from (set baseBranch)"
    )]
    NoDefaultForNew { branch: String },
    #[error("base branch {base:?} does not exist")]
    BaseMissing { base: String },
    #[error("the repository has no default branch (is it empty?)")]
    NoDefault,
    #[error(transparent)]
    Git(#[from] GitFailure),
    #[error("cannot write git's exclude file: {0}")]
    Exclude(#[source] std::io::Error),
    #[error("cannot move the clone into the workspace: {0}")]
    Move(#[source] std::io::Error),
}

/// `branch` when the remote has it; else a new `branch` from `base` (or the remote's default
/// branch); without `branch`, `base` or the default branch itself.
pub fn plan_branch(
    branch: Option<&str>,
    base: Option<&str>,
    remote_default: Option<&str>,
    on_remote: impl Fn(&str) -> bool,
) -> Result<BranchPlan, BranchError> {
    let from = base.or(remote_default);
    match branch {
        Some(b) if on_remote(b) => Ok(BranchPlan {
            branch: b.into(),
            from: b.into(),
            created: false,
        }),
        Some(b) => match from {
            Some(f) if on_remote(f) => Ok(BranchPlan {
                branch: b.into(),
                from: f.into(),
                created: true,
            }),
            Some(f) => Err(BranchError::NoBase {
                branch: b.into(),
                base: f.into(),
            }),
            None => Err(BranchError::NoDefaultForNew { branch: b.into() }),
        },
        None => match from {
            Some(f) if on_remote(f) => Ok(BranchPlan {
                branch: f.into(),
                from: f.into(),
                created: false,
            }),
            Some(f) => Err(BranchError::BaseMissing { base: f.into() }),
            None => Err(BranchError::NoDefault),
        },
    }
}

/// `text` without any of `secrets` (nor any of their lines, for keys) and without the
/// user-info of URLs.
pub fn scrub(text: &str, secrets: &[&str]) -> String {
    // Each secret whole, and each long line of a multi-line one (a key) on its own.
    let mut pieces: Vec<&str> = secrets
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .chain(
            secrets
                .iter()
                .flat_map(|s| s.lines())
                .map(str::trim)
                .filter(|l| l.len() >= 8),
        )
        .collect();
    // Longest first, so a secret that contains another is replaced whole.
    pieces.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = strip_userinfo(text);
    for piece in pieces {
        out = out.replace(piece, "***");
    }
    out
}

/// Replaces `scheme://user[:password]@` with `scheme://***@`.
fn strip_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '\'' || c == '"')
            .unwrap_or(tail.len());
        match tail[..authority_end].rfind('@') {
            Some(userinfo_end) => {
                out.push_str("***");
                rest = &tail[userinfo_end..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

/// Whether git's (scrubbed) message says the server refused us rather than was not reached.
pub fn classify_git_error(stderr: &str) -> CheckoutReason {
    const AUTH: &[&str] = &[
        "authentication failed",
        "could not read username",
        "could not read password",
        "permission denied (publickey",
        "host key verification failed",
        "the requested url returned error: 401",
        "the requested url returned error: 403",
        "invalid username or password",
        "terminal prompts disabled",
    ];
    let lower = stderr.to_ascii_lowercase();
    if AUTH.iter().any(|needle| lower.contains(needle)) {
        CheckoutReason::RepositoryAuthFailed
    } else {
        CheckoutReason::RepositoryUnreachable
    }
}

/// Prepares `workspace` for `repository`: clones it when the workspace is empty on the first
/// start, keeps an earlier clone, refuses anything else. Returns the worktree to report.
pub async fn prepare(
    workspace: &Path,
    repository: &Repository,
    credentials: &GitCredentials,
    clone_timeout: Duration,
    start: CheckoutStart,
) -> Result<Worktree, AgentctlError> {
    let state = inspect(workspace)?;
    match decide(&state, &repository.url, start) {
        Decision::Refuse(reason @ CheckoutReason::WorkspaceMismatch, why) => Err(failure(
            reason,
            format!("{why}. Use an empty workspace for this repository, or fix the workspace"),
        )),
        Decision::Refuse(reason, why) => Err(failure(
            reason,
            format!("{why}. Restore the workspace, or start a new session"),
        )),
        Decision::Keep => {
            tracing::info!(url = %repository.url, "the workspace is this repository's clone; left as it is");
            let mut worktree = describe(workspace);
            worktree.cloned = false;
            Ok(worktree)
        }
        Decision::Clone => {
            let started = std::time::Instant::now();
            clone(workspace, repository, credentials, clone_timeout).await?;
            let mut worktree = describe(workspace);
            worktree.cloned = true;
            tracing::info!(url = %repository.url, branch = ?worktree.branch, commit = ?worktree.commit,
                took_ms = started.elapsed().as_millis() as u64, "cloned the repository into the workspace");
            Ok(worktree)
        }
    }
}

fn failure(reason: CheckoutReason, message: String) -> AgentctlError {
    AgentctlError::Checkout { reason, message }
}

/// What the workspace holds.
fn inspect(workspace: &Path) -> Result<WorkspaceState, AgentctlError> {
    let entries = std::fs::read_dir(workspace).map_err(AgentctlError::io(format!(
        "cannot read the workspace {}",
        workspace.display()
    )))?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !IGNORED_ENTRIES.contains(&n.as_str()))
        .collect();
    names.sort();
    if names.is_empty() {
        return Ok(WorkspaceState::Empty);
    }
    if !workspace.join(".git").exists() {
        return Ok(WorkspaceState::Other {
            entry: names.swap_remove(0),
        });
    }
    let origin = gitfiles::origin_url(workspace)
        .map(|o| o.trim().to_string())
        .filter(|o| !o.is_empty());
    Ok(WorkspaceState::Clone { origin })
}

/// The branch and HEAD of the workspace's repository (best effort: a report, not a check),
/// read from its files: no git runs in a clone the agent has written to.
fn describe(workspace: &Path) -> Worktree {
    let (branch, commit) = gitfiles::head(workspace);
    Worktree {
        branch,
        commit,
        cloned: false,
    }
}

/// Clones into `<workspace>/.kandev/clone.tmp` without a checkout, sets the branch up there,
/// moves the `.git` directory into the workspace (one rename: the workspace is either still
/// empty or a complete clone) and checks the branch out.
async fn clone(
    workspace: &Path,
    repository: &Repository,
    credentials: &GitCredentials,
    timeout: Duration,
) -> Result<(), AgentctlError> {
    let kandev = workspace.join(KANDEV_DIR);
    let tmp = kandev.join("clone.tmp");
    let io = |what: &str| AgentctlError::io(format!("{what} ({})", tmp.display()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io("cannot remove an interrupted clone"))?;
    }
    std::fs::create_dir_all(&kandev).map_err(io("cannot create agentctl's directory"))?;
    let auth = GitAuth::new(credentials, &repository.url)?;
    let secrets = credentials.secrets();
    let tmp_arg = tmp.to_string_lossy().into_owned();
    let mut args: Vec<&str> = auth.config.iter().map(String::as_str).collect();
    args.extend([
        "clone",
        "--no-checkout",
        "--quiet",
        "--",
        repository.url.as_str(),
        tmp_arg.as_str(),
    ]);
    if let Err(err) = git(None, &args, &auth.env, timeout).await {
        let _ = std::fs::remove_dir_all(&tmp);
        let message = scrub(&err.to_string(), &secrets);
        let reason = if err.timed_out {
            CheckoutReason::RepositoryUnreachable
        } else {
            classify_git_error(&message)
        };
        return Err(failure(
            reason,
            format!("cloning {} failed: {message}", repository.url),
        ));
    }
    let result = set_up_branch(&tmp, repository).await;
    let result = match result {
        Ok(()) => {
            std::fs::rename(tmp.join(".git"), workspace.join(".git")).map_err(BranchError::Move)
        }
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_dir_all(&tmp);
    if let Err(why) = result {
        return Err(failure(
            CheckoutReason::RepositoryCheckoutFailed,
            format!("cloned {} but {why}", repository.url),
        ));
    }
    // No index yet: this fills index and working tree from the branch.
    git(
        Some(workspace),
        &["reset", "--hard", "--quiet"],
        &[],
        LOCAL_TIMEOUT,
    )
    .await
    .map_err(|e| {
        failure(
            CheckoutReason::RepositoryCheckoutFailed,
            format!(
                "cloned {} but the checkout failed: {}",
                repository.url,
                scrub(&e.to_string(), &secrets)
            ),
        )
    })?;
    Ok(())
}

/// In the fresh clone `dir`: the local branch, HEAD on it, agentctl's files excluded.
async fn set_up_branch(dir: &Path, repository: &Repository) -> Result<(), BranchError> {
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        git(Some(dir), &args, &[], LOCAL_TIMEOUT)
            .await
            .map_err(BranchError::Git)
    };
    let default = run(vec![
        "symbolic-ref".into(),
        "--quiet".into(),
        "--short".into(),
        "refs/remotes/origin/HEAD".into(),
    ])
    .await
    .ok()
    .map(|d| d.trim().trim_start_matches("origin/").to_string())
    .filter(|d| !d.is_empty());
    let mut remote = Vec::new();
    for name in [&repository.branch, &repository.base_branch, &default]
        .into_iter()
        .flatten()
    {
        let exists = run(vec![
            "rev-parse".into(),
            "--verify".into(),
            "--quiet".into(),
            format!("refs/remotes/origin/{name}"),
        ])
        .await
        .is_ok();
        if exists {
            remote.push(name.clone());
        }
    }
    let plan = plan_branch(
        repository.branch.as_deref(),
        repository.base_branch.as_deref(),
        default.as_deref(),
        |b| remote.iter().any(|r| r == b),
    )?;
    let local = format!("refs/heads/{}", plan.branch);
    let has_local = run(vec![
        "rev-parse".into(),
        "--verify".into(),
        "--quiet".into(),
        local.clone(),
    ])
    .await
    .is_ok();
    if !has_local {
        let mut args = vec!["branch".to_string()];
        args.push(
            if plan.created {
                "--no-track"
            } else {
                "--track"
            }
            .into(),
        );
        args.extend([
            "--".into(),
            plan.branch.clone(),
            format!("origin/{}", plan.from),
        ]);
        run(args).await?;
    }
    run(vec!["symbolic-ref".into(), "HEAD".into(), local]).await?;
    let exclude = dir.join(".git").join("info").join("exclude");
    if let Some(parent) = exclude.parent() {
        std::fs::create_dir_all(parent).map_err(BranchError::Exclude)?;
    }
    let mut text = std::fs::read_to_string(&exclude).unwrap_or_default();
    text.push_str("\n# agentctl's own files (kandev-operator)\n/.kandev/\n/lost+found/\n");
    std::fs::write(&exclude, text).map_err(BranchError::Exclude)?;
    Ok(())
}

/// The `-c` options and environment that hand the credentials to git, and the private
/// directory of the key files (removed on drop).
struct GitAuth {
    config: Vec<String>,
    env: Vec<(String, String)>,
    _dir: Option<tempdir::Private>,
}

impl GitAuth {
    fn new(credentials: &GitCredentials, url: &str) -> Result<Self, AgentctlError> {
        // No helper or prompt may answer instead of ours; git fails instead of waiting for a
        // terminal.
        let mut config = vec![
            "-c".to_string(),
            "credential.helper=".to_string(),
            "-c".to_string(),
            "core.askPass=".to_string(),
        ];
        let mut env = vec![
            ("GIT_TERMINAL_PROMPT".to_string(), "0".to_string()),
            ("GIT_ASKPASS".to_string(), String::new()),
            ("SSH_ASKPASS".to_string(), String::new()),
        ];
        if let (Some(password), Some((scheme, host))) = (&credentials.password, url_host(url)) {
            // The helper reads the values from the environment of this one git command (never
            // argv), and answers only when git asks for the repository's own scheme and host:
            // a redirect to another host gets nothing.
            config.push("-c".into());
            config.push(format!(
                "credential.helper=!f() {{ test \"$1\" = get || exit 0; p=; h=; while IFS= read -r l; do case \"$l\" in protocol=*) p=\"${{l#protocol=}}\";; host=*) h=\"${{l#host=}}\";; esac; done; test \"$p\" = \"$KANDEV_GIT_PROTOCOL\" && test \"$h\" = \"$KANDEV_GIT_HOST\" || exit 0; printf 'username=%s\\npassword=%s\\n' \"${{{ENV_GIT_USERNAME}:-{DEFAULT_USERNAME}}}\" \"${ENV_GIT_PASSWORD}\"; }}; f"
            ));
            env.push(("KANDEV_GIT_PROTOCOL".into(), scheme));
            env.push(("KANDEV_GIT_HOST".into(), host));
            env.push((ENV_GIT_PASSWORD.into(), password.clone()));
            if let Some(username) = &credentials.username {
                env.push((ENV_GIT_USERNAME.into(), username.clone()));
            }
        }
        let needs_files = credentials.ssh_key.is_some() || credentials.ca_bundle.is_some();
        let dir = if needs_files {
            Some(tempdir::Private::new().map_err(AgentctlError::io(
                "cannot create a private directory for the git credentials",
            ))?)
        } else {
            None
        };
        if let Some(dir) = &dir {
            if let Some(key) = &credentials.ssh_key {
                let key_file = dir.write("ssh-key", &with_newline(key))?;
                let hosts = dir.write(
                    "known_hosts",
                    &with_newline(credentials.known_hosts.as_deref().unwrap_or("")),
                )?;
                // `-F /dev/null`: ssh reads its user configuration from the passwd entry's
                // home, not HOME, so it is named away here.
                env.push((
                    "GIT_SSH_COMMAND".into(),
                    format!(
                        "ssh -F /dev/null -i '{}' -o IdentitiesOnly=yes -o UserKnownHostsFile='{}' -o StrictHostKeyChecking=yes -o BatchMode=yes",
                        key_file.display(),
                        hosts.display()
                    ),
                ));
            }
            if let Some(ca) = &credentials.ca_bundle {
                let file = dir.write("ca.pem", &with_newline(ca))?;
                // The environment, not `-c http.sslCAInfo`: git 2.39's remote helper ignores
                // the latter.
                env.push(("GIT_SSL_CAINFO".into(), file.display().to_string()));
            }
        }
        Ok(Self {
            config,
            env,
            _dir: dir,
        })
    }
}

/// The scheme and `host[:port]` of a `scheme://[user@]host[:port]/…` URL, as git's credential
/// protocol names them; `None` for other forms (a path, `user@host:path`).
fn url_host(url: &str) -> Option<(String, String)> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    (!scheme.is_empty() && !host.is_empty())
        .then(|| (scheme.to_ascii_lowercase(), host.to_string()))
}

fn with_newline(text: &str) -> String {
    if text.ends_with('\n') {
        text.to_string()
    } else {
        format!("{text}\n")
    }
}

mod tempdir {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::AgentctlError;

    /// A directory only agentctl's user can read, removed on drop.
    pub struct Private(PathBuf);

    impl Private {
        pub fn new() -> std::io::Result<Self> {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let serial = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "kandev-git-{}-{nanos:08x}-{serial}",
                std::process::id()
            ));
            std::fs::DirBuilder::new().mode(0o700).create(&path)?;
            Ok(Self(path))
        }

        pub fn path(&self) -> &std::path::Path {
            &self.0
        }

        /// Writes `name` (mode 0600) and returns its path.
        pub fn write(&self, name: &str, content: &str) -> Result<PathBuf, AgentctlError> {
            use std::io::Write;
            let path = self.0.join(name);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(AgentctlError::io("cannot write a git credential file"))?;
            file.write_all(content.as_bytes())
                .map_err(AgentctlError::io("cannot write a git credential file"))?;
            Ok(path)
        }
    }

    impl Drop for Private {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A git command that did not succeed.
#[derive(Debug)]
pub struct GitFailure {
    what: String,
    stderr: String,
    timed_out: bool,
}

impl std::fmt::Display for GitFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stderr = self.stderr.trim();
        match (self.timed_out, stderr.is_empty()) {
            (true, _) => write!(f, "{} did not finish in time", self.what),
            (false, true) => write!(f, "{} failed", self.what),
            (false, false) => write!(f, "{}", stderr.replace('\n', "; ")),
        }
    }
}

impl std::error::Error for GitFailure {}

/// Configuration on git's command line (which outranks every file) that keeps git from running
/// anything or following anything a file could name.
const HARDENING: [&str; 8] = [
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "protocol.ext.allow=never",
    "-c",
    "http.followRedirects=initial",
];

/// Variables of agentctl's environment that git may still see: where programs are and the
/// cluster's proxies. Everything else (the credentials, `GIT_*` of any kind, HOME) is left
/// out.
const PASSED_THROUGH: [&str; 7] = [
    "PATH",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// The whole environment of a git command, before the command's own additions: the
/// [`PASSED_THROUGH`] part of `inherited`, `home` as HOME, no system or global configuration,
/// messages in English (they are classified) and no prompt.
fn sandboxed(
    home: &Path,
    inherited: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut env: Vec<_> = inherited
        .filter(|(name, _)| PASSED_THROUGH.iter().any(|p| name == p))
        .collect();
    if !env.iter().any(|(name, _)| name == "PATH") {
        env.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()));
    }
    for (name, value) in [
        ("HOME", home.as_os_str()),
        ("XDG_CONFIG_HOME", home.as_os_str()),
        ("GIT_CONFIG_NOSYSTEM", "1".as_ref()),
        ("GIT_CONFIG_SYSTEM", "/dev/null".as_ref()),
        ("GIT_CONFIG_GLOBAL", "/dev/null".as_ref()),
        ("GIT_TERMINAL_PROMPT", "0".as_ref()),
        ("LC_ALL", "C".as_ref()),
    ] {
        env.push((name.into(), value.into()));
    }
    env
}

/// Runs `git <args>` in `dir` with `env` added, within `timeout` (then it is killed), and
/// returns its stdout (at most [`STDOUT_LIMIT`]); on failure, the tail of its stderr.
async fn git(
    dir: Option<&Path>,
    args: &[&str],
    env: &[(String, String)],
    timeout: Duration,
) -> Result<String, GitFailure> {
    let subcommand = args
        .iter()
        .find(|a| !a.starts_with('-') && !a.contains('='))
        .copied()
        .unwrap_or("git");
    let what = format!("git {subcommand}");
    let home = tempdir::Private::new().map_err(|e| GitFailure {
        what: what.clone(),
        stderr: format!("cannot create a private HOME for git: {e}"),
        timed_out: false,
    })?;
    let mut command = tokio::process::Command::new("git");
    command
        .env_clear()
        .envs(sandboxed(home.path(), std::env::vars_os()))
        .args(HARDENING);
    if let Some(dir) = dir {
        // A volume's root belongs to root, so git would call our own clone "dubious".
        command
            .current_dir(dir)
            .arg("-c")
            .arg(format!("safe.directory={}", dir.display()));
    }
    command
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| GitFailure {
        what: what.clone(),
        stderr: format!("cannot run git (is it installed?): {e}"),
        timed_out: false,
    })?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let run = async {
        let (out, err, status) = tokio::join!(
            read_bounded(stdout, STDOUT_LIMIT, false),
            read_bounded(stderr, STDERR_TAIL, true),
            child.wait()
        );
        (out, err, status)
    };
    match tokio::time::timeout(timeout, run).await {
        Err(_) => Err(GitFailure {
            what,
            stderr: String::new(),
            timed_out: true,
        }),
        Ok((out, _, Ok(status))) if status.success() => Ok(out),
        Ok((_, err, status)) => Err(GitFailure {
            what: match status {
                Ok(s) => format!("{what} ({s})"),
                Err(e) => format!("{what} ({e})"),
            },
            stderr: err,
            timed_out: false,
        }),
    }
}

/// Reads `reader` to the end, keeping at most `limit` bytes: the first ones, or with `tail`
/// the last ones.
async fn read_bounded<R: AsyncRead + Unpin>(reader: Option<R>, limit: usize, tail: bool) -> String {
    let Some(mut reader) = reader else {
        return String::new();
    };
    let mut kept: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&chunk[..n]);
                if kept.len() > limit {
                    if tail {
                        kept.drain(..kept.len() - limit);
                    } else {
                        kept.truncate(limit);
                    }
                }
            }
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// Writes `"<reason>: <message>"` to `path` (`--termination-log`): the file the kubelet
/// reports as the container's termination message.
pub fn write_termination_message(path: &Path, reason: CheckoutReason, message: &str) {
    // The kubelet keeps at most 4096 bytes.
    let mut text = format!("{reason}: {message}");
    if text.len() > 4000 {
        let mut cut = 4000;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    if let Err(error) = std::fs::write(path, text) {
        tracing::warn!(%error, path = %path.display(), "cannot write the termination message");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const URL: &str = "https://git.example/team/app.git";

    #[test]
    fn decide_clones_keeps_or_refuses() {
        let clone_of = |o: &str| WorkspaceState::Clone {
            origin: Some(o.into()),
        };
        let mismatch = |why: String| Decision::Refuse(CheckoutReason::WorkspaceMismatch, why);
        let cases: Vec<(WorkspaceState, Decision)> = vec![
            (WorkspaceState::Empty, Decision::Clone),
            (clone_of(URL), Decision::Keep),
            (clone_of("https://git.example/team/app"), Decision::Keep),
            (clone_of("https://git.example/team/app/"), Decision::Keep),
            (
                clone_of("https://git.example/team/other.git"),
                mismatch(format!(
                    "the workspace is a clone of https://git.example/team/other.git, not of {URL}"
                )),
            ),
            (
                clone_of("https://bob:hunter2@git.example/x.git"),
                mismatch(format!(
                    "the workspace is a clone of https://***@git.example/x.git, not of {URL}"
                )),
            ),
            (
                WorkspaceState::Clone { origin: None },
                mismatch(format!(
                    "the workspace is a git repository without an origin, not a clone of {URL}"
                )),
            ),
            (
                WorkspaceState::Other {
                    entry: "notes.txt".into(),
                },
                mismatch(format!(
                    "the workspace is not empty (it holds \"notes.txt\") and is not a clone of {URL}"
                )),
            ),
        ];
        for (state, want) in cases {
            assert_eq!(decide(&state, URL, CheckoutStart::First), want, "{state:?}");
            // A later start decides the same, but never clones into an empty workspace.
            let later = match want {
                Decision::Clone => Decision::Refuse(
                    CheckoutReason::WorkspaceEmpty,
                    format!(
                        "the workspace is empty, but the session's clone of {URL} was made on an earlier start: the clone and the agent's work on it are gone, and a new clone is never made in their place"
                    ),
                ),
                other => other,
            };
            assert_eq!(
                decide(&state, URL, CheckoutStart::Later),
                later,
                "later: {state:?}"
            );
        }
    }

    #[test]
    fn branch_selection() {
        let remote = ["main", "develop", "feature"];
        let on = |b: &str| remote.contains(&b);
        let plan = |branch: &str, from: &str, created: bool| {
            Ok(BranchPlan {
                branch: branch.into(),
                from: from.into(),
                created,
            })
        };
        // (branch, baseBranch, remote default) -> plan
        type Case<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
            Result<BranchPlan, ()>,
        );
        let cases: Vec<Case> = vec![
            (
                Some("feature"),
                None,
                Some("main"),
                plan("feature", "feature", false),
            ),
            (
                Some("feature"),
                Some("develop"),
                Some("main"),
                plan("feature", "feature", false),
            ),
            (
                Some("new"),
                Some("develop"),
                Some("main"),
                plan("new", "develop", true),
            ),
            (Some("new"), None, Some("main"), plan("new", "main", true)),
            (Some("new"), Some("gone"), Some("main"), Err(())),
            (Some("new"), None, None, Err(())),
            (
                None,
                Some("develop"),
                Some("main"),
                plan("develop", "develop", false),
            ),
            (None, None, Some("main"), plan("main", "main", false)),
            (None, Some("gone"), Some("main"), Err(())),
            (None, None, None, Err(())),
        ];
        for (branch, base, default, want) in cases {
            let got = plan_branch(branch, base, default, on).map_err(|_| ());
            assert_eq!(got, want, "{branch:?} {base:?} {default:?}");
        }
    }

    #[test]
    fn scrubbing_removes_secrets_and_url_passwords() {
        let key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----";
        let cases = [
            (
                "fatal: Authentication failed for 'https://127.0.0.1:8443/app.git/'",
                vec!["s3cr3t-token"],
                "fatal: Authentication failed for 'https://127.0.0.1:8443/app.git/'",
            ),
            (
                "remote: invalid token s3cr3t-token for user",
                vec!["s3cr3t-token"],
                "remote: invalid token *** for user",
            ),
            (
                "fatal: unable to access 'https://bob:s3cr3t@host/app.git/': 401",
                vec![],
                "fatal: unable to access 'https://***@host/app.git/': 401",
            ),
            (
                "Load key: b3BlbnNzaC1rZXktdjEAAAAA: invalid format",
                vec![key],
                "Load key: ***: invalid format",
            ),
            ("nothing secret here", vec![""], "nothing secret here"),
            ("pin 42 used", vec!["42"], "pin *** used"),
            (
                "git://host/x and ssh://git@host/y",
                vec![],
                "git://host/x and ssh://***@host/y",
            ),
        ];
        for (text, secrets, want) in cases {
            assert_eq!(scrub(text, &secrets), want, "{text}");
        }
    }

    #[test]
    fn git_errors_are_classified() {
        let cases = [
            (
                "fatal: Authentication failed for 'https://h/a.git/'",
                CheckoutReason::RepositoryAuthFailed,
            ),
            (
                "fatal: could not read Username for 'https://h': terminal prompts disabled",
                CheckoutReason::RepositoryAuthFailed,
            ),
            (
                "git@h: Permission denied (publickey).",
                CheckoutReason::RepositoryAuthFailed,
            ),
            (
                "Host key verification failed.",
                CheckoutReason::RepositoryAuthFailed,
            ),
            (
                "fatal: unable to access 'https://h/': The requested URL returned error: 403",
                CheckoutReason::RepositoryAuthFailed,
            ),
            (
                "fatal: unable to access 'https://h/': Could not resolve host: h",
                CheckoutReason::RepositoryUnreachable,
            ),
            (
                "fatal: unable to connect to 127.0.0.1: Connection refused",
                CheckoutReason::RepositoryUnreachable,
            ),
            (
                "fatal: remote error: access denied or repository not exported: /x",
                CheckoutReason::RepositoryUnreachable,
            ),
            (
                "fatal: repository 'https://h/x/' not found",
                CheckoutReason::RepositoryUnreachable,
            ),
        ];
        for (stderr, want) in cases {
            assert_eq!(classify_git_error(stderr), want, "{stderr}");
        }
    }

    #[test]
    fn termination_messages_round_trip_known_reasons_only() {
        for reason in CheckoutReason::ALL {
            let text = format!("{reason}: cloning x failed");
            assert_eq!(
                CheckoutReason::from_termination_message(&text),
                Some((reason, "cloning x failed"))
            );
        }
        assert_eq!(
            CheckoutReason::from_termination_message("OOMKilled: x"),
            None
        );
        assert_eq!(CheckoutReason::from_termination_message("no reason"), None);
    }

    /// `git <args>` in `dir` for the fixtures, failing the test on error.
    fn sh_git(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .current_dir(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A bare repository with `main` (default) and `develop`, one commit each.
    fn upstream(root: &Path) -> (PathBuf, String) {
        let work = root.join("seed");
        std::fs::create_dir_all(&work).expect("mkdir");
        sh_git(&work, &["init", "-q", "-b", "main"]);
        std::fs::write(work.join("README"), "main\n").expect("write");
        sh_git(&work, &["add", "."]);
        sh_git(&work, &["commit", "-q", "-m", "main"]);
        sh_git(&work, &["checkout", "-q", "-b", "develop"]);
        std::fs::write(work.join("DEV"), "dev\n").expect("write");
        sh_git(&work, &["add", "."]);
        sh_git(&work, &["commit", "-q", "-m", "develop"]);
        let develop = sh_git(&work, &["rev-parse", "HEAD"]);
        sh_git(&work, &["checkout", "-q", "main"]);
        let bare = root.join("upstream.git");
        sh_git(root, &["clone", "-q", "--bare", "seed", "upstream.git"]);
        (bare, develop)
    }

    #[tokio::test]
    async fn clones_once_then_keeps_the_worktree_and_refuses_strangers() {
        let root = tempfile::tempdir().expect("tempdir");
        let (bare, develop) = upstream(root.path());
        let repository = Repository {
            url: bare.to_string_lossy().into_owned(),
            branch: Some("kandev/task-1".into()),
            base_branch: Some("develop".into()),
        };
        let ws = root.path().join("ws");
        std::fs::create_dir_all(ws.join(".kandev/home")).expect("mkdir");
        let creds = GitCredentials::default();
        let first = prepare(
            &ws,
            &repository,
            &creds,
            Duration::from_secs(60),
            CheckoutStart::First,
        )
        .await
        .expect("clone");
        assert_eq!(
            first,
            Worktree {
                branch: Some("kandev/task-1".into()),
                commit: Some(develop.clone()),
                cloned: true
            }
        );
        assert!(ws.join("DEV").is_file() && ws.join("README").is_file());
        assert_eq!(
            sh_git(&ws, &["status", "--porcelain"]),
            "",
            ".kandev is excluded"
        );
        // Uncommitted work survives the next start, which clones nothing.
        std::fs::write(ws.join("work.txt"), "mine").expect("write");
        let again = prepare(
            &ws,
            &repository,
            &creds,
            Duration::from_secs(60),
            CheckoutStart::Later,
        )
        .await
        .expect("keep");
        assert!(!again.cloned);
        assert_eq!(again.commit, Some(develop));
        assert_eq!(
            std::fs::read_to_string(ws.join("work.txt")).ok().as_deref(),
            Some("mine")
        );
        // On a later start, an empty workspace (the clone gone, agentctl's own files kept) is
        // refused, and nothing is cloned.
        let wiped = root.path().join("wiped");
        std::fs::create_dir_all(wiped.join(".kandev/sessions")).expect("mkdir");
        let refused = prepare(
            &wiped,
            &repository,
            &creds,
            Duration::from_secs(60),
            CheckoutStart::Later,
        )
        .await;
        assert!(
            matches!(
                &refused,
                Err(AgentctlError::Checkout {
                    reason: CheckoutReason::WorkspaceEmpty,
                    message,
                }) if message.contains("never made in their place")
            ),
            "{refused:?}"
        );
        assert!(!wiped.join(".git").exists() && !wiped.join("README").exists());
        // The remote's default branch without branch/baseBranch.
        let ws2 = root.path().join("ws2");
        std::fs::create_dir_all(&ws2).expect("mkdir");
        let plain = Repository {
            url: repository.url.clone(),
            ..Default::default()
        };
        let main = prepare(
            &ws2,
            &plain,
            &creds,
            Duration::from_secs(60),
            CheckoutStart::First,
        )
        .await
        .expect("clone main");
        assert_eq!(main.branch.as_deref(), Some("main"));
        // A workspace with something else in it is refused, untouched.
        let ws3 = root.path().join("ws3");
        std::fs::create_dir_all(&ws3).expect("mkdir");
        std::fs::write(ws3.join("notes.txt"), "x").expect("write");
        let refused = prepare(
            &ws3,
            &repository,
            &creds,
            Duration::from_secs(60),
            CheckoutStart::First,
        )
        .await;
        assert!(
            matches!(
                &refused,
                Err(AgentctlError::Checkout {
                    reason: CheckoutReason::WorkspaceMismatch,
                    ..
                })
            ),
            "{refused:?}"
        );
        assert!(!ws3.join(".git").exists());
        // Another repository's clone is refused too.
        let other = Repository {
            url: "https://git.example/other.git".into(),
            ..Default::default()
        };
        let refused = prepare(
            &ws,
            &other,
            &creds,
            Duration::from_secs(60),
            CheckoutStart::First,
        )
        .await;
        assert!(matches!(
            &refused,
            Err(AgentctlError::Checkout {
                reason: CheckoutReason::WorkspaceMismatch,
                ..
            })
        ));
        // A missing base branch: nothing is left behind.
        let ws4 = root.path().join("ws4");
        std::fs::create_dir_all(&ws4).expect("mkdir");
        let bad_base = Repository {
            base_branch: Some("gone".into()),
            ..repository.clone()
        };
        let refused = prepare(
            &ws4,
            &bad_base,
            &creds,
            Duration::from_secs(60),
            CheckoutStart::First,
        )
        .await;
        assert!(
            matches!(
                &refused,
                Err(AgentctlError::Checkout {
                    reason: CheckoutReason::RepositoryCheckoutFailed,
                    ..
                })
            ),
            "{refused:?}"
        );
        assert!(!ws4.join(".git").exists());
        // Unreachable.
        let ws5 = root.path().join("ws5");
        std::fs::create_dir_all(&ws5).expect("mkdir");
        let nowhere = Repository {
            url: root
                .path()
                .join("nowhere.git")
                .to_string_lossy()
                .into_owned(),
            ..Default::default()
        };
        let refused = prepare(
            &ws5,
            &nowhere,
            &creds,
            Duration::from_secs(60),
            CheckoutStart::First,
        )
        .await;
        assert!(
            matches!(
                &refused,
                Err(AgentctlError::Checkout {
                    reason: CheckoutReason::RepositoryUnreachable,
                    ..
                })
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn the_credential_helper_is_bound_to_the_repositorys_host() {
        let rows = [
            (
                "https://git.example/team/app.git",
                Some(("https", "git.example")),
            ),
            (
                "HTTPS://bob:pw@git.example:8443/a",
                Some(("https", "git.example:8443")),
            ),
            ("http://git.example", Some(("http", "git.example"))),
            ("https://git.example?x=1", Some(("https", "git.example"))),
            (
                "ssh://git@git.example/team/app.git",
                Some(("ssh", "git.example")),
            ),
            ("git@git.example:team/app.git", None),
            ("/srv/git/app.git", None),
            ("https:///path", None),
        ];
        for (url, want) in rows {
            let want = want.map(|(s, h)| (s.to_string(), h.to_string()));
            assert_eq!(url_host(url), want, "{url}");
        }
    }

    /// What the agent could set for git (its HOME, `GIT_*`) and the credentials never reach a
    /// git command from agentctl's environment; PATH and the cluster's proxies do.
    #[test]
    fn git_runs_in_an_emptied_environment() {
        let inherited = [
            ("PATH", "/opt/bin:/usr/bin"),
            ("HOME", "/workspace/.kandev/home"),
            ("XDG_CONFIG_HOME", "/workspace/.config"),
            ("GIT_CONFIG_COUNT", "1"),
            ("GIT_CONFIG_KEY_0", "core.fsmonitor"),
            ("GIT_DIR", "/elsewhere"),
            ("GIT_TRACE", "/workspace/trace"),
            (ENV_GIT_PASSWORD, "s3cr3t"),
            ("HTTPS_PROXY", "http://proxy:3128"),
            ("no_proxy", ".svc"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let env = sandboxed(Path::new("/tmp/private"), inherited.into_iter());
        let names: Vec<String> = env
            .iter()
            .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
            .collect();
        assert_eq!(
            names,
            [
                "PATH=/opt/bin:/usr/bin",
                "HTTPS_PROXY=http://proxy:3128",
                "no_proxy=.svc",
                "HOME=/tmp/private",
                "XDG_CONFIG_HOME=/tmp/private",
                "GIT_CONFIG_NOSYSTEM=1",
                "GIT_CONFIG_SYSTEM=/dev/null",
                "GIT_CONFIG_GLOBAL=/dev/null",
                "GIT_TERMINAL_PROMPT=0",
                "LC_ALL=C",
            ]
        );
        let bare = sandboxed(Path::new("/tmp/p"), std::iter::empty());
        assert!(bare.iter().any(|(k, _)| k == "PATH"), "a PATH all the same");
    }

    #[test]
    fn credentials_never_show_in_debug_output() {
        let creds = GitCredentials {
            password: Some("s3cr3t".into()),
            ..Default::default()
        };
        assert!(!format!("{creds:?}").contains("s3cr3t"));
    }

    #[tokio::test]
    async fn the_helper_gets_the_password_from_the_environment_not_argv() {
        let creds = GitCredentials {
            password: Some("s3cr3t".into()),
            ssh_key: Some("KEY".into()),
            known_hosts: Some("host ssh-ed25519 AAAA".into()),
            ..Default::default()
        };
        let auth = GitAuth::new(&creds, "https://git.example:8443/team/app.git").expect("auth");
        let argv = auth.config.join(" ");
        assert!(
            !argv.contains("s3cr3t") && argv.contains("$KANDEV_GIT_PASSWORD"),
            "{argv}"
        );
        // The helper answers for the repository's scheme and host only.
        let env = |name: &str| {
            auth.env
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(env("KANDEV_GIT_PROTOCOL"), Some("https"));
        assert_eq!(env("KANDEV_GIT_HOST"), Some("git.example:8443"));
        assert_eq!(env(ENV_GIT_PASSWORD), Some("s3cr3t"));
        let ssh = auth
            .env
            .iter()
            .find(|(k, _)| k == "GIT_SSH_COMMAND")
            .map(|(_, v)| v.clone())
            .expect("ssh command");
        assert!(
            ssh.contains("StrictHostKeyChecking=yes") && !ssh.contains("KEY'"),
            "{ssh}"
        );
    }
}
