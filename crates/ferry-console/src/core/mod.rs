//! Decisions without I/O: what a scan keeps and when it stops ([`scan`]), and how records derive from each other
//! ([`lineage`]), and what a group looked like over the last hour ([`history`]). The drivers in `api/` fetch and answer; these modules only decide, and their tests are tables.

pub mod history;
pub mod lineage;
pub mod scan;
