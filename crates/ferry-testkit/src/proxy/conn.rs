//! One proxied connection: connect upstream, run the two directions, and apply the mode as it changes.
//!
//! Each direction is a reader and a writer joined by a queue bounded in bytes (a semaphore of permits). The
//! reader applies the throttle, stamps each chunk with its due time (read time + delay) and, towards the client,
//! follows HTTP/2 frames for armed response resets. The writer delivers chunks in order at their due time. A
//! connection that sees a blackhole is "poisoned" for good: from then on both directions discard and it never
//! closes by itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::h2::FrameTracker;
use super::{ProxyMode, Shared, lock};

/// Largest chunk read at once.
const CHUNK: usize = 64 * 1024;
/// Bytes a direction may hold queued (read but not yet delivered): bounds memory under a long delay.
const QUEUE_BYTES: usize = 64 * 1024 * 1024;

/// The two directions; the index selects the per-direction counters and throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToUpstream = 0,
    ToClient = 1,
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Both directions finished with a half-close.
    Closed,
    /// The proxy is shutting down.
    Cancelled,
    /// The proxy was cut.
    Cut,
    /// An armed response reset fired.
    ResponseReset,
    /// A peer reset the connection or a write failed.
    PeerFailed,
}

/// A queued unit of one direction.
enum Item {
    Data { bytes: Vec<u8>, due: Instant, _permit: OwnedSemaphorePermit },
    Eof { due: Instant },
    Reset { due: Instant },
}

impl Item {
    fn due(&self) -> Instant {
        match self {
            Item::Data { due, .. } | Item::Eof { due } | Item::Reset { due } => *due,
        }
    }
}

/// What the direction pumps of one connection share.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    shared: &'a Shared,
    poisoned: &'a AtomicBool,
}

impl Ctx<'_> {
    fn poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Relaxed)
    }
}

/// Counts a connection as open for as long as it lives.
struct OpenGuard<'a>(&'a Shared);

impl<'a> OpenGuard<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.open.fetch_add(1, Ordering::Relaxed);
        Self(shared)
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one accepted client connection until it ends or the proxy stops.
pub(super) async fn serve(client: TcpStream, shared: Arc<Shared>, cancel: CancellationToken) {
    let _open = OpenGuard::new(&shared);
    let mut mode = shared.mode.subscribe();
    let arrival = *mode.borrow_and_update();
    match arrival {
        ProxyMode::Cut => {
            reset(&client);
            shared.resets.fetch_add(1, Ordering::Relaxed);
            return;
        }
        ProxyMode::Blackhole => return hang_on_arrival(client, &shared, mode, cancel).await,
        ProxyMode::Forward => {}
    }
    let upstream_addr = *lock(&shared.upstream);
    let connected = tokio::select! {
        () = cancel.cancelled() => return,
        r = TcpStream::connect(upstream_addr) => r,
    };
    let upstream = match connected {
        Ok(upstream) => upstream,
        Err(e) => {
            // The upstream is down: the client sees what it would see connecting directly, a refusal (as RST).
            tracing::debug!(%upstream_addr, error = %e, "proxy: upstream connect failed");
            reset(&client);
            return;
        }
    };
    // Small writes (HTTP/2 frames) must not wait for Nagle; latency is the delay line's job.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    forward(client, upstream, &shared, mode, cancel).await;
}

