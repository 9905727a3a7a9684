//! The mirror between two brokers configured with scoped tokens only (`[[auth.tokens]]`, no all-powerful token):
//! the mirror's token on each side has the mirror scope alone, on the mirrored topics, the synced group and its own
//! `ferry-mirror.*` group. It copies exactly, syncs the group's offsets, survives a kill -9, and the brokers never
//! deny it anything (no denial in either broker's log).

use std::path::Path;

use ferry_client::admin::CommittedOffset;
use ferry_client::{Admin, BrokerClient, ClientConfig};
use ferry_testkit::{BrokerProcess, deadline, wait_until};

use crate::common::*;

const TOPIC: &str = "orders";
const MIRROR_SECRET: [&str; 2] = ["dc-a-mirror-7c31e9b0d54a2f68", "dc-b-mirror-40f8a2c6e19d7b53"];
const OPS_SECRET: [&str; 2] = ["dc-a-ops-b92e0d7f1c46a835", "dc-b-ops-1e7c5a93f0b26d48"];

fn toml_path(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// A DC whose broker knows two scoped tokens: the operators' (`ops`: admin, produce and consume on everything),
/// which the test's clients use, and the mirror's.
async fn scoped_dc(name: &str, secrets: &Path, ops: &str, mirror: &str) -> anyhow::Result<Dc> {
    let mut config = BROKER_CONFIG.to_owned();
    for (token, secret, scopes, groups) in [
        ("ops", ops, r#"["admin", "produce", "consume"]"#, r#"[".*"]"#),
        ("mirror", mirror, r#"["mirror"]"#, r#"['^ferry-mirror\.dc-a_to_dc-b$', '^app$']"#),
    ] {
        let file = secrets.join(format!("{name}-{token}.token"));
        std::fs::write(&file, format!("{secret}\n"))?;
        config.push_str(&format!(
            "\n[[auth.tokens]]\nname = \"{token}\"\ntoken_file = {}\nscopes = {scopes}\ntopics = ['^orders$']\n\
             groups = {groups}\n",
            toml_path(&file)
        ));
    }
    let broker = BrokerProcess::builder().cluster_id(name).config(config).start().await?;
    let client = BrokerClient::new(ClientConfig::new([broker.addr().to_string()]).with_token(ops))?;
    Ok(Dc { name: name.to_owned(), admin: Admin::new(client.clone()), client, broker })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_exactly_with_mirror_scoped_tokens_syncs_groups_and_survives_kill9() -> anyhow::Result<()> {
    ferry_testkit::init_tracing();
    let secrets = tempfile::tempdir()?;
    let (a, b) = tokio::join!(
        scoped_dc("dc-a", secrets.path(), OPS_SECRET[0], MIRROR_SECRET[0]),
        scoped_dc("dc-b", secrets.path(), OPS_SECRET[1], MIRROR_SECRET[1]),
    );
    let (a, b) = (a?, b?);
    a.create_topic(TOPIC, 2).await?;
    let p = producer(&a).await?;
    produce_range(&p, TOPIC, "before", 0, 600, 100).await?;
    let committed: Vec<u64> = a.leos(TOPIC).await?.iter().map(|leo| leo / 2).collect();
    let offsets = committed
        .iter()
        .enumerate()
        .map(|(p, o)| CommittedOffset { topic: TOPIC.into(), partition: p as u32, offset: *o, metadata: String::new() })
        .collect();
    a.admin.commit_offsets("app", offsets).await?;

    let mut conf = MirrorConf::new(&a, &b);
    conf.groups_include = vec!["^app$".into()];
    let line = |side: &str, secret: &str| -> anyhow::Result<String> {
        let file = secrets.path().join(format!("mirror-{side}.token"));
        std::fs::write(&file, format!("{secret}\n"))?;
        Ok(format!("token_file = {}\n", toml_path(&file)))
    };
    let (source_line, target_line) = (line("source", MIRROR_SECRET[0])?, line("target", MIRROR_SECRET[1])?);
    let text = conf.toml();
    let (source, target) = (
        format!("[source]\ncluster = \"{}\"\n", conf.source_cluster),
        format!("[target]\ncluster = \"{}\"\n", conf.target_cluster),
    );
    assert!(text.contains(&source) && text.contains(&target), "the config layout changed:\n{text}");
    let text =
        text.replace(&source, &format!("{source}{source_line}")).replace(&target, &format!("{target}{target_line}"));
    let mut mirror = ferry_testkit::MirrorProcess::builder(text).start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;

    // The group's offsets follow.
    let sync = deadline(&[conf.group_sync_interval, IO_BUDGET]);
    wait_until("app's offsets on dc-b", sync, async || -> anyhow::Result<bool> {
        let mut o: Vec<(u32, u64)> = b
            .admin
            .fetch_committed_offsets("app", &[])
            .await?
            .iter()
            .filter(|o| o.topic == TOPIC)
            .map(|o| (o.partition, o.offset))
            .collect();
        o.sort();
        Ok(o.into_iter().map(|(_, offset)| offset).collect::<Vec<_>>() == committed)
    })
    .await?;

    // More records, and a kill -9 of the mirror while they flow; the restarted mirror finishes the copy.
    produce_range(&p, TOPIC, "after", 600, 1_200, 100).await?;
    mirror.kill9().await?;
    mirror.restart().await?;
    produce_range(&p, TOPIC, "restarted", 1_200, 1_500, 100).await?;
    p.close().await;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let src = assert_identical(&a, TOPIC, &b, TOPIC).await?;
    assert_eq!(src.iter().map(|p| p.records.len()).sum::<usize>(), 1_500);

    // Neither broker denied the mirror anything, and no secret reached a log.
    for dc in [&a, &b] {
        let logs = dc.broker.logs();
        assert!(!logs.contains("permission denied"), "{} denied a call:\n{logs}", dc.name);
        for secret in MIRROR_SECRET.iter().chain(&OPS_SECRET) {
            assert!(!logs.contains(secret), "{}'s log holds a secret", dc.name);
        }
    }
    let logs = mirror.logs();
    assert!(!logs.contains("PermissionDenied") && !logs.contains("may not call"), "the mirror was denied:\n{logs}");
    Ok(())
}
