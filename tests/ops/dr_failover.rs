//! Fenced failover in one command (issue 29): `ferryctl failover` starts the mirror's job, which fences the source
//! topics, drains them to the target, syncs group offsets a last time, promotes every target topic as one cut and
//! stops mirroring them.
//!
//! - Under live load: every record the source acknowledged is on the target (both logs equal, record for record),
//!   produce to the source is refused naming the failover and the fence (also after the old primary restarts: a
//!   zombie), the target takes writes at a partition epoch above the cut, and the group's offsets are on the target.
//! - Killed at each step in turn (the mirror aborts right after recording a step, as a kill -9 there would), the
//!   job ends the same way when the command is run again: one fence epoch, one cut.

use std::collections::BTreeMap;

use anyhow::Context;
use ferry_client::proto::CommittedOffset;
use ferry_client::{Admin, OffsetSpec};
use ferry_testkit::MirrorProcess;
use serde_json::Value;

use crate::common::*;
use crate::support::{TOKEN, ferryctl};

const TOPIC: &str = "orders";
const JOB: &str = "failover.dc-a_to_dc-b";

/// A mirror a -> b of every topic, syncing group `app`.
fn conf(a: &Dc, b: &Dc) -> MirrorConf {
    let mut conf = MirrorConf::new(a, b);
    conf.groups_include = vec!["^app$".into()];
    conf
}

/// `ferryctl failover` against `mirror` with `extra` arguments.
async fn failover(mirror: &MirrorProcess, extra: &[&str]) -> anyhow::Result<crate::support::CtlOutput> {
    let url = mirror.monitor_url();
    let drain = dur(io_deadline());
    let mut args = vec!["--token", TOKEN, "failover", "--mirror", url.as_str(), "--topics", TOPIC, "--poll", "100ms"];
    args.extend_from_slice(&["--drain-timeout", drain.as_str()]);
    args.extend_from_slice(extra);
    let out = ferryctl(&args).await;
    // On a failure, the mirror's own account of the job.
    let logs: String = mirror.logs().lines().filter(|l| l.contains("failover")).collect::<Vec<_>>().join("\n");
    out.with_context(|| format!("the mirror's failover log lines:\n{logs}"))
}

/// The job as recorded on the target broker.
async fn stored_job(b: &Dc) -> anyhow::Result<Option<Value>> {
    let job = b.admin.get_job(JOB).await?;
    job.map(|j| serde_json::from_slice(&j.body).context("the job record is JSON")).transpose()
}

/// Asserts the end state of a finished failover of TOPIC: the logs equal, the report exact, the source refusing
/// writes naming the job, the target promoted at the job's floor and taking writes above it. Returns the job.
async fn assert_failed_over(a: &Dc, b: &Dc) -> anyhow::Result<Value> {
    let job = stored_job(b).await?.context("a recorded job")?;
    assert_eq!(job["step"], "done", "{job}");
    let source = assert_identical(a, TOPIC, b, TOPIC).await?;
    let epoch = job["epoch"].as_u64().context("epoch")?;
    let floor = job["epoch_floor"].as_u64().context("epoch_floor")?;
    let report = job["partitions"].as_array().context("partitions")?;
    assert_eq!(report.len(), source.len(), "one report line per partition: {job}");
    for (p, line) in report.iter().enumerate() {
        let end = source[p].log_end;
        assert_eq!(
            (line["partition"].as_u64(), line["source_end"].as_u64(), line["target_end"].as_u64()),
            (Some(p as u64), Some(end), Some(end)),
            "{line}"
        );
        assert_eq!((line["records_lost"].as_u64(), line["rpo_seconds"].as_f64()), (Some(0), Some(0.0)), "{line}");
    }
    assert_eq!(job["loss"], serde_json::json!([{"topic": TOPIC, "records_lost": 0, "window_seconds": 0.0}]));
    // The source is fenced: a write is refused, naming the failover and the fence epoch.
    let p = producer(a).await?;
    let err = produce_range(&p, TOPIC, "after-fence", 0, 1, 16).await.expect_err("the fenced source refuses");
    let text = format!("{err:#}");
    assert!(text.contains(&format!("is fenced at epoch {epoch} (failover {JOB} of mirror dc-a_to_dc-b)")), "{text}");
    p.close().await;
    // The target is promoted, at the floor, and takes writes in a partition epoch at or above it.
    let d = b.admin.describe_topic(TOPIC).await?;
    assert!(d.topic.mirror.is_none(), "promoted: {:?}", d.topic);
    assert_eq!(u64::from(d.topic.promote_epoch), floor);
    assert!(floor > source.iter().flat_map(|s| s.batches.iter().map(|b| u64::from(b.2))).max().unwrap_or(0));
    let q = producer(b).await?;
    produce_to_partition(&q, TOPIC, 0, "new-primary", 0, 5).await?;
    q.close().await;
    let after = read_partition(&b.client, TOPIC, 0, None).await?;
    assert_eq!(after.log_end, source[0].log_end + 5);
    let new_batches: Vec<_> = after.batches.iter().filter(|x| x.0 >= source[0].log_end).collect();
    assert!(!new_batches.is_empty() && new_batches.iter().all(|x| u64::from(x.2) == floor), "{new_batches:?}");
    Ok(job)
}

