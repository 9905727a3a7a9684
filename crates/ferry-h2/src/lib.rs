//! [`H2Channel`]: the HTTP/2 connection that carries a client's gRPC calls, made with hyper directly.
//!
//! tonic's own channel cannot set the largest frame the *broker* may send (HTTP/2's `SETTINGS_MAX_FRAME_SIZE`,
//! 16 KiB unless the receiver says more). At 16 KiB, a 1 MiB fetch answer arrives as 64 frames, each read from
//! the socket in reads of about 8 KiB, parsed and handed on apart. This channel advertises [`MAX_FRAME`], so the
//! same answer crosses in 8 frames, read in larger reads.
//!
//! Used by every client of the broker (`ferry-client`, so the mirror and `ferryctl` too) and by the broker's
//! members dialling each other.
//!
//! It keeps the behaviour of tonic's channel that the callers rely on:
//! - One connection at a time. A call made after it broke dials again, to the same address.
//! - A call whose dial fails gets `UNAVAILABLE`, with the dial's error as its source: a refused connection stays
//!   visible to `error::is_connect_failure`, so a non-idempotent request is still sent again only when it
//!   provably never left.
//! - Every request's URI gets the scheme and authority of the address.
//!
//! It bounds more than tonic's did: the whole dial (name lookup, TCP connect, TLS handshake, HTTP/2 handshake) is
//! bounded by the connect timeout, not the TCP connect alone, so a broker that accepts and then stays silent (a
//! paused process) costs one connect timeout, not a hung dial.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpSocket, TcpStream};
use tonic::body::Body;

/// The largest HTTP/2 frame this side lets its peer send: 128 KiB.
///
/// Measured on the mirror bench's LAN rounds (1 KiB records, 8 partitions), mirror CPU per 100 MB in rounds
/// where the target kept up: 16 KiB frames 0.108-0.128 s, 64 KiB 0.097-0.101, 128 KiB 0.079-0.093, 256 KiB
/// 0.088-0.098, 1 MiB 0.095-0.106. Larger frames also raised the mirror's peak memory (likely because the decoder
/// copies frames into buffers sized to them, and a batch the mirror keeps as a slice keeps its whole buffer). With 1 MiB frames
/// the peak reached 666 MiB, beyond the default `sync.max_memory` of 512 MiB; with 128 KiB the highest seen was
/// 342 MiB, in a round where the target fell behind (16 KiB: 110 MiB).
pub const MAX_FRAME: u32 = 128 * 1024;

/// The boxed error of a call, as tonic's generated clients take it.
type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How a connection is made and kept.
#[derive(Debug, Clone)]
pub struct Http2Settings {
    /// Bounds the whole dial: name lookup, TCP connect, TLS and HTTP/2 handshakes.
    pub connect_timeout: Duration,
    /// The local address connections leave from (port chosen by the system).
    pub bind: Option<IpAddr>,
    /// The receive window of each call.
    pub stream_window: u32,
    /// The receive window of the whole connection.
    pub connection_window: u32,
    /// How often an HTTP/2 keepalive ping is sent; `None` sends none.
    pub keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is declared dead.
    pub keepalive_timeout: Duration,
    /// Whether pings are sent also while no call is open.
    pub keepalive_while_idle: bool,
}

/// The TLS side of a dial: the trust roots and own identity as rustls configuration, and the name the broker's
/// certificate must carry.
#[derive(Clone)]
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
    domain: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("domain", &self.domain).finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the certificates in `ca_pem` (none: no broker is trusted), presents `identity` (certificate chain
    /// and key, PEM) when given, and expects `domain` in the broker's certificate (default: the address's host).
    /// The error names the part that is wrong, and why.
    pub fn new(
        ca_pem: Option<&[u8]>,
        identity: Option<(&[u8], &[u8])>,
        domain: Option<String>,
    ) -> Result<Self, (TlsPart, String)> {
        let mut roots = rustls::RootCertStore::empty();
        if let Some(pem) = ca_pem {
            for cert in pem_certs(pem).map_err(|e| (TlsPart::Ca, e))? {
                roots.add(cert).map_err(|e| (TlsPart::Ca, e.to_string()))?;
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| (TlsPart::Ca, e.to_string()))?
            .with_root_certificates(roots);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = pem_certs(cert).map_err(|e| (TlsPart::Cert, e))?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| (TlsPart::Key, e.to_string()))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| (TlsPart::Key, e.to_string()))?
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(ClientTls { connector: tokio_rustls::TlsConnector::from(Arc::new(config)), domain })
    }
}

