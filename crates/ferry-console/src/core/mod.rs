//! Decisions without I/O: what a scan keeps and when it stops ([`scan`]), and how records derive from each other
//! ([`lineage`]). The drivers in `api/` fetch and answer; these modules only decide, and their tests are tables.

pub mod lineage;
pub mod scan;
