//! Table tests of the transaction decisions.

use super::*;

fn key(id: &str) -> Key {
    ("g".to_owned(), id.to_owned())
}

fn msg(topic: &str, p: u32, v: &str) -> pb::TxnMessage {
    pb::TxnMessage {
        topic: topic.into(),
        partition: Some(p),
        value: Some(bytes::Bytes::copy_from_slice(v.as_bytes())),
        ..Default::default()
    }
}

fn rec(id: &str, at_ms: i64, change: pb::txn_record::Change) -> pb::TxnRecord {
    pb::TxnRecord { group: "g".into(), txn_id: id.into(), at_ms, change: Some(change) }
}

fn prepared(id: &str, at_ms: i64, messages: Vec<pb::TxnMessage>) -> pb::TxnRecord {
    rec(id, at_ms, pb::txn_record::Change::Prepared(pb::TxnPrepared { messages, producer_id: 7, count: 0 }))
}

fn decided(id: &str, o: Outcome, by: By) -> pb::TxnRecord {
    rec(id, 0, pb::txn_record::Change::Decided(pb::TxnDecided { outcome: o.to_pb() as i32, by: by.name().into() }))
}

fn done(id: &str, o: Outcome) -> pb::TxnRecord {
    rec(id, 0, pb::txn_record::Change::Done(pb::TxnDone { outcome: o.to_pb() as i32, offsets: Vec::new() }))
}

const LIMITS: Limits = Limits { max_pending: 2, max_pending_bytes: 100, max_messages: 3, max_txn_bytes: 60 };

#[test]
fn prepare_rules() {
    let mut t = Table::default();
    t.apply_record(prepared("a", 1, vec![msg("o", 0, "x")]));
    let cases: Vec<(&str, Vec<pb::TxnMessage>, Prepare)> = vec![
        ("a", vec![msg("o", 0, "x")], Prepare::Repeat),
        ("b", vec![msg("o", 0, "x")], Prepare::Write),
        ("b", vec![], Prepare::Refuse(None, "a transaction needs at least one message".into())),
    ];
    for (id, messages, want) in cases {
        assert_eq!(prepare(&t, &key(id), &messages, LIMITS), want, "{id}");
    }
    assert!(matches!(prepare(&t, &key("a"), &[msg("o", 0, "y")], LIMITS), Prepare::Refuse(None, _)));
    let four = vec![msg("o", 0, "1"), msg("o", 0, "2"), msg("o", 0, "3"), msg("o", 0, "4")];
    assert!(matches!(prepare(&t, &key("c"), &four, LIMITS), Prepare::Refuse(Some("transactions.max_messages"), _)));
    let big = vec![msg("o", 0, &"z".repeat(70))];
    assert!(matches!(prepare(&t, &key("c"), &big, LIMITS), Prepare::Refuse(Some("broker.max_batch_bytes"), _)));
    t.apply_record(prepared("b", 1, vec![msg("o", 0, "x")]));
    assert!(matches!(
        prepare(&t, &key("c"), &[msg("o", 0, "x")], LIMITS),
        Prepare::Refuse(Some("transactions.max_pending"), _)
    ));
    // Done transactions no longer count, and a repeat of a done one is still harmless.
    t.apply_record(decided("a", Outcome::Commit, By::Producer));
    t.apply_record(done("a", Outcome::Commit));
    assert_eq!(prepare(&t, &key("c"), &[msg("o", 0, "x")], LIMITS), Prepare::Write);
    assert_eq!(prepare(&t, &key("a"), &[msg("o", 0, "x")], LIMITS), Prepare::Repeat);
}

#[test]
fn pending_bytes_limit_refuses_a_prepare() {
    let mut t = Table::default();
    t.apply_record(prepared("a", 1, vec![msg("o", 0, &"x".repeat(50))]));
    let limits = Limits { max_pending: 10, ..LIMITS };
    assert!(matches!(
        prepare(&t, &key("b"), &[msg("o", 0, &"y".repeat(50))], limits),
        Prepare::Refuse(Some("transactions.max_pending_bytes"), _)
    ));
}

