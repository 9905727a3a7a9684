//! A single broker's disaster-recovery edits (see `crate::node::dr`): each stored in the topic file, then set on
//! every partition's write guard before it answers.

use std::sync::Arc;

use super::{BrokerCore, Topic};
use crate::error::Result;
use crate::node::dr::{self, FenceEdit};
use crate::node::registry::now_ms;
use crate::node::topic::{MirrorMark, TopicMeta};

impl BrokerCore {
    /// Edits topic `name`'s metadata with `edit`, storing and applying it when it changed anything.
    async fn edit_meta(&self, name: &str, edit: impl FnOnce(&mut TopicMeta) -> Result<bool>) -> Result<Arc<Topic>> {
        let _admin = self.admit(name).await;
        let topic = self.topic(name)?;
        let mut meta = topic.meta();
        if edit(&mut meta)? {
            self.replace_meta(&topic, meta).await?;
        }
        Ok(topic)
    }

    /// Fences topic `name` (or lifts its fence). Once it answers, no write is taken past the log ends it holds.
    pub async fn fence(&self, name: &str, edit: &FenceEdit) -> Result<Arc<Topic>> {
        let topic = self.edit_meta(name, |m| dr::fence(m, edit, now_ms())).await?;
        if let FenceEdit::Set { epoch, reason } = edit {
            tracing::warn!(topic = name, epoch, reason, "topic fenced: read-only");
        }
        Ok(topic)
    }

    /// Promotes topic `name` as part of one cut at partition epoch `floor`. Returns whether it was a mirror topic.
    pub async fn promote_cut(&self, name: &str, floor: u32) -> Result<(Arc<Topic>, bool)> {
        let mut was_mirror = false;
        let topic = self
            .edit_meta(name, |m| {
                let (changed, was) = dr::promote(m, floor, now_ms());
                was_mirror = was;
                Ok(changed)
            })
            .await?;
        if was_mirror {
            tracing::warn!(topic = name, epoch_floor = floor, "mirror topic promoted as part of a failover's cut");
        }
        Ok((topic, was_mirror))
    }

    /// Marks topic `name` as a mirror topic of `mark` (failback), lifting its fence.
    pub async fn mark_mirror(&self, name: &str, mark: &MirrorMark) -> Result<Arc<Topic>> {
        self.edit_meta(name, |m| dr::mark_mirror(m, mark)).await
    }
}
