//! Shared, lock-light state that the pipeline writes and the Monitor reads: per-partition offsets, state, RPO clock
//! and verification progress, paused topics, and the source and target rate meters ([`rates`]).
//!
//! All offsets are "next offset" positions (design §4): `source_offset` is the source log end, `cache_offset` the
//! next offset to copy (one past the last record the target acknowledged), `commit_offset` the next offset
//! committed to the source group, `target_offset` the target log end. `lag = source_offset - cache_offset`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

mod rates;

pub use self::rates::{MeterClock, RateMeter, SideRates};
use crate::rpo::{Heard, HeardCell, RpoClock};

/// The life of one partition in this process, as the monitor shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PartitionState {
    /// Resolving where to resume (also while re-reading the target after a truncation or a resync).
    #[default]
    Starting,
    /// Copying (or caught up).
    Mirroring,
    /// Mirroring, but no progress although the source has data (see the Alarmer's stall check).
    Stalled,
    /// Paused by an operator.
    Paused,
    /// Stopped after divergence or an error that needs an operator.
    Halted,
}

impl PartitionState {
    /// The snake_case name.
    pub const fn name(self) -> &'static str {
        match self {
            PartitionState::Starting => "starting",
            PartitionState::Mirroring => "mirroring",
            PartitionState::Stalled => "stalled",
            PartitionState::Paused => "paused",
            PartitionState::Halted => "halted",
        }
    }

    /// Every state, in the order documents list them.
    pub const ALL: [PartitionState; 5] = [
        PartitionState::Starting,
        PartitionState::Mirroring,
        PartitionState::Stalled,
        PartitionState::Paused,
        PartitionState::Halted,
    ];

    /// Parses a snake_case name.
    pub fn from_name(name: &str) -> Option<PartitionState> {
        PartitionState::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// What a lane publishes of its partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The partition's state.
    pub state: PartitionState,
    /// The next offset to copy.
    pub cache: u64,
    /// The source log start as last seen (0 with the end: not seen yet).
    pub source_log_start: u64,
    /// The source log end as last seen.
    pub source_log_end: u64,
    /// The target's log end as last read from the target.
    pub target_log_end: Option<u64>,
    /// The last error, or the failure being retried.
    pub last_error: Option<String>,
}

#[derive(Debug)]
struct StatusInner {
    state: PartitionState,
    last_error: Option<String>,
    last_progress: Instant,
    rpo: RpoClock,
    verify: VerifyProgress,
}

/// The background verifier's progress on one partition (`[verify]`; the `verify` object of a partition document).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VerifyProgress {
    /// Whether the verifier covers this partition (`[verify] bytes_per_sec` above 0, and both sides Ferry
    /// clusters).
    pub enabled: bool,
    /// Where the current pass started: the later of the two log starts.
    pub pass_start_offset: u64,
    /// Where it ends: the cache offset when it started.
    pub pass_end_offset: u64,
    /// Every batch below this offset (from `pass_start_offset`) was verified in the current pass.
    pub verified_to_offset: u64,
    /// Passes completed since the partition came to this process.
    pub passes_completed: u64,
    /// When the last complete pass ended, ms since the Unix epoch; `None` before the first.
    pub last_pass_completed_ms: Option<i64>,
    /// The mismatch the last pass stopped at, until a pass completes without one.
    pub mismatch: Option<Mismatch>,
}

/// Where a verified copy differs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Mismatch {
    /// The first mismatching offset.
    pub offset: u64,
    /// `source` or `target`: the side at fault.
    pub side: String,
    /// What differs.
    pub reason: String,
}

/// One mirrored partition as the Monitor sees it.
#[derive(Debug)]
pub struct PartitionStatus {
    /// Source topic.
    pub topic: String,
    /// Target topic.
    pub target_topic: String,
    /// Partition.
    pub partition: u32,
    source_offset: AtomicU64,
    source_log_start: AtomicU64,
    cache_offset: AtomicU64,
    commit_offset: AtomicU64,
    target_offset: AtomicU64,
    latency_ms: AtomicU64,
    probed_log_start: AtomicU64,
    probed_log_end: AtomicU64,
    /// The probe's last answer: the RPO's bound on records acknowledged unseen (no lock, as an idle partition's
    /// probe takes none).
    heard: HeardCell,
    /// Whether the stall watchdog flags it (set every check, so without a lock).
    stalled: AtomicBool,
    inner: Mutex<StatusInner>,
}

