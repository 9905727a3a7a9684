//! `ferryctl cluster ...`: a cluster's status, draining a broker, and electing a partition's leader by hand
//! (docs/cluster.md).

mod status;

use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Subcommand;
use ferry_client::Admin;
use ferry_client::proto as pb;

use crate::common::{GlobalOpts, parse_duration};
use crate::output::Format;

/// `cluster` subcommands.
#[derive(Subcommand)]
pub enum ClusterCommand {
    /// The brokers, and per partition the leader, epoch, replicas, ISR, lag and state.
    Status {
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
        /// Also show the cluster's internal partitions (the committed offsets, whose leaders coordinate groups).
        #[arg(long)]
        internal: bool,
    },
    /// Move every leadership, then every replica, off a broker, and wait until none is left on it. The
    /// controller does the moves, so an interrupted wait loses nothing: run it again to go on waiting.
    Drain {
        /// The broker to drain.
        broker_id: u32,
        /// Stop draining it: moves made stay, nothing more moves.
        #[arg(long)]
        cancel: bool,
        /// Return once the drain is started instead of waiting for it.
        #[arg(long)]
        no_wait: bool,
        /// Longest wait; the drain goes on after it.
        #[arg(long, value_parser = parse_duration, default_value = "30m")]
        wait: Duration,
    },
    /// Elect a partition's leader: its first live in-sync replica. With --unclean, when no in-sync replica is
    /// live, a live out-of-sync one, which loses what only the in-sync ones had and starts a new partition epoch.
    Elect {
        /// Topic.
        topic: String,
        /// Partition.
        partition: u32,
        /// Allow an out-of-sync replica (records may be lost; a mirror downstream sees the history change).
        #[arg(long)]
        unclean: bool,
        /// Members of the old in-sync set you know to be down: an unclean election is refused while a live
        /// replica still holds a failsafe promise to one of them, unless it is named here.
        #[arg(long, value_name = "ID[,ID]", value_delimiter = ',', requires = "unclean")]
        dead: Vec<u32>,
    },
}

/// Runs a `cluster` subcommand.
pub async fn run(cmd: ClusterCommand, global: &GlobalOpts) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::Status { format, internal } => status::status(global, format, internal).await,
        ClusterCommand::Drain { broker_id, cancel, no_wait, wait } => {
            drain(global, broker_id, cancel, no_wait, wait).await
        }
        ClusterCommand::Elect { topic, partition, unclean, dead } => {
            let elected =
                Admin::new(global.client()?).elect_leader_naming_dead(&topic, partition, unclean, dead).await?;
            let how = if elected.unclean { "uncleanly: a new partition epoch starts" } else { "from the in-sync set" };
            println!(
                "{topic}/{partition}: broker {} leads at leader epoch {} (elected {how})",
                elected.leader_id, elected.leader_epoch
            );
            Ok(())
        }
    }
}

/// Partitions with a replica on `broker`, and how many of them it leads.
fn left_on(status: &pb::ClusterStatusResponse, broker: u32) -> (usize, usize) {
    let placements = status.partitions.iter().filter_map(|p| p.placement.as_ref());
    placements.fold((0, 0), |(on, leads), p| {
        (on + usize::from(p.replicas.contains(&broker)), leads + usize::from(p.leader_id == broker))
    })
}

async fn drain(global: &GlobalOpts, broker: u32, cancel: bool, no_wait: bool, wait: Duration) -> anyhow::Result<()> {
    let client = global.client()?;
    let draining = Admin::new(client.clone()).drain_broker(broker, cancel).await?;
    if cancel {
        println!("broker {broker} is no longer drained; brokers being drained: {draining:?}");
        return Ok(());
    }
    println!("draining broker {broker}: its leaderships, then its replicas, move to other brokers");
    if no_wait {
        return Ok(());
    }
    let started = Instant::now();
    let mut last = None;
    loop {
        let status = client.cluster_status(pb::ClusterStatusRequest {}).await?;
        let (on, leads) = left_on(&status, broker);
        if on == 0 {
            println!("broker {broker} is drained: no partition has a replica on it ({:.0?})", started.elapsed());
            return Ok(());
        }
        if last != Some((on, leads)) {
            println!("broker {broker}: {on} partition(s) still have a replica on it, {leads} led there");
            last = Some((on, leads));
        }
        if started.elapsed() >= wait {
            bail!(
                "broker {broker} still holds {on} partition(s) after {wait:?}; the drain goes on: run the command \
                 again to keep waiting"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
