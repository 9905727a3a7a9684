//! `[alarms]`: the rules file, the per-channel queue, and the notification channels (`[[alarms.webhook]]`,
//! `[[alarms.email]]`). The rules file and the email templates next to it are config files too
//! ([`rules`](super::rules), [`templates`](super::templates)); validating `[alarms]` checks them, and the
//! senders' addresses, credentials and TLS roots, so `ferry-mirror validate` reports their problems with the rest.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use ferry_config::{Problems, de};
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, TlsParameters};
use serde::Deserialize;
use serde::de::{self as serde_de, Deserializer};

use super::checks;
use super::rules::Rules;
use super::secret::{self, SMTP_PASSWORD_ENV, Secret};
use super::templates::Templates;

/// SMTP transport security.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// Plain connection upgraded with STARTTLS (the default).
    #[default]
    StartTls,
    /// TLS from the first byte.
    Tls,
    /// No TLS (loopback relays only).
    None,
}

/// An SMTP server, written `"host:port"`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmtpServer {
    /// Host name or address (also the name its certificate must carry).
    pub host: String,
    /// Port.
    pub port: u16,
}

impl fmt::Display for SmtpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl<'de> Deserialize<'de> for SmtpServer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SmtpServer, D::Error> {
        let text = String::deserialize(d)?;
        match text.rsplit_once(':').map(|(h, port)| (h, port.parse::<u16>())) {
            Some((host, Ok(port))) if !host.is_empty() => Ok(SmtpServer { host: host.to_owned(), port }),
            _ => Err(serde_de::Error::custom(format!("{text:?} is not a \"host:port\" address"))),
        }
    }
}

/// One webhook channel (`[[alarms.webhook]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// Channel name.
    pub name: String,
    /// Target URL.
    pub url: String,
    /// File holding the HMAC-SHA256 key.
    pub secret_file: Option<PathBuf>,
    /// HMAC-SHA256 key, read at load from `secret_file`.
    #[serde(skip)]
    pub secret: Option<Secret>,
    /// Per-attempt timeout.
    #[serde(deserialize_with = "de::duration")]
    pub timeout: Duration,
    /// Retries after the first attempt.
    pub retries: u32,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            name: String::new(),
            url: String::new(),
            secret_file: None,
            secret: None,
            timeout: Duration::from_secs(5),
            retries: 3,
        }
    }
}

/// One email channel (`[[alarms.email]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmailConfig {
    /// Channel name.
    pub name: String,
    /// SMTP server.
    pub smtp: SmtpServer,
    /// Transport security.
    pub tls: SmtpTls,
    /// PEM root certificates trusted for the server's certificate, in addition to the built-in roots (a private
    /// CA of an internal relay).
    pub ca_file: Option<PathBuf>,
    /// Login.
    pub username: Option<String>,
    /// File holding the password.
    pub password_file: Option<PathBuf>,
    /// Environment variable holding the password (instead of `password_file`).
    pub password_env: Option<String>,
    /// Password, read at load from `password_file` or `password_env`, or from `FERRY_SMTP_PASSWORD` when this is
    /// the only email channel.
    #[serde(skip)]
    pub password: Option<Secret>,
    /// Sender.
    pub from: String,
    /// Recipients.
    pub to: Vec<String>,
    /// Per-send timeout.
    #[serde(deserialize_with = "de::duration")]
    pub timeout: Duration,
}

impl Default for EmailConfig {
    fn default() -> Self {
        EmailConfig {
            name: String::new(),
            smtp: SmtpServer::default(),
            tls: SmtpTls::StartTls,
            ca_file: None,
            username: None,
            password_file: None,
            password_env: None,
            password: None,
            from: String::new(),
            to: Vec::new(),
            timeout: Duration::from_secs(10),
        }
    }
}

fn mailbox(key: &str, text: &str) -> Result<Mailbox, String> {
    text.parse().map_err(|e| format!("{key} {text:?} is not an email address: {e}"))
}

