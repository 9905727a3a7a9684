//! [`BrokerClient`]: the connection to one of the listed brokers, and the retry rule of every call.
//!
//! Invariants:
//! - At most one live connection at a time; clones of a `BrokerClient` share it (`Arc`), so cloning is cheap.
//! - On a transport failure (UNAVAILABLE, refused or reset connection, keepalive timeout, call timeout) the
//!   connection is dropped and the next call connects through the *next* listed address, wrapping around.
//! - Idempotent calls are retried with backoff (up to `retry.max_attempts`); non-idempotent ones only when the
//!   failure proves the request never left (no connection could be made).
//! - The token travels only inside the interceptor, as a sensitive header value; it is never logged.
//! - Partition leaders: a client remembers the newest leader each partition's NOT_LEADER hints (and the fetch
//!   answers' leader hints, and Metadata) named, by leader epoch, never going back to an older one.
//!   [`BrokerClient::for_partition`] gives the client of that leader: a client of that one address, made once and
//!   shared, with this client's config and token. A transport failure or an unacknowledged write at such a
//!   leader forgets the leaders learnt at its address, so the next call asks the listed brokers again.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ferry_proto::broker_client;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;

use self::routing::Routing;
use crate::config::ClientConfig;
use crate::error::{ClientError, Result, config_err, deepest_cause, is_connect_failure, is_transport_status};
use ferry_h2::{ClientTls, Dialer, H2Channel, Http2Settings, TlsPart};

/// The generated gRPC client with the auth interceptor, message limits and compression applied. Use it for
/// streaming calls (`subscribe`) that the typed wrappers do not cover.
pub type RawClient = broker_client::BrokerClient<InterceptedService<H2Channel, AuthInterceptor>>;

/// Adds `authorization: Bearer <token>` to every request when a token is configured.
#[derive(Clone, Default)]
pub struct AuthInterceptor {
    header: Option<MetadataValue<Ascii>>,
}

impl std::fmt::Debug for AuthInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthInterceptor").field("token", &self.header.as_ref().map(|_| "<redacted>")).finish()
    }
}

