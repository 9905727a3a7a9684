//! A read-committed reader of single partitions, shared by both sides for exact log bounds and by the target for
//! its provenance reads.
//!
//! The log end is not taken from `ListOffsets` alone: some Kafka-API brokers answer it with less than the log
//! holds (tansu 0.6 answers the last batch's base offset + 1). The reader starts at that answer and reads to the
//! end of the partition as fetch responses report it (librdkafka's partition EOF), which costs one empty fetch on a
//! broker that answers correctly. With `isolation.level = read_committed` the end is the last stable offset.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::props::Ctx;

/// Reads partitions one at a time (callers serialise).
pub(crate) struct Reader {
    pub(crate) consumer: BaseConsumer<Ctx>,
    pub(crate) timeout: Duration,
}

impl Reader {
    /// (log start, one past the last visible record) of a partition.
    pub(crate) fn bounds(&self, topic: &str, partition: u32) -> Result<(i64, i64), KafkaError> {
        let (lo, hi) = self.consumer.fetch_watermarks(topic, partition as i32, self.timeout)?;
        let (lo, hi) = (lo.max(0), hi.max(lo).max(0));
        let beyond = self.read(topic, partition, hi, i64::MAX, usize::MAX, |_| ())?;
        Ok((lo, beyond.last().map_or(hi, |(o, _)| o + 1)))
    }

    /// Visible records in `[from, to)` (`to = i64::MAX`: to the end), mapped by `f`, in offset order, at most
    /// `max`. A position outside the log reads nothing.
    pub(crate) fn read<T>(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        to: i64,
        max: usize,
        mut f: impl FnMut(&BorrowedMessage<'_>) -> T,
    ) -> Result<Vec<(i64, T)>, KafkaError> {
        let mut out = Vec::new();
        if from >= to || max == 0 {
            return Ok(out);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition as i32, Offset::Offset(from))?;
        self.consumer.assign(&tpl)?;
        let deadline = Instant::now() + self.timeout;
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OperationTimedOut));
            }
            match self.consumer.poll(left) {
                None => continue,
                Some(Ok(m)) => {
                    if m.topic() != topic || m.partition() != partition as i32 || m.offset() < from {
                        continue;
                    }
                    if m.offset() >= to {
                        break Ok(());
                    }
                    out.push((m.offset(), f(&m)));
                    if m.offset().saturating_add(1) >= to || out.len() >= max {
                        break Ok(());
                    }
                }
                Some(Err(KafkaError::PartitionEOF(p))) if p == partition as i32 => break Ok(()),
                Some(Err(KafkaError::PartitionEOF(_))) => continue,
                Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange))) => break Ok(()),
                Some(Err(e)) => break Err(e),
            }
        };
        let _ = self.consumer.unassign();
        result.map(|()| out)
    }
}
