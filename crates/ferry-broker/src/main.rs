//! `ferry-broker`: the broker daemon.

fn main() {}
