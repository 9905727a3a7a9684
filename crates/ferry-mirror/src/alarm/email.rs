//! The email channel: SMTP through lettre (rustls + ring), with STARTTLS, TLS from the first byte, or no TLS
//! (loopback relays only), optional AUTH with the username and the password secret, and a plain-text message
//! whose subject and body come from the [`Templates`].
//!
//! The password lives only in the transport's credentials; nothing here logs or formats it.

use std::sync::Arc;
use std::time::Duration;

use lettre::message::Mailbox;
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::AlarmError;
use super::notice::{AlarmIdentity, Notice};
use super::template::Templates;
use crate::config::{EmailConfig, SmtpTls};

/// One email channel.
pub struct EmailChannel {
    name: String,
    server: String,
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    to: Vec<Mailbox>,
    timeout: Duration,
    templates: Arc<Templates>,
    identity: Arc<AlarmIdentity>,
}

impl std::fmt::Debug for EmailChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailChannel").field("name", &self.name).field("server", &self.server).finish()
    }
}

fn mailbox(channel: &str, key: &str, text: &str) -> Result<Mailbox, AlarmError> {
    text.parse().map_err(|e| AlarmError::Channel {
        channel: channel.to_owned(),
        reason: format!("{key} {text:?} is not an email address: {e}"),
    })
}

/// The sender, the recipients and the credentials of `cfg`, checked.
fn parts(cfg: &EmailConfig) -> Result<(Mailbox, Vec<Mailbox>, Option<Credentials>), AlarmError> {
    let bad = |reason: String| AlarmError::Channel { channel: cfg.name.clone(), reason };
    let from = mailbox(&cfg.name, "from", &cfg.from)?;
    let to = cfg.to.iter().map(|t| mailbox(&cfg.name, "to", t)).collect::<Result<Vec<_>, _>>()?;
    if to.is_empty() {
        return Err(bad("to needs one or more email addresses".into()));
    }
    let credentials = match (&cfg.username, &cfg.password) {
        (Some(user), Some(password)) => Some(Credentials::new(user.clone(), password.expose().to_owned())),
        (Some(_), None) => {
            return Err(bad(format!(
                "username is set but there is no password (password_file or {})",
                crate::config::SMTP_PASSWORD_ENV
            )));
        }
        // A password without a username (e.g. FERRY_SMTP_PASSWORD meant for another channel): no AUTH.
        (None, _) => None,
    };
    Ok((from, to, credentials))
}

/// The TLS parameters of `cfg`: the server name is the host, trusted by the built-in roots plus the certificates
/// of `ca_file`.
fn tls_parameters(cfg: &EmailConfig) -> Result<TlsParameters, String> {
    let mut builder = TlsParameters::builder(cfg.host.clone());
    if let Some(path) = &cfg.ca_file {
        let pem = std::fs::read(path).map_err(|e| format!("cannot read ca_file {}: {e}", path.display()))?;
        let count = rustls_pemfile::certs(&mut pem.as_slice()).filter(Result::is_ok).count();
        let cert = Certificate::from_pem(&pem).ok().filter(|_| count > 0).ok_or_else(|| {
            format!("ca_file {} holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")", path.display())
        })?;
        builder = builder.add_root_certificate(cert);
    }
    builder.build_rustls().map_err(|e| format!("cannot set up TLS to {}: {e}", cfg.host))
}

/// Checks `cfg` without building a transport (which needs a runtime): addresses, credentials and the TLS roots.
pub fn check(cfg: &EmailConfig) -> Result<(), AlarmError> {
    parts(cfg)?;
    // A missing ca_file is already reported by the config check.
    if cfg.tls != SmtpTls::None && cfg.ca_file.as_ref().is_none_or(|p| p.is_file()) {
        tls_parameters(cfg).map_err(|reason| AlarmError::Channel { channel: cfg.name.clone(), reason })?;
    }
    Ok(())
}

