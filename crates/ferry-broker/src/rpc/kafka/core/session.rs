//! Fetch sessions (KIP-227), which the listener does not keep: what a Fetch's session id and epoch allow.

/// Kafka's FETCH_SESSION_ID_NOT_FOUND.
pub const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;

/// The top-level error of a Fetch at session `epoch`; 0 when it is answered in full, with session id 0 (no session
/// made). As Kafka does, a full request (epoch 0, which would open a session, or -1, none) is answered whatever
/// session id it names (one it closes); an incremental one (any other epoch) needs a session, and none is kept.
pub fn check(epoch: i32) -> i16 {
    match epoch {
        0 | -1 => 0,
        _ => FETCH_SESSION_ID_NOT_FOUND,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_fetches_are_answered() {
        let cases = [(-1, 0), (0, 0), (1, FETCH_SESSION_ID_NOT_FOUND), (9, FETCH_SESSION_ID_NOT_FOUND)];
        for (epoch, want) in cases.into_iter().chain([(-2, FETCH_SESSION_ID_NOT_FOUND), (i32::MAX, 70)]) {
            assert_eq!(check(epoch), want, "epoch {epoch}");
        }
    }
}
