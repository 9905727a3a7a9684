//! The timer's decisions, without I/O or clock reads: when a delayed record falls due (and which requests are
//! refused), which time-wheel slot holds it, how a record's id is spelled, and which waiting entries fire at a given
//! time. The driver (`crate::delay`) reads the clock and the disk and performs what these return.

use std::collections::HashSet;

pub mod origin;

/// Width of one slot of the time wheel, ms: entries due within the same second share a slot file.
pub const SLOT_MS: i64 = 1000;

/// The default and the largest `delay.max_delay`, ms: 7 days.
pub const DEFAULT_MAX_DELAY_MS: u64 = 7 * 24 * 3600 * 1000;

/// When a delayed produce's records are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Their time has passed (or the delay is 0): written at once, as a plain produce.
    Now,
    /// Kept in the delay store until this time, ms since the Unix epoch.
    At(i64),
}

/// Decides when records produced at `now_ms` with `deliver_at_ms` or `delay_ms` fall due, under `max_delay_ms`.
/// The error names what is wrong in words; nothing is written when it is returned.
pub fn decide_due(
    now_ms: i64,
    deliver_at_ms: Option<i64>,
    delay_ms: Option<i64>,
    max_delay_ms: u64,
) -> Result<Due, String> {
    let max = i64::try_from(max_delay_ms).unwrap_or(i64::MAX);
    let due = match (deliver_at_ms, delay_ms) {
        (Some(_), Some(_)) => return Err("give either deliver_at_ms or delay_ms, not both".into()),
        (None, None) => return Err("a delayed produce needs deliver_at_ms or delay_ms".into()),
        (None, Some(d)) if d < 0 => return Err(format!("delay_ms {d} is negative")),
        (None, Some(d)) if d > max => {
            return Err(format!("delay_ms {d} is past the maximum delay of {max_delay_ms} ms"));
        }
        (None, Some(d)) => now_ms.checked_add(d).ok_or_else(|| format!("delay_ms {d} overflows the clock"))?,
        (Some(at), None) if at < 0 => return Err(format!("deliver_at_ms {at} is before 1970-01-01")),
        (Some(at), None) if at.saturating_sub(now_ms) > max => {
            return Err(format!(
                "deliver_at_ms {at} is {} ms from now, past the maximum delay of {max_delay_ms} ms",
                at.saturating_sub(now_ms)
            ));
        }
        (Some(at), None) => at,
    };
    Ok(if due <= now_ms { Due::Now } else { Due::At(due) })
}

/// The smallest per-topic `max_delay_ms`: one slot of the wheel.
pub const MIN_TOPIC_MAX_DELAY_MS: u64 = SLOT_MS as u64;

/// Checks a topic's `max_delay_ms`: at least one second, at most the broker's `delay.max_delay` (`ceiling_ms`;
/// `None` checks against the absolute largest, 7 days, where the broker's setting is not at hand).
pub fn check_topic_max_delay(ms: u64, ceiling_ms: Option<u64>) -> Result<(), String> {
    let (ceiling, name) = match ceiling_ms {
        Some(c) => (c, "the broker's delay.max_delay"),
        None => (DEFAULT_MAX_DELAY_MS, "the largest delay.max_delay"),
    };
    if ms < MIN_TOPIC_MAX_DELAY_MS {
        return Err(format!("config max_delay_ms {ms} is below the {MIN_TOPIC_MAX_DELAY_MS} ms minimum"));
    }
    if ms > ceiling {
        return Err(format!("config max_delay_ms {ms} is past {name}, {ceiling} ms"));
    }
    Ok(())
}

/// The maximum delay of a topic: its own `max_delay_ms` when set, else the broker's, never past the broker's (a
/// topic set before the broker's was lowered follows the lower one).
pub fn topic_max_delay(topic_ms: Option<u64>, broker_ms: u64) -> u64 {
    topic_ms.map_or(broker_ms, |t| t.min(broker_ms))
}

/// The slot of the time wheel an entry due at `due_ms` goes to.
pub fn slot_of(due_ms: i64) -> i64 {
    due_ms.div_euclid(SLOT_MS)
}

/// A delayed record's id: its place in the delay store (partition of the internal topic, offset there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DelayId {
    /// Partition of the delay store.
    pub partition: u32,
    /// Offset in that partition.
    pub offset: u64,
}

impl std::fmt::Display for DelayId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.partition, self.offset)
    }
}

impl std::str::FromStr for DelayId {
    type Err = String;

    fn from_str(s: &str) -> Result<DelayId, String> {
        let bad = || format!("{s:?} is not a delayed record id (PARTITION-OFFSET, as a delayed produce returns)");
        let (p, o) = s.split_once('-').ok_or_else(bad)?;
        Ok(DelayId { partition: p.parse().map_err(|_| bad())?, offset: o.parse().map_err(|_| bad())? })
    }
}

/// An entry waiting in the slots that have come round, in the order it must fire in (slot, then id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// Which ordered stream it belongs to (for delayed produce: its target partition).
    pub group: u64,
    /// When it falls due.
    pub due_ms: i64,
}

/// The entries of `waiting` that fire at `now_ms`: per group, the longest prefix already due, so that entries of
/// one group fire in their order even when a later one's time is earlier within the slot. Groups in `blocked`
/// (a firing of theirs is not finished) fire nothing. Returns indices into `waiting`, ascending.
pub fn pick_due(waiting: &[Waiting], now_ms: i64, blocked: &HashSet<u64>) -> Vec<usize> {
    let mut stopped: HashSet<u64> = blocked.clone();
    let mut picked = Vec::new();
    for (i, w) in waiting.iter().enumerate() {
        if stopped.contains(&w.group) {
            continue;
        }
        if w.due_ms <= now_ms {
            picked.push(i);
        } else {
            stopped.insert(w.group);
        }
    }
    picked
}

#[cfg(test)]
mod tests;
