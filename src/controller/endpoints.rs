//! The operator's HTTP endpoints (DESIGN §4): `/metrics` (OpenMetrics text), `/healthz`
//! (liveness) and `/readyz` (readiness), served by hyper (HTTP/1.1).
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections at a time and [`MAX_PER_PEER`] from one
//! address, a request head must arrive within [`READ_TIMEOUT`], and a connection lives at most
//! [`CONNECTION_TIMEOUT`] (a client that does not read its answer is cut off). A connection that
//! would pass a bound makes room by closing the oldest one (of its peer, or of all) that has not
//! sent a request head yet; only when every connection is busy answering does the next wait in
//! the kernel's accept queue. So idle connections, however many, never keep a probe out
//! ([`admit`], table-tested; `a_thousand_idle_connections_never_keep_the_probes_out`).
//!
//! `/metrics` may be served on its own listener (`--metrics-address`, e.g. 127.0.0.1 only), over
//! TLS (`--metrics-tls`, [`super::metrics_tls`]) and only to authenticated scrapers
//! (`--metrics-auth=kubernetes`, [`super::metrics_access`]); the probes' endpoints never need a
//! token.
//!
//! - `/healthz` answers 200 as long as the process and its async runtime serve requests.
//! - `/readyz` answers 200 once the startup checks passed (the API server answered and the RBAC
//!   self-check succeeded). It does not depend on leadership: a standby replica waiting for the
//!   lease is ready, otherwise a two-replica rollout would never finish.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Notify, oneshot};
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use super::metrics::{self, Metrics};
use super::metrics_access::{self, MetricsAuth, Verdict};
use crate::telemetry::SharedWarnLimiter;

/// Connections served at once; probes and a scraper or two need a handful.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections from one address at once (the kubelet's probes come from its node's address).
pub const MAX_PER_PEER: usize = 8;
/// A client that does not finish its request head in this time is dropped.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a connection lives, reading the request and writing the answer included.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// What the endpoints report.
pub struct HttpState {
    ready: AtomicBool,
    metrics: &'static Metrics,
    auth: MetricsAuth,
    /// The client of the access reviews (set once the API server answered).
    reviewer: OnceLock<metrics_access::Reviewer>,
    /// Rate limit of the warnings about refused or unverifiable scrapes.
    warnings: SharedWarnLimiter,
}

impl HttpState {
    /// Not ready yet, serving the process-wide metrics to anyone.
    pub fn new() -> Arc<Self> {
        Self::with_metrics(metrics::global(), MetricsAuth::Open)
    }

    /// Not ready yet, serving the process-wide metrics as `auth` says.
    pub fn with_auth(auth: MetricsAuth) -> Arc<Self> {
        Self::with_metrics(metrics::global(), auth)
    }

    pub fn with_metrics(metrics: &'static Metrics, auth: MetricsAuth) -> Arc<Self> {
        Arc::new(HttpState {
            ready: AtomicBool::new(false),
            metrics,
            auth,
            reviewer: OnceLock::new(),
            warnings: SharedWarnLimiter::default(),
        })
    }

    /// The startup checks passed: `/readyz` answers 200 from now on.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Who may scrape `/metrics`.
    pub fn auth(&self) -> MetricsAuth {
        self.auth
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The client that makes the access reviews of `--metrics-auth=kubernetes`; until it is
    /// set, a scrape is answered 503.
    pub fn set_reviewer(&self, client: kube::Client) {
        let _ = self.reviewer.set(metrics_access::Reviewer::new(client));
    }
}

/// Which endpoints one listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routes {
    /// `/healthz`, `/livez`, `/readyz`.
    pub health: bool,
    /// `/metrics`.
    pub metrics: bool,
}

