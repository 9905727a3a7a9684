//! Scenario 11: `sync.max_bytes_per_sec = "2MiB"` bounds the mirrored byte rate. The bytes on the target are
//! sampled while a 24 MiB backlog is mirrored; over every 10 s window the rate stays at or below 2.2 MiB/s (the
//! limit plus the limiter's quarter-second burst and measurement slack), and mirroring completes with the target
//! identical to the source.

use std::time::{Duration, Instant};

use crate::common::*;

const TOPIC: &str = "orders";
const WINDOW: Duration = Duration::from_secs(10);
const LIMIT: f64 = 2.2 * 1024.0 * 1024.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_rate_limit_holds_over_ten_second_windows() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 4).await?;
    produce(&a, TOPIC, "limited", 24 * 1024, 1024).await?;
    let source_bytes: u64 = a.admin.describe_topic(TOPIC).await?.partitions.iter().map(|p| p.size_bytes).sum();

    let mut conf = MirrorConf::new(&a, &b);
    conf.sync_extra = vec!["max_bytes_per_sec = \"2MiB\"".into()];
    let _mirror = conf.start().await?;

    // (seconds since the mirror started, bytes on the target), every 250 ms until the target has everything.
    let started = Instant::now();
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let limit = io_deadline() + Duration::from_secs(source_bytes / (2 << 20));
    loop {
        tick.tick().await;
        let bytes: u64 = match b.admin.describe_topic(TOPIC).await {
            Ok(d) => d.partitions.iter().map(|p| p.size_bytes).sum(),
            Err(_) => 0,
        };
        samples.push((started.elapsed().as_secs_f64(), bytes));
        if bytes >= source_bytes {
            break;
        }
        assert!(
            started.elapsed() < limit,
            "mirroring did not complete within {limit:?}: {bytes} of {source_bytes} bytes"
        );
    }
    let elapsed = samples.last().map_or(0.0, |s| s.0);
    assert!(elapsed >= WINDOW.as_secs_f64(), "a 24 MiB backlog at 2 MiB/s takes over 10 s, took {elapsed:.1} s");

    let mut worst = 0.0f64;
    for (i, &(t0, b0)) in samples.iter().enumerate() {
        for &(t1, b1) in &samples[i..] {
            if t1 - t0 >= WINDOW.as_secs_f64() {
                worst = worst.max((b1 - b0) as f64 / (t1 - t0));
                break;
            }
        }
    }
    tracing::info!(worst_mib_s = worst / 1048576.0, elapsed, "mirrored byte rate over 10 s windows");
    assert!(worst > 0.0, "at least one full window was measured");
    assert!(worst <= LIMIT, "the mirrored rate reached {:.2} MiB/s over a 10 s window", worst / 1048576.0);

    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;
    Ok(())
}
