//! The session's partitions: their state, batching of received records, credits (pausing), and following the
//! partition set and the lanes' seats.

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_client::batch::{Batch, Header};
use rdkafka::consumer::Consumer;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::{KafkaConsumerSettings, KafkaSession, Kc};
use crate::fetch::PartitionSet;
use crate::kafka::convert::{PartitionBatcher, Pushed};
use crate::kafka::watermarks::Tp;
use crate::lane::core::{SourceFault, SourcePos};
use crate::lane::link::LaneLink;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PartState {
    /// Its lane wants no data now: not assigned.
    Idle,
    /// Assigned in librdkafka and fetching.
    Fetching,
    /// Its topic or partition does not exist (reported; checked again).
    Missing,
    /// Its position is outside the log (reported); waits for a re-seat.
    Stopped,
}

pub(super) struct Part {
    pub(super) link: Arc<LaneLink>,
    /// The link's seat version this partition follows, and the seat its data carries.
    pub(super) version: u64,
    pub(super) seat: Option<u64>,
    pub(super) batcher: PartitionBatcher,
    pub(super) state: PartState,
    pub(super) paused: bool,
    pub(super) lo: u64,
    pub(super) hi: u64,
    pub(super) topic_id: String,
}

impl Part {
    fn new(link: Arc<LaneLink>, settings: &KafkaConsumerSettings) -> Part {
        let topic_id = crate::kafka::kafka_topic_id(link.tp.topic());
        Part {
            batcher: PartitionBatcher::new(link.fetch_from(), settings.max_batch_bytes, settings.compression),
            link,
            version: u64::MAX,
            seat: None,
            state: PartState::Idle,
            paused: false,
            lo: 0,
            hi: 0,
            topic_id,
        }
    }

    /// Whether librdkafka fetches it now.
    pub(super) fn assigned(&self) -> bool {
        self.state == PartState::Fetching && !self.paused
    }

    /// Whether its lane holds (with the open batch) its whole window.
    pub(super) fn full(&self) -> bool {
        let budget = &self.link.budget;
        let window = budget.window();
        window > 0 && budget.fetched() + self.batcher.pending_bytes() >= window
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

impl KafkaSession {
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

    /// Takes a partition out of the assignment until its lane drains.
    pub(super) fn pause(&mut self, consumer: &Kc, tp: Tp) {
        if let Some(p) = self.parts.get_mut(&tp)
            && p.assigned()
        {
            p.paused = true;
            self.unassign(consumer, &[tp]);
        }
    }

    /// Hands one batch to its lane.
    pub(super) fn deliver(&mut self, tp: &Tp, bytes: bytes::Bytes, records: u64) {
        let Some(part) = self.parts.get_mut(tp) else { return };
        let Some(seat) = part.seat else { return };
        let n = bytes.len() as u64;
        let Ok(batch) = Batch::parse(bytes) else {
            tracing::error!(topic = %tp.0, partition = tp.1, "a batch built from Kafka records does not parse");
            return;
        };
        self.metrics.received(records, n);
        self.shared.source_rates.add(records, n);
        let held = part.link.budget.hold(n);
        part.link.deliver(seat, vec![batch], held, part.pos());
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

    /// Pauses partitions whose lane reached its window; assigns paused ones again once below half of it.
    pub(super) fn credits(&mut self, consumer: &Kc) {
        let (mut pause, mut resume) = (Vec::new(), Vec::new());
        for (tp, p) in self.parts.iter_mut() {
            if p.state != PartState::Fetching {
                continue;
            }
            let budget = &p.link.budget;
            let window = budget.window();
            if !p.paused && p.full() {
                p.paused = true;
                pause.push(tp.clone());
            } else if p.paused && (window == 0 || budget.fetched() <= window / 2) {
                p.paused = false;
                resume.push((tp.clone(), p.batcher.expected()));
            }
        }
        self.unassign(consumer, &pause);
        self.assign(consumer, &resume);
    }

    /// Follows the partition set and the lanes' seats; true when topic metadata should be checked.
    pub(super) fn reconcile(&mut self, consumer: &Kc, set: &PartitionSet, topics: &BTreeMap<String, u32>) -> bool {
        let (_, lanes) = set.snapshot();
        let wanted: BTreeMap<Tp, Arc<LaneLink>> =
            lanes.into_iter().map(|l| ((l.tp.topic().to_owned(), l.tp.partition), l)).collect();
        let gone: Vec<Tp> = self.parts.keys().filter(|tp| !wanted.contains_key(*tp)).cloned().collect();
        let fetching: Vec<Tp> =
            gone.iter().filter(|tp| self.parts.get(*tp).is_some_and(Part::assigned)).cloned().collect();
        self.unassign(consumer, &fetching);
        for tp in gone {
            self.parts.remove(&tp);
        }
        let (mut assign, mut unassign, mut check) = (Vec::new(), Vec::new(), false);
        for (tp, link) in wanted {
            let settings = &self.settings;
            let part = self.parts.entry(tp.clone()).or_insert_with(|| Part::new(Arc::clone(&link), settings));
            let (version, wish) = link.seat();
            if part.version == version {
                continue;
            }
            part.version = version;
            if part.assigned() {
                unassign.push(tp.clone());
            }
            part.paused = false;
            match wish {
                None => {
                    part.seat = None;
                    part.state = PartState::Idle;
                }
                Some((seat, _)) => {
                    part.seat = Some(seat);
                    let at = link.fetch_from();
                    part.batcher.reset(at);
                    if topics.get(&tp.0).is_some_and(|&n| tp.1 < n) {
                        part.state = PartState::Fetching;
                        assign.push((tp, at));
                    } else {
                        part.state = PartState::Missing;
                        check = true;
                    }
                }
            }
        }
        self.unassign(consumer, &unassign);
        self.assign(consumer, &assign);
        self.report_missing();
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

    /// Tells the lanes of missing partitions that their topic or partition does not exist.
    pub(super) fn report_missing(&mut self) {
        for ((topic, partition), p) in &self.parts {
            if p.state == PartState::Missing {
                let message = format!(
                    "Kafka topic {topic} has no partition {partition} (the topic does not exist or has fewer partitions)"
                );
                let pos = SourcePos { topic_id: p.topic_id.clone(), ..Default::default() };
                p.link.error(SourceFault::Missing, message, pos);
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
