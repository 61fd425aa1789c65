//! Fault injectors between an operator under test and the API server.
//!
//! - [`FaultProxy`]: a real TCP fault injector, toxiproxy (`toxiproxy-server`, built from Go
//!   modules by e2e/bin.sh), driven through its HTTP API. The operator gets a kubeconfig whose
//!   server is the proxy; TLS passes through untouched (the API server's certificate is for
//!   127.0.0.1, so only the port changes).
//! - [`HttpFaultProxy`]: ours (e2e/apiproxy), which terminates TLS and can answer with an HTTP
//!   status such as 503.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::support::process::{free_port, run};
use super::{
    BUILT_BY_BIN_SH, kubectl, logs_dir, poll_until, read_kubeconfig, spawn_logged, unique,
    write_kubeconfig,
};

/// How long a proxy may take to start, and how often the test looks.
const STARTS_WITHIN: Duration = Duration::from_secs(20);
const EVERY: Duration = Duration::from_millis(100);

/// The proxy operator → API server.
const PROXY: &str = "apiserver";
/// The proxy API server → kubelet (kwok), for exec alone.
const KUBELET_PROXY: &str = "kubelet";

/// A running toxiproxy with one proxy in front of the API server, stopped when dropped.
pub struct FaultProxy {
    _server: tokio::process::Child,
    api: String,
    /// A kubeconfig like $KUBECONFIG whose server is the proxy.
    pub kubeconfig: PathBuf,
}

impl FaultProxy {
    pub async fn start() -> Self {
        let api_port = free_port();
        let dir = logs_dir();
        let server = spawn_logged(
            tokio::process::Command::new("toxiproxy-server").args([
                "-host",
                "127.0.0.1",
                "-port",
                &api_port.to_string(),
            ]),
            &dir.join(format!("{}.log", unique("toxiproxy"))),
            BUILT_BY_BIN_SH,
        );
        let api = format!("127.0.0.1:{api_port}");
        let answers = async || request(&api, "GET", "/version", None).await.is_ok();
        poll_until(STARTS_WITHIN, EVERY, "toxiproxy did not start", answers).await;

        let mut kubeconfig = read_kubeconfig();
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
        write_kubeconfig(&kubeconfig_path, &kubeconfig);
        FaultProxy {
            _server: server,
            api,
            kubeconfig: kubeconfig_path,
        }
    }