#[test]
fn resolution_is_decided_once_first_writer_wins() {
    let mut t = Table::default();
    t.apply_record(prepared("a", 1, vec![msg("o", 0, "x")]));
    assert_eq!(resolve(&t, &key("zz"), Outcome::Commit), Resolve::Unknown);
    assert_eq!(resolve(&t, &key("a"), Outcome::Commit), Resolve::Decide);
    assert_eq!(resolve(&t, &key("a"), Outcome::Rollback), Resolve::Decide);
    t.apply_record(decided("a", Outcome::Rollback, By::Check));
    // A second decision record (a race lost in the log) changes nothing.
    t.apply_record(decided("a", Outcome::Commit, By::Producer));
    let table: Vec<(Outcome, Resolve)> =
        vec![(Outcome::Rollback, Resolve::Finish), (Outcome::Commit, Resolve::Conflict(Outcome::Rollback, By::Check))];
    for (asked, want) in table {
        assert_eq!(resolve(&t, &key("a"), asked), want);
    }
    t.apply_record(done("a", Outcome::Rollback));
    assert_eq!(resolve(&t, &key("a"), Outcome::Rollback), Resolve::Answer);
    assert_eq!(resolve(&t, &key("a"), Outcome::Commit), Resolve::Conflict(Outcome::Rollback, By::Check));
    assert_eq!(t.txns[&key("a")].state(), "rolled_back");
    assert!(t.txns[&key("a")].messages.is_empty());
}

const TIMING: Timing = Timing { timeout_ms: 100, interval_ms: 50 };

#[test]
fn checks_start_at_the_timeout_and_repeat_each_interval() {
    let mut t = Table::default();
    t.apply_record(prepared("a", 1000, vec![msg("o", 0, "x")]));
    let mut id = 0;
    let yes = |_: &str| true;
    assert_eq!(due(&mut t, 1099, TIMING, &yes, &mut id), vec![]);
    assert_eq!(due(&mut t, 1100, TIMING, &yes, &mut id), vec![CheckAction::Send(key("a"), 1)]);
    // Unanswered: asked again after the interval, under a new id.
    assert_eq!(due(&mut t, 1149, TIMING, &yes, &mut id), vec![]);
    assert_eq!(due(&mut t, 1150, TIMING, &yes, &mut id), vec![CheckAction::Send(key("a"), 2)]);
    // An UNKNOWN to the old check is not counted; to the latest, once; an id never sent is ignored.
    assert_eq!(answer(&mut t, &key("a"), 1, None, 3), Answer::Stale);
    assert_eq!(answer(&mut t, &key("a"), 3, None, 3), Answer::Stale);
    assert_eq!(answer(&mut t, &key("a"), 2, None, 3), Answer::Count(1));
    assert_eq!(answer(&mut t, &key("a"), 2, None, 3), Answer::Stale);
    // A definite answer to an older check still resolves the pending transaction.
    assert_eq!(answer(&mut t, &key("a"), 1, Some(Outcome::Commit), 3), Answer::Resolve(Outcome::Commit));
}

#[test]
fn without_a_producer_the_clock_pauses_and_reports_once() {
    let mut t = Table::default();
    t.apply_record(prepared("a", 0, vec![msg("o", 0, "x")]));
    let mut id = 0;
    let no = |_: &str| false;
    assert_eq!(due(&mut t, 500, TIMING, &no, &mut id), vec![CheckAction::StartedWaiting(key("a"))]);
    assert_eq!(due(&mut t, 5000, TIMING, &no, &mut id), vec![]);
    assert!(t.clocks[&key("a")].waiting);
    assert_eq!(t.txns[&key("a")].checks, 0);
    let yes = |_: &str| true;
    assert_eq!(due(&mut t, 5001, TIMING, &yes, &mut id), vec![CheckAction::Send(key("a"), 1)]);
}

#[test]
fn unknown_answers_expire_it_after_max_checks() {
    let mut t = Table::default();
    t.apply_record(prepared("a", 0, vec![msg("o", 0, "x")]));
    let mut id = 0;
    let yes = |_: &str| true;
    let mut now = 100;
    let mut got = Vec::new();
    for _ in 0..3 {
        let actions = due(&mut t, now, TIMING, &yes, &mut id);
        assert_eq!(actions, vec![CheckAction::Send(key("a"), id)]);
        let a = answer(&mut t, &key("a"), id, None, 3);
        if let Answer::Count(n) | Answer::Expire(n) = a {
            t.apply_record(rec("a", 0, pb::txn_record::Change::Checked(pb::TxnChecked { checks: n })));
        }
        got.push(a);
        now += 50;
    }
    assert_eq!(got, vec![Answer::Count(1), Answer::Count(2), Answer::Expire(3)]);
}

