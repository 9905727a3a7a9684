//! Planning one append request from the pending batches: in order, contiguous from the cache offset, of one
//! epoch, up to the request size; a batch partly below the cache offset or larger than the target's
//! `max_batch_bytes` is re-encoded (`reshape`), keeping every record's offset.

use ferry_client::batch::Batch;

use super::{AppendPlan, PartitionCore, Pending};
use crate::lane::budget::Held;
use crate::reshape;

/// The next request's worth of pending batches, `Ok(None)` when nothing can go yet, or the reason the partition
/// must halt (a single record over the target's limit, a batch that does not decode).
pub(super) fn plan(core: &mut PartitionCore) -> Result<Option<AppendPlan>, String> {
    let Some(first) = core.pending.front() else { return Ok(None) };
    let epoch = first.batch.epoch();
    let limit = core.request_limit();
    let max_batch = core.config.target_max_batch;
    let mut cursor = core.cache;
    let mut out: Vec<Batch> = Vec::new();
    let mut bytes = 0u64;
    let mut held = Held::none();
    let mut records = 0u64;
    let mut max_timestamp = i64::MIN;
    while let Some(p) = core.pending.front() {
        let b = &p.batch;
        // Only the first batch of a request may start above the cursor (the caller checked it is the cache
        // offset); a later one waits to be checked as the first of the next request.
        if b.epoch() != epoch || (!out.is_empty() && (b.base_offset() > cursor || bytes + b.len() as u64 > limit)) {
            break;
        }
        let Some(Pending { batch, held: h }) = core.pending.pop_front() else { break };
        core.pending_bytes -= batch.len() as u64;
        if !reshape::needs_reshape(batch.header(), batch.len(), cursor, max_batch) {
            cursor = batch.next_offset();
            records += u64::from(batch.record_count());
            max_timestamp = max_timestamp.max(batch.max_timestamp());
            bytes += batch.len() as u64;
            held.merge(h);
            out.push(batch);
            continue;
        }
        match reshape::reshape(batch.header(), batch.bytes(), cursor, max_batch, core.config.decode_limit) {
            Ok(pieces) => {
                let mut pieces = pieces.into_iter().filter_map(|piece| Batch::parse(piece).ok()).peekable();
                // The pieces hold the original's bytes between them.
                held.merge(h);
                while let Some(piece) = pieces.next() {
                    // The pieces of one large batch may not fit one request: the rest wait for the next.
                    if !out.is_empty() && bytes + piece.len() as u64 > limit {
                        let rest: Vec<Batch> = std::iter::once(piece).chain(pieces).collect();
                        core.requeue_front(rest);
                        break;
                    }
                    cursor = piece.next_offset();
                    records += u64::from(piece.record_count());
                    max_timestamp = max_timestamp.max(piece.max_timestamp());
                    bytes += piece.len() as u64;
                    out.push(piece);
                }
            }
            // Append what precedes this batch first: the partition then halts exactly at the batch, when it comes
            // up again as the first of the next request.
            Err(_) if !out.is_empty() => {
                core.pending_bytes += batch.len() as u64;
                core.pending.push_front(Pending { batch, held: h });
                break;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let Some(last) = out.last() else { return Ok(None) };
    Ok(Some(AppendPlan {
        last_offset: last.last_offset(),
        epoch,
        batches: out,
        source_log_start: core.source.log_start,
        records,
        bytes,
        max_timestamp,
        held,
    }))
}

impl PartitionCore {
    /// Puts re-encoded batches back at the front of the pending queue, in order. Their bytes are held by the
    /// request that split them off until it is answered; then they count as pending until appended.
    fn requeue_front(&mut self, batches: Vec<Batch>) {
        for b in batches.into_iter().rev() {
            self.pending_bytes += b.len() as u64;
            self.pending.push_front(Pending { batch: b, held: Held::none() });
        }
    }

    /// The largest append request.
    fn request_limit(&self) -> u64 {
        self.request_limit
    }
}
