//! `AppendWithOffsets` with its batches sent from the buffers that hold them ([`AppendWithOffsetsParts`]).
//!
//! tonic encodes every request into one buffer: the mirror's batches, slices of the buffers they were received in,
//! were copied once more there, about a tenth of the mirror's CPU on a fast link. Here the request body is the
//! gRPC message's frames as they are held: the 5-byte gRPC prefix and the fields before the batches in one small
//! buffer, then each batch as its own frame. HTTP/2 sends a frame of more than a few hundred bytes from its own
//! buffer (vectored writes), so the batches reach the kernel uncopied. Batches shorter than [`OWN_FRAME_MIN`] are
//! copied together into one frame instead: a frame costs more than copying a short batch.
//!
//! Used only without compression: a compressed message is a new buffer anyway. The response is decoded by tonic,
//! as every other answer is.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use ferry_proto as pb;
use http_body::{Body as HttpBody, Frame, SizeHint};
use prost::Message as _;
use tonic::client::GrpcService;
use tonic::codec::{BufferSettings, Streaming};
use tonic::codegen::StdError;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tonic_prost::ProstDecoder;

/// A `ferry.v1.AppendWithOffsetsRequest` whose `batches` field is several buffers. It encodes to exactly the bytes
/// of the generated message with those buffers concatenated (the field is one length-delimited `bytes`), but no
/// request body holding them all is assembled first: the mirror's batches are slices of the buffers they were
/// received in. Without compression the buffers are sent as they are ([`PartsBody`]); with it, each is copied once,
/// into the message tonic compresses. It is only ever encoded; decoding it skips every field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppendWithOffsetsParts {
    /// Target topic.
    pub topic: String,
    /// Target partition.
    pub partition: u32,
    /// The source topic's UUID.
    pub source_topic_id: String,
    /// The source partition's log start offset when these batches were fetched.
    pub source_log_start_offset: u64,
    /// Whole batches, in offset order, back to back across the buffers.
    pub batches: Vec<Bytes>,
}

impl AppendWithOffsetsParts {
    fn batches_len(&self) -> usize {
        self.batches.iter().map(Bytes::len).sum()
    }

    /// Everything the message holds before its batches' bytes: fields 1 to 4, then the batches field's key and
    /// length (left out, as proto3 leaves a default value out, when there are no bytes).
    fn encode_head(&self, buf: &mut impl BufMut) {
        use prost::encoding::{WireType, encode_key, encode_varint, string, uint32, uint64};
        // Field numbers and the proto3 rule of leaving default values out, as in `broker.proto`.
        if !self.topic.is_empty() {
            string::encode(1, &self.topic, buf);
        }
        if self.partition != 0 {
            uint32::encode(2, &self.partition, buf);
        }
        if !self.source_topic_id.is_empty() {
            string::encode(3, &self.source_topic_id, buf);
        }
        if self.source_log_start_offset != 0 {
            uint64::encode(4, &self.source_log_start_offset, buf);
        }
        let len = self.batches_len();
        if len > 0 {
            encode_key(5, WireType::LengthDelimited, buf);
            encode_varint(len as u64, buf);
        }
    }
}

impl prost::Message for AppendWithOffsetsParts {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.encode_head(buf);
        for part in &self.batches {
            buf.put_slice(part);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> std::result::Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        use prost::encoding::{encoded_len_varint, key_len, string, uint32, uint64};
        let mut n = 0;
        if !self.topic.is_empty() {
            n += string::encoded_len(1, &self.topic);
        }
        if self.partition != 0 {
            n += uint32::encoded_len(2, &self.partition);
        }
        if !self.source_topic_id.is_empty() {
            n += string::encoded_len(3, &self.source_topic_id);
        }
        if self.source_log_start_offset != 0 {
            n += uint64::encoded_len(4, &self.source_log_start_offset);
        }
        let len = self.batches_len();
        if len > 0 {
            n += key_len(5) + encoded_len_varint(len as u64) + len;
        }
        n
    }

    fn clear(&mut self) {
        *self = AppendWithOffsetsParts::default();
    }
}

/// Batches at least this long go out as frames of their own, uncopied; shorter ones are copied into a shared frame.
const OWN_FRAME_MIN: usize = 4 << 10;

/// The request body: one gRPC message, as a list of frames.
#[derive(Debug)]
pub(crate) struct PartsBody {
    frames: std::vec::IntoIter<Bytes>,
    remaining: u64,
}

