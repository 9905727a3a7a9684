//! [`AlarmError`]: why the Alarmer could not be set up, or a notification could not be delivered.

use std::time::Duration;

/// Why the Alarmer could not be set up, or a notification could not be delivered.
#[derive(Debug, thiserror::Error)]
pub enum AlarmError {
    /// The rules file (or the shipped rules under it) has problems.
    #[error("alarm rules: {} problem(s):\n  - {}", problems.len(), problems.join("\n  - "))]
    Rules {
        /// Each problem, naming its key.
        problems: Vec<String>,
    },
    /// An email template has problems.
    #[error("alarm templates: {}", problems.join("; "))]
    Templates {
        /// Each problem, naming its file.
        problems: Vec<String>,
    },
    /// A channel's settings are unusable.
    #[error("alarm channel {channel:?}: {reason}")]
    Channel {
        /// Channel name.
        channel: String,
        /// What is wrong.
        reason: String,
    },
    /// The SMTP server refused or failed.
    #[error("alarm channel {channel:?}: sending through {server} failed")]
    Smtp {
        /// Channel name.
        channel: String,
        /// `host:port`.
        server: String,
        /// lettre's error.
        #[source]
        source: lettre::transport::smtp::Error,
    },
    /// The SMTP exchange did not finish in time.
    #[error("alarm channel {channel:?}: sending through {server} did not finish within {}", humantime::format_duration(*timeout))]
    SmtpTimeout {
        /// Channel name.
        channel: String,
        /// `host:port`.
        server: String,
        /// The channel's timeout.
        timeout: Duration,
    },
    /// The webhook answered with an error status.
    #[error("alarm channel {channel:?}: {url} answered HTTP {status} (attempt {attempts})")]
    WebhookStatus {
        /// Channel name.
        channel: String,
        /// Scheme and host of the URL (its path may hold a token).
        url: String,
        /// HTTP status.
        status: u16,
        /// Attempts made.
        attempts: u32,
    },
    /// The webhook could not be reached or timed out.
    #[error("alarm channel {channel:?}: POST to {url} failed (attempt {attempts})")]
    WebhookRequest {
        /// Channel name.
        channel: String,
        /// Scheme and host of the URL.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// reqwest's error, without the URL.
        #[source]
        source: reqwest::Error,
    },
}
