//! Real git servers on loopback for the repository tests, each started by a test and stopped
//! (killed and reaped) when dropped: `git daemon` (git://, no authentication), and
//! `git http-backend` behind a small HTTPS server of ours that requires basic auth, so that
//! credentials really travel from a Secret to git.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::poll_until;
use super::support::process::{free_port, run};

/// `git <args>` in `dir` (commits by a fixed test identity); panics on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    run(Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=e2e",
            "-c",
            "user.email=e2e@example.invalid",
        ])
        .args(args))
    .expect_success()
    .trim()
    .to_string()
}

/// A directory of bare repositories: `<root>/<name>.git`, each with `main` (the default branch)
/// and `develop`, one commit each.
pub struct Repositories {
    pub root: tempfile::TempDir,
}

/// The commits of a repository made by [`Repositories::create`].
pub struct Upstream {
    pub main: String,
    pub develop: String,
}

impl Repositories {
    pub fn new() -> Self {
        Self {
            root: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// Creates `<root>/<name>.git`.
    pub fn create(&self, name: &str) -> Upstream {
        let seed = self.root.path().join(format!("{name}.seed"));
        std::fs::create_dir_all(&seed).expect("mkdir");
        git(&seed, &["init", "-q", "-b", "main"]);
        std::fs::write(seed.join("README.md"), format!("# {name}\n")).expect("write");
        git(&seed, &["add", "."]);
        git(&seed, &["commit", "-q", "-m", "main"]);
        let main = git(&seed, &["rev-parse", "HEAD"]);
        git(&seed, &["checkout", "-q", "-b", "develop"]);
        std::fs::write(seed.join("DEVELOP.md"), "develop\n").expect("write");
        git(&seed, &["add", "."]);
        git(&seed, &["commit", "-q", "-m", "develop"]);
        let develop = git(&seed, &["rev-parse", "HEAD"]);
        git(&seed, &["checkout", "-q", "main"]);
        git(
            self.root.path(),
            &[
                "clone",
                "-q",
                "--bare",
                &format!("{name}.seed"),
                &format!("{name}.git"),
            ],
        );
        Upstream { main, develop }
    }

    pub fn path(&self) -> &Path {
        self.root.path()
    }
}

/// Waits until something accepts connections on `addr`.
async fn wait_listening(addr: SocketAddr) {
    let listens = async || tokio::net::TcpStream::connect(addr).await.is_ok();
    let missing = format!("{addr} does not listen");
    poll_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        &missing,
        listens,
    )
    .await;
}

/// `git daemon` serving every repository of a directory on `git://127.0.0.1:<port>/` (the
/// `git-daemon` program, so that dropping this kills the daemon itself).
pub struct GitDaemon {
    child: std::process::Child,
    pub port: u16,
}

impl GitDaemon {
    pub async fn start(root: &Path) -> Self {
        let port = free_port();
        // git-daemon itself, not `git daemon`: the `git` wrapper runs it as a child process, so
        // killing the wrapper would leave the daemon running.
        let exec_path = git(root, &["--exec-path"]);
        let child = Command::new(Path::new(&exec_path).join("git-daemon"))
            .arg("--reuseaddr")
            .arg("--export-all")
            .arg("--listen=127.0.0.1")
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", root.display()))
            .arg(root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("git daemon starts");
        let daemon = Self { child, port };
        wait_listening(SocketAddr::from(([127, 0, 0, 1], port))).await;
        daemon
    }

    pub fn url(&self, repository: &str) -> String {
        format!("git://127.0.0.1:{}/{repository}.git", self.port)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `git http-backend` (CGI) behind an HTTPS server on loopback that requires basic auth with
/// one user name and password. Its certificate is self-signed: [`HttpsGit::ca_pem`] trusts it.
pub struct HttpsGit {
    pub port: u16,
    /// The address it listens on (and its certificate names).
    pub ip: std::net::IpAddr,
    /// The server's certificate, PEM (its own CA).
    pub ca_pem: String,
    task: tokio::task::JoinHandle<()>,
    _certs: tempfile::TempDir,
}

impl HttpsGit {
    pub async fn start(root: &Path, user: &str, password: &str) -> Self {
        Self::start_on(root, user, password, [127, 0, 0, 1].into()).await
    }

    /// [`HttpsGit::start`] on `ip` (e.g. the node's address, which pods of a real node reach).
    pub async fn start_on(root: &Path, user: &str, password: &str, ip: std::net::IpAddr) -> Self {
        let certs = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
        run(Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args([
                "-subj".to_string(),
                format!("/CN={ip}"),
                "-addext".to_string(),
                format!("subjectAltName=IP:{ip}"),
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert))
        .expect_success();
        let ca_pem = std::fs::read_to_string(&cert).expect("cert");
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
            .expect("cert pem")
            .collect::<Result<_, _>>()
            .expect("certs");
        let key = PrivateKeyDer::from_pem_file(&key).expect("key pem");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind((ip, 0)).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );
        let root = root.to_path_buf();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, peer)) = listener.accept().await else {
                    return;
                };
                let (acceptor, root, expected) = (acceptor.clone(), root.clone(), expected.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        let _ = serve_one(tls, &root, &expected, peer).await;
                    }
                });
            }
        });
        Self {
            port,
            ip,
            ca_pem,
            task,
            _certs: certs,
        }
    }

    pub fn url(&self, repository: &str) -> String {
        format!("https://{}:{}/{repository}.git", self.ip, self.port)
    }
}

