//! The timer on a single broker, in process: a firing recorded and performed but not marked fired (a crash between
//! the move and the fired record) is performed again by the next owner without writing its records twice, and the
//! entries after it still fire, in order.

use std::sync::Arc;

use bytes::Bytes;
use ferry_batch::Record;
use ferry_storage::LogConfig;

use super::codec::{Intent, StoreRecord, encode};
use super::produce::{KIND, ProduceMover, encode_record, stream_key};
use super::{DELAY_TOPIC, Delays, Fire, FiredEntry, Firing};
use crate::delay::core::DelayId;
use crate::node::registry::{BrokerCore, now_ms};
use crate::node::topic::TopicSettings;
use crate::state::{Entry, StateLogs};

fn payload(i: usize) -> Bytes {
    let r = Record {
        offset: 0,
        timestamp: 5,
        key: Some(Bytes::from(format!("k{i}"))),
        value: Some(Bytes::from(format!("v{i}"))),
        headers: vec![ferry_batch::Header { key: "n".into(), value: Some(Bytes::from(i.to_string())) }],
    };
    encode_record(&r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_interrupted_after_its_move_is_finished_by_the_next_owner_without_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let core =
        BrokerCore::open(ferry_storage::fs::os(), dir.path(), Some("test"), LogConfig::default(), Default::default())
            .expect("open the broker core");
    core.ensure_internal(&DELAY_TOPIC).await.unwrap();
    core.create_topic("t", 1, TopicSettings::default(), None).await.unwrap();
    let logs = Arc::new(StateLogs::new(Arc::new(core), None));
    let first = Delays::new(Arc::clone(&logs), dir.path().to_owned(), 3_600_000);
    let key = stream_key("t", 0);
    let due = now_ms() - 1;
    let payloads: Vec<Bytes> = (0..3).map(payload).collect();
    let ids = first.schedule(KIND, key.clone(), due, &payloads).await.unwrap();
    let k = ids[0].partition;

    // The first owner records an intent for the first two, moves them, and dies before the fired record.
    let owned = logs.own(&DELAY_TOPIC, k).unwrap();
    let intent = Intent {
        kind: KIND,
        key: key.clone(),
        first_seq: 0,
        bytes: (payloads[0].len() + payloads[1].len()) as u64,
        ids: vec![(ids[0].offset, due, payloads[0].len() as u32), (ids[1].offset, due, payloads[1].len() as u32)],
    };
    let entry = Entry { key: key.clone(), value: encode(&StoreRecord::Intent(intent)) };
    logs.append(&owned, &[entry]).await.unwrap();
    let mover = ProduceMover::new(Arc::clone(&logs));
    let entries: Vec<FiredEntry> = (0..2)
        .map(|i| FiredEntry {
            id: DelayId { partition: k, offset: ids[i].offset },
            due_ms: due,
            payload: payloads[i].clone(),
        })
        .collect();
    mover.fire(&Firing { kind: KIND, key: key.clone(), first_seq: 0, entries }).await.unwrap();

    // A new owner replays the store, performs the intent again (a duplicate), then fires the third record.
    let second = Delays::new(Arc::clone(&logs), dir.path().to_owned(), 3_600_000);
    second.register(KIND, Arc::new(ProduceMover::new(Arc::clone(&logs))));
    second.step(k).await.unwrap();
    second.step(k).await.unwrap();
    let part = logs.core().partition("t", 0).unwrap();
    let read = part.read_log(0, 1 << 20).unwrap();
    let mut values = Vec::new();
    for (_, bytes) in ferry_batch::split_verified(&read.batches).unwrap() {
        for r in ferry_batch::decode_records(&bytes).unwrap() {
            assert_eq!(r.timestamp, due, "a moved record's timestamp is its due time");
            values.push((r.offset, String::from_utf8(r.value.unwrap().to_vec()).unwrap()));
        }
    }
    assert_eq!(values, vec![(0, "v0".to_owned()), (1, "v1".to_owned()), (2, "v2".to_owned())]);
    let (moves, _) = second.mover_stats();
    assert_eq!(moves, 3, "two performed again, one new");
    assert!(second.describe(KIND, |_| true).await.unwrap().is_empty(), "nothing pending");
}
