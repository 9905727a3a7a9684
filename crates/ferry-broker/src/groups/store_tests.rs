//! Durability of committed offsets against a full disk, a power loss and a flipped byte, on the simulated file
//! system.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ferry_storage::fs::{FileSystem, PowerLoss, SimFs, sync_new_dirs};

use super::offsets::Tuning;
use super::*;

type Model = BTreeMap<(String, String, u32), (u64, String)>;

const DATA: &str = "/data";

fn open(fs: &SimFs) -> GroupCoordinator {
    GroupCoordinator::open(Arc::new(fs.clone()), Path::new(DATA), Duration::from_millis(1), Duration::from_secs(60))
        .unwrap()
}

fn new_fs() -> SimFs {
    let fs = SimFs::new();
    sync_new_dirs(&fs, Path::new(DATA)).unwrap();
    fs
}

/// Commit `i`: two offsets of group `g{i % 3}`, one on a partition it shares with other commits and one of its
/// own, with values that grow with `i`.
fn commit_request(i: u64) -> pb::CommitOffsetsRequest {
    let offset = |topic: String, partition, offset| pb::CommittedOffset {
        topic,
        partition,
        offset,
        metadata: format!("commit {i}"),
    };
    pb::CommitOffsetsRequest {
        group: format!("g{}", i % 3),
        member_id: String::new(),
        generation: 0,
        offsets: vec![offset("shared".into(), (i % 2) as u32, 1000 + i), offset(format!("own{i}"), 0, i)],
    }
}

fn apply(model: &mut Model, req: &pb::CommitOffsetsRequest) {
    for o in &req.offsets {
        model.insert((req.group.clone(), o.topic.clone(), o.partition), (o.offset, o.metadata.clone()));
    }
}

/// Everything the coordinator holds, as the model.
fn held(c: &GroupCoordinator) -> Model {
    let mut out = Model::new();
    for g in c.list() {
        for o in c.committed(&g.group, &[]) {
            out.insert((g.group.clone(), o.topic, o.partition), (o.offset, o.metadata));
        }
    }
    out
}

#[test]
fn acknowledged_commits_survive_a_full_disk_and_a_power_loss() {
    let fs = new_fs();
    let c = open(&fs);
    let mut acked = Model::new();
    let mut refused = Vec::new();
    for i in 0..60 {
        if i == 20 {
            // Room for a part of the next commit only: its write fails part-way.
            fs.set_space_limit(Some(fs.used_bytes() + 30));
        }
        if i == 40 {
            fs.set_space_limit(None);
        }
        let req = commit_request(i);
        match c.commit(&req) {
            Ok(()) => apply(&mut acked, &req),
            Err(e) => {
                assert!(e.to_string().contains("no space left on device"), "commit {i}: {e}");
                refused.push(i);
            }
        }
    }
    assert_eq!(refused, (20..40).collect::<Vec<_>>(), "exactly the commits made while the disk was full fail");
    assert_eq!(held(&c), acked);
    drop(c);
    let fs = fs.power_loss(PowerLoss::DropUnsynced, 7);
    let c = open(&fs);
    // 40 acknowledged commits: one partition of its own each, and 3 groups x 2 shared partitions.
    assert_eq!(acked.len(), 46);
    assert_eq!(held(&c), acked, "every acknowledged commit is there, at its value");
}

/// Positions and headers of the batches in a segment file.
fn batches_in(fs: &SimFs, segment: &Path) -> Vec<(usize, ferry_batch::BatchHeader)> {
    let bytes = fs.read(segment).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let header = ferry_batch::BatchHeader::parse(&bytes[pos..]).unwrap();
        let len = header.total_len();
        out.push((pos, header));
        pos += len;
    }
    out
}

/// Commits 0..10, one batch each, and a bit flipped inside the records of commit 4's batch: the requests and the
/// segment file.
fn flipped_after_ten_commits(fs: &SimFs, close: bool) -> (Vec<pb::CommitOffsetsRequest>, std::path::PathBuf) {
    let c = open(fs);
    let requests: Vec<_> = (0..10).map(commit_request).collect();
    for r in &requests {
        c.commit(r).unwrap();
    }
    if close {
        c.close().unwrap();
    }
    drop(c);
    // One batch per commit, two offsets each: commit i holds offsets 2i and 2i+1. Flip a bit inside the records
    // of commit 4's batch (past its header, which the log walks to find the batches after it).
    let segment = Path::new(DATA).join(OFFSETS_TOPIC).join("0").join("00000000000000000000.log");
    let batches = batches_in(fs, &segment);
    assert_eq!(batches.iter().map(|(_, h)| (h.base_offset, h.last_offset())).collect::<Vec<_>>(), {
        (0..10).map(|i| (2 * i, 2 * i + 1)).collect::<Vec<_>>()
    });
    let (pos, header) = &batches[4];
    let inside = header.total_len() * 3 / 4;
    assert!(inside > ferry_batch::HEADER_LEN);
    fs.corrupt(&segment, (pos + inside) as u64, 0x20).unwrap();
    (requests, segment)
}