impl EmailChannel {
    /// Builds the channel: parses the addresses and sets up the SMTP transport and its connection pool (no
    /// connection yet). Must run inside a tokio runtime.
    pub fn new(
        cfg: &EmailConfig,
        templates: Arc<Templates>,
        identity: Arc<AlarmIdentity>,
    ) -> Result<EmailChannel, AlarmError> {
        let bad = |reason: String| AlarmError::Channel { channel: cfg.name.clone(), reason };
        let (from, to, credentials) = parts(cfg)?;
        type Transport = AsyncSmtpTransport<Tokio1Executor>;
        // `builder_dangerous` only means "no TLS unless set": every mode but `none` sets it, verifying the server.
        let tls = match cfg.tls {
            SmtpTls::None => Tls::None,
            SmtpTls::StartTls => Tls::Required(tls_parameters(cfg).map_err(bad)?),
            SmtpTls::Tls => Tls::Wrapper(tls_parameters(cfg).map_err(bad)?),
        };
        let mut builder = Transport::builder_dangerous(&cfg.host).tls(tls).port(cfg.port).timeout(Some(cfg.timeout));
        if let Some(c) = credentials {
            builder = builder.credentials(c);
        }
        Ok(EmailChannel {
            name: cfg.name.clone(),
            server: format!("{}:{}", cfg.host, cfg.port),
            transport: builder.build(),
            from,
            to,
            timeout: cfg.timeout,
            templates,
            identity,
        })
    }

    /// The channel name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renders and sends `notice` within the channel's timeout.
    pub async fn send(&self, notice: &Notice) -> Result<(), AlarmError> {
        let mut b = Message::builder()
            .from(self.from.clone())
            .subject(self.templates.subject(notice, &self.identity))
            .header(ContentType::TEXT_PLAIN);
        for to in &self.to {
            b = b.to(to.clone());
        }
        // SMTP ends the data with a line break of its own; without this the body would gain an empty last line.
        let body = self.templates.body(notice, &self.identity).trim_end_matches(['\r', '\n']).to_owned();
        let message = b.body(body).map_err(|e| AlarmError::Channel {
            channel: self.name.clone(),
            reason: format!("cannot build the message: {e}"),
        })?;
        match tokio::time::timeout(self.timeout, self.transport.send(message)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) => {
                Err(AlarmError::Smtp { channel: self.name.clone(), server: self.server.clone(), source })
            }
            Err(_) => Err(AlarmError::SmtpTimeout {
                channel: self.name.clone(),
                server: self.server.clone(),
                timeout: self.timeout,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn cfg() -> EmailConfig {
        EmailConfig {
            name: "oncall".into(),
            host: "127.0.0.1".into(),
            port: 2525,
            tls: SmtpTls::None,
            ca_file: None,
            username: Some("ferry".into()),
            password: Some(Secret::new("pw")),
            from: "Ferry <ferry@example.org>".into(),
            to: vec!["oncall@example.org".into()],
            timeout: Duration::from_secs(1),
        }
    }

    fn id() -> Arc<AlarmIdentity> {
        Arc::new(AlarmIdentity { mirror: "m".into(), source_cluster: "a".into(), target_cluster: "b".into() })
    }

    #[tokio::test]
    async fn bad_addresses_and_a_missing_password_are_named() {
        let t = Arc::new(Templates::load(None).unwrap());
        assert!(EmailChannel::new(&cfg(), Arc::clone(&t), id()).is_ok());
        let mut c = cfg();
        c.to = vec!["not an address".into()];
        let e = EmailChannel::new(&c, Arc::clone(&t), id()).unwrap_err().to_string();
        assert!(e.starts_with("alarm channel \"oncall\": to \"not an address\" is not an email address"), "{e}");
        let mut c = cfg();
        c.password = None;
        let e = EmailChannel::new(&c, Arc::clone(&t), id()).unwrap_err().to_string();
        assert!(e.contains("username is set but there is no password"), "{e}");
        for tls in [SmtpTls::StartTls, SmtpTls::Tls] {
            let mut c = cfg();
            c.tls = tls;
            c.host = "smtp.example.org".into();
            let ch = EmailChannel::new(&c, Arc::clone(&t), id()).unwrap();
            assert_eq!(format!("{ch:?}"), "EmailChannel { name: \"oncall\", server: \"smtp.example.org:2525\" }");
        }
    }
}
