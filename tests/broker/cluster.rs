//! Brokers under an etcd master (a real etcd on loopback): the first member writes the cluster id, every member
//! registers its advertised address under a lease, a graceful stop leaves at once and a kill -9 leaves when the
//! lease runs out; a broker of another cluster id, or with a broker id a live member holds, refuses to start
//! (exit 1) with one error naming what to fix, and etcd keeps what it had; a broker that cannot reach etcd at start
//! keeps trying, says so in its log and its readiness, and joins once etcd answers.

use std::process::Output;
use std::time::Duration;

use ferry_testkit::etcd_client::{Client, GetOptions};
use ferry_testkit::{BrokerProcess, EtcdProcess, deadline, wait_until};

use crate::common::{STOP_GRACE, error_lines, run_to_exit};

/// The members' lease TTL: the shortest allowed, so that an expiry is quick to wait for.
const LEASE_TTL: Duration = Duration::from_secs(2);

fn member_config(etcd: &EtcdProcess, id: u32) -> String {
    format!("[cluster]\netcd = [\"{}\"]\nbroker_id = {id}\nlease_ttl = \"2s\"\n", etcd.url())
}

/// Every key under `/ferry/` with its value and whether it is held by a lease, in key order; but the controller's,
/// which a member takes a beat after it joined (the raft3 tests cover the controller), and the members' secret,
/// whose value is random (it is checked apart).
async fn ferry_keys(client: &mut Client) -> anyhow::Result<Vec<(String, String, bool)>> {
    let got = client.get("/ferry/", Some(GetOptions::new().with_prefix())).await?;
    Ok(got
        .kvs()
        .iter()
        .filter(|kv| kv.key() != b"/ferry/controller" && kv.key() != b"/ferry/member_secret")
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.lease() != 0,
            )
        })
        .collect())
}

/// Runs a broker that is expected to refuse to start, on a fresh data dir; returns its output.
async fn refused(config: &str, cluster_id: &str, within: Duration) -> anyhow::Result<Output> {
    let dir = tempfile::tempdir()?;
    run_to_exit(config, &dir.path().join("data"), cluster_id, within).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_register_under_leases_and_leave_on_stop_or_when_the_lease_runs_out() -> anyhow::Result<()> {
    let etcd = EtcdProcess::start().await?;
    let mut client = etcd.client().await?;
    let mut one = BrokerProcess::builder().cluster_id("dc-a").config(member_config(&etcd, 1)).start().await?;
    let mut two = BrokerProcess::builder().cluster_id("dc-a").config(member_config(&etcd, 2)).start().await?;
    assert_eq!(
        ferry_keys(&mut client).await?,
        [
            ("/ferry/brokers/1".to_owned(), one.addr().to_string(), true),
            ("/ferry/brokers/2".to_owned(), two.addr().to_string(), true),
            ("/ferry/cluster_id".to_owned(), "dc-a".to_owned(), false),
        ]
    );
    // The members' shared secret: written once by the first member, 64 hex digits, under no lease.
    let secret = client.get("/ferry/member_secret", None).await?;
    let kv = &secret.kvs()[0];
    assert_eq!((kv.value().len(), kv.lease()), (64, 0));
    assert!(kv.value().iter().all(u8::is_ascii_hexdigit));

    // A graceful stop revokes the lease: the member is gone by the time the process has exited.
    assert_eq!(two.terminate(STOP_GRACE).await?.code(), Some(0));
    let keys: Vec<String> = ferry_keys(&mut client).await?.into_iter().map(|(k, _, _)| k).collect();
    assert_eq!(keys, ["/ferry/brokers/1", "/ferry/cluster_id"]);

    // A killed member stops renewing: it leaves once its lease runs out, and the cluster id stays.
    one.kill9().await?;
    wait_until("the killed member's lease to run out", deadline(&[LEASE_TTL, LEASE_TTL]), async || {
        ferry_keys(&mut client).await.map(|k| k.len() == 1)
    })
    .await?;
    assert_eq!(ferry_keys(&mut client).await?, [("/ferry/cluster_id".to_owned(), "dc-a".to_owned(), false)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cluster_id_or_a_held_broker_id_is_refused_and_etcd_keeps_what_it_had() -> anyhow::Result<()> {
    let etcd = EtcdProcess::start().await?;
    let mut client = etcd.client().await?;
    let one = BrokerProcess::builder().cluster_id("dc-a").config(member_config(&etcd, 1)).start().await?;
    let before = ferry_keys(&mut client).await?;

    let out = refused(&member_config(&etcd, 2), "dc-b", deadline(&[Duration::from_secs(5)])).await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("this broker's cluster id is \"dc-b\" but the cluster in etcd")
            && lines[0].contains("is \"dc-a\""),
        "{lines:?}"
    );

    // The same broker id as a live member: refused once the wait for a previous incarnation's lease is over.
    let out = refused(&member_config(&etcd, 1), "dc-a", deadline(&[LEASE_TTL, LEASE_TTL])).await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = error_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(&format!("broker id 1 is held by a live member at {}", one.addr())), "{lines:?}");
    assert_eq!(ferry_keys(&mut client).await?, before, "a refused broker changed etcd");

    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_cannot_reach_etcd_at_start_keeps_trying_says_so_and_joins_once_it_answers() -> anyhow::Result<()>
{
    let etcd = EtcdProcess::start().await?;
    let link = ferry_testkit::Proxy::start(etcd.url().trim_start_matches("http://").parse()?).await?;
    link.cut();
    let metrics = ferry_testkit::reserve_port()?;
    let config = format!("[cluster]\netcd = [\"{}\"]\nbroker_id = 1\nlease_ttl = \"2s\"\n", link.endpoint());
    let starting = tokio::spawn(
        BrokerProcess::builder()
            .cluster_id("dc-a")
            .config(config)
            .env(ferry_testkit::METRICS_LISTEN_VAR, format!("127.0.0.1:{metrics}"))
            .start(),
    );
    // Not ready, and it says why: it waits for etcd, naming the endpoint, and keeps trying.
    let readyz = format!("http://127.0.0.1:{metrics}/readyz");
    let why =
        ferry_testkit::wait_for("the starting broker's readiness", deadline(&[Duration::from_secs(5)]), async || {
            let Ok(r) = reqwest::get(&readyz).await else { return anyhow::Ok(None) };
            let status = r.status();
            let text = r.text().await?;
            Ok((status == 503 && text.contains("attempt 2")).then_some(text))
        })
        .await?;
    assert!(why.starts_with(&format!("not ready: waiting for etcd at {}", link.endpoint())), "{why}");
    assert!(!starting.is_finished(), "it must not give up while etcd is away");
    // etcd answers: it joins, serves, and is ready.
    link.restore();
    let broker = starting.await??;
    let mut client = etcd.client().await?;
    assert_eq!(
        ferry_keys(&mut client).await?,
        [
            ("/ferry/brokers/1".to_owned(), broker.addr().to_string(), true),
            ("/ferry/cluster_id".to_owned(), "dc-a".to_owned(), false),
        ]
    );
    assert_eq!(reqwest::get(&readyz).await?.text().await?, "ready\n");
    assert!(broker.logs().contains("event=\"etcd_unreachable_at_start\""), "{}", broker.logs());
    Ok(())
}
