//! The soak's fault schedule: one fault at a time, drawn from the seeded generator, each healed before the next,
//! with a short drawn pause between them.
//!
//! The faults: a mirror killed with SIGKILL and restarted; a broker (source or target) crashing with tail loss
//! (SIGKILL, then the last few KiB of the newest segment of some partitions cut off, mid-batch or not, as a power
//! loss under async flush leaves it; then restarted on the same port, where recovery cuts the torn batch and bumps
//! the epoch); one source route cut or blackholed at the proxy, then healed; SIGHUP to a mirror; a scale-out
//! membership change (a mirror stopped with SIGTERM, started again later).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use anyhow::{Context, ensure};
use ferry_testkit::{MirrorProcess, Proxy, Signal, deadline, hold_fault};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::oracle::{Crash, History, Side, cut_tail, now_us};
use super::{CHECK_INTERVAL, FAILURE_THRESHOLD, SWITCH_AFTER};
use crate::common::{Dc, SESSION, SHUTDOWN_TIMEOUT};

/// The most a crash cuts off one partition's newest segment.
pub const MAX_CUT_BYTES: u64 = 8 * 1024;

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    KillMirror(usize),
    SourceCrash,
    TargetCrash,
    CutRoute(usize),
    BlackholeRoute(usize),
    Sighup(usize),
    Membership(usize),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Fault::KillMirror(_) => "mirror kill -9",
            Fault::SourceCrash => "source crash with tail loss",
            Fault::TargetCrash => "target crash with tail loss",
            Fault::CutRoute(_) => "route cut",
            Fault::BlackholeRoute(_) => "route blackhole",
            Fault::Sighup(_) => "mirror SIGHUP",
            Fault::Membership(_) => "scale-out member SIGTERM and restart",
        };
        f.write_str(name)
    }
}

/// Everything the faults act on.
pub struct Schedule<'a> {
    pub rng: StdRng,
    pub source: &'a mut Dc,
    pub target: &'a mut Dc,
    pub routes: &'a [Proxy],
    pub mirrors: &'a mut [MirrorProcess],
    pub history: History,
    pub topic: &'a str,
    pub partitions: u32,
}

impl Schedule<'_> {
    /// A schedule drawing from `seed`.
    pub fn rng(seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed)
    }

    fn draw(&mut self) -> Fault {
        let mirror = self.rng.random_range(0..self.mirrors.len());
        let route = self.rng.random_range(0..self.routes.len());
        // Weighted: crashes with tail loss are what the divergence rules are for, so they come most often.
        match self.rng.random_range(0..11) {
            0 | 1 => Fault::KillMirror(mirror),
            2..=4 => Fault::SourceCrash,
            5 | 6 => Fault::TargetCrash,
            7 => Fault::CutRoute(route),
            8 => Fault::BlackholeRoute(route),
            9 => Fault::Sighup(mirror),
            _ => Fault::Membership(mirror),
        }
    }

    /// Injects faults for `phase`, then returns how many of each kind it did.
    pub async fn run(&mut self, phase: Duration) -> anyhow::Result<BTreeMap<String, u32>> {
        let mut done: BTreeMap<String, u32> = BTreeMap::new();
        // The fault phase is a span of time by nature: faults land on whatever the pipeline is doing then.
        let end = tokio::time::Instant::now() + phase;
        let mut n = 0u32;
        while tokio::time::Instant::now() < end {
            let fault = self.draw();
            n += 1;
            tracing::info!(n, %fault, ?fault, "fault");
            self.inject(fault).await.with_context(|| format!("fault {n}: {fault} ({fault:?})"))?;
            *done.entry(fault.to_string()).or_default() += 1;
            // A short drawn pause, from half a probe to five probes of the routes, so that faults hit the pipeline
            // in every state of its recovery from the last one.
            let pause = self.hold(CHECK_INTERVAL * 5).max(CHECK_INTERVAL / 2);
            hold_fault(pause).await;
        }
        Ok(done)
    }

    /// A drawn time a fault lasts, up to `max` (drawn, so that the pipeline is hit before, while and after it
    /// reacts; the bounds come from the configured intervals at each call site).
    fn hold(&mut self, max: Duration) -> Duration {
        Duration::from_millis(self.rng.random_range(0..=max.as_millis() as u64))
    }

    async fn inject(&mut self, fault: Fault) -> anyhow::Result<()> {
        match fault {
            Fault::KillMirror(i) => {
                self.mirrors[i].kill9().await?;
                // Down for up to two sessions: sometimes the other member takes its partitions over first.
                let down = self.hold(SESSION * 2);
                hold_fault(down).await;
                self.mirrors[i].restart().await?;
            }
            Fault::SourceCrash => self.crash(Side::Source).await?,
            Fault::TargetCrash => self.crash(Side::Target).await?,
            Fault::CutRoute(r) | Fault::BlackholeRoute(r) => {
                if matches!(fault, Fault::CutRoute(_)) {
                    self.routes[r].cut();
                } else {
                    self.routes[r].blackhole();
                }
                // Long enough, at most, for the probes to fail the route and for the mirrors to switch away from
                // it (failure_threshold checks, then switch_after), with a 3x margin; often shorter.
                let detect = CHECK_INTERVAL * FAILURE_THRESHOLD + SWITCH_AFTER;
                let held = self.hold(detect * 3);
                hold_fault(held).await;
                self.routes[r].restore();
            }
            Fault::Sighup(i) => self.mirrors[i].send_signal(Signal::HUP)?,
            Fault::Membership(i) => {
                let status = self.mirrors[i].terminate(deadline(&[SHUTDOWN_TIMEOUT])).await?;
                ensure!(status.success(), "mirror {i} exited with {status} after SIGTERM");
                // Out of the group for up to two sessions while the other member mirrors everything.
                let out = self.hold(SESSION * 2);
                hold_fault(out).await;
                self.mirrors[i].restart().await?;
            }
        }
        Ok(())
    }

    /// SIGKILL, a cut of the newest segment's tail of a drawn non-empty set of partitions, restart.
    async fn crash(&mut self, side: Side) -> anyhow::Result<()> {
        let mut chosen: Vec<u32> = (0..self.partitions).filter(|_| self.rng.random_bool(0.5)).collect();
        if chosen.is_empty() {
            chosen.push(self.rng.random_range(0..self.partitions));
        }
        let sizes: Vec<u64> = chosen.iter().map(|_| self.rng.random_range(1..=MAX_CUT_BYTES)).collect();
        let dc = match side {
            Side::Source => &mut *self.source,
            Side::Target => &mut *self.target,
        };
        let down_us = now_us();
        dc.broker.kill9().await?;
        let mut cuts = BTreeMap::new();
        for (&p, &bytes) in chosen.iter().zip(&sizes) {
            let dir = dc.broker.data_dir().join(self.topic).join(p.to_string());
            if let Some(leo) = cut_tail(&dir, bytes)? {
                cuts.insert(p, leo);
            }
        }
        dc.broker.restart().await?;
        let up_us = now_us();
        tracing::info!(?side, ?cuts, "broker restarted after a crash with tail loss");
        self.history.record(Crash { side, down_us, up_us, cuts });
        Ok(())
    }
}
