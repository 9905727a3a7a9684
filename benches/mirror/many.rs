//! Phase 5 of the mirror bench: many partitions on one mirror. `FERRY_BENCH_MANY_TOPICS` topics (default 1,000) of
//! 10 partitions each (10,000 partitions by default), one record in every partition. Prints the time from the
//! mirror's start until every partition is mirroring and its record is on the target, then, with no traffic, the
//! mirror's CPU and each broker's, with the machine's idle share beside them.
//!
//! A broker keeps two files open per partition (the active segment's log and index), so each needs an open-files
//! limit above twice its partitions (the shipped systemd unit sets 1,048,576). Where the limit the bench inherits is
//! lower and cannot be raised, the phase says so and runs the most topics that fit.
//!
//! `FERRY_BENCH_MANY_EXTRA` adds lines to the mirror's config (TOML, after its `[sync]` section):
//! `FERRY_BENCH_MANY_EXTRA=$'[verify]\nbytes_per_sec = "0"'` measures the idle CPU without the verifier, so the
//! difference from a run without it is the verifier's share.

use super::*;

/// Partitions per topic of the phase.
const PER_TOPIC: u32 = 10;
/// How long idle CPU is sampled.
const IDLE_SPAN: Duration = Duration::from_secs(20);
/// How long after the last partition started mirroring idle CPU is first sampled: the first verification lookups
/// and the last lanes' start-up work settle.
const SETTLE: Duration = Duration::from_secs(10);

/// The mirror's status totals: (partitions known, partitions mirroring, records appended, lag).
async fn totals(mirror: &MirrorProcess) -> Result<(u64, u64, u64, u64)> {
    let url = format!("{}/api/v1/status", mirror.monitor_url());
    let v: serde_json::Value = serde_json::from_str(&reqwest::get(&url).await?.text().await?)?;
    let t = &v["totals"];
    Ok((
        t["partitions"].as_u64().unwrap_or(0),
        t["partitions_by_state"]["mirroring"].as_u64().unwrap_or(0),
        t["records_out"].as_u64().unwrap_or(0),
        t["lag"].as_u64().unwrap_or(u64::MAX),
    ))
}

/// CPU share of one core each process in `pids` used over `span`, and the machine's idle share meanwhile.
async fn idle_shares(pids: &[u32], span: Duration) -> (Vec<f64>, f64) {
    let before: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let idle0 = support::cpu_idle_ticks();
    tokio::time::sleep(span).await;
    let shares = pids.iter().zip(before).map(|(p, b)| (cpu_seconds(*p) - b) / span.as_secs_f64()).collect();
    (shares, support::cpu_idle_share(idle0))
}

/// The soft limit of open files this process has (and the brokers it starts inherit), from `/proc/self/limits`.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Files a broker keeps open besides its partitions' (sockets, the catalog, the runtime).
const OTHER_FILES: u64 = 1024;

