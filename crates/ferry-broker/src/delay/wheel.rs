//! The on-disk index of one delay-store partition: a time wheel of one-second slots, each an append-only file of
//! fixed-size entries (id, due time, payload bytes), and a bitmap of ids no longer pending (cancelled or fired).
//!
//! Memory holds one small summary per non-empty slot (at most `max_delay` / 1 s of them) and one bitmap page, never
//! the pending entries: a million pending records cost 20 MB of slot files and 125 KB of bitmap per million
//! offsets on disk. The index is a cache of the partition's log: a new owner deletes it and rebuilds it by replaying
//! the log, so it needs no fsync and holds nothing the log does not.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::core::slot_of;

/// Bytes of one slot entry: id (u64), due ms (i64), payload bytes (u32).
const ENTRY: usize = 20;
/// Buffered slot entries written out past this many bytes.
const BUFFER_BYTES: usize = 1 << 20;
/// Bytes of one bitmap page.
const PAGE: u64 = 4096;

/// One entry of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotEntry {
    /// Its id (offset in the delay store).
    pub id: u64,
    /// When it falls due.
    pub due_ms: i64,
    /// Its payload's size.
    pub bytes: u32,
}

/// What memory keeps of one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotSummary {
    /// Entries written to it (some may have been cancelled since).
    pub entries: u32,
    /// Earliest due time in it.
    pub min_due: i64,
    /// Latest due time in it.
    pub max_due: i64,
    /// Lowest id in it.
    pub min_id: u64,
}

/// The index of one partition.
#[derive(Debug)]
pub struct Wheel {
    dir: PathBuf,
    slots: BTreeMap<i64, SlotSummary>,
    buffered: HashMap<i64, Vec<u8>>,
    buffered_bytes: usize,
    done: Bitmap,
}

impl Wheel {
    /// An empty index in `dir`, deleting whatever an earlier owner left there.
    pub fn create(dir: &Path) -> io::Result<Wheel> {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(dir)?;
        let done = Bitmap::open(&dir.join("done.bits"))?;
        Ok(Wheel { dir: dir.to_owned(), slots: BTreeMap::new(), buffered: HashMap::new(), buffered_bytes: 0, done })
    }

    fn slot_path(&self, slot: i64) -> PathBuf {
        self.dir.join(format!("{slot}.slot"))
    }

    /// Adds an entry to its slot.
    pub fn add(&mut self, e: SlotEntry) -> io::Result<()> {
        let slot = slot_of(e.due_ms);
        let s = self.slots.entry(slot).or_insert(SlotSummary {
            entries: 0,
            min_due: e.due_ms,
            max_due: e.due_ms,
            min_id: e.id,
        });
        s.entries += 1;
        s.min_id = s.min_id.min(e.id);
        s.min_due = s.min_due.min(e.due_ms);
        s.max_due = s.max_due.max(e.due_ms);
        let buf = self.buffered.entry(slot).or_default();
        buf.extend_from_slice(&e.id.to_le_bytes());
        buf.extend_from_slice(&e.due_ms.to_le_bytes());
        buf.extend_from_slice(&e.bytes.to_le_bytes());
        self.buffered_bytes += ENTRY;
        if self.buffered_bytes >= BUFFER_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the buffered entries to their slot files and the bitmap's page.
    pub fn flush(&mut self) -> io::Result<()> {
        for (slot, bytes) in std::mem::take(&mut self.buffered) {
            let mut f = OpenOptions::new().create(true).append(true).open(self.slot_path(slot))?;
            f.write_all(&bytes)?;
        }
        self.buffered_bytes = 0;
        self.done.flush()
    }

    /// Marks `id` as no longer pending.
    pub fn set_done(&mut self, id: u64) -> io::Result<()> {
        self.done.set(id)
    }

    /// Whether `id` is no longer pending.
    pub fn is_done(&mut self, id: u64) -> io::Result<bool> {
        self.done.get(id)
    }

    /// Takes every slot up to and including `slot` out of the wheel: their entries still pending, in slot order and
    /// then id order (the order they were produced in).
    pub fn take_through(&mut self, slot: i64) -> io::Result<Vec<SlotEntry>> {
        let due: Vec<i64> = self.slots.range(..=slot).map(|(s, _)| *s).collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        self.flush()?;
        let mut out = Vec::new();
        for s in due {
            self.slots.remove(&s);
            let path = self.slot_path(s);
            let mut bytes = Vec::new();
            File::open(&path)?.read_to_end(&mut bytes)?;
            let mut entries: Vec<SlotEntry> = bytes
                .chunks_exact(ENTRY)
                .map(|c| SlotEntry {
                    id: u64::from_le_bytes(c[0..8].try_into().unwrap_or_default()),
                    due_ms: i64::from_le_bytes(c[8..16].try_into().unwrap_or_default()),
                    bytes: u32::from_le_bytes(c[16..20].try_into().unwrap_or_default()),
                })
                .collect();
            entries.sort_by_key(|e| e.id);
            for e in entries {
                if !self.done.get(e.id)? {
                    out.push(e);
                }
            }
            std::fs::remove_file(&path)?;
        }
        Ok(out)
    }

    /// The earliest and latest due times of the slots still on the wheel (cancelled entries may widen them).
    pub fn due_range(&self) -> Option<(i64, i64)> {
        let first = self.slots.values().next()?;
        let last = self.slots.values().next_back()?;
        Some((first.min_due, last.max_due))
    }

    /// The lowest id of the slots still on the wheel (a cancelled entry counts until its slot comes round).
    pub fn min_id(&self) -> Option<u64> {
        self.slots.values().map(|s| s.min_id).min()
    }

    /// Non-empty slots on the wheel.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }
}

/// A bit per id, on disk, with one page cached.
#[derive(Debug)]
struct Bitmap {
    file: File,
    page_no: u64,
    page: Vec<u8>,
    dirty: bool,
}

impl Bitmap {
    fn open(path: &Path) -> io::Result<Bitmap> {
        let file = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(path)?;
        Ok(Bitmap { file, page_no: 0, page: vec![0; PAGE as usize], dirty: false })
    }

