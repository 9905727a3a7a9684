//! `ferryctl`: Ferry's operator CLI.

fn main() {}
