//! A target that answers `DIVERGED` halts the partition, end to end (design §3 append-with-offsets, §4
//! Divergence). While the topic is paused on the mirror, another writer appends, with offsets, different records at
//! exactly the offsets (and batch boundaries, and epoch) the source holds next. Resumed, the mirror offers its source
//! batches, the target finds them below its log end with another CRC and answers `DIVERGED` at the first of them:
//! the partition halts with `partition_diverged` naming that offset, and the target keeps exactly what it holds.
//!
//! Why the other writer acts while the mirror runs: a mirror that starts resumes at the target's log end (the
//! target is the truth), so it never offers again what the target held before it started; the target can only
//! answer `DIVERGED` to batches it is offered.

use bytes::Bytes;
use ferry_batch::{Compression, Header, ProducerInfo, Record, encode_records};
use ferry_testkit::MirrorProcess;

use crate::common::*;

const TOPIC: &str = "orders";
const TOKEN: &str = "diverged-monitor-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_answer_from_the_target_halts_and_keeps_the_target() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic(TOPIC, 1).await?;
    let p = producer(&a).await?;
    for chunk in 0..4 {
        produce_to_partition(&p, TOPIC, 0, "mirrored", chunk * 50, (chunk + 1) * 50).await?;
    }
    let conf = MirrorConf::new(&a, &b);
    let mirror = MirrorProcess::builder(conf.toml()).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    wait_caught_up(&a, TOPIC, &b, TOPIC, io_deadline()).await?;
    assert_identical(&a, TOPIC, &b, TOPIC).await?;
    let at = b.leos(TOPIC).await?[0];
    assert_eq!(at, 200);

    monitor_post(&mirror, &format!("/api/v1/topics/{TOPIC}/pause"), TOKEN).await?;
    wait_owned(&mirror, "the partition paused", io_deadline(), |rows| {
        rows.get(&(TOPIC.to_owned(), 0)).is_some_and(|r| r.state == "paused")
    })
    .await?;
    produce_to_partition(&p, TOPIC, 0, "source-next", 200, 260).await?;
    p.close().await;

    // The other writer: the source's next batches, offset for offset and epoch for epoch, with other values.
    let source = read_partition(&a.client, TOPIC, 0, None).await?;
    let next: Vec<BatchId> = source.batches.iter().filter(|b| b.0 >= at).copied().collect();
    assert_eq!(next.first().map(|b| b.0), Some(at), "the source's next batch starts at the target's log end");
    assert_eq!(next.last().map(|b| b.1), Some(259));
    let topic_id = b
        .admin
        .describe_topic(TOPIC)
        .await?
        .topic
        .mirror
        .map(|m| m.source_topic_id)
        .expect("dc-b's topic is a mirror topic");
    for (base, last, epoch, _) in &next {
        let records: Vec<Record> = (*base..=*last)
            .map(|o| Record {
                offset: o,
                timestamp: BASE_TS + o as i64,
                key: Some(Bytes::from(format!("other-writer-key-{o}"))),
                value: Some(Bytes::from(format!("not what dc-a holds at {o}"))),
                headers: vec![Header { key: "writer".into(), value: Some(Bytes::from_static(b"other")) }],
            })
            .collect();
        let batch = encode_records(&records, *epoch, Compression::None, ProducerInfo::NONE);
        let r = b.admin.append_with_offsets(TOPIC, 0, &topic_id, 0, batch).await?;
        assert_eq!(r.error, ferry_client::proto::ErrorCode::None as i32, "{r:?}");
    }
    let written = read_partition(&b.client, TOPIC, 0, None).await?;
    assert_eq!((written.log_end, written.records.len()), (260, 260));
    assert!(written.batches.iter().zip(&source.batches).all(|(t, s)| (t.0, t.1, t.2) == (s.0, s.1, s.2)));
    assert_ne!(written.summary().batches_digest, source.summary().batches_digest, "other CRCs from offset {at}");

    monitor_post(&mirror, &format!("/api/v1/topics/{TOPIC}/resume"), TOKEN).await?;
    let rows = wait_owned(&mirror, "the partition halted", io_deadline(), |rows| {
        rows.get(&(TOPIC.to_owned(), 0)).is_some_and(|r| r.state == "halted")
    })
    .await?;
    let row = &rows[&(TOPIC.to_owned(), 0)];
    let error = row.last_error.as_deref().unwrap_or_default();
    assert!(error.starts_with(&format!("diverged at offset {at}: the target holds different data")), "{row:?}");
    assert_eq!(row.cache_offset, at, "{row:?}");

    let diverged = monitor_events(&mirror, Some("partition_diverged")).await?;
    assert_eq!(diverged.len(), 1, "{diverged:?}");
    let e = &diverged[0];
    assert_eq!((&e["topic"], e["partition"].as_u64()), (&TOPIC.into(), Some(0)), "{e}");
    assert_eq!(e["details"]["offset"].as_u64(), Some(at), "{e}");
    assert_eq!(e["details"]["cache_offset"].as_u64(), Some(at), "{e}");
    assert_eq!(e["details"]["policy"], "halt", "{e}");

    let after = read_partition(&b.client, TOPIC, 0, None).await?;
    assert_same_partition("dc-b keeps exactly what it held", &written, &after);
    Ok(())
}
