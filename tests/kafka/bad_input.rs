//! Bad input never crash-loops the mirror: a route whose endpoint is not Kafka gives one clear error and a
//! `sync_error` alarm while the process keeps serving; a mirrored Kafka topic that disappears gives `remove_topic`
//! (docs/alarms.md) and the target keeps what was copied.

use std::time::Duration;

use crate::common::{
    Ferry, SideConf, events, io_deadline, mirror_toml, monitor_get, read_ferry, start_mirror, wait_ferry_leo,
};
use crate::kafka_support::{Tansu, consume, create_topic, delete_topic, digest, produce};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_is_not_kafka_gives_a_clear_error_and_an_alarm_not_a_crash_loop() -> anyhow::Result<()> {
    // The "Kafka" route points at a Ferry broker's gRPC port.
    let not_kafka = Ferry::start("dc-x").await?;
    let dst = Ferry::start("dc-b").await?;
    let source = SideConf::new("kafka-a", "kafka", &not_kafka.addr());
    let target = SideConf::new("dc-b", "ferry", &dst.addr());
    let mut mirror =
        start_mirror(&mirror_toml("kafka-a_to_dc-b", &source, &target, "identity", "^orders$", "")).await?;
    let alarm = ferry_testkit::wait_for("a sync_error naming the endpoint", io_deadline(), async || {
        let found = events(&mirror, "sync_error").await?;
        Ok::<_, anyhow::Error>(found.into_iter().find(|e| e.to_string().contains(&not_kafka.addr())))
    })
    .await?;
    assert!(alarm.to_string().contains("Kafka"), "the alarm says what is wrong: {alarm}");
    let route = &monitor_get(&mirror, "/api/v1/egress").await?["routes"][0];
    assert_eq!(route["healthy"], false, "{route}");
    // Still serving several probe periods later, and the alarm was raised once, not in a loop.
    let before = events(&mirror, "sync_error").await?.len();
    ferry_testkit::wait_until("ten more probe periods", Duration::from_secs(30), async || {
        Ok::<_, anyhow::Error>(
            monitor_get(&mirror, "/api/v1/egress").await?["routes"][0]["consecutive_failures"].as_u64() >= Some(12),
        )
    })
    .await?;
    assert!(mirror.is_running(), "the mirror must keep running");
    assert_eq!(events(&mirror, "sync_error").await?.len(), before, "one alarm, not one per probe");
    mirror.terminate(Duration::from_secs(20)).await?;
    Ok(())
}

/// The strict form of the next test: a mirrored Kafka topic deleted on tansu is reported with `remove_topic` by the
/// process that mirrored it, which keeps running (no restart at all) and keeps what was copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "librdkafka 2.12.1 (bundled by rdkafka-sys 4.10) segfaults in rd_kafka_metadata_cache_find on tansu's fetch response for the deleted topic (docs/kafka.md, Known issues), so the process does not keep running; a_deleted_kafka_topic_raises_remove_topic_and_never_crash_loops_the_mirror tolerates that one crash"]
async fn a_deleted_kafka_topic_raises_remove_topic_and_the_mirror_keeps_running() -> anyhow::Result<()> {
    let k = Tansu::start("kafka-a").await;
    let dst = Ferry::start("dc-b").await?;
    create_topic(&k, "orders", 1).await;
    let orders = produce(&k, "orders", 0, 50, 1, &[]).await;
    let source = SideConf::new("kafka-a", "kafka", &k.bootstrap());
    let target = SideConf::new("dc-b", "ferry", &dst.addr());
    let mut mirror =
        start_mirror(&mirror_toml("kafka-a_to_dc-b", &source, &target, "identity", "^orders$", "")).await?;
    wait_ferry_leo(&dst, "orders", 0, 50).await?;
    let pid = mirror.pid();
    delete_topic(&k, "orders").await;
    let event = ferry_testkit::wait_for("remove_topic for orders, or an exit", io_deadline(), async || {
        if !mirror.is_running() {
            return Ok::<_, anyhow::Error>(Some(None));
        }
        Ok(events(&mirror, "remove_topic").await?.into_iter().find(|e| e["topic"] == "orders").map(Some))
    })
    .await?;
    let Some(event) = event else {
        anyhow::bail!("the mirror exited ({:?}):\n{}", mirror.process().exit_status(), mirror.logs());
    };
    assert!(event["message"].as_str().is_some_and(|m| m.contains("orders")), "{event}");
    assert!(mirror.is_running() && mirror.pid() == pid, "the same process goes on: {}", mirror.logs());
    assert_eq!(read_ferry(&dst, "orders", 0).await?, orders, "the target keeps what was copied");
    mirror.terminate(Duration::from_secs(20)).await?;
    Ok(())
}