impl EmailConfig {
    /// The sender, the recipients and the SMTP credentials, checked. The error is the reason, as it follows
    /// `alarm channel "NAME": `.
    pub fn parts(&self) -> Result<(Mailbox, Vec<Mailbox>, Option<Credentials>), String> {
        let from = mailbox("from", &self.from)?;
        let to = self.to.iter().map(|t| mailbox("to", t)).collect::<Result<Vec<_>, _>>()?;
        if to.is_empty() {
            return Err("to needs one or more email addresses".into());
        }
        let credentials = match (&self.username, &self.password) {
            (Some(user), Some(password)) => Some(Credentials::new(user.clone(), password.expose().to_owned())),
            (Some(_), None) => {
                return Err(format!(
                    "username is set but there is no password (password_file, password_env, or {SMTP_PASSWORD_ENV} \
                     when this is the only email channel)"
                ));
            }
            // A password without a username: no AUTH.
            (None, _) => None,
        };
        Ok((from, to, credentials))
    }

    /// The TLS parameters: the server name is the host, trusted by the built-in roots plus the certificates of
    /// `ca_file`.
    pub fn tls_parameters(&self) -> Result<TlsParameters, String> {
        let mut builder = TlsParameters::builder(self.smtp.host.clone());
        if let Some(path) = &self.ca_file {
            let pem = std::fs::read(path).map_err(|e| format!("cannot read ca_file {}: {e}", path.display()))?;
            let count = rustls_pemfile::certs(&mut pem.as_slice()).filter(Result::is_ok).count();
            let cert = Certificate::from_pem(&pem).ok().filter(|_| count > 0).ok_or_else(|| {
                format!("ca_file {} holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")", path.display())
            })?;
            builder = builder.add_root_certificate(cert);
        }
        builder.build_rustls().map_err(|e| format!("cannot set up TLS to {}: {e}", self.smtp.host))
    }

    /// What building the channel would refuse, without building it (that needs a runtime): addresses,
    /// credentials and the TLS roots.
    fn check_channel(&self) -> Result<(), String> {
        self.parts()?;
        // A missing ca_file is reported by the key check.
        if self.tls != SmtpTls::None && self.ca_file.as_ref().is_none_or(|p| p.is_file()) {
            self.tls_parameters()?;
        }
        Ok(())
    }
}

/// `[alarms]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlarmsConfig {
    /// Rules file; `None` means the shipped rules.
    pub rules: Option<PathBuf>,
    /// Queue length per channel (drop-oldest beyond it); 0 counts as 1.
    pub queue_size: usize,
    /// Webhook channels.
    #[serde(rename = "webhook")]
    pub webhooks: Vec<WebhookConfig>,
    /// Email channels.
    #[serde(rename = "email")]
    pub emails: Vec<EmailConfig>,
}

impl Default for AlarmsConfig {
    fn default() -> Self {
        AlarmsConfig { rules: None, queue_size: 1000, webhooks: Vec::new(), emails: Vec::new() }
    }
}

impl AlarmsConfig {
    /// The names of the configured channels.
    pub fn channel_names(&self) -> BTreeSet<String> {
        self.webhooks.iter().map(|w| w.name.clone()).chain(self.emails.iter().map(|e| e.name.clone())).collect()
    }

    /// Reads the secrets.
    pub(super) fn resolve(&mut self, p: &mut Problems) {
        self.queue_size = self.queue_size.max(1);
        for (i, w) in self.webhooks.iter_mut().enumerate() {
            w.secret = secret::read(p, &format!("alarms.webhook[{i}].secret_file"), w.secret_file.as_deref(), None);
        }
        // FERRY_SMTP_PASSWORD is one server's password: it may only go to the one email channel there is, never to
        // whichever of several lacks its own source.
        let count = self.emails.len();
        let shared = std::env::var(SMTP_PASSWORD_ENV).ok().filter(|v| !v.trim().is_empty());
        for (i, e) in self.emails.iter_mut().enumerate() {
            let key = format!("alarms.email[{i}]");
            let named = format!("channel {:?}", e.name);
            match (&e.password_file, &e.password_env) {
                (Some(_), Some(_)) => {
                    p.push(
                        format!("{key}.password_env"),
                        format!("{named}: set password_file or password_env, not both"),
                    );
                }
                (None, Some(var)) => {
                    e.password =
                        std::env::var(var).ok().filter(|v| !v.trim().is_empty()).map(|v| Secret::new(v.trim()));
                    if e.password.is_none() {
                        p.push(format!("{key}.password_env"), format!("{named}: {var:?} is not set, or empty"));
                    }
                }
                (Some(file), None) => {
                    e.password = secret::read(p, &format!("{key}.password_file"), Some(file), None);
                }
                (None, None) if e.username.is_some() => match &shared {
                    Some(v) if count == 1 => e.password = Some(Secret::new(v.trim())),
                    Some(_) => p.push(
                        format!("{key}.password_env"),
                        format!(
                            "{named}: {SMTP_PASSWORD_ENV} applies only when there is exactly one email channel (there \
                             are {count}); give each channel with a username its own password_file or password_env"
                        ),
                    ),
                    None => {}
                },
                (None, None) => {}
            }
        }
    }