/// A serialisable snapshot of a partition (the `/api/v1/partitions` item). It deserializes too (missing fields
/// default), so clients such as `ferryctl` read the documents through the same type.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PartitionView {
    /// Source topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Target topic.
    pub target_topic: String,
    /// Source log end.
    pub source_offset: u64,
    /// Source log start.
    pub source_log_start_offset: u64,
    /// Next offset to copy.
    pub cache_offset: u64,
    /// Next offset committed to the source group.
    pub commit_offset: u64,
    /// Target log end.
    pub target_offset: u64,
    /// `source_offset - cache_offset`.
    pub lag: u64,
    /// The state; `stalled` while mirroring without progress.
    pub state: PartitionState,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// Replication latency of the last appended batch, ms.
    pub latency_ms: u64,
    /// The source log end as the independent probe (ListOffsets, every `source.health.check_interval`) read it
    /// last; 0 before the first probe.
    pub probed_source_offset: u64,
    /// How long the oldest source record not yet on the target has been waiting, seconds (0 when caught up).
    pub rpo_seconds: f64,
    /// The background verifier's progress.
    pub verify: VerifyProgress,
}

impl PartitionStatus {
    /// A new status in the `starting` state.
    pub fn new(topic: &str, target_topic: &str, partition: u32) -> PartitionStatus {
        PartitionStatus {
            topic: topic.to_owned(),
            target_topic: target_topic.to_owned(),
            partition,
            source_offset: AtomicU64::new(0),
            source_log_start: AtomicU64::new(0),
            cache_offset: AtomicU64::new(0),
            commit_offset: AtomicU64::new(0),
            target_offset: AtomicU64::new(0),
            latency_ms: AtomicU64::new(0),
            probed_log_start: AtomicU64::new(0),
            probed_log_end: AtomicU64::new(0),
            heard: HeardCell::default(),
            stalled: AtomicBool::new(false),
            inner: Mutex::new(StatusInner {
                state: PartitionState::Starting,
                last_error: None,
                last_progress: Instant::now(),
                rpo: RpoClock::default(),
                verify: VerifyProgress::default(),
            }),
        }
    }

    /// Publishes a lane's snapshot: offsets (the target's as last read from the target, never the cache offset),
    /// state and last error (or the failure being retried).
    pub fn publish(&self, snapshot: Snapshot) {
        let Snapshot { state, cache, source_log_start, source_log_end, target_log_end, last_error } = snapshot;
        if source_log_end > 0 || source_log_start > 0 {
            self.set_source(source_log_start, source_log_end);
        }
        self.set_cache(cache);
        if let Some(t) = target_log_end {
            self.set_target(t);
        }
        let mut i = self.inner.lock();
        if i.state != state {
            i.state = state;
            i.last_progress = Instant::now();
        }
        i.last_error = last_error;
    }

    /// Records the source log start and end (a fetch stream position); a log end past the cache offset starts the
    /// RPO clock of the records below it.
    pub fn set_source(&self, log_start: u64, log_end: u64) {
        self.source_log_start.store(log_start, Ordering::Relaxed);
        self.source_offset.store(log_end, Ordering::Relaxed);
        self.inner.lock().rpo.saw_end(log_end, Instant::now());
    }

    /// Records what the independent probe (ListOffsets, at each partition's leader) read of the source: it feeds
    /// the RPO clock and the stall watchdog, never the pipeline's own position (a probe may be older than the
    /// stream's last word). `end_age` is how long ago, by the source broker's own clock, its log end reached
    /// `log_end`: the records below it were received at least that long ago. `heard` is when the probe was asked
    /// and its grace: the RPO's bound on records acknowledged unseen.
    pub fn set_probed_source(&self, log_start: u64, log_end: u64, end_age: Option<Duration>, heard: Heard) {
        self.probed_log_start.store(log_start, Ordering::Relaxed);
        self.probed_log_end.store(log_end, Ordering::Relaxed);
        self.heard.store(heard);
        // Nothing below the cache offset waits, so the RPO clock has nothing to learn: an idle partition's probe
        // takes no lock.
        if log_end <= self.cache_offset() {
            return;
        }
        let now = Instant::now();
        let seen = end_age.and_then(|a| now.checked_sub(a)).unwrap_or(now);
        self.inner.lock().rpo.saw_end(log_end, seen);
    }

