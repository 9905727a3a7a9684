//! A randomized fault soak with an independent oracle, in the manner of Jepsen.
//!
//! **Setup.** A source broker and a target broker (real processes, both with `flush = "async"` and a short flush
//! interval). The source is reached through two routes, each through its own testkit proxy, so a route can be
//! cut or blackholed. Two mirror processes with the same `mirror.name` share the partitions (scale-out), with
//! `on_divergence = "truncate"` so that the target converges whatever the source loses.
//!
//! **Load and oracle.** A keyed producer runs throughout and records every acknowledged record (partition,
//! offset, digest of timestamp, key, value and headers, and when the acknowledgement came). A reader of the
//! target polls each partition's log end and reads its records round after round, re-reading the recent ones; it
//! records every record it finds changed at an offset it had read, and every log end lower than one it had seen.
//!
//! **Faults** (see `faults`): drawn one at a time from the seed, each healed before the next with a short pause:
//! mirror kill -9 and restart; source or target broker crash with tail loss; route cut and blackhole; SIGHUP to a
//! mirror; scale-out membership change (SIGTERM, later a restart).
//!
//! **At the end** faults and load stop and both mirrors catch up. Then:
//! - the target equals the source exactly, partition by partition: count, records digest and batches digest
//!   (offsets, timestamps, keys, values, headers, epochs, CRCs), contiguous, no duplicate;
//! - the reader's reads never went backwards: every change it saw (and every record it read that the final target
//!   no longer holds) is explained by a truncation a mirror logged after `partition_diverged`, or by a target
//!   crash the schedule did, that happened between the two observations and reached down to that offset;
//! - the source holds every acknowledged record at its offset with its digest, except records a source crash cut
//!   (acknowledged before that crash, at or above where its cut left the log). A lost record the target had
//!   copied (the reader saw it there) is covered by the previous check: its removal from the target needs a
//!   `partition_diverged` truncation (or a target crash). The lost records are counted and printed, with how
//!   many of them had been mirrored.
//!
//! **Seed.** `FERRY_TEST_SEED` (decimal) or a fixed default; printed at the start. The seed fixes the fault
//! sequence, its holds and pauses, and the cuts; the interleaving with the processes' own timing is not fixed, so
//! a replay hits the same faults in the same order, not always at the same records. Unlike the testkit's
//! `test_seed`, which draws a random seed when the variable is unset, the soak falls back to a fixed default, so
//! that CI runs the same fault schedule every time; other schedules are for long runs with a chosen seed.
//!
//! **Logs.** With `FERRY_SOAK_LOGS=DIR` the brokers' and mirrors' logs and the partitions' epoch checkpoints
//! are copied into DIR before the checks, for a look at a failure.
//!
//! **Short and long.** By default the fault phase lasts [`SHORT_FAULT_PHASE`] with a small load, so the whole
//! test stays around a minute in CI. `FERRY_SOAK_SECS=600` makes it a ten-minute soak; nextest's default profile
//! stops a test after ten minutes, so run a long soak with the `soak` profile:
//! `FERRY_SOAK_SECS=600 cargo nextest run --profile soak --test mirror soak`.

mod faults;
pub(crate) mod oracle;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use ferry_testkit::{MirrorProcess, Proxy, deadline};
use tokio_util::sync::CancellationToken;

use crate::common::*;
use oracle::{Explainers, History};

const TOPIC: &str = "soak";
const PARTITIONS: u32 = 4;
/// How many violations a failure lists.
const SHOWN: usize = 20;

/// How long faults are injected by default (CI).
pub const SHORT_FAULT_PHASE: Duration = Duration::from_secs(45);
/// The seed when `FERRY_TEST_SEED` is not set.
const DEFAULT_SEED: u64 = 20_260_601;

/// `source.health` of both mirrors: fast probes, so that a route fault is noticed and acted on within a fault's
/// hold.
const CHECK_INTERVAL: Duration = Duration::from_millis(200);
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
const FAILURE_THRESHOLD: u32 = 2;
const SWITCH_AFTER: Duration = Duration::from_millis(500);
const MIN_SWITCH_INTERVAL: Duration = Duration::from_secs(1);

/// Both brokers: async flush with a short interval, the setting under which a crash may lose acknowledged
/// records.
const SOAK_BROKER_CONFIG: &str =
    "[storage]\nflush = \"async\"\nflush_interval = \"100ms\"\nretention_check_interval = \"200ms\"\n";

/// The seed of this run: `FERRY_TEST_SEED`, else [`DEFAULT_SEED`].
fn test_seed() -> u64 {
    match std::env::var("FERRY_TEST_SEED") {
        Ok(s) => s.trim().parse().unwrap_or_else(|_| panic!("FERRY_TEST_SEED={s:?} is not a decimal u64")),
        Err(_) => DEFAULT_SEED,
    }
}

