//! The cluster's catalog in etcd: replicated topics, their replica placement, and per partition the leader, leader
//! epoch and in-sync set. Every change is a compare-and-swap transaction on the revision the change was computed
//! from, so two brokers acting on the same state cannot both win.
//!
//! | key | value |
//! |-----|-------|
//! | `/ferry/topics/{name}` | [`TopicMeta`] (JSON), the same record a member keeps as `topic.json` |
//! | `/ferry/partitions/{name}/{p}` | [`PartitionState`] (JSON) |
//! | `/ferry/controller` | the controller's broker id, under the controller's lease |
//! | `/ferry/deleted/{topic_id}` | the name of a deleted topic: every member deletes its replicas of that id |
//! | `/ferry/drain/{id}` | present while broker `id` is being drained |
//! | `/ferry/listeners/{id}` | broker `id`'s named listeners (name -> address), under its lease |

use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use serde::Serialize;

pub use crate::cluster::core::view::{Snapshot, Versioned};
pub use crate::node::replica::PartitionState;
use crate::node::topic::TopicMeta;

/// The root of every key the cluster keeps in etcd.
pub const ROOT: &str = "/ferry";

pub use crate::node::topic::Replication;

/// The key of topic `name`.
pub fn topic_key(name: &str) -> String {
    format!("{ROOT}/topics/{name}")
}

/// The key of partition `p` of topic `name`.
pub fn partition_key(name: &str, p: u32) -> String {
    format!("{ROOT}/partitions/{name}/{p}")
}

/// The controller's key.
pub fn controller_key() -> String {
    format!("{ROOT}/controller")
}

/// The key of broker `id`'s named listeners (JSON: name -> advertised address), under its membership lease.
pub fn listeners_key(id: u32) -> String {
    format!("{ROOT}/listeners/{id}")
}

/// The key marking broker `id` as being drained.
pub fn drain_key(id: u32) -> String {
    format!("{ROOT}/drain/{id}")
}

/// The tombstone key of the deleted topic of id `topic_id`.
pub fn tombstone_key(topic_id: &str) -> String {
    format!("{ROOT}/deleted/{topic_id}")
}

/// Reads brokers, topics, partitions and the controller in one transaction (one revision).
pub async fn snapshot(client: &mut Client) -> Result<Snapshot, etcd_client::Error> {
    let prefix = |p: &str| TxnOp::get(format!("{ROOT}/{p}/"), Some(GetOptions::new().with_prefix()));
    let txn = Txn::new().and_then([
        prefix("brokers"),
        prefix("topics"),
        prefix("partitions"),
        TxnOp::get(controller_key(), None),
        prefix("deleted"),
        prefix("drain"),
        prefix("listeners"),
    ]);
    let response = client.txn(txn).await?;
    let mut snap = Snapshot::default();
    for op in response.op_responses() {
        let etcd_client::TxnOpResponse::Get(get) = op else { continue };
        for kv in get.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            let value = kv.value();
            let Some(rest) = key.strip_prefix(ROOT).and_then(|r| r.strip_prefix('/')) else { continue };
            let mut parts = rest.split('/');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("brokers"), Some(id), None) => {
                    if let Ok(id) = id.parse() {
                        snap.brokers.insert(id, String::from_utf8_lossy(value).into_owned());
                    }
                }
                (Some("topics"), Some(name), None) => match serde_json::from_slice::<TopicMeta>(value) {
                    Ok(mut t) => {
                        // The key names the topic; a record written without its name gets it from there.
                        t.name = name.to_owned();
                        snap.topics.insert(name.to_owned(), t);
                        snap.topic_revisions.insert(name.to_owned(), kv.mod_revision());
                    }
                    Err(e) => tracing::warn!(%key, error = %e, "unreadable topic record in etcd; ignored"),
                },
                (Some("partitions"), Some(name), Some(p)) => match (p.parse(), serde_json::from_slice(value)) {
                    (Ok(p), Ok(state)) => {
                        snap.partitions.insert((name.to_owned(), p), Versioned { state, revision: kv.mod_revision() });
                    }
                    _ => tracing::warn!(%key, "unreadable partition state in etcd; ignored"),
                },
                (Some("deleted"), Some(id), None) => {
                    snap.deleted.insert(id.to_owned());
                }
                (Some("listeners"), Some(id), None) => match (id.parse(), serde_json::from_slice(value)) {
                    (Ok(id), Ok(map)) => {
                        snap.listeners.insert(id, map);
                    }
                    _ => tracing::warn!(%key, "unreadable listeners in etcd; ignored"),
                },
                (Some("drain"), Some(id), None) => {
                    if let Ok(id) = id.parse() {
                        snap.draining.insert(id);
                    }
                }
                (Some("controller"), None, None) => {
                    snap.controller = String::from_utf8_lossy(value).parse().unwrap_or(0);
                }
                _ => {}
            }
        }
    }
    Ok(snap)
}

