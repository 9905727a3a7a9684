//! Holding back facts that repeat. The fetch stream's position beats and the independent probes of either side
//! hand every partition's lane the same facts again and again while nothing moves; a lane's core decides the same on
//! the same facts, and with thousands of idle partitions waking every lane for each would be most of what an idle
//! mirror does. A [`Repeat`] passes a value that differs from the last one it passed, and an equal one only every
//! [`REPEAT_EVERY`]th time, so a lane that could not act on a fact when it came (it was resolving where to resume)
//! still sees it again within a few rounds.

/// An unchanged fact is handed on once in this many sightings.
pub const REPEAT_EVERY: u32 = 10;

/// The last value of one fact handed on, and how many equal sightings were held back since.
#[derive(Debug, Clone, Default)]
pub struct Repeat<V> {
    last: Option<(V, u32)>,
}

impl<V: PartialEq + Clone> Repeat<V> {
    /// Whether `value` must be handed on: it differs from the last one handed on, nothing was handed on yet, or
    /// [`REPEAT_EVERY`] sightings passed.
    pub fn news(&mut self, value: &V) -> bool {
        match &mut self.last {
            Some((last, held_back)) if last == value && *held_back + 1 < REPEAT_EVERY => {
                *held_back += 1;
                false
            }
            _ => {
                self.last = Some((value.clone(), 0));
                true
            }
        }
    }

    /// Something else reached the lane in between: the next sighting is news whatever its value.
    pub fn forget(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_pass_and_repeats_pass_once_in_ten() {
        let mut r = Repeat::default();
        let passed: Vec<bool> = [1, 1, 2, 2, 2].iter().map(|v| r.news(v)).collect();
        assert_eq!(passed, [true, false, true, false, false]);
        // 2 was passed, then held back twice: seven more are held back, the tenth sighting passes.
        let passed: Vec<bool> = (0..8).map(|_| r.news(&2)).collect();
        assert_eq!(passed, [false, false, false, false, false, false, false, true]);
        r.forget();
        assert!(r.news(&2), "after something else reached the lane, the same value is news");
        assert!(!r.news(&2));
    }
}
