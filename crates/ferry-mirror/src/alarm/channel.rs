//! The channels an alarm can go to, behind one type so the queue worker treats them alike.

use super::email::EmailChannel;
use super::error::AlarmError;
use super::notice::Notice;
use super::webhook::WebhookChannel;

/// One configured channel.
#[derive(Debug)]
pub enum Channel {
    /// `[[alarms.email]]`.
    Email(EmailChannel),
    /// `[[alarms.webhook]]`.
    Webhook(WebhookChannel),
}

impl Channel {
    /// The channel's configured name.
    pub fn name(&self) -> &str {
        match self {
            Channel::Email(c) => c.name(),
            Channel::Webhook(c) => c.name(),
        }
    }

    /// Delivers one notice (with the channel's own timeouts and retries).
    pub async fn send(&self, notice: &Notice) -> Result<(), AlarmError> {
        match self {
            Channel::Email(c) => c.send(notice).await,
            Channel::Webhook(c) => c.send(notice).await,
        }
    }
}
