//! A Kafka connection: size-prefixed frames in, one answer per request, in request order.
//!
//! A frame is read only after its size prefix is checked against `kafka.max_request_bytes`, so a request costs at
//! most its own size. What cannot be answered (a size out of bounds, an unknown or unadvertised API key, a version
//! outside the advertised range, bytes that do not decode) closes the connection, as Kafka brokers do; the one
//! exception is ApiVersions at a version above the advertised ones, answered in the v0 layout with
//! UNSUPPORTED_VERSION so that the client can retry at a version both sides know.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::Kafka;
use super::versions::Versions;

/// Bytes of the fixed part of every request header: API key, version, correlation id.
const FIXED_HEADER: usize = 8;

/// What a request frame is.
#[derive(Debug)]
pub enum Decoded {
    /// A request to answer.
    Request {
        /// Its header.
        header: RequestHeader,
        /// Its API.
        key: ApiKey,
        /// Its body.
        body: Box<RequestKind>,
    },
    /// ApiVersions at a version above the advertised ones: answered in the v0 layout with UNSUPPORTED_VERSION.
    UnsupportedApiVersions {
        /// Echoed.
        correlation_id: i32,
    },
    /// Not answerable: the connection is closed, and the reason logged.
    Close(String),
}

/// Decodes one request frame (without its size prefix) against what `versions` advertises. Never panics.
pub fn decode(frame: Bytes, versions: &Versions) -> Decoded {
    if frame.len() < FIXED_HEADER {
        return Decoded::Close(format!("a {}-byte frame is shorter than a request header", frame.len()));
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Ok(key) = ApiKey::try_from(raw_key) else {
        return Decoded::Close(format!("API key {raw_key} is not a Kafka API"));
    };
    let Some((min, max)) = versions.range(raw_key) else {
        return Decoded::Close(format!("{key:?} is not served by this listener (docs/kafka-compat.toml)"));
    };
    if version < min || version > max {
        if key == ApiKey::ApiVersions && version > max {
            return Decoded::UnsupportedApiVersions { correlation_id };
        }
        return Decoded::Close(format!("{key:?} v{version} is outside the served versions {min}..={max}"));
    }
    let mut buf = frame;
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let header = RequestHeader::decode(&mut buf, key.request_header_version(version)).map_err(|e| e.to_string())?;
        let body = RequestKind::decode(key, &mut buf, version).map_err(|e| e.to_string())?;
        Ok::<_, String>((header, body))
    }));
    match decoded {
        Ok(Ok((header, body))) => Decoded::Request { header, key, body: Box::new(body) },
        Ok(Err(e)) => Decoded::Close(format!("a malformed {key:?} v{version} request: {e}")),
        Err(_) => Decoded::Close(format!("a malformed {key:?} v{version} request (the decoder gave up)")),
    }
}

/// The frame (size prefix included) answering `correlation_id` with `body` at `version` of `key`.
pub fn encode(correlation_id: i32, key: ApiKey, version: i16, body: &ResponseKind) -> Result<Bytes, String> {
    let mut out = BytesMut::with_capacity(256);
    out.put_i32(0);
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    header.encode(&mut out, key.response_header_version(version)).map_err(|e| e.to_string())?;
    body.encode(&mut out, version).map_err(|e| format!("{key:?} v{version}: {e}"))?;
    let len = i32::try_from(out.len() - 4).map_err(|_| "a response over 2 GiB".to_owned())?;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Ok(out.freeze())
}

/// The v0-layout answer to an ApiVersions request at a version this listener does not serve.
pub fn unsupported_api_versions(correlation_id: i32, versions: &Versions) -> Result<Bytes, String> {
    let mut r = super::handlers::meta::api_versions(versions);
    r.error_code = ResponseError::UnsupportedVersion.code();
    encode(correlation_id, ApiKey::ApiVersions, 0, &ResponseKind::ApiVersions(r))
}

/// Serves one connection until the peer closes it, it sends what cannot be answered, or `shutdown`.
pub async fn run(kafka: Arc<Kafka>, stream: TcpStream, peer: SocketAddr, shutdown: CancellationToken) {
    let (mut rd, mut wr) = stream.into_split();
    let max = kafka.cfg.max_request_bytes.as_u64();
    loop {
        let size = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = rd.read_i32() => match r {
                Ok(n) => n,
                Err(_) => return,
            },
        };
        if size < FIXED_HEADER as i32 || size as u64 > max {
            tracing::warn!(%peer, size, max, "kafka: a request size outside 8..=kafka.max_request_bytes; connection closed");
            return;
        }
        let mut frame = vec![0u8; size as usize];
        let read = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = rd.read_exact(&mut frame) => r,
        };
        if read.is_err() {
            return;
        }
        let answer = match decode(Bytes::from(frame), &kafka.versions) {
            Decoded::Close(why) => {
                tracing::warn!(%peer, "kafka: {why}; connection closed");
                return;
            }
            Decoded::UnsupportedApiVersions { correlation_id } => {
                unsupported_api_versions(correlation_id, &kafka.versions).map(Some)
            }
            Decoded::Request { header, key, body } => {
                let version = header.request_api_version;
                match super::handlers::handle(&kafka, &header, *body).await {
                    Some(resp) => encode(header.correlation_id, key, version, &resp).map(Some),
                    None => Ok(None),
                }
            }
        };
        match answer {
            Ok(Some(bytes)) => {
                if wr.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(%peer, error = %e, "kafka: a response could not be encoded; connection closed");
                return;
            }
        }
    }
}
