//! The process layer against stand-in scripts (see `common`): start and readiness, log capture, kill9,
//! terminate, restart on the same port with the same data dir, signals, config rewrite, and the errors with the
//! log tail.

mod common;

use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::time::Duration;

use common::{http_get, standins};
use ferry_testkit::{BrokerProcess, ChildProcess, ChildSpec, Error, MirrorProcess, Signal, wait_until};
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(10);

async fn greeting(addr: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}

fn runs(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("runs")).unwrap()
}

#[tokio::test]
async fn broker_starts_restarts_on_the_same_port_and_keeps_its_data_dir() {
    let (broker_bin, _) = standins();
    let mut broker = BrokerProcess::builder()
        .program(broker_bin)
        .cluster_id("dc-a")
        .config("[storage]\nflush = \"sync\"\n")
        .env("STANDIN_GREETING", "hi")
        .start()
        .await
        .unwrap();
    let addr = broker.addr();
    assert!(addr.ip().is_loopback());
    assert_ne!(addr.port(), 0);
    assert_eq!(broker.endpoint(), format!("http://127.0.0.1:{}", addr.port()));
    assert_eq!(broker.cluster_id(), "dc-a");
    assert!(broker.data_dir().starts_with(broker.dir()));
    assert_eq!(std::fs::read_to_string(broker.config_path()).unwrap(), "[storage]\nflush = \"sync\"\n");
    assert_eq!(greeting(addr).await, "hello from dc-a\n");
    assert!(broker.is_running());
    assert_eq!(runs(broker.data_dir()), "1");

    let logs = broker.logs();
    let expected_args = format!(
        "standin args: --config {} --listen 127.0.0.1:0 --data-dir {} --cluster-id dc-a --addr-file {}",
        broker.config_path().display(),
        broker.data_dir().display(),
        broker.dir().join("addr").display()
    );
    assert!(logs.contains(&expected_args), "{logs}");
    assert!(logs.contains("standin config: [storage]|flush = \"sync\"|"), "{logs}");
    assert!(logs.contains("standin stderr works"), "stderr is captured: {logs}");
    assert!(logs.contains("env STANDIN_GREETING=hi"), "env is passed: {logs}");
    assert!(logs.starts_with("==== testkit: run 1 of ferry-broker:"), "{logs}");

    // Crash and restart: same port, same data dir.
    let first_pid = broker.pid();
    let status = broker.kill9().await.unwrap();
    assert_eq!(status.signal(), Some(Signal::KILL.as_raw()));
    assert!(!broker.is_running());
    broker.restart().await.unwrap();
    assert_eq!(broker.addr(), addr);
    assert_ne!(broker.pid(), first_pid);
    assert_eq!(runs(broker.data_dir()), "2");
    assert_eq!(greeting(addr).await, "hello from dc-a\n");
    let logs = broker.logs();
    assert!(logs.contains(&format!("--listen 127.0.0.1:{}", addr.port())), "restart pins the port: {logs}");
    assert!(logs.contains("==== testkit: run 2 of ferry-broker:"), "{logs}");

    // Graceful stop and restart.
    let status = broker.terminate(WAIT).await.unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(broker.logs().contains("got SIGTERM, shutting down"));
    broker.restart().await.unwrap();
    assert_eq!(broker.addr(), addr);
    assert_eq!(runs(broker.data_dir()), "3");

    broker.send_signal(Signal::HUP).unwrap();
    wait_until("the broker to log SIGHUP", WAIT, async || broker.logs().contains("got SIGHUP")).await.unwrap();
}

#[tokio::test]
async fn a_reused_data_dir_is_passed_and_kept() {
    let (broker_bin, _) = standins();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("runs"), "41").unwrap();
    let mut broker = BrokerProcess::builder().program(broker_bin).data_dir(data.path()).start().await.unwrap();
    assert_eq!(broker.data_dir(), data.path());
    assert!(broker.cluster_id().starts_with("test-cluster-"));
    assert_eq!(runs(data.path()), "42");
    broker.kill9().await.unwrap();
    drop(broker);
    assert_eq!(runs(data.path()), "42", "the kit never deletes a data dir it was given");
}

