//! The consumer's partitions: their state, batching of received records, credits (pausing), and the commands
//! that add, remove and re-seat them.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use ferry_batch::Header;
use ferry_client::proto as pb;
use rdkafka::consumer::Consumer;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::{KafkaConsumerSettings, KafkaSourceConsumer, Kc};
use crate::kafka::convert::{PartitionBatcher, Pushed};
use crate::kafka::watermarks::Tp;
use crate::source::{ConsumerCmd, PartitionSink, SourceMsg, SourcePos};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PartState {
    /// Assigned in librdkafka and fetching.
    Fetching,
    /// Its topic or partition does not exist (reported; checked again).
    Missing,
    /// Its position is outside the log (reported); waits for a re-seat.
    Stopped,
}

pub(super) struct Part {
    pub(super) sink: PartitionSink,
    pub(super) batcher: PartitionBatcher,
    pub(super) state: PartState,
    pub(super) paused: bool,
    pub(super) lo: u64,
    pub(super) hi: u64,
    pub(super) topic_id: String,
}

impl Part {
    pub(super) fn new(topic: &str, sink: PartitionSink, settings: &KafkaConsumerSettings) -> Part {
        let at = sink.flow.fetch_position.load(Ordering::Acquire);
        Part {
            sink,
            batcher: PartitionBatcher::new(at, settings.max_batch_bytes, settings.compression),
            state: PartState::Fetching,
            paused: false,
            lo: 0,
            hi: 0,
            topic_id: crate::kafka::kafka_topic_id(topic),
        }
    }

    /// Whether librdkafka fetches it now.
    pub(super) fn assigned(&self) -> bool {
        self.state == PartState::Fetching && !self.paused
    }

    /// Whether its queue (with the open batch) reached its window.
    pub(super) fn full(&self) -> bool {
        let window = self.sink.flow.window();
        window > 0 && self.sink.flow.queued.load(Ordering::Relaxed) + self.batcher.pending_bytes() >= window
    }

    pub(super) fn pos(&self) -> SourcePos {
        SourcePos {
            log_start: self.lo,
            log_end: self.hi.max(self.batcher.expected()),
            epoch: 0,
            topic_id: self.topic_id.clone(),
        }
    }
}

pub(super) fn tpl_of<'a>(items: impl IntoIterator<Item = (&'a Tp, Option<u64>)>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for ((t, p), at) in items {
        match at {
            Some(o) => {
                let _ = tpl.add_partition_offset(t, *p as i32, Offset::Offset(o as i64));
            }
            None => {
                tpl.add_partition(t, *p as i32);
            }
        }
    }
    tpl
}

fn headers_of(m: &BorrowedMessage<'_>) -> Vec<Header> {
    let Some(hs) = m.headers() else { return Vec::new() };
    hs.iter().map(|h| Header { key: h.key.to_owned(), value: h.value.map(bytes::Bytes::copy_from_slice) }).collect()
}

impl KafkaSourceConsumer {
    pub(super) fn on_message(&mut self, consumer: &Kc, m: &BorrowedMessage<'_>) {
        let Ok(partition) = u32::try_from(m.partition()) else { return };
        let tp = (m.topic().to_owned(), partition);
        let Some(part) = self.parts.get_mut(&tp) else { return };
        // Records of a partition taken out of the assignment are fetched again when it is assigned back.
        if !part.assigned() || m.offset() < 0 {
            return;
        }
        let headers = headers_of(m);
        let ts = m.timestamp().to_millis().unwrap_or(-1);
        if let Pushed::Completed(bytes, records) =
            part.batcher.push(m.offset() as u64, ts, m.key(), m.payload(), &headers)
        {
            self.deliver(&tp, bytes, records);
        }
        if self.parts.get(&tp).is_some_and(Part::full) {
            if let Some((bytes, records)) = self.parts.get_mut(&tp).and_then(|p| p.batcher.flush()) {
                self.deliver(&tp, bytes, records);
            }
            self.pause(consumer, tp);
        }
    }

    /// Takes a partition out of the assignment until its queue drains.
    pub(super) fn pause(&mut self, consumer: &Kc, tp: Tp) {
        if let Some(p) = self.parts.get_mut(&tp)
            && p.assigned()
        {
            p.paused = true;
            self.unassign(consumer, &[tp]);
        }
    }

    /// Sends one batch to its producer.
    pub(super) fn deliver(&mut self, tp: &Tp, bytes: bytes::Bytes, records: u64) {
        let Some(part) = self.parts.get_mut(tp) else { return };
        let n = bytes.len() as u64;
        part.sink.flow.queued.fetch_add(n, Ordering::Relaxed);
        self.metrics.received(records, n);
        self.shared.source_rates.add(records, n);
        let pos = part.pos();
        if part.sink.tx.send(SourceMsg::Data { batches: bytes, records, pos }).is_err() {
            // The producer stopped: stop fetching the partition.
            self.parts.remove(tp);
        }
    }

