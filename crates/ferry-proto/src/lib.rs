//! Ferry's wire protocol: `proto/broker.proto` (package `ferry.v1`) and the tonic/prost code generated from it.
//!
//! Nothing else lives here, apart from the rules both ends of a connection must agree on: how large a gRPC
//! message may be, given the broker's `max_batch_bytes` ([`max_message_bytes`]), which partition a key maps
//! to ([`partition_for_key`]), how a ListOffsets answer is laid out in columns ([`columns`]), and the codec every
//! generated client and server uses ([`codec::SizedCodec`]).

#![allow(missing_docs, clippy::all)]

/// Generated types of package `ferry.v1`.
pub mod v1 {
    tonic::include_proto!("ferry.v1");
}

pub use v1::*;

pub mod codec;
pub mod columns;

/// Bytes reserved in every gRPC message for framing and fields other than batch payloads.
pub const MESSAGE_OVERHEAD_BYTES: usize = 1024 * 1024;

/// The gRPC message size limit that server and client both apply, so that tonic's 4 MiB default never caps a
/// batch silently: room for a fetch or produce of `max_batch_bytes` worth of batches, twice over, plus overhead.
pub const fn max_message_bytes(max_batch_bytes: usize) -> usize {
    max_batch_bytes.saturating_mul(2).saturating_add(MESSAGE_OVERHEAD_BYTES)
}

/// The documented, stable key partitioner shared by the broker (produce by key) and the client:
/// the 32-bit FNV-1a hash of the key bytes, taken unsigned modulo the partition count (Zeze's
/// `remainderUnsigned(hash, partitionCount)`). Changing it would move keys between partitions, so it never changes.
///
/// `partitions` must be at least 1; 0 is treated as 1.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for &b in key {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitioner_is_fnv1a_mod_n() {
        // Reference values of 32-bit FNV-1a.
        assert_eq!(partition_for_key(b"", u32::MAX), 0x811c_9dc5 % u32::MAX);
        assert_eq!(partition_for_key(b"a", u32::MAX), 0xe40c_292c % u32::MAX);
        assert_eq!(partition_for_key(b"foobar", u32::MAX), 0xbf9c_f968 % u32::MAX);
        assert_eq!(partition_for_key(b"foobar", 4), 0xbf9c_f968 % 4);
        assert_eq!(partition_for_key(b"x", 0), 0);
    }
}
