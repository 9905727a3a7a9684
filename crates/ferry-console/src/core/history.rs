//! The recent past of each message-model group, sampled by the console itself: its backlog over the last hour (a
//! chart on the group page) and its redelivery and lock-expiry rates, from the broker's counters.
//!
//! Invariants: at most `cap` samples per group (the oldest dropped first); samples of a group are in time order
//! (an older sample than the newest is ignored); a rate needs two samples and is 0 when a counter went backwards
//! (the group's owner restarted and its counters began again).

use std::collections::{BTreeMap, VecDeque};

/// One observation of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// Records not yet settled (the sum of its partitions' lag).
    pub backlog: u64,
    /// The owner's redelivery counter.
    pub redeliveries: u64,
    /// The owner's lock-expiry counter.
    pub lock_expiries: u64,
}

/// Per (cluster, group), the last `cap` samples.
#[derive(Debug, Clone)]
pub struct History {
    cap: usize,
    groups: BTreeMap<(String, String), VecDeque<Sample>>,
}

/// Events per minute between the first and the last sample.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Rates {
    /// Redeliveries per minute.
    pub redeliveries_per_min: f64,
    /// Lock expiries per minute.
    pub lock_expiries_per_min: f64,
}

impl History {
    /// Keeps `cap` samples per group.
    pub fn new(cap: usize) -> History {
        History { cap: cap.max(2), groups: BTreeMap::new() }
    }

    /// Adds a sample.
    pub fn record(&mut self, cluster: &str, group: &str, s: Sample) {
        let q = self.groups.entry((cluster.to_owned(), group.to_owned())).or_default();
        if q.back().is_some_and(|last| last.at_ms > s.at_ms) {
            return;
        }
        q.push_back(s);
        while q.len() > self.cap {
            q.pop_front();
        }
    }

    /// A group's samples, oldest first.
    pub fn series(&self, cluster: &str, group: &str) -> Vec<Sample> {
        self.groups.get(&(cluster.to_owned(), group.to_owned())).map_or_else(Vec::new, |q| q.iter().copied().collect())
    }

    /// The groups of `cluster` that have samples.
    pub fn groups(&self, cluster: &str) -> Vec<String> {
        self.groups.keys().filter(|(c, _)| c == cluster).map(|(_, g)| g.clone()).collect()
    }

    /// A group's rates over its samples.
    pub fn rates(&self, cluster: &str, group: &str) -> Option<Rates> {
        let q = self.groups.get(&(cluster.to_owned(), group.to_owned()))?;
        let (first, last) = (q.front()?, q.back()?);
        let minutes = (last.at_ms - first.at_ms) as f64 / 60_000.0;
        if q.len() < 2 || minutes <= 0.0 {
            return None;
        }
        let per_min = |a: u64, b: u64| b.checked_sub(a).map_or(0.0, |d| d as f64 / minutes);
        Some(Rates {
            redeliveries_per_min: per_min(first.redeliveries, last.redeliveries),
            lock_expiries_per_min: per_min(first.lock_expiries, last.lock_expiries),
        })
    }
}

/// A sample of a group's description taken at `at_ms`.
pub fn sample_of(d: &ferry_client::proto::ShareDescribeResponse, at_ms: i64) -> Sample {
    Sample {
        at_ms,
        backlog: d.partitions.iter().map(|p| p.lag).sum(),
        redeliveries: d.redeliveries,
        lock_expiries: d.lock_expiries,
    }
}

/// An SVG polyline of backlogs over time, `w` x `h`, scaled to the largest value.
pub fn sparkline(samples: &[Sample], w: u32, h: u32) -> String {
    if samples.len() < 2 {
        return String::new();
    }
    let (t0, t1) = (samples[0].at_ms, samples[samples.len() - 1].at_ms.max(samples[0].at_ms + 1));
    let max = samples.iter().map(|s| s.backlog).max().unwrap_or(0).max(1);
    let points: Vec<String> = samples
        .iter()
        .map(|s| {
            let x = (s.at_ms - t0) as f64 / (t1 - t0) as f64 * f64::from(w);
            let y = f64::from(h) - s.backlog as f64 / max as f64 * f64::from(h);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    format!(
        "<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"backlog\">\
         <polyline fill=\"none\" stroke=\"#17324d\" stroke-width=\"1.5\" points=\"{}\"/></svg>",
        points.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at_ms: i64, backlog: u64, redeliveries: u64, lock_expiries: u64) -> Sample {
        Sample { at_ms, backlog, redeliveries, lock_expiries }
    }

    #[test]
    fn keeps_the_last_cap_samples_in_time_order() {
        let mut h = History::new(3);
        for (at, backlog) in [(1_000, 5), (2_000, 4), (1_500, 99), (3_000, 3), (4_000, 2)] {
            h.record("c", "g", s(at, backlog, 0, 0));
        }
        let got: Vec<(i64, u64)> = h.series("c", "g").iter().map(|s| (s.at_ms, s.backlog)).collect();
        assert_eq!(got, vec![(2_000, 4), (3_000, 3), (4_000, 2)]);
        assert!(h.series("c", "other").is_empty());
        assert!(h.series("d", "g").is_empty());
        assert_eq!(h.groups("c"), vec!["g".to_owned()]);
    }

    #[test]
    fn rates_table() {
        // (samples, want) as (redeliveries/min, lock expiries/min)
        type Row = (Vec<Sample>, Option<(f64, f64)>);
        let table: Vec<Row> = vec![
            (vec![], None),
            (vec![s(0, 0, 5, 1)], None),
            (vec![s(0, 0, 0, 0), s(60_000, 0, 30, 6)], Some((30.0, 6.0))),
            (vec![s(0, 0, 10, 0), s(30_000, 0, 20, 0), s(120_000, 0, 70, 4)], Some((30.0, 2.0))),
            (vec![s(0, 0, 50, 5), s(60_000, 0, 3, 1)], Some((0.0, 0.0))),
        ];
        for (samples, want) in table {
            let mut h = History::new(60);
            for x in &samples {
                h.record("c", "g", *x);
            }
            let got = h.rates("c", "g").map(|r| (r.redeliveries_per_min, r.lock_expiries_per_min));
            assert_eq!(got, want, "{samples:?}");
        }
    }

    #[test]
    fn sparkline_scales_to_the_box() {
        assert_eq!(sparkline(&[s(0, 1, 0, 0)], 100, 20), "");
        let svg = sparkline(&[s(0, 0, 0, 0), s(50, 10, 0, 0), s(100, 5, 0, 0)], 100, 20);
        assert!(svg.contains("points=\"0.0,20.0 50.0,0.0 100.0,10.0\""), "{svg}");
    }
}
