//! ListOffsets: each asked partition's log start, end and the offset its spec names, answered at its leader.
//!
//! Partitions come flat (each naming its topic) or in columns (each topic's name once, and no message per
//! partition either way: a mirror probes thousands of partitions every second this way). Both are answered one
//! answer per partition in the order asked, the columns in columns (`ferry_proto::columns`).

use ferry_proto as pb;
use tonic::Request;

use super::{BrokerService, READ, Rpc, ok};
use crate::error::BrokerError;
use crate::rpc::auth::{Scopes, caller};
use crate::rpc::fetch::{Reads, classify};

impl BrokerService {
    pub(super) async fn list_offsets_rpc(&self, req: Request<pb::ListOffsetsRequest>) -> Rpc<pb::ListOffsetsResponse> {
        let who = caller(&req)?;
        let req = req.into_inner();
        let columned = req.columns.as_ref().map_or(&[][..], |c| &c.topics[..]);
        for topic in req.partitions.iter().map(|lo| &lo.topic).chain(columned) {
            who.allow_topic("ListOffsets", READ.or(Scopes::ADMIN), topic)?;
        }
        let asked = match &req.columns {
            Some(c) => {
                Some(c.asked().map_err(|e| BrokerError::InvalidArgument(format!("ListOffsets in columns: {e}")))?)
            }
            None => None,
        };
        let reads = self.reads();
        let mut partitions = Vec::with_capacity(req.partitions.len());
        for lo in &req.partitions {
            let mut r = self.offsets_of(&reads, &lo.topic, lo).await;
            r.topic = lo.topic.clone();
            partitions.push(r);
        }
        let mut columns = None;
        if let (Some(c), Some(asked)) = (&req.columns, asked) {
            let spec = c.spec.map(Into::into);
            let mut answers = pb::ListOffsetsAnswers::default();
            for (topic, partition, leader_epoch) in asked {
                let lo = pb::ListOffsetsPartition { topic: String::new(), partition, spec, leader_epoch };
                answers.push(self.offsets_of(&reads, &c.topics[topic], &lo).await);
            }
            columns = Some(answers);
        }
        ok(pb::ListOffsetsResponse { partitions, columns })
    }

    /// The answer for partition `lo.partition` of `topic`, with `topic` left empty.
    async fn offsets_of(&self, reads: &Reads, topic: &str, lo: &pb::ListOffsetsPartition) -> pb::ListOffsetsResult {
        let mut r =
            pb::ListOffsetsResult { partition: lo.partition, error: pb::ErrorCode::None as i32, ..Default::default() };
        // A replicated partition is answered by its leader only, at the epoch the client names (KIP-320).
        let served = self.core.partition(topic, lo.partition).and_then(|p| {
            let epoch = reads.check(&p, lo.leader_epoch)?;
            Ok((p, epoch))
        });
        let (p, epoch) = match served {
            Ok(served) => served,
            Err(e) => {
                let (code, message, leader) = classify(reads, topic, lo.partition, &e);
                (r.error, r.message, r.leader) = (code as i32, message, leader);
                return r;
            }
        };
        r.leader_epoch = epoch;
        r.log_start_offset = p.log().log_start_offset();
        // A replicated partition's clients see its high watermark as its end.
        r.log_end_offset = p.visible_end();
        r.log_end_age_ms = p.end_age().map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX));
        r.fence_epoch = p.guard().fence.map(|f| f.epoch);
        r.stored_end_offset = p.log().log_end_offset();
        match lo.spec {
            Some(pb::list_offsets_partition::Spec::Earliest(_)) => r.offset = Some(r.log_start_offset),
            Some(pb::list_offsets_partition::Spec::Latest(_)) | None => r.offset = Some(r.log_end_offset),
            Some(pb::list_offsets_partition::Spec::TimestampMs(ts)) => match self.lookup_timestamp(&p, ts).await {
                Ok(o) => r.offset = o.filter(|o| *o < r.log_end_offset),
                Err(e) => {
                    r.error = pb::ErrorCode::StorageError as i32;
                    r.message = e.client_message();
                }
            },
        }
        r
    }
}