/// The fault phase: `FERRY_SOAK_SECS` seconds, else [`SHORT_FAULT_PHASE`].
fn fault_phase() -> Duration {
    match std::env::var("FERRY_SOAK_SECS") {
        Ok(s) => Duration::from_secs(
            s.trim().parse().unwrap_or_else(|_| panic!("FERRY_SOAK_SECS={s:?} is not a number of seconds")),
        ),
        Err(_) => SHORT_FAULT_PHASE,
    }
}

fn routes_toml(routes: &[Proxy]) -> String {
    let mut out = String::new();
    for (i, r) in routes.iter().enumerate() {
        out.push_str(&format!("[[source.routes]]\nname = \"route-{i}\"\nbrokers = [\"{}\"]\n\n", r.addr()));
    }
    out.push_str(&format!(
        "[source.health]\ncheck_interval = \"{}\"\ntimeout = \"{}\"\nfailure_threshold = {FAILURE_THRESHOLD}\n\
         switch_after = \"{}\"\nmin_switch_interval = \"{}\"\n",
        dur(CHECK_INTERVAL),
        dur(PROBE_TIMEOUT),
        dur(SWITCH_AFTER),
        dur(MIN_SWITCH_INTERVAL),
    ));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_faults_leave_the_target_equal_to_the_source_and_lose_only_cut_records() -> anyhow::Result<()> {
    let seed = test_seed();
    let phase = fault_phase();
    eprintln!("soak: seed {seed} (replay with FERRY_TEST_SEED={seed}), fault phase {phase:?}");
    tracing::info!(seed, ?phase, "soak starts");

    let (a, b) = tokio::join!(Dc::start_with("dc-a", SOAK_BROKER_CONFIG), Dc::start_with("dc-b", SOAK_BROKER_CONFIG));
    let (mut a, mut b) = (a?, b?);
    a.create_topic(TOPIC, PARTITIONS).await?;
    let routes = [Proxy::start(a.broker.addr()).await?, Proxy::start(a.broker.addr()).await?];
    let mut conf = MirrorConf::new(&a, &b);
    conf.on_divergence = "truncate".into();
    let config = conf.toml_with_routes(&routes_toml(&routes));
    let (m0, m1) = tokio::join!(MirrorProcess::builder(&config).start(), MirrorProcess::builder(&config).start());
    let mut mirrors = [m0?, m1?];

    let stop_load = CancellationToken::new();
    let load = oracle::spawn_producer(client_for(a.addr()), TOPIC, stop_load.clone());
    let stop_reader = CancellationToken::new();
    let reader = oracle::spawn_reader(client_for(b.addr()), TOPIC, PARTITIONS, stop_reader.clone());

    let history = History::default();
    let mut schedule = faults::Schedule {
        rng: faults::Schedule::rng(seed),
        source: &mut a,
        target: &mut b,
        routes: &routes,
        mirrors: &mut mirrors,
        history: history.clone(),
        topic: TOPIC,
        partitions: PARTITIONS,
    };
    let done = schedule.run(phase).await.with_context(|| format!("seed {seed}"))?;
    eprintln!("soak: faults done: {done:?}");

    stop_load.cancel();
    let load = load.await?.with_context(|| format!("seed {seed}: the producer"))?;
    wait_settled(&a, &b, &mirrors).await.with_context(|| format!("seed {seed}"))?;
    stop_reader.cancel();
    let mut seen = reader.await?.with_context(|| format!("seed {seed}: the reader"))?;

    if let Ok(dir) = std::env::var("FERRY_SOAK_LOGS") {
        keep_logs(std::path::Path::new(&dir), &a, &b, &mirrors)?;
    }

    // 1. The target equals the source exactly.
    let source = assert_identical(&a, TOPIC, &b, TOPIC).await?;
    let crashes = history.crashes();
    let mut truncations = Vec::new();
    for (i, m) in mirrors.iter().enumerate() {
        truncations.extend(oracle::truncations(i, &m.logs(), TOPIC).with_context(|| format!("seed {seed}"))?);
    }

    // 2. The reader's reads never went backwards without a truncation or a target crash in between.
    seen.compare_final(&source, oracle::now_us());
    let explainers = Explainers { crashes: &crashes, truncations: &truncations };
    let (mut by_crash, mut by_truncation, mut unexplained) = (0, 0, Vec::new());
    for a in &seen.anomalies {
        match explainers.explain(a) {
            Some(oracle::Explanation::TargetCrash) => by_crash += 1,
            Some(oracle::Explanation::Truncation) => by_truncation += 1,
            None => unexplained.push(a.to_string()),
        }
    }
    assert!(
        unexplained.is_empty(),
        "seed {seed}: the target went back {} times without a truncation or a target crash to explain it; the \
         first ones:\n{}\ntruncations: {truncations:?}\ncrashes: {crashes:?}",
        unexplained.len(),
        unexplained[..unexplained.len().min(SHOWN)].join("\n")
    );

    // 3. The source holds every acknowledged record but those a source crash cut.
    let (lost, violations) = oracle::lost_records(&load, &source, &crashes);
    assert!(
        violations.is_empty(),
        "seed {seed}: {} acknowledged records lost without a cut; the first ones:\n{}\ncrashes: {crashes:?}",
        violations.len(),
        violations[..violations.len().min(SHOWN)].join("\n")
    );
    let mirrored_then_lost = lost.iter().filter(|r| seen.saw(r.partition, r.offset, &r.digest)).count();

    let held: u64 = source.iter().map(|p| p.records.len() as u64).sum();
    let source_crashes = crashes.iter().filter(|c| c.side == oracle::Side::Source).count();
    eprintln!(
        "soak: seed {seed}: {} records acknowledged ({} failed), {held} on both sides at the end; \
         {} acknowledged records lost to {source_crashes} source crashes ({mirrored_then_lost} of them had been \
         mirrored, and their removal from the target is among the changes explained); {} partition_diverged \
         ({} raised by mirror 0) on partitions {:?}; {} reader rounds, {} changes seen, all explained ({by_truncation} by a truncation, \
         {by_crash} by a target crash); {} target crashes",
        load.acked.len(),
        load.failed,
        lost.len(),
        truncations.len(),
        truncations.iter().filter(|t| t.mirror == 0).count(),
        oracle::truncated_partitions(&truncations),
        seen.rounds,
        seen.anomalies.len(),
        crashes.len() - source_crashes,
    );
    assert!(!load.acked.is_empty() && seen.rounds > 0, "seed {seed}: the load and the reader ran");
    Ok(())
}

/// Copies the brokers' and mirrors' logs and the partitions' epoch checkpoints into `dir`, for a look after the
/// run (the processes' temp dirs go with the test).
fn keep_logs(dir: &std::path::Path, a: &Dc, b: &Dc, mirrors: &[MirrorProcess]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, dc) in [("source", a), ("target", b)] {
        std::fs::copy(dc.broker.log_path(), dir.join(format!("{name}.log")))?;
        for p in 0..PARTITIONS {
            let checkpoint = dc.broker.data_dir().join(TOPIC).join(p.to_string()).join("epoch.checkpoint");
            if checkpoint.exists() {
                std::fs::copy(&checkpoint, dir.join(format!("{name}-{p}-epoch.checkpoint")))?;
            }
        }
    }
    for (i, m) in mirrors.iter().enumerate() {
        std::fs::copy(m.log_path(), dir.join(format!("mirror-{i}.log")))?;
    }
    eprintln!("soak: logs kept in {}", dir.display());
    Ok(())
}

