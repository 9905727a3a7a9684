//! Failback's data steps: copying the old primary's records past the split to `{topic}.recovered` with their
//! lineage, resumably; reading one batch's CRC; moving group offsets back to the split; the receipt's record.

use std::time::Duration;

use anyhow::{Context, anyhow};
use bytes::Bytes;
use ferry_client::batch::{Header, decode_records_shared};
use ferry_client::proto::{self as pb, TopicInfo};
use ferry_client::{Admin, BrokerClient, OffsetSpec, Producer, ProducerConfig, ProducerRecord};
use ferry_mirror::verify::FetchStream;
use ferry_mirror::verify::compare::{BatchStream, Item, Side};

/// One partition's line of the receipt.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Kept {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Where the histories split.
    pub split: u64,
    /// The old primary's log end before the truncation.
    pub old_end: u64,
    /// The old primary's records `[split, old_end)` are in `{topic}.recovered` at these offsets (`[first, end)`),
    /// copied by this run or an earlier one.
    pub recovered: Option<(u64, u64)>,
    /// What was done.
    pub outcome: String,
}

/// The suffix of the topic that keeps an old primary's records past the split.
pub const SUFFIX: &str = ".recovered";

/// Lineage header names.
pub const ORIGIN_CLUSTER: &str = "ferry-origin-cluster";
/// See [`ORIGIN_CLUSTER`].
pub const ORIGIN_TOPIC: &str = "ferry-origin-topic";
/// See [`ORIGIN_CLUSTER`].
pub const ORIGIN_PARTITION: &str = "ferry-origin-partition";
/// See [`ORIGIN_CLUSTER`].
pub const ORIGIN_OFFSET: &str = "ferry-origin-offset";
/// See [`ORIGIN_CLUSTER`].
pub const ORIGIN_EPOCH: &str = "ferry-origin-epoch";

/// Where copied records come from.
pub struct Origin {
    /// The old primary's cluster id.
    pub cluster: String,
    /// The topic there.
    pub topic: String,
}

/// The CRC and epoch of the batch holding `offset`, if the partition holds it.
pub async fn batch_crc(
    client: &BrokerClient,
    topic: &str,
    partition: u32,
    offset: u64,
) -> anyhow::Result<Option<(u32, u32)>> {
    let request = pb::FetchRequest {
        partitions: vec![pb::PartitionFetch {
            topic: topic.to_owned(),
            partition,
            offset,
            max_bytes: 1,
            leader_epoch: client.known_leader_epoch(topic, partition),
        }],
        max_wait_ms: 0,
        max_bytes: 1,
    };
    let response = client.fetch(request).await.with_context(|| format!("reading {topic}/{partition} at {offset}"))?;
    let Some(data) = response.partitions.into_iter().next() else { return Ok(None) };
    if data.error == pb::ErrorCode::OffsetOutOfRange as i32 || data.batches.is_empty() {
        return Ok(None);
    }
    if data.error != pb::ErrorCode::None as i32 {
        return Err(anyhow!("reading {topic}/{partition} at {offset}: {}", data.message));
    }
    let header = ferry_client::batch::BatchHeader::parse(&data.batches)
        .map_err(|e| anyhow!("{topic}/{partition} at {offset}: {e}"))?;
    Ok(Some((header.crc, header.epoch)))
}

fn header_u64(headers: &[Header], key: &str) -> Option<u64> {
    headers.iter().find(|h| h.key == key)?.value.as_deref().and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
}

/// The next origin offset to copy to `recovered`/`partition`: one past the last record copied, or `from`.
async fn resume_at(
    client: &BrokerClient,
    admin: &Admin,
    recovered: &str,
    partition: u32,
    from: u64,
) -> anyhow::Result<u64> {
    let end = admin.list_offset(recovered, partition, OffsetSpec::Latest).await?.log_end_offset;
    if end == 0 {
        return Ok(from);
    }
    let mut stream = FetchStream::new(client.clone(), Side::Target, recovered, partition, end - 1, end);
    let mut last = None;
    while let Some(item) = stream.next().await.map_err(|e| anyhow!("{e}"))? {
        if let Item::Batch(_, bytes) = item {
            let records =
                decode_records_shared(&bytes, 64 << 20).map_err(|e| anyhow!("{recovered}/{partition}: {e}"))?;
            last = records.last().and_then(|r| header_u64(&r.headers, ORIGIN_OFFSET));
        }
    }
    Ok(last.map_or(from, |o| (o + 1).max(from)))
}

