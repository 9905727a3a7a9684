//! Unit tests of the group coordinator: the assignment rule, generation fencing, committed offsets across
//! reopens, and the import of an old journal.

use super::*;

fn join(c: &GroupCoordinator, group: &str, id: &str, topics: &[&str], counts: &dyn Fn(&str) -> u32) -> Joined {
    c.join(
        &pb::JoinGroupRequest {
            group: group.into(),
            member_id: id.into(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            session_timeout_ms: 10_000,
            client_id: String::new(),
        },
        counts,
    )
    .unwrap()
}

fn items(a: &[pb::TopicPartition]) -> Vec<(String, u32)> {
    a.iter().map(|tp| (tp.topic.clone(), tp.partition)).collect()
}

#[test]
fn zeze_rule_deals_sorted_items_over_sorted_members() {
    let dir = tempfile::tempdir().unwrap();
    let c =
        GroupCoordinator::open(ferry_storage::fs::os(), dir.path(), Duration::from_millis(1), Duration::from_secs(60))
            .unwrap();
    let counts = |t: &str| if t == "a" { 3 } else { 2 };
    let j1 = join(&c, "g", "m2", &["a", "b"], &counts);
    assert_eq!(j1.generation, 1);
    assert_eq!(items(&j1.assignment).len(), 5);
    let j2 = join(&c, "g", "m1", &["a", "b"], &counts);
    assert_eq!(j2.generation, 2);
    // Items: a0 a1 a2 b0 b1; members sorted: m1 m2.
    assert_eq!(items(&j2.assignment), vec![("a".into(), 0), ("a".into(), 2), ("b".into(), 1)]);
    let hb = c.heartbeat(&pb::HeartbeatRequest { group: "g".into(), member_id: "m2".into(), generation: 1 }, &counts);
    assert_eq!(hb.generation, 2);
    assert_eq!(items(&hb.assignment), vec![("a".into(), 1), ("b".into(), 0)]);
}

#[test]
fn stale_generations_are_fenced_and_offsets_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let counts = |_: &str| 4;
    {
        let c = GroupCoordinator::open(
            ferry_storage::fs::os(),
            dir.path(),
            Duration::from_millis(1),
            Duration::from_secs(60),
        )
        .unwrap();
        let j = join(&c, "g", "m1", &["t"], &counts);
        let commit = |generation| pb::CommitOffsetsRequest {
            group: "g".into(),
            member_id: "m1".into(),
            generation,
            offsets: vec![pb::CommittedOffset { topic: "t".into(), partition: 1, offset: 42, metadata: "x".into() }],
        };
        let err = c.commit(&commit(j.generation + 7)).unwrap_err();
        assert!(err.to_string().contains("stale generation"), "{err}");
        c.commit(&commit(j.generation)).unwrap();
        // Manual commits are refused while the group has members.
        let manual = pb::CommitOffsetsRequest { member_id: String::new(), generation: 0, ..commit(0) };
        assert!(c.commit(&manual).is_err());
        c.leave("g", "m1", &counts);
        c.commit(&pb::CommitOffsetsRequest {
            offsets: vec![pb::CommittedOffset { topic: "t".into(), partition: 2, offset: 7, metadata: String::new() }],
            ..manual
        })
        .unwrap();
    }
    let c =
        GroupCoordinator::open(ferry_storage::fs::os(), dir.path(), Duration::from_millis(1), Duration::from_secs(60))
            .unwrap();
    let got: Vec<(u32, u64)> = c.committed("g", &[]).iter().map(|o| (o.partition, o.offset)).collect();
    assert_eq!(got, vec![(1, 42), (2, 7)]);
}

