//! `kubectl kandev history`: the conversation agentctl recorded on the workspace volume, read
//! through the running agentctl pod with `agentctl history` (the container needs nothing else:
//! no shell, no `cat`).

use std::time::Duration;

use kube::api::AttachParams;
use tokio::io::AsyncReadExt;

use super::cli::{HistoryArgs, HistoryOutput};
use super::cluster::Cluster;
use super::error::{ExitCode, PluginError};
use super::status::liveness_name;
use super::write_stdout;
use crate::api::pod_contract::CONTAINER;
use crate::history::{NO_HISTORY_EXIT_CODE, parse_history, render_transcript, validate_session_id};

/// The whole read (exec, `agentctl history`, status) must finish within this.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The history file relative to the container's working directory, which is the workspace's
/// mount path (agentctl records `<workspace>/.kandev/sessions/<session>.jsonl`), for messages.
pub fn history_path(session: &str) -> String {
    format!(".kandev/sessions/{session}.jsonl")
}

/// The command exec'd in the agentctl container. The workspace is `agentctl history`'s default,
/// the working directory (the workspace's mount path), so it works wherever the volume is
/// mounted.
pub fn history_command(session: &str) -> [&str; 4] {
    ["agentctl", "history", "--session-name", session]
}

/// How the exec'd `agentctl history` ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Exit 0: stdout is the history.
    Printed,
    /// The session has no recorded history yet (exit 3).
    NoHistory,
    /// Anything else, with what the container said.
    Failed(String),
}

/// Classifies the exec's end: the exit code from the exec status when the transport reports it
/// (a kubelet does: `NonZeroExitCode` with an `ExitCode` cause), and agentctl's own words
/// otherwise (kwok's exec, for one, reports a failure without the code).
pub fn read_outcome(success: bool, exit_code: Option<i32>, stderr: &str) -> ReadOutcome {
    let stderr = stderr.trim();
    if success {
        ReadOutcome::Printed
    } else if exit_code == Some(NO_HISTORY_EXIT_CODE) || stderr.contains("no recorded history") {
        ReadOutcome::NoHistory
    } else if stderr.is_empty() {
        ReadOutcome::Failed(match exit_code {
            Some(code) => format!("agentctl history exited with code {code}"),
            None => "agentctl history failed".to_string(),
        })
    } else {
        ReadOutcome::Failed(stderr.to_string())
    }
}

pub async fn history(cluster: &Cluster, args: HistoryArgs) -> Result<ExitCode, PluginError> {
    let snapshot = cluster.snapshot(&args.session).await?;
    let name = snapshot.name();
    validate_session_id(&name).map_err(|e| PluginError::Exec {
        action: format!("locating the history of tasksession {name:?}"),
        reason: e.to_string(),
    })?;
    let Some(pod) = snapshot.running_pod().and_then(|p| p.metadata.name.clone()) else {
        let pod = match snapshot.current_pod().and_then(|p| p.metadata.name.clone()) {
            Some(pod) => format!("pod {pod} is {}", liveness_name(snapshot.liveness())),
            None => "none exists".to_string(),
        };
        return Err(PluginError::NoRunningPod {
            name,
            namespace: cluster.namespace.clone(),
            pod,
            what: "the history is on the workspace volume and is read through the agent's pod",
        });
    };
    let action = format!("reading {} in pod {pod}", history_path(&name));
    let (stdout, stderr, success, exit_code) = match tokio::time::timeout(
        READ_TIMEOUT,
        exec_read(cluster, &pod, &history_command(&name)),
    )
    .await
    {
        Ok(result) => result.map_err(|e| match e {
            ReadError::Kube(source) => cluster.kube_error(action.clone(), source),
            ReadError::Io(source) => PluginError::Io {
                context: action.clone(),
                source,
            },
        })?,
        Err(_) => {
            return Err(PluginError::Timeout {
                what: action,
                waited: READ_TIMEOUT,
                last_seen: format!("pod {pod} did not finish the read"),
            });
        }
    };
    match read_outcome(success, exit_code, &String::from_utf8_lossy(&stderr)) {
        ReadOutcome::Printed => {}
        ReadOutcome::NoHistory => {
            say!("tasksession {name:?} has no recorded history yet");
            return Ok(ExitCode::Ok);
        }
        ReadOutcome::Failed(reason) => return Err(PluginError::Exec { action, reason }),
    }
    match args.output {
        HistoryOutput::Jsonl => write_stdout(&String::from_utf8_lossy(&stdout))?,
        HistoryOutput::Text => {
            let parsed = parse_history(&String::from_utf8_lossy(&stdout));
            if parsed.entries.is_empty() {
                say!("tasksession {name:?} has no recorded history yet");
            }
            write_stdout(&render_transcript(&parsed.entries, args.timestamps))?;
            if parsed.skipped_corrupt_lines > 0 {
                say!(
                    "({} corrupt line(s) skipped; see them with -o jsonl)",
                    parsed.skipped_corrupt_lines
                );
            }
        }
    }
    Ok(ExitCode::Ok)
}

