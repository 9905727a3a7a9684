use std::collections::HashSet;

use super::*;

const NOW: i64 = 1_700_000_000_000;
const MAX: u64 = DEFAULT_MAX_DELAY_MS;

/// deliver_at_ms, delay_ms, and the decision (or words the refusal contains).
type DueCase = (Option<i64>, Option<i64>, Result<Due, &'static str>);

#[test]
fn due_times_follow_the_table() {
    let max = MAX as i64;
    let table: &[DueCase] = &[
        (None, Some(0), Ok(Due::Now)),
        (None, Some(1), Ok(Due::At(NOW + 1))),
        (None, Some(max), Ok(Due::At(NOW + max))),
        (None, Some(max + 1), Err("past the maximum delay")),
        (None, Some(-1), Err("negative")),
        (Some(NOW - 5), None, Ok(Due::Now)),
        (Some(NOW), None, Ok(Due::Now)),
        (Some(NOW + 30_000), None, Ok(Due::At(NOW + 30_000))),
        (Some(NOW + max + 1), None, Err("past the maximum delay")),
        (Some(-1), None, Err("before 1970")),
        (Some(i64::MAX), None, Err("past the maximum delay")),
        (Some(NOW), Some(5), Err("not both")),
        (None, None, Err("needs deliver_at_ms or delay_ms")),
    ];
    for (at, delay, want) in table {
        let got = decide_due(NOW, *at, *delay, MAX);
        match (want, &got) {
            (Ok(w), Ok(g)) => assert_eq!(w, g, "{at:?} {delay:?}"),
            (Err(w), Err(g)) => assert!(g.contains(w), "{at:?} {delay:?}: {g:?} lacks {w:?}"),
            _ => panic!("{at:?} {delay:?}: got {got:?}, want {want:?}"),
        }
    }
    assert!(decide_due(i64::MAX - 1, None, Some(10), u64::MAX).unwrap_err().contains("overflows"));
}

#[test]
fn slots_are_whole_seconds() {
    assert_eq!(slot_of(0), 0);
    assert_eq!(slot_of(999), 0);
    assert_eq!(slot_of(1000), 1);
    assert_eq!(slot_of(NOW + 1), NOW / 1000);
}

#[test]
fn ids_round_trip_and_bad_ones_are_named() {
    let id = DelayId { partition: 3, offset: 12_345 };
    assert_eq!(id.to_string(), "3-12345");
    assert_eq!("3-12345".parse::<DelayId>(), Ok(id));
    for bad in ["", "3", "3-", "-5", "a-1", "3-x", "3-1-2"] {
        let e = bad.parse::<DelayId>().unwrap_err();
        assert!(e.contains("not a delayed record id"), "{bad}: {e}");
    }
}

fn w(group: u64, due_ms: i64) -> Waiting {
    Waiting { group, due_ms }
}

#[test]
fn each_group_fires_its_due_prefix_in_order() {
    let none = HashSet::new();
    let table: &[(&[Waiting], i64, &[usize])] = &[
        (&[], NOW, &[]),
        (&[w(1, NOW), w(1, NOW + 1)], NOW, &[0]),
        // A later entry of the same group due earlier waits for the one before it.
        (&[w(1, NOW + 700), w(1, NOW + 300)], NOW + 500, &[]),
        (&[w(1, NOW + 700), w(1, NOW + 300)], NOW + 700, &[0, 1]),
        // Another group is not held up.
        (&[w(1, NOW + 700), w(2, NOW + 300), w(1, NOW + 100)], NOW + 500, &[1]),
        (&[w(1, NOW - 5), w(2, NOW - 4), w(1, NOW - 3)], NOW, &[0, 1, 2]),
    ];
    for (waiting, now, want) in table {
        assert_eq!(pick_due(waiting, *now, &none), want.to_vec(), "{waiting:?} at {now}");
    }
    let blocked: HashSet<u64> = [1].into();
    assert_eq!(pick_due(&[w(1, NOW), w(2, NOW)], NOW, &blocked), vec![1]);
}

#[test]
fn topic_max_delays_are_bounded_by_the_broker() {
    let day = 24 * 3_600_000;
    let table: &[(u64, Option<u64>, Result<(), &str>)] = &[
        (1_000, None, Ok(())),
        (999, None, Err("below the 1000 ms minimum")),
        (MAX, None, Ok(())),
        (MAX + 1, None, Err("past the largest delay.max_delay")),
        (day, Some(day), Ok(())),
        (day + 1, Some(day), Err("past the broker's delay.max_delay, 86400000 ms")),
    ];
    for (ms, ceiling, want) in table {
        let got = check_topic_max_delay(*ms, *ceiling);
        match (want, &got) {
            (Ok(()), Ok(())) => {}
            (Err(w), Err(g)) => assert!(g.contains(w), "{ms} {ceiling:?}: {g:?} lacks {w:?}"),
            _ => panic!("{ms} {ceiling:?}: got {got:?}, want {want:?}"),
        }
    }
    assert_eq!(topic_max_delay(None, day), day);
    assert_eq!(topic_max_delay(Some(60_000), day), 60_000);
    // A topic's setting above a broker ceiling lowered since follows the ceiling.
    assert_eq!(topic_max_delay(Some(2 * day), day), day);
}
