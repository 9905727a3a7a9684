//! Who may call what. A client presents a bearer token; the interceptor finds the [`Grant`] it belongs to, in
//! constant time per configured token, and hands it to the service, which checks each call against the grant's
//! scopes and its topic and group patterns. docs/broker.md ("Tokens and scopes") has the rule of every RPC.
//!
//! Three kinds of grant:
//! - a scoped token from `[[auth.tokens]]`: its scopes, on the topics and groups its patterns match;
//! - the single token of `broker.token_file` / `FERRY_BROKER_TOKEN`: every scope on everything, as before scopes;
//! - no token configured at all: every caller is the open grant, with every scope on everything but replica.
//!
//! Broker-to-broker calls (a follower's fetch, the leader-epoch question, an election's reports, the failsafe)
//! need more than a scope: the caller's *member credential*, `ferry-member: {broker_id}.{mac}`, where `mac` is
//! HMAC-SHA256 over the broker id keyed with the members' shared secret in etcd. It binds the call to one member:
//! a follower's fetch is accepted only from the broker it names, and only if that broker holds a replica. When
//! tokens are configured, the member's token must also have the replica scope.
//!
//! A denial is a PERMISSION_DENIED status naming the token and the operation. It is logged (the token's name, never
//! its secret), at most once a second per token with the number left out, and counted per token in that line.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use regex::RegexSet;
use subtle::ConstantTimeEq;
use tonic::{Request, Status};

pub use crate::cluster::peers::{MEMBER_KEY, MemberKey};
pub use crate::config::Scope;
use crate::config::{BrokerConfig, ConfigError};
use crate::error::BrokerError;

/// The prefix of the mirror's own groups (`ferry-mirror.{name}`): only the mirror scope may touch them.
pub const MIRROR_GROUP_PREFIX: &str = "ferry-mirror.";

/// The shortest secret a scoped token may have.
pub const MIN_SECRET_CHARS: usize = 16;

/// Shortest time between two logged denials of one token.
const LOG_EVERY: Duration = Duration::from_secs(1);

impl Scope {
    const EVERY: [Scope; 5] = [Scope::Produce, Scope::Consume, Scope::Admin, Scope::Mirror, Scope::Replica];

    fn name(self) -> &'static str {
        match self {
            Scope::Produce => "produce",
            Scope::Consume => "consume",
            Scope::Admin => "admin",
            Scope::Mirror => "mirror",
            Scope::Replica => "replica",
        }
    }
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    /// Every scope.
    pub const ALL: Scopes = Scopes(0b1_1111);
    /// Only produce.
    pub const PRODUCE: Scopes = Scopes::of(&[Scope::Produce]);
    /// Only consume.
    pub const CONSUME: Scopes = Scopes::of(&[Scope::Consume]);
    /// Only admin.
    pub const ADMIN: Scopes = Scopes::of(&[Scope::Admin]);
    /// Only mirror.
    pub const MIRROR: Scopes = Scopes::of(&[Scope::Mirror]);
    /// Only replica: broker-to-broker traffic.
    pub const REPLICA: Scopes = Scopes::of(&[Scope::Replica]);
    /// Reading data: consumers and mirrors.
    pub const READ: Scopes = Scopes::of(&[Scope::Consume, Scope::Mirror]);

    /// The set of `scopes`.
    pub const fn of(scopes: &[Scope]) -> Scopes {
        let mut bits = 0;
        let mut i = 0;
        while i < scopes.len() {
            bits |= 1 << scopes[i] as u8;
            i += 1;
        }
        Scopes(bits)
    }

    /// Both sets together.
    pub const fn or(self, other: Scopes) -> Scopes {
        Scopes(self.0 | other.0)
    }

    fn meets(self, need: Scopes) -> bool {
        self.0 & need.0 != 0
    }

    /// "produce or consume", for messages.
    fn names(self, joiner: &str) -> String {
        let names: Vec<&str> =
            Scope::EVERY.iter().filter(|s| self.0 & (1 << **s as u8) != 0).map(|s| s.name()).collect();
        if names.is_empty() { "no scope".into() } else { names.join(joiner) }
    }
}