impl Routes {
    /// One listener for everything (the default).
    pub const ALL: Routes = Routes {
        health: true,
        metrics: true,
    };
    /// The probes only (`/metrics` has its own listener).
    pub const HEALTH: Routes = Routes {
        health: true,
        metrics: false,
    };
    /// `/metrics` only (`--metrics-address`).
    pub const METRICS: Routes = Routes {
        health: false,
        metrics: true,
    };
}

/// What to do with one request.
#[derive(Debug)]
pub enum Route {
    /// Answer this.
    Answer(Response<Full<Bytes>>),
    /// Serve the metrics once the scraper passed the access check.
    CheckedMetrics,
}

/// Routes one request (pure apart from reading the state). hyper leaves out the body of an
/// answer to HEAD.
pub fn route(method: &Method, path: &str, state: &HttpState, routes: Routes) -> Route {
    if method != Method::GET && method != Method::HEAD {
        return Route::Answer(text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"));
    }
    let answer = match path {
        "/metrics" if routes.metrics && state.auth == MetricsAuth::Kubernetes => {
            return Route::CheckedMetrics;
        }
        "/metrics" if routes.metrics => metrics_answer(state),
        "/metrics" => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics is served on its own address (--metrics-address)\n",
        ),
        "/healthz" | "/livez" if routes.health => text(StatusCode::OK, "ok\n"),
        "/readyz" if routes.health && state.is_ready() => text(StatusCode::OK, "ok\n"),
        "/readyz" if routes.health => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the startup checks (API server reachable, RBAC self-check) have not passed yet\n",
        ),
        _ if routes.health => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz or /readyz\n",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found; try /metrics\n"),
    };
    Route::Answer(answer)
}

/// Answers one request, with the access check of a scrape when `--metrics-auth=kubernetes`.
pub async fn handle(
    method: &Method,
    path: &str,
    headers: &http::HeaderMap,
    state: &HttpState,
    routes: Routes,
) -> Response<Full<Bytes>> {
    match route(method, path, state, routes) {
        Route::Answer(answer) => answer,
        Route::CheckedMetrics => {
            let verdict = match state.reviewer.get() {
                Some(reviewer) => reviewer.check(headers).await,
                None => Verdict::Unavailable(
                    "the operator has not connected to the API server yet".to_owned(),
                ),
            };
            match verdict {
                Verdict::Allowed => metrics_answer(state),
                refused => {
                    state.warnings.warn(|suppressed| match &refused {
                        Verdict::Unavailable(why) => {
                            tracing::warn!(%why, suppressed, "cannot check a scrape of /metrics")
                        }
                        _ => tracing::info!(verdict = ?refused, suppressed, "refused a scrape of /metrics"),
                    });
                    denied(&refused)
                }
            }
        }
    }
}

fn metrics_answer(state: &HttpState) -> Response<Full<Bytes>> {
    answer(
        StatusCode::OK,
        metrics::CONTENT_TYPE,
        state.metrics.render(),
    )
}

/// 401 (with the `WWW-Authenticate` challenge), 403 or 503, saying what is missing.
fn denied(verdict: &Verdict) -> Response<Full<Bytes>> {
    let (status, body) = match verdict {
        Verdict::Allowed => (StatusCode::OK, String::new()),
        Verdict::Unauthenticated(why) => (
            StatusCode::UNAUTHORIZED,
            format!(
                "unauthorized: {why}. /metrics needs a bearer token (--metrics-auth=kubernetes)\n"
            ),
        ),
        Verdict::Forbidden { user, reason } => {
            let reason = if reason.is_empty() {
                String::new()
            } else {
                format!(" ({reason})")
            };
            (
                StatusCode::FORBIDDEN,
                format!(
                    "forbidden: {user} may not get /metrics{reason}; grant it get on the \
                     nonResourceURL /metrics (the chart's ClusterRole <release>-metrics-reader)\n"
                ),
            )
        }
        Verdict::Unavailable(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot check the scraper's token: {why}\n"),
        ),
    };
    let mut response = answer(status, "text/plain; charset=utf-8", body);
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"kandev-operator\""),
        );
    }
    response
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
pub async fn bind(address: &str) -> Result<TcpListener, BindError> {
    let failed = |source: std::io::Error| BindError::Io {
        address: address.to_string(),
        hint: if source.kind() == std::io::ErrorKind::AddrInUse {
            "; choose another --http-address (port 0 picks a free one)"
        } else {
            ""
        },
        source,
    };
    let addr = tokio::net::lookup_host(address)
        .await
        .map_err(failed)?
        .next()
        .ok_or_else(|| BindError::NoSuchAddress(address.to_string()))?;
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

/// Why the endpoints' address could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("binding the HTTP endpoints to {address}: {source}{hint}")]
    Io {
        address: String,
        #[source]
        source: std::io::Error,
        /// What to do about it, when known.
        hint: &'static str,
    },
    #[error("binding the HTTP endpoints to {0}: no such address")]
    NoSuchAddress(String),
}

