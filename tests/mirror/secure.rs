//! The mirror over secured links (conf/mirror.toml `[source.tls]`, `[target.tls]`, `token_file`):
//!
//! - TLS (rustls) on both sides with certificates made by rcgen here: dc-a and dc-b each have their own CA, dc-a
//!   also requires a client certificate (mutual TLS), and the mirror verifies both brokers by name.
//! - Bearer tokens on both sides, a different one per DC, read by the mirror from `source.token_file` and
//!   `target.token_file`; neither token appears in the mirror's log or its monitor.
//!
//! In both, the target ends identical to the source (records and batches, by count and digest).

use std::path::{Path, PathBuf};

use ferry_client::{Admin, BrokerClient, ClientConfig, Code, TlsOptions};
use ferry_testkit::{BrokerProcess, MirrorProcess};
use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair};

use crate::common::*;

const TOPIC: &str = "orders";

/// A CA, and certificates it signs, written as PEM files into a directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: Certificate,
    ca_key: KeyPair,
}

impl Pki {
    fn new() -> anyhow::Result<Pki> {
        let dir = tempfile::tempdir()?;
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key)?;
        std::fs::write(dir.path().join("ca.crt"), ca.pem())?;
        Ok(Pki { dir, ca, ca_key })
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// Issues a certificate for `names` and writes `{stem}.crt` and `{stem}.key`.
    fn issue(&self, stem: &str, names: &[&str]) -> anyhow::Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate()?;
        let params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        let cert = params.signed_by(&key, &self.ca, &self.ca_key)?;
        let (crt, pem) = (self.dir.path().join(format!("{stem}.crt")), self.dir.path().join(format!("{stem}.key")));
        std::fs::write(&crt, cert.pem())?;
        std::fs::write(&pem, key.serialize_pem())?;
        Ok((crt, pem))
    }
}

/// A DC whose broker runs `broker_config` (on top of [`BROKER_CONFIG`]), with clients made by `client`.
async fn secured_dc(
    name: &str,
    broker_config: &str,
    client: impl Fn(ClientConfig) -> ClientConfig,
) -> anyhow::Result<Dc> {
    ferry_testkit::init_tracing();
    let broker =
        BrokerProcess::builder().cluster_id(name).config(format!("{BROKER_CONFIG}{broker_config}")).start().await?;
    let client = BrokerClient::new(client(ClientConfig::new([broker.addr().to_string()])))?;
    Ok(Dc { name: name.to_owned(), admin: Admin::new(client.clone()), client, broker })
}

/// `conf`'s file with `source_lines` added to `[source]`, `target_lines` to `[target]`, and `tables` at the end.
fn secured_toml(conf: &MirrorConf, source_lines: &str, target_lines: &str, tables: &str) -> String {
    let text = conf.toml();
    let source = format!("[source]\ncluster = \"{}\"\n", conf.source_cluster);
    let target = format!("[target]\ncluster = \"{}\"\n", conf.target_cluster);
    assert!(text.contains(&source) && text.contains(&target), "the config layout changed:\n{text}");
    let text =
        text.replace(&source, &format!("{source}{source_lines}")).replace(&target, &format!("{target}{target_lines}"));
    format!("{text}\n{tables}")
}