/// Copies the old primary's records `[split, old_end)` of `t`/`partition` to `{t}.recovered`, after the last one a
/// previous run copied. Returns the range of `.recovered` offsets holding them.
#[allow(clippy::too_many_arguments)]
pub async fn copy(
    new: &Admin,
    new_client: &BrokerClient,
    old_client: &BrokerClient,
    origin: &Origin,
    t: &TopicInfo,
    partition: u32,
    split: u64,
    old_end: u64,
) -> anyhow::Result<(u64, u64)> {
    let recovered = format!("{}{SUFFIX}", t.name);
    if new.describe_topic(&recovered).await.is_err() {
        new.create_topic_kept(&recovered, t.partitions, None, None, &t.replication, false)
            .await
            .with_context(|| format!("creating {recovered} on the new primary"))?;
    }
    let start = resume_at(new_client, new, &recovered, partition, split).await?;
    if start < old_end {
        let config = ProducerConfig { linger: Duration::from_millis(5), ..ProducerConfig::default() };
        let producer = Producer::new(new_client.clone(), config).await?;
        let mut stream = FetchStream::new(old_client.clone(), Side::Source, &origin.topic, partition, start, old_end);
        let mut deliveries = Vec::new();
        while let Some(item) = stream.next().await.map_err(|e| anyhow!("{e}"))? {
            let Item::Batch(header, bytes) = item else {
                return Err(anyhow!(
                    "{}/{partition}: a corrupt batch on the old primary at {start} or later",
                    origin.topic
                ));
            };
            let records: Vec<_> = decode_records_shared(&Bytes::clone(&bytes), 64 << 20)
                .map_err(|e| anyhow!("{}/{partition}: {e}", origin.topic))?;
            for r in records.into_iter().filter(|r| r.offset >= start && r.offset < old_end) {
                let mut headers = r.headers.clone();
                for (k, v) in [
                    (ORIGIN_CLUSTER, origin.cluster.clone()),
                    (ORIGIN_TOPIC, origin.topic.clone()),
                    (ORIGIN_PARTITION, partition.to_string()),
                    (ORIGIN_OFFSET, r.offset.to_string()),
                    (ORIGIN_EPOCH, header.epoch.to_string()),
                ] {
                    headers.push(Header { key: k.to_owned(), value: Some(Bytes::from(v)) });
                }
                let record = ProducerRecord {
                    topic: recovered.clone(),
                    partition: Some(partition),
                    key: r.key.clone(),
                    value: r.value.clone(),
                    headers,
                    timestamp: Some(r.timestamp),
                    when: None,
                };
                deliveries.push(producer.send(record).await?);
            }
        }
        for d in deliveries {
            d.await.with_context(|| format!("copying to {recovered}/{partition}"))?;
        }
        producer.close().await;
    }
    let end = new.list_offset(&recovered, partition, OffsetSpec::Latest).await?.log_end_offset;
    // The records of this run and of the runs before it are the last `old_end - split` of the partition.
    Ok((end.saturating_sub(old_end - split), end))
}

/// Moves every group's committed offset on the old primary's `topic` that is past its partition's split back to
/// the split (the records past it are in `.recovered` now; consumers read on from the new history).
pub async fn clamp_groups(old: &Admin, topic: &str, splits: &[(u32, u64)]) -> anyhow::Result<()> {
    let partitions: Vec<(String, u32)> = splits.iter().map(|(p, _)| (topic.to_owned(), *p)).collect();
    for g in old.list_groups().await.context("listing the old primary's groups")? {
        let committed = old.fetch_committed_offsets(&g.group, &partitions).await?;
        let moved: Vec<pb::CommittedOffset> = committed
            .into_iter()
            .filter_map(|mut c| {
                let split = splits.iter().find(|(p, _)| *p == c.partition)?.1;
                (c.topic == topic && c.offset > split).then(|| {
                    c.offset = split;
                    c
                })
            })
            .collect();
        if !moved.is_empty() {
            println!("group {:?}: {} committed offsets on {topic} moved back to the split", g.group, moved.len());
            old.commit_offsets(&g.group, moved)
                .await
                .with_context(|| format!("moving group {:?}'s offsets", g.group))?;
        }
    }
    Ok(())
}

/// Keeps the receipt as a job record on the new primary (`failback.{old}`), for the record; a failure is reported,
/// not fatal (the receipt was printed).
pub async fn record_receipt(new: &Admin, old_alias: &str, receipt: &[Kept]) {
    let id = ferry_mirror::failover::job::job_id(old_alias).replacen("failover.", "failback.", 1);
    let body = Bytes::from(serde_json::to_vec(receipt).unwrap_or_default());
    let version = match new.get_job(&id).await {
        Ok(found) => found.map_or(0, |j| j.version),
        Err(e) => {
            eprintln!("cannot keep the receipt on the new primary: {e}");
            return;
        }
    };
    if let Err(e) = new.put_job(&id, version, body).await {
        eprintln!("cannot keep the receipt on the new primary: {e}");
    }
}
