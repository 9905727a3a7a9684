//! Membership of a cluster under its etcd master.
//!
//! etcd holds the cluster's truth, and every change is a compare-and-swap transaction. This part covers what a
//! broker does when it starts and stops:
//! - `/ferry/cluster_id`: the cluster's id, written once by the first member (a create-if-absent transaction). A
//!   broker whose own cluster id differs refuses to start.
//! - `/ferry/brokers/{id}`: this broker's advertised address, under a lease of `cluster.lease_ttl` that the broker
//!   renews every third of it. A broker that stops renewing (killed, cut off from etcd) leaves the cluster when
//!   the lease expires; a graceful stop revokes the lease, and the member leaves at once. A lease that expired
//!   while etcd was unreachable is granted anew and the key written again when etcd answers.
//! - A second live broker with the same id is refused: the key is created only if absent. A restart waits for the
//!   previous incarnation's lease to run out (at most one TTL) before it gives up.
//! - `/ferry/member_secret`: the members' shared secret (created once), from which each member derives the
//!   credential it presents to the others (see `rpc::auth`).
//! - While etcd cannot be reached at start, the broker keeps trying with backoff and says so in its log and its
//!   readiness (`/readyz` on the metrics listener).
//! - Every successful renewal extends the [`LeaseClock`] from the renewal's send time: the member acts as leader
//!   only within it (see `core::fencing`).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::lease::LeaseClock;
use crate::config::ClusterSection;

pub use crate::cluster::catalog::ROOT;

/// The key holding the cluster id.
pub fn cluster_id_key() -> String {
    format!("{ROOT}/cluster_id")
}

/// The key holding the members' shared secret.
pub fn member_secret_key() -> String {
    format!("{ROOT}/member_secret")
}

/// The key holding broker `id`'s registration.
pub fn broker_key(id: u32) -> String {
    format!("{ROOT}/brokers/{id}")
}

/// Why the broker cannot join its cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd did not answer.
    #[error("cannot reach etcd at {endpoints}: {message}")]
    Unreachable {
        /// The configured endpoints.
        endpoints: String,
        /// What the client said.
        message: String,
    },
    /// etcd holds another cluster id.
    #[error(
        "this broker's cluster id is {ours:?} but the cluster in etcd ({endpoints}) is {theirs:?}: point it at its own \
         cluster's etcd, or give it that cluster's id (a data dir keeps the id it was created with)"
    )]
    ClusterIdMismatch {
        /// This broker's id.
        ours: String,
        /// The id in etcd.
        theirs: String,
        /// The configured endpoints.
        endpoints: String,
    },
    /// Another live broker holds this broker id.
    #[error(
        "broker id {id} is held by a live member at {holder} (its lease did not expire within {waited:?}): give each \
         broker its own cluster.broker_id"
    )]
    BrokerIdTaken {
        /// The id.
        id: u32,
        /// The holder's advertised address.
        holder: String,
        /// How long this broker waited for the holder's lease.
        waited: Duration,
    },
}

/// A connection to the cluster's etcd whose cluster id this broker may join, before it registers: the broker
/// takes its unclean replicas out of the in-sync sets between the two (see `cluster::core::eligibility`).
pub struct Connected {
    client: Client,
    section: ClusterSection,
}

impl std::fmt::Debug for Connected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connected").finish_non_exhaustive()
    }
}

/// This broker's membership: renewed in the background until [`Membership::leave`].
pub struct Membership {
    client: Client,
    stop: CancellationToken,
    /// The renewal task; it ends with the lease it held last (a new one after an expiry).
    renewal: JoinHandle<i64>,
    lease: Arc<LeaseClock>,
    lease_id: Arc<AtomicI64>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership").finish_non_exhaustive()
    }
}

/// What a membership needs to (re)register.
#[derive(Debug, Clone)]
struct Registration {
    key: String,
    id: u32,
    advertised: String,
    /// The named listeners' advertised addresses (JSON, name -> address), written beside the registration; empty
    /// when there are none.
    listeners: String,
    ttl: Duration,
    /// etcd's endpoints, to connect the renewal anew when its connection stops answering.
    endpoints: Vec<String>,
}

/// The backoff between attempts to reach etcd at start: 200 ms doubling to 5 s, with jitter, for as long as it
/// takes.
fn start_backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build()
}

