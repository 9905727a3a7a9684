//! [`Compression`] of a batch's records section, and the zstd calls behind it.

use crate::error::BatchError;
use crate::layout::MAX_DECOMPRESSED_BYTES;

/// The least decode limit, whatever `max_batch_bytes` is: 4 MiB.
pub const MIN_DECODE_LIMIT: usize = 4 * 1024 * 1024;

/// The most decompressed bytes one decode may hold for a broker (or client) whose largest batch is
/// `max_batch_bytes`: `max(2 x max_batch_bytes, 4 MiB)`, and never above [`MAX_DECOMPRESSED_BYTES`]. A batch is
/// built from records of at most `max_batch_bytes` before compression, so a real one always fits.
pub fn decode_limit(max_batch_bytes: u64) -> usize {
    let twice = usize::try_from(max_batch_bytes.saturating_mul(2)).unwrap_or(usize::MAX);
    twice.clamp(MIN_DECODE_LIMIT, MAX_DECOMPRESSED_BYTES)
}

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

/// Decompressed bytes read from the decoder at a time.
const CHUNK: usize = 64 * 1024;

/// Decompresses a zstd records section as a stream, holding at most `limit` bytes of output (its buffer never
/// grows past `limit`): past it, decompression stops with [`BatchError::InflatesPastLimit`], however much the
/// frame would inflate to. The decoder's window, which a frame header chooses, is capped at `limit` too.
pub(crate) fn decompress_zstd(section: &[u8], limit: usize) -> Result<Vec<u8>, BatchError> {
    use std::io::{ErrorKind, Read};
    let failed = |e: std::io::Error| BatchError::Decompress(e.to_string());
    let mut decoder = zstd::stream::read::Decoder::new(section).map_err(failed)?;
    // The smallest window log that covers the limit (zstd's own range is 10..=31; more than 27 needs a flag).
    let window_log = (usize::BITS - limit.saturating_sub(1).leading_zeros()).clamp(10, 27);
    decoder.window_log_max(window_log).map_err(failed)?;
    let mut out: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = match decoder.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(failed(e)),
        };
        if out.len() + n > limit {
            return Err(BatchError::InflatesPastLimit { limit });
        }
        if out.capacity() - out.len() < n {
            // Grow by doubling, as a Vec does, but never past the limit.
            let want = (out.capacity() * 2).max(out.len() + n).min(limit);
            out.reserve_exact(want - out.len());
        }
        out.extend_from_slice(&chunk[..n]);
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
        assert_eq!(decompress_zstd(&packed, plain.len()).unwrap(), plain);
        assert_eq!(
            decompress_zstd(&packed, plain.len() - 1),
            Err(BatchError::InflatesPastLimit { limit: plain.len() - 1 })
        );
        assert!(matches!(decompress_zstd(b"not a zstd frame", 1 << 20), Err(BatchError::Decompress(_))));
    }

    #[test]
    fn the_decode_limit_is_twice_the_batch_limit_and_at_least_4_mib() {
        assert_eq!(decode_limit(1024), MIN_DECODE_LIMIT);
        assert_eq!(decode_limit(2 * 1024 * 1024), MIN_DECODE_LIMIT);
        assert_eq!(decode_limit(16 * 1024 * 1024), 32 * 1024 * 1024);
        assert_eq!(decode_limit(u64::MAX), MAX_DECOMPRESSED_BYTES);
    }
}
