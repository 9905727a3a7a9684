//! Stand-ins for the testkit's own tests: a TCP echo server that reports how each connection ended, seeded
//! payloads with digests, and stand-in scripts for the broker and mirror binaries.

#![allow(dead_code)] // each test file uses a different part of this module

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::{RngCore as _, SeedableRng as _};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// How an echo connection ended, seen from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The client half-closed; everything was echoed.
    Eof { bytes: u64 },
    /// A read or write failed.
    Error(std::io::ErrorKind),
}

/// A TCP echo server on 127.0.0.1:0 that copies every byte back and half-closes after the client's EOF.
pub struct Echo {
    pub addr: SocketAddr,
    pub accepted: std::sync::Arc<AtomicU64>,
    pub ended: mpsc::UnboundedReceiver<Ended>,
}

impl Echo {
    pub async fn start() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = std::sync::Arc::new(AtomicU64::new(0));
        let (tx, ended) = mpsc::unbounded_channel();
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let tx = tx.clone();
                tokio::spawn(async move {
                    let outcome = echo(&mut stream).await;
                    let _ = tx.send(outcome);
                });
            }
        });
        Echo { addr, accepted, ended }
    }

    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn echo(stream: &mut TcpStream) -> Ended {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => {
                let _ = stream.shutdown().await;
                return Ended::Eof { bytes: total };
            }
            Ok(n) => {
                if let Err(e) = stream.write_all(&buf[..n]).await {
                    return Ended::Error(e.kind());
                }
                total += n as u64;
            }
            Err(e) => return Ended::Error(e.kind()),
        }
    }
}

/// `len` pseudo-random bytes from `seed`.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    data
}

/// SHA-256 of `data`.
pub fn digest(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Writes `data` on `stream`, half-closes, and reads everything back until EOF (concurrently, so a large
/// payload never deadlocks on full socket buffers). Returns what was read.
pub async fn round_trip(stream: TcpStream, data: &[u8]) -> std::io::Result<Vec<u8>> {
    let (mut r, mut w) = stream.into_split();
    let write = async {
        w.write_all(data).await?;
        w.shutdown().await
    };
    let read = async {
        let mut back = Vec::with_capacity(data.len());
        r.read_to_end(&mut back).await?;
        Ok::<_, std::io::Error>(back)
    };
    let ((), back) = tokio::try_join!(write, read)?;
    Ok(back)
}

/// A stand-in for `ferry-broker`: takes the broker's flags, listens on `--listen`, writes the bound address to
/// `--addr-file` (via a rename), counts its runs in `{data-dir}/runs`, greets every connection with
/// `hello from {cluster-id}\n`, logs to stdout and stderr, and exits 0 on SIGTERM. `STANDIN_MODE` changes it:
/// `fail` prints 80 numbered lines and exits 3; `hang` never listens; `ignore-term` ignores SIGTERM.
pub const BROKER_STANDIN: &str = r#"#!/usr/bin/env python3
import os, signal, socket, sys, time
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1]
print("standin args: " + " ".join(args), flush=True)
print("standin config: " + open(opt("--config")).read().replace("\n", "|"), flush=True)
print("standin stderr works", file=sys.stderr, flush=True)
mode = os.environ.get("STANDIN_MODE", "")
if mode == "fail":
    for i in range(1, 81):
        print("noise line %d" % i, flush=True)
    print("fatal: bad config key storage.flsh", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "hang":
    signal.pause()
def on_term(*_):
    print("got SIGTERM, shutting down", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore-term" else on_term)
signal.signal(signal.SIGHUP, lambda *_: print("got SIGHUP", flush=True))
host, port = opt("--listen").rsplit(":", 1)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, int(port)))
s.listen(16)
runs_file = os.path.join(opt("--data-dir"), "runs")
runs = int(open(runs_file).read()) + 1 if os.path.exists(runs_file) else 1
open(runs_file, "w").write(str(runs))
addr = "%s:%d" % s.getsockname()
with open(opt("--addr-file") + ".tmp", "w") as f:
    f.write(addr + "\n")
os.rename(opt("--addr-file") + ".tmp", opt("--addr-file"))
print("listening on %s, run %d, env STANDIN_GREETING=%s" % (addr, runs, os.environ.get("STANDIN_GREETING")), flush=True)
while True:
    c, _ = s.accept()
    c.sendall(("hello from %s\n" % opt("--cluster-id")).encode())
    c.close()
"#;

/// A stand-in for `ferry-mirror`: reads `--config`, listens on the `listen = "..."` address in it, writes the
/// bound address to `--addr-file`, answers every HTTP request with `name=<name from config>
/// token=<FERRY_MONITOR_TOKEN>`, re-reads the config on SIGHUP (logging `reloaded name=...`), and exits 0 on
/// SIGTERM.
pub const MIRROR_STANDIN: &str = r#"#!/usr/bin/env python3
import os, re, signal, socket, sys
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1]
def load():
    text = open(opt("--config")).read()
    return re.search(r'name = "([^"]*)"', text).group(1), re.search(r'listen = "([^"]*)"', text).group(1)
name, listen = load()
def on_hup(*_):
    global name
    name = load()[0]
    print("reloaded name=" + name, flush=True)
def on_term(*_):
    print("got SIGTERM, committing offsets", flush=True)
    sys.exit(0)
signal.signal(signal.SIGHUP, on_hup)
signal.signal(signal.SIGTERM, on_term)
host, port = listen.rsplit(":", 1)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, int(port)))
s.listen(16)
addr = "%s:%d" % s.getsockname()
with open(opt("--addr-file") + ".tmp", "w") as f:
    f.write(addr)
os.rename(opt("--addr-file") + ".tmp", opt("--addr-file"))
print("monitor on %s, cwd %s" % (addr, os.getcwd()), flush=True)
while True:
    c, _ = s.accept()
    try:
        c.recv(4096)
        body = "name=%s token=%s" % (name, os.environ.get("FERRY_MONITOR_TOKEN"))
        c.sendall(("HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    except OSError:
        pass
    c.close()
"#;

/// Writes the stand-in scripts once per test binary and returns (broker, mirror) paths.
pub fn standins() -> &'static (PathBuf, PathBuf) {
    static PATHS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    PATHS.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt as _;
        // Shared by concurrently running test processes: each writes a private file and renames it into place,
        // so nobody ever executes a half-written script.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ferry-testkit-standins");
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
            std::fs::write(&tmp, text).unwrap();
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
            path
        };
        (write("ferry-broker", BROKER_STANDIN), write("ferry-mirror", MIRROR_STANDIN))
    })
}

/// Sends `GET /` over HTTP/1.0 and returns the body.
pub async fn http_get(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n").await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default())
}