    fn load(&mut self, page_no: u64) -> io::Result<()> {
        if page_no == self.page_no {
            return Ok(());
        }
        self.flush()?;
        self.page.fill(0);
        let len = self.file.metadata()?.len();
        let at = page_no * PAGE;
        if at < len {
            let n = (len - at).min(PAGE) as usize;
            self.file.read_exact_at(&mut self.page[..n], at)?;
        }
        self.page_no = page_no;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.dirty {
            self.file.write_all_at(&self.page, self.page_no * PAGE)?;
            self.dirty = false;
        }
        Ok(())
    }

    fn set(&mut self, id: u64) -> io::Result<()> {
        self.load(id / (PAGE * 8))?;
        let bit = id % (PAGE * 8);
        self.page[(bit / 8) as usize] |= 1 << (bit % 8);
        self.dirty = true;
        Ok(())
    }

    fn get(&mut self, id: u64) -> io::Result<bool> {
        self.load(id / (PAGE * 8))?;
        let bit = id % (PAGE * 8);
        Ok(self.page[(bit / 8) as usize] & (1 << (bit % 8)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(id: u64, due_ms: i64) -> SlotEntry {
        SlotEntry { id, due_ms, bytes: 10 }
    }

    #[test]
    fn slots_come_round_in_order_without_what_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wheel::create(&dir.path().join("0")).unwrap();
        for entry in [e(5, 2_500), e(1, 2_100), e(9, 1_999), e(40_000, 3_000), e(2, 2_900)] {
            w.add(entry).unwrap();
        }
        w.set_done(2).unwrap();
        w.set_done(70_000).unwrap();
        assert_eq!(w.due_range(), Some((1_999, 3_000)));
        assert_eq!(w.min_id(), Some(1));
        assert_eq!(w.take_through(0).unwrap(), vec![]);
        assert_eq!(w.take_through(2).unwrap(), vec![e(9, 1_999), e(1, 2_100), e(5, 2_500)]);
        assert!(w.is_done(70_000).unwrap() && !w.is_done(40_000).unwrap());
        assert_eq!(w.slot_count(), 1);
        assert_eq!(w.min_id(), Some(40_000));
        assert_eq!(w.take_through(10).unwrap(), vec![e(40_000, 3_000)]);
        assert_eq!(w.min_id(), None);
        assert_eq!(w.due_range(), None);
        // A new owner starts from nothing.
        let mut again = Wheel::create(&dir.path().join("0")).unwrap();
        assert!(!again.is_done(2).unwrap());
        assert_eq!(again.take_through(10).unwrap(), vec![]);
    }
}