impl AuthInterceptor {
    /// An interceptor sending `token` (or nothing).
    pub fn new(token: Option<&str>) -> Result<Self> {
        let header = match token {
            None => None,
            Some(t) => {
                let mut value = MetadataValue::try_from(format!("Bearer {t}"))
                    .map_err(|_| config_err("token", "must be printable ASCII"))?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(AuthInterceptor { header })
    }
}

impl Interceptor for AuthInterceptor {
    fn call(&mut self, mut request: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.header {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

mod routing;

/// The metadata keys of a NOT_LEADER status (the broker's `error::LEADER_*_KEY`).
const LEADER_ADDRESS_KEY: &str = "ferry-leader-address";
const LEADER_EPOCH_KEY: &str = "ferry-leader-epoch";
const LEADER_PARTITION_KEY: &str = "ferry-leader-partition";
const COORDINATOR_GROUP_KEY: &str = "ferry-coordinator-group";
const LEADER_ID_KEY: &str = "ferry-leader-id";
/// How many times one call follows a NOT_LEADER or NOT_COORDINATOR answer to the broker it names, on top of its
/// retry policy's attempts.
const MAX_REDIRECTS: u32 = 3;

/// Where a call's attempts go.
#[derive(Debug, Clone, Copy)]
enum Route<'a> {
    /// The listed brokers.
    Any,
    /// A partition's leader.
    Partition(&'a str, u32),
    /// A group's coordinator.
    Group(&'a str),
}

/// Whether a call may be sent again after a failure whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Sending it twice has the effect of sending it once.
    Idempotent,
    /// Sent again only when it provably never reached a broker.
    Once,
}

/// A failed attempt: the error, and whether the request provably never reached a broker.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: ClientError,
    pub(crate) never_sent: bool,
    /// A NOT_LEADER answer named a leader among the configured brokers: the next attempt goes there, at once.
    pub(crate) redirected: bool,
}

#[derive(Clone)]
pub(crate) struct Conn {
    index: usize,
    generation: u64,
    channel: H2Channel,
    client: RawClient,
}

impl Conn {
    /// The generated client on this connection.
    pub(crate) fn raw(&self) -> RawClient {
        self.client.clone()
    }
}

struct Inner {
    config: ClientConfig,
    /// One per listed broker, in order.
    dialers: Vec<Dialer>,
    /// Built once from the config's PEM files; the leader clients this client makes share it.
    tls: Option<ClientTls>,
    auth: AuthInterceptor,
    current: parking_lot::Mutex<Option<Conn>>,
    connecting: tokio::sync::Mutex<()>,
    next_index: AtomicUsize,
    generation: AtomicU64,
    /// The partition leaders learnt by this client and the clients of their addresses; a leader's client refers
    /// to it weakly, so dropping the client that made it drops them all.
    routing: Weak<Routing>,
    /// Held by the client that made the routing (the one built from the listed brokers).
    _routing: Option<Arc<Routing>>,
}

/// A connection to one of the configured brokers, shared by its clones. See the module docs for the failover and
/// retry rules.
#[derive(Clone)]
pub struct BrokerClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BrokerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerClient")
            .field("brokers", &self.inner.config.brokers)
            .field("current", &self.current_address())
            .finish()
    }
}

impl BrokerClient {
    /// Validates `config` and prepares the dialers without connecting; the first call connects.
    pub fn new(config: ClientConfig) -> Result<Self> {
        config.validate()?;
        let routing = Arc::new(Routing::default());
        let tls = client_tls(&config)?;
        Self::with_routing(config, tls, Arc::downgrade(&routing), Some(routing))
    }

    fn with_routing(
        config: ClientConfig,
        tls: Option<ClientTls>,
        routing: Weak<Routing>,
        owner: Option<Arc<Routing>>,
    ) -> Result<Self> {
        config.validate()?;
        let auth = AuthInterceptor::new(config.token.as_deref())?;
        let dialers =
            config.brokers.iter().map(|addr| build_dialer(&config, tls.as_ref(), addr)).collect::<Result<_>>()?;
        Ok(BrokerClient {
            inner: Arc::new(Inner {
                config,
                dialers,
                tls,
                auth,
                current: parking_lot::Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                next_index: AtomicUsize::new(0),
                generation: AtomicU64::new(0),
                routing,
                _routing: owner,
            }),
        })
    }

    /// [`BrokerClient::new`], then connects to the first reachable broker.
    pub async fn connect(config: ClientConfig) -> Result<Self> {
        let client = Self::new(config)?;
        client.connection().await?;
        Ok(client)
    }

    /// The configuration this client was built with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The address of the broker currently connected, if any.
    pub fn current_address(&self) -> Option<String> {
        self.inner.current.lock().as_ref().map(|c| self.inner.config.brokers[c.index].clone())
    }

    /// The address calls go to next: the connected broker, else the one the next connect starts with.
    pub fn address(&self) -> String {
        self.current_address().unwrap_or_else(|| {
            let i = self.inner.next_index.load(Ordering::Relaxed) % self.inner.config.brokers.len();
            self.inner.config.brokers[i].clone()
        })
    }

    /// The raw generated client on the current connection (connecting first if needed), with the interceptor,
    /// limits and compression applied. For streaming calls; report a broken stream with [`Self::reconnect`].
    pub async fn raw(&self) -> Result<RawClient> {
        Ok(self.connection().await?.client)
    }

    /// The current connection's channel (connecting first if needed), e.g. for the gRPC health client.
    pub async fn channel(&self) -> Result<H2Channel> {
        Ok(self.connection().await?.channel)
    }

    /// Drops the current connection: the next call connects through the next listed broker.
    pub fn reconnect(&self) {
        let generation = self.inner.current.lock().as_ref().map(|c| c.generation);
        if let Some(g) = generation {
            self.invalidate(g);
        }
    }

    async fn connection(&self) -> Result<Conn> {
        if let Some(conn) = self.inner.current.lock().clone() {
            return Ok(conn);
        }
        let _guard = self.inner.connecting.lock().await;
        if let Some(conn) = self.inner.current.lock().clone() {
            return Ok(conn);
        }
        let n = self.inner.dialers.len();
        let start = self.inner.next_index.load(Ordering::Relaxed) % n;
        let mut last_error = String::new();
        for step in 0..n {
            let index = (start + step) % n;
            let address = &self.inner.config.brokers[index];
            match H2Channel::connect(self.inner.dialers[index].clone()).await {
                Ok(channel) => {
                    let generation = self.inner.generation.fetch_add(1, Ordering::Relaxed) + 1;
                    let client = self.make_raw(channel.clone());
                    let conn = Conn { index, generation, channel, client };
                    self.inner.next_index.store(index, Ordering::Relaxed);
                    *self.inner.current.lock() = Some(conn.clone());
                    tracing::debug!(broker = %address, "connected");
                    return Ok(conn);
                }
                Err(e) => {
                    last_error = deepest_cause(&e);
                    tracing::debug!(broker = %address, error = %last_error, "connect failed");
                }
            }
        }
        // Next round starts after the address tried first, so one dead broker does not always go first.
        self.inner.next_index.store((start + 1) % n, Ordering::Relaxed);
        if n == 1 {
            Err(ClientError::Transport { broker: self.inner.config.brokers[0].clone(), message: last_error })
        } else {
            Err(ClientError::Unreachable { brokers: self.inner.config.brokers.join(", "), message: last_error })
        }
    }

    /// `conn`'s channel with this client's credentials.
    fn service(&self, conn: &Conn) -> InterceptedService<H2Channel, AuthInterceptor> {
        InterceptedService::new(conn.channel.clone(), self.inner.auth.clone())
    }

    /// `conn`'s service with this client's credentials and its message limit, for a call whose body is built by
    /// hand (see `parts_call`); `None` when this client compresses, where tonic's codec must encode the message.
    pub(crate) fn uncompressed_service(
        &self,
        conn: &Conn,
    ) -> Option<(InterceptedService<H2Channel, AuthInterceptor>, usize)> {
        let config = &self.inner.config;
        (!config.compression).then(|| (self.service(conn), config.max_message_bytes))
    }

    /// A plain gRPC client on `conn`, with the interceptor, limits and compression of the generated one, for
    /// calls whose messages are encoded by hand (see `parts_call::AppendWithOffsetsParts`).
    pub(crate) fn grpc(&self, conn: &Conn) -> tonic::client::Grpc<InterceptedService<H2Channel, AuthInterceptor>> {
        let config = &self.inner.config;
        let mut grpc = tonic::client::Grpc::new(self.service(conn))
            .max_decoding_message_size(config.max_message_bytes)
            .max_encoding_message_size(config.max_message_bytes);
        if config.compression {
            grpc = grpc.send_compressed(CompressionEncoding::Zstd).accept_compressed(CompressionEncoding::Zstd);
        }
        grpc
    }

    fn make_raw(&self, channel: H2Channel) -> RawClient {
        let config = &self.inner.config;
        let mut client = broker_client::BrokerClient::with_interceptor(channel, self.inner.auth.clone())
            .max_decoding_message_size(config.max_message_bytes)
            .max_encoding_message_size(config.max_message_bytes);
        // Both directions follow the setting: a client that advertises zstd makes the broker compress every
        // response, which costs CPU on a fast local link for nothing. The mirror turns it on for the WAN.
        if config.compression {
            client = client.send_compressed(CompressionEncoding::Zstd).accept_compressed(CompressionEncoding::Zstd);
        }
        client
    }

    fn invalidate(&self, generation: u64) {
        let mut current = self.inner.current.lock();
        if let Some(conn) = current.as_ref()
            && conn.generation == generation
        {
            let n = self.inner.dialers.len();
            self.inner.next_index.store((conn.index + 1) % n, Ordering::Relaxed);
            tracing::debug!(broker = %self.inner.config.brokers[conn.index], "dropping connection after a failure");
            *current = None;
        }
    }

    /// One attempt of a unary call with `timeout`. Transport failures and timeouts drop the connection. `f` gets
    /// the connection: its generated client ([`Conn::raw`]), or a plain gRPC client of it ([`Self::grpc`]).
    pub(crate) async fn attempt<T, F, Fut>(&self, rpc: &'static str, timeout: Duration, f: F) -> Result<T, Failure>
    where
        F: FnOnce(&Conn) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let conn = match self.connection().await {
            Ok(c) => c,
            Err(error) => {
                self.forget_leaders_here();
                return Err(Failure { error, never_sent: true, redirected: false });
            }
        };
        let broker = &self.inner.config.brokers[conn.index];
        match tokio::time::timeout(timeout, f(&conn)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => {
                let transport = is_transport_status(&status);
                let never_sent = transport && is_connect_failure(&status);
                // A raft3 leader that could not get its write acknowledged may have been deposed without knowing
                // it (cut off from etcd): the next attempt goes through another broker, which knows the leader.
                let unacknowledged =
                    status.metadata().get(crate::error::REASON_KEY).is_some_and(|r| r == "not_acknowledged");
                if transport || unacknowledged {
                    self.invalidate(conn.generation);
                    self.forget_leaders_here();
                }
                let redirected = self.follow_leader_hint(&status);
                Err(Failure { error: ClientError::from_status(&status, broker), never_sent, redirected })
            }
            Err(_) => {
                self.invalidate(conn.generation);
                Err(Failure {
                    error: ClientError::Timeout { rpc, broker: broker.clone(), after: timeout },
                    never_sent: false,
                    redirected: false,
                })
            }
        }
    }

    /// A unary call with the retry rule of `retry`; `f` gets the connection, as in [`Self::attempt`].
    pub(crate) async fn call<T, F, Fut>(&self, rpc: &'static str, retry: Retry, timeout: Duration, f: F) -> Result<T>
    where
        F: FnMut(&Conn) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_at(Route::Any, rpc, retry, timeout, f).await
    }

    /// [`Self::call`] about one group: every attempt goes to its coordinator as last learnt
    /// ([`Self::for_group`]), so a NOT_COORDINATOR answer sends the next attempt to the coordinator it names.
    pub(crate) async fn call_group<T, F, Fut>(&self, group: &str, rpc: &'static str, retry: Retry, f: F) -> Result<T>
    where
        F: FnMut(&Conn) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_at(Route::Group(group), rpc, retry, self.request_timeout(), f).await
    }

    /// [`Self::call`] about one partition: every attempt goes to its leader as last learnt
    /// ([`Self::for_partition`]), so a NOT_LEADER answer sends the next attempt to the leader it names.
    pub(crate) async fn call_partition<T, F, Fut>(
        &self,
        topic: &str,
        partition: u32,
        rpc: &'static str,
        retry: Retry,
        f: F,
    ) -> Result<T>
    where
        F: FnMut(&Conn) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_at(Route::Partition(topic, partition), rpc, retry, self.request_timeout(), f).await
    }

    async fn call_at<T, F, Fut>(
        &self,
        route: Route<'_>,
        rpc: &'static str,
        retry: Retry,
        timeout: Duration,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(&Conn) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let policy = self.inner.config.retry;
        let mut backoff = policy.backoff();
        let (mut attempt, mut redirects) = (0u32, 0u32);
        loop {
            let at = match route {
                Route::Any => self.clone(),
                Route::Partition(t, p) => self.for_partition(t, p),
                Route::Group(g) => self.for_group(g),
            };
            match at.attempt(rpc, timeout, &mut f).await {
                Ok(v) => return Ok(v),
                Err(Failure { error, never_sent, redirected }) => {
                    // A redirect to the leader or coordinator an answer named wrote nothing: it is followed even by
                    // a client that makes one attempt, a few times (leadership may move again meanwhile).
                    if redirected && error.nothing_written() && redirects < MAX_REDIRECTS {
                        redirects += 1;
                        tracing::debug!(rpc, %error, redirects, "retrying where the answer pointed");
                        continue;
                    }
                    attempt += 1;
                    let may_retry = error.nothing_written()
                        || match retry {
                            Retry::Idempotent => {
                                error.is_transport() || error.is_timeout() || error.reason() == Some("not_acknowledged")
                            }
                            Retry::Once => never_sent,
                        };
                    if !may_retry || attempt >= policy.max_attempts {
                        return Err(error);
                    }
                    if redirected {
                        tracing::debug!(rpc, %error, attempt, "retrying at the leader");
                        continue;
                    }
                    let delay = backoff.next().unwrap_or(policy.max_backoff);
                    tracing::debug!(rpc, %error, attempt, ?delay, "retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// The unary timeout of this client.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.inner.config.request_timeout
    }

    /// Checks a route: gRPC health of the broker, then Metadata, each bounded by `timeout` (connect included),
    /// one attempt, no retries. For egress probes that must not wait for the RPC timeout.
    pub async fn probe(&self, timeout: Duration) -> Result<ferry_proto::MetadataResponse> {
        let address = self.address();
        let probe = async {
            let conn = self.connection().await?;
            let mut health = tonic_health::pb::health_client::HealthClient::with_interceptor(
                conn.channel.clone(),
                self.inner.auth.clone(),
            );
            let broker = &self.inner.config.brokers[conn.index];
            let status = health
                .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
                .await
                .map_err(|s| {
                    if is_transport_status(&s) {
                        self.invalidate(conn.generation);
                    }
                    ClientError::from_status(&s, broker)
                })?
                .into_inner()
                .status;
            if status != tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
                return Err(ClientError::Status {
                    code: tonic::Code::Unavailable,
                    message: format!("health check answered status {status}, not SERVING"),
                    broker: broker.clone(),
                    reason: None,
                });
            }
            let listener = self.inner.config.listener.clone().unwrap_or_default();
            let answer = self
                .attempt("Metadata", timeout, |conn| {
                    let mut c = conn.raw();
                    async move { c.metadata(ferry_proto::MetadataRequest { topics: Vec::new(), listener }).await }
                })
                .await
                .map_err(|f| f.error)?;
            self.learn_brokers(answer.brokers.iter().map(|b| (b.broker_id, b.address.clone())));
            Ok(answer)
        };
        match tokio::time::timeout(timeout, probe).await {
            Ok(result) => result,
            Err(_) => {
                self.reconnect();
                Err(ClientError::Timeout { rpc: "probe", broker: address, after: timeout })
            }
        }
    }
}

/// The TLS configuration shared by the dialers of every listed broker, when TLS is on.
fn client_tls(config: &ClientConfig) -> Result<Option<ClientTls>> {
    let Some(tls) = &config.tls else { return Ok(None) };
    let ca = tls.ca_file.as_ref().map(|ca| read_pem("tls.ca_file", ca)).transpose()?;
    let identity = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some((read_pem("tls.cert_file", cert)?, read_pem("tls.key_file", key)?)),
        _ => None,
    };
    let identity = identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice()));
    ClientTls::new(ca.as_deref(), identity, tls.domain.clone()).map(Some).map_err(|(part, e)| {
        let field = match part {
            TlsPart::Ca => "tls.ca_file",
            TlsPart::Cert => "tls.cert_file",
            TlsPart::Key => "tls.key_file",
        };
        config_err(field, e)
    })
}

fn build_dialer(config: &ClientConfig, tls: Option<&ClientTls>, address: &str) -> Result<Dialer> {
    let settings = Http2Settings {
        connect_timeout: config.connect_timeout,
        bind: config.bind,
        stream_window: config.stream_window_bytes,
        connection_window: config.connection_window_bytes,
        keepalive_interval: Some(config.keepalive_interval),
        keepalive_timeout: config.keepalive_timeout,
        keepalive_while_idle: true,
    };
    Dialer::new(address, tls, settings).map_err(|e| config_err("brokers", format!("{address:?}: {e}")))
}

fn read_pem(field: &'static str, path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| config_err(field, format!("cannot read {}: {e}", path.display())))
}

#[cfg(test)]
mod tests;
