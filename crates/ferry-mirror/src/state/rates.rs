//! Rate meters: counts per second over the last minute, for the monitor's rates over 1 s, 10 s and 60 s windows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

/// Where a [`RateMeter`] reads the current second.
#[derive(Debug, Clone)]
pub enum MeterClock {
    /// Whole seconds elapsed since this instant: the process's own meters.
    Since(Instant),
    /// The second held here, moved by hand: tests that need exact rates whatever the wall clock does.
    Manual(Arc<AtomicU64>),
}

impl MeterClock {
    fn second(&self) -> u64 {
        match self {
            MeterClock::Since(start) => start.elapsed().as_secs(),
            MeterClock::Manual(second) => second.load(Ordering::Relaxed),
        }
    }
}

/// Counts per second over the last minute, for rates over 1 s, 10 s and 60 s windows.
#[derive(Debug)]
pub struct RateMeter {
    clock: MeterClock,
    inner: Mutex<RateInner>,
}

#[derive(Debug)]
struct RateInner {
    /// buckets[s % 61] counts second s since start; 61 so the current (incomplete) second never overlaps.
    buckets: [u64; 61],
    second: u64,
}

impl Default for RateMeter {
    fn default() -> Self {
        RateMeter::with_clock(MeterClock::Since(Instant::now()))
    }
}

impl RateMeter {
    /// A meter on `clock`, starting empty.
    pub fn with_clock(clock: MeterClock) -> RateMeter {
        let second = clock.second();
        RateMeter { clock, inner: Mutex::new(RateInner { buckets: [0; 61], second }) }
    }

    /// The clock this meter reads.
    pub fn clock(&self) -> &MeterClock {
        &self.clock
    }

    fn roll(&self, i: &mut RateInner) {
        let now = self.clock.second();
        if now > i.second {
            let gap = (now - i.second).min(61);
            for k in 1..=gap {
                i.buckets[((i.second + k) % 61) as usize] = 0;
            }
            i.second = now;
        }
    }

    /// Adds `n` to the current second.
    pub fn add(&self, n: u64) {
        let mut i = self.inner.lock();
        self.roll(&mut i);
        let s = i.second;
        i.buckets[(s % 61) as usize] += n;
    }

    /// Average per second over the last `window` complete seconds (1..=60).
    pub fn rate(&self, window: u64) -> f64 {
        let window = window.clamp(1, 60);
        let mut i = self.inner.lock();
        self.roll(&mut i);
        let s = i.second;
        let sum: u64 = (1..=window).filter(|k| *k <= s).map(|k| i.buckets[((s - k) % 61) as usize]).sum();
        sum as f64 / window as f64
    }
}

/// Rates of one side of the mirror.
#[derive(Debug, Default)]
pub struct SideRates {
    /// Records per second.
    pub records: RateMeter,
    /// Bytes per second.
    pub bytes: RateMeter,
    /// Records since start.
    pub records_total: AtomicU64,
    /// Bytes since start.
    pub bytes_total: AtomicU64,
}

impl SideRates {
    /// Meters on `clock`, starting at zero.
    pub fn with_clock(clock: MeterClock) -> SideRates {
        SideRates {
            records: RateMeter::with_clock(clock.clone()),
            bytes: RateMeter::with_clock(clock),
            records_total: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
        }
    }

    /// Counts records and bytes.
    pub fn add(&self, records: u64, bytes: u64) {
        self.records.add(records);
        self.bytes.add(bytes);
        self.records_total.fetch_add(records, Ordering::Relaxed);
        self.bytes_total.fetch_add(bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_meter_averages_complete_seconds() {
        let m = RateMeter::default();
        m.add(10);
        // The current second is incomplete and never counted.
        assert_eq!(m.rate(1), 0.0);
    }

    #[test]
    fn rate_meter_windows_hold_exactly_what_their_complete_seconds_counted() {
        let second = Arc::new(AtomicU64::new(0));
        let m = RateMeter::with_clock(MeterClock::Manual(Arc::clone(&second)));
        m.add(600);
        assert_eq!((m.rate(1), m.rate(10), m.rate(60)), (0.0, 0.0, 0.0), "second 0 is not complete");
        second.store(1, Ordering::Relaxed);
        m.add(50);
        assert_eq!((m.rate(1), m.rate(10), m.rate(60)), (600.0, 60.0, 10.0));
        second.store(2, Ordering::Relaxed);
        assert_eq!((m.rate(1), m.rate(10), m.rate(60)), (50.0, 65.0, 650.0 / 60.0));
        second.store(11, Ordering::Relaxed);
        assert_eq!((m.rate(1), m.rate(10), m.rate(60)), (0.0, 5.0, 650.0 / 60.0), "second 0 left the 10 s window");
        second.store(61, Ordering::Relaxed);
        assert_eq!((m.rate(1), m.rate(10), m.rate(60)), (0.0, 0.0, 50.0 / 60.0), "second 0 left the 60 s window");
        second.store(200, Ordering::Relaxed);
        assert_eq!(m.rate(60), 0.0, "a long idle gap clears every bucket");
    }
}