#[test]
fn answers_resolve_and_decided_transactions_are_finished_not_checked() {
    let mut t = Table::default();
    t.apply_record(prepared("a", 0, vec![msg("o", 0, "x")]));
    t.apply_record(prepared("b", 0, vec![msg("o", 0, "x")]));
    let mut id = 0;
    let yes = |_: &str| true;
    let actions = due(&mut t, 100, TIMING, &yes, &mut id);
    assert_eq!(actions, vec![CheckAction::Send(key("a"), 1), CheckAction::Send(key("b"), 2)]);
    assert_eq!(answer(&mut t, &key("a"), 1, Some(Outcome::Commit), 3), Answer::Resolve(Outcome::Commit));
    t.apply_record(decided("a", Outcome::Commit, By::Check));
    t.apply_record(decided("b", Outcome::Rollback, By::Producer));
    t.apply_record(done("b", Outcome::Rollback));
    assert_eq!(answer(&mut t, &key("b"), 2, Some(Outcome::Commit), 3), Answer::Stale);
    assert_eq!(due(&mut t, 1000, TIMING, &yes, &mut id), vec![CheckAction::Finish(key("a"))]);
}

#[test]
fn partitions_are_picked_once_and_grouped_in_prepared_order() {
    assert_eq!(pick_partition("t", 0, Some(3), Some(b"k"), 8), 3);
    assert_eq!(pick_partition("t", 0, None, Some(b"k"), 8), ferry_proto::partition_for_key(b"k", 8));
    let p0 = pick_partition("t", 0, None, None, 4);
    assert_eq!(pick_partition("t", 1, None, None, 4), (p0 + 1) % 4);
    let ms = vec![msg("a", 1, "1"), msg("b", 0, "2"), msg("a", 1, "3"), msg("a", 0, "4")];
    let groups: Vec<((String, u32), Vec<String>)> = by_partition(&ms)
        .into_iter()
        .map(|(tp, v)| (tp, v.iter().map(|m| String::from_utf8_lossy(m.value.as_deref().unwrap()).into()).collect()))
        .collect();
    assert_eq!(
        groups,
        vec![
            (("a".into(), 1), vec!["1".to_owned(), "3".to_owned()]),
            (("b".into(), 0), vec!["2".to_owned()]),
            (("a".into(), 0), vec!["4".to_owned()]),
        ]
    );
    let k = key("x");
    assert_eq!(producer_id(&k, 5), producer_id(&k, 5));
    assert_ne!(producer_id(&k, 5), producer_id(&k, 6));
    assert!(producer_id(&k, 5) >= 0);
}

#[test]
fn a_snapshot_rebuilds_the_table_and_forgets_what_retention_drops() {
    let mut t = Table::default();
    for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
        t.apply_record(prepared(id, i as i64, vec![msg("o", 0, "x"), msg("o", 1, "y")]));
    }
    t.apply_record(rec("a", 5, pb::txn_record::Change::Checked(pb::TxnChecked { checks: 2 })));
    t.apply_record(decided("a", Outcome::Commit, By::Check));
    t.apply_record(rec("a", 100, pb::txn_record::Change::Done(pb::TxnDone { outcome: 1, offsets: vec![] })));
    t.apply_record(decided("b", Outcome::Rollback, By::Producer));
    t.apply_record(rec("b", 200, pb::txn_record::Change::Done(pb::TxnDone { outcome: 2, offsets: vec![] })));
    t.apply_record(decided("c", Outcome::Commit, By::Operator));
    // A replay of older records (a forgotten transaction among them), then the snapshot, is the snapshot's state.
    let mut rebuilt = Table::default();
    rebuilt.apply_record(prepared("forgotten", 0, vec![msg("o", 0, "z")]));
    for r in snapshot(&t) {
        rebuilt.apply_record(r);
    }
    assert_eq!(rebuilt.txns, t.txns);
    assert_eq!(rebuilt.applied, snapshot(&t).len(), "only the records from the marker on count");
    assert_eq!(rebuilt.txns[&key("a")].count, 2, "a finished transaction keeps its message count");
    assert_eq!(prepare(&rebuilt, &key("a"), &[msg("o", 0, "x"), msg("o", 1, "y")], LIMITS), Prepare::Repeat);
    // Retention: by age, then by count (oldest first); pending and unfinished ones are never forgotten.
    let by_age = Retention { resolved_ms: 150, max_resolved: 10 };
    assert_eq!(to_forget(&t, 300, by_age), vec![key("a")]);
    let by_count = Retention { resolved_ms: 1_000_000, max_resolved: 1 };
    assert_eq!(to_forget(&t, 300, by_count), vec![key("a")]);
    let none = Retention { resolved_ms: 1_000_000, max_resolved: 0 };
    assert_eq!(to_forget(&t, 300, none), vec![key("a"), key("b")]);
    assert!(!should_compact(&t));
}