impl Connected {
    /// Connects to etcd and checks or claims the cluster id. While etcd cannot be reached it keeps trying, with
    /// backoff, saying so in its log and through `waiting` (the broker's readiness), until `stop`.
    pub async fn connect(
        section: &ClusterSection,
        cluster_id: &str,
        waiting: &(dyn Fn(String) + Send + Sync),
        stop: &CancellationToken,
    ) -> Result<Connected, ClusterError> {
        let endpoints = section.etcd.join(",");
        let ttl = section.lease_ttl;
        let mut backoff = start_backoff();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match Self::try_connect(section, cluster_id, ttl).await {
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(refused)) => return Err(refused),
                Err(e) => {
                    let delay = backoff.next().unwrap_or(Duration::from_secs(5));
                    let why = format!(
                        "waiting for etcd at {endpoints} (attempt {attempt}, next in {} ms): {e}",
                        delay.as_millis()
                    );
                    tracing::warn!(event = "etcd_unreachable_at_start", attempt, error = %e, "{why}");
                    waiting(why);
                    tokio::select! {
                        _ = stop.cancelled() => {
                            return Err(ClusterError::Unreachable { endpoints, message: format!("stopped while {e}") });
                        }
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    async fn try_connect(
        section: &ClusterSection,
        cluster_id: &str,
        ttl: Duration,
    ) -> Result<Result<Connected, ClusterError>, etcd_client::Error> {
        // Each request is bounded by a third of the lease, so a renewal that hangs never outlives the lease.
        let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(5)).with_timeout(ttl / 3);
        let mut client = Client::connect(section.etcd.clone(), Some(options)).await?;
        let (created, theirs) = create_if_absent(&mut client, &cluster_id_key(), cluster_id).await?;
        if !created && theirs != cluster_id {
            let endpoints = section.etcd.join(",");
            return Ok(Err(ClusterError::ClusterIdMismatch { ours: cluster_id.to_owned(), theirs, endpoints }));
        }
        if created {
            tracing::info!(cluster_id, "registered the cluster id in etcd");
        }
        // The members' shared secret, from which each derives the credential it presents to the others.
        let secret: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
        create_if_absent(&mut client, &member_secret_key(), &secret).await?;
        Ok(Ok(Connected { client, section: section.clone() }))
    }

    /// The etcd client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The members' shared secret (see `rpc::auth::MemberKey`).
    pub async fn member_secret(&self) -> Result<String, ClusterError> {
        let endpoints = self.section.etcd.join(",");
        let unreachable =
            |e: etcd_client::Error| ClusterError::Unreachable { endpoints: endpoints.clone(), message: e.to_string() };
        let got = self.client.clone().get(member_secret_key(), None).await.map_err(unreachable)?;
        Ok(got.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()).unwrap_or_default())
    }

    /// Registers `advertised` (and the named listeners' addresses, `listeners`) under this broker's id.
    pub async fn register(
        self,
        advertised: &str,
        listeners: &std::collections::BTreeMap<String, String>,
    ) -> Result<Membership, ClusterError> {
        let Connected { mut client, section } = self;
        let endpoints = section.etcd.join(",");
        let unreachable =
            |e: etcd_client::Error| ClusterError::Unreachable { endpoints: endpoints.clone(), message: e.to_string() };
        let id = section.broker_id.unwrap_or_default();
        let ttl = section.lease_ttl;
        let listeners =
            if listeners.is_empty() { String::new() } else { serde_json::to_string(listeners).unwrap_or_default() };
        let registration = Registration {
            key: broker_key(id),
            id,
            advertised: advertised.to_owned(),
            listeners,
            ttl,
            endpoints: section.etcd.clone(),
        };
        let clock = Arc::new(LeaseClock::new(ttl));
        // A previous incarnation killed moments ago still holds the key until its lease runs out: wait that long.
        let waited_from = Instant::now();
        let lease = loop {
            let sent = Instant::now();
            match register(&mut client, &registration).await.map_err(unreachable)? {
                Ok(lease) => {
                    clock.renewed(sent);
                    break lease;
                }
                Err(holder) if waited_from.elapsed() > ttl + ttl / 2 => {
                    return Err(ClusterError::BrokerIdTaken { id, holder, waited: waited_from.elapsed() });
                }
                Err(holder) => {
                    tracing::info!(broker_id = id, %holder, "broker id still registered; waiting for its lease to expire");
                    tokio::time::sleep(ttl / 4).await;
                }
            }
        };
        tracing::info!(broker_id = id, advertised, lease_ttl = ?ttl, "joined the cluster");
        let stop = CancellationToken::new();
        let lease_id = Arc::new(AtomicI64::new(lease));
        let renewal = tokio::spawn(renew(
            client.clone(),
            registration,
            lease,
            Arc::clone(&clock),
            Arc::clone(&lease_id),
            stop.clone(),
        ));
        Ok(Membership { client, stop, renewal, lease: clock, lease_id })
    }
}

impl Membership {
    /// A handle on the etcd client this membership uses (clones share its connection).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The lease clock: until when this member may act.
    pub fn lease(&self) -> Arc<LeaseClock> {
        Arc::clone(&self.lease)
    }

