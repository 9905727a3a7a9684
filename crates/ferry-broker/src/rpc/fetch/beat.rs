//! A subscribe stream's position heartbeat. Every beat period the stream tells the client each partition's
//! position (log start, log end, epochs) or error, busy or not, so the client always knows every log end and
//! silence means a dead link.
//!
//! A stream started with `changed_beats` (as the mirror starts its streams) is told only what changed: a beat
//! carries the partitions whose position differs from what the last beat said of them, and every
//! [`FULL_BEAT_EVERY`]th beat carries every partition, so a client that could not act on a position when it came
//! hears it again within that many beats. Such a beat is sent even when it carries nothing. With thousands of idle
//! partitions, a beat of every partition twice a second was most of what an idle stream cost both ends.

use ferry_proto as pb;

/// Every this many beats of a `changed_beats` stream, one carries every partition.
pub const FULL_BEAT_EVERY: u64 = 10;

/// How a stream beats.
#[derive(Debug, Default)]
pub struct Beats {
    /// The client asked for changes-only beats.
    pub changed_only: bool,
    /// Beats sent so far.
    sent: u64,
}

/// What the last beat said of one partition.
#[derive(Debug, Default)]
pub struct Said(Option<pb::PartitionData>);

impl Beats {
    /// The next beat, made of `positions` (each partition's current position and where the last beat's is kept),
    /// or `None` when there is nothing to send.
    pub fn next<'a>(
        &mut self,
        positions: impl Iterator<Item = (pb::PartitionData, &'a mut Said)>,
    ) -> Option<pb::SubscribeResponse> {
        if !self.changed_only {
            let partitions: Vec<pb::PartitionData> = positions.map(|(d, _)| d).collect();
            return (!partitions.is_empty()).then_some(pb::SubscribeResponse { partitions, beat: 0 });
        }
        self.sent += 1;
        let full = self.sent % FULL_BEAT_EVERY == 0;
        let mut partitions = Vec::new();
        for (d, said) in positions {
            if !full && said.0.as_ref() == Some(&d) {
                continue;
            }
            said.0 = Some(d.clone());
            partitions.push(d);
        }
        let beat = if full { pb::BeatKind::BeatFull } else { pb::BeatKind::BeatChanges };
        Some(pb::SubscribeResponse { partitions, beat: beat as i32 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(partition: u32, log_end: u64) -> pb::PartitionData {
        pb::PartitionData { topic: "t".into(), partition, log_end_offset: log_end, seat: 7, ..Default::default() }
    }

    /// Runs one beat over partitions at `ends`, with their saids.
    fn beat(beats: &mut Beats, said: &mut [Said], ends: &[u64]) -> Option<pb::SubscribeResponse> {
        let positions: Vec<pb::PartitionData> = ends.iter().enumerate().map(|(p, e)| pos(p as u32, *e)).collect();
        beats.next(positions.into_iter().zip(said.iter_mut()))
    }

    fn carried(r: &pb::SubscribeResponse) -> Vec<(u32, u64)> {
        r.partitions.iter().map(|d| (d.partition, d.log_end_offset)).collect()
    }

    #[test]
    fn a_changes_only_stream_hears_each_change_once_and_everything_every_tenth_beat() {
        let mut beats = Beats { changed_only: true, ..Default::default() };
        let mut said: Vec<Said> = (0..3).map(|_| Said::default()).collect();
        let first = beat(&mut beats, &mut said, &[5, 6, 7]).unwrap();
        assert_eq!(carried(&first), vec![(0, 5), (1, 6), (2, 7)]);
        assert_eq!(first.beat, pb::BeatKind::BeatChanges as i32);
        let quiet = beat(&mut beats, &mut said, &[5, 6, 7]).unwrap();
        assert_eq!(carried(&quiet), vec![], "an unchanged partition is left out, and the beat still goes");
        assert_eq!(quiet.beat, pb::BeatKind::BeatChanges as i32);
        let moved = beat(&mut beats, &mut said, &[5, 9, 7]).unwrap();
        assert_eq!(carried(&moved), vec![(1, 9)]);
        for n in 4..FULL_BEAT_EVERY {
            let r = beat(&mut beats, &mut said, &[5, 9, 7]).unwrap();
            assert_eq!(carried(&r), vec![], "beat {n}");
        }
        let full = beat(&mut beats, &mut said, &[5, 9, 7]).unwrap();
        assert_eq!(full.beat, pb::BeatKind::BeatFull as i32);
        assert_eq!(carried(&full), vec![(0, 5), (1, 9), (2, 7)]);
        assert_eq!(carried(&beat(&mut beats, &mut said, &[5, 9, 7]).unwrap()), vec![]);
    }

    #[test]
    fn an_error_in_place_of_a_position_is_a_change_and_so_is_its_end() {
        let mut beats = Beats { changed_only: true, ..Default::default() };
        let mut said = vec![Said::default()];
        beat(&mut beats, &mut said, &[5]).unwrap();
        let err = pb::PartitionData { error: pb::ErrorCode::NotLeader as i32, ..pos(0, 5) };
        let r = beats.next(std::iter::once((err.clone(), &mut said[0]))).unwrap();
        assert_eq!(r.partitions, vec![err.clone()]);
        assert!(beats.next(std::iter::once((err, &mut said[0]))).unwrap().partitions.is_empty());
        assert_eq!(carried(&beat(&mut beats, &mut said, &[5]).unwrap()), vec![(0, 5)]);
    }

    #[test]
    fn a_plain_stream_beats_every_partition_and_stays_silent_with_none() {
        let mut beats = Beats::default();
        let mut said: Vec<Said> = (0..2).map(|_| Said::default()).collect();
        for _ in 0..3 {
            let r = beat(&mut beats, &mut said, &[1, 2]).unwrap();
            assert_eq!(carried(&r), vec![(0, 1), (1, 2)]);
            assert_eq!(r.beat, pb::BeatKind::BeatNone as i32);
        }
        assert!(beat(&mut beats, &mut [], &[]).is_none());
        let mut changes = Beats { changed_only: true, ..Default::default() };
        assert_eq!(
            beat(&mut changes, &mut [], &[]).unwrap().partitions,
            vec![],
            "a changes-only stream beats even empty"
        );
    }
}