    /// The source log end the probe read last (0 before the first probe).
    pub fn probed_source_offset(&self) -> u64 {
        self.probed_log_end.load(Ordering::Relaxed)
    }

    /// Whether source records wait to be copied: the source log end, as the stream or the probe saw it last, is
    /// past the cache offset. The stall watchdog reads this, so a stream whose positions stopped cannot hide a
    /// stall.
    pub fn behind(&self) -> bool {
        self.source_offset().max(self.probed_source_offset()) > self.cache_offset()
    }

    /// Records a new cache offset (and counts it as progress when it moved).
    pub fn set_cache(&self, offset: u64) {
        if self.cache_offset.swap(offset, Ordering::Relaxed) != offset {
            let mut i = self.inner.lock();
            let now = Instant::now();
            i.last_progress = now;
            i.rpo.mirrored_to(offset, now);
        }
    }

    /// How long the oldest source record not yet on the target has been waiting (see [`crate::rpo`]). Records below
    /// the source's log start are gone, not waiting: they count from the later of the cache offset and that start.
    pub fn rpo(&self) -> Duration {
        self.clocks().rpo
    }

    /// How long the oldest waiting record has waited since the mirror first saw it (the RPO before any record
    /// timestamp shortens it); `None` when none waits.
    pub fn waiting(&self) -> Option<Duration> {
        self.clocks().waiting
    }

    /// The state and every clock, under one lock and at one instant (what the condition checker reads; the clocks'
    /// own accessors read it too).
    pub fn clocks(&self) -> Clocks {
        let from = self.cache_offset().max(self.source_log_start.load(Ordering::Relaxed));
        let now = Instant::now();
        let unheard = crate::rpo::unheard_since(self.heard.load(), now);
        let i = self.inner.lock();
        let since = i.rpo.waiting_since(from);
        // The longest wait: the oldest record sighted, or what may have been acknowledged unseen.
        let longest = match (since, unheard) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Clocks {
            state: i.state,
            rpo: crate::rpo::rpo(longest, now),
            waiting: since.map(|s| now.saturating_duration_since(s)),
            since_progress: now.saturating_duration_since(i.last_progress),
        }
    }

    /// Records the verifier's progress.
    pub fn set_verify(&self, progress: VerifyProgress) {
        self.inner.lock().verify = progress;
    }

    /// Records the target log end.
    pub fn set_target(&self, offset: u64) {
        self.target_offset.store(offset, Ordering::Relaxed);
    }

    /// Records a committed offset.
    pub fn set_commit(&self, offset: u64) {
        self.commit_offset.store(offset, Ordering::Relaxed);
    }

    /// Records the replication latency of the last appended batch (append time minus its newest record's
    /// timestamp).
    pub fn set_latency_ms(&self, ms: u64) {
        self.latency_ms.store(ms, Ordering::Relaxed);
    }

    /// Replication latency of the last appended batch, in ms (meaningful while there is lag).
    pub fn latency_ms(&self) -> u64 {
        self.latency_ms.load(Ordering::Relaxed)
    }

    /// Source log end.
    pub fn source_offset(&self) -> u64 {
        self.source_offset.load(Ordering::Relaxed)
    }

    /// Next offset to copy.
    pub fn cache_offset(&self) -> u64 {
        self.cache_offset.load(Ordering::Relaxed)
    }

    /// Next offset committed.
    pub fn commit_offset(&self) -> u64 {
        self.commit_offset.load(Ordering::Relaxed)
    }

    /// Target log end.
    pub fn target_offset(&self) -> u64 {
        self.target_offset.load(Ordering::Relaxed)
    }

    /// Records lag.
    pub fn lag(&self) -> u64 {
        self.source_offset().saturating_sub(self.cache_offset())
    }

    /// Sets the state (clearing the error when leaving `halted`).
    pub fn set_state(&self, state: PartitionState) {
        let mut i = self.inner.lock();
        if i.state == PartitionState::Halted && state != PartitionState::Halted {
            i.last_error = None;
        }
        i.state = state;
        i.last_progress = Instant::now();
    }

