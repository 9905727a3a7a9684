//! `FERRY_MIRROR__SECTION__KEY` environment variables override the config file (conf/mirror.toml): a list
//! (`FERRY_MIRROR__TOPICS__INCLUDE="^a$,^b$"`), a port, an interval and the mirror's name, each observed through
//! what the running mirror does.
//!
//! The file says: include only `^nothing$`, monitor on port 0, name "from-file", commit every hour. The environment
//! says: include `^env-` and `^also$`, monitor on a reserved port, name "from-env", commit every 500 ms. The mirror
//! copies exactly `env-a` and `also` (not `other`), its monitor answers on the reserved port and calls itself
//! "from-env", and its cache offsets reach the source group `ferry-mirror.from-env` while it runs, which the file's
//! one-hour interval would not allow.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_testkit::{MirrorProcess, deadline, reserve_port, wait_until};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_overrides_lists_ports_intervals_and_names() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    for t in ["env-a", "also", "other"] {
        a.create_topic(t, 2).await?;
        produce(&a, t, t, 300, 64).await?;
    }
    let mut conf = MirrorConf::new(&a, &b);
    conf.name = "from-file".into();
    conf.include = vec!["^nothing$".into()];
    conf.commit_interval = Duration::from_secs(3600);
    let commit = Duration::from_millis(500);
    let port = reserve_port()?;
    let mirror = MirrorProcess::builder(conf.toml())
        .env("FERRY_MIRROR__TOPICS__INCLUDE", "^env-,^also$")
        .env("FERRY_MIRROR__MONITOR__LISTEN", format!("127.0.0.1:{port}"))
        .env("FERRY_MIRROR__MIRROR__NAME", "from-env")
        .env("FERRY_MIRROR__SYNC__COMMIT_INTERVAL", dur(commit))
        .start()
        .await?;

    assert_eq!(mirror.addr().port(), port, "the monitor listens where the environment says");
    let status = monitor_get(&mirror, "/api/v1/status").await?;
    assert_eq!(status["mirror"], "from-env", "{status}");

    for t in ["env-a", "also"] {
        wait_caught_up(&a, t, &b, t, io_deadline()).await?;
        assert_identical(&a, t, &b, t).await?;
    }
    // Every topic existed before the start, so the first discovery round (which created the two above) saw
    // "other" and left it out.
    assert_eq!(b.topic_names().await?, ["also", "env-a"], "only the environment's include list is mirrored");

    // Commits every 500 ms while running, under the environment's name.
    let mut expected = BTreeMap::new();
    for t in ["also", "env-a"] {
        for (p, leo) in b.leos(t).await?.into_iter().enumerate() {
            assert!(leo > 0, "{t}/{p} holds records, so its offset is committed");
            expected.insert((t.to_owned(), p as u32), leo);
        }
    }
    let committed = async |group: &str| -> anyhow::Result<BTreeMap<(String, u32), u64>> {
        Ok(a.admin
            .fetch_committed_offsets(group, &[])
            .await?
            .into_iter()
            .map(|c| ((c.topic, c.partition), c.offset))
            .collect())
    };
    wait_until("the cache offsets in ferry-mirror.from-env", deadline(&[commit]), async || -> anyhow::Result<bool> {
        Ok(committed("ferry-mirror.from-env").await? == expected)
    })
    .await?;
    assert!(committed("ferry-mirror.from-file").await?.is_empty(), "nothing under the file's name");
    Ok(())
}
