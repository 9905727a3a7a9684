//! Disaster recovery: `ferryctl failover` (through the mirror's monitor) and `ferryctl failback` (against both
//! primaries' brokers). docs/operations.md has the runbooks.

pub mod failback;
pub mod failover;
mod recover;