/// A PEM path as a TOML string.
fn toml_path(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// Loads `TOPIC` on dc-a, waits until the mirror copied it and asserts the target identical.
async fn load_and_compare(a: &Dc, b: &Dc, mirror: &MirrorProcess) -> anyhow::Result<()> {
    let p = producer(a).await?;
    produce_range(&p, TOPIC, "secured", 0, 1_200, 200).await?;
    p.close().await;
    wait_caught_up(a, TOPIC, b, TOPIC, io_deadline()).await?;
    let src = assert_identical(a, TOPIC, b, TOPIC).await?;
    assert_eq!(src.iter().map(|p| p.records.len()).sum::<usize>(), 1_200);
    let rows = monitor_partitions(mirror).await?;
    assert!(rows.values().all(|r| r.state == "mirroring" && r.last_error.is_none()), "{rows:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_exactly_over_tls_with_a_client_certificate_on_the_source() -> anyhow::Result<()> {
    let (pki_a, pki_b) = (Pki::new()?, Pki::new()?);
    let (a_cert, a_key) = pki_a.issue("broker-a", &["localhost"])?;
    let (b_cert, b_key) = pki_b.issue("broker-b", &["localhost"])?;
    let (mirror_cert, mirror_key) = pki_a.issue("mirror", &["ferry-mirror"])?;
    let tls = |cert: &Path, key: &Path| {
        format!("[broker.tls]\ncert_file = {}\nkey_file = {}\n", toml_path(cert), toml_path(key))
    };
    let a_tls = format!("{}client_ca_file = {}\n", tls(&a_cert, &a_key), toml_path(&pki_a.ca_file()));
    let (a_client_cert, a_client_key) = pki_a.issue("test-client", &["test-client"])?;
    let b_tls = tls(&b_cert, &b_key);
    let (a, b) = tokio::join!(
        secured_dc("dc-a", &a_tls, |c| c.with_tls(TlsOptions {
            ca_file: Some(pki_a.ca_file()),
            cert_file: Some(a_client_cert.clone()),
            key_file: Some(a_client_key.clone()),
            domain: Some("localhost".into()),
        })),
        secured_dc("dc-b", &b_tls, |c| c.with_tls(TlsOptions {
            ca_file: Some(pki_b.ca_file()),
            domain: Some("localhost".into()),
            ..TlsOptions::default()
        })),
    );
    let (a, b) = (a?, b?);
    a.create_topic(TOPIC, 3).await?;

    let conf = MirrorConf::new(&a, &b);
    let tables = format!(
        "[source.tls]\nca_file = {}\ncert_file = {}\nkey_file = {}\ndomain = \"localhost\"\n\n\
         [target.tls]\nca_file = {}\ndomain = \"localhost\"\n",
        toml_path(&pki_a.ca_file()),
        toml_path(&mirror_cert),
        toml_path(&mirror_key),
        toml_path(&pki_b.ca_file()),
    );
    let mirror = MirrorProcess::builder(secured_toml(&conf, "", "", &tables)).start().await?;
    load_and_compare(&a, &b, &mirror).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_exactly_with_a_bearer_token_per_side_from_token_files() -> anyhow::Result<()> {
    const SOURCE_TOKEN: &str = "dc-a-token-3f9c2e71";
    const TARGET_TOKEN: &str = "dc-b-token-8a41d0b6";
    let secrets = tempfile::tempdir()?;
    let file = |name: &str, token: &str| -> anyhow::Result<PathBuf> {
        let path = secrets.path().join(name);
        std::fs::write(&path, format!("{token}\n"))?;
        Ok(path)
    };
    let (a_file, b_file) = (file("dc-a.token", SOURCE_TOKEN)?, file("dc-b.token", TARGET_TOKEN)?);
    let broker_token = |f: &Path| format!("[broker]\ntoken_file = {}\n", toml_path(f));
    let (a_config, b_config) = (broker_token(&a_file), broker_token(&b_file));
    let (a, b) = tokio::join!(
        secured_dc("dc-a", &a_config, |c| c.with_token(SOURCE_TOKEN)),
        secured_dc("dc-b", &b_config, |c| c.with_token(TARGET_TOKEN)),
    );
    let (a, b) = (a?, b?);
    // Each broker refuses a client without its token, and the other DC's token: the mirror must send the right one.
    for (dc, other) in [(&a, TARGET_TOKEN), (&b, SOURCE_TOKEN)] {
        for config in [ClientConfig::new([dc.addr()]), ClientConfig::new([dc.addr()]).with_token(other)] {
            let err = Admin::new(BrokerClient::new(config)?).list_topics().await.unwrap_err();
            assert!(matches!(&err, ferry_client::ClientError::Status { code: Code::Unauthenticated, .. }), "{err:?}");
        }
    }
    a.create_topic(TOPIC, 3).await?;

    let conf = MirrorConf::new(&a, &b);
    let toml = secured_toml(
        &conf,
        &format!("token_file = {}\n", toml_path(&secrets.path().join("mirror-source.token"))),
        &format!("token_file = {}\n", toml_path(&secrets.path().join("mirror-target.token"))),
        "",
    );
    file("mirror-source.token", SOURCE_TOKEN)?;
    file("mirror-target.token", TARGET_TOKEN)?;
    let mirror = MirrorProcess::builder(toml).start().await?;
    load_and_compare(&a, &b, &mirror).await?;

    // Secrets are never logged nor shown by the monitor.
    let logs = mirror.logs();
    let status = monitor_get(&mirror, "/api/v1/status").await?.to_string();
    let egress = monitor_get(&mirror, "/api/v1/egress").await?.to_string();
    for token in [SOURCE_TOKEN, TARGET_TOKEN] {
        assert!(!logs.contains(token), "the mirror's log shows a token");
        assert!(!status.contains(token) && !egress.contains(token), "the monitor shows a token");
    }
    Ok(())
}
