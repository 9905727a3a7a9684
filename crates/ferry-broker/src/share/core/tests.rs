use super::*;

fn settings(mode: Mode) -> Settings {
    Settings { mode, lock_ms: 1_000, window: 4, backoff_ms: vec![100, 500], retries: 2 }
}

#[test]
fn a_queue_takes_only_what_is_in_the_window_unlocked_and_not_waiting() {
    let mut p = Part::at(10);
    p.locks.insert(11, Lock { member: "a".into(), until_ms: 50, retries: 2 });
    p.failed(12, 0, 200, "boom");
    // 10 free, 11 locked, 12 waits until 200, 13 free, 14 past the window of 4.
    assert_eq!(p.pick(&[10, 11, 12, 13, 14], 4, 100, 10, false), vec![10, 13]);
    assert_eq!(p.pick(&[10, 11, 12, 13, 14], 4, 200, 10, false), vec![10, 12, 13]);
    assert_eq!(p.pick(&[10, 11, 12, 13, 14], 4, 200, 1, false), vec![10]);
    assert_eq!(p.first_available(4, 100), Some(10));
}

#[test]
fn a_serial_group_takes_in_order_and_stops_at_the_first_record_it_may_not_take() {
    let mut p = Part::at(0);
    assert_eq!(p.pick(&[0, 1, 2], 10, 0, 10, true), vec![0, 1, 2]);
    p.locks.insert(0, Lock { member: "a".into(), until_ms: 50, retries: 2 });
    // Record 0 is in flight: nothing after it is delivered.
    assert_eq!(p.pick(&[1, 2], 10, 0, 10, true), Vec::<u64>::new());
    p.settle(0, false);
    p.failed(1, 0, 100, "x");
    assert_eq!(p.pick(&[1, 2], 10, 50, 10, true), Vec::<u64>::new(), "record 1 waits for its retry: 2 waits too");
    assert_eq!(p.pick(&[1, 2], 10, 100, 10, true), vec![1, 2]);
}

#[test]
fn settling_moves_the_start_past_every_settled_record_only() {
    let mut p = Part::at(5);
    p.delivered(&[5, 6, 7]);
    p.settle(6, false);
    assert_eq!(p.start, 5, "6 settled out of order");
    p.settle(5, false);
    assert_eq!(p.start, 7);
    assert_eq!(p.status(6, 0), Status::Success);
    p.settle(7, true);
    assert_eq!((p.start, p.recs.len()), (8, 0));
    p.skip_to(20);
    assert_eq!(p.start, 20);
}

#[test]
fn lock_expiry_and_a_dead_member_return_records_to_new_with_their_count_kept() {
    let mut p = Part::at(0);
    p.delivered(&[0, 1]);
    p.locks.insert(0, Lock { member: "a".into(), until_ms: 10, retries: 2 });
    p.locks.insert(1, Lock { member: "b".into(), until_ms: 99, retries: 2 });
    assert_eq!(p.expire_locks(10), vec![(0, "a".to_owned())]);
    assert_eq!(p.status(0, 10), Status::New);
    assert_eq!(p.recs[&0].deliveries, 1);
    assert_eq!(p.release_member("b"), vec![1]);
    assert_eq!(p.status(1, 10), Status::New);
}

#[test]
fn failures_back_off_by_the_policy_then_dead_letter() {
    let s = settings(Mode::Queue);
    // (deliveries so far, retries allowed, asked wait, expected)
    let cases = [
        (1, 2, None, AfterFailure::RetryAt(1_100)),
        (2, 2, None, AfterFailure::RetryAt(1_500)),
        (3, 2, None, AfterFailure::DeadLetter),
        (1, 2, Some(7), AfterFailure::RetryAt(1_007)),
        (1, 0, None, AfterFailure::DeadLetter),
        (9, 20, None, AfterFailure::RetryAt(1_500)),
    ];
    for (deliveries, retries, asked, want) in cases {
        assert_eq!(after_failure(&s, deliveries, retries, asked, 1_000), want, "{deliveries} {retries} {asked:?}");
    }
    let default = Settings { backoff_ms: vec![], ..s };
    assert_eq!(default.backoff(1), 1_000);
    assert_eq!(default.backoff(100), 600_000);
    assert!(exhausted(3, 2));
    assert!(!exhausted(2, 2));
}

#[test]
fn the_longest_lived_member_is_active() {
    let members = [("b", 5), ("a", 7), ("c", 5)];
    assert_eq!(active_member(members.iter().map(|(m, s)| (*m, *s))), Some("b"));
    assert_eq!(active_member(std::iter::empty()), None);
}

#[test]
fn bounds_are_checked_with_the_field_named() {
    assert!(check_settings(30_000, 2_000, &[1_000], 16).is_ok());
    assert!(check_settings(10, 2_000, &[], 16).unwrap_err().contains("lock_timeout_ms"));
    assert!(check_settings(30_000, 0, &[], 16).unwrap_err().contains("window"));
    assert!(check_settings(30_000, 10, &[MAX_BACKOFF_MS + 1], 16).unwrap_err().contains("backoff"));
    assert!(check_settings(30_000, 10, &[], MAX_RETRIES + 1).unwrap_err().contains("retries"));
}
