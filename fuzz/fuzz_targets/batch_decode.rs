//! Feeds arbitrary bytes to every batch decoding entry point: header parsing, verification, the batch iterators
//! (over a slice and over `Bytes`), the typed `Batch` value, the zero-copy splitter and the record decoder. None
//! may panic, loop or allocate without bound.
//!
//! Random bytes rarely pass the CRC, so each input is also tried with its length, magic and CRC fixed up: that
//! takes the record decoder (and the zstd path) into the fuzzer's reach. Records that decode must have strictly
//! increasing offsets, and re-encoding them must give back exactly the same records.
#![no_main]

use bytes::Bytes;
use ferry_batch::{
    self as batch, Batch, BatchHeader, BatchIter, Batches, Compression, HEADER_LEN, LOG_OVERHEAD, MAGIC, ProducerInfo,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = BatchHeader::parse(data);
    let _ = batch::verify(data);
    let _ = batch::decode_records(data);
    for (_, bytes) in BatchIter::new(data).flatten() {
        let _ = batch::verify(bytes);
        let _ = batch::decode_records(bytes);
    }
    let buf = Bytes::copy_from_slice(data);
    let _ = batch::split_verified(&buf);
    for parsed in Batches::new(buf.clone()).flatten() {
        // A batch that passed the header checks agrees with verify on everything but the CRC.
        assert_eq!(parsed.verify_crc().is_ok(), batch::verify(parsed.bytes()).is_ok());
        let _ = batch::decode_records(parsed.bytes());
    }
    for verified in Batches::verified(buf.clone()).flatten() {
        assert_eq!(batch::verify(verified.bytes()).as_ref(), Ok(verified.header()));
    }
    let _ = Batch::parse(buf.clone());
    let _ = Batch::verify(buf);

    if data.len() < HEADER_LEN || data.len() - LOG_OVERHEAD > u32::MAX as usize {
        return;
    }
    let mut fixed = data.to_vec();
    fixed[8..12].copy_from_slice(&((data.len() - LOG_OVERHEAD) as u32).to_be_bytes());
    fixed[16] = MAGIC;
    let crc = batch::compute_crc(&fixed);
    fixed[17..21].copy_from_slice(&crc.to_be_bytes());
    let Ok(records) = batch::decode_records(&fixed) else { return };
    let Ok(header) = BatchHeader::parse(&fixed) else { panic!("a batch that decodes has a header") };
    assert_eq!(records.len(), header.record_count as usize);
    // Offsets strictly increase within a batch (the decoder rejects anything else).
    assert!(records.windows(2).all(|w| w[0].offset < w[1].offset), "decoded offsets must increase");
    for compression in [Compression::None, Compression::Zstd] {
        let again = batch::encode_records(&records, header.epoch, compression, ProducerInfo::NONE);
        assert_eq!(batch::decode_records(&again).as_ref(), Ok(&records), "re-encoding changed the records");
    }
});