    /// The id of the lease the registration is held under now (it changes when an expired one is replaced).
    pub fn lease_id(&self) -> Arc<AtomicI64> {
        Arc::clone(&self.lease_id)
    }

    /// Leaves the cluster: stops renewing and revokes the lease, so the registration goes at once.
    pub async fn leave(mut self) {
        self.stop.cancel();
        self.lease.lost();
        let Ok(lease) = self.renewal.await else { return };
        match self.client.lease_revoke(lease).await {
            Ok(_) => tracing::info!("left the cluster"),
            Err(e) => tracing::warn!(error = %e, "could not revoke the membership lease; it expires on its own"),
        }
    }
}

/// Creates `key` = `value` unless it exists; returns whether it did and the value stored afterwards.
async fn create_if_absent(client: &mut Client, key: &str, value: &str) -> Result<(bool, String), etcd_client::Error> {
    let txn = Txn::new()
        .when([Compare::version(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key, value, None)])
        .or_else([TxnOp::get(key, None)]);
    let response = client.txn(txn).await?;
    if response.succeeded() {
        return Ok((true, value.to_owned()));
    }
    Ok((false, stored_value(&response).unwrap_or_default()))
}

/// The value a transaction's `get` branch read, if any.
fn stored_value(response: &etcd_client::TxnResponse) -> Option<String> {
    response.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
        _ => None,
    })
}

/// Grants a lease and writes the registration under it if no one holds the key: `Ok(lease)`, or `Err(holder)`
/// with the holder's address (the unused lease is revoked).
async fn register(client: &mut Client, r: &Registration) -> Result<Result<i64, String>, etcd_client::Error> {
    let ttl = i64::try_from(r.ttl.as_secs()).unwrap_or(i64::MAX).max(1);
    let lease = client.lease_grant(ttl, None).await?.id();
    let mut puts = vec![TxnOp::put(r.key.as_str(), r.advertised.as_str(), Some(PutOptions::new().with_lease(lease)))];
    if !r.listeners.is_empty() {
        let key = crate::cluster::catalog::listeners_key(r.id);
        puts.push(TxnOp::put(key, r.listeners.as_str(), Some(PutOptions::new().with_lease(lease))));
    }
    let txn = Txn::new()
        .when([Compare::version(r.key.as_str(), CompareOp::Equal, 0)])
        .and_then(puts)
        .or_else([TxnOp::get(r.key.as_str(), None)]);
    let response = client.txn(txn).await?;
    if response.succeeded() {
        return Ok(Ok(lease));
    }
    let _ = client.lease_revoke(lease).await;
    Ok(Err(stored_value(&response).unwrap_or_default()))
}

