//! Group membership and the assignment rule: a group's members, their subscriptions and session clocks, and the
//! deal of partitions over them (Zeze's rule, see the parent module), with the generation it bumps.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ferry_proto as pb;

/// One (topic, partition) to deal.
type Item = (String, u32);

/// One member of a group.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub(super) client_id: String,
    pub(super) topics: BTreeSet<String>,
    pub(super) session_timeout: Duration,
    pub(super) last_seen: Instant,
}

/// One group: its members and their current assignment.
#[derive(Debug, Default)]
pub(super) struct Group {
    pub(super) generation: u64,
    pub(super) members: BTreeMap<String, Member>,
    pub(super) assignment: BTreeMap<String, Vec<Item>>,
    /// The partition count of each subscribed topic when the assignment was last dealt.
    pub(super) dealt: BTreeMap<String, u32>,
    /// How many times the assignment was dealt (observed by tests).
    pub(super) deals: u64,
}

impl Group {
    /// Recomputes the assignment with the current partition counts; bumps the generation when it changed.
    pub(super) fn rebalance(&mut self, counts: &dyn Fn(&str) -> u32) -> bool {
        self.dealt = self.counts(counts);
        self.deals += 1;
        let items: Vec<Item> = self.dealt.iter().flat_map(|(t, &n)| (0..n).map(move |p| (t.clone(), p))).collect();
        let ids: Vec<&String> = self.members.keys().collect();
        let mut next: BTreeMap<String, Vec<Item>> = ids.iter().map(|id| ((*id).clone(), Vec::new())).collect();
        if !ids.is_empty() {
            for (i, item) in items.into_iter().enumerate() {
                let n = ids.len();
                if let Some(owner) =
                    (0..n).map(|k| ids[(i + k) % n]).find(|id| self.members[*id].topics.contains(&item.0))
                {
                    next.get_mut(owner).expect("member listed").push(item);
                }
            }
        }
        if next != self.assignment {
            self.assignment = next;
            self.generation += 1;
            true
        } else {
            false
        }
    }

    /// Deals again only when a subscribed topic's partition count changed since the last deal; returns whether
    /// the generation moved. The subscribed topics themselves change only with membership, which deals through
    /// [`Group::rebalance`], so comparing the counts of the topics dealt is enough.
    pub(super) fn refresh(&mut self, counts: &dyn Fn(&str) -> u32) -> bool {
        self.dealt.iter().any(|(t, &n)| counts(t) != n) && self.rebalance(counts)
    }

    /// The current partition count of every topic a member subscribes to.
    fn counts(&self, counts: &dyn Fn(&str) -> u32) -> BTreeMap<String, u32> {
        let topics: BTreeSet<&String> = self.members.values().flat_map(|m| m.topics.iter()).collect();
        topics.into_iter().map(|t| (t.clone(), counts(t))).collect()
    }

    pub(super) fn assignment_of(&self, member: &str) -> Vec<pb::TopicPartition> {
        self.assignment
            .get(member)
            .map(|items| items.iter().map(|(t, p)| pb::TopicPartition { topic: t.clone(), partition: *p }).collect())
            .unwrap_or_default()
    }
}
