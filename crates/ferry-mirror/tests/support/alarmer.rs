//! The Alarmer under test, driven through its EventBus: channel configs (webhooks, emails to the SMTP sink), a
//! running Alarmer with its metrics, shared state and reload channel, and a writer that captures its logs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_mirror::alarm::{AlarmIdentity, Alarmer};
use ferry_mirror::config::{AlarmsConfig, EmailConfig, Secret, SmtpServer, SmtpTls, WebhookConfig};
use ferry_mirror::events::{Event, EventBus};
use ferry_mirror::metrics::Metrics;
use ferry_mirror::state::Shared;
use ferry_testkit::wait_until;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A fixed event time: 2023-11-14T22:13:20Z.
pub const T0_MS: i64 = 1_700_000_000_000;

/// How long any awaited delivery may take (3x a 5 s budget): a bound on a hang, not a measurement.
pub fn deadline() -> Duration {
    ferry_testkit::deadline(&[Duration::from_secs(5)])
}

/// The identity the alarms name: mirror dc-a_to_dc-b from dc-a to dc-b.
pub fn identity() -> AlarmIdentity {
    AlarmIdentity { mirror: "dc-a_to_dc-b".into(), source_cluster: "dc-a".into(), target_cluster: "dc-b".into() }
}

/// A webhook channel to `url`, HMAC-signed with `secret` when given.
pub fn webhook(name: &str, url: &str, secret: Option<&str>, retries: u32) -> WebhookConfig {
    WebhookConfig {
        name: name.into(),
        url: url.into(),
        secret_file: None,
        secret: secret.map(Secret::new),
        timeout: Duration::from_secs(5),
        retries,
    }
}

/// An email channel to the SMTP server on 127.0.0.1:`port`, plain text, with `auth` when given.
pub fn email(name: &str, port: u16, auth: Option<(&str, &str)>, timeout: Duration) -> EmailConfig {
    EmailConfig {
        name: name.into(),
        smtp: SmtpServer { host: "127.0.0.1".into(), port },
        tls: SmtpTls::None,
        ca_file: None,
        username: auth.map(|a| a.0.to_owned()),
        password_file: None,
        password_env: None,
        password: auth.map(|a| Secret::new(a.1)),
        from: "Ferry Alarms <ferry@example.org>".into(),
        to: vec!["oncall@example.org".into(), "backup@example.org".into()],
        timeout,
    }
}

/// The `[alarms]` section with these rules and channels.
pub fn alarms(rules: Option<PathBuf>, webhooks: Vec<WebhookConfig>, emails: Vec<EmailConfig>) -> AlarmsConfig {
    AlarmsConfig { rules, queue_size: 1000, webhooks, emails }
}

/// Writes an alarm rules file `name` into `dir`.
pub fn rules_file(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The event, stamped at `T0_MS`.
pub fn at_t0(mut e: Event) -> Event {
    e.timestamp_ms = T0_MS;
    e
}

/// A running Alarmer and what drives it.
pub struct Running {
    pub bus: EventBus,
    pub metrics: Metrics,
    pub shared: Arc<Shared>,
    pub reload: watch::Sender<AlarmsConfig>,
    pub stop: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts an Alarmer with `config`, checking the shared state every 50 ms.
    pub fn start(config: AlarmsConfig) -> Running {
        let metrics = Metrics::new();
        let bus = EventBus::new(metrics.clone());
        let shared = Arc::new(Shared::default());
        let alarmer = Alarmer::new(&config, identity(), bus.clone(), metrics.clone()).unwrap();
        let (reload, rx) = watch::channel(config);
        let stop = CancellationToken::new();
        let task = tokio::spawn(alarmer.run(Arc::clone(&shared), Duration::from_millis(50), rx, stop.clone()));
        Running { bus, metrics, shared, reload, stop, task }
    }

    /// The `ferry_alarms_total` count of `channel` and `outcome`.
    pub fn count(&self, channel: &str, outcome: &str) -> u64 {
        self.metrics.alarm_count(channel, outcome)
    }

    /// Waits until that count reaches `n`, then asserts it is exactly `n`.
    pub async fn wait_count(&self, channel: &str, outcome: &str, n: u64) {
        let what = format!("ferry_alarms_total{{channel={channel:?},outcome={outcome:?}}} = {n}");
        wait_until(&what, deadline(), async || self.count(channel, outcome) >= n).await.unwrap();
        assert_eq!(self.count(channel, outcome), n, "{what}");
    }

    /// Stops the Alarmer and waits for it.
    pub async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// The hex HMAC-SHA256 of `body` under `key`, as the webhook signature carries it.
pub fn hmac_hex(key: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(body);
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
pub struct Capture(pub Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
