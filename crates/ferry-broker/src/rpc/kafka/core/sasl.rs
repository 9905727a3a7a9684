//! A connection's authentication, as a pure state: what it may send before it has authenticated, and how a
//! SASL/PLAIN token reads. The connection performs the I/O and looks the password up among the broker's tokens.

use kafka_protocol::messages::ApiKey;

/// Kafka error codes of the SASL answers.
pub mod codes {
    /// The mechanism is not PLAIN (or SASL is off).
    pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    /// A SASL request out of order.
    pub const ILLEGAL_SASL_STATE: i16 = 34;
    /// The password is none of the broker's tokens, or the token does not parse.
    pub const SASL_AUTHENTICATION_FAILED: i16 = 58;
}

/// Where a connection's authentication stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Authenticated (or SASL is off): every advertised API is served.
    Done,
    /// Waiting for SaslHandshake.
    Handshake,
    /// After a v1 SaslHandshake: waiting for SaslAuthenticate.
    Authenticate,
    /// After a v0 SaslHandshake: the next frame is a bare SASL token, without a Kafka header.
    RawToken,
}

impl Auth {
    /// The state a new connection starts in.
    pub fn start(sasl: bool) -> Auth {
        if sasl { Auth::Handshake } else { Auth::Done }
    }

    /// Whether a request of `key` may be served now (the SASL requests are answered by the connection).
    pub fn may_serve(self, key: ApiKey) -> bool {
        match self {
            Auth::Done => true,
            Auth::Handshake => matches!(key, ApiKey::ApiVersions | ApiKey::SaslHandshake),
            Auth::Authenticate => matches!(key, ApiKey::ApiVersions | ApiKey::SaslAuthenticate),
            Auth::RawToken => false,
        }
    }

    /// After a SaslHandshake at `version` naming `mechanism`: the error code to answer and the next state.
    pub fn handshake(self, version: i16, mechanism: &str, sasl: bool) -> (i16, Auth) {
        if !sasl || mechanism != "PLAIN" {
            return (codes::UNSUPPORTED_SASL_MECHANISM, self);
        }
        if self != Auth::Handshake {
            return (codes::ILLEGAL_SASL_STATE, self);
        }
        (0, if version == 0 { Auth::RawToken } else { Auth::Authenticate })
    }
}

/// The password of a SASL/PLAIN token (`[authzid] NUL authcid NUL passwd`, RFC 4616), when it is one.
pub fn plain_password(token: &[u8]) -> Option<&[u8]> {
    let mut parts = token.splitn(3, |&b| b == 0);
    let (_authzid, authcid, password) = (parts.next()?, parts.next()?, parts.next()?);
    (!authcid.is_empty() && !password.is_empty()).then_some(password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sasl_requests_and_api_versions_come_before_authentication() {
        let cases: &[(Auth, ApiKey, bool)] = &[
            (Auth::Done, ApiKey::Produce, true),
            (Auth::Handshake, ApiKey::ApiVersions, true),
            (Auth::Handshake, ApiKey::SaslHandshake, true),
            (Auth::Handshake, ApiKey::SaslAuthenticate, false),
            (Auth::Handshake, ApiKey::Metadata, false),
            (Auth::Authenticate, ApiKey::SaslAuthenticate, true),
            (Auth::Authenticate, ApiKey::Produce, false),
            (Auth::RawToken, ApiKey::ApiVersions, false),
        ];
        for &(state, key, want) in cases {
            assert_eq!(state.may_serve(key), want, "{state:?} {key:?}");
        }
    }

    #[test]
    fn handshakes() {
        assert_eq!(Auth::Handshake.handshake(1, "PLAIN", true), (0, Auth::Authenticate));
        assert_eq!(Auth::Handshake.handshake(0, "PLAIN", true), (0, Auth::RawToken));
        assert_eq!(Auth::Handshake.handshake(1, "SCRAM-SHA-256", true).0, codes::UNSUPPORTED_SASL_MECHANISM);
        assert_eq!(Auth::Done.handshake(1, "PLAIN", false).0, codes::UNSUPPORTED_SASL_MECHANISM);
        assert_eq!(Auth::Done.handshake(1, "PLAIN", true), (codes::ILLEGAL_SASL_STATE, Auth::Done));
    }

    #[test]
    fn plain_tokens() {
        assert_eq!(plain_password(b"\0user\0secret"), Some(&b"secret"[..]));
        assert_eq!(plain_password(b"admin\0user\0se\0cret"), Some(&b"se\0cret"[..]));
        assert_eq!(plain_password(b"\0user\0"), None);
        assert_eq!(plain_password(b"\0\0secret"), None);
        assert_eq!(plain_password(b"usersecret"), None);
        assert_eq!(plain_password(b""), None);
    }
}
