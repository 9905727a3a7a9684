//! Which broker leads each partition, as a client learnt it, and the clients of those leaders (see the
//! connection module's docs, "Partition leaders").

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{
    BrokerClient, COORDINATOR_GROUP_KEY, LEADER_ADDRESS_KEY, LEADER_EPOCH_KEY, LEADER_ID_KEY, LEADER_PARTITION_KEY,
};
use crate::config::ClientConfig;

/// One topic's partitions' leaders: partition -> (leader epoch, leader address).
type TopicLeaders = HashMap<u32, (u32, String)>;

/// The newest known leader of each partition, and the clients of the leaders' addresses.
#[derive(Default)]
pub(super) struct Routing {
    /// topic -> partition -> (leader epoch, leader address); by topic first, so that a lookup needs no owned name.
    leaders: parking_lot::Mutex<HashMap<String, TopicLeaders>>,
    /// Group -> (leader epoch of its offsets partition, coordinator address).
    coordinators: parking_lot::Mutex<HashMap<String, (u32, String)>>,
    /// Broker id -> address on this client's listener, from the last Metadata answer.
    brokers: parking_lot::Mutex<HashMap<u32, String>>,
    /// Clients of one leader address each.
    direct: parking_lot::Mutex<HashMap<String, BrokerClient>>,
}

/// Learns that `address` leads `topic`/`partition` at `epoch` unless a newer epoch is known: whether it did.
fn learn(leaders: &mut HashMap<String, TopicLeaders>, topic: &str, partition: u32, epoch: u32, address: &str) -> bool {
    let by_partition = match leaders.get_mut(topic) {
        Some(t) => t,
        None => leaders.entry(topic.to_owned()).or_default(),
    };
    let known = by_partition.entry(partition).or_insert_with(|| (epoch, address.to_owned()));
    if epoch < known.0 {
        return false;
    }
    if (known.0, known.1.as_str()) != (epoch, address) {
        *known = (epoch, address.to_owned());
    }
    true
}

impl BrokerClient {
    /// The client of `topic`/`partition`'s leader, as this client last learnt it; this client when it knows none
    /// (its brokers answer NOT_LEADER with the leader, which it then learns).
    pub fn for_partition(&self, topic: &str, partition: u32) -> BrokerClient {
        let Some(routing) = self.inner.routing.upgrade() else { return self.clone() };
        let address = routing.leaders.lock().get(topic).and_then(|t| t.get(&partition)).map(|(_, a)| a.clone());
        self.client_at(&routing, address)
    }

    /// [`BrokerClient::for_partition`] and [`BrokerClient::known_leader_epoch`] in one look-up (a probe of
    /// thousands of partitions asks both of each).
    pub fn leader_for(&self, topic: &str, partition: u32) -> (BrokerClient, Option<u32>) {
        let Some(routing) = self.inner.routing.upgrade() else { return (self.clone(), None) };
        let known = routing.leaders.lock().get(topic).and_then(|t| t.get(&partition)).cloned();
        let epoch = known.as_ref().map(|(e, _)| *e).filter(|e| *e > 0);
        (self.client_at(&routing, known.map(|(_, a)| a)), epoch)
    }

    /// [`BrokerClient::leader_for`] of many partitions under one look-up of the leaders known: the distinct
    /// leader clients, and for each partition the index of its leader among them and the leader epoch known of
    /// it (0: none). A probe of thousands of partitions then takes one lock and makes no name per partition.
    pub fn leaders_for<'a>(
        &self,
        partitions: impl IntoIterator<Item = (&'a str, u32)>,
    ) -> (Vec<BrokerClient>, Vec<(usize, u32)>) {
        let Some(routing) = self.inner.routing.upgrade() else {
            return (vec![self.clone()], partitions.into_iter().map(|_| (0, 0)).collect());
        };
        // Distinct leader addresses (`None`: not known, this client's brokers), few in number.
        let mut addresses: Vec<Option<String>> = Vec::new();
        let mut placed = Vec::new();
        {
            let leaders = routing.leaders.lock();
            let mut last: Option<(&str, Option<&TopicLeaders>)> = None;
            for (topic, partition) in partitions {
                let of_topic = match last {
                    Some((t, of_topic)) if t == topic => of_topic,
                    _ => {
                        let of_topic = leaders.get(topic);
                        last = Some((topic, of_topic));
                        of_topic
                    }
                };
                let known = of_topic.and_then(|t| t.get(&partition));
                let address = known.map(|(_, a)| a.as_str());
                let at = match addresses.iter().position(|a| a.as_deref() == address) {
                    Some(at) => at,
                    None => {
                        addresses.push(address.map(str::to_owned));
                        addresses.len() - 1
                    }
                };
                placed.push((at, known.map_or(0, |(e, _)| *e)));
            }
        }
        let clients = addresses.into_iter().map(|a| self.client_at(&routing, a)).collect();
        (clients, placed)
    }

