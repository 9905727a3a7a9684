//! ListOffsets by timestamp, DeleteGroups and fetch sessions, each against a broker's Kafka listener.

use anyhow::Context;
use bytes::{Buf, BufMut, BytesMut};
use ferry_client::admin::TopicConfig;
use serde_json::{Value, json};

use crate::bad_input::{exchange, frame};
use crate::support::{Member, Wire, run_client, step_deadline};

/// The timestamp of record 0 of client.py's records (record i has this + i).
const TS0: i64 = 1_750_000_000_000;

#[tokio::test]
async fn list_offsets_by_timestamp_answers_the_first_offset_at_or_after_it() -> anyhow::Result<()> {
    let w = Wire::start().await?;
    w.admin.create_topic("timed", 2, TopicConfig::default(), None).await?;
    // Record i in partition i % 2 at offset i / 2, timestamp TS0 + i: partition p's offset o has TS0 + 2o + p.
    let acked = run_client("confluent", &w.kafka, &["produce", "timed", "2", "t", "0", "40"]).await?;
    assert_eq!(acked.last().cloned(), Some(json!({"acked": 40, "unflushed": 0})));
    let deltas: [i64; 7] = [-100, 0, 5, 6, 38, 39, 40];
    let times: Vec<String> = deltas.iter().map(|d| (TS0 + d).to_string()).collect();
    for lib in ["confluent", "kafkapython"] {
        let mut args = vec!["times", "timed", "2"];
        args.extend(times.iter().map(String::as_str));
        let got = run_client(lib, &w.kafka, &args).await?;
        let mut want = Vec::new();
        for p in 0..2i64 {
            for d in deltas {
                // The first offset o with TS0 + 2o + p >= TS0 + d; none past offset 19.
                let o = ((d - p).max(0) + 1) / 2;
                let (offset, ts) = if o < 20 { (o, json!(TS0 + 2 * o + p)) } else { (-1, Value::Null) };
                // confluent-kafka gives no timestamp; kafka-python gives the found record's.
                let ts = if lib == "confluent" { Value::Null } else { ts };
                want.push(json!([p, TS0 + d, offset, ts]));
            }
        }
        want.sort_by_key(|v| v.to_string());
        let mut got = got.first().context("a times line")?["times"].as_array().cloned().unwrap_or_default();
        got.sort_by_key(|v| v.to_string());
        assert_eq!(got, want, "{lib}");
    }
    Ok(())
}

#[tokio::test]
async fn delete_groups_refuses_a_group_with_members_and_drops_its_offsets() -> anyhow::Result<()> {
    let w = Wire::start().await?;
    w.admin.create_topic("doomed", 2, TopicConfig::default(), None).await?;
    run_client("confluent", &w.kafka, &["produce", "doomed", "2", "g", "0", "10"]).await?;
    let member = Member::start("confluent", &w.kafka, "doomed", "goner")?;
    ferry_testkit::wait_until("the member to read and commit all 10", step_deadline(), async || {
        Ok::<_, anyhow::Error>(member.records().len() == 10)
    })
    .await?;
    let delete = async || -> anyhow::Result<Value> {
        Ok(run_client("confluent", &w.kafka, &["delete-group", "goner"]).await?.first().context("a line")?.clone())
    };
    assert_eq!(delete().await?, json!({"delete_group": "NON_EMPTY_GROUP"}), "while a member is in it");
    let committed = w.admin.fetch_committed_offsets("goner", &[]).await?;
    assert_eq!(committed.iter().map(|c| (c.partition, c.offset)).collect::<Vec<_>>(), vec![(0, 5), (1, 5)]);
    member.stop().await?;
    assert_eq!(delete().await?, json!({"delete_group": "ok"}), "once it is empty");
    assert!(w.admin.fetch_committed_offsets("goner", &[]).await?.is_empty(), "its offsets are gone");
    assert!(w.admin.list_groups().await?.iter().all(|g| g.group != "goner"), "it is not listed");
    assert_eq!(delete().await?, json!({"delete_group": "GROUP_ID_NOT_FOUND"}), "a second time");
    // Gone after a kill -9 and a restart too: the tombstones are in the offsets partition.
    let mut w = w;
    w.broker.kill9().await?;
    w.broker.restart().await?;
    assert!(w.admin.fetch_committed_offsets("goner", &[]).await?.is_empty(), "still gone after a restart");
    Ok(())
}

