//! Reading a whole partition with plain fetches (no consumer logic), shared by the end-to-end test binaries
//! (`#[path]`-included): every batch's CRC is checked and offsets must strictly increase, so a duplicate or a
//! reordering fails the read itself.

// Not every binary that includes this uses every field.
#![allow(dead_code)]

use anyhow::{Context, ensure};
use ferry_batch::{self as batch, BatchIter, Record};
use ferry_client::proto as pb;
use ferry_client::{Admin, BrokerClient};

/// A partition as read from the log.
#[derive(Debug, Clone, Default)]
pub struct PartitionRead {
    pub log_start: u64,
    /// Where the read stopped: the log end at the call, or `until` when lower.
    pub log_end: u64,
    /// Each stored batch once: (base offset, last offset, epoch, CRC).
    pub batches: Vec<(u64, u64, u32, u32)>,
    pub records: Vec<Record>,
}

/// Reads `topic`/`partition` from its log start up to `until` (default: the log end at the call).
pub async fn read_partition(
    client: &BrokerClient,
    topic: &str,
    partition: u32,
    until: Option<u64>,
) -> anyhow::Result<PartitionRead> {
    let d = Admin::new(client.clone()).describe_topic(topic).await.with_context(|| format!("describe {topic}"))?;
    let p = d
        .partitions
        .iter()
        .find(|p| p.partition == partition)
        .with_context(|| format!("{topic} has no partition {partition}"))?;
    let end = until.map_or(p.log_end_offset, |u| u.min(p.log_end_offset));
    let mut out = PartitionRead { log_start: p.log_start_offset, log_end: end, ..Default::default() };
    let mut position = p.log_start_offset;
    let mut redirects = 0;
    while position < end {
        // At the partition's leader as the client knows it; a NOT_LEADER answer naming one is followed.
        let response = client
            .for_partition(topic, partition)
            .fetch(pb::FetchRequest {
                partitions: vec![pb::PartitionFetch {
                    topic: topic.to_owned(),
                    partition,
                    offset: position,
                    max_bytes: 4 << 20,
                    leader_epoch: None,
                }],
                max_wait_ms: 0,
                max_bytes: 8 << 20,
            })
            .await
            .with_context(|| format!("fetch {topic}/{partition} at {position}"))?;
        let data = &response.partitions[0];
        let moved =
            data.error == pb::ErrorCode::NotLeader as i32 || data.error == pb::ErrorCode::FencedLeaderEpoch as i32;
        if let (true, Some(hint)) = (moved, &data.leader)
            && redirects < 10
        {
            redirects += 1;
            client.take_hint(topic, partition, hint);
            continue;
        }
        ensure!(data.error == pb::ErrorCode::None as i32, "fetch {topic}/{partition} at {position}: {}", data.message);
        ensure!(!data.batches.is_empty(), "fetch {topic}/{partition} at {position} below {end} returned nothing");
        for item in BatchIter::new(&data.batches) {
            let (header, bytes) = item.context("whole batches")?;
            if header.base_offset >= end {
                break;
            }
            batch::verify(bytes).context("batch CRC")?;
            if header.last_offset() >= position && out.batches.last().is_none_or(|b| b.0 < header.base_offset) {
                out.batches.push((header.base_offset, header.last_offset(), header.epoch, header.crc));
            }
            for r in batch::decode_records(bytes).context("decodable batch")? {
                if r.offset < position || r.offset >= end {
                    continue;
                }
                if let Some(prev) = out.records.last() {
                    ensure!(r.offset > prev.offset, "{topic}/{partition}: offset {} after {}", r.offset, prev.offset);
                }
                out.records.push(r);
            }
            position = position.max(header.next_offset());
        }
        position = position.max(data.next_offset);
    }
    Ok(out)
}
