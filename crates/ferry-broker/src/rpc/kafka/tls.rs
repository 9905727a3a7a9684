//! The Kafka listener's TLS (`[kafka.tls]`): rustls with ring, the broker's certificate and key from PEM files.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsSection;

/// An acceptor serving `cfg`'s certificate chain; the error names the file that is wrong.
pub fn acceptor(cfg: &TlsSection) -> Result<tokio_rustls::TlsAcceptor, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cfg.cert_file)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| format!("kafka.tls.cert_file {}: {e}", cfg.cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!("kafka.tls.cert_file {}: no certificate", cfg.cert_file.display()));
    }
    let key = PrivateKeyDer::from_pem_file(&cfg.key_file)
        .map_err(|e| format!("kafka.tls.key_file {}: {e}", cfg.key_file.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("kafka.tls: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("kafka.tls: {e}"))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
