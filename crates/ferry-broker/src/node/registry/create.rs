//! A client's topic create, and the limits every growth is checked against.
//!
//! A create holds the admin lock only to check the name and the limits and to reserve the name. The directories,
//! partition files and fsyncs that make the topic run after it, outside the lock, so creates of different topics
//! run side by side (the disk takes their fsyncs together: a mirror creating a thousand target topics is not a
//! thousand fsync chains one after another). Every other admin call on a reserved name, a second create of it
//! included, waits until the name is released, which is once the topic is in the map or its creation failed. A
//! reserved topic's partitions count against the limits as if it existed.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{BrokerCore, Topic, now_ms};
use crate::error::{BrokerError, Result};
use crate::node::topic::{MirrorMark, RESERVED_PREFIX, Replication, TopicMeta, TopicSettings, validate_topic_name};

/// The names being created outside the admin lock, with their partition counts.
#[derive(Debug, Default)]
pub(super) struct Creating {
    names: Arc<Mutex<HashMap<String, u32>>>,
    released: Arc<Notify>,
}

/// A name reserved for its creation; dropping it releases the name and wakes whoever waits on it.
#[derive(Debug)]
pub(super) struct Reservation {
    name: String,
    names: Arc<Mutex<HashMap<String, u32>>>,
    released: Arc<Notify>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.names.lock().remove(&self.name);
        self.released.notify_waiters();
    }
}

impl BrokerCore {
    /// The admin lock, once no create of `name` is under way.
    pub(super) async fn admit(&self, name: &str) -> tokio::sync::MutexGuard<'_, ()> {
        loop {
            let released = Arc::clone(&self.creating.released);
            let notified = released.notified();
            tokio::pin!(notified);
            // Registered before the check, so a release between the check and the wait is not missed.
            notified.as_mut().enable();
            let admin = self.admin.lock().await;
            if !self.creating.names.lock().contains_key(name) {
                return admin;
            }
            drop(admin);
            notified.await;
        }
    }

    /// Creates a topic (optionally as a mirror topic).
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: u32,
        settings: TopicSettings,
        mirror: Option<MirrorMark>,
    ) -> Result<Arc<Topic>> {
        validate_topic_name(name)?;
        if partitions == 0 || partitions > 100_000 {
            return Err(BrokerError::InvalidArgument(format!(
                "topic \"{name}\": partitions must be between 1 and 100000, not {partitions}"
            )));
        }
        let reserved = {
            let _admin = self.admit(name).await;
            if let Some(existing) = self.topics.read().get(name) {
                return Err(BrokerError::TopicExists { topic: name.to_owned(), topic_id: existing.id() });
            }
            self.check_limits(name, 1, partitions)?;
            self.creating.names.lock().insert(name.to_owned(), partitions);
            Reservation {
                name: name.to_owned(),
                names: Arc::clone(&self.creating.names),
                released: Arc::clone(&self.creating.released),
            }
        };
        let meta = TopicMeta {
            name: name.to_owned(),
            topic_id: uuid::Uuid::new_v4().to_string(),
            partitions,
            created_ms: now_ms(),
            settings,
            mirror,
            promoted_ms: None,
            replication: Replication::Single,
            risk_phase: false,
            fence: None,
            promote_epoch: None,
        };
        let all: Vec<u32> = (0..partitions).collect();
        self.materialize(meta, all, Some(reserved)).await
    }

    /// Refuses growing the broker by `topics` topics and `partitions` partitions past its limits. Topics being
    /// created count as created. The caller holds the admin lock.
    pub(super) fn check_limits(&self, name: &str, topics: u32, partitions: u32) -> Result<()> {
        // Internal topics are the broker's own state, not the clients': they do not count.
        let clients = |n: &String| !n.starts_with(RESERVED_PREFIX);
        let (mut count, mut total) = {
            let map = self.topics.read();
            map.iter()
                .filter(|(n, _)| clients(n))
                .fold((0u64, 0u64), |(n, p), (_, t)| (n + 1, p + u64::from(t.partition_count())))
        };
        for (_, p) in self.creating.names.lock().iter().filter(|(n, _)| clients(n)) {
            count += 1;
            total += u64::from(*p);
        }
        let limits = self.limits;
        if count + u64::from(topics) > u64::from(limits.max_topics) {
            return Err(BrokerError::LimitReached {
                what: format!("creating topic \"{name}\" would pass the broker's {} topics", limits.max_topics),
                key: "limits.max_topics",
            });
        }
        if total + u64::from(partitions) > u64::from(limits.max_partitions) {
            return Err(BrokerError::LimitReached {
                what: format!(
                    "{partitions} more partitions for topic \"{name}\" would pass the broker's {} partitions ({total} \
                     exist)",
                    limits.max_partitions
                ),
                key: "limits.max_partitions",
            });
        }
        Ok(())
    }
}