/// A mirrored Kafka topic deleted on tansu: the mirror raises `remove_topic` for it, the target keeps what was
/// copied, and mirroring of the other topic goes on: never a crash loop.
///
/// While rdkafka bundles librdkafka 2.12, the deletion may crash the process once: the segfault in
/// `rd_kafka_metadata_cache_find` documented in docs/kafka.md ("Known issues"), right away or a fetch or so after
/// `remove_topic`. The test then restarts the process once, as its supervisor would; a process restarted before it
/// raised `remove_topic` raises it at start (the topic is a mirror topic of this source whose source is gone).
/// Any other exit, a second crash, or a crash with another librdkafka fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_kafka_topic_raises_remove_topic_and_never_crash_loops_the_mirror() -> anyhow::Result<()> {
    let k = Tansu::start("kafka-a").await;
    let dst = Ferry::start("dc-b").await?;
    create_topic(&k, "orders", 1).await;
    create_topic(&k, "payments", 1).await;
    let orders = produce(&k, "orders", 0, 50, 1, &[]).await;
    let mut payments = produce(&k, "payments", 0, 20, 2, &[]).await;
    let source = SideConf::new("kafka-a", "kafka", &k.bootstrap());
    let target = SideConf::new("dc-b", "ferry", &dst.addr());
    let mut mirror = start_mirror(&mirror_toml("kafka-a_to_dc-b", &source, &target, "identity", ".*", "")).await?;
    wait_ferry_leo(&dst, "orders", 0, 50).await?;
    wait_ferry_leo(&dst, "payments", 0, 20).await?;
    delete_topic(&k, "orders").await;
    let mut restarts = 0;
    // remove_topic, from the first process or from the one restarted after the documented crash.
    let event = loop {
        let found = ferry_testkit::wait_for("remove_topic for orders, or an exit", io_deadline(), async || {
            if !mirror.is_running() {
                return Ok::<_, anyhow::Error>(Some(None));
            }
            Ok(events(&mirror, "remove_topic").await?.into_iter().find(|e| e["topic"] == "orders").map(Some))
        })
        .await?;
        match found {
            Some(event) => break event,
            None => restart_after_the_documented_crash(&mut mirror, &mut restarts).await?,
        }
    };
    assert!(event["message"].as_str().is_some_and(|m| m.contains("orders")), "{event}");
    // Mirroring of the other topic goes on (the documented crash may also come a fetch or so after remove_topic).
    payments.extend(produce(&k, "payments", 0, 30, 3, &[]).await);
    loop {
        ferry_testkit::wait_until("payments/0 on dc-b to reach 50, or an exit", io_deadline(), async || {
            Ok::<_, anyhow::Error>(!mirror.is_running() || dst.leos("payments").await.first().is_some_and(|&l| l >= 50))
        })
        .await?;
        if mirror.is_running() {
            break;
        }
        restart_after_the_documented_crash(&mut mirror, &mut restarts).await?;
    }
    // Let ten discovery rounds (the configured 1 s each) pass in one process: a crash loop would show within them.
    let rounds = 10 * DISCOVERY_INTERVAL;
    loop {
        ferry_testkit::wait_until("ten discovery rounds, or an exit", ferry_testkit::deadline(&[rounds]), async || {
            if !mirror.is_running() {
                return Ok::<_, anyhow::Error>(true);
            }
            let status = monitor_get(&mirror, "/api/v1/status").await?;
            Ok(status["uptime_seconds"].as_u64().is_some_and(|s| s >= rounds.as_secs()))
        })
        .await?;
        if mirror.is_running() {
            break;
        }
        restart_after_the_documented_crash(&mut mirror, &mut restarts).await?;
    }
    assert_eq!(read_ferry(&dst, "orders", 0).await?, orders, "the target keeps what was copied");
    assert_eq!(consume(&k, "payments", 0, 0).await, payments);
    let got = read_ferry(&dst, "payments", 0).await?;
    assert_eq!(got.len(), 50);
    assert_eq!(digest(&got), digest(&payments), "every payments record copied once");
    assert_eq!(got, payments);

    // Any later start reports the topic as gone too: a mirror topic of this source whose source topic is gone.
    mirror.terminate(Duration::from_secs(20)).await?;
    mirror.restart().await?;
    let event = ferry_testkit::wait_for("remove_topic for orders after a restart", io_deadline(), async || {
        Ok::<_, anyhow::Error>(events(&mirror, "remove_topic").await?.into_iter().find(|e| e["topic"] == "orders"))
    })
    .await?;
    assert_eq!(event["details"]["target_topic"], "orders", "{event}");
    assert!(event["message"].as_str().is_some_and(|m| m.contains("the source topic is gone")), "{event}");
    assert_eq!(events(&mirror, "remove_topic").await?.len(), 1, "only orders is gone");
    mirror.terminate(Duration::from_secs(20)).await?;
    Ok(())
}

