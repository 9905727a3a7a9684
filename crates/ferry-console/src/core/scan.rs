//! A filter scan's decisions: which records match, and when the scan stops (the byte budget spent, enough
//! matches, the end of the range). The driver feeds each fetched chunk with [`Scan::step`] and obeys the answer.
//!
//! Invariants: the budget counts the bytes of batches fetched (what the broker sent), so a scan of a partition
//! with no match still ends; records before `from` or at/after `until` are never matched; a match is reported once.

use regex::bytes::Regex;

/// How a field is matched.
#[derive(Debug, Clone)]
pub enum Matcher {
    /// Contains these bytes.
    Substring(Vec<u8>),
    /// Equals these bytes.
    Exact(Vec<u8>),
    /// Matches this regex anywhere.
    Regex(Regex),
}

impl Matcher {
    /// Whether `field` matches (a null field never does).
    pub fn matches(&self, field: Option<&[u8]>) -> bool {
        let Some(f) = field else { return false };
        match self {
            Matcher::Substring(s) => s.is_empty() || memmem(f, s),
            Matcher::Exact(s) => f == s.as_slice(),
            Matcher::Regex(r) => r.is_match(f),
        }
    }
}

fn memmem(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

/// What a record must satisfy (every set part).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// On the key.
    pub key: Option<Matcher>,
    /// On the value.
    pub value: Option<Matcher>,
    /// A header of this name, whose value matches when a matcher is given.
    pub header: Option<(String, Option<Matcher>)>,
    /// Timestamps at or after (ms).
    pub from_ms: Option<i64>,
    /// Timestamps before (ms).
    pub until_ms: Option<i64>,
}

/// The parts of a record a filter looks at.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// Offset.
    pub offset: u64,
    /// Timestamp, ms.
    pub timestamp: i64,
    /// Key.
    pub key: Option<&'a [u8]>,
    /// Value.
    pub value: Option<&'a [u8]>,
    /// Headers.
    pub headers: &'a [(&'a str, Option<&'a [u8]>)],
}

impl Filter {
    /// Whether `r` matches.
    pub fn matches(&self, r: &View<'_>) -> bool {
        if self.from_ms.is_some_and(|f| r.timestamp < f) || self.until_ms.is_some_and(|u| r.timestamp >= u) {
            return false;
        }
        if self.key.as_ref().is_some_and(|m| !m.matches(r.key))
            || self.value.as_ref().is_some_and(|m| !m.matches(r.value))
        {
            return false;
        }
        match &self.header {
            None => true,
            Some((name, m)) => r.headers.iter().any(|(k, v)| k == name && m.as_ref().is_none_or(|m| m.matches(*v))),
        }
    }
}

/// Why a scan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// The byte budget is spent.
    Budget,
    /// As many matches as asked for.
    Limit,
    /// The end of the range was reached.
    End,
}

/// A scan's progress.
#[derive(Debug, Clone)]
pub struct Scan {
    /// The filter.
    pub filter: Filter,
    /// First offset looked at.
    pub from: u64,
    /// Offset the scan ends before (the log end when it started).
    pub end: u64,
    /// Bytes it may fetch.
    pub budget: u64,
    /// Matches it stops at.
    pub limit: usize,
    /// Bytes fetched so far.
    pub scanned_bytes: u64,
    /// Records looked at so far.
    pub scanned_records: u64,
    /// Matches so far.
    pub matched: usize,
    /// Next offset to fetch.
    pub next: u64,
}

/// The answer to one chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The offsets of the chunk's records that match, in order.
    pub matches: Vec<u64>,
    /// `Some` when the scan is over.
    pub stop: Option<Stop>,
}

impl Scan {
    /// A scan of `[from, end)` with `budget` bytes, stopping at `limit` matches.
    pub fn new(filter: Filter, from: u64, end: u64, budget: u64, limit: usize) -> Scan {
        Scan { filter, from, end, budget, limit, scanned_bytes: 0, scanned_records: 0, matched: 0, next: from }
    }

    /// Before the first fetch: a scan of an empty range is over.
    pub fn start(&self) -> Option<Stop> {
        (self.next >= self.end).then_some(Stop::End).or_else(|| (self.limit == 0).then_some(Stop::Limit))
    }

