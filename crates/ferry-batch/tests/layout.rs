//! The batch layout, byte for byte. Batches written by one version are read by every other (on disk after an
//! upgrade, on the wire between a new client and an old broker, between the two DCs of a mirror), so the layout
//! documented in the crate docs and in docs/broker.md is pinned here by a hand-written batch: any change to a
//! field's position, width, byte order, the CRC's coverage or the record encoding fails this test.

use bytes::Bytes;
use ferry_batch::{
    Batch, BatchBuilder, BatchHeader, Batches, Compression, Header, ProducerInfo, Record, decode_records,
    set_base_offset, set_epoch, verify,
};

const FIRST_TS: i64 = 1_700_000_000_000; // 0x0000_018b_cfe5_6800
const MAX_TS: i64 = FIRST_TS + 1000; // 0x0000_018b_cfe5_6be8

/// Two records, written out by hand from the layout table.
#[rustfmt::skip]
const BATCH: [u8; 84] = [
    // 0: base_offset u64
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
    // 8: batch_length u32 = 84 - 12
    0x00, 0x00, 0x00, 0x48,
    // 12: partition_epoch u32
    0x0a, 0x0b, 0x0c, 0x0d,
    // 16: magic u8
    0x01,
    // 17: crc u32, CRC-32C of bytes 21..84
    0x03, 0xb2, 0x7b, 0x3c,
    // 21: attributes u16 (no compression)
    0x00, 0x00,
    // 23: last_offset_delta u32
    0x00, 0x00, 0x00, 0x02,
    // 27: first_timestamp i64
    0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00,
    // 35: max_timestamp i64
    0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x6b, 0xe8,
    // 43: producer_id i64
    0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
    // 51: producer_epoch i16
    0x21, 0x22,
    // 53: base_sequence i32
    0x31, 0x32, 0x33, 0x34,
    // 57: record_count u32
    0x00, 0x00, 0x00, 0x02,
    // 61: record 0: length 12, attributes, timestamp_delta zigzag(0), offset_delta 0,
    //     key zigzag(1) "k", value zigzag(1) "v", 1 header: key 1 "h", value zigzag(1) "x"
    0x0c, 0x00, 0x00, 0x00, 0x02, b'k', 0x02, b'v', 0x01, 0x01, b'h', 0x02, b'x',
    // 74: record 1: length 9, attributes, timestamp_delta zigzag(1000) = 2000, offset_delta 2,
    //     null key zigzag(-1), value zigzag(2) "vv", 0 headers
    0x09, 0x00, 0xd0, 0x0f, 0x02, 0x01, 0x04, b'v', b'v', 0x00,
];

fn records() -> Vec<Record> {
    vec![
        Record {
            offset: 0x0102_0304_0506_0708,
            timestamp: FIRST_TS,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"v")),
            headers: vec![Header { key: "h".into(), value: Some(Bytes::from_static(b"x")) }],
        },
        Record {
            offset: 0x0102_0304_0506_070a,
            timestamp: MAX_TS,
            key: None,
            value: Some(Bytes::from_static(b"vv")),
            headers: vec![],
        },
    ]
}

const PRODUCER: ProducerInfo =
    ProducerInfo { producer_id: 0x1112_1314_1516_1718, producer_epoch: 0x2122, base_sequence: 0x3132_3334 };

#[test]
fn the_builder_writes_the_documented_layout_byte_for_byte() {
    let mut builder = BatchBuilder::new(Compression::None, PRODUCER);
    for r in &records() {
        builder.push_record(0x0102_0304_0506_0708, r);
    }
    let built = builder.build(0x0102_0304_0506_0708, 0x0a0b_0c0d);
    assert_eq!(&built[..], &BATCH[..]);
}

#[test]
fn the_documented_layout_reads_back_field_by_field() {
    let header = verify(&BATCH).unwrap();
    assert_eq!(
        header,
        BatchHeader {
            base_offset: 0x0102_0304_0506_0708,
            batch_length: 72,
            epoch: 0x0a0b_0c0d,
            magic: 1,
            crc: 0x03b2_7b3c,
            attributes: 0,
            last_offset_delta: 2,
            first_timestamp: FIRST_TS,
            max_timestamp: MAX_TS,
            producer_id: 0x1112_1314_1516_1718,
            producer_epoch: 0x2122,
            base_sequence: 0x3132_3334,
            record_count: 2,
        }
    );
    assert_eq!(header.total_len(), 84);
    assert_eq!(decode_records(&BATCH).unwrap(), records());

    let batch = Batch::verify(Bytes::from_static(&BATCH)).unwrap();
    assert_eq!(*batch.header(), header);
    assert_eq!(
        (batch.base_offset(), batch.last_offset(), batch.next_offset(), batch.epoch()),
        (0x0102_0304_0506_0708, 0x0102_0304_0506_070a, 0x0102_0304_0506_070b, 0x0a0b_0c0d)
    );
    assert_eq!((batch.record_count(), batch.max_timestamp(), batch.len()), (2, MAX_TS, 84));
    let twice = Bytes::from([BATCH, BATCH].concat());
    let offsets: Vec<u64> = Batches::verified(twice).map(|b| b.unwrap().base_offset()).collect();
    assert_eq!(offsets, [0x0102_0304_0506_0708, 0x0102_0304_0506_0708]);
}

#[test]
fn stamping_writes_bytes_0_to_8_and_12_to_16_and_keeps_the_crc() {
    let mut stamped = BATCH;
    set_base_offset(&mut stamped, 0xa1a2_a3a4_a5a6_a7a8);
    set_epoch(&mut stamped, 0xb1b2_b3b4);
    assert_eq!(stamped[0..8], [0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8]);
    assert_eq!(stamped[12..16], [0xb1, 0xb2, 0xb3, 0xb4]);
    assert_eq!(stamped[8..12], BATCH[8..12]);
    assert_eq!(stamped[16..], BATCH[16..]);
    assert!(verify(&stamped).is_ok(), "base offset and epoch are outside the CRC");
}
