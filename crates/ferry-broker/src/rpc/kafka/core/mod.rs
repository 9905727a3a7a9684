//! The Kafka listener's decisions, without I/O or clocks: how a Kafka group member's view of its generation
//! meets the Ferry group it is a member of ([`group`]), and a connection's authentication ([`sasl`]).

pub mod group;
pub mod sasl;