/// A Fetch v7 of `topic`/0 from offset 0 with session `id` and `epoch`: (error, session id, high watermark of the
/// partition or -1 when none is answered, records in the answered batches).
async fn fetch_v7(addr: &str, topic: &str, id: i32, epoch: i32) -> anyhow::Result<(i16, i32, i64, i32)> {
    let mut b = BytesMut::new();
    b.put_i32(-1); // replica id
    b.put_i32(0); // max wait
    b.put_i32(0); // min bytes
    b.put_i32(1 << 20); // max bytes
    b.put_i8(0); // isolation level
    b.put_i32(id);
    b.put_i32(epoch);
    b.put_i32(1);
    b.put_i16(topic.len() as i16);
    b.put_slice(topic.as_bytes());
    b.put_i32(1);
    b.put_i32(0); // partition
    b.put_i64(0); // fetch offset
    b.put_i64(-1); // log start offset
    b.put_i32(1 << 20); // partition max bytes
    b.put_i32(0); // forgotten topics
    let answer = exchange(addr, &frame(1, 7, 11, &b)).await?.context("a Fetch answer")?;
    let mut r = &answer[..];
    r.advance(4 + 4); // correlation id, throttle time
    let (error, session) = (r.get_i16(), r.get_i32());
    if r.get_i32() == 0 {
        return Ok((error, session, -1, 0));
    }
    r.advance(2 + topic.len() + 4 + 4 + 2); // topic, one partition, its index and error
    let hw = r.get_i64();
    r.advance(8 + 8); // last stable offset, log start offset
    let aborted = r.get_i32();
    r.advance(aborted.max(0) as usize * 16);
    let len = r.get_i32().max(0) as usize;
    let mut records = &r[..len];
    let mut count = 0;
    // Each v2 batch: base offset, length, then 49 more header bytes, the last 4 its record count.
    while records.len() >= 61 {
        let size = i32::from_be_bytes(records[8..12].try_into()?) as usize;
        count += i32::from_be_bytes(records[57..61].try_into()?);
        records = &records[(12 + size).min(records.len())..];
    }
    Ok((error, session, hw, count))
}

#[tokio::test]
async fn fetch_sessions_are_not_kept_and_full_fetches_are_answered() -> anyhow::Result<()> {
    let w = Wire::start().await?;
    w.admin.create_topic("sessions", 1, TopicConfig::default(), None).await?;
    run_client("confluent", &w.kafka, &["produce", "sessions", "1", "s", "0", "25"]).await?;
    // Without a session (epoch -1), and asking for a new one (id 0, epoch 0): full answers, session id 0.
    assert_eq!(fetch_v7(&w.kafka, "sessions", 0, -1).await?, (0, 0, 25, 25));
    assert_eq!(fetch_v7(&w.kafka, "sessions", 0, 0).await?, (0, 0, 25, 25));
    // Closing a session it never made and opening another (id 7, epoch 0): a full answer too.
    assert_eq!(fetch_v7(&w.kafka, "sessions", 7, 0).await?, (0, 0, 25, 25));
    // Incremental fetches of a session: FETCH_SESSION_ID_NOT_FOUND (70), no data.
    assert_eq!(fetch_v7(&w.kafka, "sessions", 7, 1).await?, (70, 0, -1, 0));
    assert_eq!(fetch_v7(&w.kafka, "sessions", 0, 3).await?, (70, 0, -1, 0));
    Ok(())
}