/// Creates topic `name` with its partition states, only if the topic key does not exist. `Ok(false)`: it does.
pub async fn create_topic(
    client: &mut Client,
    name: &str,
    record: &TopicMeta,
    states: &[PartitionState],
) -> Result<bool, etcd_client::Error> {
    let key = topic_key(name);
    let mut puts = vec![TxnOp::put(key.as_str(), encode(record), None)];
    for (p, state) in states.iter().enumerate() {
        puts.push(TxnOp::put(partition_key(name, p as u32), encode(state), None));
    }
    let txn = Txn::new().when([Compare::version(key.as_str(), CompareOp::Equal, 0)]).and_then(puts);
    Ok(client.txn(txn).await?.succeeded())
}

/// Replaces topic `name`'s record (its config, mirror mark or promotion) only if the topic key is still at
/// `revision`. `Ok(false)`: the topic changed meanwhile, or is gone.
pub async fn update_topic(
    client: &mut Client,
    name: &str,
    revision: i64,
    record: &TopicMeta,
) -> Result<bool, etcd_client::Error> {
    let key = topic_key(name);
    let txn = Txn::new()
        .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)])
        .and_then([TxnOp::put(key.as_str(), encode(record), None)]);
    Ok(client.txn(txn).await?.succeeded())
}

/// Grows topic `name` to `record.partitions`, writing the new partitions' states (`first` is the first new
/// partition's index), only if the topic key is still at `revision`. `Ok(false)`: it changed meanwhile.
pub async fn grow_topic(
    client: &mut Client,
    name: &str,
    revision: i64,
    record: &TopicMeta,
    first: u32,
    states: &[PartitionState],
) -> Result<bool, etcd_client::Error> {
    let key = topic_key(name);
    let mut when = vec![Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)];
    let mut puts = vec![TxnOp::put(key.as_str(), encode(record), None)];
    for (i, state) in states.iter().enumerate() {
        let pkey = partition_key(name, first + i as u32);
        when.push(Compare::version(pkey.as_str(), CompareOp::Equal, 0));
        puts.push(TxnOp::put(pkey, encode(state), None));
    }
    Ok(client.txn(Txn::new().when(when).and_then(puts)).await?.succeeded())
}

/// Deletes topic `name` (of id `topic_id`) and its partition states, leaving a tombstone of its id for the
/// members, only if the topic key is still at `revision`. `Ok(false)`: it changed meanwhile.
pub async fn delete_topic(
    client: &mut Client,
    name: &str,
    revision: i64,
    topic_id: &str,
) -> Result<bool, etcd_client::Error> {
    let key = topic_key(name);
    let txn = Txn::new().when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)]).and_then([
        TxnOp::delete(key.as_str(), None),
        TxnOp::delete(format!("{ROOT}/partitions/{name}/"), Some(DeleteOptions::new().with_prefix())),
        TxnOp::put(tombstone_key(topic_id), name, None),
    ]);
    Ok(client.txn(txn).await?.succeeded())
}

/// Writes `state` for `name/p` only if the key is still at `revision` (and, when `controller` is set, only if
/// that controller key still has that create revision: a deposed controller's writes fail). `Ok(Some(revision))`:
/// written at that revision; `Ok(None)`: it lost.
pub async fn swap_partition(
    client: &mut Client,
    name: &str,
    p: u32,
    revision: i64,
    state: &PartitionState,
    controller: Option<i64>,
) -> Result<Option<i64>, etcd_client::Error> {
    let key = partition_key(name, p);
    let mut when = vec![Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)];
    if let Some(created) = controller {
        when.push(Compare::create_revision(controller_key(), CompareOp::Equal, created));
    }
    let txn = Txn::new().when(when).and_then([TxnOp::put(key.as_str(), encode(state), None)]);
    let response = client.txn(txn).await?;
    Ok(response.succeeded().then(|| response.header().map_or(0, |h| h.revision())))
}

fn encode<T: Serialize>(value: &T) -> String {
    // Plain structs of numbers and strings: serialising them cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replication_names_parse_and_others_are_refused() {
        assert_eq!(Replication::parse(""), Ok(Replication::Single));
        assert_eq!(Replication::parse("single"), Ok(Replication::Single));
        assert_eq!(Replication::parse("raft3"), Ok(Replication::Raft3));
        assert_eq!(
            Replication::parse("raft5"),
            Err("replication \"raft5\" is not one of \"single\", \"double_write\", \"raft3\"".to_owned())
        );
        assert_eq!(Replication::Raft3.as_str(), "raft3");
    }
}
