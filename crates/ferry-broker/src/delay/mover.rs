//! The timer's driver: every tick, for each delay-store partition this broker owns, it performs the firings
//! recorded but not finished, takes the slots that have come round off the wheel, and fires what is due (intent
//! first, then the handler, then the fired record). See the module docs of `crate::delay`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::codec::{Intent, StoreRecord, encode};
use super::core::{DelayId, Waiting, pick_due};
use super::partition::{Loaded, PartState, read_ids};
use super::{DELAY_TOPIC, Delays, FiredEntry, Firing, index_error, now_slot, show};
use crate::error::{BrokerError, Result};
use crate::state::{Entry, Owned};

/// Most entries in one firing.
const FIRING_ENTRIES: usize = 5_000;
/// Most payload bytes in one firing.
const FIRING_BYTES: u64 = 512 * 1024;
/// Lateness samples kept for the percentiles.
const SAMPLES: usize = 10_000;

/// Counters of the mover, for metrics and describe.
#[derive(Debug, Default)]
pub struct MoverStats {
    /// Entries fired.
    pub moves: AtomicU64,
    lateness: parking_lot::Mutex<VecDeque<u64>>,
}

impl MoverStats {
    fn note(&self, lateness_ms: u64) {
        self.moves.fetch_add(1, Ordering::Relaxed);
        let mut l = self.lateness.lock();
        if l.len() == SAMPLES {
            l.pop_front();
        }
        l.push_back(lateness_ms);
    }

    /// The p50 and p99 lateness (ms after the due time an entry fired) over the last fired entries.
    pub fn lateness(&self) -> Option<(u64, u64)> {
        let mut v: Vec<u64> = self.lateness.lock().iter().copied().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some((at(0.5), at(0.99)))
    }
}

impl Delays {
    /// Entries fired since start, and the lateness percentiles.
    pub fn mover_stats(&self) -> (u64, Option<(u64, u64)>) {
        (self.stats.moves.load(Ordering::Relaxed), self.stats.lateness())
    }

