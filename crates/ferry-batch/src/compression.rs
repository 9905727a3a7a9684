//! [`Compression`] of a batch's records section, and the zstd calls behind it.

use crate::error::BatchError;
use crate::layout::MAX_DECOMPRESSED_BYTES;

/// Compression of a batch's records section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Stored as is.
    #[default]
    None,
    /// One zstd frame.
    Zstd,
}

impl Compression {
    /// The code stored in the attribute bits.
    pub(crate) fn code(self) -> u16 {
        match self {
            Compression::None => 0,
            Compression::Zstd => 1,
        }
    }

    /// The compression a code in the attribute bits stands for.
    pub(crate) fn from_code(code: u16) -> Result<Self, BatchError> {
        match code {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Zstd),
            other => Err(BatchError::BadCompression(other)),
        }
    }
}

/// Compresses a records section as one zstd frame.
pub(crate) fn compress_zstd(records: &[u8]) -> std::io::Result<Vec<u8>> {
    zstd::bulk::compress(records, 3)
}

/// Decompresses a zstd records section, refusing to grow past [`MAX_DECOMPRESSED_BYTES`].
pub(crate) fn decompress_zstd(section: &[u8]) -> Result<Vec<u8>, BatchError> {
    use std::io::Read;
    let mut decoder = zstd::stream::read::Decoder::new(section).map_err(|e| BatchError::Decompress(e.to_string()))?;
    let mut out = Vec::new();
    let limit = MAX_DECOMPRESSED_BYTES as u64 + 1;
    (&mut decoder).take(limit).read_to_end(&mut out).map_err(|e| BatchError::Decompress(e.to_string()))?;
    if out.len() > MAX_DECOMPRESSED_BYTES {
        return Err(BatchError::Decompress(format!("more than {MAX_DECOMPRESSED_BYTES} bytes")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_refused() {
        for c in [Compression::None, Compression::Zstd] {
            assert_eq!(Compression::from_code(c.code()), Ok(c));
        }
        assert_eq!(Compression::None.code(), 0);
        assert_eq!(Compression::Zstd.code(), 1);
        assert_eq!(Compression::from_code(2), Err(BatchError::BadCompression(2)));
        assert_eq!(Compression::from_code(7), Err(BatchError::BadCompression(7)));
    }

    #[test]
    fn zstd_round_trips_and_garbage_is_a_decompress_error() {
        let plain = b"value value value value value value".repeat(10);
        let packed = compress_zstd(&plain).unwrap();
        assert_eq!(decompress_zstd(&packed).unwrap(), plain);
        assert!(matches!(decompress_zstd(b"not a zstd frame"), Err(BatchError::Decompress(_))));
    }
}
