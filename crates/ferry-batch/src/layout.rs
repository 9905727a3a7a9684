//! Where each field of the fixed header sits (the table is in the crate docs). Every other module reads and
//! writes header fields through these constants, so the layout is spelled once.

/// The format version this crate writes and reads.
pub const MAGIC: u8 = 1;
/// Length of the fixed batch header.
pub const HEADER_LEN: usize = 61;
/// Bytes before the end of the `batch_length` field; `total_len = LOG_OVERHEAD + batch_length`.
pub const LOG_OVERHEAD: usize = 12;
/// First byte covered by the CRC.
pub const CRC_START: usize = 21;
/// Upper bound on a decompressed records section, so a hostile batch cannot make a decoder allocate without limit.
pub const MAX_DECOMPRESSED_BYTES: usize = 256 * 1024 * 1024;

pub(crate) const OFF_BASE_OFFSET: usize = 0;
pub(crate) const OFF_LENGTH: usize = 8;
pub(crate) const OFF_EPOCH: usize = 12;
pub(crate) const OFF_MAGIC: usize = 16;
pub(crate) const OFF_CRC: usize = 17;
pub(crate) const OFF_ATTRIBUTES: usize = 21;
pub(crate) const OFF_LAST_OFFSET_DELTA: usize = 23;
pub(crate) const OFF_FIRST_TS: usize = 27;
pub(crate) const OFF_MAX_TS: usize = 35;
pub(crate) const OFF_PRODUCER_ID: usize = 43;
pub(crate) const OFF_PRODUCER_EPOCH: usize = 51;
pub(crate) const OFF_BASE_SEQUENCE: usize = 53;
pub(crate) const OFF_RECORD_COUNT: usize = 57;

/// Attribute bits that hold the compression code.
pub(crate) const COMPRESSION_MASK: u16 = 0b111;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_tile_the_header_without_gaps() {
        // (offset, size) of every header field in order: each starts where the one before ends.
        let fields = [
            (OFF_BASE_OFFSET, 8),
            (OFF_LENGTH, 4),
            (OFF_EPOCH, 4),
            (OFF_MAGIC, 1),
            (OFF_CRC, 4),
            (OFF_ATTRIBUTES, 2),
            (OFF_LAST_OFFSET_DELTA, 4),
            (OFF_FIRST_TS, 8),
            (OFF_MAX_TS, 8),
            (OFF_PRODUCER_ID, 8),
            (OFF_PRODUCER_EPOCH, 2),
            (OFF_BASE_SEQUENCE, 4),
            (OFF_RECORD_COUNT, 4),
        ];
        let mut at = 0;
        for (offset, size) in fields {
            assert_eq!(offset, at);
            at += size;
        }
        assert_eq!(at, HEADER_LEN);
        assert_eq!(OFF_LENGTH + 4, LOG_OVERHEAD);
        assert_eq!(OFF_CRC + 4, CRC_START);
    }
}