/// `[topics] discovery_interval` of [`mirror_toml`].
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(1);

/// The librdkafka version rdkafka-sys bundles, as Cargo.lock pins it (`4.10.0+2.12.1` gives `2.12.1`).
fn bundled_librdkafka() -> String {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).expect("read Cargo.lock");
    let package = lock.split("[[package]]").find(|p| p.contains("name = \"rdkafka-sys\"")).expect("rdkafka-sys");
    let version = package.lines().find_map(|l| l.strip_prefix("version = ")).expect("its version");
    version.trim_matches('"').split_once('+').expect("rdkafka-sys versions carry librdkafka's").1.to_owned()
}

/// Restarts a mirror that died of the crash docs/kafka.md documents, as a supervisor would, once. Fails on a second
/// death, on an exit other than SIGSEGV, and on a SIGSEGV when the bundled librdkafka is no longer 2.12.
async fn restart_after_the_documented_crash(
    mirror: &mut ferry_testkit::MirrorProcess,
    restarts: &mut u32,
) -> anyhow::Result<()> {
    use std::os::unix::process::ExitStatusExt;
    let status = mirror.process().exit_status();
    let librdkafka = bundled_librdkafka();
    anyhow::ensure!(
        *restarts == 0,
        "the mirror exited again ({status:?}) after its restart for the documented librdkafka 2.12 segfault in \
         rd_kafka_metadata_cache_find (docs/kafka.md, Known issues): a crash loop:\n{}",
        mirror.logs()
    );
    anyhow::ensure!(
        status.and_then(|s| s.signal()) == Some(ferry_testkit::Signal::SEGV.as_raw()),
        "the mirror exited ({status:?}), which is not the documented librdkafka 2.12 segfault in \
         rd_kafka_metadata_cache_find (docs/kafka.md, Known issues):\n{}",
        mirror.logs()
    );
    anyhow::ensure!(
        librdkafka.starts_with("2.12."),
        "the mirror died of a SIGSEGV with librdkafka {librdkafka}: docs/kafka.md documents the segfault in \
         rd_kafka_metadata_cache_find for librdkafka 2.12 only; check whether it remains, then update the docs and \
         this test:\n{}",
        mirror.logs()
    );
    *restarts += 1;
    tracing::warn!(
        ?status,
        librdkafka,
        "the mirror died of the documented librdkafka 2.12 segfault in rd_kafka_metadata_cache_find on the deleted \
         topic; restarting it once"
    );
    Ok(mirror.restart().await?)
}
