//! One lane per mirrored partition: the decision core ([`core`]) and the thin driver that performs what it decides.
//!
//! The lane owns the partition's flow control: its memory [`budget::Budget`] (every byte it holds is a
//! [`budget::Held`] value), its [`link::LaneLink`] (where the fetch session delivers data and the SyncManager
//! delivers controls and probes, bounded by the budget and coalescing everything else), and its seat (where it
//! wants to be fetched from). A lane that is stuck (a down target, a long retry) delays nothing but itself: the
//! fetch session never waits for it, and data for it stops once its budget is full.
//!
//! The driver loop: perform the actions the core produced (at most one request in flight, raced against new
//! input), publish the status, wait for input or the request's answer, step the core, repeat. A graceful stop
//! stops fetching and appends what is pending within the drain budget; a kill stops at once.

pub mod budget;
pub mod core;
pub mod gather;
mod io;
pub mod link;
pub mod repeats;

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::core::{Action, Answer, CoreConfig, CoreEvent, Input, PartitionCore};
use self::io::Call;
pub use self::io::LaneIo;
use self::link::LaneLink;
use crate::config::OnDivergence;
use crate::events::{Details, DivergedFacts, Event, EventKind, FailureFacts, GapFacts};
use crate::metrics::Metrics;
use crate::state::{PartitionStatus, Shared, Snapshot};
use crate::tp::SourceTp;

/// What every lane shares.
#[derive(Debug, Clone)]
pub struct LaneCtx {
    /// Request I/O.
    pub io: Arc<LaneIo>,
    /// Metrics.
    pub metrics: Metrics,
    /// Shared rates.
    pub shared: Arc<Shared>,
}

/// A running lane.
#[derive(Debug)]
pub struct Lane {
    /// Its id, unique among the lanes of its owner (sent on `ended`, with its partition, when its task ends).
    pub id: u64,
    /// Its link (the fetch session and the SyncManager deliver into it).
    pub link: Arc<LaneLink>,
    /// Its status (the monitor reads it).
    pub status: Arc<PartitionStatus>,
    stop: CancellationToken,
    kill: CancellationToken,
    join: JoinHandle<()>,
}

/// What a lane's task sends when it ends: its partition and its id.
pub type Ended = (SourceTp, u64);

/// What ties a lane to whoever owns it.
#[derive(Debug)]
pub struct Owner {
    /// A child of the process's token tree: the lane ends at once when it is cancelled.
    pub kill: CancellationToken,
    /// The lane's id, unique among the owner's lanes.
    pub id: u64,
    /// Where the lane's task sends its partition and `id` when it ends, however it ends (a panic too), so an owner
    /// of many lanes need not ask each whether it has.
    pub ended: mpsc::UnboundedSender<Ended>,
}

/// Sends its lane's partition and id when dropped.
struct EndedGuard(Option<Ended>, mpsc::UnboundedSender<Ended>);

impl Drop for EndedGuard {
    fn drop(&mut self) {
        // The owner may be gone already (shutdown): nobody is left to tell.
        if let Some(ended) = self.0.take() {
            let _ = self.1.send(ended);
        }
    }
}

impl Lane {
    /// Starts a lane for `config`, tied to its owner by `owner`. [`Lane::stop`] ends it gracefully, appending what
    /// is pending within `drain`.
    pub fn spawn(
        config: CoreConfig,
        ctx: LaneCtx,
        link: Arc<LaneLink>,
        status: Arc<PartitionStatus>,
        paused: bool,
        drain: Duration,
        owner: Owner,
    ) -> Lane {
        let Owner { kill, id, ended } = owner;
        let stop = CancellationToken::new();
        let driver = Driver {
            core: PartitionCore::new(config.clone(), paused, link.budget.request()),
            config: Arc::new(config),
            ctx,
            link: Arc::clone(&link),
            status: Arc::clone(&status),
            note: Arc::new(Mutex::new(None)),
        };
        let run = driver.run(stop.clone(), kill.clone(), drain);
        let tp = link.tp.clone();
        let join = tokio::spawn(async move {
            // Dropped when the task ends: on return, and when a panic unwinds it.
            let _ended = EndedGuard(Some((tp, id)), ended);
            run.await
        });
        Lane { id, link, status, stop, kill, join }
    }

