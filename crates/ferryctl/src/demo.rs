//! `ferryctl demo`: Ferry's whole story in one command, with nothing to set up. In this process, through the
//! libraries: two brokers in a temp dir as `dc-a` and `dc-b` on free loopback ports, the topic `orders` (4
//! partitions) on dc-a, the mirror between them with its monitor (127.0.0.1:9300 when free) and a random token, and
//! a keyed load of orders on dc-a. It prints the monitor URL and token, then a live line (records mirrored, lag,
//! source and target records/s) until Ctrl-C or `--duration`. The web console (`ferry-console`, 127.0.0.1:9500 when
//! free) runs beside them over both brokers.
//!
//! Stopping is orderly: the load stops and every record is acknowledged, the mirror catches up and shuts down
//! through its cancellation token, then `mirror verify`'s comparison proves that dc-b holds exactly dc-a's batches
//! and log ends, and the brokers shut down. The exit code is 0 only when the copy is complete and identical. A second
//! Ctrl-C during the stop exits at once (130).

use std::io::{IsTerminal, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Args;
use ferry_client::admin::TopicConfig;
use ferry_client::{Admin, BrokerClient, ClientConfig, OffsetSpec};
use ferry_mirror::{MirrorConfig, MirrorHandle};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::common::{GlobalOpts, parse_duration};
use crate::verify::{self, Progress};

mod console;
mod load;

use load::Load;

/// The demo topic.
pub const TOPIC: &str = "orders";
/// Its partitions.
pub const PARTITIONS: u32 = 4;
/// The monitor address the demo prefers (the mirror's default).
const PREFERRED_MONITOR: &str = "127.0.0.1:9300";
/// How long a library component gets to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the mirror gets to copy the last records after the load stopped.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// A broker running in this process.
struct Broker {
    addr: SocketAddr,
    /// Its Kafka listener (dc-a's only).
    kafka: Option<SocketAddr>,
    task: JoinHandle<Result<(), ferry_broker::ServerError>>,
}

/// The mirror running in this process.
struct Mirror {
    handle: MirrorHandle,
    monitor: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<Result<(), ferry_mirror::run::MirrorError>>,
}

/// `demo` options.
#[derive(Args)]
pub struct DemoArgs {
    /// Stop by itself after this long (e.g. 30s or plain seconds); default: run until Ctrl-C.
    #[arg(long, value_name = "SECONDS", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Records per second of the sample load.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub rate: u32,
}

/// Runs the demo.
pub async fn run(args: DemoArgs, _global: &GlobalOpts) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("ferry-demo-").tempdir().context("cannot create a temp dir")?;
    let brokers_stop = CancellationToken::new();
    // On an early error the brokers and the mirror are told to stop when these guards drop.
    let _brokers_guard = brokers_stop.clone().drop_guard();
    let a = start_broker("dc-a", &dir.path().join("dc-a"), brokers_stop.clone()).await?;
    let b = start_broker("dc-b", &dir.path().join("dc-b"), brokers_stop.clone()).await?;
    let source = client(a.addr)?;
    let target = client(b.addr)?;
    Admin::new(source.clone())
        .create_topic(TOPIC, PARTITIONS, TopicConfig::default(), None)
        .await
        .context("cannot create the demo topic on dc-a")?;

    let token = random_token();
    let token_file = dir.path().join("monitor.token");
    std::fs::write(&token_file, &token).with_context(|| format!("cannot write {}", token_file.display()))?;
    let mirror = start_mirror(dir.path(), a.addr, b.addr, &token_file).await?;
    let _mirror_guard = mirror.stop.clone().drop_guard();
    let console = console::start(a.addr, b.addr, mirror.monitor, &token_file, mirror.stop.clone()).await?;
    let (token_shown, token_arg) = token_used(&token);
    print_intro(&a, &b, &mirror, console, (&token_shown, &token_arg), args.rate);

    let load = Load::start(source.clone(), TOPIC, args.rate).await?;
    let started = Instant::now();
    let interrupted = live(&mirror.handle, &load, args.duration).await;
    let elapsed = started.elapsed();
    if interrupted {
        // From here a second Ctrl-C leaves at once: the stop below can take a while.
        tokio::spawn(async {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ninterrupted again: exiting without the final check");
                std::process::exit(130);
            }
        });
    }
    println!("\nstopping: the load, then the mirror once it has copied everything, then the brokers");
    let produced = load.stop().await?;
    let caught_up = wait_caught_up(&source, &target, CATCH_UP_TIMEOUT).await;
    let mirrored = mirror.handle.shared.target_rates.records_total.load(Ordering::Relaxed);
    mirror.stop.cancel();
    match tokio::time::timeout(START_TIMEOUT, mirror.task).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => eprintln!("warning: the mirror stopped with an error: {e}"),
        Ok(Err(e)) => eprintln!("warning: the mirror task failed: {e}"),
        Err(_) => eprintln!("warning: the mirror did not stop within {}s", START_TIMEOUT.as_secs()),
    }

    let progress = Progress::new(std::io::stderr().is_terminal());
    let report = verify::verify(&source, &target, Some(TOPIC), &progress).await;
    progress.finish();
    brokers_stop.cancel();
    for (name, broker) in [("dc-a", a), ("dc-b", b)] {
        match tokio::time::timeout(START_TIMEOUT, broker.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => eprintln!("warning: the {name} broker stopped with an error: {e}"),
            Ok(Err(e)) => eprintln!("warning: the {name} broker task failed: {e}"),
            Err(_) => eprintln!("warning: the {name} broker did not stop within {}s", START_TIMEOUT.as_secs()),
        }
    }
    let report = report?;

    let secs = elapsed.as_secs_f64().max(1e-9);
    println!(
        "produced {} records to dc-a/{TOPIC} in {:.1}s ({:.0} records/s); the mirror appended {} records to dc-b",
        thousands(produced),
        secs,
        produced as f64 / secs,
        thousands(mirrored)
    );
    println!("verify dc-a -> dc-b:");
    for p in &report.partitions {
        println!("  {}", p.line());
    }
    println!("{}", report.summary());
    let complete = report.partitions.iter().all(|p| p.target_log_end_offset == p.source_log_end_offset);
    match caught_up {
        Ok(()) if report.identical && complete => {
            println!("the target equals the source: every record, offset, key, value and header");
            Ok(())
        }
        Err(e) => Err(e),
        Ok(()) => Err(anyhow!("the target does not equal the source (see the lines above)")),
    }
}

