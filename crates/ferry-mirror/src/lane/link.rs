//! The link between a partition's lane and the rest of the process: the fetch session delivers source data,
//! positions and errors into it; the SyncManager delivers operator controls and target probes; the lane takes it
//! all out in one go. The lane publishes where it wants to be fetched from (its seat) through it.
//!
//! Memory is bounded by construction: data is bounded by the partition's [`Budget`] (every delivery holds its
//! bytes), and everything else coalesces — the newest position, the newest error, the newest probe and the
//! operator's last word replace what was there — so a lane stuck retrying a down target holds a fixed few hundred
//! bytes besides its data, however long it is stuck.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ferry_client::batch::Batch;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::budget::{Budget, Held};
use super::core::{Input, SourceFault, SourcePos};
use super::repeats::Repeat;
use crate::state::PartitionStatus;
use crate::tp::{SourceTp, TargetTp};

/// Bytes a lane's link holds besides its data at most (the coalesced slots): counted against `sync.max_memory`.
pub const LINK_OVERHEAD_BYTES: u64 = 1024;

/// A delivery of fetched batches.
#[derive(Debug)]
struct Delivery {
    seat: u64,
    batches: Vec<Batch>,
    held: Held,
    pos: SourcePos,
}

#[derive(Debug, Default)]
struct Inbox {
    data: VecDeque<Delivery>,
    error: Option<(SourceFault, String, SourcePos)>,
    position: Option<SourcePos>,
    probed_log_start: Option<u64>,
    target_log_end: Option<(u64, u64)>,
    paused: Option<bool>,
    request_limit: Option<u64>,
}

/// The probes' facts last handed to a lane, each held back while it repeats (see [`crate::lane::repeats`]).
#[derive(Debug, Default)]
struct Probed {
    source_log_start: Repeat<u64>,
    /// (target log end, cache offset before the read).
    target_log_end: Repeat<(u64, u64)>,
}

/// Where the lane wants to be fetched: `Some((seat, from))`, or `None` (not now).
pub type SeatWish = Option<(u64, u64)>;

/// The link of one partition.
#[derive(Debug)]
pub struct LaneLink {
    /// The source partition.
    pub tp: SourceTp,
    /// Its memory budget.
    pub budget: Arc<Budget>,
    /// Its status, as the monitor shows it (the probes write what they read of it here without a look-up).
    pub status: Arc<PartitionStatus>,
    /// The partition it is mirrored into, as the target probe asks for it.
    pub target: TargetTp,
    /// What the probes last handed the lane: kept with the link, so that a probe round finds it without a look-up.
    probed: Mutex<Probed>,
    inbox: Mutex<Inbox>,
    wake: Notify,
    seat: Mutex<(u64, SeatWish)>,
    fetch_from: AtomicU64,
    /// The signal of the session that serves the partition now (it moves with the partition's leader).
    seats_changed: Mutex<Arc<Notify>>,
}

impl LaneLink {
    /// A link for `tp` with status `status`, whose seat changes are signalled on `seats_changed` (the fetcher's).
    pub fn new(
        tp: SourceTp,
        budget: Arc<Budget>,
        seats_changed: Arc<Notify>,
        status: Arc<PartitionStatus>,
    ) -> Arc<LaneLink> {
        let target = TargetTp::new(status.target_topic.as_str(), status.partition);
        Arc::new(LaneLink {
            tp,
            budget,
            status,
            target,
            probed: Mutex::new(Probed::default()),
            inbox: Mutex::new(Inbox::default()),
            wake: Notify::new(),
            seat: Mutex::new((0, None)),
            fetch_from: AtomicU64::new(0),
            seats_changed: Mutex::new(seats_changed),
        })
    }

    /// The partition moved to another session (its leader changed): seat changes are signalled on its
    /// `seats_changed` from now on.
    pub fn serve_from(&self, seats_changed: Arc<Notify>) {
        *self.seats_changed.lock() = seats_changed;
    }

    // ---- the fetch side ----------------------------------------------------------------------------------------

    /// The seat the lane wants, with a version that changes whenever it does.
    pub fn seat(&self) -> (u64, SeatWish) {
        *self.seat.lock()
    }

