//! Ferry's test harness: starts the real `ferry-broker` and `ferry-mirror` binaries on free loopback ports with
//! temporary directories and captured logs, provides a fault-injecting TCP proxy (cut, blackhole, delay line,
//! throttle, reset after the first response bytes), and deadline-based wait helpers.
