//! Appending to a Kafka target: the records of the offered batches that the partition does not hold yet, in
//! order, with provenance; the outcome in source offsets.

use ferry_batch::{Batch, Record, decode_records_bounded};
use ferry_client::Code;

use super::KafkaTarget;
use super::provenance::Origin;
use super::writer::Writer;
use crate::cluster::{AppendOutcome, Result};
use crate::kafka::error::status;

impl KafkaTarget {
    /// Writes the records of `batches` not yet in the partition.
    pub(super) async fn append_locked(
        &self,
        writer: &mut Writer,
        topic: &str,
        origin: &Origin,
        source_topic_id: &str,
        source_log_start: u64,
        batches: &[Batch],
    ) -> Result<AppendOutcome> {
        let tp = (topic.to_owned(), origin.partition);
        let brokers = self.inner.clients.brokers_text();
        if batches.is_empty() {
            if source_log_start > writer.log_end {
                // An empty target positioned at a start point, or a source retention gap carried over.
                if writer.log_end == 0 {
                    self.inner.starts.lock().insert(tp.clone(), source_log_start);
                }
                writer.log_end = source_log_start;
            }
            return Ok(AppendOutcome::Appended { log_end: writer.log_end, written: 0, present: 0 });
        }
        let (mut written, mut present) = (0u32, 0u32);
        let mut records: Vec<Record> = Vec::new();
        let mut cursor = writer.log_end;
        for (i, batch) in batches.iter().enumerate() {
            let header = batch.header();
            if i == 0 && header.base_offset > writer.log_end && source_log_start != header.base_offset {
                return Ok(AppendOutcome::GapRefused(format!(
                    "batch at offset {} is above the Kafka target's log end {} (source offsets) and does not start at \
                     the source log start {source_log_start}",
                    header.base_offset, writer.log_end
                )));
            }
            if header.last_offset() < writer.log_end {
                present += 1;
                continue;
            }
            let decoded = decode_records_bounded(batch.bytes(), self.inner.decode_limit).map_err(|e| {
                status(
                    Code::InvalidArgument,
                    format!(
                        "{topic}/{}: batch at offset {} cannot be decoded: {e}",
                        origin.partition, header.base_offset
                    ),
                    brokers,
                )
            })?;
            written += 1;
            for r in decoded {
                if r.offset >= cursor {
                    cursor = r.offset.saturating_add(1);
                    records.push(r);
                }
            }
        }
        if !records.is_empty() {
            let pairs = writer.write(&records, origin, source_topic_id).await?;
            let mut maps = self.inner.maps.lock();
            let map = maps.entry(tp.clone()).or_default();
            for (src, tgt) in pairs {
                map.record(src, tgt);
            }
            writer.log_end = cursor;
            self.remember_topic_id(topic, Some(source_topic_id));
        }
        Ok(AppendOutcome::Appended { log_end: writer.log_end, written, present })
    }
}
