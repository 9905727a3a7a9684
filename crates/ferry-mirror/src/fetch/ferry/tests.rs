//! What a beat hands to a lane: a changed position at once, a repeated one once in ten sightings.

use tokio::sync::Notify;

use super::*;
use crate::config::SwitchBack;
use crate::egress::ferry_routes;
use crate::egress::tests::source;
use crate::events::EventBus;
use crate::lane::budget::Budget;
use crate::lane::core::Input;
use crate::state::PartitionStatus;

fn session() -> FerrySession {
    let metrics = Metrics::new();
    let config = source(2, SwitchBack::Manual);
    let egress =
        EgressHandle::new(&config, &ferry_routes(&config, false, 4 << 20), None, EventBus::new(metrics.clone()))
            .expect("egress");
    FerrySession::new(FerrySessionSettings::default(), egress, metrics, Arc::new(Shared::default()))
}

fn beat(kind: pb::BeatKind, log_end: u64) -> pb::SubscribeResponse {
    pb::SubscribeResponse {
        beat: kind as i32,
        partitions: vec![pb::PartitionData {
            topic: "t".into(),
            partition: 0,
            seat: 1,
            log_start_offset: 2,
            log_end_offset: log_end,
            topic_id: "id-1".into(),
            ..Default::default()
        }],
    }
}

/// The log ends of the positions a lane was handed.
fn handed(link: &LaneLink) -> Vec<u64> {
    link.drain_inputs()
        .into_iter()
        .filter_map(|i| if let Input::Position(p) = i { Some(p.log_end) } else { None })
        .collect()
}

#[test]
fn a_beat_hands_a_changed_position_at_once_and_a_repeated_one_once_in_ten() {
    let session = session();
    let tp = SourceTp::new("t", 0);
    let status = Arc::new(PartitionStatus::new("t", "t", 0));
    let link = LaneLink::new(tp.clone(), Budget::new(1 << 20, 1 << 17), Arc::new(Notify::new()), status);
    let sub =
        Sub { link: Arc::clone(&link), version: 1, seat: Some(1), credit: Held::none(), last_beat: Repeat::default() };
    let mut subs = BTreeMap::from([(tp, sub)]);
    let mut wanting = HashSet::new();
    let set = PartitionSet::for_leader(0, Arc::new(|_: &SourceTp, _: u32| {}));
    let mut per_beat = Vec::new();
    // A changes-only beat with the new position, then nine full beats that repeat it, a tenth, and a change.
    let beats = std::iter::once(beat(pb::BeatKind::BeatChanges, 5))
        .chain((0..10).map(|_| beat(pb::BeatKind::BeatFull, 5)))
        .chain([beat(pb::BeatKind::BeatChanges, 6), beat(pb::BeatKind::BeatFull, 6)]);
    for resp in beats {
        session.dispatch(&mut subs, &mut wanting, &set, resp);
        per_beat.push(handed(&link));
    }
    // Handed: the first sighting of 5, then the tenth after it; 6 at once, and not again at the next full beat.
    let mut want = vec![vec![5]];
    want.extend(std::iter::repeat_n(vec![], 9));
    want.extend([vec![5], vec![6], vec![]]);
    assert_eq!(per_beat, want);
    session.dispatch(&mut subs, &mut wanting, &set, beat(pb::BeatKind::BeatFull, 7));
    assert_eq!(handed(&link), [7], "a changed position, whatever the beat");
    assert!(wanting.is_empty(), "beats carry no data");
}
