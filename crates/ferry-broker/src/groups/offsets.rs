//! Committed offsets and their journal: every commit is appended as a JSON line and fsynced before it is
//! acknowledged; on open the journal is replayed (a torn last line is dropped) and compacted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use ferry_proto as pb;
use ferry_storage::fs::{FileRef, FsRef, OpenMode};
use serde::{Deserialize, Serialize};

use crate::error::{BrokerError, Result};
use crate::topic::write_atomic;

/// One journal line (short keys keep the journal small): group, topic, partition, offset, metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct JournalLine {
    g: String,
    t: String,
    p: u32,
    o: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    m: String,
}

/// Committed offsets with their journal.
#[derive(Debug)]
pub(super) struct OffsetStore {
    fs: FsRef,
    path: PathBuf,
    map: BTreeMap<(String, String, u32), (u64, String)>,
    file: FileRef,
    lines: usize,
}

impl OffsetStore {
    /// Replays and compacts the journal at `path` (created when missing). Blocking.
    pub(super) fn open(fs: FsRef, path: PathBuf) -> Result<OffsetStore> {
        let io = |source| BrokerError::Io { path: path.clone(), source };
        let mut map = BTreeMap::new();
        match fs.read(&path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                for line in text.lines() {
                    match serde_json::from_str::<JournalLine>(line) {
                        Ok(l) => {
                            map.insert((l.g, l.t, l.p), (l.o, l.m));
                        }
                        Err(_) => {
                            tracing::warn!(path = %path.display(), "dropping a torn line at the end of the group offsets journal");
                            break;
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let file = fs.open(&path, OpenMode::Create).map_err(io)?;
        let mut store = OffsetStore { fs, file, path, map, lines: 0 };
        store.compact()?;
        Ok(store)
    }

    fn compact(&mut self) -> Result<()> {
        let mut text = Vec::new();
        for ((g, t, p), (o, m)) in &self.map {
            let line = JournalLine { g: g.clone(), t: t.clone(), p: *p, o: *o, m: m.clone() };
            serde_json::to_writer(&mut text, &line).map_err(|e| BrokerError::Internal(e.to_string()))?;
            text.push(b'\n');
        }
        write_atomic(&*self.fs, &self.path, &text)?;
        self.file = self
            .fs
            .open(&self.path, OpenMode::Create)
            .map_err(|source| BrokerError::Io { path: self.path.clone(), source })?;
        self.lines = self.map.len();
        Ok(())
    }

    pub(super) fn commit(&mut self, group: &str, offsets: &[pb::CommittedOffset]) -> Result<()> {
        let mut text = Vec::new();
        for o in offsets {
            let line = JournalLine {
                g: group.to_owned(),
                t: o.topic.clone(),
                p: o.partition,
                o: o.offset,
                m: o.metadata.clone(),
            };
            serde_json::to_writer(&mut text, &line).map_err(|e| BrokerError::Internal(e.to_string()))?;
            text.push(b'\n');
        }
        let io = |source| BrokerError::Io { path: self.path.clone(), source };
        self.file.append(&[&text]).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        for o in offsets {
            self.map.insert((group.to_owned(), o.topic.clone(), o.partition), (o.offset, o.metadata.clone()));
        }
        self.lines += offsets.len();
        if self.lines > 10_000 && self.lines > self.map.len() * 4 {
            self.compact()?;
        }
        Ok(())
    }

    /// Drops the offsets of every topic `gone` says no longer exists, rewriting the journal when any were dropped.
    pub(super) fn forget(&mut self, gone: &dyn Fn(&str) -> bool) -> Result<usize> {
        let before = self.map.len();
        self.map.retain(|(_, topic, _), _| !gone(topic));
        let dropped = before - self.map.len();
        if dropped > 0 {
            self.compact()?;
        }
        Ok(dropped)
    }

    pub(super) fn of_group(&self, group: &str) -> Vec<pb::CommittedOffset> {
        self.map
            .range((group.to_owned(), String::new(), 0)..)
            .take_while(|((g, _, _), _)| g == group)
            .map(|((_, t, p), (o, m))| pb::CommittedOffset {
                topic: t.clone(),
                partition: *p,
                offset: *o,
                metadata: m.clone(),
            })
            .collect()
    }

    pub(super) fn groups(&self) -> BTreeSet<String> {
        self.map.keys().map(|(g, _, _)| g.clone()).collect()
    }
}
