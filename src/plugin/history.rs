//! `kubectl kandev history`: the conversation agentctl recorded on the workspace volume, read
//! through the running agentctl pod.

use std::time::Duration;

use kube::api::AttachParams;
use tokio::io::AsyncReadExt;

use super::cli::{HistoryArgs, HistoryOutput};
use super::cluster::Cluster;
use super::error::{ExitCode, PluginError};
use super::view::{liveness_name, render_history};
use super::{write_stdout, write_stdout_bytes};
use crate::controller::pods::CONTAINER;
use crate::history::{parse_history, validate_session_id};

/// The whole read (exec, `cat`, status) must finish within this.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The history file relative to the container's working directory, which is the workspace's
/// mount path (agentctl records `<workspace>/.kandev/sessions/<session>.jsonl`). Relative, so
/// it works wherever the volume is mounted.
pub fn history_path(session: &str) -> String {
    format!(".kandev/sessions/{session}.jsonl")
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
    let (stdout, stderr, success) =
        match tokio::time::timeout(READ_TIMEOUT, cat(cluster, &pod, &name)).await {
            Ok(result) => result.map_err(|e| match e {
                CatError::Kube(source) => cluster.kube_error(action.clone(), source),
                CatError::Io(source) => PluginError::Io {
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
    if !success {
        let message = String::from_utf8_lossy(&stderr).trim().to_string();
        if message.contains("No such file") {
            eprintln!("tasksession {name:?} has no recorded history yet");
            return Ok(ExitCode::Ok);
        }
        return Err(PluginError::Exec {
            action,
            reason: if message.is_empty() {
                "cat failed".to_string()
            } else {
                message
            },
        });
    }
    match args.output {
        HistoryOutput::Jsonl => write_stdout_bytes(&stdout)?,
        HistoryOutput::Text => {
            let parsed = parse_history(&String::from_utf8_lossy(&stdout));
            if parsed.entries.is_empty() {
                eprintln!("tasksession {name:?} has no recorded history yet");
            }
            write_stdout(&render_history(&parsed.entries, args.timestamps))?;
            if parsed.skipped_corrupt_lines > 0 {
                eprintln!(
                    "({} corrupt line(s) skipped; see them with -o jsonl)",
                    parsed.skipped_corrupt_lines
                );
            }
        }
    }
    Ok(ExitCode::Ok)
}

enum CatError {
    Kube(kube::Error),
    Io(std::io::Error),
}

/// Execs `cat <history file>` in the agentctl container: (stdout, stderr, exited with success).
async fn cat(
    cluster: &Cluster,
    pod: &str,
    session: &str,
) -> Result<(Vec<u8>, Vec<u8>, bool), CatError> {
    let params = AttachParams::default()
        .container(CONTAINER)
        .stdin(false)
        .stdout(true)
        .stderr(true);
    let mut process = cluster
        .exec_pods()
        .exec(pod, ["cat", &history_path(session)], &params)
        .await
        .map_err(CatError::Kube)?;
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
    read_out.map_err(CatError::Io)?;
    read_err.map_err(CatError::Io)?;
    let success = match status {
        Some(status) => status
            .await
            .is_some_and(|s| s.status.as_deref() == Some("Success")),
        None => true,
    };
    process
        .join()
        .await
        .map_err(|e| CatError::Io(std::io::Error::other(e)))?;
    Ok((out, err, success))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_path_is_relative_to_the_workspace() {
        assert_eq!(history_path("demo"), ".kandev/sessions/demo.jsonl");
    }
}