/// Bounds of a listener: [`MAX_CONNECTIONS`], [`MAX_PER_PEER`], [`READ_TIMEOUT`],
/// [`CONNECTION_TIMEOUT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub max_connections: usize,
    pub max_per_peer: usize,
    pub read_timeout: Duration,
    pub connection_timeout: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            max_per_peer: MAX_PER_PEER,
            read_timeout: READ_TIMEOUT,
            connection_timeout: CONNECTION_TIMEOUT,
        }
    }
}

/// An open connection, as [`admit`] sees it: its number (in the order of arrival), its peer's
/// address, and whether it has sent no request head yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Open {
    pub id: u64,
    pub peer: IpAddr,
    pub idle: bool,
}

/// What to do with a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Accept,
    /// Accept it once connection `id` (the oldest idle one that stands in its way) is closed.
    Evict(u64),
    /// Close it: its peer holds its share, all busy answering.
    Refuse,
    /// Every connection is busy answering: wait until one ends.
    Wait,
}

/// Whether a new connection from `peer` is served, given the `open` ones (in order of arrival):
/// within its peer's share and the listener's bound it is; past either, it takes the place of
/// the oldest connection there that has not sent a request head.
pub fn admit(open: &[Open], peer: IpAddr, bounds: Bounds) -> Admit {
    let oldest_idle = |of_peer: bool| {
        open.iter()
            .filter(|o| o.idle && (!of_peer || o.peer == peer))
            .map(|o| o.id)
            .min()
    };
    if open.iter().filter(|o| o.peer == peer).count() >= bounds.max_per_peer {
        return oldest_idle(true).map_or(Admit::Refuse, Admit::Evict);
    }
    if open.len() >= bounds.max_connections {
        return oldest_idle(false).map_or(Admit::Wait, Admit::Evict);
    }
    Admit::Accept
}

/// The open connections of a listener, each with the means to close it.
#[derive(Default)]
struct Connections {
    open: Mutex<BTreeMap<u64, Entry>>,
    /// Told when a connection ends.
    ended: Notify,
}

struct Entry {
    peer: IpAddr,
    idle: Arc<AtomicBool>,
    close: Option<oneshot::Sender<()>>,
}