/// The topics or groups a grant covers: all, or those whose whole name matches one of the patterns.
#[derive(Debug, Clone)]
pub enum Names {
    /// Every name.
    All,
    /// Names matching one of the patterns (none when there are no patterns).
    Matching(RegexSet),
}

impl Names {
    /// The names matching one of `patterns`, each anchored at both ends. The error names the bad pattern.
    pub fn matching(patterns: &[String]) -> Result<Names, String> {
        crate::config::compile_patterns(patterns).map(Names::Matching)
    }

    fn covers(&self, name: &str) -> bool {
        match self {
            Names::All => true,
            Names::Matching(set) => set.is_match(name),
        }
    }
}

/// What one token may do, and its denial count.
pub struct Grant {
    name: String,
    secret: Option<Vec<u8>>,
    scopes: Scopes,
    topics: Names,
    groups: Names,
    denials: AtomicU64,
    /// When a denial was last logged, and how many were left out since.
    log: Mutex<(Option<Instant>, u64)>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant").field("name", &self.name).field("scopes", &self.scopes).finish_non_exhaustive()
    }
}

impl Grant {
    fn new(name: String, secret: Option<Vec<u8>>, scopes: Scopes, topics: Names, groups: Names) -> Grant {
        Grant { name, secret, scopes, topics, groups, denials: AtomicU64::new(0), log: Mutex::new((None, 0)) }
    }

    /// The grant of a broker with no token configured: every scope on everything but replica (broker-to-broker
    /// calls need a member credential). For embedding the service without the interceptor (the fuzz target).
    pub fn open() -> Arc<Grant> {
        let all_but_replica = Scopes(Scopes::ALL.0 & !Scopes::REPLICA.0);
        Arc::new(Grant::new("anonymous".into(), None, all_but_replica, Names::All, Names::All))
    }

    /// Whether this is the grant of a broker with no token configured.
    pub fn is_open(&self) -> bool {
        self.secret.is_none() && self.name == "anonymous"
    }

    /// The token's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Calls this grant was denied since the broker started.
    pub fn denials(&self) -> u64 {
        self.denials.load(Ordering::Relaxed)
    }

    /// `operation` needs one of `need`, on no topic or group in particular.
    pub fn allow(&self, operation: &'static str, need: Scopes) -> Result<(), BrokerError> {
        if self.scopes.meets(need) { Ok(()) } else { Err(self.lacks(operation, need, "")) }
    }

    /// `operation` needs one of `need`, and a topic pattern matching `topic`.
    pub fn allow_topic(&self, operation: &'static str, need: Scopes, topic: &str) -> Result<(), BrokerError> {
        self.allow_named(operation, need, "topic", topic, &self.topics)
    }

    /// `operation` needs one of `need`, and a group pattern matching `group`.
    pub fn allow_group(&self, operation: &'static str, need: Scopes, group: &str) -> Result<(), BrokerError> {
        self.allow_named(operation, need, "group", group, &self.groups)
    }

    /// Whether the token may see `topic` in a listing: its patterns match it (any scope sees names).
    pub fn sees_topic(&self, topic: &str) -> bool {
        self.topics.covers(topic)
    }

    /// Whether the token may see `group` in a listing, as [`Grant::sees_topic`].
    pub fn sees_group(&self, group: &str) -> bool {
        self.groups.covers(group)
    }

    fn allow_named(
        &self,
        operation: &'static str,
        need: Scopes,
        kind: &str,
        name: &str,
        names: &Names,
    ) -> Result<(), BrokerError> {
        if !self.scopes.meets(need) {
            return Err(self.lacks(operation, need, &format!(" on {kind} {name:?}")));
        }
        if !names.covers(name) {
            return Err(self.deny(
                operation,
                format!(
                    "token \"{}\" may not call {operation} on {kind} {name:?}: none of its {kind}s patterns matches it",
                    self.name
                ),
            ));
        }
        Ok(())
    }