    /// Asks the lane to stop gracefully.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Whether the lane's task ended.
    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }

    /// Stops the lane gracefully and waits for it up to `budget`, then kills it.
    pub async fn shut_down(mut self, budget: Duration) {
        self.stop.cancel();
        if tokio::time::timeout(budget, &mut self.join).await.is_err() {
            tracing::warn!(tp = %self.link.tp, "partition did not drain within shutdown_timeout; stopping it");
            self.kill.cancel();
            let _ = (&mut self.join).await;
        }
    }
}

/// The request in flight: its id, whether it is an append (a drain waits for it), and its future.
type InFlight = (u64, bool, Pin<Box<dyn Future<Output = Answer> + Send>>);

struct Driver {
    core: PartitionCore,
    config: Arc<CoreConfig>,
    ctx: LaneCtx,
    link: Arc<LaneLink>,
    status: Arc<PartitionStatus>,
    note: Arc<Mutex<Option<String>>>,
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Replication latency: now less the newest record's timestamp, which the producer chose (a hostile one neither
/// overflows nor goes below zero).
fn latency_ms(now_ms: i64, max_timestamp: i64) -> u64 {
    u64::try_from(now_ms.saturating_sub(max_timestamp).max(0)).unwrap_or(u64::MAX)
}

impl Driver {
    async fn run(mut self, stop: CancellationToken, kill: CancellationToken, drain: Duration) {
        // Exposed at 0 from the start: a series that appears with its first increment is invisible to increase().
        self.ctx.metrics.lost_before_mirroring(self.config.tp.topic(), self.config.tp.partition, 0);
        let mut in_flight: Option<InFlight> = None;
        let mut draining: Option<tokio::time::Instant> = None;
        // What the status shows: published again only when it changed (publishing the same again changes nothing,
        // and an idle lane is woken by repeated facts).
        let mut published: Option<Snapshot> = None;
        // Made once: a cancellation future registers with its token when first polled, not at every wake.
        let killed = kill.cancelled();
        let stopped = stop.cancelled();
        tokio::pin!(killed, stopped);
        loop {
            for action in self.core.take_actions() {
                self.act(action, &mut in_flight, draining.is_some());
            }
            self.link.set_fetch_from(self.core.fetch_from());
            let snapshot = self.core.published(self.note.lock().as_ref());
            if published.as_ref() != Some(&snapshot) {
                self.status.publish(snapshot.clone());
                published = Some(snapshot);
            }
            if let Some(deadline) = draining {
                let appending = in_flight.as_ref().is_some_and(|(_, append, _)| *append);
                if (self.core.pending_bytes() == 0 && !appending) || tokio::time::Instant::now() >= deadline {
                    break;
                }
            }
            tokio::select! {
                biased;
                _ = &mut killed => break,
                _ = &mut stopped, if draining.is_none() => {
                    draining = Some(tokio::time::Instant::now() + drain);
                    self.link.set_seat(None);
                }
                answer = async { in_flight.as_mut().map(|(_, _, f)| f.as_mut()).expect("in flight").await }, if in_flight.is_some() => {
                    let id = in_flight.take().map_or(0, |(id, _, _)| id);
                    self.core.step(Input::Answer { id, answer });
                }
                _ = self.link.wait() => {
                    let (inputs, limit) = self.link.take();
                    if let Some(limit) = limit {
                        self.core.set_request_limit(limit);
                    }
                    for input in inputs {
                        // While draining, nothing new is taken in: what is pending goes, then the lane ends.
                        if draining.is_some() && matches!(input, Input::Data { .. }) {
                            continue;
                        }
                        self.core.step(input);
                    }
                }
                _ = async { match draining { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => break,
            }
        }
        self.ctx.metrics.remove_partition(self.config.tp.topic(), self.config.tp.partition);
    }

    fn act(&mut self, action: Action, in_flight: &mut Option<InFlight>, draining: bool) {
        match action {
            Action::Send { id, request } => {
                let append = matches!(request, self::core::Request::Append(_));
                let call = Call {
                    io: Arc::clone(&self.ctx.io),
                    config: Arc::clone(&self.config),
                    budget: Arc::clone(&self.link.budget),
                    note: Arc::clone(&self.note),
                };
                *in_flight = Some((id, append, Box::pin(call.perform(request))));
            }
            Action::Cancel => *in_flight = None,
            Action::Seat(wish) => {
                if !draining {
                    self.link.set_seat(wish);
                }
            }
            Action::Emit(event) => {
                if let CoreEvent::DataLost { start, end } = event {
                    self.ctx.metrics.lost_before_mirroring(
                        self.config.tp.topic(),
                        self.config.tp.partition,
                        end - start,
                    );
                }
                self.ctx.io.events.emit(self.event(event))
            }
            Action::Copied { records, bytes, max_timestamp } => {
                let latency = latency_ms(now_ms(), max_timestamp);
                self.status.set_latency_ms(latency);
                self.ctx.metrics.appended(records, bytes, Some(latency as f64 / 1000.0));
                self.ctx.shared.target_rates.add(records, bytes);
            }
        }
    }

    fn event(&self, event: CoreEvent) -> Event {
        let tp = &self.config.tp;
        let at = |e: Event| e.partition(tp.topic(), tp.partition);
        match event {
            CoreEvent::Diverged { at: offset, cache, reason, policy } => {
                at(Event::new(EventKind::PartitionDiverged, format!("{tp} diverged at offset {offset}: {reason}")))
                    .with(Details::Diverged(DivergedFacts {
                        offset,
                        cache_offset: cache,
                        reason,
                        policy: if policy == OnDivergence::Halt { "halt" } else { "truncate" }.to_owned(),
                    }))
            }
            CoreEvent::Halted { reason } => at(Event::new(EventKind::SyncError, format!("{tp} halted: {reason}")))
                .with(Details::Failure(FailureFacts { reason: Some(reason), ..Default::default() })),
            CoreEvent::SyncError { reason, code } => at(Event::new(EventKind::SyncError, reason.clone()))
                .with(Details::Failure(FailureFacts { reason: Some(reason), code, ..Default::default() })),
            CoreEvent::TargetLost { log_end, cache } => at(Event::new(
                EventKind::SyncError,
                format!(
                    "{tp}: the target's log end {log_end} is below the cache offset {cache}: the target lost \
                     {} records it had acknowledged; copying them again from offset {log_end}",
                    cache - log_end
                ),
            ))
            .with(Details::Failure(FailureFacts {
                target_offset: Some(log_end),
                cache_offset: Some(cache),
                ..Default::default()
            })),
            CoreEvent::DataLost { start, end } => at(Event::new(
                EventKind::DataLostBeforeMirroring,
                format!(
                    "{tp}: source retention deleted offsets [{start}, {end}) ({} records) before they were mirrored; \
                     the target records the gap",
                    end - start
                ),
            ))
            .with(Details::Gap(GapFacts { gap_start: start, gap_end: end, records: end - start })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{EndedGuard, latency_ms};
    use crate::tp::SourceTp;
    use tokio::sync::mpsc;

    #[tokio::test]
    async fn a_task_holding_the_guard_says_it_ended_however_it_ends() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let guarded = |id: u64, panics: bool| {
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ended = EndedGuard(Some((SourceTp::new("orders", id as u32), id)), tx);
                tokio::task::yield_now().await;
                assert!(!panics, "the lane's task panics");
            })
        };
        let (fine, panicked) = (guarded(7, false), guarded(8, true));
        assert!(fine.await.is_ok());
        assert!(panicked.await.unwrap_err().is_panic());
        let mut ids = vec![rx.recv().await, rx.recv().await];
        ids.sort();
        assert_eq!(ids, [Some((SourceTp::new("orders", 7), 7)), Some((SourceTp::new("orders", 8), 8))]);
        assert!(rx.try_recv().is_err(), "each says it once");
    }

    #[test]
    fn latency_survives_hostile_timestamps() {
        assert_eq!(latency_ms(10_000, 9_000), 1_000);
        assert_eq!(latency_ms(10_000, i64::MAX), 0, "a timestamp in the future");
        assert_eq!(latency_ms(10_000, i64::MIN), i64::MAX as u64, "a timestamp before anything");
        assert_eq!(latency_ms(i64::MIN, i64::MAX), 0);
    }
}
