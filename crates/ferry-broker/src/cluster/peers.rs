//! The links from one cluster member to another (a follower's fetches, its leader-epoch questions): dialled at a
//! member's registered address (or its test-only `cluster.peer_addrs` override), over TLS when
//! `cluster.tls_ca_file` is set, presenting `cluster.token_file` as a bearer token when set. The peers' own
//! `[[auth.tokens]]` must grant that token the replica scope. With `[broker.tls]` and TLS to the peers, the member
//! presents its own certificate, so peers that require client certificates (`client_ca_file`) let it in.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferry_h2::{ClientTls, Dialer, H2Channel, Http2Settings, TlsPart};
use ferry_proto::broker_client::BrokerClient;
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;

use crate::config::BrokerConfig;

/// The metadata key of a member credential.
pub const MEMBER_KEY: &str = "ferry-member";

/// The members' shared secret, known once the broker has read it from etcd: it makes and checks member
/// credentials.
#[derive(Clone, Default)]
pub struct MemberKey {
    secret: Arc<std::sync::OnceLock<Vec<u8>>>,
}

impl std::fmt::Debug for MemberKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("MemberKey").field("known", &self.secret.get().is_some()).finish()
    }
}

impl MemberKey {
    /// Sets the secret (once; later calls are ignored).
    pub fn set(&self, secret: &str) {
        let _ = self.secret.set(secret.as_bytes().to_vec());
    }

    fn mac(&self, id: u32) -> Option<Vec<u8>> {
        use hmac::Mac;
        let secret = self.secret.get().filter(|s| !s.is_empty())?;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).ok()?;
        mac.update(format!("ferry-member/{id}").as_bytes());
        Some(mac.finalize().into_bytes().to_vec())
    }

    /// The credential broker `id` presents, `None` before the secret is known.
    pub fn credential(&self, id: u32) -> Option<String> {
        let mac = self.mac(id)?;
        Some(format!("{id}.{}", mac.iter().map(|b| format!("{b:02x}")).collect::<String>()))
    }

    /// The member a presented credential proves, if it does.
    pub fn verify(&self, presented: &str) -> Option<u32> {
        let (id, hex) = presented.split_once('.')?;
        let id: u32 = id.parse().ok()?;
        let expected = self.credential(id)?;
        let theirs = format!("{id}.{hex}");
        bool::from(expected.as_bytes().ct_eq(theirs.as_bytes())).then_some(id)
    }
}

/// The receive windows of a peer connection: a follower's fetch answers are up to a few MiB, and a window as
/// large as the answer lets one cross without waiting for a window update.
const PEER_STREAM_WINDOW: u32 = 16 * 1024 * 1024;
const PEER_CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

/// A client of another member.
pub type PeerClient = BrokerClient<InterceptedService<H2Channel, PeerAuth>>;

/// Adds the member's bearer token, when it has one, and its member credential to every call to a peer.
#[derive(Clone)]
pub struct PeerAuth {
    header: Option<MetadataValue<tonic::metadata::Ascii>>,
    member: Arc<OnceLock<MetadataValue<tonic::metadata::Ascii>>>,
}

impl Interceptor for PeerAuth {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.header {
            request.metadata_mut().insert("authorization", h.clone());
        }
        if let Some(m) = self.member.get() {
            request.metadata_mut().insert(MEMBER_KEY, m.clone());
        }
        Ok(request)
    }
}

/// What a member needs to dial its peers.
#[derive(Clone)]
pub struct PeerLinks {
    auth: PeerAuth,
    tls: Option<ClientTls>,
}

impl std::fmt::Debug for PeerLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("PeerLinks")
            .field("token", &self.auth.header.is_some())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Why the peer links could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A file named by a key could not be read.
    #[error("cannot read {key} {path}: {source}")]
    Read {
        /// The config key.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The token file holds nothing usable.
    #[error("cluster.token_file {0}: the file is empty or is not a header-safe token")]
    BadToken(PathBuf),
    /// A PEM file named by a key holds no usable certificate or key.
    #[error("{key}: {message}")]
    BadPem {
        /// The config key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl PeerLinks {
    /// The links `config` asks for: its `[cluster]` token and CA, and its `[broker.tls]` identity.
    pub fn from_config(config: &BrokerConfig) -> Result<PeerLinks, PeerError> {
        let read = |key: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|source| PeerError::Read { key, path: path.clone(), source })
        };
        let header = match &config.cluster.token_file {
            None => None,
            Some(path) => {
                let text = String::from_utf8(read("cluster.token_file", path)?).unwrap_or_default();
                let token = text.trim();
                let value = format!("Bearer {token}").parse().ok().filter(|_| !token.is_empty());
                Some(value.ok_or_else(|| PeerError::BadToken(path.clone()))?)
            }
        };
        let tls = match &config.cluster.tls_ca_file {
            None => None,
            Some(ca) => {
                let ca = read("cluster.tls_ca_file", ca)?;
                let identity = match &config.broker.tls {
                    None => None,
                    Some(own) => Some((
                        read("broker.tls.cert_file", &own.cert_file)?,
                        read("broker.tls.key_file", &own.key_file)?,
                    )),
                };
                let identity = identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice()));
                let tls = ClientTls::new(Some(&ca), identity, None).map_err(|(part, message)| PeerError::BadPem {
                    key: match part {
                        TlsPart::Ca => "cluster.tls_ca_file",
                        TlsPart::Cert => "broker.tls.cert_file",
                        TlsPart::Key => "broker.tls.key_file",
                    },
                    message,
                })?;
                Some(tls)
            }
        };
        Ok(PeerLinks { auth: PeerAuth { header, member: Arc::new(OnceLock::new()) }, tls })
    }

    /// Presents `credential` (see `rpc::auth::MemberKey`) on every call from now on, through every client made
    /// from these links.
    pub fn set_member(&self, credential: &str) {
        if let Ok(v) = credential.parse() {
            let _ = self.auth.member.set(v);
        }
    }

    /// A lazily connecting client of the member at `address`; `None` when the address is not usable.
    pub fn client(&self, address: &str, ttl: Duration, max_message: usize) -> Option<PeerClient> {
        let settings = Http2Settings {
            connect_timeout: ttl / 2,
            bind: None,
            stream_window: PEER_STREAM_WINDOW,
            connection_window: PEER_CONNECTION_WINDOW,
            keepalive_interval: Some(Duration::from_secs(5)),
            keepalive_timeout: ttl,
            keepalive_while_idle: false,
        };
        let dialer = match Dialer::new(address, self.tls.as_ref(), settings) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(address, error = %e, "cannot dial a peer at this address");
                return None;
            }
        };
        let channel = H2Channel::lazy(dialer);
        Some(
            BrokerClient::with_interceptor(channel, self.auth.clone())
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member whose CA file holds no certificate could dial no peer: it does not start, and says which key.
    #[test]
    fn a_ca_file_without_a_certificate_stops_the_member_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate\n").unwrap();
        let mut config = BrokerConfig::default();
        config.cluster.tls_ca_file = Some(ca);
        match PeerLinks::from_config(&config) {
            Err(PeerError::BadPem { key, message }) => {
                assert_eq!((key, message.as_str()), ("cluster.tls_ca_file", "no certificate in the PEM text"))
            }
            other => panic!("expected BadPem, got {other:?}"),
        }
    }
}
