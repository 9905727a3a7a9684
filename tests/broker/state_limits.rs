//! Bounded state keyed by client input: group member and client ids over `groups.max_id_bytes` and members past
//! `groups.max_members` are refused, and an idempotent producer id expires by batch timestamps
//! (`storage.producer_id_expiration`), after which its late retry is refused instead of appended, also after a
//! restart rebuilds the state from the log. Produced timestamps may be only so far ahead of the broker's clock,
//! and a mirror topic's far-future timestamps (exempt from that bound) age from their append time.

use ferry_batch::{BatchBuilder, Compression, ProducerInfo};
use ferry_client::Code;
use ferry_client::admin::TopicConfig;
use ferry_client::proto as pb;

use crate::common::{STOP_GRACE, assert_status, connect, leos, plain_batch, read_topic, start_broker};

const TS0: i64 = 1_700_000_000_000;

fn join(member_id: &str, client_id: &str) -> pb::JoinGroupRequest {
    pb::JoinGroupRequest {
        group: "g".into(),
        member_id: member_id.into(),
        topics: vec!["t".into()],
        session_timeout_ms: 30_000,
        client_id: client_id.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_member_and_client_ids_and_members_past_the_limit_are_refused() -> anyhow::Result<()> {
    let broker = start_broker("[groups]\nmax_members = 2\n").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("t", 1, TopicConfig::default(), None).await?;
    let (too_long, at_limit) = ("m".repeat(256), "m".repeat(255));

    let message = assert_status(client.join_group(join(&too_long, "")).await, Code::InvalidArgument, &[]);
    assert_eq!(message, "invalid request: group \"g\": the member id is 256 bytes, above groups.max_id_bytes (255)");
    let message = assert_status(client.join_group(join("", &too_long)).await, Code::InvalidArgument, &[]);
    assert_eq!(message, "invalid request: group \"g\": the client id is 256 bytes, above groups.max_id_bytes (255)");

    // At the limit: accepted. Then the group is full at two members.
    assert_eq!(client.join_group(join(&at_limit, "")).await?.member_id, at_limit);
    assert_eq!(client.join_group(join("m2", "")).await?.member_id, "m2");
    let message = assert_status(client.join_group(join("m3", "")).await, Code::ResourceExhausted, &[]);
    assert_eq!(
        message,
        "member \"m3\" joining group \"g\" would pass its 2 members (the limit is groups.max_members in the broker \
         config)"
    );
    // A member already in joins again; the broker keeps serving with exactly the two members.
    assert_eq!(client.join_group(join("m2", "")).await?.member_id, "m2");
    let mut members: Vec<String> = admin.describe_group("g").await?.members.into_iter().map(|m| m.member_id).collect();
    members.sort();
    assert_eq!(members, ["m2".to_owned(), at_limit]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_from_an_expired_producer_id_is_refused_not_appended() -> anyhow::Result<()> {
    // Expiry follows batch timestamps, which the test chooses: no time has to pass.
    let mut broker = start_broker("[storage]\nproducer_id_expiration = \"1s\"\n").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("payments", 1, TopicConfig::default(), None).await?;
    let id = client.init_producer(pb::InitProducerRequest {}).await?;
    let batch = |base_sequence: i32, values: &[&str]| {
        let mut b = BatchBuilder::new(
            Compression::None,
            ProducerInfo { producer_id: id.producer_id, producer_epoch: id.producer_epoch as i16, base_sequence },
        );
        for (i, v) in values.iter().enumerate() {
            b.push(i as u32, TS0, Some(b"k"), Some(v.as_bytes()), &[]);
        }
        b.build(0, 0)
    };
    let produce = |batches| pb::ProduceRequest { topic: "payments".into(), partition: Some(0), key: None, batches };

    let first = client.produce(produce(batch(0, &["a", "b"]))).await?;
    assert_eq!((first.base_offset, first.last_offset, first.duplicate), (0, 1, false));
    // Another writer's batch exactly 1 s of batch time later: the producer id is not expired yet.
    client.produce(produce(plain_batch(&["x"], TS0 + 1000))).await?;
    let retry = client.produce(produce(batch(0, &["a", "b"]))).await?;
    assert_eq!((retry.base_offset, retry.last_offset, retry.duplicate), (0, 1, true));
    // One millisecond more: expired. The late retry and the next sequence are refused, and nothing is written.
    client.produce(produce(plain_batch(&["y"], TS0 + 1001))).await?;
    let expired = format!(
        "producer {} on payments/0: producer id {} expired: its last batch (max_timestamp {TS0}) is 1001 ms older \
         than the partition's newest batch, beyond storage.producer_id_expiration (1000 ms); a late retry is not \
         appended, produce with a new producer id",
        id.producer_id, id.producer_id
    );
    for attempt in [batch(0, &["a", "b"]), batch(2, &["c"])] {
        let message = assert_status(client.produce(produce(attempt)).await, Code::FailedPrecondition, &[]);
        assert_eq!(message, expired);
    }
    // The state rebuilt from the log on restart reaches the same verdict.
    broker.terminate(STOP_GRACE).await?;
    broker.restart().await?;
    let message = assert_status(client.produce(produce(batch(0, &["a", "b"]))).await, Code::FailedPrecondition, &[]);
    assert_eq!(message, expired);

    assert_eq!(leos(&admin, "payments").await, vec![4]);
    let values: Vec<String> =
        read_topic(&client, "payments").await.iter().map(|r| format!("{}@{}", r.value_str(), r.offset)).collect();
    assert_eq!(values, ["a@0", "b@1", "x@2", "y@3"]);
    Ok(())
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produced_timestamps_may_be_only_so_far_ahead_and_mirror_appends_are_exempt() -> anyhow::Result<()> {
    let broker = start_broker("[storage]\nmax_timestamp_ahead = \"1h\"\n").await?;
    let (client, admin) = connect(&broker);
    admin.create_topic("t", 1, TopicConfig::default(), None).await?;
    let produce = |batches| pb::ProduceRequest { topic: "t".into(), partition: Some(0), key: None, batches };
    let hour = 3_600_000;
    // Two hours ahead, and the hostile i64::MAX: refused, nothing written.
    for ts in [wall_ms() + 2 * hour, i64::MAX - 1] {
        assert_status(
            client.produce(produce(plain_batch(&["late"], ts))).await,
            Code::InvalidArgument,
            &[&format!("t/0: a batch's newest record timestamp {ts} is more than storage.max_timestamp_ahead")],
        );
    }
    assert_eq!(leos(&admin, "t").await, vec![0]);
    // A batch after a good one in the same request: refused as a whole.
    let both = [plain_batch(&["ok"], wall_ms()), plain_batch(&["late"], wall_ms() + 2 * hour)].concat();
    assert_status(client.produce(produce(both.into())).await, Code::InvalidArgument, &["max_timestamp_ahead"]);
    assert_eq!(leos(&admin, "t").await, vec![0]);
    // Half an hour ahead is within the bound.
    let ts = wall_ms() + hour / 2;
    client.produce(produce(plain_batch(&["a", "b"], ts))).await?;
    let got: Vec<(u64, i64)> = read_topic(&client, "t").await.iter().map(|r| (r.offset, r.timestamp)).collect();
    assert_eq!(got, vec![(0, ts), (1, ts + 1)]);

    // A mirror topic takes the source's timestamps whatever this clock says (DC clocks differ).
    let mark = ferry_client::admin::MirrorSource {
        source_cluster_id: "dc-a-cluster".into(),
        source_topic_id: "7d5c2f4e-93a1-4c39-9f3b-2b8f7a1e0c11".into(),
        source_topic: "m".into(),
        source_cluster: "dc-a".into(),
    };
    admin.create_topic("dc-a.m", 1, TopicConfig::default(), Some(mark)).await?;
    let far = wall_ms() + 48 * hour;
    let r = admin
        .append_with_offsets("dc-a.m", 0, "7d5c2f4e-93a1-4c39-9f3b-2b8f7a1e0c11", 0, plain_batch(&["x"], far))
        .await?;
    assert_eq!((r.error, r.log_end_offset), (pb::ErrorCode::None as i32, 1), "{}", r.message);
    Ok(())
}

/// A one-record batch at offset `base`, as a mirror appends it.
fn mirrored(base: u64, value: &str, ts: i64) -> bytes::Bytes {
    let mut b = BatchBuilder::new(Compression::None, ProducerInfo::NONE);
    b.push(0, ts, None, Some(value.as_bytes()), &[]);
    b.build(base, 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_topics_far_future_timestamps_age_from_their_append_time() -> anyhow::Result<()> {
    let check = std::time::Duration::from_millis(200);
    let broker = start_broker("[storage]\nretention_check_interval = \"200ms\"\n").await?;
    let (client, admin) = connect(&broker);
    let topic_id = "7d5c2f4e-93a1-4c39-9f3b-2b8f7a1e0c11";
    let mark = ferry_client::admin::MirrorSource {
        source_cluster_id: "dc-a-cluster".into(),
        source_topic_id: topic_id.into(),
        source_topic: "m".into(),
        source_cluster: "dc-a".into(),
    };
    // Segments roll once their first batch is 1 s old; time retention is 1 s.
    let (segment_ms, retention_ms) = (1_000, 1_000);
    let config = TopicConfig { segment_ms: Some(segment_ms), retention_ms: Some(retention_ms), ..Default::default() };
    admin.create_topic("dc-a.m", 1, config, Some(mark)).await?;
    // The source's clock (or a hostile producer there) stamped the first record at the end of time: by its
    // timestamp it would never expire.
    let r = admin.append_with_offsets("dc-a.m", 0, topic_id, 0, mirrored(0, "future", i64::MAX - 1)).await?;
    assert_eq!((r.error, r.log_end_offset), (pb::ErrorCode::None as i32, 1), "{}", r.message);

    // The mirror keeps appending current records. Once the first segment is a second old it is sealed, and a
    // second after its last append retention removes it, far-future timestamp and all.
    let mut appended = vec![(0, "future".to_string())];
    let limit = ferry_testkit::deadline(&[std::time::Duration::from_millis(segment_ms + retention_ms), check]);
    ferry_testkit::wait_until("the far-future segment to be removed by retention", limit, async || {
        let next = appended.len() as u64;
        let value = format!("v{next}");
        let r = admin.append_with_offsets("dc-a.m", 0, topic_id, 0, mirrored(next, &value, wall_ms())).await?;
        anyhow::ensure!(r.error == pb::ErrorCode::None as i32, "append refused: {}", r.message);
        appended.push((next, value));
        let offsets = admin.list_offset("dc-a.m", 0, ferry_client::OffsetSpec::Earliest).await?;
        anyhow::Ok(offsets.log_start_offset > 0)
    })
    .await?;
    let start = admin.list_offset("dc-a.m", 0, ferry_client::OffsetSpec::Earliest).await?.log_start_offset;
    // What is left is exactly the appended records from the new log start on.
    let got: Vec<(u64, String)> = read_topic(&client, "dc-a.m")
        .await
        .iter()
        .map(|r| (r.offset, String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap()))
        .collect();
    assert_eq!(got, appended[start as usize..].to_vec());
    assert!(start < appended.len() as u64, "only sealed segments are removed");
    Ok(())
}
