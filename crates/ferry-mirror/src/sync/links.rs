//! The lanes' links, by source partition, and the list of them a probe round walks.
//!
//! The SourceWatch and the TargetWatch each walk every owned partition every second. Listing thousands of links
//! from the map every round (a pass over its shards, and the names and links counted up and down) cost more than
//! the round's own work, and the set changes only when the SyncManager starts or stops a lane. So the map counts
//! its changes, and a probe's [`LinkList`] is listed again only when that count moved.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::mapref::multiple::RefMulti;

use crate::lane::link::LaneLink;
use crate::tp::{SourceTp, TargetTp, TpMap};

/// The links by source partition, with a count of the changes made to the set.
#[derive(Debug, Default)]
pub struct LinkMap {
    map: TpMap<Arc<LaneLink>>,
    version: AtomicU64,
}

impl LinkMap {
    /// Adds (or replaces) a partition's link.
    pub fn insert(&self, tp: SourceTp, link: Arc<LaneLink>) -> Option<Arc<LaneLink>> {
        let old = self.map.insert(tp, link);
        self.version.fetch_add(1, Ordering::Release);
        old
    }

    /// Removes a partition's link.
    pub fn remove(&self, tp: &SourceTp) -> Option<(SourceTp, Arc<LaneLink>)> {
        let old = self.map.remove(tp);
        self.version.fetch_add(1, Ordering::Release);
        old
    }

    /// Every partition's link. Only reading is offered: a change made any other way than [`LinkMap::insert`] or
    /// [`LinkMap::remove`] would not be counted, and a probe would keep its old list.
    pub fn iter(&self) -> impl Iterator<Item = RefMulti<'_, SourceTp, Arc<LaneLink>>> {
        self.map.iter()
    }

    /// How many changes were made to the set: equal counts, the same set.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
}

/// Every link of a [`LinkMap`], listed once and kept while the map does not change: entry `i` of each column is
/// one partition's.
#[derive(Debug, Default)]
pub struct LinkList {
    version: Option<u64>,
    /// The source partitions.
    pub tps: Vec<SourceTp>,
    /// Their target partitions.
    pub targets: Vec<TargetTp>,
    /// Their links.
    pub links: Vec<Arc<LaneLink>>,
}

impl LinkList {
    /// Brings the list in line with `map`: listed again only when the map changed since it was last listed. A
    /// change made while it is listed is caught at the next call.
    pub fn refresh(&mut self, map: &LinkMap) {
        let version = map.version();
        if self.version == Some(version) {
            return;
        }
        self.tps.clear();
        self.targets.clear();
        self.links.clear();
        for entry in map.iter() {
            self.tps.push(entry.key().clone());
            self.targets.push(entry.value().target.clone());
            self.links.push(Arc::clone(entry.value()));
        }
        self.version = Some(version);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lane::budget::Budget;
    use crate::state::PartitionStatus;

    fn link(topic: &str, p: u32) -> Arc<LaneLink> {
        let tp = SourceTp::new(topic, p);
        let status = Arc::new(PartitionStatus::new(topic, &format!("{topic}.copy"), p));
        LaneLink::new(tp, Budget::new(1 << 20, 1 << 16), Arc::new(tokio::sync::Notify::new()), status)
    }

    fn listed(list: &LinkList) -> Vec<(String, u32, String)> {
        let mut out: Vec<_> = list
            .tps
            .iter()
            .zip(&list.targets)
            .zip(&list.links)
            .map(|((tp, target), link)| {
                assert_eq!(&link.tp, tp, "a row's link is its partition's");
                (tp.topic().to_owned(), tp.partition, target.topic().to_owned())
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_list_is_listed_again_exactly_when_the_set_changed() {
        let map = LinkMap::default();
        map.insert(SourceTp::new("a", 0), link("a", 0));
        map.insert(SourceTp::new("a", 1), link("a", 1));
        let mut list = LinkList::default();
        list.refresh(&map);
        assert_eq!(listed(&list), [("a".into(), 0, "a.copy".into()), ("a".into(), 1, "a.copy".into())]);
        // Unchanged: the same rows, the same links.
        let before = list.links.clone();
        list.refresh(&map);
        assert!(before.iter().zip(&list.links).all(|(x, y)| Arc::ptr_eq(x, y)));
        // A removal and an addition that keep the count are both seen.
        map.remove(&SourceTp::new("a", 0));
        map.insert(SourceTp::new("b", 0), link("b", 0));
        list.refresh(&map);
        assert_eq!(listed(&list), [("a".into(), 1, "a.copy".into()), ("b".into(), 0, "b.copy".into())]);
        // A replaced link is the new one.
        let fresh = link("b", 0);
        map.insert(SourceTp::new("b", 0), Arc::clone(&fresh));
        list.refresh(&map);
        let at = list.tps.iter().position(|tp| *tp == SourceTp::new("b", 0)).expect("b/0 listed");
        assert!(Arc::ptr_eq(&list.links[at], &fresh));
        assert_eq!(map.version(), 5);
    }
}
