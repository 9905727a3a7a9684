//! Every `lag_sample_interval`, each message-model group's backlog and counters, into [`crate::core::history`]:
//! the group page's chart of the last hour and its rates. A cluster that cannot be read is skipped until the next
//! tick; the task ends on shutdown. The groups sampled: those ShareList names or with a dead-letter topic, and those the console was
//! asked about (a group page records a sample, so a group is followed from its first visit).

use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::api::{now_ms, read::group_names};
use crate::core::history::sample_of;

/// The sampling loop.
pub async fn run(state: AppState, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(state.config.lag_sample_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => sample(&state).await,
        }
    }
}

async fn sample(state: &AppState) {
    for c in state.clusters.iter() {
        let known = state.history.lock().groups(&c.name);
        let Ok((_, groups)) = group_names(c, &known).await else { continue };
        for g in groups.iter().take(crate::api::read::MAX_GROUPS_DESCRIBED) {
            let Ok(d) = c.share.describe(g).await else { continue };
            state.history.lock().record(&c.name, g, sample_of(&d, now_ms()));
        }
    }
}
