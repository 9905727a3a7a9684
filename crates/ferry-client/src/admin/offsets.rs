//! ListOffsets of many partitions at once, each asked at its leader, in columns on the wire.
//!
//! Partitions that look up the same spec go in columns: each topic's name once, the partitions and the answers as
//! packed numbers, an answer placed by its position. A probe of thousands of partitions then sends, decodes and
//! allocates nothing per partition beyond the answer itself. A broker that predates the form answers it with
//! nothing; this client then asks that one again flat, and every broker flat from then on.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ferry_proto as pb;
use ferry_proto::columns::{Answer, OffsetsRow};
use ferry_proto::list_offsets_partition::Spec;

use super::{Admin, LEADER_ROUNDS, OffsetSpec, PartitionOffsets, partition_result};
use crate::connection::BrokerClient;
use crate::error::{ClientError, Result};

impl Admin {
    /// Offsets of many partitions at once, each asked at its leader as this client knows it (at its leader epoch);
    /// a partition whose answer points elsewhere is asked again there, a few rounds at most. A partition the broker
    /// reports an error for fails the whole call with [`crate::ClientError::Partition`] naming it.
    pub async fn list_offsets(&self, partitions: &[(String, u32, OffsetSpec)]) -> Result<Vec<PartitionOffsets>> {
        self.list_offsets_each(partitions).await?.into_iter().collect()
    }

    /// [`Admin::list_offsets`], with each partition's own outcome: one partition's error does not fail the others
    /// (a probe of many partitions, some of whose leaders are being elected). A partition no leader answered for
    /// is left out.
    pub async fn list_offsets_each<T: AsRef<str>>(
        &self,
        partitions: &[(T, u32, OffsetSpec)],
    ) -> Result<Vec<Result<PartitionOffsets>>> {
        let answers = self.list_offsets_aligned(partitions).await?;
        Ok(answers
            .into_iter()
            .zip(partitions)
            .filter_map(|(answer, (topic, partition, _))| {
                Some(answer?.map(|r| PartitionOffsets {
                    topic: topic.as_ref().to_owned(),
                    partition: *partition,
                    offset: r.offset,
                    log_start_offset: r.log_start_offset,
                    log_end_offset: r.log_end_offset,
                    log_end_age_ms: r.log_end_age_ms,
                    fence_epoch: r.fence_epoch,
                    stored_end_offset: r.stored_end_offset,
                }))
            })
            .collect())
    }

    /// [`Admin::list_offsets_each`] for a probe: answer `i` is partition `i`'s (`None` when no leader answered
    /// for it), and a result's `topic` may be empty, as it is the asked partition's. Nothing is allocated per
    /// partition beyond the request and the answers.
    pub async fn list_offsets_aligned<T: AsRef<str>>(
        &self,
        partitions: &[(T, u32, OffsetSpec)],
    ) -> Result<Vec<Option<Result<pb::ListOffsetsResult>>>> {
        let answers = self.answers_aligned(partitions, None).await?;
        Ok(answers
            .into_iter()
            .zip(partitions)
            .map(|(answer, (topic, partition, _))| {
                Some(match answer? {
                    Ok(row) => Ok(row.into()),
                    Err(r) => partition_result(topic.as_ref(), *partition, r.error, &r.message).map(|()| *r),
                })
            })
            .collect())
    }

    /// [`Admin::list_offsets_aligned`] for a probe of thousands of partitions, as small rows: row `i` is partition
    /// `i`'s, `None` when no leader answered for it or its leader answered with an error.
    pub async fn list_offsets_rows<T: AsRef<str>>(
        &self,
        partitions: &[(T, u32, OffsetSpec)],
    ) -> Result<Vec<Option<OffsetsRow>>> {
        let answers = self.answers_aligned(partitions, None).await?;
        Ok(answers.into_iter().map(|a| a?.ok()).collect())
    }

