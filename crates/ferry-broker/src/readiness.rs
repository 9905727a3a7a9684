//! The broker's readiness, as `GET /readyz` on the metrics listener answers it: 503 with the reason while it
//! starts (opening its data, waiting for etcd, taking unclean replicas out of the in-sync sets), 200 once it
//! serves.

use parking_lot::Mutex;

/// Why the broker is not serving yet, or that it is.
#[derive(Debug)]
pub struct Readiness {
    waiting: Mutex<Option<String>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness { waiting: Mutex::new(Some("starting".into())) }
    }
}

impl Readiness {
    /// The broker is not serving yet, because of `why`.
    pub fn waiting(&self, why: impl Into<String>) {
        *self.waiting.lock() = Some(why.into());
    }

    /// The broker serves.
    pub fn ready(&self) {
        *self.waiting.lock() = None;
    }

    /// `Ok` when serving, else why not.
    pub fn state(&self) -> Result<(), String> {
        match &*self.waiting.lock() {
            None => Ok(()),
            Some(why) => Err(why.clone()),
        }
    }
}