pub(super) enum ReadError {
    Kube(kube::Error),
    Io(std::io::Error),
}

/// What an exec'd command left: stdout, stderr, whether it exited with success, and its exit
/// code when the transport reported one.
pub(super) type Exited = (Vec<u8>, Vec<u8>, bool, Option<i32>);

/// Execs `command` (an agentctl subcommand that ends by itself) in the agentctl container and
/// reads what it leaves.
pub(super) async fn exec_read(
    cluster: &Cluster,
    pod: &str,
    command: &[&str],
) -> Result<Exited, ReadError> {
    let params = AttachParams::default()
        .container(CONTAINER)
        .stdin(false)
        .stdout(true)
        .stderr(true);
    let mut process = cluster
        .exec_pods()
        .exec(pod, command.iter().copied(), &params)
        .await
        .map_err(ReadError::Kube)?;
    let status = process.take_status();
    let mut stdout = process.stdout();
    let mut stderr = process.stderr();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let read_out = async {
        match stdout.as_mut() {
            Some(s) => s.read_to_end(&mut out).await.map(|_| ()),
            None => Ok(()),
        }
    };
    let read_err = async {
        match stderr.as_mut() {
            Some(s) => s.read_to_end(&mut err).await.map(|_| ()),
            None => Ok(()),
        }
    };
    let (read_out, read_err) = tokio::join!(read_out, read_err);
    read_out.map_err(ReadError::Io)?;
    read_err.map_err(ReadError::Io)?;
    let (success, exit_code) = match status {
        Some(status) => {
            let status = status.await;
            let success = status
                .as_ref()
                .is_some_and(|s| s.status.as_deref() == Some("Success"));
            (success, status.as_ref().and_then(exit_code))
        }
        None => (true, None),
    };
    process
        .join()
        .await
        .map_err(|e| ReadError::Io(std::io::Error::other(e)))?;
    Ok((out, err, success, exit_code))
}

/// The exit code in an exec's final status (`reason: NonZeroExitCode`, cause `ExitCode`).
fn exit_code(status: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status) -> Option<i32> {
    status
        .details
        .as_ref()?
        .causes
        .as_ref()?
        .iter()
        .find(|cause| cause.reason.as_deref() == Some("ExitCode"))?
        .message
        .as_deref()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_path_is_relative_to_the_workspace() {
        assert_eq!(history_path("demo"), ".kandev/sessions/demo.jsonl");
        assert_eq!(
            history_command("demo"),
            ["agentctl", "history", "--session-name", "demo"]
        );
    }

    #[test]
    fn how_the_read_ended() {
        let failed = |s: &str| ReadOutcome::Failed(s.to_string());
        #[rustfmt::skip]
        let rows = [
            (true, None, "", ReadOutcome::Printed),
            (true, Some(0), "noise", ReadOutcome::Printed),
            (false, Some(3), "", ReadOutcome::NoHistory),
            (false, None, "agentctl: no recorded history for session \"a\" at …", ReadOutcome::NoHistory),
            (false, Some(1), "agentctl: invalid --session-name: …\n", failed("agentctl: invalid --session-name: …")),
            (false, Some(126), "", failed("agentctl history exited with code 126")),
            (false, None, "  ", failed("agentctl history failed")),
        ];
        for (success, code, stderr, expected) in rows {
            assert_eq!(read_outcome(success, code, stderr), expected, "{stderr:?}");
        }
    }

    #[test]
    fn the_exit_code_is_read_from_the_exec_status() {
        let status: k8s_openapi::apimachinery::pkg::apis::meta::v1::Status =
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}
            }))
            .expect("status");
        assert_eq!(exit_code(&status), Some(3));
        assert_eq!(exit_code(&Default::default()), None);
    }
}
