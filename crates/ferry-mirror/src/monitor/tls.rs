//! TLS for the monitor (`monitor.tls`): rustls with the ring provider, set explicitly on the server config (no
//! process-wide default provider is installed), from a PEM certificate chain and a PEM private key.

use std::path::Path;
use std::sync::Arc;

use axum_server::tls_rustls::RustlsConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::error::MonitorError;

fn tls_error(path: &Path, reason: impl Into<String>) -> MonitorError {
    MonitorError::Tls { path: path.to_owned(), reason: reason.into() }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, MonitorError> {
    let bytes = std::fs::read(path).map_err(|e| tls_error(path, format!("cannot read the certificate: {e}")))?;
    let certs = rustls_pemfile::certs(&mut bytes.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(path, format!("invalid PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(tls_error(path, "no \"BEGIN CERTIFICATE\" block found"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, MonitorError> {
    let bytes = std::fs::read(path).map_err(|e| tls_error(path, format!("cannot read the private key: {e}")))?;
    rustls_pemfile::private_key(&mut bytes.as_slice())
        .map_err(|e| tls_error(path, format!("invalid PEM private key: {e}")))?
        .ok_or_else(|| tls_error(path, "no PKCS#8, PKCS#1 or SEC1 private key block found"))
}

/// Builds the acceptor configuration. ALPN offers HTTP/1.1 only: the monitor serves small JSON documents, and
/// HTTP/1.1 is what every scraper and `curl` speaks.
pub fn rustls_config(cert: &Path, key: &Path) -> Result<RustlsConfig, MonitorError> {
    let certs = read_certs(cert)?;
    let key_der = read_key(key)?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(cert, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| tls_error(key, format!("the key does not fit the certificate: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(RustlsConfig::from_config(Arc::new(config)))
}