    /// Every problem of `[alarms]`: the channels' keys, the rules file and the templates, and what building
    /// each email channel would refuse.
    pub(super) fn validate(&self, p: &mut Problems) {
        let mut names = BTreeSet::new();
        for (i, w) in self.webhooks.iter().enumerate() {
            let key = format!("alarms.webhook[{i}]");
            channel_name(p, &key, &w.name, &mut names);
            let url = &w.url;
            if !(url.starts_with("http://") || url.starts_with("https://")) || reqwest::Url::parse(url).is_err() {
                p.push(format!("{key}.url"), format!("{url:?} is not an http(s) URL"));
            }
            p.at_least(format!("{key}.timeout"), w.timeout, Duration::from_millis(10));
        }
        for (i, e) in self.emails.iter().enumerate() {
            let key = format!("alarms.email[{i}]");
            channel_name(p, &key, &e.name, &mut names);
            if e.smtp.host.is_empty() && !p.has(&format!("{key}.smtp")) {
                p.push(format!("{key}.smtp"), "is required: the SMTP server as \"host:port\"");
            }
            if !e.from.contains('@') {
                p.push(format!("{key}.from"), format!("{:?} is not an email address", e.from));
            }
            if e.to.is_empty() || e.to.iter().any(|t| !t.contains('@')) {
                p.push(format!("{key}.to"), "needs one or more email addresses");
            }
            if let Some(ca) = &e.ca_file {
                if e.tls == SmtpTls::None {
                    p.push(format!("{key}.ca_file"), "is only used with tls = \"starttls\" or \"tls\"");
                } else if !ca.is_file() {
                    p.push(format!("{key}.ca_file"), format!("{} does not exist", ca.display()));
                }
            }
            p.at_least(format!("{key}.timeout"), e.timeout, Duration::from_millis(10));
            if e.tls == SmtpTls::None && e.username.is_some() && !is_loopback(&e.smtp.host) {
                p.push(
                    format!("{key}.tls"),
                    format!(
                        "channel {:?}: credentials over tls = \"none\" would cross the network in clear text to {}; \
                         use tls = \"starttls\" or \"tls\", or a relay on loopback (127.0.0.1, ::1, localhost)",
                        e.name, e.smtp.host
                    ),
                );
            }
        }
        match &self.rules {
            Some(r) if !r.is_file() => p.push("alarms.rules", format!("{} does not exist", r.display())),
            rules => {
                if let Err(problems) = Rules::load(rules.as_deref(), &self.channel_names()) {
                    p.extend(problems);
                }
            }
        }
        if let Err(problems) = Templates::load(self.rules.as_deref()) {
            p.extend(problems);
        }
        for (i, e) in self.emails.iter().enumerate() {
            // Addresses without '@' are reported above, and a password source that failed when the secrets were read.
            let password_reported =
                p.has(&format!("alarms.email[{i}].password_env")) || p.has(&format!("alarms.email[{i}].password_file"));
            if e.from.contains('@')
                && e.to.iter().all(|t| t.contains('@'))
                && !password_reported
                && let Err(reason) = e.check_channel()
            {
                p.push_text(format!("alarm channel {:?}: {reason}", e.name));
            }
        }
    }
}

/// Whether an SMTP host is this machine: `localhost`, or a loopback address.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
}

fn channel_name(p: &mut Problems, key: &str, name: &str, seen: &mut BTreeSet<String>) {
    checks::name(p, &format!("{key}.name"), name);
    if !seen.insert(name.to_owned()) {
        p.push(format!("{key}.name"), format!("duplicate channel name {name:?}"));
    }
}
