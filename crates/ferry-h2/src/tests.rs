use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tower::Service as _;

use super::*;

fn settings(connect_timeout: Duration) -> Http2Settings {
    Http2Settings {
        connect_timeout,
        bind: None,
        stream_window: 3 * 1024 * 1024,
        connection_window: 7 * 1024 * 1024,
        keepalive_interval: None,
        keepalive_timeout: Duration::from_secs(20),
        keepalive_while_idle: false,
    }
}

fn request() -> http::Request<Body> {
    http::Request::builder().uri("/ferry.v1.Broker/Metadata").body(Body::empty()).unwrap()
}

/// The SETTINGS the channel opens its connection with, read off the wire by a bare TCP listener: the client
/// preface, then a SETTINGS frame whose payload is (identifier, value) pairs.
#[tokio::test]
async fn the_connection_lets_the_broker_send_frames_of_128_kib_and_opens_the_configured_windows() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let dialer = Dialer::new(&address, None, settings(Duration::from_secs(5))).unwrap();
    let (channel, accepted) = tokio::join!(H2Channel::connect(dialer), listener.accept());
    let _channel = channel.unwrap();
    let (mut socket, _) = accepted.unwrap();
    let mut preface = [0u8; 24];
    socket.read_exact(&mut preface).await.unwrap();
    assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    let mut header = [0u8; 9];
    socket.read_exact(&mut header).await.unwrap();
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    assert_eq!((header[3], header[4]), (0x4, 0), "a SETTINGS frame, not an acknowledgement");
    let mut payload = vec![0u8; length];
    socket.read_exact(&mut payload).await.unwrap();
    let pairs: Vec<(u16, u32)> = payload
        .chunks_exact(6)
        .map(|c| (u16::from_be_bytes([c[0], c[1]]), u32::from_be_bytes([c[2], c[3], c[4], c[5]])))
        .collect();
    // SETTINGS_INITIAL_WINDOW_SIZE (4) and SETTINGS_MAX_FRAME_SIZE (5).
    assert!(pairs.contains(&(0x4, 3 * 1024 * 1024)), "{pairs:?}");
    assert!(pairs.contains(&(0x5, MAX_FRAME)), "{pairs:?}");
    assert_eq!(MAX_FRAME, 128 * 1024);
}

/// A refused dial is UNAVAILABLE, and the refusal stays in its source chain: the client's retry rule tells from
/// it that the request never left.
#[tokio::test]
async fn a_refused_dial_is_unavailable_and_provably_never_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let dialer = Dialer::new(&address, None, settings(Duration::from_secs(5))).unwrap();
    let error = H2Channel::connect(dialer.clone()).await.unwrap_err();
    assert!(
        matches!(&error, DialError::Connect { source, .. } if source.kind() == std::io::ErrorKind::ConnectionRefused)
    );

    let mut channel = H2Channel::lazy(dialer);
    let error = channel.call(request()).await.unwrap_err();
    let status = tonic::Status::from_error(error);
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().starts_with(&format!("cannot connect to {address}: ")), "{}", status.message());
    // What the client's `is_connect_failure` looks for: the refusal, somewhere in the chain.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&status);
    let mut refused = false;
    while let Some(err) = cause {
        refused |=
            err.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        cause = err.source();
    }
    assert!(refused, "the refusal is in the status's source chain");
}

/// A broker that accepts the TCP connection and then says nothing (a paused process) costs one connect timeout:
/// the TLS handshake is inside the bound.
#[tokio::test]
async fn a_silent_peer_costs_one_connect_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let tls = ClientTls::new(None, None, Some("broker.test".into())).unwrap();
    let timeout = Duration::from_millis(300);
    let dialer = Dialer::new(&address, Some(&tls), settings(timeout)).unwrap();
    let (result, accepted) = tokio::join!(H2Channel::connect(dialer), listener.accept());
    let _held_open = accepted.unwrap();
    match result {
        Err(DialError::Timeout { address: a, after }) => assert_eq!((a, after), (address, timeout)),
        other => panic!("expected a dial timeout, got {other:?}"),
    }
}

#[test]
fn bad_addresses_and_pem_text_are_refused_with_what_is_wrong() {
    let s = settings(Duration::from_secs(1));
    assert_eq!(Dialer::new("127.0.0.1", None, s.clone()).unwrap_err(), "no port");
    assert!(Dialer::new("bad host:1", None, s.clone()).is_err());
    assert_eq!(Dialer::new("[::1]:7411", None, s).unwrap().address(), "[::1]:7411");
    let (part, message) = ClientTls::new(Some(b"not pem"), None, None).unwrap_err();
    assert_eq!((part, message.as_str()), (TlsPart::Ca, "no certificate in the PEM text"));
}

/// A lazy channel (a broker's client of a peer) whose connection broke dials again on the next call, to the same
/// address: a real HTTP/2 server answers each call with the number of the connection it came on.
#[tokio::test]
async fn a_broken_connection_is_dialled_again_by_the_next_call() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (conn_tx, mut conn_rx) = tokio::sync::mpsc::unbounded_channel();
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let service =
                hyper::service::service_fn(move |_request: http::Request<hyper::body::Incoming>| async move {
                    let response = http::Response::builder().header("x-connection", n.to_string()).body(Body::empty());
                    Ok::<_, std::convert::Infallible>(response.unwrap())
                });
            let serving = tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(socket), service),
            );
            conn_tx.send(serving).unwrap();
        }
    });
    let connection = |r: &http::Response<Body>| r.headers()["x-connection"].to_str().unwrap().to_owned();
    let mut channel = H2Channel::lazy(Dialer::new(&address, None, settings(Duration::from_secs(5))).unwrap());
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "a lazy channel dials on its first call");
    assert_eq!(connection(&channel.call(request()).await.unwrap()), "0");
    assert_eq!(connection(&channel.call(request()).await.unwrap()), "0", "calls share the connection");

    // The server drops connection 0; the channel sees it closed, and the next call dials connection 1.
    conn_rx.recv().await.unwrap().abort();
    tokio::time::timeout(Duration::from_secs(5), async {
        while channel.live().is_some() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the channel notices its connection closed");
    assert_eq!(connection(&channel.call(request()).await.unwrap()), "1");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}
