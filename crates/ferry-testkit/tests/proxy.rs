//! The fault proxy against stand-in servers started here: exact pass-through, cut, blackhole, delay line,
//! throttle and the HTTP/2 response reset.

mod common;

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use common::{Echo, Ended, digest, payload, round_trip};
use ferry_testkit::{Proxy, ProxyMode, wait_until};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Bound on any single wait in these tests; the waits are for events that happen in milliseconds.
const WAIT: Duration = Duration::from_secs(10);
/// How long "nothing arrives" is watched for in the blackhole test (the hang is the thing under test).
const SILENCE: Duration = Duration::from_millis(300);

async fn ping(stream: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
    stream.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(WAIT, stream.read_exact(&mut back)).await.expect("echo answered in time").unwrap();
    back
}

/// A read that must fail: reset (or at least EOF), never data.
async fn expect_reset_or_eof(stream: &mut TcpStream) -> std::io::Result<usize> {
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(WAIT, stream.read(&mut buf)).await.expect("read ended in time");
    if let Ok(n) = r {
        assert_eq!(n, 0, "no data may arrive, got {:?}", &buf[..n]);
    }
    r
}

#[tokio::test]
async fn proxy_passes_exact_bytes_both_ways_and_half_closes() {
    let mut echo = Echo::start().await;
    let proxy = Proxy::start(echo.addr).await.unwrap();
    assert_eq!(proxy.upstream(), echo.addr);
    assert_eq!(proxy.endpoint(), format!("http://{}", proxy.addr()));

    let data = payload(1, 4 * 1024 * 1024 + 17);
    let back = round_trip(TcpStream::connect(proxy.addr()).await.unwrap(), &data).await.unwrap();
    assert_eq!(back.len(), data.len());
    assert_eq!(digest(&back), digest(&data));
    // The client's FIN reached the server, which saw every byte and closed cleanly.
    assert_eq!(echo.ended.recv().await, Some(Ended::Eof { bytes: data.len() as u64 }));

    let stats = proxy.stats();
    assert_eq!(stats.bytes_to_upstream, data.len() as u64);
    assert_eq!(stats.bytes_to_client, data.len() as u64);
    assert_eq!(stats.connections_accepted, 1);
    assert_eq!(stats.resets, 0);
    wait_until("the connection to be released", WAIT, async || proxy.stats().connections_open == 0).await.unwrap();
}

#[tokio::test]
async fn cut_resets_open_and_new_connections_until_restore() {
    let mut echo = Echo::start().await;
    let proxy = Proxy::start(echo.addr).await.unwrap();
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(ping(&mut open, b"before cut").await, b"before cut");

    proxy.cut();
    assert_eq!(proxy.mode(), ProxyMode::Cut);
    let err = expect_reset_or_eof(&mut open).await.expect_err("a cut connection is reset, not closed");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    // The upstream side was reset too.
    assert_eq!(echo.ended.recv().await, Some(Ended::Error(ErrorKind::ConnectionReset)));

    // New connections: accepted and reset at once, never forwarded.
    for _ in 0..3 {
        if let Ok(mut fresh) = TcpStream::connect(proxy.addr()).await {
            let _ = fresh.write_all(b"during cut").await;
            let _ = expect_reset_or_eof(&mut fresh).await;
        }
    }
    assert_eq!(echo.accepted(), 1, "nothing reached the upstream during the cut");
    wait_until("4 resets", WAIT, async || proxy.stats().resets == 4).await.unwrap();

    proxy.restore();
    let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(ping(&mut after, b"after restore").await, b"after restore");
    assert_eq!(echo.accepted(), 2);
}