async fn committed(admin: &Admin, partitions: u32) -> anyhow::Result<BTreeMap<u32, u64>> {
    let asks: Vec<(String, u32)> = (0..partitions).map(|p| (TOPIC.to_owned(), p)).collect();
    Ok(admin.fetch_committed_offsets("app", &asks).await?.into_iter().map(|c| (c.partition, c.offset)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_failover_under_live_load_loses_nothing_and_fences_the_old_primary() -> anyhow::Result<()> {
    let (mut a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 3).await?;
    produce(&a, TOPIC, "before", 300, 64).await?;
    let leos = a.leos(TOPIC).await?;
    let offsets: Vec<CommittedOffset> = (0..3)
        .map(|p| CommittedOffset {
            topic: TOPIC.into(),
            partition: p,
            offset: leos[p as usize] / 2,
            metadata: "m".into(),
        })
        .collect();
    a.admin.commit_offsets("app", offsets).await?;
    let mirror = MirrorProcess::builder(conf(&a, &b).toml()).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;

    // Live load until the fence refuses it.
    let client = a.client.clone();
    let load = tokio::spawn(async move {
        let p = ferry_client::Producer::new(client, Default::default()).await?;
        let mut next = 0u64;
        loop {
            match produce_range(&p, TOPIC, "live", next, next + 50, 64).await {
                Ok(()) => next += 50,
                Err(e) => return anyhow::Ok((next, format!("{e:#}"))),
            }
        }
    });
    wait_progress_beyond(&a, TOPIC, &leos, io_deadline()).await?;
    let dry = failover(&mirror, &["--dry-run"]).await?;
    assert_eq!(dry.code, 0, "{dry:?}");
    assert!(
        dry.stdout.contains("[ok] source: route primary healthy") && dry.stdout.contains("3 partitions"),
        "{dry:?}"
    );
    assert!(stored_job(&b).await?.is_none(), "a dry run records nothing");

    let out = failover(&mirror, &["--confirm"]).await?;
    assert_eq!(out.code, 0, "{out:?}\n{}", mirror.logs());
    assert!(out.stdout.contains("RPO 0"), "{}", out.stdout);
    let (acked_chunks, refusal) = load.await??;
    assert!(refusal.contains("fenced at epoch"), "the load stopped at the fence: {refusal}");
    let job = assert_failed_over(&a, &b).await?;
    // Every acknowledged record is in the (final) source log, which the target equals.
    let live: usize = read_topic(&a, TOPIC)
        .await?
        .iter()
        .map(|p| p.records.iter().filter(|r| r.key.as_deref().is_some_and(|k| k.starts_with(b"live-"))).count())
        .sum();
    assert!(live as u64 >= acked_chunks && acked_chunks > 0, "{live} live records, {acked_chunks} acknowledged");
    assert_eq!(committed(&b.admin, 3).await?, committed(&a.admin, 3).await?, "the group's offsets were synced");

    // Visible: the events of each step, the status document, ferryctl mirror status.
    let kinds: Vec<String> =
        monitor_events(&mirror, None).await?.iter().filter_map(|e| e["kind"].as_str().map(str::to_owned)).collect();
    for k in ["failover_started", "fenced", "drained", "promoted"] {
        assert_eq!(kinds.iter().filter(|x| *x == k).count(), 1, "one {k} event: {kinds:?}");
    }
    let status = monitor_get(&mirror, "/api/v1/status").await?;
    assert_eq!(status["failover"]["step"], "done", "{status}");
    assert_eq!(status["failover"]["fence_epoch"], job["epoch"]);
    let text = ferryctl(&["--monitor", &mirror.addr().to_string(), "mirror", "status"]).await?;
    assert!(text.stdout.contains(&format!("Failover:      {JOB} at step done (1 topics")), "{}", text.stdout);

    // Running the command again changes nothing and answers the same job.
    let again = failover(&mirror, &["--confirm"]).await?;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(stored_job(&b).await?.context("job")?, job);

    // A zombie old primary: after a crash and restart it still refuses writes.
    a.broker.kill9().await?;
    a.broker.restart().await?;
    let p = producer(&a).await?;
    let err = produce_range(&p, TOPIC, "zombie", 0, 1, 16).await.expect_err("the restarted old primary is fenced");
    assert!(format!("{err:#}").contains("is fenced at epoch"), "{err:#}");
    p.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_killed_after_each_step_ends_the_same_when_run_again() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 2).await?;
    produce(&a, TOPIC, "before", 200, 64).await?;
    let steps = ["started", "fenced", "drained", "groups_synced", "promoted"];
    let mut mirror = MirrorProcess::builder(conf(&a, &b).toml())
        .env("FERRY_MONITOR_TOKEN", TOKEN)
        .env("FERRY_MIRROR_FAILOVER_CRASH_AFTER", steps.join(","))
        .start()
        .await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    let mut epochs = Vec::new();
    for step in steps {
        // Each run records one more step, then the mirror aborts (the command fails: the mirror is gone).
        let out = failover(&mirror, &["--confirm"]).await?;
        assert_ne!(out.code, 0, "the mirror aborted after {step}: {out:?}");
        let exited = mirror.process().wait_exit(io_deadline()).await;
        assert!(exited.is_ok(), "the mirror aborted after {step}");
        let job = stored_job(&b).await?.context("a recorded job")?;
        assert_eq!(job["step"], step, "{job}");
        epochs.push(job["epoch"].clone());
        mirror.restart().await?;
    }
    assert!(epochs.windows(2).all(|w| w[0] == w[1]), "one job, one fence epoch: {epochs:?}");
    let out = failover(&mirror, &["--confirm"]).await?;
    assert_eq!(out.code, 0, "{out:?}");
    let job = assert_failed_over(&a, &b).await?;
    assert_eq!(job["epoch"], epochs[0]);
    // The source's fence and the target's records are what one uninterrupted run leaves: nothing written twice.
    assert_eq!(a.admin.list_offset(TOPIC, 0, OffsetSpec::Latest).await?.fence_epoch, job["epoch"].as_u64());
    let status = monitor_get(&mirror, "/api/v1/status").await?;
    assert_eq!(status["paused_topics"], serde_json::json!([TOPIC]), "mirroring of the topic stopped: {status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_of_100_topics_of_10_partitions_promotes_them_as_one_cut() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    let names: Vec<String> = (0..100).map(|t| format!("bulk.{t:03}")).collect();
    for n in &names {
        a.create_topic(n, 10).await?;
    }
    let p = producer(&a).await?;
    send_all(&p, names.iter().flat_map(|n| (0..10u64).map(move |q| record(n, "bulk", q, 16).with_partition(q as u32))))
        .await?;
    p.close().await;
    let mut conf = MirrorConf::new(&a, &b);
    conf.include = vec!["^bulk\\..*$".into()];
    let mirror = MirrorProcess::builder(conf.toml()).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    for n in &names {
        wait_caught_up(&a, n, &b, n, io_deadline()).await?;
    }
    let url = mirror.monitor_url();
    let out = ferryctl(&["--token", TOKEN, "failover", "--mirror", &url, "--topics", "bulk\\..*", "--confirm"]).await?;
    assert_eq!(out.code, 0, "{out:?}");
    let job = stored_job(&b).await?.context("a recorded job")?;
    assert_eq!(job["step"], "done");
    let report = job["partitions"].as_array().context("partitions")?;
    assert_eq!(report.len(), 1000);
    assert!(report.iter().all(|l| l["source_end"] == 1 && l["target_end"] == 1 && l["rpo_seconds"] == 0.0), "{job}");
    // One cut: every topic promoted at the one floor, and fenced at the one epoch on the source.
    let floor = job["epoch_floor"].as_u64().context("floor")?;
    let epoch = job["epoch"].as_u64().context("epoch")?;
    for n in &names {
        let d = b.admin.describe_topic(n).await?;
        assert_eq!((d.topic.mirror.is_none(), u64::from(d.topic.promote_epoch)), (true, floor), "{n}");
        let s = a.admin.describe_topic(n).await?;
        assert_eq!(s.topic.fence.map(|f| f.epoch), Some(epoch), "{n}");
    }
    Ok(())
}
