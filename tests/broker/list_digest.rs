//! `ListTopics` with a digest: a broker asked with the digest of its current list answers `unchanged` and sends no
//! topic; any change to the list (a topic created, deleted, grown or reconfigured) answers the whole new list with
//! a new digest. The mirror's discovery asks this way every round.

use ferry_client::admin::TopicConfig;

use crate::common::{connect, start_broker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_topics_answers_unchanged_to_its_own_digest_and_the_whole_list_after_any_change() -> anyhow::Result<()> {
    let broker = start_broker("").await?;
    let (_, admin) = connect(&broker);
    admin.create_topic("a", 2, TopicConfig::default(), None).await?;
    admin.create_topic("b", 1, TopicConfig::default(), None).await?;
    let names = |list: &Option<Vec<ferry_client::proto::TopicInfo>>| -> Option<Vec<(String, u32)>> {
        list.as_ref().map(|l| l.iter().map(|t| (t.name.clone(), t.partitions)).collect())
    };

    let (first, digest) = admin.list_topics_since(&[]).await?;
    assert_eq!(names(&first), Some(vec![("a".into(), 2), ("b".into(), 1)]));
    assert_eq!(first.clone(), Some(admin.list_topics().await?), "the same list as a plain ask");
    assert_eq!(digest.len(), 32);
    assert_eq!(admin.list_topics_since(&digest).await?, (None, digest.clone()), "nothing changed");

    // Each change gives the whole new list, and its new digest is then unchanged in turn.
    let mut last = digest;
    let changes: [(&str, Vec<(String, u32)>); 4] = [
        ("create c", vec![("a".into(), 2), ("b".into(), 1), ("c".into(), 1)]),
        ("grow a", vec![("a".into(), 3), ("b".into(), 1), ("c".into(), 1)]),
        ("reconfigure b", vec![("a".into(), 3), ("b".into(), 1), ("c".into(), 1)]),
        ("delete c", vec![("a".into(), 3), ("b".into(), 1)]),
    ];
    for (change, expected) in changes {
        match change {
            "create c" => drop(admin.create_topic("c", 1, TopicConfig::default(), None).await?),
            "grow a" => drop(admin.alter_partitions("a", 3).await?),
            "reconfigure b" => {
                let config = TopicConfig { retention_ms: Some(3_600_000), ..TopicConfig::default() };
                drop(admin.alter_topic_config("b", config).await?)
            }
            _ => admin.delete_topic("c").await?,
        }
        let (list, digest) = admin.list_topics_since(&last).await?;
        assert_eq!(names(&list), Some(expected), "{change}");
        assert_ne!(digest, last, "{change}");
        if change == "reconfigure b" {
            let b = list.iter().flatten().find(|t| t.name == "b").and_then(|t| t.config.clone()).unwrap_or_default();
            assert_eq!(b.retention_ms, Some(3_600_000));
        }
        assert_eq!(admin.list_topics_since(&digest).await?, (None, digest.clone()), "after {change}");
        last = digest;
    }
    Ok(())
}