    /// Whether `other` is this very client (the same connection), as [`BrokerClient::for_partition`] hands out one
    /// client per leader: partitions are grouped by leader without naming it.
    pub fn is_same(&self, other: &BrokerClient) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The leader epoch of `topic`/`partition` this client last learnt (`None` when it knows none): requests about
    /// the partition name it, so that only the leader of that epoch answers (Kafka's KIP-320).
    pub fn known_leader_epoch(&self, topic: &str, partition: u32) -> Option<u32> {
        let routing = self.inner.routing.upgrade()?;
        let epoch = routing.leaders.lock().get(topic).and_then(|t| t.get(&partition)).map(|(e, _)| *e);
        epoch.filter(|e| *e > 0)
    }

    /// Forgets the leader learnt for `topic`/`partition` (it answered that it does not, or may not, lead it and
    /// named no other): the next call about it goes to the listed brokers.
    pub fn forget_leader(&self, topic: &str, partition: u32) {
        if let Some(routing) = self.inner.routing.upgrade() {
            let mut leaders = routing.leaders.lock();
            if let Some(t) = leaders.get_mut(topic) {
                t.remove(&partition);
                if t.is_empty() {
                    leaders.remove(topic);
                }
            }
        }
    }

    /// Takes a partition answer's leader hint (NOT_LEADER or FENCED_LEADER_EPOCH): learns the leader it names, or,
    /// when it names none, forgets the one known and moves the listed brokers' connection on, so that another
    /// member is asked. Returns whether a leader was learnt.
    pub fn take_hint(&self, topic: &str, partition: u32, hint: &ferry_proto::LeaderHint) -> bool {
        if hint.leader_id == 0 || hint.leader_address.is_empty() {
            self.forget_leader(topic, partition);
            self.reconnect();
            return false;
        }
        let address = self.address_of(hint.leader_id, &hint.leader_address);
        self.learn_leader(topic, partition, hint.leader_epoch, &address)
    }

    /// The client of `group`'s coordinator, as this client last learnt it (from NOT_COORDINATOR answers); this
    /// client when it knows none.
    pub fn for_group(&self, group: &str) -> BrokerClient {
        let Some(routing) = self.inner.routing.upgrade() else { return self.clone() };
        let address = routing.coordinators.lock().get(group).map(|(_, a)| a.clone());
        self.client_at(&routing, address)
    }

    /// The client of broker `id` at its address on this client's listener, as the last Metadata answer gave it;
    /// `None` when that answer did not name it.
    pub fn for_broker(&self, id: u32) -> Option<BrokerClient> {
        let routing = self.inner.routing.upgrade()?;
        let address = routing.brokers.lock().get(&id).cloned()?;
        Some(self.client_at(&routing, Some(address)))
    }

    /// Learns the brokers' addresses on this client's listener (a Metadata answer's).
    pub(crate) fn learn_brokers(&self, brokers: impl IntoIterator<Item = (u32, String)>) {
        if let Some(routing) = self.inner.routing.upgrade() {
            let mut known = routing.brokers.lock();
            for (id, address) in brokers.into_iter().filter(|(id, a)| *id != 0 && !a.is_empty()) {
                known.insert(id, address);
            }
        }
    }

    /// Broker `id`'s address on this client's listener, when a Metadata answer named it; else `fallback` (an
    /// answer's hint, given at the registered address).
    pub fn address_of(&self, id: u32, fallback: &str) -> String {
        let known = self.inner.routing.upgrade().and_then(|r| r.brokers.lock().get(&id).cloned());
        known.unwrap_or_else(|| fallback.to_owned())
    }

    /// The client of one broker address (made once and shared), or this client for `None` or its own address.
    fn client_at(&self, routing: &Arc<Routing>, address: Option<String>) -> BrokerClient {
        let Some(address) = address else { return self.clone() };
        if self.inner.config.brokers.len() == 1 && self.inner.config.brokers[0] == address {
            return self.clone();
        }
        let mut direct = routing.direct.lock();
        if let Some(c) = direct.get(&address) {
            return c.clone();
        }
        let config = ClientConfig { brokers: vec![address.clone()], ..self.inner.config.clone() };
        match BrokerClient::with_routing(config, self.inner.tls.clone(), Arc::downgrade(routing), None) {
            Ok(c) => {
                direct.insert(address, c.clone());
                c
            }
            Err(e) => {
                tracing::debug!(%address, error = %e, "cannot dial a broker the cluster named; using the listed brokers");
                self.clone()
            }
        }
    }

    /// Learns that `address` leads `topic`/`partition` at `epoch`, unless a newer epoch is known already. Returns
    /// whether it did.
    pub fn learn_leader(&self, topic: &str, partition: u32, epoch: u32, address: &str) -> bool {
        let Some(routing) = self.inner.routing.upgrade() else { return false };
        if address.is_empty() {
            return false;
        }
        learn(&mut routing.leaders.lock(), topic, partition, epoch, address)
    }