/// Renews the lease every third of its TTL until `stop`, over one keep-alive stream that is opened again only
/// after it failed. A failed renewal is retried on the next beat; a lease that expired meanwhile (etcd answers with
/// TTL 0) is replaced and the registration written again. Returns the lease it held last.
async fn renew(
    mut client: Client,
    r: Registration,
    mut lease: i64,
    clock: Arc<LeaseClock>,
    lease_id: Arc<AtomicI64>,
    stop: CancellationToken,
) -> i64 {
    let mut beat = tokio::time::interval(r.ttl / 3);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut failures = 0u32;
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return lease,
            _ = beat.tick() => {}
        }
        if failures >= 2 {
            // Two renewals in a row failed: the connection itself may be stuck (streams hang where unary calls
            // pass, after etcd was frozen). A new one for the renewals.
            let options = ConnectOptions::new().with_connect_timeout(r.ttl / 3).with_timeout(r.ttl / 3);
            if let Ok(Ok(fresh)) =
                tokio::time::timeout(r.ttl / 3, Client::connect(r.endpoints.clone(), Some(options))).await
            {
                client = fresh;
                stream = None;
            }
        }
        let sent = Instant::now();
        // The whole exchange is bounded by a third of the TTL: a keep-alive stream that stopped answering (etcd
        // frozen, a half-open connection) is dropped and opened again at the next beat, never waited on for good.
        let exchange = async {
            match stream.take() {
                Some((mut keeper, mut answers)) => {
                    keeper.keep_alive().await?;
                    let answer = answers.message().await?;
                    let ttl = answer.map(|a| a.ttl());
                    if ttl.is_some_and(|ttl| ttl > 0) {
                        stream = Some((keeper, answers));
                    }
                    Ok(ttl)
                }
                // Opening the stream renews once and reads that answer; a lease etcd no longer knows is refused.
                None => match client.lease_keep_alive(lease).await {
                    Ok(open) => {
                        stream = Some(open);
                        Ok(Some(r.ttl.as_secs().max(1) as i64))
                    }
                    Err(etcd_client::Error::LeaseKeepAliveError(e)) if e.contains("not found") => Ok(Some(0)),
                    Err(e) => Err(e),
                },
            }
        };
        let mut renewed = match tokio::time::timeout(r.ttl / 3, exchange).await {
            Ok(answer) => answer,
            Err(_) => {
                stream = None;
                Err(etcd_client::Error::LeaseKeepAliveError(
                    "etcd did not answer the keep-alive within a third of the TTL".into(),
                ))
            }
        };
        if renewed.is_err() && failures >= 2 {
            // The keep-alive path keeps failing: ask etcd plainly whether the lease still lives, so that a lease
            // that expired meanwhile is replaced even while the streams are broken.
            let asked = tokio::time::timeout(r.ttl / 3, client.lease_time_to_live(lease, None)).await;
            if let Ok(Ok(answer)) = asked {
                if answer.ttl() <= 0 {
                    renewed = Ok(Some(0));
                }
            }
        }
        failures = if matches!(renewed, Ok(Some(_))) { 0 } else { failures + 1 };
        if failures > 0 && failures % 10 == 0 {
            let error = renewed.as_ref().err().map(|e| e.to_string()).unwrap_or_else(|| "stream closed".into());
            tracing::warn!(broker_id = r.id, failures, error, "membership lease renewals still failing");
        }
        match renewed {
            Ok(Some(ttl)) if ttl > 0 => {
                clock.renewed(sent);
                if failing {
                    tracing::info!(broker_id = r.id, "membership lease renewed again");
                    failing = false;
                }
            }
            Ok(Some(_)) => {
                stream = None;
                clock.lost();
                tracing::warn!(broker_id = r.id, "membership lease expired; registering again");
                let sent = Instant::now();
                match tokio::time::timeout(r.ttl, register(&mut client, &r)).await {
                    Err(_) => tracing::warn!(broker_id = r.id, "registering again timed out; will retry"),
                    Ok(Ok(Ok(new))) => {
                        lease = new;
                        lease_id.store(new, Ordering::Release);
                        clock.regranted(sent);
                        tracing::info!(broker_id = r.id, "registered again");
                    }
                    Ok(Ok(Err(holder))) => {
                        tracing::error!(broker_id = r.id, %holder, "broker id taken by another member meanwhile");
                    }
                    Ok(Err(e)) => tracing::warn!(broker_id = r.id, error = %e, "registering again failed; will retry"),
                }
            }
            Ok(None) => {
                stream = None;
                note_failure(&mut failing, r.id, "etcd closed the keep-alive stream");
            }
            Err(e) => note_failure(&mut failing, r.id, &e.to_string()),
        }
    }
}

/// Logs the first of a run of failed renewals (the next success says so too).
fn note_failure(failing: &mut bool, id: u32, error: &str) {
    if !*failing {
        tracing::warn!(broker_id = id, error, "membership lease renewal failed; will retry");
        *failing = true;
    }
}
