//! Per-partition log configuration.

use std::time::Duration;

/// When appended bytes are made durable with fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// fsync before an append returns (the ack waits for the disk).
    Sync,
    /// fsync once `interval` has passed since the last flush, or once `bytes` unflushed bytes accumulate,
    /// whichever comes first. A crash may lose what was not yet flushed; the next open then bumps the epoch.
    Async {
        /// Longest time unflushed data may wait.
        interval: Duration,
        /// Most unflushed bytes before a flush.
        bytes: u64,
    },
}

/// The async policy's default byte threshold (4 MiB). Kept small on purpose: an fsync writes back everything dirty
/// at once, and a 16 MiB write-back per partition stalled the whole machine (the broker's appends and other
/// processes alike) for tens of milliseconds on the developers' virtual disk; 4 MiB fsyncs did not, at the same
/// throughput (`cargo bench --bench broker`, docs/broker.md). It also bounds what a power loss can take.
pub const DEFAULT_FLUSH_BYTES: u64 = 4 * 1024 * 1024;

impl Default for FlushPolicy {
    fn default() -> Self {
        FlushPolicy::Async { interval: Duration::from_millis(1000), bytes: DEFAULT_FLUSH_BYTES }
    }
}

/// The largest offset a log holds: offsets stay below 2^63, as Kafka's (signed 64-bit) do, so that a log end
/// never reaches the end of the 64-bit space and every offset fits an `i64` wherever one is needed. An append or a
/// gap jump that would pass it is refused (`OffsetOverflow`).
pub const MAX_OFFSET: u64 = i64::MAX as u64 - 1;

/// The shortest `segment_ms` the broker accepts (1 s): a shorter one would roll a segment on nearly every append,
/// and every segment is a pair of files.
pub const MIN_SEGMENT_MS: u64 = 1000;

/// Configuration of one partition's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// A segment rolls once it reaches this many bytes (default 100 MiB).
    pub segment_bytes: u64,
    /// A non-empty segment rolls once its first batch is this old (default 7 days).
    pub segment_ms: u64,
    /// One index entry per this many bytes of batches (default 4 KiB).
    pub index_interval_bytes: u64,
    /// Largest batch accepted, in bytes (default 1 MiB).
    pub max_batch_bytes: u64,
    /// When appends are fsynced.
    pub flush: FlushPolicy,
    /// Delete the oldest sealed segments while the log is larger than this. `None` keeps everything.
    pub retention_bytes: Option<u64>,
    /// Delete sealed segments whose newest record is older than this many ms. `None` keeps everything.
    pub retention_ms: Option<u64>,
    /// Time retention counts a segment's age from the earlier of its newest record timestamp and the wall-clock
    /// time of its last append, so that a timestamp ahead of this broker's clock never keeps data longer (default
    /// off: the newest record timestamp alone). For mirror topics, whose timestamps come from another DC's clock
    /// and are not bounded on the way in.
    pub retention_caps_timestamps_at_append_time: bool,
    /// Recovery after a crash: a batch in a segment that fails only its CRC, followed by valid batches that continue
    /// its offsets, is kept in place (reading it fails with `CorruptSegment`, as in a sealed segment) instead of
    /// being cut with everything after it (default off: cut, as a torn tail). Under sync flush a torn write can only
    /// be the last batch, so such a batch is damage, not a torn write; for logs written only with sync flush (the
    /// broker's offsets partition), whose reader skips a corrupt batch.
    pub keep_corrupt_batches_followed_by_valid_ones: bool,
    /// Most sealed-segment files the log keeps open at once (default 8, at least 1); others are opened on
    /// demand, the least recently used closed. The active segment's files are open besides.
    pub max_open_segments: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 100 * 1024 * 1024,
            segment_ms: 7 * 24 * 3600 * 1000,
            index_interval_bytes: 4096,
            max_batch_bytes: 1024 * 1024,
            flush: FlushPolicy::default(),
            retention_bytes: None,
            retention_ms: None,
            retention_caps_timestamps_at_append_time: false,
            keep_corrupt_batches_followed_by_valid_ones: false,
            max_open_segments: 8,
        }
    }
}