impl PartsBody {
    /// The frames of `request`'s message; refused (`OUT_OF_RANGE`, as tonic refuses a message too large to send)
    /// when the message is longer than `max_message_bytes`.
    pub(crate) fn new(request: &AppendWithOffsetsParts, max_message_bytes: usize) -> Result<PartsBody, Status> {
        let len = request.encoded_len();
        let prefix_len = u32::try_from(len).ok().filter(|_| len <= max_message_bytes).ok_or_else(|| {
            Status::out_of_range(format!(
                "an AppendWithOffsets message of {len} bytes is above this client's limit of {max_message_bytes} \
                 bytes (max_message_bytes)"
            ))
        })?;
        let mut frames = Vec::with_capacity(request.batches.len() + 1);
        let mut pending = BytesMut::with_capacity(128);
        pending.put_u8(0); // not compressed
        pending.put_u32(prefix_len);
        request.encode_head(&mut pending);
        for part in &request.batches {
            if part.len() >= OWN_FRAME_MIN {
                if !pending.is_empty() {
                    frames.push(pending.split().freeze());
                }
                frames.push(part.clone());
            } else {
                pending.extend_from_slice(part);
            }
        }
        if !pending.is_empty() {
            frames.push(pending.freeze());
        }
        Ok(PartsBody { frames: frames.into_iter(), remaining: 5 + len as u64 })
    }
}

