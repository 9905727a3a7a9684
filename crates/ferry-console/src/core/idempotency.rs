//! Idempotency keys of the writing actions (produce, edit-and-resend): a caller that did not learn the outcome of a
//! request (its connection dropped) sends it again with the same `Idempotency-Key` header and gets the first
//! answer, with nothing written twice.
//!
//! Invariants:
//! - A key is scoped by caller, cluster and action: another caller's key never matches.
//! - A key is bound to its request: the same key with another body is refused, never answered with the other
//!   request's outcome.
//! - While the first request with a key runs, a repeat is refused (`InFlight`), never run beside it; a first request
//!   that failed releases its key, so the repeat runs.
//! - At most `capacity` keys are remembered (the oldest are forgotten first); they live in memory only.

use std::collections::{HashMap, VecDeque};

/// The longest key accepted.
pub const MAX_KEY_CHARS: usize = 128;

/// Who sent a key, where and for what.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    /// The caller's name.
    pub caller: String,
    /// The cluster.
    pub cluster: String,
    /// The action.
    pub action: &'static str,
    /// The key.
    pub key: String,
}

#[derive(Debug, Clone)]
enum Entry<T> {
    InFlight { body: [u8; 32] },
    Done { body: [u8; 32], answer: T },
}

/// What to do with a request that carries a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<T> {
    /// First time: run it, then [`Keys::finish`] or [`Keys::release`].
    Run,
    /// Done before with the same body: answer this.
    Replay(T),
    /// The first request with this key still runs.
    InFlight,
    /// The key was used with another body.
    Reused,
}

/// The remembered keys.
#[derive(Debug)]
pub struct Keys<T> {
    entries: HashMap<Scope, Entry<T>>,
    order: VecDeque<Scope>,
    capacity: usize,
}

/// Whether `key` is acceptable: 1 to [`MAX_KEY_CHARS`] visible ASCII characters.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_CHARS && key.bytes().all(|b| b.is_ascii_graphic())
}

impl<T: Clone> Keys<T> {
    /// Remembering at most `capacity` keys.
    pub fn new(capacity: usize) -> Keys<T> {
        Keys { entries: HashMap::new(), order: VecDeque::new(), capacity: capacity.max(1) }
    }

    /// Looks `scope` up for a request whose body digests to `body`; a first sight reserves the key.
    pub fn begin(&mut self, scope: &Scope, body: [u8; 32]) -> Decision<T> {
        match self.entries.get(scope) {
            Some(Entry::InFlight { body: b }) if *b == body => Decision::InFlight,
            Some(Entry::Done { body: b, answer }) if *b == body => Decision::Replay(answer.clone()),
            Some(_) => Decision::Reused,
            None => {
                while self.order.len() >= self.capacity {
                    if let Some(old) = self.order.pop_front() {
                        self.entries.remove(&old);
                    }
                }
                self.entries.insert(scope.clone(), Entry::InFlight { body });
                self.order.push_back(scope.clone());
                Decision::Run
            }
        }
    }

    /// The request of `scope` succeeded with `answer`.
    pub fn finish(&mut self, scope: &Scope, answer: T) {
        if let Some(e) = self.entries.get_mut(scope) {
            if let Entry::InFlight { body } = *e {
                *e = Entry::Done { body, answer };
            }
        }
    }

    /// The request of `scope` failed: forget the key, so a repeat runs.
    pub fn release(&mut self, scope: &Scope) {
        if matches!(self.entries.get(scope), Some(Entry::InFlight { .. })) {
            self.entries.remove(scope);
            self.order.retain(|s| s != scope);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(caller: &str, key: &str) -> Scope {
        Scope { caller: caller.into(), cluster: "c".into(), action: "produce", key: key.into() }
    }

    #[test]
    fn a_key_runs_once_then_replays_and_is_bound_to_its_body_and_caller() {
        let mut k = Keys::new(10);
        let (a, b) = ([1u8; 32], [2u8; 32]);
        assert_eq!(k.begin(&scope("ops", "k1"), a), Decision::Run);
        assert_eq!(k.begin(&scope("ops", "k1"), a), Decision::InFlight);
        assert_eq!(k.begin(&scope("ops", "k1"), b), Decision::Reused);
        k.finish(&scope("ops", "k1"), 7);
        assert_eq!(k.begin(&scope("ops", "k1"), a), Decision::Replay(7));
        assert_eq!(k.begin(&scope("ops", "k1"), b), Decision::Reused);
        assert_eq!(k.begin(&scope("other", "k1"), a), Decision::Run, "another caller's key is its own");
    }

    #[test]
    fn a_failed_request_releases_its_key_and_the_oldest_keys_go_first() {
        let mut k = Keys::new(2);
        let a = [1u8; 32];
        assert_eq!(k.begin(&scope("ops", "k1"), a), Decision::Run);
        k.release(&scope("ops", "k1"));
        assert_eq!(k.begin(&scope("ops", "k1"), a), Decision::Run);
        k.finish(&scope("ops", "k1"), 1);
        k.release(&scope("ops", "k1"));
        assert_eq!(k.begin(&scope("ops", "k1"), a), Decision::Replay(1), "a finished key is not released");
        assert_eq!(k.begin(&scope("ops", "k2"), a), Decision::Run);
        assert_eq!(k.begin(&scope("ops", "k3"), a), Decision::Run);
        assert_eq!(k.begin(&scope("ops", "k1"), a), Decision::Run, "k1, the oldest, was forgotten");
    }

    #[test]
    fn keys_are_short_visible_ascii() {
        assert!(valid_key("retry-7f3a"));
        for bad in ["", "a b", "é", &"x".repeat(MAX_KEY_CHARS + 1)] {
            assert!(!valid_key(bad), "{bad:?}");
        }
    }
}
