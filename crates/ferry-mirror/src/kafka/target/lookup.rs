//! The Kafka target's lookups: where a target partition's records from this source partition are (its origin and
//! slot), its log end read from the tail, source <-> target offset translation, and the mirror marks of topics.

use super::*;

impl KafkaTarget {
    pub(super) fn origin(&self, topic: &str, partition: u32) -> Result<Origin> {
        let source = self.source_topic_of(topic).ok_or_else(|| {
            status(
                Code::InvalidArgument,
                format!(
                    "Kafka target topic {topic} is not named by the rename policy for source cluster {}",
                    self.inner.source_cluster
                ),
                self.inner.clients.brokers_text(),
            )
        })?;
        Ok(Origin { cluster: self.inner.source_cluster.clone(), topic: source, partition })
    }

    pub(super) fn slot(&self, topic: &str, partition: u32) -> Slot {
        let mut writers = self.inner.writers.lock();
        Arc::clone(writers.entry((topic.to_owned(), partition)).or_default())
    }

    pub(super) async fn read<T, F>(&self, what: &'static str, subject: String, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Reader) -> Result<T, KafkaError> + Send + 'static,
    {
        self.inner.clients.with_reader(what, subject, f).await
    }

    /// The last record of `origin` in the target partition: (target offset, source offset, topic id).
    pub(super) async fn scan(&self, topic: &str, origin: &Origin) -> Result<Option<(u64, u64, Option<String>)>> {
        let (t, o) = (topic.to_owned(), origin.clone());
        let found = self
            .read("tail read of", format!("{topic}/{}", origin.partition), move |r| provenance::tail(r, &t, &o))
            .await?;
        Ok(found.map(|(tgt, p)| (tgt as u64, p.offset, p.topic_id)))
    }

    pub(super) fn remember_topic_id(&self, topic: &str, id: Option<&str>) {
        if let Some(id) = id.filter(|i| !i.is_empty()) {
            self.inner.marks.lock().entry(topic.to_owned()).or_default().source_topic_id = id.to_owned();
        }
    }

    /// The log end (source offsets) from the tail, seeding the offset map.
    pub(super) async fn log_end_from_tail(&self, topic: &str, origin: &Origin) -> Result<u64> {
        let tp = (topic.to_owned(), origin.partition);
        let start = self.inner.starts.lock().get(&tp).copied().unwrap_or(0);
        let scanned = self.scan(topic, origin).await?;
        if let Some((tgt, src, id)) = &scanned {
            self.remember_topic_id(topic, id.as_deref());
            let mut maps = self.inner.maps.lock();
            let map = maps.entry(tp).or_default();
            if map.to_target(*src) != Lookup::Exact(*tgt) {
                map.clear();
                map.record(*src, *tgt);
            }
        }
        Ok(scanned.map_or(0, |(_, src, _)| src + 1).max(start))
    }

    /// Target offset of the first record whose source offset is at least `src`.
    pub(super) async fn to_target(&self, topic: &str, partition: u32, src: u64) -> Result<u64> {
        let tp = (topic.to_owned(), partition);
        if let Some(Lookup::Exact(t)) = self.inner.maps.lock().get(&tp).map(|m| m.to_target(src)) {
            return Ok(t);
        }
        let origin = self.origin(topic, partition)?;
        let t = topic.to_owned();
        let at = self
            .read("offset search in", format!("{topic}/{partition}"), move |r| provenance::locate(r, &t, &origin, src))
            .await?;
        Ok(at.max(0) as u64)
    }

    /// Source offset of the first record at target offset `tgt` or later (the log end when none).
    pub(super) async fn to_source(&self, topic: &str, partition: u32, tgt: u64) -> Result<u64> {
        let tp = (topic.to_owned(), partition);
        if let Some(Lookup::Exact(s)) = self.inner.maps.lock().get(&tp).map(|m| m.to_source(tgt)) {
            return Ok(s);
        }
        let origin = self.origin(topic, partition)?;
        let (t, o) = (topic.to_owned(), origin.clone());
        let found = self
            .read("offset read in", format!("{topic}/{partition}"), move |r| {
                provenance::first_from(r, &t, &o, tgt as i64, i64::MAX)
            })
            .await?;
        match found {
            Some((_, p)) => Ok(p.offset),
            None => self.log_end_from_tail(topic, &origin).await,
        }
    }

    /// The mirror mark of a topic named by the rename policy (`None`: written locally, not a mirror topic).
    pub(super) async fn mark(
        &self,
        topic: &str,
        partitions: u32,
        source_topic: &str,
    ) -> Result<Option<pb::MirrorSource>> {
        let known = self.inner.marks.lock().get(topic).cloned();
        let id = match known.as_ref().map(|m| m.source_topic_id.clone()).filter(|i| !i.is_empty()) {
            Some(id) => Some(id),
            None => {
                let (t, cluster, src) = (topic.to_owned(), self.inner.source_cluster.clone(), source_topic.to_owned());
                let sample = self
                    .read("tail read of", topic.to_owned(), move |r| {
                        let mut non_empty = false;
                        for p in 0..partitions {
                            let (found, any) = provenance::tail_sample(r, &t, p, &cluster)?;
                            non_empty |= any;
                            if let Some(prov) = found.filter(|prov| prov.topic == src) {
                                return Ok(Some(Some(prov.topic_id.unwrap_or_default())));
                            }
                        }
                        Ok(if non_empty { None } else { Some(None) })
                    })
                    .await?;
                match sample {
                    // Records, none of them mirrored from this source: a local topic.
                    None => return Ok(None),
                    Some(id) => id,
                }
            }
        };
        if let Some(id) = &id {
            self.remember_topic_id(topic, Some(id));
        }
        Ok(Some(pb::MirrorSource {
            source_cluster_id: known.map(|k| k.source_cluster_id).unwrap_or_default(),
            source_topic_id: id.unwrap_or_default(),
            source_topic: source_topic.to_owned(),
            source_cluster: self.inner.source_cluster.clone(),
        }))
    }

    pub(super) fn admin_error(&self, e: &KafkaError, op: &str, subject: &str) -> ClientError {
        let cause = self.inner.clients.admin().map(|a| a.inner().context().cause()).unwrap_or_default();
        map_error(e, op, subject, self.inner.clients.brokers_text(), &cause)
    }
}