    /// [`BrokerClient::learn_leader`] of many partitions led by `address`, each at its epoch, under one lock.
    pub fn learn_leaders<'a>(&self, address: &str, partitions: impl IntoIterator<Item = (&'a str, u32, u32)>) {
        let Some(routing) = self.inner.routing.upgrade() else { return };
        if address.is_empty() {
            return;
        }
        let mut leaders = routing.leaders.lock();
        for (topic, partition, epoch) in partitions {
            learn(&mut leaders, topic, partition, epoch, address);
        }
    }

    /// Learns that `address` coordinates `group` (its offsets partition's leader at `epoch`), unless a newer epoch
    /// is known already. Returns whether it did.
    fn learn_coordinator(&self, group: &str, epoch: u32, address: &str) -> bool {
        let Some(routing) = self.inner.routing.upgrade() else { return false };
        if address.is_empty() {
            return false;
        }
        let mut known = routing.coordinators.lock();
        let entry = known.entry(group.to_owned()).or_insert_with(|| (epoch, address.to_owned()));
        if epoch < entry.0 {
            return false;
        }
        *entry = (epoch, address.to_owned());
        true
    }

    /// Forgets the leaders learnt at this client's address, when it is a leader's client: after a failure there,
    /// the listed brokers are asked again.
    pub(super) fn forget_leaders_here(&self) {
        let (Some(routing), [address]) = (self.inner.routing.upgrade(), self.inner.config.brokers.as_slice()) else {
            return;
        };
        if self.inner._routing.is_some() {
            return;
        }
        routing.leaders.lock().retain(|_, t| {
            t.retain(|_, (_, a)| a != address);
            !t.is_empty()
        });
        routing.coordinators.lock().retain(|_, (_, a)| a != address);
    }

    /// Follows the leader hint of a NOT_LEADER status from a raw (streaming) call, as the unary calls do; whether
    /// a leader was learnt.
    pub fn follow_hint(&self, status: &tonic::Status) -> bool {
        self.follow_leader_hint(status)
    }

    /// Follows a NOT_LEADER answer's leader hint: when it names one of the configured brokers and its leader
    /// epoch is not older than the newest this client saw for that partition, the next connection goes there.
    /// Returns whether it does.
    pub(super) fn follow_leader_hint(&self, status: &tonic::Status) -> bool {
        let md = status.metadata();
        let text = |key: &str| md.get(key).and_then(|v| v.to_str().ok()).map(str::to_owned);
        match text(crate::error::REASON_KEY).as_deref() {
            Some("not_leader" | "fenced_leader_epoch") => {}
            Some("not_coordinator") => {
                let (Some(address), Some(epoch), Some(group)) = (
                    text(LEADER_ADDRESS_KEY),
                    text(LEADER_EPOCH_KEY).and_then(|e| e.parse::<u32>().ok()),
                    text(COORDINATOR_GROUP_KEY),
                ) else {
                    return false;
                };
                let leader_id = text(LEADER_ID_KEY).and_then(|id| id.parse::<u32>().ok()).unwrap_or(0);
                let address = self.address_of(leader_id, &address);
                return self.learn_coordinator(&group, epoch, &address);
            }
            _ => return false,
        }
        let (Some(address), Some(epoch), Some(partition)) = (
            text(LEADER_ADDRESS_KEY),
            text(LEADER_EPOCH_KEY).and_then(|e| e.parse::<u32>().ok()),
            text(LEADER_PARTITION_KEY),
        ) else {
            return false;
        };
        // The hint gives the registered address; this client's listener may have another for that broker.
        let leader_id = text(LEADER_ID_KEY).and_then(|id| id.parse::<u32>().ok()).unwrap_or(0);
        let Some((topic, index)) = partition.rsplit_once('/').and_then(|(t, p)| Some((t, p.parse::<u32>().ok()?)))
        else {
            return false;
        };
        if leader_id == 0 || address.is_empty() {
            // No leader named (an election runs, or this member fenced itself): ask the listed brokers again.
            self.forget_leader(topic, index);
            self.forget_leaders_here();
            self.reconnect();
            return false;
        }
        let address = self.address_of(leader_id, &address);
        if !self.learn_leader(topic, index, epoch, &address) {
            return false;
        }
        let Some(index) = self.inner.config.brokers.iter().position(|b| *b == address) else {
            // Not a listed broker: `for_partition` dials it for the next attempt.
            return true;
        };
        let mut current = self.inner.current.lock();
        if current.as_ref().is_some_and(|c| c.index == index) {
            // Already there: the hint is about this very broker (it just took over); retry as it is.
            return true;
        }
        self.inner.next_index.store(index, Ordering::Relaxed);
        *current = None;
        tracing::debug!(broker = %address, leader_epoch = epoch, "following the leader hint");
        true
    }
}