    pub(super) fn flush_all(&mut self, consumer: &Kc) {
        let ready: Vec<Tp> =
            self.parts.iter().filter(|(_, p)| p.batcher.has_pending()).map(|(tp, _)| tp.clone()).collect();
        for tp in ready {
            if let Some((bytes, records)) = self.parts.get_mut(&tp).and_then(|p| p.batcher.flush()) {
                self.deliver(&tp, bytes, records);
            }
        }
        self.credits(consumer);
    }

    /// Pauses partitions whose queue reached their window; assigns paused ones again once below half of it.
    pub(super) fn credits(&mut self, consumer: &Kc) {
        let (mut pause, mut resume) = (Vec::new(), Vec::new());
        for (tp, p) in self.parts.iter_mut() {
            if p.state != PartState::Fetching {
                continue;
            }
            let window = p.sink.flow.window();
            let queued = p.sink.flow.queued.load(Ordering::Relaxed);
            if !p.paused && p.full() {
                p.paused = true;
                pause.push(tp.clone());
            } else if p.paused && (window == 0 || queued <= window / 2) {
                p.paused = false;
                resume.push((tp.clone(), p.batcher.expected()));
            }
        }
        self.unassign(consumer, &pause);
        self.assign(consumer, &resume);
    }

    /// Applies a command; true when topic metadata should be checked.
    pub(super) fn on_command(&mut self, cmd: ConsumerCmd, consumer: &Kc, topics: &BTreeMap<String, u32>) -> bool {
        let mut check = false;
        match cmd {
            ConsumerCmd::Add(list) => {
                let mut assign = Vec::new();
                let mut unassign = Vec::new();
                for (tp, sink) in list {
                    if self.parts.get(&tp).is_some_and(Part::assigned) {
                        unassign.push(tp.clone());
                    }
                    let mut part = Part::new(&tp.0, sink, &self.settings);
                    if topics.get(&tp.0).is_some_and(|&n| tp.1 < n) {
                        assign.push((tp.clone(), part.batcher.expected()));
                    } else {
                        part.state = PartState::Missing;
                        check = true;
                    }
                    self.parts.insert(tp, part);
                }
                self.unassign(consumer, &unassign);
                self.assign(consumer, &assign);
                self.report_missing();
            }
            ConsumerCmd::Remove(list) => {
                let fetching: Vec<Tp> =
                    list.iter().filter(|tp| self.parts.get(*tp).is_some_and(Part::assigned)).cloned().collect();
                self.unassign(consumer, &fetching);
                for tp in list {
                    self.parts.remove(&tp);
                }
            }
            ConsumerCmd::Reseat(tp) => {
                let Some(p) = self.parts.get_mut(&tp) else { return false };
                let was_fetching = p.assigned();
                let at = p.sink.flow.fetch_position.load(Ordering::Acquire);
                p.batcher.reset(at);
                p.paused = false;
                if p.state == PartState::Missing {
                    return true;
                }
                p.state = PartState::Fetching;
                if was_fetching {
                    self.unassign(consumer, std::slice::from_ref(&tp));
                }
                self.assign(consumer, &[(tp, at)]);
            }
        }
        check
    }

    pub(super) fn assign(&self, consumer: &Kc, list: &[(Tp, u64)]) {
        if list.is_empty() {
            return;
        }
        if let Err(e) = consumer.incremental_assign(&tpl_of(list.iter().map(|(tp, at)| (tp, Some(*at))))) {
            tracing::warn!(error = %e, "cannot assign Kafka partitions");
        }
    }

    pub(super) fn unassign(&self, consumer: &Kc, list: &[Tp]) {
        if list.is_empty() {
            return;
        }
        if let Err(e) = consumer.incremental_unassign(&tpl_of(list.iter().map(|tp| (tp, None)))) {
            tracing::warn!(error = %e, "cannot unassign Kafka partitions");
        }
    }

    /// Tells the producers of missing partitions that their topic or partition does not exist.
    pub(super) fn report_missing(&mut self) {
        for ((topic, partition), p) in &self.parts {
            if p.state == PartState::Missing {
                let message = format!(
                    "Kafka topic {topic} has no partition {partition} (the topic does not exist or has fewer partitions)"
                );
                let _ = p.sink.tx.send(SourceMsg::Error {
                    code: pb::ErrorCode::UnknownTopicOrPartition,
                    message,
                    pos: SourcePos { topic_id: p.topic_id.clone(), ..Default::default() },
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_lists_carry_offsets() {
        let a: Tp = ("t".into(), 1);
        let b: Tp = ("u".into(), 0);
        let tpl = tpl_of([(&a, Some(5)), (&b, None)]);
        let elems = tpl.elements();
        assert_eq!(elems.len(), 2);
        assert_eq!((elems[0].topic(), elems[0].partition(), elems[0].offset()), ("t", 1, Offset::Offset(5)));
        assert_eq!((elems[1].topic(), elems[1].partition()), ("u", 0));
    }
}
