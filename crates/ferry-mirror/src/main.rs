//! `ferry-mirror`: the mirror daemon, one per datacenter pair.

fn main() {}
