//! SASL/PLAIN over TLS on the Kafka listener: a token is the password, and the token's scopes apply per API.

use std::path::PathBuf;

use ferry_client::admin::TopicConfig;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
use serde_json::{Value, json};

use crate::support::{Rec, Wire, assert_same, expected_range, run_client_with};

/// A CA and a certificate for 127.0.0.1 it signed, as PEM files: (CA, certificate, key).
fn pki(dir: &std::path::Path) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
    let ca_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Distinct names: OpenSSL takes a certificate whose issuer is its own subject for a self-signed one.
    params.distinguished_name.push(DnType::CommonName, "kafka_wire test CA");
    let ca = params.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, "localhost");
    // librdkafka checks the address it dialled against the certificate: an IP address entry, not a DNS name.
    params.subject_alt_names.push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    let paths = (dir.join("ca.crt"), dir.join("broker.crt"), dir.join("broker.key"));
    std::fs::write(&paths.0, ca.pem())?;
    std::fs::write(&paths.1, cert.pem())?;
    std::fs::write(&paths.2, key.serialize_pem())?;
    Ok(paths)
}

fn client(ca: &std::path::Path, user: &str, password: &str) -> Value {
    json!({
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": ca.display().to_string(),
        "message.timeout.ms": 5000,
    })
}

#[tokio::test]
async fn sasl_plain_over_tls_maps_onto_scoped_tokens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (ca, cert, key) = pki(dir.path())?;
    let tokens = [
        ("admin", "admin-secret-0123456789", "[\"admin\", \"produce\", \"consume\"]", "[\".*\"]"),
        ("writer", "writer-secret-0123456789", "[\"produce\"]", "[]"),
        ("reader", "reader-secret-0123456789", "[\"consume\"]", "[\"readers\"]"),
    ];
    let mut extra =
        format!("sasl = true\n[kafka.tls]\ncert_file = {:?}\nkey_file = {:?}\n", cert.display(), key.display());
    for (name, secret, scopes, groups) in tokens {
        let file = dir.path().join(name);
        std::fs::write(&file, secret)?;
        extra.push_str(&format!(
            "[[auth.tokens]]\nname = {name:?}\ntoken_file = {:?}\nscopes = {scopes}\ntopics = [\"orders\"]\ngroups = {groups}\n",
            file.display()
        ));
    }
    let w = Wire::start_with(&extra, Some(tokens[0].1)).await?;
    w.admin.create_topic("orders", 1, TopicConfig::default(), None).await?;

    // The writer's token produces; the reader's consumes in its group, exactly what was written.
    let writer = client(&ca, "writer", tokens[1].1);
    let acked = run_client_with("confluent", &w.kafka, &["produce", "orders", "1", "s", "0", "20"], &writer).await?;
    assert_eq!(acked, vec![json!({"acked": 20, "unflushed": 0})]);
    let reader = client(&ca, "reader", tokens[2].1);
    let read = run_client_with("confluent", &w.kafka, &["consume", "orders", "readers", "20"], &reader).await?;
    let mut read: Vec<Rec> = read.iter().filter_map(|l| l.get("rec")).map(Rec::of).collect();
    read.sort();
    assert_same("read with the reader's token", &read, &expected_range("s", 1, 0, 20));

    // The reader's token may not produce: TOPIC_AUTHORIZATION_FAILED (a plain producer: an idempotent one is
    // already refused its producer id, CLUSTER_AUTHORIZATION_FAILED), nothing written.
    let mut plain = reader.clone();
    plain["enable.idempotence"] = json!(false);
    let refused = run_client_with("confluent", &w.kafka, &["produce", "orders", "1", "t", "0", "3"], &plain).await?;
    let errors: Vec<&str> = refused.iter().filter_map(|l| l["error"].as_str()).collect();
    assert_eq!(errors.len(), 3, "{refused:?}");
    assert!(errors.iter().all(|e| e.contains("TOPIC_AUTHORIZATION_FAILED")), "{errors:?}");

    // A password that is no token: nothing gets in.
    let stranger = client(&ca, "writer", "not-a-token-0123456789");
    let refused = run_client_with("confluent", &w.kafka, &["produce", "orders", "1", "u", "0", "3"], &stranger).await?;
    assert_eq!(refused.iter().filter(|l| l.get("error").is_some()).count(), 3, "{refused:?}");
    assert_eq!(w.admin.describe_topic("orders").await?.partitions[0].log_end_offset, 20, "only the writer's records");
    Ok(())
}

#[tokio::test]
async fn a_broker_with_tokens_refuses_an_open_kafka_listener() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("t"), "some-secret-0123456789")?;
    let config = format!(
        "[kafka]\nlisten = \"127.0.0.1:0\"\n[[auth.tokens]]\nname = \"t\"\ntoken_file = {:?}\nscopes = [\"produce\"]\ntopics = [\"t\"]\n",
        dir.path().join("t").display()
    );
    let started = ferry_testkit::BrokerProcess::builder().config(config).start().await;
    let err = started.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("the Kafka listener must authenticate its clients: set kafka.sasl = true"), "{err}");
    Ok(())
}
