//! The operator's HTTP endpoints (DESIGN §4): `/metrics` (OpenMetrics text), `/healthz`
//! (liveness) and `/readyz` (readiness), served by hyper (HTTP/1.1).
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections at a time (the next wait in the kernel's
//! accept queue), a request head must arrive within [`READ_TIMEOUT`], and a connection lives at
//! most [`CONNECTION_TIMEOUT`] (a client that does not read its answer is cut off).
//!
//! - `/healthz` answers 200 as long as the process and its async runtime serve requests.
//! - `/readyz` answers 200 once the startup checks passed (the API server answered and the RBAC
//!   self-check succeeded). It does not depend on leadership: a standby replica waiting for the
//!   lease is ready, otherwise a two-replica rollout would never finish.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;
use tracing::debug;

use super::metrics::{self, Metrics};

/// Connections served at once; probes and a scraper or two need a handful.
pub const MAX_CONNECTIONS: usize = 64;
/// A client that does not finish its request head in this time is dropped.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection lives, reading the request and writing the answer included.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Routes one request (pure apart from reading the state). hyper leaves out the body of an
/// answer to HEAD.
pub fn respond(method: &Method, path: &str, state: &HttpState) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match path {
        "/metrics" => answer(
            StatusCode::OK,
            metrics::CONTENT_TYPE,
            state.metrics.render(),
        ),
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" if state.is_ready() => text(StatusCode::OK, "ok\n"),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the startup checks (API server reachable, RBAC self-check) have not passed yet\n",
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz or /readyz\n",
        ),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    answer(status, "text/plain; charset=utf-8", body.to_owned())
}

fn answer(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
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
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // Full: the next connection waits in the accept queue until one ends.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Usually EMFILE: back off instead of spinning.
                tracing::warn!(%err, "accepting an HTTP connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let response = respond(request.method(), request.uri().path(), &state);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(READ_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => debug!(%peer, %err, "HTTP connection ended with an error"),
                Err(_) => debug!(%peer, "HTTP connection cut off after {CONNECTION_TIMEOUT:?}"),
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    fn state() -> Arc<HttpState> {
        HttpState::with_metrics(Box::leak(Box::new(Metrics::new())))
    }

    #[test]
    fn routes() {
        let state = state();
        let status = |method: Method, path: &str| respond(&method, path, &state).status();
        assert_eq!(status(Method::GET, "/healthz"), 200);
        assert_eq!(status(Method::GET, "/readyz"), 503);
        state.set_ready();
        assert_eq!(status(Method::GET, "/readyz"), 200);
        assert_eq!(status(Method::HEAD, "/readyz"), 200);
        let metrics = respond(&Method::GET, "/metrics", &state);
        assert_eq!(metrics.status(), 200);
        assert_eq!(
            metrics.headers()[header::CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert_eq!(status(Method::GET, "/"), 404);
        assert_eq!(status(Method::POST, "/metrics"), 405);
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
    async fn serves_http_1_over_tcp() {
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
        let response = get(address, "GET /readyz?verbose HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        let lower = response.to_ascii_lowercase();
        assert!(lower.contains("\r\ncontent-length: 3\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\nok\n"), "{response}");

        // What the bench's probe sends: HTTP/1.0, answered and closed.
        let response = get(address, "GET /metrics HTTP/1.0\r\n\r\n").await;
        let (head, body) = response.split_once("\r\n\r\n").expect("head and body");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{head}"
        );
        assert!(body.contains("kandev_leader 0"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");

        let response = get(address, "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.ends_with("\r\n\r\n"),
            "HEAD has no body: {response}"
        );

        let response = get(address, "nonsense\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 400 "), "{response}");
    }

    #[tokio::test]
    async fn a_silent_client_is_dropped_after_the_read_timeout() {
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(serve(listener, state()));
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .expect("write");
        let mut response = Vec::new();
        let read = tokio::time::timeout(
            READ_TIMEOUT + Duration::from_secs(5),
            stream.read_to_end(&mut response),
        )
        .await;
        assert!(matches!(read, Ok(Ok(_))), "closed by the server: {read:?}");
    }
}
