//! End-to-end tests of the mirror's operations side: egress failover and alarms (issue 5), and the monitor's API,
//! metrics and the verify tool (issue 6). Real processes throughout: `ferry-broker` processes as the datacenters
//! (dc-a the source, dc-b the target, dc-x a foreign cluster), the real `ferry-mirror`, the testkit's fault proxy on
//! the links, a real SMTP server (aiosmtpd) and a webhook receiver started by the test, and the real `ferryctl`.
//! Build the binaries first: `cargo build -p ferry-broker -p ferry-mirror -p ferryctl --bins`.
//!
//! Every wait polls a condition with a deadline of three times the configured intervals it depends on; data is
//! compared exactly (per partition: same offsets, records, batches, by count and digest; zero loss, zero
//! duplicates). The one fixed span is the 20 s target outage, which is the scenario itself ([`support::hold`]).

// The mirror suite's helpers (brokers as DCs, loads, exact partition reads and comparison); this binary uses a
// subset of them.
#[allow(dead_code)]
#[path = "../mirror/common.rs"]
mod common;

mod support;

mod api_errors;
mod dr_cluster;
mod dr_failback;
mod dr_failover;
mod failover;
mod lag;
mod rules_reload;
mod smtp_down;
mod switch_back;
mod target_cut;
mod totals;
mod wrong_cluster;
