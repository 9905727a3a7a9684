//! Consumer-group offset sync, for failover: the committed source offsets of the groups matched by `[groups]` are
//! copied to the target, mapped through the rename policy, so consumers that move to the target DC continue where
//! they were.
//!
//! Each copied offset is `min(committed, target log end)`: a consumer never starts past what the target holds. It
//! only moves forward, only while the group has no active members on the target (a group running there owns its
//! offsets), and never for promoted topics (after failover the target's consumers are the truth).

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_client::ClientError;
use ferry_client::proto as pb;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cluster::TargetCluster;
use crate::config::GroupsConfig;
use crate::egress::EgressHandle;
use crate::topics::TopicSet;

/// The group offset sync task.
pub struct GroupSync {
    rules: watch::Receiver<GroupsConfig>,
    topics: watch::Receiver<Arc<TopicSet>>,
    target: Arc<dyn TargetCluster>,
    egress: EgressHandle,
    /// The mirror's own groups (never synced).
    own_prefix: String,
}

/// What one round did (for logs and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncRound {
    /// Offsets committed on the target.
    pub committed: usize,
    /// Groups skipped because they have active members on the target.
    pub skipped_active: usize,
}

impl GroupSync {
    /// A sync task.
    pub fn new(
        rules: watch::Receiver<GroupsConfig>,
        topics: watch::Receiver<Arc<TopicSet>>,
        target: Arc<dyn TargetCluster>,
        egress: EgressHandle,
    ) -> GroupSync {
        GroupSync { rules, topics, target, egress, own_prefix: "ferry-mirror.".into() }
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let interval = self.rules.borrow().group_sync_interval;
            if !self.rules.borrow().include.is_empty() {
                match self.round().await {
                    Ok(r) if r.committed > 0 => {
                        tracing::info!(offsets = r.committed, "synced group offsets to the target")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "group offset sync failed"),
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
                changed = self.rules.changed() => if changed.is_err() { return },
            }
        }
    }

    /// One sync round.
    pub async fn round(&self) -> Result<SyncRound, ClientError> {
        let rules = self.rules.borrow().clone();
        let set = self.topics.borrow().clone();
        let source = Arc::clone(&self.egress.active().cluster);
        let mut round = SyncRound::default();
        // Target topics still mirror topics (promoted ones are left alone) and their partition log ends.
        let mirror_targets: BTreeMap<String, pb::TopicInfo> = self
            .target
            .list_topics()
            .await?
            .into_iter()
            .filter(|t| t.mirror.is_some())
            .map(|t| (t.name.clone(), t))
            .collect();
        let mut leos: BTreeMap<(String, u32), u64> = BTreeMap::new();
        for name in source.list_groups().await? {
            if name.starts_with(&self.own_prefix)
                || !rules.include.iter().any(|r| r.is_match(&name))
                || rules.exclude.iter().any(|r| r.is_match(&name))
            {
                continue;
            }
            let committed = source.committed(&name, &[]).await?;
            let on_target = self.target.group_state(&name).await?;
            if on_target.active_members > 0 {
                round.skipped_active += 1;
                continue;
            }
            let current: BTreeMap<(String, u32), u64> =
                on_target.offsets.iter().map(|o| ((o.topic.clone(), o.partition), o.offset)).collect();
            let mut updates = Vec::new();
            for c in committed {
                let Some(m) = set.topics.get(&c.topic) else { continue };
                if !mirror_targets.contains_key(&m.target) {
                    continue;
                }
                let key = (m.target.clone(), c.partition);
                let leo = match leos.get(&key) {
                    Some(&leo) => leo,
                    None => {
                        let leo = match self.target.partition(&m.target, c.partition).await {
                            Ok(p) => p.log_end,
                            Err(e) if e.is_not_found() => continue,
                            Err(e) => return Err(e),
                        };
                        leos.insert(key.clone(), leo);
                        leo
                    }
                };
                let offset = c.offset.min(leo);
                if current.get(&key).is_none_or(|&cur| offset > cur) {
                    updates.push(pb::CommittedOffset {
                        topic: m.target.clone(),
                        partition: c.partition,
                        offset,
                        metadata: c.metadata,
                    });
                }
            }
            if !updates.is_empty() {
                round.committed += updates.len();
                match self.target.commit_group(&name, updates).await {
                    Ok(()) => {}
                    // Members joined on the target between our check and the commit: they own the offsets now.
                    Err(e) if e.is_failed_precondition() => round.skipped_active += 1,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(round)
    }
}
