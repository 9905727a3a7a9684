//! Issue 11's defects of a target that is down, or of one target partition that cannot be written:
//!
//! - **Position heartbeats coalesce.** The source sends every fetched partition's position on every beat. While the
//!   target is down, every lane sits in append retries; the positions it has not read yet are coalesced (the
//!   newest wins) instead of queued. With 200 partitions and a 20 ms beat (10,000 positions a second; the broker
//!   honours beats down to the mirror's 10 ms lower bound), the mirror's resident set does not grow over 1,500
//!   beats. Before the fix each partition's positions waited in an unbounded channel its blocked task did not read:
//!   up to 300,000 queued messages of about 130 bytes each, some 37 MiB.
//! - **A partition stuck in append retries delays only itself.** One target partition cannot roll its segment (a
//!   directory sits where its next segment file must go), so every append to it fails with a storage error and is
//!   retried. The others keep mirroring, also across a fetch-stream restart (a manual route switch): they catch up
//!   to the source's exact log ends within the bound of a restart, far below the 60 s that every restart waited for
//!   every lane to acknowledge a reset before the fix. The stuck partition shows `stalled`, its target holds exactly
//!   the source's records below the failed roll, and it catches up once the obstacle is gone.
//! - **A target down at startup raises the alarm.** The mirror starts while its target hangs (blackholed): the
//!   monitor serves, the target probe raises `target_net_not_available`, `/readyz` is 503 `target_down`; once the
//!   target is back `target_net_recovered` follows, `/readyz` is 200 and the target ends identical. The same holds
//!   for an idle, caught-up mirror whose target goes away (no append fails, only the probe can tell). Before the fix
//!   only failed appends raised the alarm, and the startup read of the target's topics blocked the monitor.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferry_client::ProducerRecord;
use ferry_client::admin::TopicConfig;
use ferry_testkit::{MirrorProcess, Proxy, deadline, wait_for, wait_until};

use crate::common::*;

/// The mirror's retry policy's longest back-off (`run::retry_policy`): a failed fetch session or append waits at
/// most this long before its next attempt.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// `[source.health] check_interval` of [`MirrorConf`]; `[target.health]` defaults to it.
const SOURCE_CHECK: Duration = Duration::from_millis(500);

/// `[source.health] timeout` of [`MirrorConf`].
const SOURCE_TIMEOUT: Duration = Duration::from_secs(1);

/// `failure_threshold` of a health section left at its default.
const DEFAULT_THRESHOLD: u32 = 3;

/// Produces `count` records of `tag` (indexes `from..from + count`) to every partition of `topic`.
async fn produce_everywhere(
    p: &ferry_client::Producer,
    topic: &str,
    partitions: u32,
    tag: &str,
    from: u64,
    count: u64,
) -> anyhow::Result<()> {
    let records = (0..partitions)
        .flat_map(|partition| (from..from + count).map(move |i| (partition, i)))
        .map(|(partition, i)| record(topic, tag, i, 64).with_partition(partition));
    send_all(p, records).await
}

/// `config` with a `[target.health]` table.
fn with_target_health(config: &str, check_interval: Duration, timeout: Duration, failure_threshold: u32) -> String {
    let table = format!(
        "[target.health]\ncheck_interval = \"{}\"\ntimeout = \"{}\"\nfailure_threshold = {failure_threshold}\n\n[topics]",
        dur(check_interval),
        dur(timeout)
    );
    config.replacen("[topics]", &table, 1)
}