fn client(addr: SocketAddr) -> anyhow::Result<BrokerClient> {
    let mut config = ClientConfig::new([addr.to_string()]);
    config.request_timeout = Duration::from_secs(10);
    Ok(BrokerClient::new(config)?)
}

async fn start_broker(cluster: &str, data_dir: &Path, stop: CancellationToken) -> anyhow::Result<Broker> {
    let mut config = ferry_broker::BrokerConfig::default();
    config.broker.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.broker.data_dir = data_dir.to_owned();
    config.broker.cluster_id = Some(cluster.to_owned());
    config.broker.shutdown_timeout = Duration::from_secs(10);
    // Two brokers in one process: neither takes the metrics port (the mirror's monitor serves the demo's metrics).
    config.metrics.enabled = false;
    // The source DC speaks Kafka's protocol too, so stock Kafka tools can look at the demo's data.
    if cluster == "dc-a" {
        config.kafka.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    }
    let (tx, rx) = oneshot::channel();
    let options = ferry_broker::RunOptions::default();
    let mut task = tokio::spawn(ferry_broker::run(config, options, stop, move |started| {
        let _ = tx.send(started);
    }));
    tokio::select! {
        started = rx => match started {
            Ok(started) => Ok(Broker { addr: started.addr, kafka: started.kafka_addr, task }),
            Err(_) => Err(anyhow!("the {cluster} broker did not start: {}", ended(task.await))),
        },
        result = &mut task => Err(anyhow!("the {cluster} broker did not start: {}", ended(result))),
        _ = tokio::time::sleep(START_TIMEOUT) => Err(anyhow!("the {cluster} broker did not start within {}s", START_TIMEOUT.as_secs())),
    }
}