    /// Puts a second proxy between the API server and the kubelet of node `node` (kwok), by
    /// pointing the node's kubelet endpoint at it: exec (and logs) go through it, nothing
    /// else. Returns the kubelet's own port, to point the node back at.
    pub async fn intercept_kubelet(&self, client: &kube::Client, node: &str) -> i32 {
        let nodes: kube::Api<Node> = kube::Api::all(client.clone());
        let port = nodes
            .get_status(node)
            .await
            .expect("the node")
            .status
            .and_then(|s| s.daemon_endpoints)
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port)
            .expect("the node's kubelet port");
        let listen = free_port();
        let proxy = json!({"name": KUBELET_PROXY, "listen": format!("127.0.0.1:{listen}"),
            "upstream": format!("127.0.0.1:{port}"), "enabled": true});
        let created = request(&self.api, "POST", "/proxies", Some(proxy))
            .await
            .expect("create the kubelet proxy");
        assert!(created.0 < 300, "create the kubelet proxy: {created:?}");
        set_kubelet_port(&nodes, node, i32::from(listen)).await;
        port
    }

    /// Adds toxic `name` of `kind` on the kubelet proxy (both directions).
    pub async fn add_to_kubelet(&self, name: &str, kind: &str, attributes: Value) {
        self.add_on(KUBELET_PROXY, name, kind, attributes).await;
    }

    /// Removes toxic `name` from the kubelet proxy.
    pub async fn remove_from_kubelet(&self, name: &str) {
        self.remove_on(KUBELET_PROXY, name).await;
    }

    /// Adds toxic `name` of `kind` (toxiproxy's types: latency, timeout, reset_peer, …) on
    /// both directions (`<name>-up`, `<name>-down`).
    pub async fn add(&self, name: &str, kind: &str, attributes: Value) {
        self.add_on(PROXY, name, kind, attributes).await;
    }

    async fn add_on(&self, proxy: &str, name: &str, kind: &str, attributes: Value) {
        for stream in ["upstream", "downstream"] {
            let toxic = json!({
                "name": format!("{name}-{stream}"),
                "type": kind,
                "stream": stream,
                "toxicity": 1.0,
                "attributes": attributes,
            });
            let path = format!("/proxies/{proxy}/toxics");
            let answer = request(&self.api, "POST", &path, Some(toxic))
                .await
                .expect("add a toxic");
            assert!(answer.0 < 300, "add toxic {name}: {answer:?}");
        }
    }

    /// Removes toxic `name` (both directions).
    pub async fn remove(&self, name: &str) {
        self.remove_on(PROXY, name).await;
    }

    async fn remove_on(&self, proxy: &str, name: &str) {
        for stream in ["upstream", "downstream"] {
            let path = format!("/proxies/{proxy}/toxics/{name}-{stream}");
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

async fn set_kubelet_port(nodes: &kube::Api<Node>, node: &str, port: i32) {
    let patch = json!({"status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}});
    nodes
        .patch_status(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("point the node's kubelet endpoint");
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

/// Our HTTP fault proxy (`kandev-apiproxy`, e2e/apiproxy, built by e2e/bin.sh) in front of the
/// API server: it terminates TLS, so it can answer with an HTTP status, which toxiproxy cannot.
/// Stopped when dropped.
pub struct HttpFaultProxy {
    _server: tokio::process::Child,
    control: String,
    /// A kubeconfig like $KUBECONFIG whose server is the proxy (its own CA).
    pub kubeconfig: PathBuf,
}

impl HttpFaultProxy {
    pub async fn start() -> Self {
        let dir = logs_dir().join(unique("apiproxy"));
        std::fs::create_dir_all(&dir).expect("proxy dir");
        // The API server's address, CA and the test's client certificate, as files.
        let field = |path: &str| {
            run(kubectl()
                .args(["config", "view", "--raw", "--minify", "--flatten", "-o"])
                .arg(format!("jsonpath={{{path}}}")))
            .expect_success()
        };
        let decode = |path: &str, file: &str| {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(field(path).trim())
                .unwrap_or_else(|e| panic!("{path} is not base64: {e}"));
            let file = dir.join(file);
            std::fs::write(&file, pem).expect("write a PEM file");
            file
        };
        let upstream = field(".clusters[0].cluster.server");
        let ca = decode(
            ".clusters[0].cluster.certificate-authority-data",
            "upstream-ca.crt",
        );
        let cert = decode(".users[0].user.client-certificate-data", "client.crt");
        let key = decode(".users[0].user.client-key-data", "client.key");
        let mut cmd = tokio::process::Command::new("kandev-apiproxy");
        cmd.arg("--upstream")
            .arg(&upstream)
            .arg("--ca")
            .arg(&ca)
            .arg("--cert")
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .arg("--dir")
            .arg(&dir);
        let server = spawn_logged(&mut cmd, &dir.join("apiproxy.log"), BUILT_BY_BIN_SH);
        let addresses = dir.join("addresses.json");
        let missing = format!(
            "kandev-apiproxy did not start: see {}",
            dir.join("apiproxy.log").display()
        );
        poll_until(STARTS_WITHIN, EVERY, &missing, async || addresses.exists()).await;
        let addresses: Value =
            serde_json::from_slice(&std::fs::read(&addresses).expect("addresses")).expect("JSON");
        let api = addresses["api"].as_str().expect("api address");
        let control = addresses["control"].as_str().expect("control address");

        let mut kubeconfig = read_kubeconfig();
        let ca_pem = std::fs::read(dir.join("ca.crt")).expect("the proxy's CA");
        for cluster in kubeconfig
            .clusters
            .iter_mut()
            .filter_map(|c| c.cluster.as_mut())
        {
            cluster.server = Some(format!("https://{api}"));
            cluster.certificate_authority = None;
            cluster.certificate_authority_data =
                Some(base64::engine::general_purpose::STANDARD.encode(&ca_pem));
        }
        let kubeconfig_path = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig_path, &kubeconfig);
        HttpFaultProxy {
            _server: server,
            control: control.to_string(),
            kubeconfig: kubeconfig_path,
        }
    }

    /// Every new request is answered with `status` for `seconds`, and the open watches end.
    pub async fn fail(&self, status: u16, seconds: u64) {
        let path = format!("/fault?status={status}&seconds={seconds}");
        let answer = request(&self.control, "POST", &path, None)
            .await
            .expect("start the fault");
        assert!(answer.0 < 300, "start the fault: {answer:?}");
    }

    /// How many requests were answered with the fault's status.
    pub async fn refused(&self) -> u64 {
        let answer = request(&self.control, "GET", "/stats", None)
            .await
            .expect("stats");
        let stats: Value = serde_json::from_str(&answer.1).expect("stats as JSON");
        stats["refused"].as_u64().expect("refused")
    }
}