    /// Where a (re)started fetch of the current seat starts: past what the lane already holds.
    pub fn fetch_from(&self) -> u64 {
        self.fetch_from.load(Ordering::Acquire)
    }

    /// Delivers batches fetched under `seat`.
    pub fn deliver(&self, seat: u64, batches: Vec<Batch>, held: Held, pos: SourcePos) {
        self.inbox.lock().data.push_back(Delivery { seat, batches, held, pos });
        self.wake.notify_one();
    }

    /// Delivers a position heartbeat (the newest replaces an unread older one).
    pub fn position(&self, pos: SourcePos) {
        self.inbox.lock().position = Some(pos);
        self.wake.notify_one();
    }

    /// Delivers a source error (the newest replaces an unread older one).
    pub fn error(&self, fault: SourceFault, message: String, pos: SourcePos) {
        self.inbox.lock().error = Some((fault, message, pos));
        self.wake.notify_one();
    }

    // ---- the SyncManager side ----------------------------------------------------------------------------------

    /// Delivers the source's log start as the independent probe read it (the highest unread one is kept).
    pub fn source_log_start(&self, log_start: u64) {
        let mut inbox = self.inbox.lock();
        inbox.probed_log_start = Some(inbox.probed_log_start.map_or(log_start, |s| s.max(log_start)));
        drop(inbox);
        self.wake.notify_one();
    }

    /// Delivers a target probe: the target's log end, read by a probe started when the cache offset was
    /// `cache_before`.
    pub fn target_log_end(&self, log_end: u64, cache_before: u64) {
        self.inbox.lock().target_log_end = Some((log_end, cache_before));
        self.wake.notify_one();
    }

    /// [`LaneLink::source_log_start`] from a probe round: held back while it repeats what the lane was last handed.
    pub fn probed_source_log_start(&self, log_start: u64) {
        if self.probed.lock().source_log_start.news(&log_start) {
            self.source_log_start(log_start);
        }
    }

    /// [`LaneLink::target_log_end`] from a probe round: held back while it repeats what the lane was last handed.
    pub fn probed_target_log_end(&self, log_end: u64, cache_before: u64) {
        if self.probed.lock().target_log_end.news(&(log_end, cache_before)) {
            self.target_log_end(log_end, cache_before);
        }
    }

    /// An operator paused (`true`) or resumed (`false`) the partition.
    pub fn set_paused(&self, paused: bool) {
        self.inbox.lock().paused = Some(paused);
        self.wake.notify_one();
    }

    /// The largest append request changed.
    pub fn set_request_limit(&self, bytes: u64) {
        self.inbox.lock().request_limit = Some(bytes);
        self.wake.notify_one();
    }

    // ---- the lane side -----------------------------------------------------------------------------------------

    /// Waits until something was delivered.
    pub(crate) async fn wait(&self) {
        self.wake.notified().await;
    }

    /// Everything delivered, as core inputs in the order they must be applied: data as it came, then the newest
    /// error, the newest position, the probed log start, the newest target probe and the operator's last word. Also
    /// the new request limit.
    pub(crate) fn take(&self) -> (Vec<Input>, Option<u64>) {
        let inbox = std::mem::take(&mut *self.inbox.lock());
        let mut out: Vec<Input> = inbox
            .data
            .into_iter()
            .map(|d| Input::Data { seat: d.seat, batches: d.batches, held: d.held, pos: d.pos })
            .collect();
        if let Some((fault, message, pos)) = inbox.error {
            out.push(Input::SourceError { fault, message, pos });
        }
        if let Some(pos) = inbox.position {
            out.push(Input::Position(pos));
        }
        if let Some(log_start) = inbox.probed_log_start {
            out.push(Input::SourceLogStart(log_start));
        }
        if let Some((log_end, cache_before)) = inbox.target_log_end {
            out.push(Input::TargetLogEnd { log_end, cache_before });
        }
        match inbox.paused {
            Some(true) => out.push(Input::Pause),
            Some(false) => out.push(Input::Resume),
            None => {}
        }
        (out, inbox.request_limit)
    }

