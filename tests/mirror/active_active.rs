//! Scenario 6: active-active with `rename = "prefix"`. Two mirrors run together, dc-a -> dc-b and dc-b -> dc-a.
//! Every record exists once in each DC ("orders" of dc-a is "dc-a.orders" on dc-b and the other way round), the
//! copies are byte-identical (same batches, no added headers), and nothing loops: no "dc-b.dc-a.orders" or
//! "dc-a.dc-a.orders" ever appears, however many discovery rounds pass.

use ferry_testkit::deadline;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_active_with_prefixes_does_not_loop() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    a.create_topic("orders", 4).await?;
    b.create_topic("orders", 4).await?;
    let mut a_to_b = MirrorConf::new(&a, &b);
    a_to_b.rename = "prefix".into();
    let mut b_to_a = MirrorConf::new(&b, &a);
    b_to_a.rename = "prefix".into();
    let (m1, m2) = tokio::join!(a_to_b.start(), b_to_a.start());
    let (mut m1, mut m2) = (m1?, m2?);

    let (pa, pb) = tokio::join!(
        produce(&a, "orders", "made-in-dc-a", 3_000, 80),
        produce(&b, "orders", "made-in-dc-b", 3_000, 80)
    );
    pa?;
    pb?;
    let copy = deadline(&[DISCOVERY, IO_BUDGET]);
    wait_caught_up(&a, "orders", &b, "dc-a.orders", copy).await?;
    wait_caught_up(&b, "orders", &a, "dc-b.orders", copy).await?;

    // A second wave of records, copied while both mirrors hold each other's mirror topics.
    let (pa, pb) =
        tokio::join!(produce(&a, "orders", "second-wave-a", 500, 80), produce(&b, "orders", "second-wave-b", 500, 80));
    pa?;
    pb?;
    wait_caught_up(&a, "orders", &b, "dc-a.orders", copy).await?;
    wait_caught_up(&b, "orders", &a, "dc-b.orders", copy).await?;
    // Marker topics prove that discovery rounds ran after every mirror topic existed: a round that lists a marker
    // also listed every topic created before it, and would have mirrored a mirror topic in the same round.
    discovery_round(&b, &a, "marker-1", "dc-b.marker-1", copy).await?;
    discovery_round(&a, &b, "marker-2", "dc-a.marker-2", copy).await?;
    discovery_round(&b, &a, "marker-3", "dc-b.marker-3", copy).await?;
    discovery_round(&a, &b, "marker-4", "dc-a.marker-4", copy).await?;

    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        a.topic_names().await?,
        names(&["dc-b.marker-1", "dc-b.marker-3", "dc-b.orders", "marker-2", "marker-4", "orders"]),
        "topics on dc-a: local ones and dc-b's, each once, nothing mirrored back"
    );
    assert_eq!(
        b.topic_names().await?,
        names(&["dc-a.marker-2", "dc-a.marker-4", "dc-a.orders", "marker-1", "marker-3", "orders"]),
        "topics on dc-b: local ones and dc-a's, each once, nothing mirrored back"
    );
    let from_a = assert_identical(&a, "orders", &b, "dc-a.orders").await?;
    let from_b = assert_identical(&b, "orders", &a, "dc-b.orders").await?;
    // Each DC's records exist once per DC: the local topic holds only local records, the mirror only remote ones.
    for (parts, tag) in [(&from_a, "made-in-dc-a"), (&from_b, "made-in-dc-b")] {
        let records: Vec<&Rec> = parts.iter().flat_map(|p| &p.records).collect();
        assert_eq!(records.len(), 3_500);
        let second = if tag.ends_with('a') { "second-wave-a" } else { "second-wave-b" };
        for r in records {
            let tags: Vec<&[u8]> =
                r.headers.iter().filter(|(k, _)| k == "tag").filter_map(|(_, v)| v.as_deref()).collect();
            assert!(tags == [tag.as_bytes()] || tags == [second.as_bytes()], "foreign or extra tag on {r:?}");
            assert_eq!(r.headers.len(), 3, "no header is added on the way: {r:?}");
        }
    }
    assert!(m1.is_running() && m2.is_running());
    Ok(())
}