/// The part of a TLS configuration an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPart {
    /// The trusted certificates.
    Ca,
    /// This side's certificate chain.
    Cert,
    /// This side's private key.
    Key,
}

fn pem_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no certificate in the PEM text".into());
    }
    Ok(certs)
}

/// Why a dial failed. Each names the address dialled; the source of `Connect` is the I/O error of the last
/// resolved address tried.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // the messages say what each variant and field is
pub enum DialError {
    #[error("cannot resolve {address}: {source}")]
    Resolve { address: String, source: std::io::Error },
    #[error("{address} resolves to no address of the family of the local bind address {bind}")]
    NoUsableAddress { address: String, bind: IpAddr },
    #[error("cannot connect to {address}: {source}")]
    Connect { address: String, source: std::io::Error },
    #[error("TLS handshake with {address} failed: {source}")]
    Tls { address: String, source: std::io::Error },
    #[error("{address} did not agree to HTTP/2 in the TLS handshake")]
    NotHttp2 { address: String },
    #[error("HTTP/2 handshake with {address} failed: {source}")]
    Http2 { address: String, source: hyper::Error },
    #[error("connecting to {address} took longer than {after:?}")]
    Timeout { address: String, after: Duration },
}

struct DialerInner {
    /// `host:port`, as configured.
    address: String,
    /// `http://host:port` or `https://host:port`: the scheme and authority every request gets.
    origin: http::uri::Parts,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    settings: Http2Settings,
}

/// Makes connections to one address. Cheap to clone.
#[derive(Clone)]
pub struct Dialer {
    inner: Arc<DialerInner>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer").field("address", &self.inner.address).finish_non_exhaustive()
    }
}

impl Dialer {
    /// A dialer of `address` (`host:port`), over `tls` when given. The error says what is wrong with the address.
    pub fn new(address: &str, tls: Option<&ClientTls>, settings: Http2Settings) -> Result<Self, String> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let uri: http::Uri = format!("{scheme}://{address}/").parse().map_err(|e| format!("{e}"))?;
        let host = uri.host().ok_or("no host")?.trim_start_matches('[').trim_end_matches(']').to_owned();
        if uri.port_u16().is_none() {
            return Err("no port".into());
        }
        let tls = match tls {
            None => None,
            Some(t) => {
                let name = t.domain.clone().unwrap_or(host);
                let name = ServerName::try_from(name.clone()).map_err(|e| format!("TLS name {name:?}: {e}"))?;
                Some((t.connector.clone(), name))
            }
        };
        let mut origin = uri.into_parts();
        origin.path_and_query = None;
        Ok(Dialer { inner: Arc::new(DialerInner { address: address.to_owned(), origin, tls, settings }) })
    }

    /// The address this dialer connects to.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// One connection, its driver spawned on the runtime; bounded by the connect timeout.
    async fn dial(&self) -> Result<SendRequest<Body>, DialError> {
        let inner = &self.inner;
        let after = inner.settings.connect_timeout;
        // Boxed: the TLS and HTTP/2 handshakes make a large future, and every caller's future would carry it.
        match tokio::time::timeout(after, Box::pin(self.dial_unbounded())).await {
            Ok(result) => result,
            Err(_) => Err(DialError::Timeout { address: inner.address.clone(), after }),
        }
    }

    async fn dial_unbounded(&self) -> Result<SendRequest<Body>, DialError> {
        let inner = &self.inner;
        let address = || inner.address.clone();
        let tcp = self.tcp().await?;
        let settings = &inner.settings;
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .initial_stream_window_size(settings.stream_window)
            .initial_connection_window_size(settings.connection_window)
            .max_frame_size(MAX_FRAME)
            .keep_alive_interval(settings.keepalive_interval)
            .keep_alive_timeout(settings.keepalive_timeout)
            .keep_alive_while_idle(settings.keepalive_while_idle);
        match &inner.tls {
            None => handshake(&builder, tcp, &inner.address).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|source| DialError::Tls { address: address(), source })?;
                if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                    return Err(DialError::NotHttp2 { address: address() });
                }
                handshake(&builder, tls, &inner.address).await
            }
        }
    }

    /// A TCP connection to the first of the address's resolved addresses that accepts one.
    async fn tcp(&self) -> Result<TcpStream, DialError> {
        let inner = &self.inner;
        let bind = inner.settings.bind;
        let resolved = tokio::net::lookup_host(inner.address.as_str())
            .await
            .map_err(|source| DialError::Resolve { address: inner.address.clone(), source })?;
        let mut last = None;
        for to in resolved {
            if bind.is_some_and(|b| b.is_ipv4() != to.is_ipv4()) {
                continue;
            }
            match connect_from(bind, to).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        Err(match (last, bind) {
            (Some(source), _) => DialError::Connect { address: inner.address.clone(), source },
            (None, Some(bind)) => DialError::NoUsableAddress { address: inner.address.clone(), bind },
            (None, None) => DialError::Resolve {
                address: inner.address.clone(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
            },
        })
    }

    /// `request` with this dialer's scheme and authority.
    fn with_origin(&self, mut request: http::Request<Body>) -> Result<http::Request<Body>, BoxError> {
        let origin = &self.inner.origin;
        let mut parts = http::uri::Parts::default();
        parts.scheme = origin.scheme.clone();
        parts.authority = origin.authority.clone();
        parts.path_and_query = request.uri().path_and_query().cloned();
        *request.uri_mut() = http::Uri::from_parts(parts)?;
        Ok(request)
    }
}

/// The HTTP/2 handshake on `io`; the connection's driver is spawned on the runtime.
async fn handshake<IO>(builder: &Builder<TokioExecutor>, io: IO, address: &str) -> Result<SendRequest<Body>, DialError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, connection) = builder
        .handshake(TokioIo::new(io))
        .await
        .map_err(|source| DialError::Http2 { address: address.to_owned(), source })?;
    let peer = address.to_owned();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(broker = %peer, error = %e, "connection ended");
        }
    });
    Ok(send)
}

