//! A real OTLP receiver: Jaeger v1 all-in-one (`jaeger-all-in-one`, built from Go modules by
//! e2e/bin.sh), every port on loopback and free, spans in memory, read back through its query
//! HTTP API (`/api/traces`). Stopped when dropped.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::support::process::free_port;
use super::{BUILT_BY_BIN_SH, logs_dir, poll_until, spawn_logged, unique};

pub struct Jaeger {
    _server: tokio::process::Child,
    /// OTLP over HTTP: the value of `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp_endpoint: String,
    query: String,
}

fn free_address() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// One span of a trace, as the query API answers it.
#[derive(Clone, Debug)]
pub struct Span {
    pub span_id: String,
    pub parent: Option<String>,
    pub name: String,
    pub service: String,
}

impl Jaeger {
    pub async fn start() -> Self {
        let otlp = free_address();
        let query = free_address();
        let mut cmd = tokio::process::Command::new("jaeger-all-in-one");
        for (flag, address) in [
            ("--collector.otlp.http.host-port", otlp.clone()),
            ("--query.http-server.host-port", query.clone()),
            ("--collector.otlp.grpc.host-port", free_address()),
            ("--collector.grpc-server.host-port", free_address()),
            ("--collector.http-server.host-port", free_address()),
            ("--query.grpc-server.host-port", free_address()),
            ("--admin.http.host-port", free_address()),
        ] {
            cmd.arg(flag).arg(address);
        }
        // Jaeger does not trace itself into anyone's receiver.
        cmd.env("OTEL_TRACES_SAMPLER", "always_off")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        let log = logs_dir().join(format!("{}.log", unique("jaeger")));
        let server = spawn_logged(&mut cmd, &log, BUILT_BY_BIN_SH);
        let jaeger = Jaeger {
            _server: server,
            otlp_endpoint: format!("http://{otlp}"),
            query,
        };
        let answers = async || jaeger.get("/api/services").await.is_ok();
        let (within, every) = (Duration::from_secs(30), Duration::from_millis(200));
        poll_until(within, every, "jaeger did not start", answers).await;
        jaeger
    }

    /// The traces with a span of `operation` by `service`: each a list of spans.
    pub async fn traces(&self, service: &str, operation: &str) -> Vec<Vec<Span>> {
        let path =
            format!("/api/traces?service={service}&operation={operation}&limit=100&lookback=1h");
        let Ok(body) = self.get(&path).await else {
            return Vec::new();
        };
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let mut traces = Vec::new();
        for trace in answer["data"].as_array().into_iter().flatten() {
            let processes = &trace["processes"];
            let spans = trace["spans"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|span| Span {
                    span_id: span["spanID"].as_str().unwrap_or_default().to_string(),
                    parent: span["references"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|r| r["refType"] == "CHILD_OF")
                        .and_then(|r| r["spanID"].as_str())
                        .map(str::to_string),
                    name: span["operationName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    service: span["processID"]
                        .as_str()
                        .and_then(|p| processes[p]["serviceName"].as_str())
                        .unwrap_or_default()
                        .to_string(),
                })
                .collect();
            traces.push(spans);
        }
        traces
    }

    /// A GET on the query API (HTTP/1.0: the answer is not chunked and ends with the
    /// connection); the body of a 200 answer.
    async fn get(&self, path: &str) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(&self.query).await?;
        let head = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.query);
        stream.write_all(head.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        match answer.split_once("\r\n\r\n") {
            Some((head, body))
                if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") =>
            {
                Ok(body.to_string())
            }
            _ => Err(std::io::Error::other(format!("GET {path}: {answer}"))),
        }
    }
}
