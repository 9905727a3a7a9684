//! A decompression bomb: a zstd batch of a few KiB that claims u32::MAX records and inflates to 256 MiB. The
//! bounded decoder refuses it holding at most its limit, measured as the growth of the process's peak resident set
//! (nextest runs this test in its own process, and zeros that were never touched are not resident, so only what
//! the decoder writes counts).

use ferry_batch::{
    BatchBuilder, BatchError, Compression, HEADER_LEN, MIN_DECODE_LIMIT, ProducerInfo, compute_crc, decode_limit,
    decode_records, decode_records_bounded, verify,
};

/// The process's peak resident set (`VmHWM`), in bytes.
fn peak_rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("a VmHWM line");
    let kib: usize = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmHWM in kB");
    kib * 1024
}

/// Byte positions of the header fields rewritten here (the table in the crate docs).
const OFF_LENGTH: usize = 8;
const OFF_CRC: usize = 17;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_RECORD_COUNT: usize = 57;

/// A zstd frame of `blocks` RLE blocks of 128 KiB of zeros each: 4 bytes per block on the wire.
fn rle_frame(blocks: usize) -> Vec<u8> {
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd];
    // Frame header descriptor: no content size, no checksum, no dictionary, not single-segment; then a window
    // descriptor of 2^17 bytes (exponent 7, mantissa 0).
    f.extend_from_slice(&[0x00, 7 << 3]);
    for i in 0..blocks {
        let last = u32::from(i + 1 == blocks);
        let block_header = (128 * 1024) << 3 | (1 << 1) | last;
        f.extend_from_slice(&block_header.to_le_bytes()[..3]);
        f.push(0);
    }
    f
}

/// A well-formed zstd batch whose records section is replaced by `section`, claiming `record_count` records
/// (dense, so it passes every header check), with a valid CRC.
fn with_section(section: &[u8], record_count: u32) -> Vec<u8> {
    let mut b = BatchBuilder::new(Compression::Zstd, ProducerInfo::NONE);
    b.push(0, 1_700_000_000_000, None, Some(b"v"), &[]);
    let mut batch = b.build(0, 0)[..HEADER_LEN].to_vec();
    batch.extend_from_slice(section);
    let length = u32::try_from(batch.len() - 12).unwrap();
    batch[OFF_LENGTH..OFF_LENGTH + 4].copy_from_slice(&length.to_be_bytes());
    batch[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&(record_count - 1).to_be_bytes());
    batch[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&record_count.to_be_bytes());
    let crc = compute_crc(&batch);
    batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    batch
}

#[test]
fn a_zstd_bomb_is_refused_at_the_decode_limit_without_inflating() {
    // 2,048 blocks of 128 KiB: 256 MiB of zeros from an 8 KiB section.
    let bomb = with_section(&rle_frame(2048), u32::MAX);
    assert!(bomb.len() < 9 * 1024, "{} bytes", bomb.len());
    let header = verify(&bomb).expect("the bomb passes every header check");
    assert_eq!((header.record_count, header.last_offset_delta), (u32::MAX, u32::MAX - 1));
    header.check_dense().expect("and is dense, as produce requires");

    let limit = decode_limit(1024 * 1024);
    assert_eq!(limit, MIN_DECODE_LIMIT);
    let before = peak_rss();
    assert_eq!(decode_records_bounded(&bomb, limit), Err(BatchError::InflatesPastLimit { limit }));
    let grew = peak_rss().saturating_sub(before);
    // The output buffer never grows past the limit; besides it the decoder holds its context, its window (128 KiB
    // here) and a read chunk. Unbounded, the peak would grow by 256 MiB.
    assert!(grew <= limit + 4 * 1024 * 1024, "the peak RSS grew by {grew} bytes; the decode limit is {limit}");

    // A bomb that fits the limit but claims more records than its body can hold stops before decoding them.
    let small = with_section(&rle_frame(8), u32::MAX);
    assert_eq!(
        decode_records_bounded(&small, limit),
        Err(BatchError::Malformed { what: "record count larger than the records section can hold", position: 1 << 20 })
    );
    // The default decoder (256 MiB ceiling) makes the same record-count check.
    assert!(matches!(decode_records(&small), Err(BatchError::Malformed { .. })));

    // A real compressed batch still decodes under the limit.
    let mut b = BatchBuilder::new(Compression::Zstd, ProducerInfo::NONE);
    for i in 0..1000u32 {
        b.push(i, 1_700_000_000_000 + i64::from(i), Some(b"key"), Some(&[b'x'; 900]), &[]);
    }
    let real = b.build(0, 0);
    let records = decode_records_bounded(&real, limit).unwrap();
    assert_eq!(records.len(), 1000);
    assert_eq!(records[999].offset, 999);
    assert_eq!(records[999].value.as_deref(), Some(&[b'x'; 900][..]));
}
