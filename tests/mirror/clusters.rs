//! Issue 17: the mirror between Ferry clusters (an etcd and three or four brokers per datacenter, small segments,
//! short lease and lag intervals, fsync on every append).
//!
//! 1. raft3 to raft3 under load, two mirrors sharing the partitions through their group on the target cluster:
//!    kill -9 the source leader of a mirrored partition, then a target leader. The target topic is created raft3
//!    (`target.replication = "source"`), and ends identical to the source by digest, with every acknowledged
//!    record once, no gap, and no divergence raised.
//! 2. Route failover on a cluster: two named listeners per source broker, each route through its own proxies. The
//!    primary route is cut: the mirror switches to the backup route, whose listener addresses carry the copying
//!    from then on (the backup proxies forward at least every byte copied since); a source broker is drained while
//!    it copies. The target is identical, every record once.
//! 3. An unclean forced election on the source, after the mirror copied records only the old in-sync replicas had:
//!    the mirror raises `partition_diverged` at the new leader's end, truncates the target under
//!    `on_divergence = "truncate"`, and copies the new history: the target ends identical to the source.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use ferry_client::proto::PartitionPlacement;
use ferry_client::{Admin, BrokerClient, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use ferry_testkit::{BrokerProcess, EtcdProcess, MirrorProcess, Proxy, deadline, wait_until};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::common::*;

const TOPIC: &str = "orders";
/// The members' `cluster.lease_ttl`: a killed broker leaves the cluster this long after its last renewal.
const LEASE_TTL: Duration = Duration::from_secs(2);
/// The members' `cluster.replica_lag_max`.
const REPLICA_LAG_MAX: Duration = Duration::from_secs(2);
/// Value size of the loads' records.
const VALUE_SIZE: usize = 100;

/// A cluster member's config: `extra` goes into `[cluster]` (e.g. `[[cluster.listeners]]` tables).
fn member_config(etcd: &EtcdProcess, id: u32, extra: &str) -> String {
    format!(
        "[cluster]\netcd = [\"{}\"]\nbroker_id = {id}\nlease_ttl = \"{}\"\nreplica_lag_max = \"{}\"\nack_timeout = \
         \"8s\"\n{extra}\n[storage]\nflush = \"sync\"\nsegment_bytes = \"1MiB\"\nretention_check_interval = \
         \"200ms\"\n",
        etcd.url(),
        dur(LEASE_TTL),
        dur(REPLICA_LAG_MAX),
    )
}

/// One datacenter as a cluster: an etcd and its members, broker id `i + 1` at index `i`.
struct ClusterDc {
    name: String,
    _etcd: EtcdProcess,
    brokers: Vec<BrokerProcess>,
    /// A client of every member.
    client: BrokerClient,
}

impl ClusterDc {
    /// Starts an etcd and `members` brokers named (cluster id) `name`; `extra(id)` goes into each one's `[cluster]`.
    async fn start(name: &str, members: u32, extra: impl Fn(u32) -> String) -> anyhow::Result<ClusterDc> {
        ferry_testkit::init_tracing();
        let etcd = EtcdProcess::start().await?;
        let mut brokers = Vec::new();
        for id in 1..=members {
            let config = member_config(&etcd, id, &extra(id));
            brokers.push(BrokerProcess::builder().cluster_id(name).config(config).start().await?);
        }
        let addrs: Vec<String> = brokers.iter().map(|b| b.addr().to_string()).collect();
        let client = BrokerClient::new(ClientConfig::new(addrs))?;
        Ok(ClusterDc { name: name.to_owned(), _etcd: etcd, brokers, client })
    }

    /// The members' addresses as the inside of a TOML string array: `a", "b", "c`.
    fn brokers_toml(&self) -> String {
        self.brokers.iter().map(|b| b.addr().to_string()).collect::<Vec<_>>().join("\", \"")
    }

    fn member(&mut self, id: u32) -> &mut BrokerProcess {
        &mut self.brokers[id as usize - 1]
    }

    async fn placements(&self, topic: &str) -> anyhow::Result<Vec<PartitionPlacement>> {
        let mut parts = self.client.metadata_for(vec![topic.to_owned()]).await?.partitions;
        parts.sort_by_key(|p| p.partition);
        Ok(parts)
    }

    /// Waits until each of the `partitions` of `topic` has a leader, not `not`, with `isr` replicas in sync.
    async fn wait_led(&self, topic: &str, partitions: usize, isr: usize, not: u32) -> anyhow::Result<()> {
        let what = format!("{}:{topic} led on every partition with {isr} in sync, not by broker {not}", self.name);
        wait_until(&what, deadline(&[LEASE_TTL, REPLICA_LAG_MAX, DISCOVERY]), async || -> anyhow::Result<bool> {
            let parts = self.placements(topic).await?;
            Ok(parts.len() == partitions
                && parts.iter().all(|p| p.leader_id != 0 && p.leader_id != not && p.isr.len() == isr))
        })
        .await
    }

    /// A client of the current leader of `topic`/`partition`.
    async fn leader_client(&self, topic: &str, partition: u32) -> anyhow::Result<BrokerClient> {
        let parts = self.placements(topic).await?;
        let p = parts.iter().find(|p| p.partition == partition).context("no such partition")?;
        anyhow::ensure!(p.leader_id != 0, "{}:{topic}/{partition} has no leader", self.name);
        Ok(client_for(self.brokers[p.leader_id as usize - 1].addr()))
    }

    /// Every partition of `topic`, read from its leader (up to its high watermark).
    async fn read(&self, topic: &str, partitions: u32) -> anyhow::Result<Vec<PartitionData>> {
        let mut out = Vec::new();
        for p in 0..partitions {
            out.push(read_partition(&self.leader_client(topic, p).await?, topic, p, None).await?);
        }
        Ok(out)
    }

    /// The readable log ends of `topic` at its leaders, in partition order.
    async fn leos(&self, topic: &str, partitions: u32) -> anyhow::Result<Vec<u64>> {
        let mut out = Vec::new();
        for p in 0..partitions {
            let leader = Admin::new(self.leader_client(topic, p).await?);
            out.push(leader.describe_topic(topic).await?.partitions[p as usize].log_end_offset);
        }
        Ok(out)
    }
}

/// Where the target's copy is read.
trait Readable {
    async fn read_all(&self, topic: &str, partitions: u32) -> anyhow::Result<Vec<PartitionData>>;
    async fn ends(&self, topic: &str, partitions: u32) -> anyhow::Result<Vec<u64>>;
}

impl Readable for ClusterDc {
    async fn read_all(&self, topic: &str, partitions: u32) -> anyhow::Result<Vec<PartitionData>> {
        self.read(topic, partitions).await
    }
    async fn ends(&self, topic: &str, partitions: u32) -> anyhow::Result<Vec<u64>> {
        self.leos(topic, partitions).await
    }
}

impl Readable for Dc {
    async fn read_all(&self, topic: &str, _partitions: u32) -> anyhow::Result<Vec<PartitionData>> {
        read_topic(self, topic).await
    }
    async fn ends(&self, topic: &str, _partitions: u32) -> anyhow::Result<Vec<u64>> {
        self.leos(topic).await
    }
}

/// The mirror config from cluster `a` to the target named `target` at `target_brokers` (a TOML array's inside),
/// with `[target] replication = replication`.
fn cluster_conf(a: &ClusterDc, target: &str, target_brokers: String, policy: &str, replication: &str) -> String {
    let conf = MirrorConf {
        on_divergence: policy.into(),
        include: vec![format!("^{TOPIC}$")],
        exclude: Vec::new(),
        ..MirrorConf::between(&a.name, a.brokers_toml(), target, target_brokers)
    };
    conf.toml().replacen("[target]\n", &format!("[target]\nreplication = \"{replication}\"\n"), 1)
}

/// Record `i` of the load `tag`: [`record`]'s key, headers and timestamp, with a value of [`VALUE_SIZE`] bytes
/// that do not compress (a hash chain), so bytes on the wire can be compared with the records carried.
fn load_record(tag: &str, i: u64) -> ProducerRecord {
    let mut value = Vec::with_capacity(VALUE_SIZE + 32);
    let mut block = Sha256::digest(format!("{tag}-{i}"));
    while value.len() < VALUE_SIZE {
        value.extend_from_slice(&block);
        block = Sha256::digest(block);
    }
    value.truncate(VALUE_SIZE);
    ProducerRecord { value: Some(Bytes::from(value)), ..record(TOPIC, tag, i, 0) }
}

/// Keeps producing chunks of 100 acknowledged [`load_record`]s of `tag` through `client`, a chunk every 20 ms at
/// most (a steady load the two cores keep up with), until `stop`; returns how many were sent, each acknowledged.
/// The producer retries across leader changes for up to the deadline.
fn load(
    client: BrokerClient,
    tag: &'static str,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<anyhow::Result<u64>> {
    tokio::spawn(async move {
        let config = ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET, LEASE_TTL]), ..Default::default() };
        let p = Producer::new(client, config).await?;
        let mut pace = tokio::time::interval(Duration::from_millis(20));
        let mut next = 0u64;
        while !stop.is_cancelled() {
            pace.tick().await;
            send_all(&p, (next..next + 100).map(|i| load_record(tag, i))).await?;
            next += 100;
        }
        p.close().await;
        Ok(next)
    })
}

