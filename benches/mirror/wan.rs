//! Phase 2 of the mirror bench: the backlog copied over the testkit proxy's delay line on the source link, at a
//! 50 ms and a 150 ms RTT (25 and 75 ms one way), against the same proxy with no delay, so each ratio isolates the
//! round-trip time. The three runs of a round follow each other, and the rounds repeat `FERRY_BENCH_WAN_ROUNDS`
//! times (default 3), so no delay always runs on a fuller disk or page cache; each round's ratios are side by side
//! and the median is the figure. The machine's idle CPU during each run is printed too: on a saturated machine a
//! ratio measures CPU contention as much as RTT.

use super::*;

/// One-way delays of the phase: none, then the 50 ms and the 150 ms RTT.
const DELAYS_MS: [u64; 3] = [0, 25, 75];

pub(super) async fn wan(a: &BrokerProcess, b: &BrokerProcess, mb: usize, lan_mbps: f64) -> Result<()> {
    let rounds: usize = std::env::var("FERRY_BENCH_WAN_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let (bytes, records) = (mb * 1024 * 1024, (mb * 1024 * 1024 / RECORD) as u64);
    let a_addr = a.addr().to_string();
    let a_admin = admin(&a_addr)?;
    let proxy = Proxy::start(a.addr()).await?;
    let proxy_addr = proxy.addr().to_string();
    // Per delayed RTT: the ratios to the proxy's 0 ms run, and to the direct run of phase 1.
    let mut ratios = vec![Vec::new(); DELAYS_MS.len() - 1];
    let mut direct = vec![Vec::new(); DELAYS_MS.len() - 1];
    for round in 1..=rounds.max(1) {
        let mut rates = [0.0f64; DELAYS_MS.len()];
        for (i, one_way) in DELAYS_MS.into_iter().enumerate() {
            let delay = Duration::from_millis(one_way);
            let topic = format!("wan{round}-{one_way}");
            a_admin.create_topic(&topic, PARTITIONS, Default::default(), None).await.context("create topic")?;
            produce(&a_addr, &topic, bytes, Duration::from_millis(5)).await?;
            proxy.set_delay(delay);
            let idle0 = support::cpu_idle_ticks();
            let extra = std::env::var("FERRY_BENCH_WAN_SYNC").unwrap_or_default();
            let run = mirror_backlog_with(&proxy_addr, b, &topic, records, &extra).await?;
            let idle = support::cpu_idle_share(idle0);
            rates[i] = mb as f64 / run.seconds;
            println!(
                "round {round}: mirror throughput (proxy, {:>3} ms RTT): {:8.1} MiB/s ({:.2} s in all; mirror CPU per \
                 100 MB {:.3} s; machine idle {:.0}%)",
                2 * one_way,
                rates[i],
                run.total_seconds,
                run.cpu / mb as f64 * 100.0,
                idle * 100.0
            );
        }
        for i in 1..DELAYS_MS.len() {
            ratios[i - 1].push(rates[i] / rates[0]);
            direct[i - 1].push(rates[i] / lan_mbps);
        }
    }
    for (i, one_way) in DELAYS_MS.into_iter().enumerate().skip(1) {
        let rtt = 2 * one_way;
        let shown: Vec<String> = ratios[i - 1].iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "RATIO {rtt} ms RTT / 0 ms RTT (same proxy): {:.2} median of [{}]  (target >= 0.8)",
            median(&mut ratios[i - 1]),
            shown.join(", ")
        );
        println!("RATIO {rtt} ms RTT / direct 0 ms run:       {:.2} median", median(&mut direct[i - 1]));
    }
    Ok(())
}