    /// The state.
    pub fn state(&self) -> PartitionState {
        self.inner.lock().state
    }

    /// Records an error (the state is unchanged).
    pub fn set_error(&self, error: impl Into<String>) {
        self.inner.lock().last_error = Some(error.into());
    }

    /// Clears the last error.
    pub fn clear_error(&self) {
        self.inner.lock().last_error = None;
    }

    /// Halts the partition with a reason.
    pub fn halt(&self, reason: impl Into<String>) {
        let mut i = self.inner.lock();
        i.state = PartitionState::Halted;
        i.last_error = Some(reason.into());
    }

    /// How long since the cache offset last moved (or the state changed).
    pub fn since_progress(&self) -> Duration {
        self.clocks().since_progress
    }

    /// Marks the partition stalled or not; returns whether that changed.
    pub fn set_stalled(&self, stalled: bool) -> bool {
        self.stalled.swap(stalled, Ordering::Relaxed) != stalled
    }

    /// Whether the partition is flagged stalled.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// A snapshot.
    pub fn view(&self) -> PartitionView {
        let rpo = self.rpo();
        let i = self.inner.lock();
        let state =
            if self.stalled() && i.state == PartitionState::Mirroring { PartitionState::Stalled } else { i.state };
        PartitionView {
            topic: self.topic.clone(),
            partition: self.partition,
            target_topic: self.target_topic.clone(),
            source_offset: self.source_offset(),
            source_log_start_offset: self.source_log_start.load(Ordering::Relaxed),
            cache_offset: self.cache_offset(),
            commit_offset: self.commit_offset(),
            target_offset: self.target_offset(),
            lag: self.lag(),
            state,
            last_error: i.last_error.clone(),
            latency_ms: self.latency_ms(),
            probed_source_offset: self.probed_source_offset(),
            rpo_seconds: rpo.as_millis() as f64 / 1000.0,
            verify: i.verify.clone(),
        }
    }
}

/// A partition's state and clocks at one instant (see [`PartitionStatus::clocks`]).
#[derive(Debug, Clone, Copy)]
pub struct Clocks {
    /// The state (without the stalled flag).
    pub state: PartitionState,
    /// As [`PartitionStatus::rpo`].
    pub rpo: Duration,
    /// As [`PartitionStatus::waiting`].
    pub waiting: Option<Duration>,
    /// As [`PartitionStatus::since_progress`].
    pub since_progress: Duration,
}

/// The state shared by every component.
#[derive(Debug)]
pub struct Shared {
    /// When the process started.
    pub started: Instant,
    /// Partitions owned by this process, by source partition.
    pub partitions: crate::tp::TpMap<Arc<PartitionStatus>>,
    /// Source topics an operator paused.
    pub paused: Mutex<BTreeSet<String>>,
    /// Records and bytes received from the source.
    pub source_rates: SideRates,
    /// Records and bytes appended to the target.
    pub target_rates: SideRates,
    /// Source topics currently mirrored (source name -> target name), set by discovery.
    pub topics: Mutex<std::collections::BTreeMap<String, String>>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            started: Instant::now(),
            partitions: crate::tp::TpMap::default(),
            paused: Mutex::new(BTreeSet::new()),
            source_rates: SideRates::default(),
            target_rates: SideRates::default(),
            topics: Mutex::new(Default::default()),
        }
    }
}

impl Shared {
    /// Snapshots of all partitions, sorted by topic and partition, optionally for one source topic.
    pub fn partition_views(&self, topic: Option<&str>) -> Vec<PartitionView> {
        let mut out: Vec<PartitionView> = self
            .partitions
            .iter()
            .filter(|e| topic.is_none_or(|t| e.key().topic() == t))
            .map(|e| e.value().view())
            .collect();
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        out
    }

