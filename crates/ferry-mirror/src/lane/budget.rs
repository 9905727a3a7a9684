//! A partition's memory budget, as owned byte counts.
//!
//! Every byte a partition holds (fetched and not yet appended, credit granted to the source and not yet used, the
//! copies an append in flight makes) is held by a [`Held`] value taken from the partition's [`Budget`], and given
//! back when that value is dropped. Nothing has to remember to release anything: a batch dropped on a stream
//! restart, a halt or a resync releases its bytes with it.
//!
//! The budget may be overdrawn for a moment (the broker may send a whole batch past the credit it was given);
//! the fetch side simply grants no new credit while `held` is at or above the window.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Resizes made of any budget in this process ([`Budget::resizes`]).
static RESIZES: AtomicU64 = AtomicU64::new(0);

/// One partition's budget: a cap, and the bytes held against it (of which `copies` are an append's copies).
#[derive(Debug, Default)]
pub struct Budget {
    cap: AtomicU64,
    request: AtomicU64,
    held: AtomicU64,
    copies: AtomicU64,
}

impl Budget {
    /// A budget of `cap` bytes whose append requests are at most `request` bytes.
    pub fn new(cap: u64, request: u64) -> Arc<Budget> {
        Arc::new(Budget {
            cap: AtomicU64::new(cap),
            request: AtomicU64::new(request),
            held: AtomicU64::new(0),
            copies: AtomicU64::new(0),
        })
    }

    /// Changes the cap and the request size (the SyncManager splits `sync.max_memory` over the partitions).
    pub fn resize(&self, cap: u64, request: u64) {
        self.cap.store(cap, Ordering::Relaxed);
        self.request.store(request, Ordering::Relaxed);
        RESIZES.fetch_add(1, Ordering::Release);
    }

    /// How many resizes this process has made of any budget: a budget's free bytes grow without data moving only
    /// when this changes (a fetch session then looks at every partition's credit again).
    pub fn resizes() -> u64 {
        RESIZES.load(Ordering::Acquire)
    }

    /// Whether any budget was resized since `seen` was last brought up to date (here, or by [`Budget::resizes`]).
    pub fn resized_since(seen: &mut u64) -> bool {
        let now = Budget::resizes();
        std::mem::replace(seen, now) != now
    }

    /// The cap.
    pub fn cap(&self) -> u64 {
        self.cap.load(Ordering::Relaxed)
    }

    /// Largest append request.
    pub fn request(&self) -> u64 {
        self.request.load(Ordering::Relaxed)
    }

