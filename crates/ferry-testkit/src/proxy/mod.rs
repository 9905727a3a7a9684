//! [`Proxy`]: an in-process, fault-injecting TCP proxy for one upstream, to put on a link (e.g. the mirror's
//! route to the source broker) and break it on command.
//!
//! Written here rather than taken from a crate: the faults needed (an HTTP/2-aware one-shot reset, a delay line
//! that does not limit bandwidth, runtime switching that also hits open connections) are not offered together by
//! an in-process Rust proxy crate; the rate limit itself is `governor`.
//!
//! Faults are switched at runtime through `&self` methods and affect open connections as well as new ones:
//! - **mode** — exactly one of forward (normal), [`Proxy::cut`], [`Proxy::blackhole`]; [`Proxy::restore`] goes
//!   back to forward;
//! - **delay** ([`Proxy::set_delay`]) and **throttle** ([`Proxy::set_throttle`]) — independent of the mode and of
//!   each other, left as they are by `restore`;
//! - **response resets** ([`Proxy::reset_next_responses`]) — a one-shot budget;
//! - **held responses** ([`Proxy::hold_responses`]) — what the upstream sends waits until released, while
//!   requests still flow.
//!
//! Per connection and direction, a reader moves chunks (up to 64 KiB) into a queue bounded at 64 MiB (per
//! connection and direction) and a writer delivers them in order, each at its read time plus the delay; so the
//! delay adds latency without limiting bandwidth (up to 64 MiB in flight per direction of a connection). Half-closes (FIN) travel the same queue, so they keep their
//! place; a reset (RST) from one peer is passed on to the other as a reset.
//!
//! All tasks stop when the `Proxy` is dropped (or [`Proxy::shutdown`]); the connections they hold close then.

mod conn;
mod h2;
mod throttle;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::error::{Error, Result};
use throttle::Throttle;

/// The proxy's mode; see [`Proxy::cut`], [`Proxy::blackhole`], [`Proxy::restore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Bytes are forwarded (subject to delay and throttle).
    Forward,
    /// Connections are reset; new ones are reset right after accept.
    Cut,
    /// Nothing is forwarded and nothing is closed; connections hang.
    Blackhole,
}

/// A snapshot of the proxy's counters, all since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyStats {
    /// Bytes written to the upstream (client -> upstream direction).
    pub bytes_to_upstream: u64,
    /// Bytes written to clients (upstream -> client direction).
    pub bytes_to_client: u64,
    /// Connections accepted from clients, including ones reset or blackholed on arrival.
    pub connections_accepted: u64,
    /// Connections currently held open by the proxy (forwarding or hanging).
    pub connections_open: u64,
    /// Resets the proxy injected: connections reset by a cut (open or on arrival) and by a response reset. Resets
    /// passed on from a peer, and failed upstream connects, are not counted.
    pub resets: u64,
    /// Response resets done by [`Proxy::reset_next_responses`] (also counted in `resets`).
    pub response_resets: u64,
}

/// A fault-injecting TCP proxy listening on `127.0.0.1:{random port}`; see the module docs.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    _stop_on_drop: DropGuard,
}

/// State shared by the accept loop, every connection task and the `Proxy` handle.
pub(crate) struct Shared {
    upstream: Mutex<SocketAddr>,
    mode: watch::Sender<ProxyMode>,
    delay_nanos: AtomicU64,
    /// Index 0: client -> upstream; 1: upstream -> client.
    throttle: [Throttle; 2],
    response_reset_budget: AtomicU64,
    /// While true, nothing is delivered towards the client.
    held: watch::Sender<bool>,
    bytes: [AtomicU64; 2],
    accepted: AtomicU64,
    open: AtomicU64,
    resets: AtomicU64,
    response_resets: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("upstream", &*lock(&self.upstream)).finish_non_exhaustive()
    }
}