    /// One fetched chunk: `bytes` fetched, its records, and the offset to fetch next.
    pub fn step(&mut self, bytes: u64, records: &[View<'_>], next_offset: u64) -> Step {
        self.scanned_bytes += bytes;
        let mut matches = Vec::new();
        for r in records.iter().filter(|r| r.offset >= self.next && r.offset < self.end) {
            self.scanned_records += 1;
            if self.filter.matches(r) {
                matches.push(r.offset);
                self.matched += 1;
                if self.matched >= self.limit {
                    self.next = r.offset + 1;
                    return Step { matches, stop: Some(Stop::Limit) };
                }
            }
        }
        self.next = self.next.max(next_offset);
        let stop = if self.next >= self.end {
            Some(Stop::End)
        } else if self.scanned_bytes >= self.budget {
            Some(Stop::Budget)
        } else {
            None
        };
        Step { matches, stop }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(offset: u64, key: &'a str, value: &'a str, headers: &'a [(&'a str, Option<&'a [u8]>)]) -> View<'a> {
        View {
            offset,
            timestamp: offset as i64 * 10,
            key: Some(key.as_bytes()),
            value: Some(value.as_bytes()),
            headers,
        }
    }

    #[test]
    fn filter_table() {
        let h: &[(&str, Option<&[u8]>)] = &[("trace", Some(b"abc-123"))];
        let r = view(5, "order-7", r#"{"amount": 12}"#, h);
        let sub = |s: &str| Some(Matcher::Substring(s.as_bytes().to_vec()));
        let cases: Vec<(Filter, bool)> = vec![
            (Filter::default(), true),
            (Filter { key: sub("order"), ..Default::default() }, true),
            (Filter { key: Some(Matcher::Exact(b"order".to_vec())), ..Default::default() }, false),
            (Filter { key: Some(Matcher::Exact(b"order-7".to_vec())), ..Default::default() }, true),
            (Filter { value: sub("amount\": 13"), ..Default::default() }, false),
            (
                Filter { value: Some(Matcher::Regex(Regex::new(r#""amount": \d+"#).unwrap())), ..Default::default() },
                true,
            ),
            (Filter { header: Some(("trace".into(), None)), ..Default::default() }, true),
            (Filter { header: Some(("trace".into(), sub("123"))), ..Default::default() }, true),
            (Filter { header: Some(("trace".into(), sub("999"))), ..Default::default() }, false),
            (Filter { header: Some(("other".into(), None)), ..Default::default() }, false),
            (Filter { from_ms: Some(50), until_ms: Some(51), ..Default::default() }, true),
            (Filter { from_ms: Some(51), ..Default::default() }, false),
            (Filter { until_ms: Some(50), ..Default::default() }, false),
            (Filter { key: sub("order"), value: sub("nope"), ..Default::default() }, false),
        ];
        for (i, (f, want)) in cases.iter().enumerate() {
            assert_eq!(f.matches(&r), *want, "case {i}: {f:?}");
        }
    }

    #[test]
    fn scan_stops_at_budget_limit_or_end() {
        let none: &[(&str, Option<&[u8]>)] = &[];
        let chunk: Vec<View<'_>> =
            (0..10).map(|o| view(o, if o % 3 == 0 { "hit" } else { "miss" }, "v", none)).collect();
        let hit = Filter { key: Some(Matcher::Exact(b"hit".to_vec())), ..Default::default() };
        // (budget, limit, end, bytes per chunk) -> (matches, stop)
        // (budget, limit, end, bytes per chunk) -> (matches, stop)
        type Row = ((u64, usize, u64, u64), (Vec<u64>, Option<Stop>));
        let table: Vec<Row> = vec![
            ((1000, 10, 100, 10), (vec![0, 3, 6, 9], None)),
            ((10, 10, 100, 10), (vec![0, 3, 6, 9], Some(Stop::Budget))),
            ((1000, 2, 100, 10), (vec![0, 3], Some(Stop::Limit))),
            ((1000, 10, 10, 10), (vec![0, 3, 6, 9], Some(Stop::End))),
            ((1000, 10, 5, 10), (vec![0, 3], Some(Stop::End))),
        ];
        for ((budget, limit, end, bytes), (matches, stop)) in table {
            let mut s = Scan::new(hit.clone(), 0, end, budget, limit);
            assert_eq!(s.start(), None);
            let step = s.step(bytes, &chunk, 10);
            assert_eq!((step.matches, step.stop), (matches, stop), "budget {budget} limit {limit} end {end}");
        }
        // A batch that starts before `from` does not match records before it.
        let mut s = Scan::new(hit.clone(), 4, 100, 1000, 10);
        assert_eq!(s.step(10, &chunk, 10).matches, vec![6, 9]);
        assert_eq!(Scan::new(hit, 7, 7, 1, 1).start(), Some(Stop::End));
    }
}
