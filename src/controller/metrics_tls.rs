//! TLS for `/metrics` (`--metrics-tls`): rustls, with the certificate and key of PEM files (a
//! `kubernetes.io/tls` Secret mounted by the chart, e.g. one that cert-manager keeps) or, without
//! them, a self-signed certificate made at start for `localhost` and the pod's host name (the
//! scraper then skips verification, as Prometheus does for kube-rbac-proxy's default). A bearer
//! token of an authenticated scraper never crosses the network in clear.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::{TlsAcceptor, rustls};

/// Why the TLS listener cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading the metrics TLS certificate {path}: {source}")]
    Certificate {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("reading the metrics TLS key {path}: {source}")]
    Key {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("the metrics TLS certificate file {0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("making a self-signed metrics certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    #[error("the metrics TLS certificate and key do not make a server configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Where the certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertificateSource {
    /// PEM files: the certificate chain and its private key (read once, at start).
    Files { cert: PathBuf, key: PathBuf },
    /// A new self-signed certificate for these names (DNS names or IP addresses).
    SelfSigned { names: Vec<String> },
}

impl CertificateSource {
    /// The self-signed certificate's names: `localhost` and this host's name (the pod's).
    pub fn self_signed_for_this_host() -> Self {
        let mut names = vec!["localhost".to_string()];
        if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            let host = host.trim();
            if !host.is_empty() && host != "localhost" {
                names.push(host.to_string());
            }
        }
        Self::SelfSigned { names }
    }
}

/// The TLS acceptor of the metrics listener.
pub fn acceptor(source: &CertificateSource) -> Result<TlsAcceptor, TlsError> {
    let (chain, key) = match source {
        CertificateSource::Files { cert, key } => read_files(cert, key)?,
        CertificateSource::SelfSigned { names } => {
            let made = rcgen::generate_simple_self_signed(names.clone())?;
            let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
            (vec![made.cert.der().clone()], PrivateKeyDer::Pkcs8(key))
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn read_files(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Certificate {
            path: cert.to_path_buf(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert.to_path_buf()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Key {
        path: key.to_path_buf(),
        source,
    })?;
    Ok((chain, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_or_one_from_files() {
        let names = vec!["localhost".to_string(), "operator-0".to_string()];
        assert!(
            acceptor(&CertificateSource::SelfSigned {
                names: names.clone()
            })
            .is_ok()
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let made = rcgen::generate_simple_self_signed(names).expect("certificate");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, made.cert.pem()).expect("write cert");
        std::fs::write(&key, made.signing_key.serialize_pem()).expect("write key");
        let files = CertificateSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        };
        assert!(acceptor(&files).is_ok());

        // Each bad input names its file.
        std::fs::write(&key, "not a key").expect("write");
        let error = acceptor(&files).err().expect("a bad key").to_string();
        assert!(error.contains("tls.key"), "{error}");
        std::fs::write(&cert, "").expect("write");
        let error = acceptor(&files).err().expect("no certificate").to_string();
        assert!(error.contains("holds no certificate"), "{error}");
        let missing = CertificateSource::Files {
            cert: dir.path().join("absent.crt"),
            key,
        };
        let error = acceptor(&missing).err().expect("missing").to_string();
        assert!(error.contains("absent.crt"), "{error}");
    }
}