    fn lacks(&self, operation: &'static str, need: Scopes, on: &str) -> BrokerError {
        self.deny(
            operation,
            format!(
                "token \"{}\" may not call {operation}{on}: that needs the {} scope, and the token has {}",
                self.name,
                need.names(" or "),
                self.scopes.names(", ")
            ),
        )
    }

    fn deny(&self, operation: &'static str, message: String) -> BrokerError {
        let denials = self.denials.fetch_add(1, Ordering::Relaxed) + 1;
        let mut log = self.log.lock();
        let now = Instant::now();
        if log.0.is_none_or(|at| now.duration_since(at) >= LOG_EVERY) {
            let left_out = std::mem::take(&mut log.1);
            log.0 = Some(now);
            drop(log);
            tracing::warn!(token = %self.name, operation, denials, left_out, "permission denied: {message}");
        } else {
            log.1 += 1;
        }
        BrokerError::PermissionDenied { token: self.name.clone(), operation, message }
    }
}

/// The member a call's credential proved, put in its extensions by the interceptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member(pub u32);

/// Checks that `req` comes from cluster member `id` (its member credential), and, when tokens are configured,
/// that its token has the replica scope.
pub fn require_member<T>(req: &Request<T>, operation: &'static str, id: Option<u32>) -> Result<u32, Status> {
    let grant = caller(req)?;
    let member = req.extensions().get::<Member>().map(|m| m.0);
    let denied = |why: String| {
        crate::error::status(tonic::Code::PermissionDenied, "permission_denied", format!("{operation}: {why}"))
    };
    let Some(member) = member else {
        return Err(denied("only a cluster member may call it, with its member credential".into()));
    };
    if let Some(id) = id
        && id != member
    {
        return Err(denied(format!("the call names broker {id}, but its credential is broker {member}'s")));
    }
    if !grant.is_open() {
        grant.allow(operation, Scopes::REPLICA)?;
    }
    Ok(member)
}

/// Every token of a broker: the interceptor that authenticates calls.
#[derive(Clone, Debug)]
pub struct Authorizer {
    /// Empty: no token is configured, and every call gets `open`.
    grants: Arc<Vec<Arc<Grant>>>,
    open: Arc<Grant>,
    members: MemberKey,
}

impl Authorizer {
    /// The tokens of `config`: the all-scope one from `FERRY_BROKER_TOKEN` or `broker.token_file`, and each
    /// `[[auth.tokens]]` entry with its secret read from its file. Two tokens with the same secret are refused: a
    /// caller must be one token.
    pub fn from_config(config: &BrokerConfig) -> Result<Authorizer, ConfigError> {
        let mut grants = Vec::new();
        if let Some((source, secret)) = config.token()? {
            grants.push(Grant::new(source.into(), Some(secret.into_bytes()), Scopes::ALL, Names::All, Names::All));
        }
        let mut problems = ferry_config::Problems::new();
        for (i, t) in config.auth.tokens.iter().enumerate() {
            let key = format!("auth.tokens[{i}] ({})", t.name);
            let text = std::fs::read_to_string(&t.token_file)
                .map_err(|source| ConfigError::TokenFile { path: t.token_file.clone(), source })?;
            let secret = text.trim();
            if secret.chars().count() < MIN_SECRET_CHARS {
                problems.push(
                    format!("{key}.token_file"),
                    format!("the secret in {} is shorter than {MIN_SECRET_CHARS} characters", t.token_file.display()),
                );
                continue;
            }
            if let Some(twin) =
                grants.iter().find(|g: &&Grant| g.secret.as_deref().is_some_and(|s| s == secret.as_bytes()))
            {
                problems.push(
                    format!("{key}.token_file"),
                    format!("holds the same secret as token \"{}\"; each token needs its own", twin.name),
                );
                continue;
            }
            let (topics, groups) = match (Names::matching(&t.topics), Names::matching(&t.groups)) {
                (Ok(topics), Ok(groups)) => (topics, groups),
                (Err(e), _) | (_, Err(e)) => {
                    problems.push(&key, e);
                    continue;
                }
            };
            grants.push(Grant::new(
                t.name.clone(),
                Some(secret.as_bytes().to_vec()),
                Scopes::of(&t.scopes),
                topics,
                groups,
            ));
        }
        problems.into_result(()).map_err(ConfigError::Invalid)?;
        Ok(Authorizer {
            grants: Arc::new(grants.into_iter().map(Arc::new).collect()),
            open: Grant::open(),
            members: MemberKey::default(),
        })
    }