impl HttpBody for PartsBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        Poll::Ready(this.frames.next().map(|frame| {
            this.remaining -= frame.len() as u64;
            Ok(Frame::data(frame))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.len() == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// Sends `body` as `AppendWithOffsets` on `service` and decodes the answer, as tonic's unary call does: a
/// trailers-only error answer is that error, and an error in the trailers after the message is too.
pub(crate) async fn append<S>(
    mut service: S,
    body: PartsBody,
    max_message_bytes: usize,
) -> Result<tonic::Response<pb::AppendWithOffsetsResponse>, Status>
where
    S: GrpcService<tonic::body::Body>,
    S::Error: Into<StdError>,
    S::ResponseBody: HttpBody<Data = Bytes> + Send + 'static,
    <S::ResponseBody as HttpBody>::Error: Into<StdError>,
{
    poll_fn(|cx| service.poll_ready(cx))
        .await
        .map_err(|e| Status::unavailable(format!("service was not ready: {}", e.into())))?;
    let request = http::Request::builder()
        .method(http::Method::POST)
        .version(http::Version::HTTP_2)
        .uri("/ferry.v1.Broker/AppendWithOffsets")
        .header(http::header::TE, "trailers")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(tonic::body::Body::new(body))
        .map_err(|e| Status::internal(format!("cannot build the AppendWithOffsets request: {e}")))?;
    let response = service.call(request).await.map_err(|e| Status::from_error(e.into()))?;
    if let Some(status) = Status::from_header_map(response.headers()) {
        if status.code() != Code::Ok {
            return Err(status);
        }
        return Err(Status::internal("missing response message: the answer had no body"));
    }
    let status_code = response.status();
    let (parts, body) = response.into_parts();
    let decoder = ProstDecoder::<pb::AppendWithOffsetsResponse>::new(BufferSettings::default());
    let mut stream = Streaming::new_response(decoder, body, status_code, None, Some(max_message_bytes));
    let message = stream.message().await?.ok_or_else(|| Status::internal("missing response message"))?;
    stream.trailers().await?;
    Ok(tonic::Response::from_parts(MetadataMap::from_headers(parts.headers), message, parts.extensions))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(mut body: PartsBody) -> Vec<Bytes> {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut out = Vec::new();
        let mut hint = body.size_hint().exact().unwrap();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            let data = frame.unwrap().into_data().unwrap();
            hint -= data.len() as u64;
            assert_eq!(body.size_hint().exact(), Some(hint), "the size hint counts down what is left");
            out.push(data);
        }
        assert!(body.is_end_stream());
        assert_eq!(hint, 0);
        out
    }

    /// The frames are the gRPC prefix and the generated message's bytes; each long batch is a frame of its own
    /// holding the very buffer it was given (not a copy), and the short ones between are copied together.
    #[test]
    fn long_batches_go_out_uncopied_and_the_whole_is_the_generated_message() {
        let big = Bytes::from((0..40_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let parts = vec![
            big.slice(..100),
            big.slice(100..200),
            big.slice(200..10_200),
            big.slice(10_200..10_300),
            Bytes::new(),
            big.slice(10_300..30_000),
            big.slice(30_000..30_010),
        ];
        let request = AppendWithOffsetsParts {
            topic: "dc-a.orders".into(),
            partition: 3,
            source_topic_id: "7d5c2f4e".into(),
            source_log_start_offset: 1 << 33,
            batches: parts.clone(),
        };
        let out = frames(PartsBody::new(&request, 1 << 20).unwrap());
        let generated = pb::AppendWithOffsetsRequest {
            topic: request.topic.clone(),
            partition: 3,
            source_topic_id: request.source_topic_id.clone(),
            source_log_start_offset: 1 << 33,
            batches: parts.concat().into(),
        }
        .encode_to_vec();
        let mut want = vec![0u8];
        want.extend_from_slice(&(generated.len() as u32).to_be_bytes());
        want.extend_from_slice(&generated);
        assert_eq!(out.concat(), want);
        // Head and the two short batches; the first long one; the short one after it; the second long one; the
        // last short one.
        let lens: Vec<usize> = out.iter().map(Bytes::len).collect();
        let mut head = BytesMut::new();
        request.encode_head(&mut head);
        assert_eq!(lens, [5 + head.len() + 200, 10_000, 100, 19_700, 10]);
        assert_eq!(out[1].as_ptr(), parts[2].as_ptr(), "a long batch is sent from its own buffer");
        assert_eq!(out[3].as_ptr(), parts[5].as_ptr(), "a long batch is sent from its own buffer");
    }

    #[test]
    fn a_message_above_the_limit_is_refused_before_anything_is_sent() {
        let request = AppendWithOffsetsParts {
            topic: "t".into(),
            batches: vec![Bytes::from(vec![7u8; 5_000]), Bytes::from(vec![8u8; 5_000])],
            ..Default::default()
        };
        let len = request.encoded_len();
        let refused = PartsBody::new(&request, len - 1).unwrap_err();
        assert_eq!(refused.code(), Code::OutOfRange);
        assert!(refused.message().contains(&format!("{len} bytes")), "{}", refused.message());
        assert!(refused.message().contains("max_message_bytes"), "{}", refused.message());
        let out = frames(PartsBody::new(&request, len).unwrap());
        assert_eq!(out.iter().map(Bytes::len).sum::<usize>(), 5 + len);
    }

    /// No batches: the head alone, as the generated message encodes it (the empty field left out).
    #[test]
    fn a_request_without_batches_is_its_head_alone() {
        let request = AppendWithOffsetsParts { topic: "t".into(), batches: vec![Bytes::new()], ..Default::default() };
        let out = frames(PartsBody::new(&request, 1 << 20).unwrap());
        let generated = pb::AppendWithOffsetsRequest { topic: "t".into(), ..Default::default() }.encode_to_vec();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0][5..], generated[..]);
        assert_eq!(out[0][..5], [0, 0, 0, 0, generated.len() as u8]);
    }
}

#[cfg(test)]
mod encode_tests {
    use prost::Message as _;

    use super::*;

    fn generated(parts: &AppendWithOffsetsParts) -> pb::AppendWithOffsetsRequest {
        pb::AppendWithOffsetsRequest {
            topic: parts.topic.clone(),
            partition: parts.partition,
            source_topic_id: parts.source_topic_id.clone(),
            source_log_start_offset: parts.source_log_start_offset,
            batches: parts.batches.concat().into(),
        }
    }

    #[test]
    fn parts_encode_to_the_generated_messages_bytes() {
        let big = Bytes::from((0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let cases = [
            AppendWithOffsetsParts {
                topic: "orders".into(),
                partition: 7,
                source_topic_id: "0b6f3c1e".into(),
                source_log_start_offset: 1 << 40,
                batches: vec![big.slice(..100), big.slice(100..250_000), Bytes::new(), big.slice(250_000..)],
            },
            // Defaults left out, one part, no parts.
            AppendWithOffsetsParts { batches: vec![big.slice(..1)], ..Default::default() },
            AppendWithOffsetsParts { topic: "t".into(), ..Default::default() },
        ];
        for parts in cases {
            let want = generated(&parts).encode_to_vec();
            assert_eq!(parts.encoded_len(), want.len());
            assert_eq!(parts.encode_to_vec(), want);
            let decoded = pb::AppendWithOffsetsRequest::decode(want.as_slice()).unwrap();
            assert_eq!(decoded, generated(&parts));
        }
    }
}
