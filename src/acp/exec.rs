//! ACP over a Kubernetes exec stream: `agentctl connect` inside the agentctl pod bridges the
//! exec's stdin/stdout to the agent that `agentctl serve` holds, so the operator speaks ACP to
//! the agent through the API server without any port or service.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, AttachedProcess};

use super::{AcpClient, AcpError};

/// An ACP client whose byte stream is an exec into `agentctl connect`.
pub struct PodConnection {
    pub client: AcpClient,
    process: AttachedProcess,
}

impl PodConnection {
    /// Execs `agentctl connect` in `container` of `pod` and wraps its stdio in an [`AcpClient`].
    pub async fn open(pods: &Api<Pod>, pod: &str, container: &str) -> Result<Self, AcpError> {
        let (process, stdout, stdin) =
            exec_stdio(pods, pod, container, &["agentctl", "connect"]).await?;
        Ok(Self {
            client: AcpClient::new(stdout, stdin),
            process,
        })
    }

    /// Ends the connection, leaving the agent running: `_kandev/disconnect`, then wait up to
    /// `grace` for `agentctl connect` to exit before dropping the stream.
    pub async fn close(self, grace: Duration) {
        self.client.disconnect(grace).await;
        if tokio::time::timeout(grace, self.process.join())
            .await
            .is_err()
        {
            tracing::debug!("agentctl connect did not exit in time; dropping the exec stream");
        }
    }
}

/// Execs `command` in `container` of `pod` with its stdin and stdout attached (no stderr).
pub async fn exec_stdio(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    command: &[&str],
) -> Result<
    (
        AttachedProcess,
        impl tokio::io::AsyncRead + Unpin + Send + 'static,
        impl tokio::io::AsyncWrite + Unpin + Send + 'static,
    ),
    AcpError,
> {
    let params = AttachParams::default()
        .container(container)
        .stdin(true)
        .stdout(true)
        .stderr(false);
    let mut process = pods
        .exec(pod, command.iter().copied(), &params)
        .await
        .map_err(|source| AcpError::Exec {
            pod: pod.to_string(),
            source,
        })?;
    let (Some(stdout), Some(stdin)) = (process.stdout(), process.stdin()) else {
        return Err(AcpError::ExecStreams {
            pod: pod.to_string(),
        });
    };
    Ok((process, stdout, stdin))
}