    /// Bytes that may be fetched ahead: half the cap. Of the rest, a quarter holds the two copies an append in
    /// flight makes of up to `request` (an eighth of the cap) bytes, and a quarter absorbs the whole batch the
    /// broker may send past the credit, so all of it stays within the cap.
    pub fn window(&self) -> u64 {
        self.cap() / 2
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Bytes held for fetched data: credit outstanding, and data received and not yet appended; everything held
    /// but the copies of appends in flight.
    pub fn fetched(&self) -> u64 {
        self.held().saturating_sub(self.copies.load(Ordering::Relaxed))
    }

    /// Bytes that may be granted as new credit now: the window less the fetched data held (credit outstanding
    /// included). An append's copies come out of the other half of the cap, not out of the window: counted against
    /// it, they took a partition's in-flight credit down to about half the window while appends ran, and a long
    /// link's throughput with it.
    pub fn free(&self) -> u64 {
        self.window().saturating_sub(self.fetched())
    }

    /// Takes `bytes` (always succeeds; the caller decides whether it may).
    pub fn hold(self: &Arc<Budget>, bytes: u64) -> Held {
        self.held.fetch_add(bytes, Ordering::Relaxed);
        Held { budget: Some(Arc::clone(self)), bytes, copies: false }
    }

    /// Takes `bytes` for the copies an append in flight makes (see [`Budget::window`]): held like any other bytes,
    /// but not counted against the credit window.
    pub fn hold_copies(self: &Arc<Budget>, bytes: u64) -> Held {
        self.copies.fetch_add(bytes, Ordering::Relaxed);
        self.held.fetch_add(bytes, Ordering::Relaxed);
        Held { budget: Some(Arc::clone(self)), bytes, copies: true }
    }
}

/// Bytes held against a [`Budget`]; dropping it gives them back.
#[derive(Debug, Default)]
pub struct Held {
    budget: Option<Arc<Budget>>,
    bytes: u64,
    /// Whether these are an append's copies ([`Budget::hold_copies`]).
    copies: bool,
}

impl Held {
    /// Holds nothing (tests, and data that needs no accounting).
    pub fn none() -> Held {
        Held::default()
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Splits off `bytes` (or all of it, when it holds less) into a value of its own.
    pub fn split(&mut self, bytes: u64) -> Held {
        let n = bytes.min(self.bytes);
        self.bytes -= n;
        Held { budget: self.budget.clone(), bytes: n, copies: self.copies }
    }

    /// Takes `bytes` out of this value, holding whatever it lacks fresh from `budget`.
    pub fn take(&mut self, bytes: u64, budget: &Arc<Budget>) -> Held {
        let mut out = self.split(bytes);
        if out.bytes < bytes {
            let extra = budget.hold(bytes - out.bytes);
            out.merge(extra);
        }
        out
    }

    /// Adds another value's bytes to this one (both must be of the same budget and kind, or this one empty).
    pub fn merge(&mut self, mut other: Held) {
        debug_assert!(self.budget.is_none() || self.copies == other.copies, "merging copies with fetched bytes");
        if self.budget.is_none() {
            self.budget = other.budget.take();
            self.bytes = std::mem::take(&mut other.bytes);
            self.copies = other.copies;
            return;
        }
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(b) = &self.budget
            && self.bytes > 0
        {
            let less = |h: u64| Some(h.saturating_sub(self.bytes));
            if self.copies {
                let _ = b.copies.fetch_update(Ordering::Relaxed, Ordering::Relaxed, less);
            }
            let _ = b.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, less);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resize_is_counted_after_its_new_size_is_in_place() {
        let b = Budget::new(1000, 100);
        let mut seen = Budget::resizes();
        b.resize(4000, 400);
        // Other tests in this process may resize too: the count moved by at least this one.
        assert!(Budget::resized_since(&mut seen));
        assert_eq!((b.cap(), b.request(), b.free()), (4000, 400, 2000));
    }

    #[test]
    fn held_bytes_come_back_when_dropped_split_or_merged() {
        let b = Budget::new(1000, 100);
        assert_eq!((b.window(), b.free()), (500, 500));
        let mut credit = b.hold(300);
        assert_eq!(b.free(), 200);
        let data = credit.take(120, &b);
        assert_eq!((credit.bytes(), data.bytes(), b.held()), (180, 120, 300));
        // Data past the credit is held fresh: the budget is overdrawn until it is dropped.
        let past = credit.take(400, &b);
        assert_eq!((credit.bytes(), past.bytes(), b.held()), (0, 400, 520));
        assert_eq!(b.free(), 0);
        drop(past);
        let mut whole = Held::none();
        whole.merge(data);
        assert_eq!(whole.bytes(), 120);
        drop(whole);
        drop(credit);
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn an_appends_copies_are_held_but_leave_the_credit_window_whole() {
        let b = Budget::new(1000, 100);
        let mut credit = b.hold(500);
        let data = credit.take(100, &b);
        assert_eq!((b.held(), b.fetched(), b.free()), (500, 500, 0));
        // The append of those 100 bytes makes two copies: held (memory), not fetched (credit).
        let copies = b.hold_copies(200);
        assert_eq!((b.held(), b.fetched(), b.free()), (700, 500, 0));
        // Split copies stay copies: dropping either part gives back both counts.
        let mut copies = copies;
        let half = copies.split(150);
        drop(half);
        assert_eq!((b.held(), b.fetched()), (550, 500));
        // The append is answered: its data and copies come back, and the window may be granted again.
        drop(copies);
        drop(data);
        assert_eq!((b.held(), b.fetched(), b.free()), (400, 400, 100));
        drop(credit);
        assert_eq!((b.held(), b.fetched(), b.free()), (0, 0, 500));
    }
}