    /// The member key whose credentials this authorizer accepts (set once the secret is read from etcd).
    pub fn members(&self) -> MemberKey {
        self.members.clone()
    }

    /// The grant every caller gets when no token is configured; `None` when tokens are (the Kafka listener).
    pub fn open_grant(&self) -> Option<Arc<Grant>> {
        self.grants.is_empty().then(|| Arc::clone(&self.open))
    }

    /// The grant whose secret is `secret` (the Kafka listener's SASL/PLAIN password), compared in constant time.
    pub fn grant_for(&self, secret: &[u8]) -> Option<Arc<Grant>> {
        self.find(secret).cloned()
    }

    /// The grant whose secret is `presented`. Every configured secret is compared, each in constant time.
    fn find(&self, presented: &[u8]) -> Option<&Arc<Grant>> {
        let mut found = None;
        for g in self.grants.iter() {
            if g.secret.as_deref().is_some_and(|s| bool::from(s.ct_eq(presented))) {
                found = Some(g);
            }
        }
        found
    }
}

impl tonic::service::Interceptor for Authorizer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let grant = if self.grants.is_empty() {
            Arc::clone(&self.open)
        } else {
            let presented = req
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or("");
            match self.find(presented.as_bytes()) {
                Some(g) => Arc::clone(g),
                None => {
                    return Err(crate::error::status(
                        tonic::Code::Unauthenticated,
                        "unauthenticated",
                        "missing or wrong bearer token; pass a token this broker knows (FERRY_TOKEN)",
                    ));
                }
            }
        };
        let member = req.metadata().get(MEMBER_KEY).and_then(|v| v.to_str().ok()).and_then(|v| self.members.verify(v));
        if let Some(id) = member {
            req.extensions_mut().insert(Member(id));
        }
        req.extensions_mut().insert(Caller(grant));
        Ok(req)
    }
}

/// The grant of the call, put in its extensions by the interceptor.
#[derive(Clone, Debug)]
pub struct Caller(pub Arc<Grant>);

/// The grant of `req`. A call that did not pass the interceptor has none and is refused.
pub fn caller<T>(req: &Request<T>) -> Result<Arc<Grant>, Status> {
    req.extensions().get::<Caller>().map(|c| Arc::clone(&c.0)).ok_or_else(|| {
        crate::error::status(tonic::Code::Internal, "internal", "the call reached the service without its token check")
    })
}

/// Who may use `group` as a member (join, heartbeat, leave): only the mirror scope, for the mirror's own groups.
pub fn member_scopes(group: &str) -> Scopes {
    if group.starts_with(MIRROR_GROUP_PREFIX) { Scopes::MIRROR } else { Scopes::CONSUME }
}