impl Connections {
    /// The open connections, without those already told to close (they are leaving).
    fn snapshot(&self) -> Vec<Open> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.close.is_some())
            .map(|(id, e)| Open {
                id: *id,
                peer: e.peer,
                idle: e.idle.load(Ordering::Relaxed),
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Closes connection `id` (it leaves the table when its task ends).
    fn close(&self, id: u64) {
        if let Some(close) = self.lock().get_mut(&id).and_then(|e| e.close.take()) {
            let _ = close.send(());
        }
    }

    /// Counts connection `id` of `peer` as open, idle; returns its idle flag and its close signal.
    fn add(&self, id: u64, peer: IpAddr) -> (Arc<AtomicBool>, oneshot::Receiver<()>) {
        let idle = Arc::new(AtomicBool::new(true));
        let (close, closed) = oneshot::channel();
        self.lock().insert(
            id,
            Entry {
                peer,
                idle: idle.clone(),
                close: Some(close),
            },
        );
        (idle, closed)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
        self.ended.notify_one();
    }
}

/// Removes its connection from the table when the connection's task ends, however it ends.
struct Leaving {
    connections: Arc<Connections>,
    id: u64,
}

impl Drop for Leaving {
    fn drop(&mut self) {
        self.connections.remove(self.id);
    }
}

/// Serves `routes` until the runtime shuts down; over TLS with `tls`.
pub async fn serve(
    listener: TcpListener,
    state: Arc<HttpState>,
    routes: Routes,
    tls: Option<TlsAcceptor>,
) {
    serve_bounded(listener, state, routes, Bounds::default(), tls).await
}

async fn serve_bounded(
    listener: TcpListener,
    state: Arc<HttpState>,
    routes: Routes,
    bounds: Bounds,
    tls: Option<TlsAcceptor>,
) {
    let connections = Arc::new(Connections::default());
    let mut next_id: u64 = 0;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Usually EMFILE: back off instead of spinning.
                tracing::warn!(%err, "accepting an HTTP connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Busy everywhere: this one waits (and the next ones in the kernel's queue) until a
        // connection ends.
        let admitted = loop {
            let ended = connections.ended.notified();
            match admit(&connections.snapshot(), peer.ip(), bounds) {
                Admit::Wait => ended.await,
                other => break other,
            }
        };
        match admitted {
            Admit::Refuse => {
                debug!(%peer, "HTTP connection refused: its address holds its share, all busy");
                continue;
            }
            Admit::Evict(id) => {
                debug!(%peer, evicted = id, "closing the oldest idle HTTP connection to make room");
                connections.close(id);
            }
            Admit::Accept | Admit::Wait => {}
        }
        next_id += 1;
        let id = next_id;
        let (idle, closed) = connections.add(id, peer.ip());
        let leaving = Leaving {
            connections: connections.clone(),
            id,
        };
        let (state, tls) = (state.clone(), tls.clone());
        tokio::spawn(async move {
            let _leaving = leaving;
            // A TLS handshake must end within the request head's time, and counts against the
            // connection's life like the rest.
            let deadline = tokio::time::Instant::now() + bounds.connection_timeout;
            let served = async {
                match tls {
                    None => {
                        serve_connection(stream, peer, state, routes, bounds, deadline, idle).await
                    }
                    Some(tls) => {
                        match tokio::time::timeout(bounds.read_timeout, tls.accept(stream)).await {
                            Ok(Ok(stream)) => {
                                serve_connection(
                                    stream, peer, state, routes, bounds, deadline, idle,
                                )
                                .await
                            }
                            Ok(Err(err)) => debug!(%peer, %err, "TLS handshake failed"),
                            Err(_) => debug!(%peer, "TLS handshake cut off"),
                        }
                    }
                }
            };
            tokio::select! {
                () = served => {}
                _ = closed => debug!(%peer, "idle HTTP connection closed to make room"),
            }
        });
    }
}

/// One HTTP/1.1 connection on `stream` (plain TCP or TLS), cut off at `deadline`; `idle` is
/// cleared when its request head has arrived.
async fn serve_connection<S>(
    stream: S,
    peer: std::net::SocketAddr,
    state: Arc<HttpState>,
    routes: Routes,
    bounds: Bounds,
    deadline: tokio::time::Instant,
    idle: Arc<AtomicBool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let state = state.clone();
        // Its head has arrived: from now on it is busy answering, never closed to make room.
        idle.store(false, Ordering::Relaxed);
        async move {
            let response = handle(
                request.method(),
                request.uri().path(),
                request.headers(),
                &state,
                routes,
            )
            .await;
            Ok::<_, Infallible>(response)
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.read_timeout)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout_at(deadline, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => debug!(%peer, %err, "HTTP connection ended with an error"),
        Err(_) => debug!(
            %peer,
            "HTTP connection cut off after {:?}",
            bounds.connection_timeout
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    fn state() -> Arc<HttpState> {
        HttpState::with_metrics(Box::leak(Box::new(Metrics::new())), MetricsAuth::Open)
    }

    fn status(route: Route) -> Option<StatusCode> {
        match route {
            Route::Answer(answer) => Some(answer.status()),
            Route::CheckedMetrics => None,
        }
    }

    #[test]
    fn routes() {
        let state = state();
        let status = |method: Method, path: &str| status(route(&method, path, &state, Routes::ALL));
        assert_eq!(status(Method::GET, "/healthz"), Some(StatusCode::OK));
        assert_eq!(
            status(Method::GET, "/readyz"),
            Some(StatusCode::SERVICE_UNAVAILABLE)
        );
        state.set_ready();
        assert_eq!(status(Method::GET, "/readyz"), Some(StatusCode::OK));
        assert_eq!(status(Method::HEAD, "/readyz"), Some(StatusCode::OK));
        let Route::Answer(metrics) = route(&Method::GET, "/metrics", &state, Routes::ALL) else {
            panic!("open metrics need no check");
        };
        assert_eq!(metrics.status(), 200);
        assert_eq!(
            metrics.headers()[header::CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert_eq!(status(Method::GET, "/"), Some(StatusCode::NOT_FOUND));
        assert_eq!(
            status(Method::POST, "/metrics"),
            Some(StatusCode::METHOD_NOT_ALLOWED)
        );
    }

    #[test]
    fn each_listener_serves_its_routes_and_only_metrics_are_checked() {
        let open = state();
        open.set_ready();
        let checked =
            HttpState::with_metrics(Box::leak(Box::new(Metrics::new())), MetricsAuth::Kubernetes);
        checked.set_ready();
        let (ok, not_found, check) = (Some(StatusCode::OK), Some(StatusCode::NOT_FOUND), None);
        // (state, routes, path, expected status; None: the scraper's token is checked first)
        #[rustfmt::skip]
        let rows = [
            (&open, Routes::HEALTH, "/healthz", ok),
            (&open, Routes::HEALTH, "/readyz", ok),
            (&open, Routes::HEALTH, "/metrics", not_found),
            (&open, Routes::METRICS, "/metrics", ok),
            (&open, Routes::METRICS, "/healthz", not_found),
            (&open, Routes::METRICS, "/readyz", not_found),
            (&checked, Routes::ALL, "/metrics", check),
            (&checked, Routes::METRICS, "/metrics", check),
            (&checked, Routes::ALL, "/healthz", ok),
            (&checked, Routes::ALL, "/readyz", ok),
            (&checked, Routes::HEALTH, "/metrics", not_found),
        ];
        for (state, routes, path, expected) in rows {
            assert_eq!(
                status(route(&Method::GET, path, state, routes)),
                expected,
                "{routes:?} {path}"
            );
        }
    }

    #[tokio::test]
    async fn a_checked_scrape_without_the_api_server_is_unavailable_not_served() {
        let checked =
            HttpState::with_metrics(Box::leak(Box::new(Metrics::new())), MetricsAuth::Kubernetes);
        let mut headers = http::HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            header::HeaderValue::from_static("Bearer t"),
        );
        let answer = handle(&Method::GET, "/metrics", &headers, &checked, Routes::ALL).await;
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn refusals_say_what_is_missing() {
        let unauthenticated = denied(&Verdict::Unauthenticated(
            "no Authorization header; send a bearer token".into(),
        ));
        assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            unauthenticated.headers()[header::WWW_AUTHENTICATE],
            "Bearer realm=\"kandev-operator\""
        );
        let forbidden = denied(&Verdict::Forbidden {
            user: "system:serviceaccount:mon:other".into(),
            reason: String::new(),
        });
        assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
        assert!(forbidden.headers().get(header::WWW_AUTHENTICATE).is_none());
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
        tokio::spawn(serve(listener, state.clone(), Routes::ALL, None));

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

    /// `--metrics-tls`: a client that trusts the listener's certificate gets /metrics over TLS;
    /// a plain HTTP request on that port gets no HTTP answer.
    #[tokio::test]
    async fn metrics_over_tls() {
        use super::super::metrics_tls::{CertificateSource, acceptor};
        use tokio_rustls::rustls;
        let dir = tempfile::tempdir().expect("tempdir");
        let made =
            rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, made.cert.pem()).expect("cert");
        std::fs::write(&key, made.signing_key.serialize_pem()).expect("key");
        let tls = acceptor(&CertificateSource::Files { cert, key }).expect("acceptor");
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("addr");
        tokio::spawn(serve(listener, state(), Routes::METRICS, Some(tls)));

        let mut roots = rustls::RootCertStore::empty();
        roots.add(made.cert.der().clone()).expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(address).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut stream = connector.connect(name, tcp).await.expect("TLS handshake");
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response).await;
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.ends_with("# EOF\n"), "{response}");

        let mut plain = TcpStream::connect(address).await.expect("connect");
        plain
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut answer = Vec::new();
        let _ = plain.read_to_end(&mut answer).await;
        assert!(
            !String::from_utf8_lossy(&answer).contains("HTTP/1.1"),
            "plain HTTP answered: {answer:?}"
        );
    }

    #[tokio::test]
    async fn a_silent_client_is_dropped_after_the_read_timeout() {
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(serve(listener, state(), Routes::ALL, None));
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

    /// Reads whatever the server answers until it closes; `None` if nothing came in `wait`.
    async fn answered_within(stream: &mut TcpStream, wait: Duration) -> Option<String> {
        let mut response = Vec::new();
        match tokio::time::timeout(wait, stream.read_to_end(&mut response)).await {
            Ok(read) => {
                read.expect("read");
                Some(String::from_utf8_lossy(&response).into_owned())
            }
            Err(_) => None,
        }
    }

    #[test]
    fn a_connection_past_a_bound_takes_the_place_of_the_oldest_idle_one() {
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let bounds = Bounds {
            max_connections: 3,
            max_per_peer: 2,
            ..Bounds::default()
        };
        let open = |list: &[(u64, IpAddr, bool)]| -> Vec<Open> {
            list.iter()
                .map(|&(id, peer, idle)| Open { id, peer, idle })
                .collect()
        };
        #[rustfmt::skip]
        let rows: Vec<(&str, Vec<Open>, IpAddr, Admit)> = vec![
            ("room", open(&[]), a, Admit::Accept),
            ("room for its peer and all", open(&[(1, a, true), (2, b, true)]), a, Admit::Accept),
            ("its peer's share is full: its oldest idle one goes",
                open(&[(1, b, true), (2, a, true), (3, a, true)]), a, Admit::Evict(2)),
            ("its peer's share is full of busy ones: refused",
                open(&[(1, b, true), (2, a, false), (3, a, false)]), a, Admit::Refuse),
            ("its peer's busy and idle ones: the idle one goes",
                open(&[(2, a, false), (3, a, true)]), a, Admit::Evict(3)),
            ("the listener is full: the oldest idle of any peer goes",
                open(&[(1, a, false), (2, b, true), (3, b, true)]), a, Admit::Evict(2)),
            ("the listener is full of busy ones: wait",
                open(&[(1, a, false), (2, b, false), (3, b, false)]), a, Admit::Wait),
        ];
        for (what, open, peer, expected) in rows {
            assert_eq!(admit(&open, peer, bounds), expected, "{what}");
        }
    }

    #[tokio::test]
    async fn connections_beyond_the_bound_close_the_oldest_idle_one() {
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let bounds = Bounds {
            max_connections: 1,
            ..Bounds::default()
        };
        tokio::spawn(serve_bounded(listener, state(), Routes::ALL, bounds, None));
        // The one slot is held by a client that has not finished its request head.
        let mut holder = TcpStream::connect(address).await.expect("connect");
        holder
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .expect("write");
        // (Let the server take it in before the next one arrives.)
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut next = TcpStream::connect(address).await.expect("connect");
        next.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let served = answered_within(&mut next, READ_TIMEOUT)
            .await
            .expect("answered");
        assert!(served.starts_with("HTTP/1.1 200 OK\r\n"), "{served}");
        let holder = answered_within(&mut holder, READ_TIMEOUT).await;
        assert_eq!(holder.as_deref(), Some(""), "closed without an answer");
    }

    /// Issue 40, part 4: another process holds 1,000 connections open without a word, from
    /// another address (127.0.0.2: another pod), reopening every one the server closes; every
    /// probe is still answered within the liveness probe's timeout (2 s in the chart). (With the
    /// old accept loop, 64 idle connections held every slot and the first probe went
    /// unanswered.)
    #[tokio::test]
    async fn a_thousand_idle_connections_never_keep_the_probes_out() {
        const IDLE: usize = 1000;
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(serve(listener, state(), Routes::ALL, None));
        // Connects IDLE sockets and holds them (reconnecting any the server closes), printing
        // "held" once all were opened.
        let script = format!(
            r#"
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
held = []
for _ in range({IDLE}):
    s = socket.socket(); s.bind(("127.0.0.2", 0)); s.connect(("127.0.0.1", {port})); held.append(s)
print("held", flush=True)
while True:
    for i, s in enumerate(held):
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                s.close(); n = socket.socket(); n.bind(("127.0.0.2", 0)); n.connect(("127.0.0.1", {port})); held[i] = n
        except BlockingIOError:
            pass
    time.sleep(0.05)
"#,
            port = address.port()
        );
        let mut holder = tokio::process::Command::new("python3")
            .args(["-c", &script])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 holds the connections");
        let mut out = tokio::io::BufReader::new(holder.stdout.take().expect("stdout"));
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
            .await
            .expect("read");
        assert_eq!(line.trim(), "held");
        for probe in 0..20 {
            let started = std::time::Instant::now();
            let mut stream = TcpStream::connect(address).await.expect("connect");
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .expect("write");
            let answer = answered_within(&mut stream, Duration::from_secs(2)).await;
            assert!(
                answer
                    .as_deref()
                    .is_some_and(|a| a.starts_with("HTTP/1.1 200 OK\r\n")),
                "probe {probe} not answered within 2 s ({:?}): {answer:?}",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        holder.kill().await.expect("kill");
    }

    #[tokio::test]
    async fn a_connection_is_cut_off_at_its_lifetime_whatever_it_does() {
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        // The header timeout is out of reach here: only the connection's lifetime can end it.
        let bounds = Bounds {
            read_timeout: Duration::from_secs(3600),
            connection_timeout: Duration::from_secs(1),
            ..Bounds::default()
        };
        tokio::spawn(serve_bounded(listener, state(), Routes::ALL, bounds, None));
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .await
            .expect("write");
        let closed = answered_within(&mut stream, Duration::from_secs(30)).await;
        assert_eq!(closed.as_deref(), Some(""), "closed without an answer");
    }

    #[tokio::test]
    async fn a_listener_on_127_0_0_1_is_not_reachable_on_another_address() {
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        tokio::spawn(serve(listener, state(), Routes::METRICS, None));
        // 127.0.0.2 is this host too (all of 127/8 is loopback), but not the bound address,
        // as the pod IP is not for a listener on 127.0.0.1.
        let other = TcpStream::connect(("127.0.0.2", port)).await;
        assert!(
            other
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
            "{other:?}"
        );
        let response = get(
            ([127, 0, 0, 1], port).into(),
            "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    }
}