/// Waits until the target has the source's log end on every partition and the two mirrors together mirror every
/// partition, none halted. On a timeout, the error carries what each mirror reports per partition.
async fn wait_settled(a: &Dc, b: &Dc, mirrors: &[MirrorProcess]) -> anyhow::Result<()> {
    let all: BTreeSet<(String, u32)> = (0..PARTITIONS).map(|p| (TOPIC.to_owned(), p)).collect();
    // Any member still expelled rejoins within a session; the copy of the load's tail is bounded by IO_BUDGET.
    let limit = deadline(&[SESSION, DISCOVERY, IO_BUDGET]);
    let settled = async {
        wait_caught_up(a, TOPIC, b, TOPIC, limit).await?;
        ferry_testkit::wait_until("the mirrors to cover every partition, none halted", limit, async || {
            let mut covered = BTreeSet::new();
            for m in mirrors {
                let rows = monitor_partitions(m).await?;
                anyhow::ensure!(
                    rows.values().all(|r| r.state != "halted"),
                    "a partition is halted: {:?}",
                    rows.values().filter(|r| r.state == "halted").collect::<Vec<_>>()
                );
                covered.extend(mirroring_partitions(&rows));
            }
            Ok::<bool, anyhow::Error>(covered == all)
        })
        .await
    };
    match settled.await {
        Ok(()) => Ok(()),
        Err(e) => {
            let mut report =
                format!("source log ends {:?}, target log ends {:?}", a.leos(TOPIC).await, b.leos(TOPIC).await);
            for (i, m) in mirrors.iter().enumerate() {
                report.push_str(&format!("\nmirror {i}: {:?}", monitor_get(m, "/api/v1/partitions").await));
            }
            Err(e.context(report))
        }
    }
}
