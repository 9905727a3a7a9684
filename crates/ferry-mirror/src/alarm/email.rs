//! The email channel: SMTP through lettre (rustls + ring), with STARTTLS, TLS from the first byte, or no TLS
//! (credentials then only to a loopback relay, which the config's validate enforces), optional AUTH with the username
//! and the channel's own password secret, and a plain-text message
//! whose subject and body come from the [`Templates`].
//!
//! The password lives only in the transport's credentials; nothing here logs or formats it.

use std::sync::Arc;
use std::time::Duration;

use lettre::message::Mailbox;
use lettre::message::header::ContentType;
use lettre::transport::smtp::client::Tls;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::error::AlarmError;
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

impl EmailChannel {
    /// Builds the channel: parses the addresses and sets up the SMTP transport and its connection pool (no
    /// connection yet). Must run inside a tokio runtime.
    pub fn new(
        cfg: &EmailConfig,
        templates: Arc<Templates>,
        identity: Arc<AlarmIdentity>,
    ) -> Result<EmailChannel, AlarmError> {
        let bad = |reason: String| AlarmError::Channel { channel: cfg.name.clone(), reason };
        let (from, to, credentials) = cfg.parts().map_err(bad)?;
        type Transport = AsyncSmtpTransport<Tokio1Executor>;
        // `builder_dangerous` only means "no TLS unless set": every mode but `none` sets it, verifying the server.
        let tls = match cfg.tls {
            SmtpTls::None => Tls::None,
            SmtpTls::StartTls => Tls::Required(cfg.tls_parameters().map_err(bad)?),
            SmtpTls::Tls => Tls::Wrapper(cfg.tls_parameters().map_err(bad)?),
        };
        let mut builder =
            Transport::builder_dangerous(&cfg.smtp.host).tls(tls).port(cfg.smtp.port).timeout(Some(cfg.timeout));
        if let Some(c) = credentials {
            builder = builder.credentials(c);
        }
        Ok(EmailChannel {
            name: cfg.name.clone(),
            server: cfg.smtp.to_string(),
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
    use crate::config::{Secret, SmtpServer};

    fn cfg() -> EmailConfig {
        EmailConfig {
            name: "oncall".into(),
            smtp: SmtpServer { host: "127.0.0.1".into(), port: 2525 },
            tls: SmtpTls::None,
            ca_file: None,
            username: Some("ferry".into()),
            password_file: None,
            password_env: None,
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
            c.smtp.host = "smtp.example.org".into();
            let ch = EmailChannel::new(&c, Arc::clone(&t), id()).unwrap();
            assert_eq!(format!("{ch:?}"), "EmailChannel { name: \"oncall\", server: \"smtp.example.org:2525\" }");
        }
    }
}
