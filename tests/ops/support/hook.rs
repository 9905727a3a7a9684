//! A webhook receiver on a free loopback port (axum): it answers 200 to every POST on `/hook` and records the JSON
//! bodies in arrival order, so tests can wait for a given alarm and check its fields.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::Value;

type Received = Arc<Mutex<Vec<Value>>>;

/// A running receiver; it stops when dropped.
pub struct Hook {
    /// `http://127.0.0.1:PORT/hook`.
    pub url: String,
    received: Received,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(State(received): State<Received>, body: Bytes) -> StatusCode {
    match serde_json::from_slice::<Value>(&body) {
        Ok(v) => {
            received.lock().unwrap_or_else(PoisonError::into_inner).push(v);
            StatusCode::OK
        }
        // A body that is not JSON is a product bug: record it so the test fails on it, and refuse it.
        Err(_) => {
            let text = String::from_utf8_lossy(&body).into_owned();
            received.lock().unwrap_or_else(PoisonError::into_inner).push(Value::String(text));
            StatusCode::BAD_REQUEST
        }
    }
}

impl Hook {
    /// Starts a receiver.
    pub async fn start() -> anyhow::Result<Hook> {
        let received: Received = Arc::default();
        let app = Router::new().route("/hook", post(accept)).with_state(Arc::clone(&received));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("bind the webhook receiver")?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Hook { url, received, task })
    }

    /// Every body received so far, in arrival order.
    pub fn received(&self) -> Vec<Value> {
        self.received.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The bodies of `event` received so far.
    pub fn of(&self, event: &str) -> Vec<Value> {
        self.received().into_iter().filter(|v| v["event"] == event).collect()
    }

    /// Waits (up to `limit`) for the first body of `event` that `accept` takes, and returns it.
    pub async fn wait(&self, event: &str, limit: Duration, accept: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
        ferry_testkit::wait_for(&format!("webhook {event}"), limit, async || self.of(event).into_iter().find(&accept))
            .await
            .with_context(|| format!("webhook bodies so far: {:#?}", self.received()))
    }
}
