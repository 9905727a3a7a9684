//! SIGHUP reloads the alarm rules of the running process (docs/alarms.md "SIGHUP reloads the rules ... a file with
//! problems is refused and the old rules stay"), observed at a webhook.
//!
//! The first rules send `remove_topic` to the "ops" webhook and `add_topic` nowhere; the second ones the other way
//! round. Topic changes on dc-a raise those events one at a time, and the webhook shows which rule was in force for
//! each. A third rules file names an unknown channel: the reload is refused with an error naming the problem, and
//! the second rules still apply. One channel delivers in order, so "not delivered" is proven by a later notice
//! arriving first.

use std::path::Path;

use ferry_testkit::{MirrorProcess, Signal, deadline, wait_until};
use serde_json::Value;

use crate::common::*;
use crate::support::hook::Hook;
use crate::support::*;

const FIRST: &str = "[events.add_topic]\nchannels = []\n\n[events.remove_topic]\nchannels = [\"ops\"]\n";
const SECOND: &str = "[events.add_topic]\nchannels = [\"ops\"]\n\n[events.remove_topic]\nchannels = []\n";
const BROKEN: &str = "[events.add_topic]\nchannels = [\"pager\"]\n\n[events.remove_topic]\nchannels = [\"ops\"]\n";

/// The topics of the webhook bodies of `event`, in arrival order.
fn topics_of(hook: &Hook, event: &str) -> Vec<String> {
    hook.of(event).iter().filter_map(|v| v["topic"].as_str().map(str::to_owned)).collect()
}

/// Writes `rules` through a sibling file and a rename, so the mirror never reads half of it.
fn write_rules(path: &Path, rules: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, rules)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Waits until the mirror's log holds `needle` `count` times.
async fn wait_log(mirror: &MirrorProcess, needle: &str, count: usize) -> anyhow::Result<()> {
    wait_until(&format!("{count} x {needle:?} in the mirror's log"), deadline(&[DISCOVERY]), async || {
        mirror.logs().matches(needle).count() >= count
    })
    .await
}

/// Waits until the monitor lists `kind` for `topic`.
async fn wait_event(mirror: &MirrorProcess, kind: &str, topic: &str) -> anyhow::Result<Value> {
    ferry_testkit::wait_for(&format!("{kind} for {topic}"), deadline(&[DISCOVERY, IO_BUDGET]), async || {
        events(mirror, kind).await.map(|list| list.into_iter().find(|e| e["topic"] == topic))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_alarm_rules_and_refuses_a_broken_file() -> anyhow::Result<()> {
    let (a, b) = two_dcs().await?;
    for t in ["before", "gone-1", "gone-2"] {
        a.create_topic(t, 1).await?;
    }
    let hook = Hook::start().await?;
    let rules_dir = tempfile::tempdir()?;
    let rules = rules_dir.path().join("rules.toml");
    write_rules(&rules, FIRST)?;
    let mut conf = OpsConf::new(&a, &b);
    conf.webhooks = vec![("ops".into(), hook.url.clone())];
    let text = conf.toml();
    assert!(text.contains("\n[alarms]\n"), "the config layout changed:\n{text}");
    let text = text.replace("\n[alarms]\n", &format!("\n[alarms]\nrules = {:?}\n", rules.display().to_string()));
    let mut mirror = MirrorProcess::builder(text).env("FERRY_MONITOR_TOKEN", TOKEN).start().await?;
    let pid = mirror.pid();
    let limit = deadline(&[DISCOVERY, IO_BUDGET]);
    for t in ["before", "gone-1", "gone-2"] {
        wait_event(&mirror, "add_topic", t).await?;
    }

    // First rules: remove_topic is sent, add_topic is not (it came first and would have arrived first).
    a.admin.delete_topic("gone-1").await?;
    hook.wait("remove_topic", limit, |v| v["topic"] == "gone-1").await?;
    assert_eq!(topics_of(&hook, "add_topic"), Vec::<String>::new(), "add_topic goes nowhere under the first rules");

    // Second rules.
    write_rules(&rules, SECOND)?;
    mirror.send_signal(Signal::HUP)?;
    wait_log(&mirror, "alarm rules and channels reloaded", 1).await?;
    a.admin.delete_topic("gone-2").await?;
    wait_event(&mirror, "remove_topic", "gone-2").await?;
    a.create_topic("after", 1).await?;
    hook.wait("add_topic", limit, |v| v["topic"] == "after").await?;
    assert_eq!(topics_of(&hook, "remove_topic"), ["gone-1"], "remove_topic goes nowhere under the second rules");
    assert_eq!(topics_of(&hook, "add_topic"), ["after"]);

    // A broken file: refused with the problem named; the second rules stay in force.
    write_rules(&rules, BROKEN)?;
    mirror.send_signal(Signal::HUP)?;
    wait_log(&mirror, "SIGHUP: the new config is invalid, keeping the old one", 1).await?;
    let logs = mirror.logs();
    let line = logs.lines().find(|l| l.contains("SIGHUP: the new config is invalid")).unwrap_or_default();
    assert!(line.contains("ERROR"), "logged as an error: {line}");
    assert!(logs.contains("unknown channel \"pager\""), "the refusal names the problem:\n{logs}");
    assert_eq!(logs.matches("alarm rules and channels reloaded").count(), 1, "the broken file was not applied");
    a.admin.delete_topic("before").await?;
    wait_event(&mirror, "remove_topic", "before").await?;
    a.create_topic("after-2", 1).await?;
    hook.wait("add_topic", limit, |v| v["topic"] == "after-2").await?;
    assert_eq!(topics_of(&hook, "remove_topic"), ["gone-1"]);
    assert_eq!(topics_of(&hook, "add_topic"), ["after", "after-2"]);
    assert!(mirror.is_running() && mirror.pid() == pid, "reloads need no restart");
    Ok(())
}