#[test]
fn offsets_of_deleted_topics_are_forgotten_durably() {
    let dir = tempfile::tempdir().unwrap();
    let offset = |t: &str, o| pb::CommittedOffset { topic: t.into(), partition: 0, offset: o, metadata: String::new() };
    {
        let c = GroupCoordinator::open(
            ferry_storage::fs::os(),
            dir.path(),
            Duration::from_millis(1),
            Duration::from_secs(60),
        )
        .unwrap();
        for g in ["g1", "g2"] {
            let req = pb::CommitOffsetsRequest {
                group: g.into(),
                member_id: String::new(),
                generation: 0,
                offsets: vec![offset("gone", 5), offset("kept", 7)],
            };
            c.commit(&req).unwrap();
        }
        assert_eq!(c.forget_topics(&|t| t == "gone").unwrap(), 2);
        assert_eq!(c.forget_topics(&|t| t == "gone").unwrap(), 0);
    }
    let c =
        GroupCoordinator::open(ferry_storage::fs::os(), dir.path(), Duration::from_millis(1), Duration::from_secs(60))
            .unwrap();
    assert_eq!(c.committed("g1", &[]), vec![offset("kept", 7)]);
    assert_eq!(c.committed("g2", &[]), vec![offset("kept", 7)]);
}

#[test]
fn an_old_journal_is_imported_once_as_far_as_it_parses_then_removed() {
    let dir = tempfile::tempdir().unwrap();
    let meta = dir.path().join(crate::core::META_DIR);
    std::fs::create_dir_all(&meta).unwrap();
    let journal = meta.join(OFFSETS_FILE);
    std::fs::write(
        &journal,
        "{\"g\":\"g\",\"t\":\"t\",\"p\":0,\"o\":5}\n{\"g\":\"g\",\"t\":\"t\",\"p\":1,\"o\":9,\"m\":\"x\"}\n\
         {\"g\":\"g\",\"t\":\"t\",\"p\":0,\"o\":7}\n{\"g\":\"h\",\"t\"",
    )
    .unwrap();
    let offset = |p, o, m: &str| pb::CommittedOffset { topic: "t".into(), partition: p, offset: o, metadata: m.into() };
    let open = || {
        GroupCoordinator::open(ferry_storage::fs::os(), dir.path(), Duration::from_millis(1), Duration::from_secs(60))
            .unwrap()
    };
    let c = open();
    assert_eq!(c.committed("g", &[]), vec![offset(0, 7, ""), offset(1, 9, "x")]);
    assert_eq!(c.list().len(), 1, "the torn last line (group h) is not imported");
    assert!(!journal.exists(), "the journal is removed once imported");
    // A commit after the import wins over the imported value, and nothing is imported again.
    c.commit(&pb::CommitOffsetsRequest {
        group: "g".into(),
        member_id: String::new(),
        generation: 0,
        offsets: vec![offset(0, 8, "")],
    })
    .unwrap();
    c.close().unwrap();
    drop(c);
    let c = open();
    assert_eq!(c.committed("g", &[]), vec![offset(0, 8, ""), offset(1, 9, "x")]);
    assert!(dir.path().join(OFFSETS_TOPIC).join("0").is_dir());
}

#[test]
fn expired_members_lose_their_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let c =
        GroupCoordinator::open(ferry_storage::fs::os(), dir.path(), Duration::from_millis(1), Duration::from_secs(60))
            .unwrap();
    let counts = |_: &str| 4;
    let mut req = pb::JoinGroupRequest {
        group: "g".into(),
        member_id: "a".into(),
        topics: vec!["t".into()],
        session_timeout_ms: 1,
        client_id: String::new(),
    };
    c.join(&req, &counts).unwrap();
    req.member_id = "b".into();
    req.session_timeout_ms = 60_000;
    c.join(&req, &counts).unwrap();
    // Member "a" has a 1 ms session; wait until it has certainly passed.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(5) {
        std::thread::yield_now();
    }
    assert_eq!(c.expire(&counts), 1);
    let hb = c.heartbeat(&pb::HeartbeatRequest { group: "g".into(), member_id: "b".into(), generation: 0 }, &counts);
    assert_eq!(hb.assignment.len(), 4);
}