pub(super) async fn many() -> Result<()> {
    let asked: u32 = std::env::var("FERRY_BENCH_MANY_TOPICS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let fit = open_files_limit().map_or(u64::MAX, |l| l.saturating_sub(OTHER_FILES) / 2 / u64::from(PER_TOPIC));
    let topics = asked.min(u32::try_from(fit).unwrap_or(u32::MAX));
    if topics < asked {
        println!(
            "{asked} topics of {PER_TOPIC} need {} open files per broker, above this machine's limit of {}: running \
             {topics} topics ({} partitions)",
            u64::from(asked * PER_TOPIC) * 2 + OTHER_FILES,
            open_files_limit().unwrap_or(0),
            topics * PER_TOPIC
        );
    }
    let partitions = u64::from(topics * PER_TOPIC);
    let a = broker("dc-a").await?;
    let b = broker("dc-b").await?;
    let (a_addr, b_addr) = (a.addr().to_string(), b.addr().to_string());
    let (a_admin, b_admin) = (admin(&a_addr)?, admin(&b_addr)?);
    let client = BrokerClient::new(ClientConfig::new([a_addr.clone()]))?;
    let producer = Producer::new(client, ProducerConfig::default()).await?;
    let mut pending = Vec::new();
    for t in 0..topics {
        let topic = format!("many-{t:05}");
        a_admin.create_topic(&topic, PER_TOPIC, Default::default(), None).await?;
        for p in 0..PER_TOPIC {
            let value = Bytes::from(format!("{topic}/{p}"));
            pending.push(producer.send(ProducerRecord::new(topic.clone(), value).with_partition(p)).await?);
        }
    }
    for p in pending {
        p.await?;
    }
    producer.close().await;
    // The brokers at rest with the topics in place, before any mirror runs.
    let (shares, idle) = idle_shares(&[a.pid(), b.pid()], Duration::from_secs(5)).await;
    println!(
        "{partitions} partitions, no mirror yet: source broker {:.1}%, target broker {:.1}% of a core (machine idle \
         {:.0}%)",
        shares[0] * 100.0,
        shares[1] * 100.0,
        idle * 100.0
    );

    let idle0 = support::cpu_idle_ticks();
    let started = Instant::now();
    let extra = std::env::var("FERRY_BENCH_MANY_EXTRA").unwrap_or_default();
    let mut mirror = MirrorProcess::builder(mirror_config_with(&a_addr, &b_addr, "^many-", &extra))
        .program(bin_dir().join("ferry-mirror"))
        .start()
        .await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    // When every partition had a lane (discovery and the target topics done): the rest is the lanes' start.
    let mut all_known = None;
    loop {
        let (known, mirroring, out, lag) = totals(&mirror).await?;
        if known == partitions && all_known.is_none() {
            all_known = Some(started.elapsed().as_secs_f64());
        }
        if known == partitions && mirroring == partitions && out == partitions && lag == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{partitions} partitions not mirrored in time ({known} known, {mirroring} mirroring, {out} records \
                 appended, lag {lag}):\n{}",
                mirror.logs()
            );
        }
        // Not much more often: the status is computed over every partition, which costs the mirror.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = started.elapsed().as_secs_f64();
    let start_idle = support::cpu_idle_share(idle0);
    // What the mirror reported, checked on the target: every partition holds exactly its one record.
    let listed = b_admin.list_topics().await?;
    let mut on_target = 0u64;
    let mut mirrored_topics = 0;
    for t in listed.iter().filter(|t| t.name.starts_with("many-")) {
        mirrored_topics += 1;
        on_target += total_leo(&b_admin, &t.name).await?;
    }
    if mirrored_topics != topics || on_target != partitions {
        bail!("the target holds {on_target} records in {mirrored_topics} topics; expected {partitions} in {topics}");
    }
    println!(
        "{partitions} partitions: all mirroring after {took:.1} s (target < 10 s; every partition had a lane after \
         {:.1} s; machine idle {:.0}% meanwhile)",
        all_known.unwrap_or(took),
        start_idle * 100.0
    );
    tokio::time::sleep(SETTLE).await;
    let (shares, idle) = idle_shares(&[mirror.pid(), a.pid(), b.pid()], IDLE_SPAN).await;
    println!(
        "{partitions} partitions idle CPU over {} s from {} s after: mirror {:.1}% of a core (target < 5%); source \
         broker {:.1}%, target broker {:.1}% (machine idle {:.0}%)",
        IDLE_SPAN.as_secs(),
        SETTLE.as_secs(),
        shares[0] * 100.0,
        shares[1] * 100.0,
        shares[2] * 100.0,
        idle * 100.0
    );
    // What the verifier did meanwhile: its share of the idle CPU is verifying these partitions over and over.
    let (verified, passes) = verified(&mirror).await?;
    println!(
        "{partitions} partitions: {verified} had a verification pass completed, {passes} passes in all, by the end \
         of the idle span"
    );
    mirror.terminate(Duration::from_secs(30)).await?;
    Ok(())
}

/// Partitions whose verification completed a pass, and the passes completed over all partitions.
async fn verified(mirror: &MirrorProcess) -> Result<(u64, u64)> {
    let url = format!("{}/api/v1/partitions", mirror.monitor_url());
    let v: serde_json::Value = serde_json::from_str(&reqwest::get(&url).await?.text().await?)?;
    let passes: Vec<u64> = v["partitions"]
        .as_array()
        .map(|ps| ps.iter().map(|p| p["verify"]["passes_completed"].as_u64().unwrap_or(0)).collect())
        .unwrap_or_default();
    Ok((passes.iter().filter(|&&n| n > 0).count() as u64, passes.iter().sum()))
}
