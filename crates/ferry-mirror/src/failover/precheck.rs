//! The failover's pre-checks: which topics, the routes, the RPO against `max_rpo`, and what the Kafka-API sides
//! cannot do. Lag is reported and never gates: a fenced failover drains it.

use std::time::Duration;

use super::job::JobTopic;
use super::{Check, Deps, Refusal, Request};
use crate::config::ClusterKind;

/// The mirrored topics whose source name matches `pattern`.
pub fn select(deps: &Deps, pattern: &regex::Regex) -> Result<Vec<JobTopic>, Refusal> {
    let set = deps.topics.borrow().clone();
    if !set.discovered {
        return Err(Refusal::Unavailable("the mirror has not listed its topics yet; try again".into()));
    }
    let topics: Vec<JobTopic> = set
        .topics
        .values()
        .filter(|t| pattern.is_match(&t.source))
        .map(|t| JobTopic { source: t.source.clone(), target: t.target.clone(), partitions: t.partitions })
        .collect();
    if topics.is_empty() {
        let known: Vec<&str> = set.topics.keys().map(String::as_str).take(20).collect();
        return Err(Refusal::Bad(format!(
            "no mirrored topic matches {}; mirrored topics include: {}",
            pattern.as_str(),
            known.join(", ")
        )));
    }
    Ok(topics)
}

/// Records the target lacks now, over the partitions of `topics` this process mirrors.
pub fn lag(deps: &Deps, topics: &[JobTopic]) -> u64 {
    topics.iter().flat_map(|t| deps.shared.partition_views(Some(&t.source))).map(|v| v.lag).sum()
}

/// Runs every pre-check; the failed ones refuse the failover.
pub async fn run(deps: &Deps, topics: &[JobTopic], req: &Request, max_rpo: Option<Duration>) -> Vec<Check> {
    let mut checks = Vec::new();
    let check = |name: &str, ok: bool, detail: String| Check { name: name.to_owned(), ok, detail };
    checks.push(match (deps.target_kind, deps.target.limits().await) {
        (ClusterKind::Kafka, _) => check(
            "target",
            false,
            "a Kafka target's topics cannot be promoted by Ferry: stop the mirror and \
                                    move the applications by hand"
                .into(),
        ),
        (_, Ok(_)) => check("target", true, "reachable".into()),
        (_, Err(e)) => check("target", false, format!("not reachable: {e}")),
    });
    if req.source_unreachable {
        checks.push(check(
            "source",
            true,
            "skipped (--source-unreachable): no fence and no drain; records not on the target are reported, not \
             copied"
                .into(),
        ));
    } else if deps.source_kind == ClusterKind::Kafka {
        checks.push(check(
            "source",
            false,
            "a Kafka source cannot be fenced: stop its producers, wait for the lag to reach 0, and run with \
             --source-unreachable"
                .into(),
        ));
    } else {
        let view = deps.egress.view();
        let active = view.routes.iter().find(|r| r.active);
        let ok = active.is_some_and(|r| r.healthy);
        let detail = match active {
            Some(r) if r.healthy => format!("route {} healthy", r.name),
            Some(r) => format!(
                "route {} unhealthy ({}); switch routes, or run with --source-unreachable",
                r.name,
                r.last_error.as_deref().unwrap_or("no probe passed yet")
            ),
            None => "no active route".into(),
        };
        checks.push(check("source", ok, detail));
    }
    let rpos: Vec<(String, f64)> = topics
        .iter()
        .flat_map(|t| deps.shared.partition_views(Some(&t.source)))
        .map(|v| (format!("{}/{}", v.topic, v.partition), v.rpo_seconds))
        .collect();
    let worst = rpos.iter().map(|(_, r)| *r).fold(0.0, f64::max);
    match super::core::rpo_refusal(&rpos, max_rpo.map(|d| d.as_secs_f64())) {
        Some(reason) => checks.push(check("rpo", false, reason)),
        None => checks.push(check("rpo", true, format!("worst {worst:.1} s"))),
    }
    checks
}
