//! The broker core's admin rules: limits, creates side by side, and what a deletion does before the next admin call
//! may start.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

fn open(dir: &Path, limits: Limits) -> Arc<BrokerCore> {
    Arc::new(
        BrokerCore::open(ferry_storage::fs::os(), dir, Some("test"), LogConfig::default(), Default::default())
            .unwrap()
            .with_limits(limits),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_forgets_the_topics_offsets_before_another_admin_call_starts() {
    let dir = tempfile::tempdir().unwrap();
    let core = open(dir.path(), Limits::default());
    core.create_topic("t", 1, TopicSettings::default(), None).await.unwrap();
    let (ran, locked) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (r, l, c) = (Arc::clone(&ran), Arc::clone(&locked), Arc::clone(&core));
    core.delete_topic(
        "t",
        Box::new(move || {
            r.store(true, Ordering::SeqCst);
            // A create of the same name (or any admin call) waits for this: the admin lock is still held.
            l.store(c.admin.try_lock().is_err(), Ordering::SeqCst);
            Ok(())
        }),
    )
    .await
    .unwrap();
    assert!(ran.load(Ordering::SeqCst), "the follow-up ran");
    assert!(locked.load(Ordering::SeqCst), "the follow-up ran under the admin lock");
    assert!(core.topic("t").is_err());
    // A failing follow-up fails the deletion's answer, but the topic is gone.
    core.create_topic("u", 1, TopicSettings::default(), None).await.unwrap();
    let err =
        core.delete_topic("u", Box::new(|| Err(BrokerError::Internal("offsets store".into())))).await.unwrap_err();
    assert_eq!(err.to_string(), BrokerError::Internal("offsets store".into()).to_string());
    assert!(core.topic("u").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_count_every_topic_and_partition() {
    let dir = tempfile::tempdir().unwrap();
    let core = open(dir.path(), Limits { max_topics: 2, max_partitions: 4, max_subscribe_partitions: 1 });
    core.create_topic("a", 3, TopicSettings::default(), None).await.unwrap();
    let err = core.create_topic("b", 2, TopicSettings::default(), None).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.to_string().contains("limits.max_partitions"), "{err}");
    core.create_topic("b", 1, TopicSettings::default(), None).await.unwrap();
    let err = core.create_topic("c", 1, TopicSettings::default(), None).await.unwrap_err();
    assert!(err.to_string().contains("limits.max_topics"), "{err}");
    // What is on disk loads whatever the limits say.
    drop(core);
    let reopened = open(dir.path(), Limits { max_topics: 1, max_partitions: 1, max_subscribe_partitions: 1 });
    let names: Vec<String> = reopened.topics().iter().map(|t| t.meta().name).collect();
    assert_eq!(names, ["a", "b"]);
}

/// Creates `names` side by side, each with `partitions` partitions; the results in the order of `names`.
async fn create_all(core: &Arc<BrokerCore>, names: &[String], partitions: u32) -> Vec<Result<Arc<Topic>>> {
    let creates = names.iter().map(|n| core.create_topic(n, partitions, TopicSettings::default(), None));
    futures::future::join_all(creates).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_run_side_by_side_and_each_name_is_created_once() {
    let dir = tempfile::tempdir().unwrap();
    let core = open(dir.path(), Limits::default());
    // Forty different topics at once: every one is created, in the map and on disk.
    let names: Vec<String> = (0..40).map(|i| format!("t{i:02}")).collect();
    for r in create_all(&core, &names, 3).await {
        r.unwrap();
    }
    // Eight creates of one name at once: one wins, the others are told it exists, with the winner's id.
    let same = vec!["same".to_owned(); 8];
    let results = create_all(&core, &same, 2).await;
    let won: Vec<String> = results.iter().filter_map(|r| r.as_ref().ok()).map(|t| t.id()).collect();
    assert_eq!(won.len(), 1, "exactly one create of a name wins: {results:?}");
    for r in &results {
        if let Err(e) = r {
            assert!(
                matches!(e, BrokerError::TopicExists { topic, topic_id } if topic == "same" && *topic_id == won[0]),
                "{e}"
            );
        }
    }
    let mut all = names.clone();
    all.insert(0, "same".to_owned());
    let listed: Vec<String> = core.topics().iter().map(|t| t.meta().name).collect();
    assert_eq!(listed, all);
    drop(core);
    let reopened = open(dir.path(), Limits::default());
    let loaded: Vec<(String, u32)> = reopened.topics().iter().map(|t| (t.meta().name, t.partition_count())).collect();
    let expected: Vec<(String, u32)> = all.iter().map(|n| (n.clone(), if n == "same" { 2 } else { 3 })).collect();
    assert_eq!(loaded, expected, "every create is on disk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_under_way_count_against_the_limits() {
    let dir = tempfile::tempdir().unwrap();
    let core = open(dir.path(), Limits { max_topics: 5, max_partitions: 100, max_subscribe_partitions: 1 });
    let names: Vec<String> = (0..12).map(|i| format!("t{i:02}")).collect();
    let results = create_all(&core, &names, 2).await;
    let made = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(made, 5, "{results:?}");
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(e.to_string().contains("limits.max_topics"), "{e}");
    }
    assert_eq!(core.topics().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_caller_went_away_finishes_and_its_name_is_then_taken() {
    let dir = tempfile::tempdir().unwrap();
    let core = open(dir.path(), Limits::default());
    {
        // Polled once: the name is reserved and the work handed to the blocking pool; then the caller goes.
        let create = core.create_topic("gone", 4, TopicSettings::default(), None);
        tokio::pin!(create);
        assert!(futures::poll!(create.as_mut()).is_pending(), "the create waits on its files");
    }
    // A second create of the name waits for the first, then is told it exists: never a second set of files.
    let err = core.create_topic("gone", 1, TopicSettings::default(), None).await.unwrap_err();
    let topic = core.topic("gone").unwrap();
    assert!(matches!(&err, BrokerError::TopicExists { topic_id, .. } if *topic_id == topic.id()), "{err}");
    assert_eq!(topic.partition_count(), 4);
    drop((topic, core));
    let reopened = open(dir.path(), Limits::default());
    assert_eq!(reopened.topic("gone").unwrap().partition_count(), 4, "the abandoned create is on disk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_meets_a_full_disk_registers_nothing_and_releases_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flag = dir.path().join("disk-full");
    let fs: ferry_storage::fs::FsRef = Arc::new(ferry_storage::fs::JournalFs::with(None, Some(flag.clone())).unwrap());
    let core = BrokerCore::open(fs, &data, Some("test"), LogConfig::default(), Default::default()).unwrap();
    std::fs::write(&flag, b"").unwrap();
    let err = core.create_topic("full", 2, TopicSettings::default(), None).await.unwrap_err();
    assert!(err.to_string().contains("no space left on device"), "{err}");
    assert!(core.topic("full").is_err(), "a failed create registers nothing");
    // The disk has room again: the name was released, and the create goes through over what the failed one left.
    std::fs::remove_file(&flag).unwrap();
    core.create_topic("full", 2, TopicSettings::default(), None).await.unwrap();
    drop(core);
    let reopened = open(&data, Limits::default());
    let loaded: Vec<(String, u32)> = reopened.topics().iter().map(|t| (t.meta().name, t.partition_count())).collect();
    assert_eq!(loaded, [("full".to_owned(), 2)]);
}
