//! Decisions without I/O: what a scan keeps and when it stops ([`scan`]), and how records derive from each other
//! ([`lineage`]), what a group looked like over the last hour ([`history`]), and which leader and transaction a
//! stored batch came from ([`provenance`]). The drivers in `api/` fetch and answer; these modules only decide, and
//! their tests are tables.

pub mod history;
pub mod idempotency;
pub mod lineage;
pub mod provenance;
pub mod scan;