#[tokio::test]
async fn blackhole_hangs_connections_without_closing_them() {
    let echo = Echo::start().await;
    let proxy = Proxy::start(echo.addr).await.unwrap();
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(ping(&mut open, b"before").await, b"before");

    proxy.blackhole();
    assert_eq!(proxy.mode(), ProxyMode::Blackhole);
    open.write_all(b"into the void").await.unwrap();
    let mut buf = [0u8; 16];
    assert!(
        tokio::time::timeout(SILENCE, open.read(&mut buf)).await.is_err(),
        "an open connection gets no answer and no EOF"
    );

    let mut fresh = TcpStream::connect(proxy.addr()).await.expect("new connections are accepted");
    fresh.write_all(b"hello?").await.unwrap();
    assert!(tokio::time::timeout(SILENCE, fresh.read(&mut buf)).await.is_err(), "a new connection hangs too");
    assert_eq!(echo.accepted(), 1, "a blackholed connection never reaches the upstream");
    // Even a half-close gets no reaction.
    fresh.shutdown().await.unwrap();
    assert!(tokio::time::timeout(SILENCE, fresh.read(&mut buf)).await.is_err(), "the proxy never closes");

    proxy.restore();
    let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(ping(&mut after, b"after restore").await, b"after restore");
    // Connections that went through the blackhole stay dead: bytes were lost, their stream is invalid.
    open.write_all(b"still there?").await.unwrap();
    assert!(tokio::time::timeout(SILENCE, open.read(&mut buf)).await.is_err());
    assert_eq!(proxy.stats().connections_open, 3);
}

#[tokio::test]
async fn delay_adds_latency_both_ways_and_keeps_every_byte() {
    let mut echo = Echo::start().await;
    let proxy = Proxy::start(echo.addr).await.unwrap();
    let delay = Duration::from_millis(100);
    proxy.set_delay(delay);
    assert_eq!(proxy.delay(), delay);

    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    for i in 0..3u8 {
        let started = Instant::now();
        assert_eq!(ping(&mut conn, &[i; 10]).await, [i; 10]);
        let rtt = started.elapsed();
        assert!(rtt >= 2 * delay, "round trip {rtt:?} must include the delay both ways");
    }

    // 32 MiB echoed through a 50 ms delay line arrive whole and in order. How fast (the line pipelines rather than
    // sending one window per round trip) is a speed claim: benches/mirror.rs, phase "proxy", prints it.
    proxy.set_delay(Duration::from_millis(50));
    let data = payload(2, 32 * 1024 * 1024);
    let back = round_trip(TcpStream::connect(proxy.addr()).await.unwrap(), &data).await.unwrap();
    assert_eq!(back.len(), data.len());
    assert_eq!(digest(&back), digest(&data));

    // Turned off, the open connection still carries its bytes.
    proxy.set_delay(Duration::ZERO);
    assert_eq!(ping(&mut conn, b"no delay").await, b"no delay");
    drop(conn);
    let _ = echo.ended.recv().await;
}

#[tokio::test]
async fn throttle_caps_the_rate_of_each_direction() {
    let echo = Echo::start().await;
    let proxy = Proxy::start(echo.addr).await.unwrap();
    let rate = 512 * 1024;
    proxy.set_throttle(Some(rate));
    assert_eq!(proxy.throttle(), Some(rate));

    let len = 1024 * 1024;
    let data = payload(3, len);
    let started = Instant::now();
    let back = round_trip(TcpStream::connect(proxy.addr()).await.unwrap(), &data).await.unwrap();
    let took = started.elapsed();
    assert_eq!(digest(&back), digest(&data));
    // The limit under test, as a lower bound on time: a full bucket lets its burst (a twentieth of a second of
    // traffic) through at once, every other byte waits its 1/rate (proxy/throttle.rs).
    let burst = rate / 20;
    let floor = Duration::from_secs_f64((len as u64 - burst) as f64 / rate as f64);
    println!("1 MiB echoed at 512 KiB/s per direction in {took:?} (floor {floor:?})");
    assert!(took >= floor, "{len} bytes at {rate} B/s took only {took:?}");

    proxy.set_throttle(None);
    assert_eq!(proxy.throttle(), None);
    let back = round_trip(TcpStream::connect(proxy.addr()).await.unwrap(), &data).await.unwrap();
    assert_eq!(digest(&back), digest(&data));
}

/// A fake HTTP/2 server: sends SETTINGS at once; after the first request byte, sends HEADERS and DATA on stream 1;
/// then reads until EOF and reports whether its peer closed.
async fn fake_h2_server() -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let tx = tx.clone();
            tokio::spawn(async move {
                stream.write_all(&settings_frame()).await.unwrap();
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                // The response: the request was handled.
                let _ = stream.write_all(&response_frames()).await;
                // Until the peer goes away.
                let closed = loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break true,
                        Ok(_) => {}
                    }
                };
                let _ = tx.send(closed);
            });
        }
    });
    (addr, rx)
}

fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], frame_type, flags];
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

fn settings_frame() -> Vec<u8> {
    frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100]) // SETTINGS_MAX_CONCURRENT_STREAMS = 100
}

fn response_frames() -> Vec<u8> {
    let mut f = frame(0x1, 0x4, 1, &[0x88]); // HEADERS, END_HEADERS, ":status: 200"
    f.extend(frame(0x0, 0x1, 1, b"answer")); // DATA, END_STREAM
    f
}

#[tokio::test]
async fn reset_next_responses_drops_exactly_n_responses() {
    let (server, mut server_closed) = fake_h2_server().await;
    let proxy = Proxy::start(server).await.unwrap();
    proxy.reset_next_responses(2);
    assert_eq!(proxy.pending_response_resets(), 2);

    for attempt in 1..=2 {
        let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut settings = vec![0u8; settings_frame().len()];
        tokio::time::timeout(WAIT, conn.read_exact(&mut settings)).await.unwrap().unwrap();
        assert_eq!(settings, settings_frame(), "frames before the response pass through");
        conn.write_all(b"request").await.unwrap();
        let err = expect_reset_or_eof(&mut conn).await.expect_err("the response is replaced by a reset");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "attempt {attempt}");
        // The server answered and then lost its connection.
        assert_eq!(tokio::time::timeout(WAIT, server_closed.recv()).await.unwrap(), Some(true));
        assert_eq!(proxy.pending_response_resets(), 2 - attempt);
    }

    // Disarmed: the third request gets its whole answer.
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    conn.write_all(b"request").await.unwrap();
    let mut expected = settings_frame();
    expected.extend(response_frames());
    let mut got = vec![0u8; expected.len()];
    tokio::time::timeout(WAIT, conn.read_exact(&mut got)).await.unwrap().unwrap();
    assert_eq!(got, expected);

    let stats = proxy.stats();
    assert_eq!(stats.response_resets, 2);
    assert_eq!(stats.resets, 2);
}

#[tokio::test]
async fn response_reset_waits_for_the_delayed_prefix_and_ignores_unarmed_connections() {
    let (server, _closed) = fake_h2_server().await;
    let proxy = Proxy::start(server).await.unwrap();
    // An open, unarmed connection gets its answer normally...
    let mut early = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut settings = vec![0u8; settings_frame().len()];
    early.read_exact(&mut settings).await.unwrap();

    // ...and arming later hits the next response on any connection, here through a delay line.
    proxy.set_delay(Duration::from_millis(30));
    proxy.reset_next_responses(1);
    early.write_all(b"request").await.unwrap();
    let err = expect_reset_or_eof(&mut early).await.expect_err("reset");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    assert_eq!(proxy.pending_response_resets(), 0);

    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    conn.write_all(b"request").await.unwrap();
    let mut expected = settings_frame();
    expected.extend(response_frames());
    let mut got = vec![0u8; expected.len()];
    tokio::time::timeout(WAIT, conn.read_exact(&mut got)).await.unwrap().unwrap();
    assert_eq!(got, expected);
}

#[tokio::test]
async fn upstream_down_resets_clients_and_set_upstream_redirects_new_connections() {
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = free.local_addr().unwrap();
    drop(free);
    let proxy = Proxy::start(dead).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    expect_reset_or_eof(&mut conn).await.expect_err("nothing to connect to: reset");

    let echo = Echo::start().await;
    proxy.set_upstream(echo.addr);
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(ping(&mut conn, b"redirected").await, b"redirected");
}

#[tokio::test]
async fn shutdown_closes_every_connection() {
    let echo = Echo::start().await;
    let proxy = Proxy::start(echo.addr).await.unwrap();
    let addr = proxy.addr();
    let mut conn = TcpStream::connect(addr).await.unwrap();
    assert_eq!(ping(&mut conn, b"x").await, b"x");
    proxy.shutdown().await;
    let _ = expect_reset_or_eof(&mut conn).await;
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is gone");
}