/// The status code and JSON body of `GET /readyz`.
async fn readyz(mirror: &MirrorProcess) -> anyhow::Result<(u16, serde_json::Value)> {
    let response = reqwest::get(format!("{}/readyz", mirror.monitor_url())).await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

/// Whether `/readyz` answers 503 naming `target_down`.
async fn not_ready_target_down(mirror: &MirrorProcess) -> anyhow::Result<bool> {
    let (status, body) = readyz(mirror).await?;
    Ok(status == 503 && body["reasons"].as_array().is_some_and(|r| r.contains(&"target_down".into())))
}

/// Wall-clock ms, as event timestamps are.
fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Waits for an event of `kind` raised at or after `since_ms` and returns it.
async fn wait_event(
    mirror: &MirrorProcess,
    kind: &str,
    since_ms: i64,
    limit: Duration,
) -> anyhow::Result<serde_json::Value> {
    wait_for(&format!("{kind} (raised after {since_ms})"), limit, async || -> anyhow::Result<Option<_>> {
        let events = monitor_events(mirror, Some(kind)).await?;
        Ok(events.into_iter().find(|e| e["timestamp_ms"].as_i64().is_some_and(|t| t >= since_ms)))
    })
    .await
}

/// Asserts that `event` is the whole-target alarm or its recovery: no topic, partition or route (alarm key
/// `{kind}/-/-/-`).
fn assert_target_wide(event: &serde_json::Value, kind: &str, severity: &str) {
    assert_eq!(event["kind"], kind, "{event}");
    assert_eq!(event["severity"], severity, "{event}");
    assert_eq!(event["cleared"], false, "{event}");
    for key in ["topic", "partition", "route"] {
        assert!(event.get(key).is_none(), "{kind} names no {key}: {event}");
    }
}

// ---- position heartbeats -------------------------------------------------------------------------------------

const HB_TOPICS: u32 = 4;
const HB_PARTITIONS: u32 = 50;
/// `sync.position_heartbeat`: 200 partitions at this beat are 10,000 positions a second.
const HEARTBEAT: Duration = Duration::from_millis(20);
/// Beats let pass after the warm-up, each carrying every partition's position.
const BEATS: u32 = 1_500;
/// Beats of warm-up with the target down before the first sample: every lane is in append retries by then and the
/// allocator has settled.
const WARM_UP_BEATS: u32 = 100;
/// How much the resident set may grow over [`BEATS`].
const RSS_SLACK: u64 = 16 << 20;

fn hb_topic(i: u32) -> String {
    format!("beats-{i}")
}

/// Position beats `broker` sent on its subscribe streams so far (`ferry_broker_subscribe_beats_total`).
async fn beats_sent(broker: &ferry_testkit::BrokerProcess) -> anyhow::Result<u64> {
    let addr = broker.metrics_addr().ok_or_else(|| anyhow::anyhow!("no metrics address in the broker's log"))?;
    let text = reqwest::get(format!("http://{addr}/metrics")).await?.error_for_status()?.text().await?;
    let line = text.lines().find_map(|l| l.strip_prefix("ferry_broker_subscribe_beats_total "));
    Ok(line.ok_or_else(|| anyhow::anyhow!("no beat counter in:\n{text}"))?.trim().parse()?)
}

/// Waits until `broker` sent `total` beats, `beats` of them from now on: within `beats` heartbeats, with margin.
async fn wait_for_beats(broker: &ferry_testkit::BrokerProcess, total: u64, beats: u32) -> anyhow::Result<()> {
    wait_until(&format!("{total} beats sent"), deadline(&[HEARTBEAT * beats]), async || {
        beats_sent(broker).await.map(|sent| sent >= total)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn position_heartbeats_coalesce_while_the_target_is_down() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    let topics: Vec<String> = (0..HB_TOPICS).map(hb_topic).collect();
    let p = producer(&a).await?;
    for topic in &topics {
        a.create_topic(topic, HB_PARTITIONS).await?;
        produce_everywhere(&p, topic, HB_PARTITIONS, "before", 0, 4).await?;
    }
    let t = Proxy::start(b.broker.addr()).await?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.target_brokers = t.addr().to_string();
    conf.sync_extra = vec![format!("position_heartbeat = \"{}\"", dur(HEARTBEAT))];
    let mirror = conf.start().await?;
    for topic in &topics {
        wait_caught_up(&a, topic, &b, topic, io_deadline()).await?;
    }
    // The mirror must have heard every append's answer too: the cut below could drop one in flight.
    let all = (HB_TOPICS * HB_PARTITIONS) as usize;
    wait_owned(&mirror, "every append's answer to reach the mirror", io_deadline(), |rows| {
        rows.len() == all && rows.values().all(|r| r.cache_offset == 4)
    })
    .await?;

    // The target goes away; new records for every partition put every lane into append retries.
    let cut_at = now_ms();
    t.cut();
    for topic in &topics {
        produce_everywhere(&p, topic, HB_PARTITIONS, "during", 4, 3).await?;
    }
    p.close().await;
    let alarm_limit = deadline(&[SOURCE_CHECK * DEFAULT_THRESHOLD, SOURCE_TIMEOUT * DEFAULT_THRESHOLD]);
    wait_event(&mirror, "target_net_not_available", cut_at, alarm_limit).await?;
    // Every lane knows of its 3 new records (lag 3) and has appended none of them (cache 4).
    wait_owned(&mirror, "every partition to see its new records", io_deadline(), |rows| {
        rows.len() == all && rows.values().all(|r| r.lag == 3 && r.cache_offset == 4)
    })
    .await?;

    // The beats are the load: the source broker counts those it sent, each carrying every partition's position.
    let start = beats_sent(&a.broker).await?;
    wait_for_beats(&a.broker, start + u64::from(WARM_UP_BEATS), WARM_UP_BEATS).await?;
    let warm = rss_bytes(mirror.pid())?;
    wait_for_beats(&a.broker, start + u64::from(WARM_UP_BEATS + BEATS), BEATS).await?;
    let end = rss_bytes(mirror.pid())?;
    tracing::info!(warm_mib = warm >> 20, end_mib = end >> 20, "mirror resident set over {BEATS} beats");
    assert!(
        end <= warm + RSS_SLACK,
        "the mirror's RSS grew from {} KiB to {} KiB over {BEATS} beats of {HEARTBEAT:?} with the target down \
         (allowed: {} KiB more)",
        warm >> 10,
        end >> 10,
        RSS_SLACK >> 10
    );
    let rows = monitor_partitions(&mirror).await?;
    assert!(rows.values().all(|r| r.cache_offset == 4 && r.lag == 3), "nothing was appended while down: {rows:?}");
    for topic in &topics {
        assert_eq!(b.leos(topic).await?, vec![4; HB_PARTITIONS as usize], "{topic} on dc-b while the target is down");
    }

    t.restore();
    for topic in &topics {
        wait_caught_up(&a, topic, &b, topic, io_deadline()).await?;
        assert_identical(&a, topic, &b, topic).await?;
        assert_eq!(b.leos(topic).await?, vec![7; HB_PARTITIONS as usize], "{topic}: every record, once");
    }
    Ok(())
}

// ---- one stuck partition -------------------------------------------------------------------------------------

const STUCK_TOPIC: &str = "orders";
const STUCK_PARTITIONS: u32 = 4;
/// The partition whose target cannot roll its segment.
const STUCK: u32 = 2;
/// The topic's `segment_bytes`, copied to the target topic: the brokers' `max_batch_bytes` (1 MiB by default),
/// the smallest segment a broker keeps.
const SEGMENT: u64 = 1 << 20;
/// Records in each partition before the obstacle.
const PHASE_1: u64 = 50;
/// `sync.stall_check_interval` and the rules' `stall_after` of this test.
const STALL_CHECK: Duration = Duration::from_millis(200);
const STALL_AFTER: Duration = Duration::from_secs(1);
const TOKEN: &str = "target-down-token";

/// The number of fetch sessions the mirror has opened so far, from its log.
fn sessions_opened(mirror: &MirrorProcess) -> usize {
    mirror.logs().lines().filter(|l| l.contains("source fetch stream open")).count()
}

/// Compares `partition` of the source and the target up to the target's log end, and returns that log end.
async fn assert_target_is_source_prefix(a: &Dc, b: &Dc, topic: &str, partition: u32) -> anyhow::Result<u64> {
    let dst = read_partition(&b.client, topic, partition, None).await?;
    let src = read_partition(&a.client, topic, partition, Some(dst.log_end)).await?;
    let what = format!("{topic}/{partition} up to the target's log end {}", dst.log_end);
    dst.assert_contiguous(&format!("target {what}"));
    assert_same_partition(&what, &src, &dst);
    Ok(dst.log_end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_stuck_in_append_retries_delays_only_itself() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    let config = TopicConfig { segment_bytes: Some(SEGMENT), ..Default::default() };
    a.admin.create_topic(STUCK_TOPIC, STUCK_PARTITIONS, config, None).await?;
    let p = producer(&a).await?;
    produce_everywhere(&p, STUCK_TOPIC, STUCK_PARTITIONS, "one", 0, PHASE_1).await?;

    // Stalls show after 1 s without progress; two routes into the source, so that the fetch stream can be moved.
    let rules = tempfile::tempdir()?;
    let rules_file = rules.path().join("rules.toml");
    std::fs::write(&rules_file, format!("[thresholds]\nstall_after = \"{}\"\n", dur(STALL_AFTER)))?;
    let mut conf = MirrorConf::new(&a, &b);
    conf.sync_extra = vec![format!("stall_check_interval = \"{}\"", dur(STALL_CHECK))];
    let routes = format!(
        "[[source.routes]]\nname = \"primary\"\nbrokers = [\"{src}\"]\n\n[[source.routes]]\nname = \"backup\"\n\
         brokers = [\"{src}\"]\n\n[source.health]\ncheck_interval = \"{check}\"\ntimeout = \"{timeout}\"\n",
        src = a.addr(),
        check = dur(SOURCE_CHECK),
        timeout = dur(SOURCE_TIMEOUT)
    );
    let text =
        format!("{}\n[alarms]\nrules = {:?}\n", conf.toml_with_routes(&routes), rules_file.display().to_string());
    let mirror = MirrorProcess::builder(text).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    wait_caught_up(&a, STUCK_TOPIC, &b, STUCK_TOPIC, io_deadline()).await?;
    assert_identical(&a, STUCK_TOPIC, &b, STUCK_TOPIC).await?;

    // The obstacle: a directory where the stuck partition's next segment file goes. The next record fills a whole
    // batch (2 KiB short of the segment size; the first records took more than that), so its append must roll the
    // segment there first, and fails before writing anything (a storage error, which the mirror retries). The other
    // partitions get more records and keep mirroring.
    let obstacle = segment_file(&b, STUCK_TOPIC, STUCK, PHASE_1);
    std::fs::create_dir(&obstacle)?;
    let big = ProducerRecord::new(STUCK_TOPIC, Bytes::from(vec![b'x'; SEGMENT as usize - 2048]))
        .with_partition(STUCK)
        .with_key("big")
        .with_header("seq", PHASE_1.to_string())
        .with_timestamp(BASE_TS + PHASE_1 as i64);
    send_all(&p, [big]).await?;
    let flowing: Vec<u32> = (0..STUCK_PARTITIONS).filter(|&q| q != STUCK).collect();
    send_all(
        &p,
        flowing
            .iter()
            .flat_map(|&q| (PHASE_1..2 * PHASE_1).map(move |i| record(STUCK_TOPIC, "two", i, 64).with_partition(q))),
    )
    .await?;
    let stuck_key = (STUCK_TOPIC.to_owned(), STUCK);
    let stall_limit = deadline(&[STALL_AFTER, STALL_CHECK, MAX_BACKOFF]);
    let rows = wait_owned(&mirror, "the stuck partition to show stalled", stall_limit, |rows| {
        rows.get(&stuck_key).is_some_and(|r| r.state == "stalled")
    })
    .await?;
    let row = &rows[&stuck_key];
    assert_eq!((row.cache_offset, row.target_offset, row.lag), (PHASE_1, PHASE_1, 1), "{row:?}");
    // The retried error shows, naming the partition; the broker keeps its on-disk paths to its own log.
    let error = row.last_error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with(&format!("target: storage error on {STUCK_TOPIC}/{STUCK}: "))
            && error.contains("the broker's log names the file")
            && !error.contains(&b.broker.data_dir().display().to_string()),
        "{row:?}"
    );

    // A fetch-stream restart while the partition is stuck: a manual switch to the other route.
    wait_until("the backup route to be healthy", deadline(&[SOURCE_CHECK, SOURCE_TIMEOUT]), async || {
        let egress = monitor_get(&mirror, "/api/v1/egress").await?;
        let routes = egress["routes"].as_array().cloned().unwrap_or_default();
        anyhow::Ok(routes.iter().any(|r| r["name"] == "backup" && r["healthy"] == true))
    })
    .await?;
    let opened = sessions_opened(&mirror);
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/egress/switch", mirror.monitor_url()))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"route": "backup"}))
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 200, "{}", response.text().await?);
    // The new session starts at once (a route change restarts it without a back-off); its partitions resume
    // after at most one back-off of a failed start and a heartbeat.
    let restart_limit = deadline(&[MAX_BACKOFF, SOURCE_CHECK, Duration::from_millis(500)]);
    wait_until("a new fetch session over the backup route", restart_limit, async || sessions_opened(&mirror) > opened)
        .await?;

    // New records everywhere after the restart: the flowing partitions reach the source's exact log ends within
    // the restart bound.
    produce_everywhere(&p, STUCK_TOPIC, STUCK_PARTITIONS, "three", 2 * PHASE_1, PHASE_1).await?;
    let source_leos = a.leos(STUCK_TOPIC).await?;
    assert_eq!(source_leos, vec![3 * PHASE_1, 3 * PHASE_1, 2 * PHASE_1 + 1, 3 * PHASE_1]);
    wait_until("the flowing partitions to catch up after the restart", restart_limit, async || {
        let target = b.leos(STUCK_TOPIC).await?;
        anyhow::Ok(flowing.iter().all(|&q| target[q as usize] == source_leos[q as usize]))
    })
    .await?;
    for &q in &flowing {
        let src = read_partition(&a.client, STUCK_TOPIC, q, None).await?;
        let dst = read_partition(&b.client, STUCK_TOPIC, q, None).await?;
        let what = format!("{STUCK_TOPIC}/{q}");
        src.assert_contiguous(&format!("source {what}"));
        dst.assert_contiguous(&format!("target {what}"));
        assert_same_partition(&what, &src, &dst);
    }
    // The stuck partition: still stalled, nothing written past the failed roll, nothing wrong below it.
    assert_eq!(assert_target_is_source_prefix(&a, &b, STUCK_TOPIC, STUCK).await?, PHASE_1);
    // The monitor agrees once the lanes have taken in the last acknowledgements and positions.
    let expected = |q: u32| {
        if q == STUCK { ("stalled", PHASE_1, source_leos[q as usize] - PHASE_1) } else { ("mirroring", 3 * PHASE_1, 0) }
    };
    wait_owned(&mirror, "the monitor to show the stuck and the flowing partitions", restart_limit, |rows| {
        (0..STUCK_PARTITIONS).all(|q| {
            rows.get(&(STUCK_TOPIC.to_owned(), q))
                .is_some_and(|r| (r.state.as_str(), r.cache_offset, r.lag) == expected(q))
        })
    })
    .await?;
    let stalled = monitor_events(&mirror, Some("partition_stalled")).await?;
    assert!(
        stalled.iter().any(|e| e["topic"] == STUCK_TOPIC && e["partition"] == STUCK && e["cleared"] == false),
        "partition_stalled for {STUCK_TOPIC}/{STUCK}: {stalled:?}"
    );
    // One partition's storage error is the target answering: the target is reachable, no target alarm (the
    // other partitions' successes keep it so too; `lane::io` unit-tests which failures count).
    let target_down = monitor_events(&mirror, Some("target_net_not_available")).await?;
    assert!(target_down.is_empty(), "a partition's storage error is not the target being down: {target_down:?}");

    // The obstacle gone, the next retry rolls the segment and the partition catches up.
    std::fs::remove_dir(&obstacle)?;
    p.close().await;
    wait_caught_up(&a, STUCK_TOPIC, &b, STUCK_TOPIC, io_deadline()).await?;
    assert_identical(&a, STUCK_TOPIC, &b, STUCK_TOPIC).await?;
    assert_eq!(b.leos(STUCK_TOPIC).await?, source_leos);
    Ok(())
}

// ---- a target down at startup --------------------------------------------------------------------------------

const START_TOPIC: &str = "orders";
const START_PARTITIONS: u32 = 2;
const START_RECORDS: u64 = 300;
/// `[target.health]` of this test.
const TARGET_CHECK: Duration = Duration::from_millis(200);
const TARGET_TIMEOUT: Duration = Duration::from_millis(200);
const TARGET_THRESHOLD: u32 = 2;
/// The target client's HTTP/2 keepalive interval and timeout (`sides::target_client_config`): a connection that
/// hangs (blackholed) is dropped after these, and the next call connects afresh.
const TARGET_KEEPALIVE: Duration = Duration::from_secs(2 + 5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_down_at_startup_raises_the_alarm_makes_readyz_503_and_recovers() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(START_TOPIC, START_PARTITIONS).await?;
    let p = producer(&a).await?;
    produce_everywhere(&p, START_TOPIC, START_PARTITIONS, "start", 0, START_RECORDS).await?;
    p.close().await;

    // The target hangs from the start: connections are accepted and never answered.
    let t = Proxy::start(b.broker.addr()).await?;
    t.blackhole();
    let mut conf = MirrorConf::new(&a, &b);
    conf.target_brokers = t.addr().to_string();
    let text = with_target_health(&conf.toml(), TARGET_CHECK, TARGET_TIMEOUT, TARGET_THRESHOLD);
    let started_at = now_ms();
    let mirror = MirrorProcess::builder(text).start().await?;

    // The monitor serves; the probe fails `failure_threshold` times, each within its timeout.
    let status = monitor_get(&mirror, "/api/v1/status").await?;
    assert_eq!(status["mirror"], conf.name, "{status}");
    let alarm_limit = deadline(&[TARGET_CHECK * TARGET_THRESHOLD, TARGET_TIMEOUT * TARGET_THRESHOLD]);
    let alarm = wait_event(&mirror, "target_net_not_available", started_at, alarm_limit).await?;
    assert_target_wide(&alarm, "target_net_not_available", "critical");
    assert_eq!(monitor_get(&mirror, "/api/v1/status").await?["target_down"], true);
    wait_until("/readyz 503 target_down", alarm_limit, async || not_ready_target_down(&mirror).await).await?;
    // While the target cannot answer, nothing recovers and the alarm is raised once.
    assert_eq!(monitor_events(&mirror, Some("target_net_not_available")).await?.len(), 1);
    assert!(monitor_events(&mirror, Some("target_net_recovered")).await?.is_empty());
    assert!(!b.has_topic(START_TOPIC).await?, "nothing reached the target");

    // The target is back: the hung connection is dropped by keepalive, the next probe succeeds.
    let restored_at = now_ms();
    t.restore();
    let recovery_limit = deadline(&[TARGET_KEEPALIVE, TARGET_CHECK, TARGET_TIMEOUT]);
    let recovered = wait_event(&mirror, "target_net_recovered", restored_at, recovery_limit).await?;
    assert_target_wide(&recovered, "target_net_recovered", "info");
    wait_caught_up(&a, START_TOPIC, &b, START_TOPIC, io_deadline()).await?;
    assert_identical(&a, START_TOPIC, &b, START_TOPIC).await?;
    assert_eq!(b.leos(START_TOPIC).await?, vec![START_RECORDS; START_PARTITIONS as usize]);
    wait_until("/readyz 200", io_deadline(), async || anyhow::Ok(readyz(&mirror).await?.0 == 200)).await?;

    // Idle and caught up, the target goes away: no append runs, and the probe alone raises the alarm.
    let cut_at = now_ms();
    t.cut();
    let alarm = wait_event(&mirror, "target_net_not_available", cut_at, alarm_limit).await?;
    assert_target_wide(&alarm, "target_net_not_available", "critical");
    wait_until("/readyz 503 target_down (idle)", alarm_limit, async || not_ready_target_down(&mirror).await).await?;
    let restored_at = now_ms();
    t.restore();
    // A cut resets the connections: the next probe connects afresh.
    let recovered =
        wait_event(&mirror, "target_net_recovered", restored_at, deadline(&[TARGET_CHECK, TARGET_TIMEOUT])).await?;
    assert_target_wide(&recovered, "target_net_recovered", "info");
    wait_until("/readyz 200 (idle)", alarm_limit, async || anyhow::Ok(readyz(&mirror).await?.0 == 200)).await?;
    assert_identical(&a, START_TOPIC, &b, START_TOPIC).await?;
    assert_eq!(b.leos(START_TOPIC).await?, vec![START_RECORDS; START_PARTITIONS as usize]);
    Ok(())
}