#[tokio::test]
async fn early_exit_is_an_error_with_the_log_tail() {
    let (broker_bin, _) = standins();
    let err = BrokerProcess::builder().program(broker_bin).env("STANDIN_MODE", "fail").start().await.unwrap_err();
    assert!(matches!(err, Error::EarlyExit { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with("ferry-broker exited with exit status: 3 before it was ready"), "{msg}");
    assert!(msg.contains("fatal: bad config key storage.flsh"), "{msg}");
    assert!(msg.contains("noise line 80"), "{msg}");
    assert!(!msg.contains("noise line 30\n"), "only the last 50 lines: {msg}");
}

#[tokio::test]
async fn start_timeout_is_an_error_with_the_log_tail() {
    let (broker_bin, _) = standins();
    let err = BrokerProcess::builder()
        .program(broker_bin)
        .env("STANDIN_MODE", "hang")
        .start_timeout(Duration::from_secs(1))
        .start()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StartTimeout { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.starts_with("ferry-broker was not ready within 1s (address file "), "{msg}");
    // The tail holds at least the kit's own run marker (the stand-in's lines may not be out yet on a busy machine).
    assert!(msg.contains("==== testkit: run 1 of ferry-broker:"), "{msg}");
}

#[tokio::test]
async fn terminate_kills_a_process_that_ignores_sigterm() {
    let (broker_bin, _) = standins();
    let mut broker =
        BrokerProcess::builder().program(broker_bin).env("STANDIN_MODE", "ignore-term").start().await.unwrap();
    let err = broker.terminate(Duration::from_millis(500)).await.unwrap_err();
    assert!(matches!(err, Error::TerminateTimeout { .. }), "{err:?}");
    assert!(err.to_string().contains("did not exit within 500ms after SIGTERM"), "{err}");
    assert!(!broker.is_running());
}

#[tokio::test]
async fn suspend_freezes_a_process_resume_continues_it_and_kill9_still_ends_it() {
    let (broker_bin, mirror_bin) = standins();
    let mut broker = BrokerProcess::builder().program(broker_bin).cluster_id("dc-a").start().await.unwrap();
    assert!(!broker.process().is_suspended());
    broker.suspend(WAIT).await.unwrap();
    assert!(broker.process().is_suspended(), "stopped on return");
    assert!(broker.is_running(), "a frozen process is alive");
    broker.resume().unwrap();
    wait_until("the broker to run again", WAIT, async || !broker.process().is_suspended()).await.unwrap();
    assert_eq!(greeting(broker.addr()).await, "hello from dc-a\n", "it serves again");

    let mut mirror = MirrorProcess::builder("[mirror]\nname = \"m\"\n[monitor]\nlisten = \"127.0.0.1:0\"\n")
        .program(mirror_bin)
        .start()
        .await
        .unwrap();
    mirror.suspend(WAIT).await.unwrap();
    assert!(mirror.process().is_suspended());
    let status = mirror.kill9().await.unwrap();
    assert_eq!(status.signal(), Some(Signal::KILL.as_raw()), "SIGKILL ends a frozen process");
    let err = mirror.resume().unwrap_err();
    assert!(matches!(err, Error::NotRunning { .. }), "{err:?}");
    assert!(!mirror.process().is_suspended());
}

#[tokio::test]
async fn restart_while_running_is_refused() {
    let (broker_bin, _) = standins();
    let mut broker = BrokerProcess::builder().program(broker_bin).start().await.unwrap();
    let err = broker.restart().await.unwrap_err();
    assert!(matches!(err, Error::StillRunning { .. }), "{err:?}");
    assert!(broker.is_running());
}

#[tokio::test]
async fn dropping_a_broker_kills_it() {
    let (broker_bin, _) = standins();
    let broker = BrokerProcess::builder().program(broker_bin).start().await.unwrap();
    let pid = broker.pid();
    let dir = broker.dir().to_path_buf();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    drop(broker);
    wait_until("the process to be gone", WAIT, async || !Path::new(&format!("/proc/{pid}")).exists()).await.unwrap();
    assert!(!dir.exists(), "the temp dir is removed");
}

#[tokio::test]
async fn mirror_gets_its_config_env_signals_and_restarts() {
    let (_, mirror_bin) = standins();
    let config = |name: &str| format!("[mirror]\nname = \"{name}\"\n[monitor]\nlisten = \"127.0.0.1:0\"\n");
    let mut mirror = MirrorProcess::builder(config("first"))
        .program(mirror_bin)
        .env("FERRY_MONITOR_TOKEN", "s3cret")
        .start()
        .await
        .unwrap();
    assert_eq!(mirror.monitor_url(), format!("http://{}", mirror.addr()));
    assert_eq!(std::fs::read_to_string(mirror.config_path()).unwrap(), config("first"), "written verbatim");
    assert_eq!(http_get(mirror.addr()).await.unwrap(), "name=first token=s3cret");
    assert!(mirror.logs().contains(&format!("cwd {}", mirror.dir().canonicalize().unwrap().display())));

    mirror.rewrite_config(&config("second")).unwrap();
    mirror.send_signal(Signal::HUP).unwrap();
    wait_until("the reload to be logged", WAIT, async || mirror.logs().contains("reloaded name=second")).await.unwrap();
    assert_eq!(http_get(mirror.addr()).await.unwrap(), "name=second token=s3cret");

    let status = mirror.terminate(WAIT).await.unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(mirror.logs().contains("got SIGTERM, committing offsets"));
    let err = mirror.send_signal(Signal::HUP).unwrap_err();
    assert!(matches!(err, Error::NotRunning { .. }), "{err:?}");

    mirror.restart().await.unwrap();
    assert_eq!(http_get(mirror.addr()).await.unwrap(), "name=second token=s3cret", "restart uses the new config");
    mirror.kill9().await.unwrap();
    assert!(!mirror.is_running());
}

#[tokio::test]
async fn mirror_config_error_shows_in_the_start_error() {
    let (_, mirror_bin) = standins();
    // No listen key: the stand-in dies with a Python traceback, as a bad config would end the real one.
    let err = MirrorProcess::builder("[mirror]\nname = \"x\"\n").program(mirror_bin).start().await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("ferry-mirror exited with exit status: 1 before it was ready"), "{msg}");
    assert!(msg.contains("Traceback"), "{msg}");
}

#[tokio::test]
async fn child_process_runs_one_shot_commands_with_captured_output() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ChildSpec::new("sh-probe", "/bin/sh", dir.path().join("log"))
        .arg("-c")
        .arg("echo out; echo err >&2; echo \"$PROBE in $(pwd) nc=$NO_COLOR\"; exit 7")
        .env("PROBE", "value")
        .current_dir(dir.path());
    let mut child = ChildProcess::spawn(spec).unwrap();
    let status = child.wait_exit(WAIT).await.unwrap();
    assert_eq!(status.code(), Some(7));
    assert_eq!(child.exit_status(), Some(status));
    let logs = child.logs();
    let cwd = dir.path().canonicalize().unwrap();
    assert!(logs.ends_with(&format!("out\nerr\nvalue in {} nc=1\n", cwd.display())), "{logs}");
    assert_eq!(child.log_tail(2), format!("err\nvalue in {} nc=1", cwd.display()));

    child.respawn().unwrap();
    assert_eq!(child.wait_exit(WAIT).await.unwrap().code(), Some(7));
    assert!(child.logs().contains("==== testkit: run 2 of sh-probe: /bin/sh -c"));
}

#[tokio::test]
async fn child_process_wait_exit_times_out_and_spawn_errors_name_the_program() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ChildSpec::new("sleeper", "/bin/sh", dir.path().join("log")).args(["-c", "echo napping; sleep 60"]);
    let mut child = ChildProcess::spawn(spec).unwrap();
    let err = child.wait_exit(Duration::from_millis(300)).await.unwrap_err();
    assert!(matches!(err, Error::ExitTimeout { .. }), "{err:?}");
    assert!(child.is_running());
    let status = child.kill9().await.unwrap();
    assert_eq!(status.signal(), Some(Signal::KILL.as_raw()));

    let missing = ChildSpec::new("ghost", "/no/such/program", dir.path().join("log2"));
    let err = ChildProcess::spawn(missing).unwrap_err();
    assert!(err.to_string().starts_with("cannot spawn ghost (/no/such/program): "), "{err}");
}