    /// Everything delivered, as core inputs in the order the lane applies them (the request limit left out). For
    /// tests that play the lane against a fetch session; in the process only the lane's driver takes its inputs.
    pub fn drain_inputs(&self) -> Vec<Input> {
        self.take().0
    }

    /// Publishes where the lane wants to be fetched (`Some((seat, from))`: data must carry `seat` and start at
    /// `from`), which also moves the fetch position to `from`. Public so that tests can play the lane against a
    /// fetch session; in the process only the lane's driver calls it.
    pub fn set_seat(&self, wish: SeatWish) {
        {
            let mut s = self.seat.lock();
            s.0 += 1;
            s.1 = wish;
        }
        if let Some((_, from)) = wish {
            self.fetch_from.store(from, Ordering::Release);
        }
        self.seats_changed.lock().notify_one();
    }

    /// Publishes how far the lane holds data (a restarted fetch starts there). Public so that tests can play the
    /// lane across session restarts; in the process only the lane's driver calls it.
    pub fn set_fetch_from(&self, offset: u64) {
        self.fetch_from.store(offset, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> Arc<PartitionStatus> {
        Arc::new(PartitionStatus::new("t", "t", 0))
    }

    #[test]
    fn positions_errors_and_probes_coalesce_and_data_keeps_its_order() {
        let link =
            LaneLink::new(SourceTp::new("t", 0), Budget::new(1 << 20, 1 << 17), Arc::new(Notify::new()), status());
        for i in 0..1000 {
            link.position(SourcePos { log_end: i, ..Default::default() });
            link.source_log_start(1000 - i);
            link.target_log_end(i, i);
        }
        link.set_paused(true);
        link.set_paused(false);
        let (inputs, limit) = link.take();
        assert_eq!(limit, None);
        assert_eq!(inputs.len(), 4, "one position, one log start, one probe, one control: {inputs:?}");
        assert!(matches!(inputs[0], Input::Position(SourcePos { log_end: 999, .. })));
        assert!(matches!(inputs[1], Input::SourceLogStart(1000)), "the highest log start");
        assert!(matches!(inputs[2], Input::TargetLogEnd { log_end: 999, cache_before: 999 }));
        assert!(matches!(inputs[3], Input::Resume));
        assert!(link.take().0.is_empty());
    }

    #[test]
    fn probe_rounds_hand_a_repeated_fact_on_once_in_ten_and_a_change_at_once() {
        let status = Arc::new(PartitionStatus::new("src", "dst", 3));
        let link =
            LaneLink::new(SourceTp::new("src", 3), Budget::new(1 << 20, 1 << 17), Arc::new(Notify::new()), status);
        assert_eq!(link.target, TargetTp::new("dst", 3));
        let mut handed = Vec::new();
        for round in 0..12u64 {
            // The log start moves at round 5; the target's log end and the cache offset never do.
            link.probed_source_log_start(if round < 5 { 7 } else { 8 });
            link.probed_target_log_end(40, 40);
            handed.push(link.take().0);
        }
        let starts: Vec<u64> = handed
            .iter()
            .flat_map(|inputs| {
                inputs.iter().filter_map(|i| if let Input::SourceLogStart(s) = i { Some(*s) } else { None })
            })
            .collect();
        assert_eq!(starts, [7, 8], "each value once: 8 came at round 5 and repeats only 7 times after");
        let ends: Vec<usize> = (0..12)
            .filter(|&r| handed[r].iter().any(|i| matches!(i, Input::TargetLogEnd { log_end: 40, cache_before: 40 })))
            .collect();
        assert_eq!(ends, [0, 10], "the first round, then the tenth sighting of the same fact");
    }

    #[test]
    fn a_seat_change_bumps_its_version_and_moves_the_fetch_position() {
        let notify = Arc::new(Notify::new());
        let link = LaneLink::new(SourceTp::new("t", 0), Budget::new(1 << 20, 1 << 17), notify, status());
        assert_eq!(link.seat(), (0, None));
        link.set_seat(Some((1, 40)));
        assert_eq!((link.seat(), link.fetch_from()), ((1, Some((1, 40))), 40));
        link.set_fetch_from(55);
        link.set_seat(None);
        assert_eq!((link.seat(), link.fetch_from()), ((2, None), 55));
    }
}
