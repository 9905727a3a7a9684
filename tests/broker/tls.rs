//! TLS on the broker's listener: a client that trusts the broker's CA talks to it, a plaintext client does not,
//! and with `client_ca_file` only a client with a certificate from that CA gets in.

use std::path::{Path, PathBuf};

use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, TlsOptions};
use ferry_testkit::BrokerProcess;
use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair};

/// A CA, and certificates it signs, written as PEM files into a directory.
pub struct Pki {
    dir: tempfile::TempDir,
    ca: Certificate,
    ca_key: KeyPair,
}

impl Pki {
    pub fn new() -> anyhow::Result<Pki> {
        let dir = tempfile::tempdir()?;
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key)?;
        std::fs::write(dir.path().join("ca.crt"), ca.pem())?;
        Ok(Pki { dir, ca, ca_key })
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// Issues a certificate for `names` and writes `{stem}.crt` and `{stem}.key`.
    pub fn issue(&self, stem: &str, names: &[&str]) -> anyhow::Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate()?;
        let params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        let cert = params.signed_by(&key, &self.ca, &self.ca_key)?;
        let (crt, pem) = (self.dir.path().join(format!("{stem}.crt")), self.dir.path().join(format!("{stem}.key")));
        std::fs::write(&crt, cert.pem())?;
        std::fs::write(&pem, key.serialize_pem())?;
        Ok((crt, pem))
    }
}

fn tls_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> String {
    let mut text = format!("[broker.tls]\ncert_file = {:?}\nkey_file = {:?}\n", cert.display(), key.display());
    if let Some(ca) = client_ca {
        text.push_str(&format!("client_ca_file = {:?}\n", ca.display()));
    }
    text
}

/// An admin dialling the broker's loopback address; with TLS, the certificate is checked against `localhost`.
fn admin(broker: &BrokerProcess, tls: Option<TlsOptions>) -> anyhow::Result<Admin> {
    let mut config = ClientConfig::new([broker.addr().to_string()]);
    config.tls = tls.map(|t| TlsOptions { domain: Some("localhost".into()), ..t });
    Ok(Admin::new(BrokerClient::new(config)?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_trust_the_broker_ca_get_in_and_plaintext_does_not() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let pki = Pki::new()?;
    let (cert, key) = pki.issue("broker", &["localhost"])?;
    let broker = BrokerProcess::builder().config(tls_config(&cert, &key, None)).start().await?;

    let trusted = admin(&broker, Some(TlsOptions { ca_file: Some(pki.ca_file()), ..TlsOptions::default() }))?;
    assert_eq!(trusted.metadata().await?.cluster_id, broker.cluster_id());
    trusted.create_topic("secure", 1, TopicConfig::default(), None).await?;

    // Plaintext HTTP/2 against a TLS listener fails as a transport error, and a client trusting another CA fails
    // the handshake.
    let plain = admin(&broker, None)?;
    let err = plain.list_topics().await.unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    let other = Pki::new()?;
    let wrong_ca = admin(&broker, Some(TlsOptions { ca_file: Some(other.ca_file()), ..TlsOptions::default() }))?;
    let err = wrong_ca.list_topics().await.unwrap_err();
    assert!(err.is_transport(), "{err:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_clients_with_its_certificates_get_in() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let pki = Pki::new()?;
    let (cert, key) = pki.issue("broker", &["localhost"])?;
    let (client_cert, client_key) = pki.issue("client", &["ferry-client"])?;
    let broker = BrokerProcess::builder().config(tls_config(&cert, &key, Some(&pki.ca_file()))).start().await?;

    let anonymous = admin(&broker, Some(TlsOptions { ca_file: Some(pki.ca_file()), ..TlsOptions::default() }))?;
    let err = anonymous.list_topics().await.unwrap_err();
    assert!(err.is_transport(), "{err:?}");

    let with_cert = admin(
        &broker,
        Some(TlsOptions {
            ca_file: Some(pki.ca_file()),
            cert_file: Some(client_cert),
            key_file: Some(client_key),
            domain: None,
        }),
    )?;
    with_cert.create_topic("mutual", 2, TopicConfig::default(), None).await?;
    let names: Vec<String> = with_cert.list_topics().await?.into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["mutual"]);
    Ok(())
}