async fn connect_from(bind: Option<IpAddr>, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if to.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    if let Some(ip) = bind {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let stream = socket.connect(to).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

struct Shared {
    dialer: Dialer,
    current: parking_lot::Mutex<Option<SendRequest<Body>>>,
    dialing: tokio::sync::Mutex<()>,
}

/// One HTTP/2 connection to one address, dialled again when it broke; a tower service of gRPC requests. Clones
/// share the connection.
#[derive(Clone)]
pub struct H2Channel {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for H2Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Channel").field("address", &self.shared.dialer.inner.address).finish_non_exhaustive()
    }
}

impl H2Channel {
    /// A channel that dials on its first call.
    pub fn lazy(dialer: Dialer) -> Self {
        H2Channel {
            shared: Arc::new(Shared {
                dialer,
                current: parking_lot::Mutex::new(None),
                dialing: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// A channel connected now.
    pub async fn connect(dialer: Dialer) -> Result<Self, DialError> {
        let send = dialer.dial().await?;
        let channel = Self::lazy(dialer);
        *channel.shared.current.lock() = Some(send);
        Ok(channel)
    }

    fn live(&self) -> Option<SendRequest<Body>> {
        self.shared.current.lock().as_ref().filter(|s| !s.is_closed()).cloned()
    }

    /// The open connection, dialling one when there is none or it broke; one dial at a time.
    async fn sender(&self) -> Result<SendRequest<Body>, DialError> {
        if let Some(send) = self.live() {
            return Ok(send);
        }
        let _dialing = self.shared.dialing.lock().await;
        if let Some(send) = self.live() {
            return Ok(send);
        }
        let send = self.shared.dialer.dial().await?;
        *self.shared.current.lock() = Some(send.clone());
        Ok(send)
    }
}

impl tower::Service<http::Request<Body>> for H2Channel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is the connection's, which may need dialling: that happens in the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let channel = self.clone();
        Box::pin(async move {
            let request = channel.shared.dialer.with_origin(request)?;
            let mut send = channel.sender().await.map_err(unavailable)?;
            futures::future::poll_fn(|cx| send.poll_ready(cx)).await?;
            Ok(send.send_request(request).await?.map(Body::new))
        })
    }
}

/// A dial failure as the status a call gets: `UNAVAILABLE`, with the dial error as its source.
fn unavailable(e: DialError) -> BoxError {
    let mut status = tonic::Status::unavailable(e.to_string());
    status.set_source(Arc::new(e));
    Box::new(status)
}

#[cfg(test)]
mod tests;
