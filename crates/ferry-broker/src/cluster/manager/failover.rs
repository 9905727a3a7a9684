//! A cluster's disaster-recovery edits (see `crate::node::dr`): each a compare-and-swap on the topic's catalog
//! record, so a member that was down when the fence was written takes it from the catalog before it serves.

use ferry_proto as pb;

use super::Replication;
use crate::error::Result;
use crate::node::dr::{self, FenceEdit};
use crate::node::registry::now_ms;
use crate::node::topic::MirrorMark;

impl Replication {
    /// Fences replicated topic `name` in the catalog (or lifts its fence).
    pub async fn fence(&self, name: &str, edit: &FenceEdit) -> Result<pb::TopicInfo> {
        let record = self.change(name, |r| dr::fence(r, edit, now_ms())).await?;
        if let FenceEdit::Set { epoch, reason } = edit {
            tracing::warn!(topic = name, epoch, reason, "replicated topic fenced in the catalog: read-only");
        }
        Ok(self.info(name, &record))
    }

    /// Promotes replicated topic `name` as part of one cut at partition epoch `floor`. Returns the topic and
    /// whether it was a mirror topic.
    pub async fn promote_cut(&self, name: &str, floor: u32) -> Result<(pb::TopicInfo, bool)> {
        let mut was_mirror = false;
        let record = self
            .change(name, |r| {
                let (changed, was) = dr::promote(r, floor, now_ms());
                was_mirror |= was;
                Ok(changed)
            })
            .await?;
        Ok((self.info(name, &record), was_mirror))
    }

    /// Marks replicated topic `name` as a mirror topic of `mark` (failback), lifting its fence.
    pub async fn mark_mirror(&self, name: &str, mark: &MirrorMark) -> Result<pb::TopicInfo> {
        let record = self.change(name, |r| dr::mark_mirror(r, mark)).await?;
        Ok(self.info(name, &record))
    }
}