/// A connection accepted during a blackhole: never connected upstream, discards until cut or shutdown.
async fn hang_on_arrival(
    mut client: TcpStream,
    shared: &Shared,
    mut mode: watch::Receiver<ProxyMode>,
    cancel: CancellationToken,
) {
    let poisoned = AtomicBool::new(true);
    let end = tokio::select! {
        () = cancel.cancelled() => End::Cancelled,
        () = watch_mode(&mut mode, &poisoned) => End::Cut,
        () = discard(&mut client) => End::Cancelled,
    };
    if end == End::Cut {
        reset(&client);
        shared.resets.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs both directions of a connected pair and closes them as the way it ended requires.
async fn forward(
    mut client: TcpStream,
    mut upstream: TcpStream,
    shared: &Shared,
    mut mode: watch::Receiver<ProxyMode>,
    cancel: CancellationToken,
) {
    let poisoned = AtomicBool::new(false);
    let end = {
        let ctx = Ctx { shared, poisoned: &poisoned };
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        let to_upstream = pump(client_read, upstream_write, Dir::ToUpstream, ctx);
        let to_client = pump(upstream_read, client_write, Dir::ToClient, ctx);
        tokio::select! {
            () = cancel.cancelled() => End::Cancelled,
            () = watch_mode(&mut mode, &poisoned) => End::Cut,
            r = async { tokio::try_join!(to_upstream, to_client) } => r.err().unwrap_or(End::Closed),
        }
    };
    match end {
        End::Closed | End::Cancelled => {}
        End::Cut => {
            reset(&client);
            reset(&upstream);
            shared.resets.fetch_add(1, Ordering::Relaxed);
        }
        End::ResponseReset => {
            // The client must not see the answer; the upstream just loses its peer.
            reset(&client);
            shared.resets.fetch_add(1, Ordering::Relaxed);
            shared.response_resets.fetch_add(1, Ordering::Relaxed);
        }
        End::PeerFailed => {
            reset(&client);
            reset(&upstream);
        }
    }
}

/// Follows the mode: returns on a cut, marks the connection poisoned on a blackhole.
async fn watch_mode(mode: &mut watch::Receiver<ProxyMode>, poisoned: &AtomicBool) {
    loop {
        match *mode.borrow_and_update() {
            ProxyMode::Cut => return,
            ProxyMode::Blackhole => poisoned.store(true, Ordering::Relaxed),
            ProxyMode::Forward => {}
        }
        if mode.changed().await.is_err() {
            // The proxy is gone; its cancellation ends the connection.
            std::future::pending::<()>().await;
        }
    }
}

/// Reads and drops everything; after EOF or an error, waits forever (a blackhole never closes).
async fn discard(reader: &mut (impl AsyncRead + Unpin)) {
    let mut buf = vec![0u8; CHUNK];
    while let Ok(n) = reader.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
    std::future::pending::<()>().await;
}

/// Moves one direction: reader -> queue -> writer.
async fn pump(
    mut reader: impl AsyncRead + Unpin,
    mut writer: impl AsyncWrite + Unpin,
    dir: Dir,
    ctx: Ctx<'_>,
) -> Result<(), End> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Item>();
    let queue = Arc::new(Semaphore::new(QUEUE_BYTES));
    let shared = ctx.shared;

    let read_side = async move {
        let mut buf = vec![0u8; CHUNK];
        let mut frames = FrameTracker::default();
        loop {
            let read = reader.read(&mut buf).await;
            if ctx.poisoned() {
                match read {
                    Ok(n) if n > 0 => continue,
                    _ => return hang().await,
                }
            }
            let n = match read {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(?dir, error = %e, "proxy: read failed");
                    return Err(End::PeerFailed);
                }
            };
            if n == 0 {
                let _ = tx.send(Item::Eof { due: Instant::now() + shared.delay() });
                return Ok(());
            }
            let mut data = &buf[..n];
            let mut reset_here = false;
            if dir == Dir::ToClient
                && let Some(at) = frames.scan(data, || shared.take_response_reset())
            {
                data = &data[..at];
                reset_here = true;
            }
            if !data.is_empty() {
                shared.throttle[dir as usize].take(data.len()).await;
                // n <= CHUNK, so the cast is lossless; the semaphore is never closed.
                let Ok(permit) = queue.clone().acquire_many_owned(data.len() as u32).await else { return Ok(()) };
                let item = Item::Data { bytes: data.to_vec(), due: Instant::now() + shared.delay(), _permit: permit };
                if tx.send(item).is_err() {
                    // The writer already ended with an error, which try_join reports.
                    return Ok(());
                }
            }
            if reset_here {
                let _ = tx.send(Item::Reset { due: Instant::now() + shared.delay() });
                return Ok(());
            }
        }
    };

    let write_side = async move {
        while let Some(item) = rx.recv().await {
            let due = item.due();
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            if dir == Dir::ToClient {
                shared.responses_released().await;
            }
            match item {
                Item::Data { bytes, .. } => {
                    if ctx.poisoned() {
                        continue;
                    }
                    if let Err(e) = writer.write_all(&bytes).await {
                        if ctx.poisoned() {
                            return hang().await;
                        }
                        tracing::debug!(?dir, error = %e, "proxy: write failed");
                        return Err(End::PeerFailed);
                    }
                    shared.bytes[dir as usize].fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
                Item::Eof { .. } => {
                    if ctx.poisoned() {
                        return hang().await;
                    }
                    // Pass the half-close on; a failure here means the peer is gone, which its reader reports.
                    let _ = writer.shutdown().await;
                    return Ok(());
                }
                Item::Reset { .. } => return Err(End::ResponseReset),
            }
        }
        Ok(())
    };

    tokio::try_join!(read_side, write_side).map(|_| ())
}

/// Never completes: a poisoned direction neither forwards nor closes.
async fn hang() -> Result<(), End> {
    std::future::pending().await
}

/// Arranges for the socket to send RST instead of FIN when it is dropped.
fn reset(stream: &TcpStream) {
    // Fails only if the socket is already broken, in which case the peer sees an error anyway.
    let _ = stream.set_zero_linger();
}
