//! Each channel's bounded queue (drop-oldest) and its worker task, which is what keeps a failing or hanging
//! channel from ever blocking the EventBus subscriber or mirroring: the dispatcher only pushes, never waits.
//!
//! Outcomes are counted in `ferry_alarms_total{channel,outcome}`: `sent` and `failed` by the worker, `dropped`
//! when a full queue pushes out its oldest notice or when notices are still queued at shutdown.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::channel::Channel;
use super::notice::Notice;
use crate::metrics::Metrics;

#[derive(Debug, Default)]
struct State {
    items: VecDeque<Notice>,
    closed: bool,
}

/// A bounded FIFO that drops its oldest item when full. One consumer.
#[derive(Debug)]
pub struct NoticeQueue {
    state: Mutex<State>,
    ready: Notify,
    capacity: usize,
}

impl NoticeQueue {
    /// An empty queue holding at most `capacity` (at least 1) notices.
    pub fn new(capacity: usize) -> NoticeQueue {
        NoticeQueue { state: Mutex::new(State::default()), ready: Notify::new(), capacity: capacity.max(1) }
    }

    /// Appends `notice`; returns the oldest notice when it had to make room (or `notice` itself once closed).
    pub fn push(&self, notice: Notice) -> Option<Notice> {
        let dropped = {
            let mut s = self.state.lock();
            if s.closed {
                return Some(notice);
            }
            let dropped = if s.items.len() >= self.capacity { s.items.pop_front() } else { None };
            s.items.push_back(notice);
            dropped
        };
        // One consumer: a stored permit wakes it even if it is not waiting yet.
        self.ready.notify_one();
        dropped
    }

    /// The next notice; `None` once the queue is closed and empty.
    pub async fn pop(&self) -> Option<Notice> {
        loop {
            {
                let mut s = self.state.lock();
                if let Some(n) = s.items.pop_front() {
                    return Some(n);
                }
                if s.closed {
                    return None;
                }
            }
            self.ready.notified().await;
        }
    }

    /// Refuses further pushes; the consumer drains what is queued, then gets `None`.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_one();
    }

    /// Takes every queued notice.
    pub fn drain(&self) -> Vec<Notice> {
        self.state.lock().items.drain(..).collect()
    }
}

/// Delivers the notices of `queue` through `channel` one at a time until the queue is closed and drained, or
/// `stop` (which abandons an in-flight delivery). Whatever is left then is counted as dropped.
pub async fn run_worker(channel: Arc<Channel>, queue: Arc<NoticeQueue>, metrics: Metrics, stop: CancellationToken) {
    let name = channel.name().to_owned();
    loop {
        let notice = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            n = queue.pop() => match n { Some(n) => n, None => break },
        };
        let event = notice.event.kind.name();
        let key = notice.event.key();
        let result = tokio::select! {
            biased;
            _ = stop.cancelled() => {
                metrics.alarm(&name, "dropped");
                tracing::warn!(channel = %name, event, key, "alarm delivery abandoned at shutdown");
                break;
            }
            r = Box::pin(channel.send(&notice)) => r,
        };
        match result {
            Ok(()) => {
                metrics.alarm(&name, "sent");
                tracing::info!(channel = %name, event, key, notice = notice.kind.name(), "alarm sent");
            }
            Err(e) => {
                metrics.alarm(&name, "failed");
                tracing::warn!(channel = %name, event, key, error = %e, "alarm delivery failed");
            }
        }
    }
    let left = queue.drain().len() as u64;
    if left > 0 {
        metrics.alarm_by(&name, "dropped", left);
        tracing::warn!(channel = %name, count = left, "alarms still queued at shutdown were dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alarm::notice::NoticeKind;
    use crate::events::{Event, EventKind, Severity};

    fn notice(i: u32) -> Notice {
        let e = Event::new(EventKind::SyncError, format!("n{i}")).partition("t", i);
        Notice { event: Arc::new(e), severity: Severity::Critical, kind: NoticeKind::Alarm }
    }

    fn messages(q: &NoticeQueue) -> Vec<String> {
        q.drain().into_iter().map(|n| n.event.message.clone()).collect()
    }

    #[test]
    fn a_full_queue_drops_its_oldest() {
        let q = NoticeQueue::new(3);
        let dropped: Vec<_> = (0..5).filter_map(|i| q.push(notice(i))).map(|n| n.event.message.clone()).collect();
        assert_eq!(dropped, ["n0", "n1"]);
        assert_eq!(messages(&q), ["n2", "n3", "n4"]);
        assert!(messages(&q).is_empty());
        q.close();
        assert_eq!(q.push(notice(9)).map(|n| n.event.message.clone()).as_deref(), Some("n9"), "closed: refused");
    }

    #[tokio::test]
    async fn pop_waits_for_a_push_and_ends_after_close_and_drain() {
        let q = Arc::new(NoticeQueue::new(10));
        let consumer = tokio::spawn({
            let q = Arc::clone(&q);
            async move {
                let mut got = Vec::new();
                while let Some(n) = q.pop().await {
                    got.push(n.event.message.clone());
                }
                got
            }
        });
        for i in 0..4 {
            assert!(q.push(notice(i)).is_none());
        }
        q.close();
        assert_eq!(consumer.await.unwrap(), ["n0", "n1", "n2", "n3"]);
    }
}
