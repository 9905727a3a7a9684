//! The broker core's admin rules: limits, and what a deletion does before the next admin call may start.

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
