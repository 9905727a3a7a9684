use bytes::{Bytes, BytesMut};
use ferry_batch::{BatchBuilder, Compression, Header, ProducerInfo};

use super::*;

fn ferry_batch(compression: Compression) -> Bytes {
    let producer = ProducerInfo { producer_id: 42, producer_epoch: 3, base_sequence: 7 };
    let mut b = BatchBuilder::new(compression, producer);
    let h =
        |k: &str, v: Option<&str>| Header { key: k.to_owned(), value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())) };
    b.push(0, 1_700_000_000_000, Some(b"k0"), Some(b"v0"), &[h("a", Some("1")), h("a", None)]);
    b.push(1, 1_700_000_000_005, None, Some(b"v1"), &[]);
    b.push(2, 1_699_999_999_000, Some(b"k2"), None, &[h("z", Some(""))]);
    b.build(100, 4)
}

#[test]
fn a_stored_batch_served_to_kafka_and_produced_back_keeps_every_field() {
    for compression in [Compression::None, Compression::Zstd] {
        let stored = ferry_batch(compression);
        let mut kafka = BytesMut::new();
        to_kafka(&stored, -1, 1 << 20, &mut kafka).unwrap();
        assert_eq!(kafka[16], KAFKA_MAGIC);
        assert_eq!(ferry_batch::compute_crc(&kafka), u32::from_be_bytes(kafka[17..21].try_into().unwrap()));
        let batches = split_kafka(&kafka).unwrap();
        assert_eq!(batches.len(), 1);
        let back = to_ferry(batches[0], 1 << 20).unwrap();
        let want = ferry_batch::decode_records(&stored).unwrap();
        let mut got = ferry_batch::decode_records(&back).unwrap();
        for r in &mut got {
            r.offset += 100;
        }
        assert_eq!(got, want);
        let h = ferry_batch::BatchHeader::parse(&back).unwrap();
        assert_eq!((h.producer_id, h.producer_epoch, h.base_sequence, h.record_count), (42, 3, 7, 3));
    }
}

#[test]
fn hostile_batches_are_refused_with_a_reason() {
    let mut kafka = BytesMut::new();
    to_kafka(&ferry_batch(Compression::None), -1, 1 << 20, &mut kafka).unwrap();
    let good = kafka.freeze();
    assert!(matches!(split_kafka(&good[..30]), Err(RecordsError::Corrupt(_))));
    assert!(matches!(split_kafka(&[]), Err(RecordsError::Corrupt(_))));
    let mut magic = good.to_vec();
    magic[16] = 1;
    assert!(matches!(split_kafka(&magic), Err(RecordsError::Unsupported(_))));
    let mut flipped = good.to_vec();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    assert!(matches!(to_ferry(&flipped, 1 << 20), Err(RecordsError::Crc { .. })));
    // A record count far above what the bytes can hold, CRC fixed up: refused before anything is built.
    let mut count = good.to_vec();
    count[57..61].copy_from_slice(&u32::MAX.to_be_bytes());
    let crc = ferry_batch::compute_crc(&count);
    count[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(matches!(to_ferry(&count, 1 << 20), Err(RecordsError::Corrupt(_))));
    // Every truncation and every single-byte change either converts or is refused; none panics.
    for cut in 0..good.len() {
        let _ = split_kafka(&good[..cut]).map(|bs| bs.iter().filter(|b| to_ferry(b, 1 << 20).is_ok()).count());
    }
    for at in 0..good.len() {
        let mut b = good.to_vec();
        b[at] = b[at].wrapping_add(0x55);
        let crc = ferry_batch::compute_crc(&b);
        if b.len() > 21 {
            b[17..21].copy_from_slice(&crc.to_be_bytes());
        }
        let _ = split_kafka(&b).map(|bs| bs.iter().filter(|b| to_ferry(b, 1 << 20).is_ok()).count());
    }
}
