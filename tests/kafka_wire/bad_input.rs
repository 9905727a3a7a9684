//! Bad frames on the Kafka listener: each gets Kafka's error code or a clean close, never a crash, and the
//! listener goes on answering.

use anyhow::Context;
use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Wire, step_deadline};

/// A request frame: size, API key, version, correlation id, client id "t", body.
pub fn frame(key: i16, version: i16, correlation: i32, body: &[u8]) -> Vec<u8> {
    let mut f = BytesMut::new();
    f.put_i16(key);
    f.put_i16(version);
    f.put_i32(correlation);
    f.put_i16(1);
    f.put_u8(b't');
    f.put_slice(body);
    let mut out = (f.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&f);
    out
}

/// Sends `bytes` on a new connection; the answer frame (without its size), or `None` when the listener closed
/// the connection without one.
pub async fn exchange(addr: &str, bytes: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
    let mut s = TcpStream::connect(addr).await?;
    // The listener may close before it has read everything: a failed write is a close too.
    if s.write_all(bytes).await.is_err() {
        return Ok(None);
    }
    let read = async {
        let Ok(n) = s.read_i32().await else { return Ok(None) };
        let mut body = vec![0u8; n.max(0) as usize];
        s.read_exact(&mut body).await?;
        Ok::<_, anyhow::Error>(Some(body))
    };
    tokio::time::timeout(step_deadline(), read).await.context("no answer and no close")?
}

/// A Produce v3 request of one partition of `topic` carrying `records`.
fn produce_v3(topic: &str, records: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_i16(-1); // no transactional id
    b.put_i16(1); // acks
    b.put_i32(5000);
    b.put_i32(1);
    b.put_i16(topic.len() as i16);
    b.put_slice(topic.as_bytes());
    b.put_i32(1);
    b.put_i32(0); // partition
    b.put_i32(records.len() as i32);
    b.put_slice(records);
    frame(0, 3, 7, &b)
}

#[tokio::test]
async fn bad_frames_get_kafka_errors_or_a_clean_close() -> anyhow::Result<()> {
    let w = Wire::start().await?;
    let k = w.kafka.as_str();

    // ApiVersions v0 is answered: error 0 and the advertised APIs.
    let ok = exchange(k, &frame(18, 0, 1, &[])).await?.context("ApiVersions v0 answered")?;
    let mut r = &ok[..];
    assert_eq!((r.get_i32(), r.get_i16()), (1, 0), "correlation id, error code");
    assert!(r.get_i32() >= 10, "the ledger's APIs");

    // ApiVersions above the advertised versions: the v0 layout with UNSUPPORTED_VERSION (35), and the list.
    let v99 = exchange(k, &frame(18, 99, 2, &[])).await?.context("ApiVersions v99 answered")?;
    let mut r = &v99[..];
    assert_eq!((r.get_i32(), r.get_i16()), (2, 35));
    let n = r.get_i32();
    let apis: Vec<(i16, i16, i16)> = (0..n).map(|_| (r.get_i16(), r.get_i16(), r.get_i16())).collect();
    assert!(apis.contains(&(18, 0, 3)), "ApiVersions 0..=3 advertised: {apis:?}");
    assert!(!apis.iter().any(|a| a.0 == 26), "EndTxn is not advertised");
    assert!(!apis.iter().any(|a| a.0 == 23), "OffsetForLeaderEpoch is not advertised");

    // Closed without an answer: a size past kafka.max_request_bytes, a negative size, an unknown API key, an API
    // that is not advertised, a version out of range, a body that does not decode, an array count far beyond the
    // frame.
    let mut huge_array = BytesMut::new();
    huge_array.put_i32(i32::MAX);
    let closes: Vec<(&str, Vec<u8>)> = vec![
        ("oversized", (64_i32 << 20).to_be_bytes().to_vec()),
        ("negative size", (-5_i32).to_be_bytes().to_vec()),
        ("unknown API key", frame(999, 0, 3, &[])),
        ("EndTxn, not advertised", frame(26, 0, 3, &[])),
        ("Metadata v99", frame(3, 99, 3, &[])),
        ("Produce v2, below the floor", frame(0, 2, 3, &[])),
        ("truncated Metadata v1", frame(3, 1, 3, &[0, 0])),
        ("Metadata v1 claiming 2^31 topics", frame(3, 1, 3, &huge_array)),
    ];
    for (what, bytes) in closes {
        assert_eq!(exchange(k, &bytes).await?, None, "{what}: closed without an answer");
    }

    // Records that are not a batch: the partition's CORRUPT_MESSAGE (2), and nothing written.
    w.admin.create_topic("bad", 1, ferry_client::admin::TopicConfig::default(), None).await?;
    let ans = exchange(k, &produce_v3("bad", &[0u8; 70])).await?.context("Produce answered")?;
    let mut r = &ans[..];
    assert_eq!(r.get_i32(), 7);
    assert_eq!(r.get_i32(), 1, "one topic");
    let name_len = r.get_i16() as usize;
    r.advance(name_len);
    assert_eq!(r.get_i32(), 1, "one partition");
    assert_eq!((r.get_i32(), r.get_i16()), (0, 2), "partition 0: CORRUPT_MESSAGE");
    assert_eq!(w.admin.describe_topic("bad").await?.partitions[0].log_end_offset, 0);

    // The listener still answers, and the broker runs.
    assert!(exchange(k, &frame(18, 0, 9, &[])).await?.is_some());
    let mut broker = w.broker;
    assert!(broker.is_running());
    Ok(())
}