/// Why a component task ended.
fn ended<E: std::fmt::Display>(result: Result<Result<(), E>, tokio::task::JoinError>) -> String {
    match result {
        Ok(Ok(())) => "it stopped".into(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}

/// The demo's mirror config: frequent discovery and commits, so the demo shows results quickly.
fn mirror_toml(source: SocketAddr, target: SocketAddr, listen: &str, token_file: &Path) -> String {
    let token_file = format!("{:?}", token_file.display().to_string());
    format!(
        "[mirror]\nname = \"dc-a_to_dc-b\"\n\
         [source]\ncluster = \"dc-a\"\n\
         [[source.routes]]\nname = \"primary\"\nbrokers = [\"{source}\"]\n\
         [source.health]\ncheck_interval = \"1s\"\n\
         [target]\ncluster = \"dc-b\"\nbrokers = [\"{target}\"]\n\
         [topics]\ninclude = [\"^{TOPIC}$\"]\ndiscovery_interval = \"1s\"\nstart_position = \"earliest\"\n\
         [sync]\ncommit_interval = \"1s\"\nshutdown_timeout = \"10s\"\n\
         [monitor]\nlisten = \"{listen}\"\ntoken_file = {token_file}\n"
    )
}

/// Starts the mirror with its monitor on 127.0.0.1:9300, or on a free port when 9300 is taken.
async fn start_mirror(dir: &Path, source: SocketAddr, target: SocketAddr, token_file: &Path) -> anyhow::Result<Mirror> {
    let preferred_free = std::net::TcpListener::bind(PREFERRED_MONITOR).is_ok();
    let mut listens = vec!["127.0.0.1:0"];
    if preferred_free {
        listens.insert(0, PREFERRED_MONITOR);
    }
    let mut last = None;
    for listen in listens {
        let config = MirrorConfig::from_toml(&mirror_toml(source, target, listen, token_file), false)
            .map_err(|e| anyhow!("the demo's mirror config is invalid: {e}"))?;
        match start_mirror_with(config, &dir.join("monitor.addr")).await {
            Ok(m) => return Ok(m),
            // Another process may take 9300 between the check and the bind: then any free port will do.
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow!("the mirror did not start")))
}

async fn start_mirror_with(config: MirrorConfig, addr_file: &PathBuf) -> anyhow::Result<Mirror> {
    let stop = CancellationToken::new();
    let (tx, rx) = oneshot::channel();
    let options = ferry_mirror::RunOptions { addr_file: Some(addr_file.clone()), reload: None, on_started: Some(tx) };
    let mut task = tokio::spawn(ferry_mirror::run(config, options, stop.clone()));
    let handle = tokio::select! {
        started = rx => match started {
            Ok(handle) => handle,
            Err(_) => return Err(anyhow!("the mirror did not start: {}", ended(task.await))),
        },
        result = &mut task => return Err(anyhow!("the mirror did not start: {}", ended(result))),
        _ = tokio::time::sleep(START_TIMEOUT) => {
            stop.cancel();
            return Err(anyhow!("the mirror did not start within {}s", START_TIMEOUT.as_secs()));
        }
    };
    // The mirror writes the monitor's bound address before it reports that it started.
    let text = std::fs::read_to_string(addr_file)
        .with_context(|| format!("cannot read the monitor address from {}", addr_file.display()))?;
    let monitor = text.trim().parse().with_context(|| format!("{} holds no address: {text:?}", addr_file.display()))?;
    Ok(Mirror { handle, monitor, stop, task })
}

/// A random 24-character token for the monitor.
fn random_token() -> String {
    use rand::Rng as _;
    rand::rng().sample_iter(rand::distr::Alphanumeric).take(24).map(char::from).collect()
}

/// The token the monitor checks, as shown and as a `--token` argument: ours, unless `FERRY_MONITOR_TOKEN` in the
/// environment overrides the file (then it is not printed: the operator chose it).
fn token_used(ours: &str) -> (String, String) {
    let env = ferry_mirror::config::MONITOR_TOKEN_ENV;
    match std::env::var(env) {
        Ok(v) if !v.trim().is_empty() => (format!("(from {env})"), format!("\"${env}\"")),
        _ => (ours.to_owned(), ours.to_owned()),
    }
}

fn print_intro(
    a: &Broker,
    b: &Broker,
    mirror: &Mirror,
    console: SocketAddr,
    (token, token_arg): (&str, &str),
    rate: u32,
) {
    let m = mirror.monitor;
    println!(
        "Ferry demo: brokers dc-a and dc-b, the mirror dc-a -> dc-b and {rate} orders/s on {TOPIC:?} ({PARTITIONS} partitions)"
    );
    println!("  dc-a broker (source)  {}", a.addr);
    println!("  dc-b broker (target)  {}", b.addr);
    if let Some(k) = a.kafka {
        println!("  dc-a Kafka listener   {k}   (e.g. kcat -b {k} -C -t {TOPIC} -c 3)");
    }
    println!("  monitor: http://{m}/   (dashboard; JSON under /api/v1/, metrics under /metrics)");
    println!("  monitor token         {token}");
    println!("  console: http://{console}/   (topics, browse, message trace; log in with the token for actions)");
    println!("Try in another terminal:");
    println!("  ferryctl --monitor {m} mirror partitions --watch");
    println!("  ferryctl --monitor {m} --token {token_arg} mirror pause {TOPIC}");
    println!("  ferryctl --broker {} consume {TOPIC} --from-beginning --max 3 --format json", b.addr);
    println!("Ctrl-C stops the demo and checks that dc-b holds exactly what dc-a holds.\n");
}

/// Shows the live line until Ctrl-C (returns true) or the duration passed (false).
async fn live(handle: &MirrorHandle, load: &Load, duration: Option<Duration>) -> bool {
    let terminal = std::io::stdout().is_terminal();
    let mut tick = tokio::time::interval(if terminal { Duration::from_millis(500) } else { Duration::from_secs(2) });
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    let until = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(ctrl_c, until);
    tick.tick().await; // The first tick is immediate: nothing to show yet.
    loop {
        tokio::select! {
            biased;
            _ = &mut ctrl_c => return true,
            _ = &mut until => return false,
            _ = tick.tick() => {
                let line = live_line(handle, load.acknowledged());
                let mut out = std::io::stdout().lock();
                let _ = if terminal { write!(out, "\r{line}\x1b[K") } else { writeln!(out, "{line}") };
                let _ = out.flush();
            }
        }
    }
}

/// `mirrored N records | lag L | source S rec/s | target T rec/s | produced P`.
fn live_line(handle: &MirrorHandle, produced: u64) -> String {
    let shared = &handle.shared;
    let mirrored = shared.target_rates.records_total.load(Ordering::Relaxed);
    let lag: u64 = shared.partition_views(None).iter().map(|v| v.lag).sum();
    format!(
        "mirrored {} records | lag {} | source {} rec/s | target {} rec/s | produced {}",
        thousands(mirrored),
        thousands(lag),
        thousands(shared.source_rates.records.rate(1) as u64),
        thousands(shared.target_rates.records.rate(1) as u64),
        thousands(produced)
    )
}

/// Waits until every partition's log end on dc-b equals dc-a's.
async fn wait_caught_up(source: &BrokerClient, target: &BrokerClient, within: Duration) -> anyhow::Result<()> {
    let wanted: Vec<(String, u32, OffsetSpec)> =
        (0..PARTITIONS).map(|p| (TOPIC.to_owned(), p, OffsetSpec::Latest)).collect();
    let ends = |c: &BrokerClient| {
        let admin = Admin::new(c.clone());
        let wanted = wanted.clone();
        async move { admin.list_offsets(&wanted).await.map(|v| v.into_iter().map(|o| o.log_end_offset).collect::<Vec<_>>()) }
    };
    let deadline = Instant::now() + within;
    let src = ends(source).await.context("cannot read dc-a's log ends")?;
    loop {
        // The target topic appears with discovery; until then an error only means "not yet".
        if let Ok(tgt) = ends(target).await
            && tgt == src
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let total: u64 = src.iter().sum();
            return Err(anyhow!(
                "the mirror did not copy all {total} records within {}s; the target is incomplete",
                within.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `1234567` -> `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn the_demo_config_is_valid() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t");
        std::fs::write(&file, "tok").unwrap();
        let config = MirrorConfig::from_toml(
            &mirror_toml("127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap(), "127.0.0.1:0", &file),
            false,
        )
        .unwrap();
        assert_eq!(config.source.cluster, "dc-a");
        assert_eq!(config.target.cluster, "dc-b");
        assert_eq!(config.monitor.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(config.topics.discovery_interval, Duration::from_secs(1));
    }

    #[test]
    fn tokens_are_random_alphanumerics() {
        let (a, b) = (random_token(), random_token());
        assert_eq!(a.len(), 24);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