/// The total of `ends`.
fn total(ends: &[u64]) -> u64 {
    ends.iter().sum()
}

/// Waits until the target holds `more` records beyond `base` in all.
async fn wait_total_beyond(target: &impl Readable, partitions: u32, base: u64, more: u64) -> anyhow::Result<u64> {
    let what = format!("the target to hold {} records", base + more);
    let mut now = 0;
    wait_until(&what, io_deadline(), async || -> anyhow::Result<bool> {
        now = total(&target.ends(TOPIC, partitions).await?);
        Ok(now >= base + more)
    })
    .await?;
    Ok(now)
}

/// Waits until every target partition has its source partition's log end, then asserts the target identical to
/// the source, contiguous, with exactly the `produced` records of `tag` (each once); returns the source.
async fn assert_mirrored(
    source: &ClusterDc,
    target: &impl Readable,
    partitions: u32,
    tag: &str,
    produced: u64,
) -> anyhow::Result<Vec<PartitionData>> {
    wait_until("the target to reach the source's log ends", io_deadline(), async || -> anyhow::Result<bool> {
        let s = source.leos(TOPIC, partitions).await?;
        Ok(total(&s) == produced && target.ends(TOPIC, partitions).await.is_ok_and(|t| t == s))
    })
    .await?;
    let src = source.read(TOPIC, partitions).await?;
    let dst = target.read_all(TOPIC, partitions).await?;
    assert_eq!(src.len(), dst.len());
    let mut keys = BTreeSet::new();
    for (p, (s, d)) in src.iter().zip(&dst).enumerate() {
        let what = format!("{TOPIC}/{p}");
        s.assert_contiguous(&format!("source {what}"));
        d.assert_contiguous(&format!("target {what}"));
        assert_same_partition(&what, s, d);
        for r in &s.records {
            assert!(keys.insert(r.key.clone()), "{what}: record {:?} twice in the source", r.key);
        }
    }
    let want: BTreeSet<_> = (0..produced).map(|i| load_record(tag, i).key).collect();
    assert_eq!(keys, want, "the source holds every acknowledged record once");
    Ok(src)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft3_to_raft3_under_load_survives_a_source_and_a_target_leader_kill() -> anyhow::Result<()> {
    const PARTITIONS: u32 = 2;
    let (a, b) =
        tokio::join!(ClusterDc::start("dc-a", 3, |_| String::new()), ClusterDc::start("dc-b", 3, |_| String::new()));
    let (mut a, mut b) = (a?, b?);
    Admin::new(a.client.clone()).create_replicated_topic(TOPIC, PARTITIONS, "raft3").await?;
    a.wait_led(TOPIC, PARTITIONS as usize, 3, 0).await?;

    // Two mirrors of one group on the target cluster share the partitions.
    let config = cluster_conf(&a, "dc-b", b.brokers_toml(), "halt", "source");
    let (m1, m2) = tokio::join!(MirrorProcess::builder(&config).start(), MirrorProcess::builder(&config).start());
    let (m1, m2) = (m1?, m2?);
    let stop = CancellationToken::new();
    let producing = load(a.client.clone(), "load", stop.clone());

    // The mirror topic is raft3 on the target, like its source.
    b.wait_led(TOPIC, PARTITIONS as usize, 3, 0).await?;
    let created = Admin::new(b.client.clone()).describe_topic(TOPIC).await?;
    assert_eq!(created.topic.replication, "raft3", "{created:?}");
    let all: BTreeSet<_> = (0..PARTITIONS).map(|p| (TOPIC.to_owned(), p)).collect();
    wait_split(&m1, &m2, &all, deadline(&[SESSION, DISCOVERY, LEASE_TTL])).await?;
    let copied = wait_total_beyond(&b, PARTITIONS, 0, 300).await?;

    // kill -9 the source leader of partition 0: the mirror follows the new leader.
    let source_leader = a.placements(TOPIC).await?[0].leader_id;
    a.member(source_leader).kill9().await?;
    a.wait_led(TOPIC, PARTITIONS as usize, 2, source_leader).await?;
    let copied = wait_total_beyond(&b, PARTITIONS, copied, 300).await?;

    // Then a target leader: appends go to the new one, which has every acknowledged append.
    let target_leader = b.placements(TOPIC).await?[0].leader_id;
    b.member(target_leader).kill9().await?;
    b.wait_led(TOPIC, PARTITIONS as usize, 2, target_leader).await?;
    wait_total_beyond(&b, PARTITIONS, copied, 300).await?;

    stop.cancel();
    let produced = producing.await??;
    assert_mirrored(&a, &b, PARTITIONS, "load", produced).await?;
    for m in [&m1, &m2] {
        assert_no_divergence_nor_halt(m, "leaders killed on both sides").await?;
    }
    Ok(())
}

/// The `[[cluster.listeners]]` of source member `id`: "primary" and "backup", each advertised at its proxy.
fn listeners_toml(primary: &[Proxy], backup: &[Proxy], id: u32) -> String {
    let i = id as usize - 1;
    format!(
        "[[cluster.listeners]]\nname = \"primary\"\naddr = \"127.0.0.1:0\"\nadvertised = \"{}\"\n\n\
         [[cluster.listeners]]\nname = \"backup\"\naddr = \"127.0.0.1:0\"\nadvertised = \"{}\"\n",
        primary[i].addr(),
        backup[i].addr()
    )
}

/// Two routes, each through its own proxy of every source broker, naming its listener; fast probes.
fn routes_toml(primary: &[Proxy], backup: &[Proxy]) -> String {
    let list = |ps: &[Proxy]| ps.iter().map(|p| format!("{:?}", p.addr().to_string())).collect::<Vec<_>>().join(", ");
    format!(
        "[[source.routes]]\nname = \"primary\"\nbrokers = [{}]\nlistener = \"primary\"\n\n\
         [[source.routes]]\nname = \"backup\"\nbrokers = [{}]\nlistener = \"backup\"\n\n\
         [source.health]\ncheck_interval = \"200ms\"\ntimeout = \"300ms\"\nfailure_threshold = 2\nswitch_after = \
         \"1s\"\nmin_switch_interval = \"0s\"\n",
        list(primary),
        list(backup)
    )
}

/// The bytes the proxies forwarded to their clients.
fn forwarded(proxies: &[Proxy]) -> u64 {
    proxies.iter().map(|p| p.stats().bytes_to_client).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_primary_route_fails_over_to_the_backup_listener_and_a_drain_loses_nothing() -> anyhow::Result<()> {
    const PARTITIONS: u32 = 2;
    const MEMBERS: u32 = 4;
    // Every broker's two listeners are reached through proxies; they learn their upstream once it is bound.
    let nowhere = std::net::SocketAddr::from(([127, 0, 0, 1], 9));
    let (mut primary, mut backup) = (Vec::new(), Vec::new());
    for _ in 0..MEMBERS {
        primary.push(Proxy::start(nowhere).await?);
        backup.push(Proxy::start(nowhere).await?);
    }
    let (a, b) =
        tokio::join!(ClusterDc::start("dc-a", MEMBERS, |id| listeners_toml(&primary, &backup, id)), Dc::start("dc-b"));
    let (a, b) = (a?, b?);
    // The proxies forward to each broker's main listener: every listener serves the same API.
    for (i, broker) in a.brokers.iter().enumerate() {
        primary[i].set_upstream(broker.addr());
        backup[i].set_upstream(broker.addr());
    }
    Admin::new(a.client.clone()).create_replicated_topic(TOPIC, PARTITIONS, "raft3").await?;
    a.wait_led(TOPIC, PARTITIONS as usize, 3, 0).await?;

    let base = cluster_conf(&a, "dc-b", b.addr(), "halt", "single");
    let config = {
        let start = base.find("[[source.routes]]").expect("a routes table");
        let end = base.find("[target]").expect("a target table");
        format!("{}{}\n{}", &base[..start], routes_toml(&primary, &backup), &base[end..])
    };
    let mirror = MirrorProcess::builder(&config).start().await?;
    let stop = CancellationToken::new();
    let producing = load(a.client.clone(), "routes", stop.clone());
    wait_total_beyond(&b, PARTITIONS, 0, 300).await?;

    // Cut the primary route: the mirror switches to the backup. Records the source holds past this point can only
    // reach the mirror through the backup route.
    let backup_bytes = forwarded(&backup);
    for p in &primary {
        p.cut();
    }
    let at_cut = total(&a.leos(TOPIC, PARTITIONS).await?);
    let reaction = deadline(&[Duration::from_millis(500) * 3, Duration::from_secs(1), Duration::from_secs(2)]);
    wait_until("the mirror to switch to the backup route", reaction, async || -> anyhow::Result<bool> {
        Ok(monitor_get(&mirror, "/api/v1/egress").await?["active"] == "backup")
    })
    .await?;
    let at_switch = total(&b.leos(TOPIC).await?);

    // Drain the source leader of partition 0 while the mirror copies over the backup.
    let drained = a.placements(TOPIC).await?[0].leader_id;
    Admin::new(a.client.clone()).drain_broker(drained, false).await?;
    wait_until(&format!("broker {drained} drained"), deadline(&[LEASE_TTL, REPLICA_LAG_MAX, IO_BUDGET]), async || {
        let parts = a.placements(TOPIC).await?;
        anyhow::Ok(
            parts.iter().all(|p| !p.replicas.contains(&drained) && p.isr.len() == 3 && p.target_replicas.is_empty()),
        )
    })
    .await?;
    wait_total_beyond(&b, PARTITIONS, at_switch, 300).await?;

    stop.cancel();
    let produced = producing.await??;
    assert_mirrored(&a, &b, PARTITIONS, "routes", produced).await?;
    assert_no_divergence_nor_halt(&mirror, "route failover and a drain").await?;
    assert_eq!(monitor_get(&mirror, "/api/v1/egress").await?["active"], "backup");

    // Everything the source took after the cut came through the backup listener's addresses: its proxies forwarded
    // at least those records' value bytes (had the mirror been given the brokers' own addresses, they would carry
    // only probes and metadata).
    let since_cut = produced - at_cut;
    let carried = forwarded(&backup) - backup_bytes;
    assert!(
        carried >= since_cut * VALUE_SIZE as u64,
        "the backup proxies forwarded {carried} bytes since the cut, less than the values of the {since_cut} records \
         the source took since ({} bytes)",
        since_cut * VALUE_SIZE as u64
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unclean_election_on_the_source_is_a_divergence_and_truncate_follows_the_new_history() -> anyhow::Result<()>
{
    let (a, b) = tokio::join!(ClusterDc::start("dc-a", 3, |_| String::new()), Dc::start("dc-b"));
    let (mut a, b) = (a?, b?);
    let admin = Admin::new(a.client.clone());
    admin.create_replicated_topic(TOPIC, 1, "raft3").await?;
    a.wait_led(TOPIC, 1, 3, 0).await?;
    let placement = a.placements(TOPIC).await?.remove(0);
    let leader = placement.leader_id;
    let followers: Vec<u32> = placement.replicas.iter().copied().filter(|&r| r != leader).collect();
    let (kept, lagging) = (followers[0], followers[1]);

    // 300 records on all three; then one follower dies and 300 more reach only the other two.
    let p = Producer::new(
        a.client.clone(),
        ProducerConfig { delivery_timeout: deadline(&[IO_BUDGET, LEASE_TTL]), ..Default::default() },
    )
    .await?;
    produce_range(&p, TOPIC, "kept", 0, 300, VALUE_SIZE).await?;
    a.wait_led(TOPIC, 1, 3, 0).await?;
    a.member(lagging).kill9().await?;
    a.wait_led(TOPIC, 1, 2, lagging).await?;
    produce_range(&p, TOPIC, "kept", 300, 600, VALUE_SIZE).await?;
    p.close().await;

    let mirror = MirrorProcess::builder(cluster_conf(&a, "dc-b", b.addr(), "truncate", "single")).start().await?;
    wait_until("the mirror to copy 600 records", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(b.leos(TOPIC).await.is_ok_and(|l| l == [600]))
    })
    .await?;

    // Both in-sync replicas die; the lagging one comes back and is elected uncleanly: offsets 300.. are lost.
    a.member(leader).kill9().await?;
    a.member(kept).kill9().await?;
    a.member(lagging).restart().await?;
    let lagging_admin = Admin::new(client_for(a.member(lagging).addr()));
    let elected = ferry_testkit::wait_for("an unclean election", deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        anyhow::Ok(lagging_admin.elect_leader(TOPIC, 0, true).await.ok().filter(|e| e.leader_id == lagging))
    })
    .await?;
    assert!(elected.unclean, "{elected:?}");
    a.member(leader).restart().await?;
    a.member(kept).restart().await?;
    a.wait_led(TOPIC, 1, 3, 0).await?;

    // The new history: 500 records from offset 300.
    let p = Producer::new(a.client.clone(), ProducerConfig::default()).await?;
    produce_range(&p, TOPIC, "new-history", 0, 500, VALUE_SIZE).await?;
    p.close().await;

    wait_until("the target to follow the new history", io_deadline(), async || -> anyhow::Result<bool> {
        Ok(b.leos(TOPIC).await? == a.leos(TOPIC, 1).await? && a.leos(TOPIC, 1).await? == [800])
    })
    .await?;
    let src = a.read(TOPIC, 1).await?;
    let dst = read_topic(&b, TOPIC).await?;
    src[0].assert_contiguous("source");
    assert_same_partition("target after the unclean election", &src[0], &dst[0]);
    let kept_keys: Vec<_> = (0..300).map(|i| record(TOPIC, "kept", i, VALUE_SIZE).key).collect();
    let new_keys: Vec<_> = (0..500).map(|i| record(TOPIC, "new-history", i, VALUE_SIZE).key).collect();
    let keys: Vec<_> = src[0].records.iter().map(|r| r.key.clone()).collect();
    assert_eq!(keys, [kept_keys, new_keys].concat(), "the first 300, then the new history");

    // One partition_diverged at the new leader's end, under truncate.
    let events = monitor_events(&mirror, Some("partition_diverged")).await?;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!((&e["details"]["offset"], &e["details"]["cache_offset"]), (&300.into(), &600.into()), "{e}");
    assert_eq!(e["details"]["policy"], "truncate", "{e}");
    Ok(())
}