/// Who may commit to or read the offsets of `group`: the mirror's own groups only the mirror scope, the others
/// consume or mirror (the mirror syncs them).
pub fn offset_scopes(group: &str) -> Scopes {
    if group.starts_with(MIRROR_GROUP_PREFIX) { Scopes::MIRROR } else { Scopes::CONSUME.or(Scopes::MIRROR) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(scopes: &[Scope], topics: &[&str], groups: &[&str]) -> Grant {
        let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        Grant::new(
            "orders-app".into(),
            Some(b"secret-secret-secret".to_vec()),
            Scopes::of(scopes),
            Names::matching(&owned(topics)).unwrap(),
            Names::matching(&owned(groups)).unwrap(),
        )
    }

    #[test]
    fn patterns_match_whole_names_only() {
        let g = grant(&[Scope::Produce], &["orders\\..*"], &[]);
        assert!(g.allow_topic("Produce", Scopes::PRODUCE, "orders.eu").is_ok());
        for other in ["xorders.eu", "orders", "payments"] {
            let err = g.allow_topic("Produce", Scopes::PRODUCE, other).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "token \"orders-app\" may not call Produce on topic {other:?}: none of its topics patterns matches it"
                )
            );
        }
        // Alternation stays inside the anchors.
        let g = grant(&[Scope::Consume], &["a|b"], &[]);
        assert!(g.sees_topic("a") && g.sees_topic("b") && !g.sees_topic("ab") && !g.sees_topic("xa"));
        assert_eq!(g.denials(), 0, "sees_* does not count");
    }

    #[test]
    fn a_missing_scope_is_named_with_what_the_token_has() {
        let g = grant(&[Scope::Produce, Scope::Consume], &[".*"], &[".*"]);
        let err = g.allow_topic("CreateTopic", Scopes::ADMIN, "orders").unwrap_err();
        assert_eq!(
            err.to_string(),
            "token \"orders-app\" may not call CreateTopic on topic \"orders\": that needs the admin scope, and the \
             token has produce, consume"
        );
        let err = g.allow_group("JoinGroup", member_scopes("ferry-mirror.a_to_b"), "ferry-mirror.a_to_b").unwrap_err();
        assert!(err.to_string().contains("needs the mirror scope"), "{err}");
        assert!(g.allow_group("JoinGroup", member_scopes("orders-eu"), "orders-eu").is_ok());
        assert_eq!(g.denials(), 2);
        let status = Status::from(err);
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert_eq!(status.metadata().get(crate::error::REASON_KEY).unwrap(), "permission_denied");
    }

    #[test]
    fn the_mirror_scope_alone_may_use_the_mirrors_groups() {
        let mirror = grant(&[Scope::Mirror], &[".*"], &[".*"]);
        let consumer = grant(&[Scope::Consume, Scope::Admin, Scope::Produce], &[".*"], &[".*"]);
        for group in ["ferry-mirror.dc-a_to_dc-b", "ferry-mirror."] {
            assert!(mirror.allow_group("JoinGroup", member_scopes(group), group).is_ok());
            assert!(mirror.allow_group("CommitOffsets", offset_scopes(group), group).is_ok());
            assert!(consumer.allow_group("JoinGroup", member_scopes(group), group).is_err());
            assert!(consumer.allow_group("CommitOffsets", offset_scopes(group), group).is_err());
        }
        // The mirror commits to the groups it syncs, but does not join them.
        assert!(mirror.allow_group("CommitOffsets", offset_scopes("orders-eu"), "orders-eu").is_ok());
        assert!(mirror.allow_group("JoinGroup", member_scopes("orders-eu"), "orders-eu").is_err());
    }

    #[test]
    fn member_credentials_bind_a_call_to_one_broker_and_the_open_grant_has_no_replica_scope() {
        let key = MemberKey::default();
        assert_eq!(key.credential(2), None, "no secret yet");
        key.set("cluster-secret");
        let c2 = key.credential(2).unwrap();
        assert_eq!(key.verify(&c2), Some(2));
        // Claiming another broker's id with broker 2's mac, or a made-up mac, proves nothing.
        let (_, mac) = c2.split_once('.').unwrap();
        assert_eq!(key.verify(&format!("3.{mac}")), None);
        assert_eq!(key.verify("2.00ff"), None);
        assert_eq!(key.verify("nonsense"), None);
        let other = MemberKey::default();
        other.set("another-secret");
        assert_eq!(other.verify(&c2), None, "another cluster's secret");
        let open = Grant::open();
        assert!(open.is_open());
        assert!(open.allow("ReplicaFetch", Scopes::REPLICA).is_err());
        assert!(open.allow("Produce", Scopes::PRODUCE).is_ok());
    }

    #[test]
    fn bad_patterns_are_named() {
        let err = Names::matching(&["orders(".into()]).unwrap_err();
        assert!(err.starts_with("pattern \"orders(\" is not a valid regex"), "{err}");
        let huge = Names::matching(&["\\w{1000}\\w{1000}\\w{1000}".into()]).unwrap_err();
        assert!(huge.contains("is not a valid regex"), "{huge}");
    }
}
