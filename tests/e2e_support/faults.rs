//! A real TCP fault injector between an operator under test and the API server: toxiproxy
//! (`toxiproxy-server`, built from Go modules by e2e/bin.sh), driven through its HTTP API. The
//! operator gets a kubeconfig whose server is the proxy; TLS passes through untouched (the API
//! server's certificate is for 127.0.0.1, so only the port changes).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use kube::config::Kubeconfig;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{repo_path, unique};

/// The name of the one proxy: operator → API server.
const PROXY: &str = "apiserver";

/// A running toxiproxy with one proxy in front of the API server, stopped when dropped.
pub struct FaultProxy {
    _server: tokio::process::Child,
    api: String,
    /// A kubeconfig like $KUBECONFIG whose server is the proxy.
    pub kubeconfig: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl FaultProxy {
    pub async fn start() -> Self {
        let api_port = free_port();
        let dir = repo_path("target/e2e-logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        let log = std::fs::File::create(dir.join(format!("{}.log", unique("toxiproxy"))))
            .expect("toxiproxy log");
        let server = tokio::process::Command::new("toxiproxy-server")
            .args(["-host", "127.0.0.1", "-port", &api_port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start toxiproxy-server (built by e2e/bin.sh; run the tests with e2e/test.sh)");
        let api = format!("127.0.0.1:{api_port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while request(&api, "GET", "/version", None).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "toxiproxy did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let path = std::env::var("KUBECONFIG").expect("KUBECONFIG");
        let first = std::env::split_paths(&path).next().expect("a path");
        let mut kubeconfig = Kubeconfig::read_from(&first).expect("read KUBECONFIG");
        let listen = format!("127.0.0.1:{}", free_port());
        let mut upstream = None;
        for cluster in &mut kubeconfig.clusters {
            let Some(cluster) = cluster.cluster.as_mut() else {
                continue;
            };
            let server = cluster.server.clone().expect("a server");
            let url: http::Uri = server.parse().expect("server URL");
            let authority = url.authority().expect("host:port").to_string();
            cluster.server = Some(server.replace(&authority, &listen));
            upstream = Some(authority);
        }
        let upstream = upstream.expect("a cluster in KUBECONFIG");
        let created = request(
            &api,
            "POST",
            "/proxies",
            Some(json!({"name": PROXY, "listen": listen, "upstream": upstream, "enabled": true})),
        )
        .await
        .expect("create the proxy");
        assert!(created.0 < 300, "create the proxy: {created:?}");
        let kubeconfig_path = dir.join(format!("{}.kubeconfig", unique("faults")));
        std::fs::write(
            &kubeconfig_path,
            serde_yaml::to_string(&kubeconfig).expect("kubeconfig as YAML"),
        )
        .expect("write the proxied kubeconfig");
        FaultProxy {
            _server: server,
            api,
            kubeconfig: kubeconfig_path,
        }
    }

    /// Adds toxic `name` of `kind` (toxiproxy's types: latency, timeout, reset_peer, …) on
    /// both directions (`<name>-up`, `<name>-down`).
    pub async fn add(&self, name: &str, kind: &str, attributes: Value) {
        for stream in ["upstream", "downstream"] {
            let toxic = json!({
                "name": format!("{name}-{stream}"),
                "type": kind,
                "stream": stream,
                "toxicity": 1.0,
                "attributes": attributes,
            });
            let path = format!("/proxies/{PROXY}/toxics");
            let answer = request(&self.api, "POST", &path, Some(toxic))
                .await
                .expect("add a toxic");
            assert!(answer.0 < 300, "add toxic {name}: {answer:?}");
        }
    }

    /// Removes toxic `name` (both directions).
    pub async fn remove(&self, name: &str) {
        for stream in ["upstream", "downstream"] {
            let path = format!("/proxies/{PROXY}/toxics/{name}-{stream}");
            let answer = request(&self.api, "DELETE", &path, None)
                .await
                .expect("remove a toxic");
            assert!(answer.0 < 300, "remove toxic {name}: {answer:?}");
        }
    }

    /// Disabled: every connection is closed and new ones are refused, as while the API server
    /// restarts. Enabled again: connections are accepted.
    pub async fn set_enabled(&self, enabled: bool) {
        let path = format!("/proxies/{PROXY}");
        let answer = request(&self.api, "POST", &path, Some(json!({"enabled": enabled})))
            .await
            .expect("update the proxy");
        assert!(answer.0 < 300, "enable={enabled}: {answer:?}");
    }
}

/// One HTTP/1.1 request to toxiproxy's API: (status, body).
async fn request(
    api: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(api).await?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
