//! Disaster recovery's edits of a topic's metadata, the same on a single broker's topic file and a cluster's
//! catalog record: fence and unfence, promotion as one cut, and marking a topic as a mirror topic again (failback).
//! Each answers whether it changed anything, so a repeated call writes nothing.

use crate::error::{BrokerError, Result};
use crate::node::topic::{Fence, MirrorMark, TopicMeta};

/// What a fence call asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceEdit {
    /// Fence at this epoch, for this reason.
    Set {
        /// The fence epoch.
        epoch: u64,
        /// Why (names the failover).
        reason: String,
    },
    /// Lift any fence.
    Lift,
}

/// Applies `edit` to `meta` at `now_ms` (ms since the Unix epoch). A fence only moves up: one below the fence in force is refused (a stale job must not
/// replace a newer one); the same epoch again changes nothing.
pub fn fence(meta: &mut TopicMeta, edit: &FenceEdit, now_ms: i64) -> Result<bool> {
    match edit {
        FenceEdit::Lift => Ok(meta.fence.take().is_some()),
        FenceEdit::Set { epoch, reason } => {
            if *epoch == 0 {
                return Err(BrokerError::InvalidArgument("a fence epoch must be at least 1".into()));
            }
            match &meta.fence {
                Some(f) if f.epoch > *epoch => Err(BrokerError::InvalidArgument(format!(
                    "topic \"{}\" is fenced at epoch {} ({}), above the asked epoch {epoch}; a fence only moves up",
                    meta.name, f.epoch, f.reason
                ))),
                Some(f) if f.epoch == *epoch => Ok(false),
                _ => {
                    meta.fence = Some(Fence { epoch: *epoch, reason: reason.clone(), at_ms: now_ms });
                    Ok(true)
                }
            }
        }
    }
}

/// Promotes `meta` as part of one cut: clears the mirror mark and raises the promotion epoch floor to `floor`.
/// Returns (changed, was a mirror topic).
pub fn promote(meta: &mut TopicMeta, floor: u32, now_ms: i64) -> (bool, bool) {
    let was_mirror = meta.mirror.take().is_some();
    if was_mirror {
        meta.promoted_ms = Some(now_ms);
    }
    let raise = floor > meta.promote_epoch.unwrap_or(0);
    if raise {
        meta.promote_epoch = Some(floor);
    }
    (was_mirror || raise, was_mirror)
}

/// Marks `meta` as a mirror topic of `mark`, lifting its fence (the mirror's appends are its only writes from now
/// on). Refused for a topic that mirrors another source.
pub fn mark_mirror(meta: &mut TopicMeta, mark: &MirrorMark) -> Result<bool> {
    if let Some(m) = &meta.mirror
        && (m.source_cluster_id != mark.source_cluster_id || m.source_topic != mark.source_topic)
    {
        return Err(BrokerError::InvalidArgument(format!(
            "topic \"{}\" already mirrors {}/{}; promote it first",
            meta.name,
            m.source_display(),
            m.source_topic
        )));
    }
    let changed = meta.mirror.as_ref() != Some(mark) || meta.fence.is_some();
    meta.mirror = Some(mark.clone());
    meta.fence = None;
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::topic::{Replication, TopicSettings};

    fn meta() -> TopicMeta {
        TopicMeta {
            name: "orders".into(),
            topic_id: "id".into(),
            partitions: 1,
            replication: Replication::Single,
            created_ms: 1,
            settings: TopicSettings::default(),
            mirror: None,
            promoted_ms: None,
            risk_phase: false,
            fence: None,
            promote_epoch: None,
        }
    }

    fn set(epoch: u64) -> FenceEdit {
        FenceEdit::Set { epoch, reason: format!("failover f-{epoch}") }
    }

    #[test]
    fn a_fence_only_moves_up_and_repeats_change_nothing() {
        let mut m = meta();
        assert!(fence(&mut m, &set(3), 1).unwrap());
        assert_eq!(m.fence.as_ref().map(|f| (f.epoch, f.reason.as_str())), Some((3, "failover f-3")));
        assert!(!fence(&mut m, &set(3), 1).unwrap(), "the same epoch again");
        let err = fence(&mut m, &set(2), 1).unwrap_err().to_string();
        assert!(err.contains("fenced at epoch 3 (failover f-3), above the asked epoch 2"), "{err}");
        assert!(fence(&mut m, &set(5), 1).unwrap());
        assert_eq!(m.fence.as_ref().map(|f| f.epoch), Some(5));
        assert!(fence(&mut m, &FenceEdit::Lift, 1).unwrap());
        assert!(!fence(&mut m, &FenceEdit::Lift, 1).unwrap());
        assert!(fence(&mut m, &set(0), 1).is_err(), "epoch 0 is no fence");
    }

    #[test]
    fn promotion_clears_the_mark_and_raises_the_floor_once() {
        let mut m = meta();
        let mark = MirrorMark {
            source_cluster_id: "c".into(),
            source_topic_id: "t".into(),
            source_topic: "orders".into(),
            source_cluster: "dc-a".into(),
        };
        m.mirror = Some(mark.clone());
        assert_eq!(promote(&mut m, 7, 1), (true, true));
        assert_eq!((m.mirror.is_none(), m.promote_epoch, m.promoted_ms.is_some()), (true, Some(7), true));
        assert_eq!(promote(&mut m, 7, 1), (false, false), "a repeat");
        assert_eq!(promote(&mut m, 4, 1), (false, false), "a lower floor never lowers it");
        assert_eq!(m.promote_epoch, Some(7));
        // Failback marks it again, lifting a fence; another source is refused.
        m.fence = Some(Fence { epoch: 1, reason: "r".into(), at_ms: 0 });
        assert!(mark_mirror(&mut m, &mark).unwrap());
        assert_eq!((m.mirror.as_ref(), m.fence.is_none()), (Some(&mark), true));
        assert!(!mark_mirror(&mut m, &mark).unwrap());
        let other = MirrorMark { source_cluster_id: "d".into(), ..mark };
        assert!(mark_mirror(&mut m, &other).is_err());
    }
}
