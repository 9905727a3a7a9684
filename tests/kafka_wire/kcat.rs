//! Debian's kcat, with the older librdkafka Debian ships, produces (auto-creating the topic through Metadata) and
//! consumes: the old-client case of the version floors.

use std::process::Stdio;

use anyhow::{Context, ensure};
use tokio::io::AsyncWriteExt;

use crate::support::{Wire, step_deadline};

#[tokio::test]
async fn kcat_with_debian_librdkafka_produces_and_consumes() -> anyhow::Result<()> {
    let w = Wire::start().await?;
    let lines: String = (0..50).map(|i| format!("k{}:v{i}-{}\n", i % 5, "y".repeat(i % 9))).collect();
    let mut produce = tokio::process::Command::new("kcat")
        .args(["-b", &w.kafka, "-P", "-t", "kc", "-p", "0", "-K:", "-H", "origin=kcat", "-X", "acks=all"])
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("kcat (Debian package kcat) is not installed")?;
    let mut stdin = produce.stdin.take().context("stdin")?;
    stdin.write_all(lines.as_bytes()).await?;
    drop(stdin);
    let status = tokio::time::timeout(step_deadline(), produce.wait()).await.context("kcat -P did not finish")??;
    ensure!(status.success(), "kcat -P failed: {status}");

    // Through gRPC: the same records, in order, from offset 0, with kcat's header.
    let stored = w.read_grpc("kc", 0).await?;
    let got: Vec<String> = stored
        .iter()
        .map(|r| {
            let s = |b: &Option<bytes::Bytes>| String::from_utf8_lossy(b.as_deref().unwrap_or(b"<null>")).into_owned();
            let h: Vec<String> = r.headers.iter().map(|h| format!("{}={}", h.key, s(&h.value))).collect();
            format!("{} {}:{} {}", r.offset, s(&r.key), s(&r.value), h.join(","))
        })
        .collect();
    let want: Vec<String> = lines.lines().enumerate().map(|(i, l)| format!("{i} {l} origin=kcat")).collect();
    assert_eq!(got, want);

    // Through kcat's consumer: the same.
    let consume = tokio::process::Command::new("kcat")
        .args(["-b", &w.kafka, "-C", "-t", "kc", "-p", "0", "-o", "beginning", "-e", "-q", "-f", "%o %k:%s %h\n"])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(step_deadline(), consume).await.context("kcat -C did not finish")??;
    ensure!(out.status.success(), "kcat -C failed: {}", String::from_utf8_lossy(&out.stderr));
    let read: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(read, want);
    Ok(())
}
