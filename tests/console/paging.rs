//! A topic with many partitions: its answer and its page list them a page at a time, exactly, with links to the
//! next and previous pages; an out-of-range page size is a 400 naming the field.

use ferry_client::admin::TopicConfig;

use crate::common::{Env, OPS};

const PARTITIONS: u32 = 120;

fn numbers(v: &serde_json::Value) -> Vec<u64> {
    v["partitions"].as_array().unwrap().iter().map(|p| p["partition"].as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_page_lists_its_partitions_a_page_at_a_time() -> anyhow::Result<()> {
    let env = Env::start().await?;
    env.admin.create_topic("wide", PARTITIONS, TopicConfig::default(), None).await?;
    let api = "/api/v1/clusters/dc1/topics/wide";

    // The default page: partitions 0..=99 of 120.
    let first = env.read(api).await?;
    assert_eq!(numbers(&first), (0..100).collect::<Vec<_>>());
    assert_eq!((first["partitions_total"].as_u64(), first["partitions_limit"].as_u64()), (Some(120), Some(100)));
    // Pages of 50: 0..=49, 50..=99, 100..=119, then none.
    for (from, want) in [(0u64, 0..50u64), (50, 50..100), (100, 100..120), (120, 120..120)] {
        let page = env.read(&format!("{api}?partitions_offset={from}&partitions_limit=50")).await?;
        assert_eq!(numbers(&page), want.collect::<Vec<_>>(), "from {from}");
        assert_eq!(page["partitions_offset"].as_u64(), Some(from));
    }
    for bad in ["partitions_limit=0", "partitions_limit=1001", "partitions_offset=-1", "bogus=1"] {
        let (s, e) = env.get(&format!("{api}?{bad}"), Some(OPS)).await?;
        assert_eq!((s, e["code"].as_str()), (400, Some("bad_request")), "{bad}: {e}");
    }
    let (_, e) = env.get(&format!("{api}?partitions_limit=0"), Some(OPS)).await?;
    assert!(e["reason"].as_str().unwrap_or_default().contains("partitions_limit"), "{e}");

    // The page: its table rows are exactly the page's partitions, with the links between pages.
    let page = |q: &'static str| {
        let url = env.url(&format!("/c/dc1/topics/wide{q}"));
        let http = env.http.clone();
        async move { anyhow::Ok(http.get(url).bearer_auth(OPS).send().await?.text().await?) }
    };
    let rows = |html: &str| -> Vec<u32> {
        (0..PARTITIONS).filter(|p| html.contains(&format!("/c/dc1/browse/wide/{p}?newest=true"))).collect()
    };
    let html = page("?partitions_limit=50").await?;
    assert_eq!(rows(&html), (0..50).collect::<Vec<_>>());
    assert!(html.contains("partitions 0..50 of 120"), "{html}");
    assert!(html.contains("id=\"next\" href=\"?partitions_offset=50&partitions_limit=50\""), "{html}");
    assert!(!html.contains("id=\"prev\""));
    let html = page("?partitions_offset=100&partitions_limit=50").await?;
    assert_eq!(rows(&html), (100..120).collect::<Vec<_>>());
    assert!(html.contains("partitions 100..120 of 120"), "{html}");
    assert!(html.contains("id=\"prev\" href=\"?partitions_offset=50&partitions_limit=50\""), "{html}");
    assert!(!html.contains("id=\"next\""));
    Ok(())
}
