//! Starting and signalling the local processes that play containers.
//!
//! Each process leads its own process group (so the whole "container" can be signalled at
//! once) and gets SIGKILL if the harness dies (so no container outlives its harness). What was
//! exec'd into a pod is found by the pod UID in its environment and dies with the container.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::Stdio;

use k8s_openapi::jiff::Timestamp;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tracing::warn;

use crate::plan::LaunchPlan;

/// Creates the plan's directories and starts its process; its stdout and stderr are copied to
/// the plan's log file in the CRI log format (what kwok's `Logs` serves to `kubectl logs`).
///
/// Must be called from the thread that stays alive for the harness's whole life (the harness
/// runs a current-thread runtime): the parent-death signal fires when the *spawning thread* ends.
#[allow(unsafe_code)]
pub fn spawn(plan: &LaunchPlan) -> io::Result<Child> {
    for dir in &plan.dirs {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::create_dir_all(&plan.pod_dir)?;
    // Fail early, before starting anything, if the log file cannot be written.
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&plan.log_file)?;

    let mut cmd = Command::new(&plan.program);
    cmd.args(&plan.args)
        .current_dir(&plan.workdir)
        .envs(plan.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2), which is
    // async-signal-safe; it touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    if let Some(out) = child.stdout.take() {
        tokio::spawn(pump(out, "stdout", plan.log_file.clone()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(pump(err, "stderr", plan.log_file.clone()));
    }
    Ok(child)
}

/// One line of a CRI container log: `<RFC 3339 time> <stream> F <line>`.
pub fn cri_line(stream: &str, line: &str) -> String {
    format!("{} {stream} F {line}\n", Timestamp::now())
}

/// Copies `reader` line by line into the CRI log file until EOF.
async fn pump<R: AsyncRead + Unpin>(reader: R, stream: &'static str, log_file: PathBuf) {
    let mut lines = BufReader::new(reader).lines();
    let mut file = match OpenOptions::new().create(true).append(true).open(&log_file) {
        Ok(f) => f,
        Err(e) => {
            warn!(file = %log_file.display(), error = %e, "cannot open the log file");
            return;
        }
    };
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                if let Err(e) = file.write_all(cri_line(stream, &line).as_bytes()) {
                    warn!(file = %log_file.display(), error = %e, "cannot write the log file");
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                warn!(stream, error = %e, "reading the process output failed");
                return;
            }
        }
    }
}

/// The processes (other than this one) whose environment sets `key`, by its value: a pod's own
/// process and everything exec'd into the pod (kwok starts those with the Exec's env) under the
/// pod's uid. One pass over /proc for all pods.
pub fn pids_by_env(key: &str) -> HashMap<String, Vec<u32>> {
    let prefix = format!("{key}=");
    let me = std::process::id();
    let mut found: HashMap<String, Vec<u32>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    let pids = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    for pid in pids.filter(|pid| *pid != me) {
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let value = env
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(prefix.as_bytes()));
        if let Some(value) = value {
            let value = String::from_utf8_lossy(value).into_owned();
            found.entry(value).or_default().push(pid);
        }
    }
    found
}

/// Sends `signal` to one process. Returns false when it no longer exists.
#[allow(unsafe_code)]
pub fn signal_pid(pid: u32, signal: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 1 {
        return false;
    }
    // SAFETY: kill(2) on a single pid; no memory is shared.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// Sends `signal` to the process group `pgid`. Returns false when the group no longer exists.
#[allow(unsafe_code)]
pub fn signal_group(pgid: u32, signal: libc::c_int) -> bool {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is shared.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// True while some process of group `pgid` is alive.
pub fn group_alive(pgid: u32) -> bool {
    signal_group(pgid, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_lines() {
        let line = cri_line("stdout", "hello world");
        let mut parts = line.splitn(4, ' ');
        let time = parts.next().expect("time");
        assert!(time.parse::<Timestamp>().is_ok(), "{time}");
        assert_eq!(
            parts.collect::<Vec<_>>(),
            vec!["stdout", "F", "hello world\n"]
        );
    }

    #[test]
    fn finds_processes_by_environment() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("KANDEV_TEST_MARKER", "find-me-42")
            .spawn()
            .expect("spawn sleep");
        let mut found = Vec::new();
        for _ in 0..50 {
            found = pids_by_env("KANDEV_TEST_MARKER")
                .remove("find-me-42")
                .unwrap_or_default();
            if found.contains(&child.id()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            found.contains(&child.id()),
            "{found:?} lacks {}",
            child.id()
        );
        assert!(!found.contains(&std::process::id()));
    }
}
