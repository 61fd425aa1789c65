//! The operator's HTTP endpoints (DESIGN §4): `/metrics` (Prometheus text format 0.0.4),
//! `/healthz` (liveness) and `/readyz` (readiness).
//!
//! A deliberately small HTTP/1.1 server on tokio: GET/HEAD of three fixed paths, one request per
//! connection (`Connection: close`), bounded request size and read time. Probes and Prometheus
//! need nothing more, and it keeps a server framework out of the operator.
//!
//! - `/healthz` answers 200 as long as the process and its async runtime serve requests.
//! - `/readyz` answers 200 once the startup checks passed (the API server answered and the RBAC
//!   self-check succeeded). It does not depend on leadership: a standby replica waiting for the
//!   lease is ready, otherwise a two-replica rollout would never finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tracing::debug;

use super::metrics::{self, Metrics};

/// Largest request head we read; probes and scrapers send a few hundred bytes.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// A client that does not finish its request head in this time is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What the endpoints report.
pub struct HttpState {
    ready: AtomicBool,
    metrics: &'static Metrics,
}

impl HttpState {
    /// Not ready yet, serving the process-wide metrics.
    pub fn new() -> Arc<Self> {
        Self::with_metrics(metrics::global())
    }

    pub fn with_metrics(metrics: &'static Metrics) -> Arc<Self> {
        Arc::new(HttpState {
            ready: AtomicBool::new(false),
            metrics,
        })
    }

    /// The startup checks passed: `/readyz` answers 200 from now on.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// One response.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}

/// Routes one request (pure apart from reading the state).
pub fn respond(method: &str, target: &str, state: &HttpState) -> Response {
    if method != "GET" && method != "HEAD" {
        return Response::text(405, "method not allowed\n");
    }
    let path = target.split(['?', '#']).next().unwrap_or_default();
    match path {
        "/metrics" => Response {
            status: 200,
            content_type: metrics::CONTENT_TYPE,
            body: state.metrics.render(),
        },
        "/healthz" | "/livez" => Response::text(200, "ok\n"),
        "/readyz" if state.is_ready() => Response::text(200, "ok\n"),
        "/readyz" => Response::text(
            503,
            "not ready: the startup checks (API server reachable, RBAC self-check) have not passed yet\n",
        ),
        _ => Response::text(404, "not found; try /metrics, /healthz or /readyz\n"),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Binds the endpoints' address (e.g. `0.0.0.0:8080`; port 0 picks a free port).
///
/// With `SO_REUSEPORT`: in a pod (its own network namespace) it changes nothing, and replicas
/// that share one network namespace (the e2e harness plays pods as processes of one host) share
/// the port instead of the second one failing to start.
pub async fn bind(address: &str) -> Result<TcpListener, String> {
    let failed = |e: std::io::Error| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            "; choose another --http-address (port 0 picks a free one)"
        } else {
            ""
        };
        format!("binding the HTTP endpoints to {address}: {e}{hint}")
    };
    let addr = tokio::net::lookup_host(address)
        .await
        .map_err(failed)?
        .next()
        .ok_or_else(|| format!("binding the HTTP endpoints to {address}: no such address"))?;
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(failed)?;
    socket.set_reuseaddr(true).map_err(failed)?;
    socket.set_reuseport(true).map_err(failed)?;
    socket.bind(addr).map_err(failed)?;
    socket.listen(1024).map_err(failed)
}

/// Serves connections until the runtime shuts down.
pub async fn serve(listener: TcpListener, state: Arc<HttpState>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let state = state.clone();
                tokio::spawn(async move {
                    if let Err(err) = handle(stream, &state).await {
                        debug!(%peer, %err, "HTTP connection ended with an error");
                    }
                });
            }
            Err(err) => {
                // Usually EMFILE: back off instead of spinning.
                tracing::warn!(%err, "accepting an HTTP connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn handle(mut stream: TcpStream, state: &HttpState) -> std::io::Result<()> {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(head) => head?,
        Err(_) => return Ok(()),
    };
    let (response, method) = match head {
        Head::Complete(text) => {
            let mut parts = text.lines().next().unwrap_or_default().split_whitespace();
            match (parts.next(), parts.next(), parts.next()) {
                (Some(method), Some(target), Some(version)) if version.starts_with("HTTP/1.") => {
                    (respond(method, target, state), method.to_string())
                }
                _ => (Response::text(400, "bad request\n"), String::new()),
            }
        }
        Head::TooLarge => (
            Response::text(431, "request head too large\n"),
            String::new(),
        ),
        Head::Closed => return Ok(()),
    };
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(response.body.as_bytes());
    }
    stream.write_all(&out).await?;
    stream.shutdown().await
}

#[derive(Debug, PartialEq, Eq)]
enum Head {
    Complete(String),
    TooLarge,
    Closed,
}

/// Reads up to the blank line that ends the request head (a GET has no body to read).
async fn read_head<R: AsyncRead + Unpin>(stream: &mut R) -> std::io::Result<Head> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Head::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(Head::Complete(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Ok(Head::TooLarge);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Arc<HttpState> {
        HttpState::with_metrics(Box::leak(Box::new(Metrics::new())))
    }

    #[test]
    fn routes() {
        let state = state();
        assert_eq!(respond("GET", "/healthz", &state).status, 200);
        assert_eq!(respond("GET", "/readyz", &state).status, 503);
        state.set_ready();
        assert_eq!(respond("GET", "/readyz", &state).status, 200);
        assert_eq!(respond("HEAD", "/readyz?verbose", &state).status, 200);
        let metrics = respond("GET", "/metrics", &state);
        assert_eq!(metrics.status, 200);
        assert_eq!(
            metrics.content_type,
            "text/plain; version=0.0.4; charset=utf-8"
        );
        assert!(metrics.body.contains("# TYPE kandev_build_info gauge"));
        assert_eq!(respond("GET", "/", &state).status, 404);
        assert_eq!(respond("POST", "/metrics", &state).status, 405);
    }

    async fn get(address: std::net::SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .expect("read to close");
        response
    }

    #[tokio::test]
    async fn serves_http_1_1_over_tcp() {
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let state = state();
        tokio::spawn(serve(listener, state.clone()));

        let response = get(
            address,
            "GET /readyz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.36\r\n\r\n",
        )
        .await;
        assert!(
            response.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{response}"
        );
        state.set_ready();
        let response = get(address, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.contains("\r\nContent-Length: 3\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\nok\n"), "{response}");

        let response = get(address, "GET /metrics HTTP/1.0\r\n\r\n").await;
        let (head, body) = response.split_once("\r\n\r\n").expect("head and body");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert!(body.contains("kandev_leader 0"), "{body}");

        let response = get(address, "HEAD /healthz HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.ends_with("\r\n\r\n"),
            "HEAD has no body: {response}"
        );

        let response = get(address, "nonsense\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 400 "), "{response}");
    }

    #[tokio::test]
    async fn request_heads_are_bounded() {
        let complete = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(
            read_head(&mut complete.as_bytes()).await.expect("read"),
            Head::Complete(complete.into())
        );
        assert_eq!(
            read_head(&mut "GET / HTTP/1.1\r\n".as_bytes())
                .await
                .expect("read"),
            Head::Closed
        );
        let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(10_000));
        assert_eq!(
            read_head(&mut huge.as_bytes()).await.expect("read"),
            Head::TooLarge
        );
    }
}