impl Proxy {
    /// Starts a proxy to `upstream`, listening on `127.0.0.1:0` (see [`Proxy::addr`]). Must be called inside
    /// a tokio runtime. The upstream need not be up yet: connections made while it is down are reset.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let listener = TcpListener::bind(bind).await.map_err(|source| Error::Net {
            action: "bind proxy listener on",
            addr: bind.to_string(),
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| Error::Net {
            action: "read the address of proxy listener",
            addr: bind.to_string(),
            source,
        })?;
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream),
            mode: watch::Sender::new(ProxyMode::Forward),
            delay_nanos: AtomicU64::new(0),
            throttle: Default::default(),
            response_reset_budget: AtomicU64::new(0),
            held: watch::Sender::new(false),
            bytes: Default::default(),
            accepted: AtomicU64::new(0),
            open: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            response_resets: AtomicU64::new(0),
        });
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        tracker.spawn(accept_loop(listener, shared.clone(), tracker.clone(), cancel.clone()));
        tracing::debug!(%addr, %upstream, "proxy started");
        Ok(Self { addr, shared, tracker, _stop_on_drop: cancel.clone().drop_guard(), cancel })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{addr}`, for gRPC clients.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The upstream new connections go to.
    pub fn upstream(&self) -> SocketAddr {
        *lock(&self.shared.upstream)
    }

    /// Points new connections at another upstream; open connections keep theirs.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *lock(&self.shared.upstream) = upstream;
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.shared.mode.borrow()
    }

    /// Cuts the link: every open connection is reset on both sides (SO_LINGER 0, so the peers get RST, not FIN),
    /// and every new connection is accepted and reset at once (a client's connect may succeed; its first read
    /// fails or sees EOF). Lasts until [`Proxy::restore`].
    pub fn cut(&self) {
        self.set_mode(ProxyMode::Cut);
    }

    /// Blackholes the link: nothing is forwarded, nothing is answered, nothing is closed. Open connections stop
    /// forwarding in both directions and read and discard whatever arrives; new connections are accepted and
    /// treated the same, without connecting upstream. A connection that was blackholed stays dead, discarding and
    /// never closing, even after [`Proxy::restore`] (bytes were lost, so its stream can never be valid again): a
    /// client must notice (timeouts, HTTP/2 keepalive) and reconnect. Only a later [`Proxy::cut`] or dropping the
    /// proxy closes such connections.
    pub fn blackhole(&self) {
        self.set_mode(ProxyMode::Blackhole);
    }

    /// Ends a cut or blackhole: new connections are forwarded again. Delay, throttle and armed response resets are
    /// left as they are.
    pub fn restore(&self) {
        self.set_mode(ProxyMode::Forward);
    }

    /// Sets the one-way delay applied to each direction: every chunk is delivered `delay` after the proxy read
    /// it, in order, without limiting bandwidth. Applies to chunks read from now on, on open and new connections.
    /// `Duration::ZERO` turns it off. A round trip through the proxy gains at least 2x `delay`.
    pub fn set_delay(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.shared.delay_nanos.store(nanos, Ordering::Relaxed);
    }

    /// The current one-way delay.
    pub fn delay(&self) -> Duration {
        self.shared.delay()
    }

    /// Limits bandwidth to `bytes_per_sec` in each direction separately; `None` removes the limit. Each
    /// direction's limit is shared by all connections of the proxy (two connections each get about half). Applies
    /// to open and new connections. Meant for slow links (up to tens of MB/s); see the `throttle` module docs.
    pub fn set_throttle(&self, bytes_per_sec: Option<u64>) {
        for t in &self.shared.throttle {
            t.set(bytes_per_sec);
        }
    }

    /// The current throttle.
    pub fn throttle(&self) -> Option<u64> {
        self.shared.throttle[0].rate()
    }

    /// Arms `n` response resets, replacing any still armed. For an HTTP/2 upstream (a gRPC broker): the proxy
    /// follows the frames the upstream sends, and when a HEADERS frame on a non-zero stream arrives (the server
    /// finished handling a request and starts answering it), it does not forward that frame: it resets the client
    /// connection (RST) and closes the upstream connection, and uses up one of the `n`. Bytes before that frame
    /// are delivered first; if the frame header was split across reads, the client may get up to 8 of its bytes,
    /// never the whole frame. Other requests in flight on the same connection lose their answers too. Once `n`
    /// resets are done, traffic flows normally. Arm this only on proxies whose upstream speaks HTTP/2.
    pub fn reset_next_responses(&self, n: u64) {
        self.shared.response_reset_budget.store(n, Ordering::SeqCst);
    }

    /// Holds everything the upstream sends, on open and new connections: it is read and queued (up to the
    /// per-direction queue bound) but delivered to the client only after [`Proxy::release_responses`], in order.
    /// Requests still reach the upstream. For a gRPC client this means requests are served while no answer
    /// arrives, as over a link whose return path stalled.
    pub fn hold_responses(&self) {
        self.shared.held.send_replace(true);
    }

    /// Delivers what was held, and everything after it, as before [`Proxy::hold_responses`].
    pub fn release_responses(&self) {
        self.shared.held.send_replace(false);
    }

    /// How many armed response resets are still to happen.
    pub fn pending_response_resets(&self) -> u64 {
        self.shared.response_reset_budget.load(Ordering::SeqCst)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ProxyStats {
        let s = &self.shared;
        ProxyStats {
            bytes_to_upstream: s.bytes[0].load(Ordering::Relaxed),
            bytes_to_client: s.bytes[1].load(Ordering::Relaxed),
            connections_accepted: s.accepted.load(Ordering::Relaxed),
            connections_open: s.open.load(Ordering::Relaxed),
            resets: s.resets.load(Ordering::Relaxed),
            response_resets: s.response_resets.load(Ordering::Relaxed),
        }
    }

    /// Stops the proxy and waits until all its tasks have ended and its connections are closed. Dropping the
    /// proxy stops it too, without waiting.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }

    fn set_mode(&self, mode: ProxyMode) {
        tracing::debug!(proxy = %self.addr, ?mode, "proxy mode");
        self.shared.mode.send_replace(mode);
    }
}

impl Shared {
    pub(crate) fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::Relaxed))
    }

    /// Waits while responses are held.
    pub(crate) async fn responses_released(&self) {
        let mut held = self.held.subscribe();
        // The sender lives in `self`: the wait can only end by a release.
        let _ = held.wait_for(|h| !*h).await;
    }

    /// Uses up one armed response reset, if any.
    pub(crate) fn take_response_reset(&self) -> bool {
        self.response_reset_budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, tracker: TaskTracker, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((client, _peer)) => {
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                tracker.spawn(conn::serve(client, shared.clone(), cancel.clone()));
            }
            Err(e) => {
                // E.g. out of file descriptors: back off briefly instead of spinning.
                tracing::warn!(error = %e, "proxy accept failed");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
            }
        }
    }
}

/// Locks a mutex, ignoring poisoning: the guarded values are plain data that a panic cannot leave half-updated.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
