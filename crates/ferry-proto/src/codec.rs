//! The gRPC codec of every generated client and server ([`SizedCodec`]): prost's, except that a message is encoded
//! into a buffer reserved at its encoded length.
//!
//! tonic starts each message's buffer at 8 KiB and lets it grow as the message is written, doubling. A fetch answer
//! or an append of a mebibyte of batches then moves through about seven reallocations, and the bytes written
//! before each are copied again: nearly one more copy of the whole message on top of the one encoding makes. The
//! length is known before encoding (prost computes it from the fields' lengths without touching the payloads), so
//! the buffer is grown once.

use std::marker::PhantomData;

use prost::Message;
use prost::bytes::BufMut;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::ProstDecoder;

/// prost's codec with buffers reserved at the message's encoded length. Decoding is prost's.
#[derive(Debug)]
pub struct SizedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SizedCodec<T, U> {
    fn default() -> Self {
        SizedCodec(PhantomData)
    }
}

impl<T, U> Codec for SizedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SizedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::default())
    }
}

/// Encodes a message into a buffer first reserved at its encoded length.
#[derive(Debug)]
pub struct SizedEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        encode_sized(&item, buf)
    }
}

/// A buffer that can be grown ahead of writing.
trait Reserve: BufMut {
    fn reserve_more(&mut self, additional: usize);
}

impl Reserve for EncodeBuf<'_> {
    fn reserve_more(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

/// Reserves `item`'s encoded length in `buf`, then encodes it.
fn encode_sized(item: &impl Message, buf: &mut impl Reserve) -> Result<(), Status> {
    buf.reserve_more(item.encoded_len());
    item.encode(buf).map_err(|e| Status::internal(format!("cannot encode the message: {e}")))
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use prost::bytes::buf::UninitSlice;
    use prost::bytes::{BufMut, Bytes, BytesMut};

    use super::{Reserve, encode_sized};
    use crate::v1 as pb;

    /// A buffer that writes as tonic's `EncodeBuf` does (through `chunk_mut`, one chunk at a time, growing the
    /// `BytesMut` when it is full) and counts how often its allocation moved.
    struct Chunked {
        buf: BytesMut,
        moves: usize,
    }

    // SAFETY: every method delegates to `BytesMut`'s, which keeps `BufMut`'s contract; counting changes nothing.
    #[allow(unsafe_code)]
    unsafe impl BufMut for Chunked {
        fn remaining_mut(&self) -> usize {
            self.buf.remaining_mut()
        }

        unsafe fn advance_mut(&mut self, cnt: usize) {
            // SAFETY: the caller's promise (`cnt` bytes of the last chunk initialised) is passed on unchanged.
            unsafe { self.buf.advance_mut(cnt) }
        }

        fn chunk_mut(&mut self) -> &mut UninitSlice {
            if self.buf.capacity() == self.buf.len() {
                self.moves += 1;
            }
            self.buf.chunk_mut()
        }
    }

    impl Reserve for Chunked {
        fn reserve_more(&mut self, additional: usize) {
            if self.buf.capacity() - self.buf.len() < additional {
                self.moves += 1;
            }
            self.buf.reserve(additional);
        }
    }

    fn message(batches: &Bytes) -> pb::FetchResponse {
        pb::FetchResponse {
            partitions: vec![pb::PartitionData {
                topic: "orders".into(),
                partition: 3,
                batches: batches.clone(),
                log_end_offset: 42,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// The bytes are prost's own encoding, written into one allocation made before the first byte; prost's
    /// encoding alone, into the same buffer, moves it again and again as it grows.
    #[test]
    fn a_message_is_encoded_as_prost_encodes_it_into_one_reservation() {
        let batches = Bytes::from((0..3_000_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let message = message(&batches);
        let mut sized = Chunked { buf: BytesMut::with_capacity(8 << 10), moves: 0 };
        encode_sized(&message, &mut sized).unwrap();
        assert_eq!(sized.buf.as_ref(), message.encode_to_vec().as_slice());
        assert_eq!(sized.moves, 1, "one reservation");
        let mut grown = Chunked { buf: BytesMut::with_capacity(8 << 10), moves: 0 };
        message.encode(&mut grown).unwrap();
        assert_eq!(grown.buf, sized.buf);
        assert!(grown.moves >= 8, "prost alone grows the buffer {} times from 8 KiB to 3 MB", grown.moves);
        let decoded = pb::FetchResponse::decode(sized.buf.freeze()).unwrap();
        assert_eq!(decoded, message);
        assert_eq!(decoded.partitions[0].batches, batches);
    }
}