impl Drop for HttpsGit {
    fn drop(&mut self) {
        // The accept loop and its connections end; their CGI children are killed on drop.
        self.task.abort();
    }
}

/// One request on one connection (`Connection: close`): 401 without the right credentials,
/// else the answer of `git http-backend`.
async fn serve_one<S>(
    stream: S,
    root: &Path,
    expected: &str,
    peer: SocketAddr,
) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).await?;
    let mut parts = request_line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("GET").to_string(),
        parts.next().unwrap_or("/").to_string(),
    );
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            break;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(len) = header("content-length").and_then(|l| l.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body).await?;
    } else if header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).await?;
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).await?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    let mut stream = reader.into_inner();
    if header("authorization").as_deref() != Some(expected) {
        stream
            .write_all(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await?;
        return stream.shutdown().await;
    }
    let (path, query) = target.split_once('?').unwrap_or((target.as_str(), ""));
    let mut cgi = tokio::process::Command::new("git");
    cgi.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("REMOTE_USER", "e2e")
        .env("REMOTE_ADDR", peer.ip().to_string())
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("CONTENT_TYPE", header("content-type").unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(encoding) = header("content-encoding") {
        cgi.env("HTTP_CONTENT_ENCODING", encoding);
    }
    if let Some(protocol) = header("git-protocol") {
        cgi.env("GIT_PROTOCOL", protocol);
    }
    let mut child = cgi.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&body).await?;
    }
    let output = child.wait_with_output().await?;
    let out = output.stdout;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            out.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        })
        .unwrap_or((0, 0));
    let head = String::from_utf8_lossy(&out[..split.0]).to_string();
    let payload = &out[split.1..];
    let mut status = "200 OK".to_string();
    let mut response = String::new();
    for line in head.lines() {
        match line.split_once(':') {
            Some((k, v)) if k.eq_ignore_ascii_case("status") => status = v.trim().to_string(),
            Some(_) => {
                response.push_str(line.trim_end());
                response.push_str("\r\n");
            }
            None => {}
        }
    }
    let head = format!(
        "HTTP/1.1 {status}\r\n{response}Content-Length: {}\r\nConnection: close\r\n\r\n",
        payload.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(payload).await?;
    stream.shutdown().await
}

/// Where the programs that [`plant_hostile_git_config`] names would write what they saw, below
/// the workspace.
pub const LEAK_DIR: &str = ".kandev/leak";

/// A shell script, run as the agent in its pod (the workspace as its working directory), that
/// writes the git configuration an agent could write to steal the repository's credentials on
/// the next start: into its HOME and into the clone's `.git/config`, naming programs (fsmonitor,
/// hooks, a credential helper, filters) that write their whole environment below [`LEAK_DIR`],
/// tracing the credential variables with trace2, and rewriting `url` to a dead address. Prints
/// `planted`; refuses (and writes nothing) when HOME is not on the workspace, so that a harness
/// whose exec does not carry the pod's environment never gets the host's git configuration
/// rewritten.
pub fn plant_hostile_git_config(url: &str) -> String {
    format!(
        r#"set -e
mkdir -p "$HOME"
case "$(cd "$HOME" && pwd -P)" in "$(pwd -P)"/*) ;; *) echo "HOME=$HOME is not on the workspace $PWD"; exit 1;; esac
L="$PWD/{LEAK_DIR}"; H="$PWD/.kandev/hooks"
mkdir -p "$L" "$H"
for h in reference-transaction post-checkout post-merge post-index-change; do
  printf '#!/bin/sh\nenv >> %s/hook-%s\n' "$L" "$h" > "$H/$h"; chmod +x "$H/$h"
done
cat > "$HOME/.gitconfig" <<EOF
[core]
	fsmonitor = "env >> $L/fsmonitor; true"
	hooksPath = $H
[trace2]
	eventTarget = $L/trace2-event
	normalTarget = $L/trace2-normal
	envVars = KANDEV_GIT_PASSWORD,KANDEV_GIT_USERNAME
[credential]
	helper = "!env >> $L/credential-helper; true"
[url "https://127.0.0.1:9/"]
	insteadOf = {url}
[filter "leak"]
	smudge = "env >> $L/smudge; cat"
EOF
if [ -d .git ]; then cat "$HOME/.gitconfig" >> .git/config; echo '* filter=leak' > .git/info/attributes; fi
echo planted"#
    )
}

/// A shell script, run in the pod, that lists every file of the workspace holding `secret`
/// (what a planted program or trace2 wrote included); prints `clean` when there is none.
///
/// That a planted program ran at all is no finding here: the agent's own git (a real agent runs
/// git in its workspace) reads the configuration the agent wrote, without the credentials. That
/// the checkout runs none of them is the CLI tier's test
/// (`checkout_never_acts_on_git_configuration_the_agent_wrote`), where no agent runs.
pub fn leak_check(secret: &str) -> String {
    format!(
        r#"held=$(grep -rlF -e '{secret}' "$PWD" 2>/dev/null); if [ -z "$held" ]; then echo clean; else echo "held: $held"; fi"#
    )
}
