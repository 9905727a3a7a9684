//! The Kafka listener's decisions, without I/O or clocks: how a Kafka group member's view of its generation
//! meets the Ferry group it is a member of ([`group`]), a connection's authentication ([`sasl`]), and what a Fetch's
//! session fields allow ([`session`]).

pub mod group;
pub mod sasl;
pub mod session;
