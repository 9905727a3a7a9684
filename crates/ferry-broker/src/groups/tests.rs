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
    let meta = dir.path().join(crate::node::registry::META_DIR);
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

fn join_req(member_id: &str, client_id: &str) -> pb::JoinGroupRequest {
    pb::JoinGroupRequest {
        group: "g".into(),
        member_id: member_id.into(),
        topics: vec!["t".into()],
        session_timeout_ms: 10_000,
        client_id: client_id.into(),
    }
}

#[test]
fn ids_longer_than_max_id_bytes_and_members_past_max_members_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = GroupCoordinator::open(ferry_storage::fs::os(), dir.path(), Duration::from_millis(1), Duration::MAX)
        .unwrap()
        .with_limits(Limits { max_id_bytes: 64, max_members: 2, ..Limits::default() });
    let counts = |_: &str| 2;
    let long = "x".repeat(65);
    let err = c.join(&join_req(&long, ""), &counts).unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        err.to_string(),
        "invalid request: group \"g\": the member id is 65 bytes, above groups.max_id_bytes (64)"
    );
    let err = c.join(&join_req("", &long), &counts).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid request: group \"g\": the client id is 65 bytes, above groups.max_id_bytes (64)"
    );
    // At the limit: accepted; an id generated from a client id at the limit fits it too, so it can join again.
    let at_limit = "y".repeat(64);
    assert_eq!(c.join(&join_req(&at_limit, ""), &counts).unwrap().member_id, at_limit);
    let generated = c.join(&join_req("", &"é".repeat(32)), &counts).unwrap().member_id;
    // 27 bytes of room cut at a character boundary: 13 two-byte characters.
    assert_eq!((generated.len(), &generated[..27]), (63, format!("{}-", "é".repeat(13)).as_str()));
    // The group is full: a third member is refused, the members already in may join again.
    let err = c.join(&join_req("m3", ""), &counts).unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        err.to_string(),
        "member \"m3\" joining group \"g\" would pass its 2 members (the limit is groups.max_members in the broker \
         config)"
    );
    assert_eq!(c.join(&join_req(&generated, ""), &counts).unwrap().member_id, generated);
    assert_eq!(c.describe("g").members.len(), 2);
}

#[test]
fn groups_past_max_groups_and_metadata_past_max_metadata_bytes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = GroupCoordinator::open(ferry_storage::fs::os(), dir.path(), Duration::from_millis(1), Duration::MAX)
        .unwrap()
        .with_limits(Limits { max_groups: 2, max_metadata_bytes: 8, ..Limits::default() });
    let counts = |_: &str| 2;
    let commit = |group: &str, metadata: &str| pb::CommitOffsetsRequest {
        group: group.into(),
        member_id: String::new(),
        generation: 0,
        offsets: vec![pb::CommittedOffset { topic: "t".into(), partition: 1, offset: 5, metadata: metadata.into() }],
    };
    // Metadata at the limit is kept; one byte over is refused, naming the offset and the key.
    c.commit(&commit("a", "12345678")).unwrap();
    let err = c.commit(&commit("a", "123456789")).unwrap_err();
    assert_eq!((err.code(), err.reason()), (tonic::Code::InvalidArgument, "invalid_argument"));
    assert_eq!(
        err.to_string(),
        "invalid request: group \"a\": the metadata of the offset of t/1 is 9 bytes, above \
         groups.max_metadata_bytes (8)"
    );
    // Group "a" has offsets, "b" joins with a member: two groups. A third is refused, by a commit or a join.
    c.join(&pb::JoinGroupRequest { group: "b".into(), ..join_req("m1", "") }, &counts).unwrap();
    for err in [
        c.commit(&commit("c", "")).unwrap_err(),
        c.join(&pb::JoinGroupRequest { group: "c".into(), ..join_req("m1", "") }, &counts).unwrap_err(),
    ] {
        assert_eq!((err.code(), err.reason()), (tonic::Code::ResourceExhausted, "limit_reached"));
        assert_eq!(
            err.to_string(),
            "group \"c\" would pass the broker's 2 groups (with members or committed offsets) (the limit is \
             groups.max_groups in the broker config)"
        );
    }
    // Known groups go on: "a" commits again, "b" commits through its member. What was refused left nothing.
    c.commit(&commit("a", "x")).unwrap();
    assert_eq!(c.committed("a", &[]).iter().map(|o| (o.offset, o.metadata.as_str())).collect::<Vec<_>>(), [(5, "x")]);
    assert!(c.committed("c", &[]).is_empty());
    assert_eq!(c.list().iter().map(|g| g.group.as_str()).collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn heartbeats_deal_again_only_when_partition_counts_change() {
    let dir = tempfile::tempdir().unwrap();
    let c =
        GroupCoordinator::open(ferry_storage::fs::os(), dir.path(), Duration::from_millis(1), Duration::MAX).unwrap();
    let partitions = std::cell::Cell::new(2);
    let counts = |_: &str| partitions.get();
    let joined = c.join(&join_req("m1", ""), &counts).unwrap();
    let hb =
        || c.heartbeat(&pb::HeartbeatRequest { group: "g".into(), member_id: "m1".into(), generation: 1 }, &counts);
    let deals = || c.groups.lock()["g"].deals;
    assert_eq!((joined.generation, deals()), (1, 1));
    for _ in 0..3 {
        assert_eq!((hb().generation, items(&hb().assignment).len()), (1, 2));
    }
    assert_eq!(deals(), 1, "heartbeats without a change must not deal the partitions again");
    // A partition added to the topic: the next heartbeat deals it.
    partitions.set(3);
    let after = hb();
    assert_eq!((after.generation, items(&after.assignment).len(), deals()), (2, 3, 2));
}