/// What the coordinator must hold once commit 4's batch is lost: every other commit at its value. Nine partitions
/// of their own, and five of the six shared ones (g1/shared/0 only commit 4 wrote).
fn all_but_commit_4(requests: &[pb::CommitOffsetsRequest]) -> Model {
    let mut expected = Model::new();
    for r in requests.iter().filter(|r| r.offsets[1].topic != "own4") {
        apply(&mut expected, r);
    }
    assert_eq!(expected.len(), 14);
    expected
}

#[test]
fn a_byte_flipped_in_the_active_segment_before_a_crash_costs_only_its_batch() {
    let fs = new_fs();
    // No clean close: the next open is a crash recovery, which checks every batch of the active segment. The bad
    // batch has good ones after it, so it is damage, not a torn write: kept for the replay to skip, not cut with
    // every commit after it.
    let (requests, _) = flipped_after_ten_commits(&fs, false);
    let fs = fs.power_loss(PowerLoss::DropUnsynced, 5);
    let c = open(&fs);
    assert_eq!(c.skipped_batches(), vec![(8, 9)]);
    let mut expected = all_but_commit_4(&requests);
    assert_eq!(held(&c), expected, "the commits after the flipped batch are kept");
    // Rewritten away: another crash loses nothing.
    let later = commit_request(10);
    c.commit(&later).unwrap();
    apply(&mut expected, &later);
    drop(c);
    let c = open(&fs.power_loss(PowerLoss::DropUnsynced, 6));
    assert_eq!(c.skipped_batches(), vec![]);
    assert_eq!(held(&c), expected);
}

#[test]
fn a_flipped_byte_costs_only_the_commits_of_its_batch_and_says_so() {
    let fs = new_fs();
    let (requests, segment) = flipped_after_ten_commits(&fs, true);

    let c = open(&fs);
    // Exactly the flipped batch is skipped and reported; every commit before and after it is there at its value,
    // and the keys commit 4 wrote hold what the other commits left (here: own4 and g1/shared/0, written only by
    // commit 4, are gone rather than showing a value newer than what was acknowledged).
    assert_eq!(c.skipped_batches(), vec![(8, 9)]);
    let mut expected = all_but_commit_4(&requests);
    assert_eq!(held(&c), expected);
    // The open rewrote the offsets into a new segment (at the old log end, 20) and dropped the segment holding the
    // bad batch: left in the active segment, it would make the next unclean open cut the log there and lose
    // every commit after it. Commits after that, then a power loss (an unclean open) lose nothing.
    let mut logs: Vec<String> =
        fs.read_dir(segment.parent().unwrap()).unwrap().into_iter().filter(|n| n.ends_with(".log")).collect();
    logs.sort();
    assert_eq!(logs, vec!["00000000000000000020.log".to_owned()]);
    let later = commit_request(10);
    c.commit(&later).unwrap();
    apply(&mut expected, &later);
    drop(c);
    let fs = fs.power_loss(PowerLoss::DropUnsynced, 3);
    let c = open(&fs);
    assert_eq!(c.skipped_batches(), vec![]);
    assert_eq!(held(&c), expected);
}

#[test]
fn snapshots_bound_the_partition_and_replay_to_the_same_offsets() {
    let fs = new_fs();
    let tuning = Tuning { segment_bytes: 1024, snapshot_min_bytes: 4096, batch_bytes: 512 };
    let open_store = |fs: &SimFs| OffsetStore::open(Arc::new(fs.clone()), Path::new(DATA), tuning).unwrap();
    let mut store = open_store(&fs);
    let mut expected = Model::new();
    let mut largest = 0;
    for i in 0..600u64 {
        if i == 300 {
            // Forgotten with tombstones; snapshots after this must not bring t0 back.
            assert_eq!(store.forget(&|t| t == "t0").unwrap(), 3);
            expected.retain(|(_, t, _), _| t != "t0");
        }
        let topic = if i >= 300 && i % 5 == 0 { 1 } else { i % 5 };
        let req = pb::CommitOffsetsRequest {
            group: format!("g{}", i % 3),
            offsets: vec![pb::CommittedOffset {
                topic: format!("t{topic}"),
                partition: 0,
                offset: i,
                metadata: String::new(),
            }],
            ..commit_request(i)
        };
        store.commit(&req.group, &req.offsets).unwrap();
        apply(&mut expected, &req);
        largest = largest.max(store.log().stats().size_bytes);
    }
    let stats = store.log().stats();
    assert!(stats.log_start_offset > 0, "snapshots let old segments go: {stats:?}");
    // Growth is bounded by the snapshot threshold plus the commit that crossed it (one segment of slack).
    assert!(largest <= tuning.snapshot_min_bytes + tuning.segment_bytes, "{largest} bytes at most");
    store.close().unwrap();
    drop(store);
    let store = open_store(&fs);
    let mut got = Model::new();
    for g in store.groups() {
        for o in store.of_group(&g) {
            got.insert((g.clone(), o.topic, o.partition), (o.offset, o.metadata));
        }
    }
    assert_eq!(expected.len(), 3 * 4);
    assert_eq!(got, expected);
}
