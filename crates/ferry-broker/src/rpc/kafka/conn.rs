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
use kafka_protocol::messages::{
    ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind, SaslAuthenticateResponse, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::core::sasl::{Auth, codes as sasl_codes, plain_password};
use super::versions::Versions;
use super::{GRANT, Kafka};
use crate::rpc::auth::Grant;

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

/// Serves one connection until the peer closes it, it sends what cannot be answered, or `shutdown`: through TLS
/// when `[kafka.tls]` is set (the handshake within `kafka.auth_timeout`).
pub async fn run(kafka: Arc<Kafka>, stream: TcpStream, peer: SocketAddr, shutdown: CancellationToken) {
    match kafka.tls.clone() {
        None => serve(kafka, stream, peer, shutdown).await,
        Some(acceptor) => match tokio::time::timeout(kafka.cfg.auth_timeout, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => serve(kafka, tls, peer, shutdown).await,
            Ok(Err(e)) => tracing::warn!(%peer, error = %e, "kafka: TLS handshake failed; connection closed"),
            Err(_) => tracing::warn!(%peer, "kafka: no TLS handshake within kafka.auth_timeout; connection closed"),
        },
    }
}

/// What the connection does after answering a SASL request.
enum After {
    Continue,
    Close(&'static str),
}

/// Answers a SaslHandshake or SaslAuthenticate (or a bare v0 token), moving the connection's authentication on.
fn sasl(
    kafka: &Kafka,
    auth: &mut Auth,
    grant: &mut Option<Arc<Grant>>,
    body: RequestKind,
    version: i16,
) -> (ResponseKind, After) {
    match body {
        RequestKind::SaslHandshake(r) => {
            let (code, next) = auth.handshake(version, r.mechanism.as_str(), kafka.cfg.sasl);
            *auth = next;
            let mut resp = SaslHandshakeResponse::default();
            resp.error_code = code;
            if kafka.cfg.sasl {
                resp.mechanisms = vec![StrBytes::from_static_str("PLAIN")];
            }
            (ResponseKind::SaslHandshake(resp), After::Continue)
        }
        RequestKind::SaslAuthenticate(r) => {
            let mut resp = SaslAuthenticateResponse::default();
            let found = plain_password(&r.auth_bytes).and_then(|p| kafka.authz.grant_for(p));
            match found {
                Some(g) if *auth == Auth::Authenticate => {
                    *grant = Some(g);
                    *auth = Auth::Done;
                    (ResponseKind::SaslAuthenticate(resp), After::Continue)
                }
                Some(_) => {
                    resp.error_code = sasl_codes::ILLEGAL_SASL_STATE;
                    (ResponseKind::SaslAuthenticate(resp), After::Close("SaslAuthenticate out of order"))
                }
                None => {
                    resp.error_code = sasl_codes::SASL_AUTHENTICATION_FAILED;
                    resp.error_message = Some(StrBytes::from_static_str("authentication failed"));
                    (ResponseKind::SaslAuthenticate(resp), After::Close("SASL/PLAIN authentication failed"))
                }
            }
        }
        _ => (ResponseKind::ApiVersions(Default::default()), After::Close("not a SASL request")),
    }
}

/// Reads one size-prefixed frame: `None` when the connection is done (closed, shutdown, past the deadline, or a
/// size out of bounds).
async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    max: u64,
    peer: SocketAddr,
    deadline: Option<tokio::time::Instant>,
    shutdown: &CancellationToken,
) -> Option<Vec<u8>> {
    let read = async {
        let size = rd.read_i32().await.ok()?;
        if size < FIXED_HEADER as i32 || size as u64 > max {
            tracing::warn!(%peer, size, max, "kafka: a request size outside 8..=kafka.max_request_bytes; connection closed");
            return None;
        }
        let mut frame = vec![0u8; size as usize];
        rd.read_exact(&mut frame).await.ok()?;
        Some(frame)
    };
    let far = tokio::time::Instant::now() + std::time::Duration::from_secs(365 * 24 * 3600);
    tokio::select! {
        _ = shutdown.cancelled() => None,
        _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => {
            tracing::warn!(%peer, "kafka: not authenticated within kafka.auth_timeout; connection closed");
            None
        }
        f = read => f,
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    kafka: Arc<Kafka>,
    stream: S,
    peer: SocketAddr,
    shutdown: CancellationToken,
) {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let max = kafka.cfg.max_request_bytes.as_u64();
    let mut auth = Auth::start(kafka.cfg.sasl);
    let mut grant = kafka.open.clone();
    let deadline = tokio::time::Instant::now() + kafka.cfg.auth_timeout;
    loop {
        let until = (auth != Auth::Done).then_some(deadline);
        let Some(frame) = read_frame(&mut rd, max, peer, until, &shutdown).await else { return };
        if auth == Auth::RawToken {
            // A v0 handshake's bare token: an empty frame answers success; a failure closes.
            match plain_password(&frame).and_then(|p| kafka.authz.grant_for(p)) {
                Some(g) => {
                    grant = Some(g);
                    auth = Auth::Done;
                    if wr.write_all(&0i32.to_be_bytes()).await.is_err() {
                        return;
                    }
                    continue;
                }
                None => {
                    tracing::warn!(%peer, "kafka: SASL/PLAIN authentication failed; connection closed");
                    return;
                }
            }
        }
        let mut close = None;
        let answer = match decode(Bytes::from(frame), &kafka.versions) {
            Decoded::Close(why) => {
                tracing::warn!(%peer, "kafka: {why}; connection closed");
                return;
            }
            Decoded::UnsupportedApiVersions { correlation_id } => {
                unsupported_api_versions(correlation_id, &kafka.versions).map(Some)
            }
            Decoded::Request { key, .. } if !auth.may_serve(key) => {
                tracing::warn!(%peer, request = ?key, "kafka: a request before SASL authentication; connection closed");
                return;
            }
            Decoded::Request { header, key, body } => {
                let version = header.request_api_version;
                let resp = if matches!(key, ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) {
                    let (resp, after) = sasl(&kafka, &mut auth, &mut grant, *body, version);
                    if let After::Close(why) = after {
                        close = Some(why);
                    }
                    Some(resp)
                } else {
                    match grant.clone() {
                        Some(g) => GRANT.scope(g, super::handlers::handle(&kafka, &header, *body)).await,
                        None => super::handlers::handle(&kafka, &header, *body).await,
                    }
                };
                match resp {
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
        if let Some(why) = close {
            tracing::warn!(%peer, "kafka: {why}; connection closed");
            let _ = wr.flush().await;
            return;
        }
    }
}
