//! Watermarks of many partitions at once, for the Kafka consumer's position heartbeats.
//!
//! One `ListOffsets` round per leader for the latest offsets and one for the earliest (librdkafka's
//! offsets-for-times with Kafka's special timestamps -1 = latest and -2 = earliest), instead of two requests per
//! partition. With `isolation.level = read_committed` the latest offset is the last stable offset: what a consumer
//! can read. A partition the batched call leaves without an answer is asked on its own.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

/// (topic, partition).
pub(crate) type Tp = (String, u32);

fn batched<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
    consumer: &C,
    tps: &[Tp],
    which: Offset,
    timeout: Duration,
) -> Result<BTreeMap<Tp, i64>, KafkaError> {
    let mut tpl = TopicPartitionList::with_capacity(tps.len());
    for (t, p) in tps {
        tpl.add_partition_offset(t, *p as i32, which)?;
    }
    let got = consumer.offsets_for_times(tpl, timeout)?;
    Ok(got
        .elements()
        .iter()
        .filter(|e| e.error().is_ok())
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) if o >= 0 => Some(((e.topic().to_owned(), e.partition() as u32), o)),
            _ => None,
        })
        .collect())
}

fn unreachable(e: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as K;
    matches!(
        e.rdkafka_error_code(),
        Some(
            K::BrokerTransportFailure
                | K::AllBrokersDown
                | K::Resolve
                | K::OperationTimedOut
                | K::RequestTimedOut
                | K::TimedOutQueue
                | K::Authentication
                | K::SaslAuthenticationFailed
                | K::SSL
        )
    )
}

/// (low, high) watermarks of `tps`. Fails when the cluster cannot be asked at all; partitions it has no answer
/// for (an unknown topic) are left out.
pub(crate) fn watermarks<C: Consumer<X>, X: rdkafka::consumer::ConsumerContext>(
    consumer: &C,
    tps: &[Tp],
    timeout: Duration,
) -> Result<BTreeMap<Tp, (u64, u64)>, KafkaError> {
    let mut out = BTreeMap::new();
    if tps.is_empty() {
        return Ok(out);
    }
    let batch = batched(consumer, tps, Offset::End, timeout)
        .and_then(|high| Ok((high, batched(consumer, tps, Offset::Beginning, timeout)?)));
    let (mut high, mut low) = match batch {
        Ok(both) => both,
        // An unreachable cluster: asking each partition would only wait out more timeouts.
        Err(e) if unreachable(&e) => return Err(e),
        Err(_) => (BTreeMap::new(), BTreeMap::new()),
    };
    let mut first_error = None;
    for tp in tps {
        match (low.remove(tp), high.remove(tp)) {
            (Some(l), Some(h)) => {
                out.insert(tp.clone(), (l as u64, h.max(l) as u64));
            }
            _ => match consumer.fetch_watermarks(&tp.0, tp.1 as i32, timeout) {
                Ok((l, h)) => {
                    out.insert(tp.clone(), (l.max(0) as u64, h.max(l).max(0) as u64));
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            },
        }
    }
    match first_error {
        // Nothing answered: the cluster is not reachable (or every topic is gone; the caller checks metadata).
        Some(e) if out.is_empty() => Err(e),
        _ => Ok(out),
    }
}