    /// [`Admin::list_offsets_rows`] with each leader on its own, for a probe that must not lose every partition to
    /// one broker: a leader that fails, or has not answered within `within`, leaves only its own partitions `None`
    /// (logged at debug); the others' rows are kept. No redirect is followed past `within`.
    pub async fn list_offsets_rows_within<T: AsRef<str>>(
        &self,
        partitions: &[(T, u32, OffsetSpec)],
        within: Duration,
    ) -> Vec<Option<OffsetsRow>> {
        let deadline = tokio::time::Instant::now() + within;
        match self.answers_aligned(partitions, Some(deadline)).await {
            Ok(answers) => answers.into_iter().map(|a| a?.ok()).collect(),
            // Only a strict call fails as a whole.
            Err(_) => vec![None; partitions.len()],
        }
    }

    /// The answers of [`Admin::list_offsets_aligned`], each a row or (an error) the result whole. Without a
    /// `deadline` one leader's failure fails the call; with one, each leader's ask is bounded by it and a leader
    /// that fails or is late leaves only its own partitions unanswered.
    async fn answers_aligned<T: AsRef<str>>(
        &self,
        partitions: &[(T, u32, OffsetSpec)],
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Vec<Option<Answer>>> {
        let mut answers: Vec<Option<Answer>> = vec![None; partitions.len()];
        let mut pending: Vec<usize> = (0..partitions.len()).collect();
        let mut backoff = self.client.config().retry.backoff();
        for round in 0..LEADER_ROUNDS {
            if pending.is_empty() {
                break;
            }
            if round > 0 {
                let pause = backoff.next().unwrap_or_default();
                if deadline.is_some_and(|d| tokio::time::Instant::now() + pause >= d) {
                    break;
                }
                tokio::time::sleep(pause).await;
            }
            // By leader client (a handful), found under one look-up of the leaders known; each partition with the
            // leader epoch this client knows of it (0: none), from the same look-up.
            let (clients, placed) = self.client.leaders_for(pending.iter().map(|&i| {
                let (topic, partition, _) = &partitions[i];
                (topic.as_ref(), *partition)
            }));
            let mut by_leader: Vec<(BrokerClient, Vec<usize>, Vec<u32>)> =
                clients.into_iter().map(|c| (c, Vec::new(), Vec::new())).collect();
            for (&i, (at, epoch)) in pending.iter().zip(placed) {
                let (_, idx, epochs) = &mut by_leader[at];
                idx.push(i);
                epochs.push(epoch);
            }
            let sent = tokio::time::Instant::now();
            let asks = by_leader.into_iter().map(|(c, idx, epochs)| async move {
                let ask = self.ask_leader(&c, partitions, &idx, epochs);
                let answer = match deadline {
                    None => ask.await,
                    Some(d) => tokio::time::timeout_at(d, ask).await.unwrap_or_else(|_| {
                        Err(ClientError::Timeout {
                            rpc: "ListOffsets",
                            broker: c.address(),
                            after: d.saturating_duration_since(sent),
                        })
                    }),
                };
                (idx, c.address(), answer)
            });
            let mut next = Vec::new();
            for (idx, address, answer) in futures::future::join_all(asks).await {
                let answer = match (answer, deadline) {
                    (Ok(answer), _) => answer,
                    (Err(e), None) => return Err(e),
                    (Err(e), Some(_)) => {
                        tracing::debug!(broker = %address, error = %e, partitions = idx.len(), "a leader did not answer ListOffsets; its partitions are left unanswered");
                        continue;
                    }
                };
                // The leaders the answers name, learnt together under one lock.
                let mut learnt: Vec<(usize, u32)> = Vec::new();
                for (i, r) in idx.into_iter().zip(answer) {
                    match &r {
                        None => continue,
                        Some(Ok(row)) if row.leader_epoch > 0 => learnt.push((i, row.leader_epoch)),
                        Some(Ok(_)) => {}
                        Some(Err(f)) => {
                            let (topic, partition) = (partitions[i].0.as_ref(), partitions[i].1);
                            if self.redirects(topic, partition, f.error, f.leader.as_ref()) && round + 1 < LEADER_ROUNDS
                            {
                                next.push(i);
                                continue;
                            }
                        }
                    }
                    answers[i] = r;
                }
                let learnt = learnt.iter().map(|&(i, epoch)| (partitions[i].0.as_ref(), partitions[i].1, epoch));
                self.client.learn_leaders(&address, learnt);
            }
            pending = next;
        }
        Ok(answers)
    }

    /// Partitions `idx` of `partitions` asked in columns, when they all look up the same spec: each run of the
    /// same topic named once, each partition with its known leader epoch (`leader_epochs`, 0 for none).
    fn in_columns<T: AsRef<str>>(
        partitions: &[(T, u32, OffsetSpec)],
        idx: &[usize],
        leader_epochs: &[u32],
    ) -> Option<pb::ListOffsetsColumns> {
        let spec = partitions[*idx.first()?].2;
        if idx.iter().any(|&i| partitions[i].2 != spec) {
            return None;
        }
        let mut c = pb::ListOffsetsColumns {
            partitions: Vec::with_capacity(idx.len()),
            // None known for any: no column.
            leader_epochs: if leader_epochs.iter().all(|&e| e == 0) { Vec::new() } else { leader_epochs.to_vec() },
            spec: Some(wire_spec(spec).into()),
            ..Default::default()
        };
        for &i in idx {
            let (topic, partition, _) = &partitions[i];
            let topic = topic.as_ref();
            match (c.topics.last(), c.counts.last_mut()) {
                (Some(last), Some(count)) if last == topic => *count += 1,
                _ => {
                    c.topics.push(topic.to_owned());
                    c.counts.push(1);
                }
            }
            c.partitions.push(*partition);
        }
        Some(c)
    }

    /// Asks leader `c` for partitions `idx` of `partitions` (with the leader epochs known of them): the answers
    /// aligned with `idx`, `None` for one the broker left out. An answer is taken only for the topic and partition
    /// it was asked for.
    async fn ask_leader<T: AsRef<str>>(
        &self,
        c: &BrokerClient,
        partitions: &[(T, u32, OffsetSpec)],
        idx: &[usize],
        leader_epochs: Vec<u32>,
    ) -> Result<Vec<Option<Answer>>> {
        let columns =
            Self::in_columns(partitions, idx, &leader_epochs).filter(|_| !self.flat_offsets.load(Ordering::Relaxed));
        if let Some(columns) = columns {
            let request = pb::ListOffsetsRequest { partitions: Vec::new(), columns: Some(columns) };
            let answer = c.list_offsets(request).await?;
            if let Some(answers) = answer.columns {
                let asked = idx.iter().map(|&i| partitions[i].1);
                let Some(results) = answers.into_answers(asked) else {
                    tracing::debug!(broker = %c.address(), "a ListOffsets answer's columns do not match its ask");
                    return Ok(vec![None; idx.len()]);
                };
                return Ok(results.into_iter().map(Some).collect());
            }
            tracing::debug!(broker = %c.address(), "the broker does not answer ListOffsets in columns; asking flat");
            self.flat_offsets.store(true, Ordering::Relaxed);
        }
        let ask = |(&i, &epoch): (&usize, &u32)| {
            let (topic, partition, spec) = &partitions[i];
            pb::ListOffsetsPartition {
                topic: topic.as_ref().to_owned(),
                partition: *partition,
                spec: Some(wire_spec(*spec)),
                leader_epoch: Some(epoch).filter(|&e| e > 0),
            }
        };
        let request =
            pb::ListOffsetsRequest { partitions: idx.iter().zip(&leader_epochs).map(ask).collect(), columns: None };
        let mut placed: Vec<Option<Answer>> = vec![None; idx.len()];
        for (k, r) in c.list_offsets(request).await?.partitions.into_iter().enumerate() {
            // In order as asked; anything else (one left out before it) by its names.
            let (topic, partition) = (r.topic.as_str(), r.partition);
            let named = |i: usize| partitions[i].0.as_ref() == topic && partitions[i].1 == partition;
            if let Some(at) =
                (idx.get(k).is_some_and(|&i| named(i))).then_some(k).or_else(|| idx.iter().position(|&i| named(i)))
            {
                placed[at] = Some(r.into_answer());
            }
        }
        Ok(placed)
    }
}

/// What a ListOffsets ask looks up, as the wire says it.
fn wire_spec(spec: OffsetSpec) -> Spec {
    match spec {
        OffsetSpec::Earliest => Spec::Earliest(true),
        OffsetSpec::Latest => Spec::Latest(true),
        OffsetSpec::Timestamp(ts) => Spec::TimestampMs(ts),
    }
}