    /// Whether a source topic is paused.
    pub fn is_paused(&self, topic: &str) -> bool {
        self.paused.lock().contains(topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_source_minus_cache() {
        let s = PartitionStatus::new("t", "t", 0);
        s.set_source(0, 100);
        s.set_cache(60);
        assert_eq!(s.view().lag, 40);
        s.halt("diverged at 5");
        assert_eq!(s.view().state, PartitionState::Halted);
        assert_eq!(s.view().last_error.as_deref(), Some("diverged at 5"));
    }

    #[test]
    fn the_probe_reveals_waiting_records_the_stream_has_not_shown() {
        let s = PartitionStatus::new("t", "t", 0);
        s.set_source(0, 10);
        s.set_cache(10);
        assert_eq!((s.behind(), s.waiting(), s.rpo()), (false, None, Duration::ZERO), "caught up");
        // The stream's last word is still 10; the probe reads 12.
        s.set_probed_source(0, 12, None, in_time());
        assert!(s.behind() && s.waiting().is_some());
        assert_eq!((s.view().lag, s.view().probed_source_offset), (0, 12));
        // Copied: nothing waits, whatever the stale readings say.
        s.set_cache(12);
        assert_eq!((s.behind(), s.waiting(), s.rpo()), (false, None, Duration::ZERO));
        // Records below the source's log start are gone, not waiting: a stale stream end past the cache offset
        // with a log start at the end waits for nothing.
        s.set_source(15, 15);
        s.set_probed_source(15, 15, None, in_time());
        assert_eq!(s.waiting(), None, "offsets 12..15 were deleted, none waits");
    }

    /// A probe answer asked now, with a grace no test outlives.
    fn in_time() -> Heard {
        Heard { asked: Instant::now(), grace: Duration::from_secs(3600) }
    }

    #[test]
    fn a_partition_the_probe_has_not_heard_past_its_grace_counts_from_the_last_answer() {
        let s = PartitionStatus::new("t", "t", 0);
        s.set_source(0, 10);
        s.set_cache(10);
        // The last answer was asked 5 s ago with a grace of 1 s: whatever was acknowledged since may wait unseen.
        let asked = Instant::now() - Duration::from_secs(5);
        s.set_probed_source(0, 10, None, Heard { asked, grace: Duration::from_secs(1) });
        let before = asked.elapsed();
        let c = s.clocks();
        assert!(c.rpo >= before && c.rpo <= asked.elapsed(), "{c:?} against {before:?}");
        // Nothing was sighted: the stall watchdog's clock and the lag know of no waiting record.
        assert_eq!((c.waiting, s.behind(), s.view().lag), (None, false, 0));
        assert!(s.view().rpo_seconds >= 5.0, "{:?}", s.view());
        // An answer asked later takes it back to 0; an older one arriving after it does not move it back.
        s.set_probed_source(0, 10, None, in_time());
        s.set_probed_source(0, 10, None, Heard { asked, grace: Duration::from_secs(1) });
        assert_eq!(s.rpo(), Duration::ZERO);
        // Sighted records and the unheard bound: the longer wait counts.
        s.set_source(0, 11);
        let sighted = s.rpo();
        assert!(sighted < Duration::from_secs(1), "{sighted:?}");
    }

    #[test]
    fn a_partition_never_answered_has_only_its_marks() {
        let s = PartitionStatus::new("t", "t", 0);
        s.set_source(0, 10);
        s.set_cache(10);
        assert_eq!((s.rpo(), s.clocks().waiting), (Duration::ZERO, None));
    }

    #[test]
    fn the_clocks_read_at_once_lie_between_the_same_read_one_by_one() {
        let s = PartitionStatus::new("t", "t", 0);
        s.set_state(PartitionState::Mirroring);
        let idle = s.clocks();
        assert_eq!((idle.state, idle.rpo, idle.waiting), (PartitionState::Mirroring, Duration::ZERO, None));
        s.set_source(0, 10);
        s.set_cache(4);
        let (rpo, waiting, progress) = (s.rpo(), s.waiting().unwrap(), s.since_progress());
        let at_once = s.clocks();
        let (rpo_after, waiting_after, progress_after) = (s.rpo(), s.waiting().unwrap(), s.since_progress());
        assert_eq!(at_once.state, s.state());
        assert!(rpo <= at_once.rpo && at_once.rpo <= rpo_after, "{rpo:?} {at_once:?} {rpo_after:?}");
        let w = at_once.waiting.unwrap();
        assert!(waiting <= w && w <= waiting_after, "{waiting:?} {w:?} {waiting_after:?}");
        assert!(progress <= at_once.since_progress && at_once.since_progress <= progress_after);
    }
}
