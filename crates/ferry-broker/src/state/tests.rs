//! The state pattern on a single broker: what is written is applied once acknowledged, a new owner replays the
//! same state, and a compaction keeps it while dropping the segments before it.

use std::collections::BTreeMap;
use std::path::Path;

use ferry_storage::LogConfig;

use super::*;

static TOPIC: InternalTopic =
    InternalTopic { name: "__ferry_test_state", partitions: 2, segment_bytes: 64 * 1024, retention_ms: 0 };

/// Key -> (value, offset it was set at), as a replay sees the records.
#[derive(Debug, Default, PartialEq, Eq)]
struct Registers(BTreeMap<Vec<u8>, (Vec<u8>, u64)>);

impl Replayed for Registers {
    fn apply(&mut self, offset: u64, record: &Record) {
        let key = record.key.as_deref().unwrap_or_default().to_vec();
        self.0.insert(key, (record.value.as_deref().unwrap_or_default().to_vec(), offset));
    }
}

fn entry(k: &str, v: &str) -> Entry {
    Entry { key: Bytes::copy_from_slice(k.as_bytes()), value: Bytes::copy_from_slice(v.as_bytes()) }
}

async fn open(dir: &Path) -> StateLogs {
    // Batches of at most 64 KiB, so the topic's 64 KiB segments take effect.
    let defaults = LogConfig { max_batch_bytes: 64 * 1024, ..LogConfig::default() };
    let core = BrokerCore::open(ferry_storage::fs::os(), dir, Some("test"), defaults, Default::default())
        .expect("open the broker core");
    core.ensure_internal(&TOPIC).await.expect("the internal topic");
    StateLogs::new(Arc::new(core), None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_state_is_applied_in_log_order_and_a_new_owner_replays_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let logs = open(dir.path()).await;
    let owners: Owners<Registers> = Owners::new(&TOPIC);
    {
        let mut g = owners.lock(&logs, 1).await.unwrap();
        assert_eq!(g.owned().epoch, 0);
        g.write(&[entry("a", "1"), entry("b", "2")]).await.unwrap();
        g.write(&[entry("a", "3")]).await.unwrap();
        let want: BTreeMap<Vec<u8>, (Vec<u8>, u64)> =
            [(b"a".to_vec(), (b"3".to_vec(), 2)), (b"b".to_vec(), (b"2".to_vec(), 1))].into();
        assert_eq!(g.state().0, want);
        assert!(g.write(&[]).await.is_ok(), "an empty write writes nothing");
    }
    let written = owners.lock(&logs, 1).await.unwrap().state().0.clone();
    // Another owner (a broker that takes the partition over) rebuilds the same state from the log.
    let fresh: Owners<Registers> = Owners::new(&TOPIC);
    assert_eq!(fresh.lock(&logs, 1).await.unwrap().state().0, written);
    assert!(fresh.lock(&logs, 0).await.unwrap().state().0.is_empty(), "partition 0 holds nothing");
    assert!(matches!(logs.own(&TOPIC, 2), Err(BrokerError::UnknownPartition { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_keeps_the_state_and_drops_the_segments_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let logs = open(dir.path()).await;
    let owners: Owners<Registers> = Owners::new(&TOPIC);
    let mut g = owners.lock(&logs, 0).await.unwrap();
    let big = "x".repeat(1000);
    for round in 0..200 {
        g.write(&[entry(&format!("k{}", round % 5), &format!("{round}{big}"))]).await.unwrap();
    }
    let before = g.state().0.clone();
    let snapshot: Vec<Entry> = before
        .iter()
        .map(|(k, (v, _))| Entry { key: Bytes::copy_from_slice(k), value: Bytes::copy_from_slice(v) })
        .collect();
    let deleted = g.compact(&snapshot).await.unwrap();
    assert!(deleted > 0, "200 KB of records in 64 KiB segments left no segment to delete");
    let log_start = g.owned().part.log().log_start_offset();
    assert!(log_start > 0 && log_start <= 200, "log start {log_start}");
    drop(g);
    let values = |s: &Registers| s.0.iter().map(|(k, (v, _))| (k.clone(), v.clone())).collect::<Vec<_>>();
    let fresh: Owners<Registers> = Owners::new(&TOPIC);
    assert_eq!(
        values(fresh.lock(&logs, 0).await.unwrap().state()),
        before.values().map(|(v, _)| v.clone()).zip(before.keys()).map(|(v, k)| (k.clone(), v)).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let logs = open(dir.path()).await;
        let owners: Owners<Registers> = Owners::new(&TOPIC);
        owners.lock(&logs, 0).await.unwrap().write(&[entry("kept", "yes")]).await.unwrap();
        logs.core.close();
    }
    let logs = open(dir.path()).await;
    let owners: Owners<Registers> = Owners::new(&TOPIC);
    let g = owners.lock(&logs, 0).await.unwrap();
    assert_eq!(g.state().0.get(b"kept".as_slice()).map(|(v, _)| v.clone()), Some(b"yes".to_vec()));
}