    /// Runs the timer until `stop`, waking every `tick`.
    pub async fn run(self: Arc<Self>, tick: Duration, stop: CancellationToken) {
        let mut timer = tokio::time::interval(tick);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = timer.tick() => {
                    let owned = self.logs.owned(&DELAY_TOPIC);
                    for k in 0..DELAY_TOPIC.partitions {
                        if !owned.iter().any(|o| o.k == k) {
                            self.note_gauges(k, None);
                        }
                    }
                    for owned in owned {
                        if let Err(e) = self.step(owned.k).await {
                            tracing::warn!(partition = owned.k, error = %e, "the delay timer's step failed; retried next tick");
                        }
                    }
                }
            }
        }
    }

    /// One tick of partition `k`.
    pub(super) async fn step(&self, k: u32) -> Result<()> {
        let (owned, mut guard) = self.lock(k).await?;
        let Some(state) = guard.as_mut() else { return Ok(()) };
        let mut result = self.step_locked(&owned, state).await;
        if result.is_ok() {
            result = self.maybe_compact(&owned, state).await;
        }
        if result.is_err() {
            // The log may or may not hold what was being written: the next tick rebuilds from it.
            *guard = None;
        }
        self.note_gauges(k, guard.as_ref());
        result
    }

    async fn step_locked(&self, owned: &Owned, state: &mut PartState) -> Result<()> {
        // Firings recorded by this or an earlier owner but not known to be performed, in order.
        let unfinished: Vec<(u64, Intent)> = state.unfinished.iter().map(|(o, i)| (*o, i.clone())).collect();
        for (offset, intent) in unfinished {
            let ids: Vec<u64> = intent.ids.iter().map(|(id, _, _)| *id).collect();
            let part = Arc::clone(&owned.part);
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            let found = tokio::task::spawn_blocking(move || read_ids(&part, &sorted))
                .await
                .map_err(|e| BrokerError::Internal(format!("the delay read task failed: {e}")))??;
            let payloads: HashMap<u64, Bytes> = found
                .into_iter()
                .filter_map(|(id, r)| match r {
                    StoreRecord::Schedule { payload, .. } => Some((id, payload)),
                    _ => None,
                })
                .collect();
            let entries = intent
                .ids
                .iter()
                .map(|(id, due, _)| FiredEntry {
                    id: DelayId { partition: owned.k, offset: *id },
                    due_ms: *due,
                    payload: payloads.get(id).cloned().unwrap_or_default(),
                })
                .collect();
            let firing = Firing { kind: intent.kind, key: intent.key.clone(), first_seq: intent.first_seq, entries };
            self.perform(owned, state, offset, &firing).await?;
        }
        // Streams whose firing is still unfinished fire nothing new until it is.
        let blocked_streams: HashSet<(u8, Bytes)> =
            state.unfinished.values().map(|i| (i.kind, i.key.clone())).collect();
        // The slots that have come round.
        let (now, slot) = now_slot();
        let part = Arc::clone(&owned.part);
        let taken = state.wheel.take_through(slot).map_err(index_error)?;
        if !taken.is_empty() {
            let ids: Vec<u64> = {
                let mut ids: Vec<u64> = taken.iter().map(|e| e.id).collect();
                ids.sort_unstable();
                ids
            };
            let found = tokio::task::spawn_blocking(move || read_ids(&part, &ids))
                .await
                .map_err(|e| BrokerError::Internal(format!("the delay read task failed: {e}")))??;
            let mut records: HashMap<u64, StoreRecord> = found.into_iter().collect();
            for entry in taken {
                if let Some(StoreRecord::Schedule { kind, key, payload, .. }) = records.remove(&entry.id) {
                    state.current.push(Loaded { entry, stream: (kind, key), payload });
                }
            }
        }
        if state.current.is_empty() {
            return Ok(());
        }
        // What is due now, stream by stream, in order.
        let group_of: HashMap<(u8, Bytes), u64> = {
            let mut m = HashMap::new();
            for l in &state.current {
                let n = m.len() as u64;
                m.entry(l.stream.clone()).or_insert(n);
            }
            m
        };
        let waiting: Vec<Waiting> =
            state.current.iter().map(|l| Waiting { group: group_of[&l.stream], due_ms: l.entry.due_ms }).collect();
        let blocked: HashSet<u64> =
            group_of.iter().filter(|(s, _)| blocked_streams.contains(*s)).map(|(_, g)| *g).collect();
        let picked = pick_due(&waiting, now, &blocked);
        if picked.is_empty() {
            return Ok(());
        }
        let picked_set: HashSet<usize> = picked.iter().copied().collect();
        let mut by_stream: Vec<((u8, Bytes), Vec<Loaded>)> = Vec::new();
        let mut rest = Vec::with_capacity(state.current.len() - picked.len());
        for (i, l) in std::mem::take(&mut state.current).into_iter().enumerate() {
            if !picked_set.contains(&i) {
                rest.push(l);
                continue;
            }
            match by_stream.iter_mut().find(|(s, _)| *s == l.stream) {
                Some((_, v)) => v.push(l),
                None => by_stream.push((l.stream.clone(), vec![l])),
            }
        }
        state.current = rest;
        for (stream, loaded) in by_stream {
            let mut chunk: Vec<Loaded> = Vec::new();
            let mut bytes = 0u64;
            let mut pending = loaded.into_iter().peekable();
            while let Some(l) = pending.next() {
                bytes += u64::from(l.entry.bytes);
                chunk.push(l);
                let full = chunk.len() >= FIRING_ENTRIES || bytes >= FIRING_BYTES;
                if full || pending.peek().is_none() {
                    let batch = std::mem::take(&mut chunk);
                    if let Err(e) = self.fire_new(owned, state, &stream, batch, bytes).await {
                        // Entries not yet recorded in an intent go back to wait for the next tick.
                        let mut back: Vec<Loaded> = pending.collect();
                        back.append(&mut state.current);
                        state.current = back;
                        return Err(e);
                    }
                    bytes = 0;
                }
            }
        }
        Ok(())
    }

    /// Records an intent for `batch` of `stream`, then performs it.
    async fn fire_new(
        &self,
        owned: &Owned,
        state: &mut PartState,
        stream: &(u8, Bytes),
        batch: Vec<Loaded>,
        bytes: u64,
    ) -> Result<()> {
        let first_seq = state.seqs.get(stream).copied().unwrap_or(0);
        let intent = Intent {
            kind: stream.0,
            key: stream.1.clone(),
            first_seq,
            bytes,
            ids: batch.iter().map(|l| (l.entry.id, l.entry.due_ms, l.entry.bytes)).collect(),
        };
        let entry = Entry { key: stream.1.clone(), value: encode(&StoreRecord::Intent(intent.clone())) };
        let written = self.logs.append(owned, &[entry]).await?;
        let offset = written.first().map_or(0, |p| p.base_offset);
        state.intended(offset, intent).map_err(index_error)?;
        let entries = batch
            .into_iter()
            .map(|l| FiredEntry {
                id: DelayId { partition: owned.k, offset: l.entry.id },
                due_ms: l.entry.due_ms,
                payload: l.payload,
            })
            .collect();
        let firing = Firing { kind: stream.0, key: stream.1.clone(), first_seq, entries };
        self.perform(owned, state, offset, &firing).await
    }

    /// Calls the handler of a recorded firing and, once it succeeded, records that it was performed. A handler's
    /// failure leaves the intent unfinished (performed again on the next tick) and is not an error of the step.
    async fn perform(&self, owned: &Owned, state: &mut PartState, offset: u64, firing: &Firing) -> Result<()> {
        let handler = self.handlers.read().get(&firing.kind).cloned();
        let Some(handler) = handler else {
            return Err(BrokerError::Internal(format!("no handler for delayed entries of kind {}", firing.kind)));
        };
        if let Err(e) = handler.fire(firing).await {
            tracing::warn!(stream = %show(&(firing.kind, firing.key.clone())), error = %e, "a delayed firing failed; retried next tick");
            return Ok(());
        }
        let now = super::now_ms();
        for e in &firing.entries {
            self.stats.note(u64::try_from(now - e.due_ms).unwrap_or(0));
        }
        let done = Entry { key: firing.key.clone(), value: encode(&StoreRecord::Fired { intent: offset }) };
        self.logs.append(owned, &[done]).await?;
        state.unfinished.remove(&offset);
        Ok(())
    }
}
