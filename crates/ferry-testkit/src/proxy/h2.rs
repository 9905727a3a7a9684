//! Follows the HTTP/2 frame boundaries of the server-to-client byte stream, so the proxy can drop a connection
//! exactly where a response starts: the first HEADERS frame (type 0x1) on a non-zero stream. A server sends no
//! preface magic, so its stream is frames from the first byte: 9-byte headers (24-bit payload length, type,
//! flags, reserved bit + 31-bit stream id) each followed by its payload.
//!
//! The tracker runs on every connection, whether or not a reset is armed, so it is in sync when one is. On a
//! stream that is not HTTP/2 it reads garbage, which is harmless while no reset is armed.

/// Frame type of HEADERS (RFC 9113 §6.2).
const HEADERS: u8 = 0x1;
/// Size of a frame header.
const HEADER_LEN: usize = 9;

/// Incremental frame-boundary tracker.
#[derive(Debug, Default)]
pub(crate) struct FrameTracker {
    header: [u8; HEADER_LEN],
    have: usize,
    payload_left: u64,
}

impl FrameTracker {
    /// Scans the next chunk of the stream. For every response HEADERS frame header completed in this chunk it
    /// asks `take` whether to cut here; when `take` says yes, returns the offset in `chunk` where that frame
    /// header starts (0 if it began in an earlier chunk, whose bytes are already gone). Bytes from that offset
    /// on must not be forwarded. After a cut, the tracker's state no longer matters: the connection is closed.
    pub(crate) fn scan(&mut self, chunk: &[u8], mut take: impl FnMut() -> bool) -> Option<usize> {
        let mut i = 0;
        while i < chunk.len() {
            if self.payload_left > 0 {
                let skip = self.payload_left.min((chunk.len() - i) as u64);
                self.payload_left -= skip;
                i += skip as usize;
                continue;
            }
            self.header[self.have] = chunk[i];
            self.have += 1;
            i += 1;
            if self.have == HEADER_LEN {
                self.have = 0;
                let h = &self.header;
                self.payload_left = u64::from(u32::from_be_bytes([0, h[0], h[1], h[2]]));
                let frame_type = h[3];
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                if frame_type == HEADERS && stream != 0 && take() {
                    return Some(i.saturating_sub(HEADER_LEN));
                }
            }
        }
        None
    }
}

/// Builds a frame header (used by tests here and in the proxy tests).
#[cfg(test)]
pub(crate) fn frame_header(len: u32, frame_type: u8, flags: u8, stream: u32) -> [u8; HEADER_LEN] {
    let l = len.to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], frame_type, flags, s[0], s[1], s[2], s[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: u32, frame_type: u8, stream: u32) -> Vec<u8> {
        let mut f = frame_header(len, frame_type, 0, stream).to_vec();
        f.extend(std::iter::repeat_n(0xAB, len as usize));
        f
    }

    #[test]
    fn finds_response_headers_after_settings() {
        let mut stream = frame(6, 0x4, 0); // SETTINGS on stream 0
        stream.extend(frame(0, 0x4, 0)); // SETTINGS ack
        let at = stream.len();
        stream.extend(frame(5, HEADERS, 1));
        let mut t = FrameTracker::default();
        assert_eq!(t.scan(&stream, || true), Some(at));
    }

    #[test]
    fn ignores_headers_when_not_armed_and_on_stream_zero() {
        let mut stream = frame(3, HEADERS, 0);
        stream.extend(frame(2, HEADERS, 3));
        let mut t = FrameTracker::default();
        let mut asked = 0;
        assert_eq!(
            t.scan(&stream, || {
                asked += 1;
                false
            }),
            None
        );
        assert_eq!(asked, 1, "asked only for the stream-3 HEADERS");
    }

    #[test]
    fn follows_frames_split_at_every_byte() {
        let mut stream = frame(100, 0x0, 1); // DATA
        stream.extend(frame(4, 0x8, 0)); // WINDOW_UPDATE
        let at = stream.len();
        stream.extend(frame(7, HEADERS, 5));
        for split in 1..stream.len() {
            let mut t = FrameTracker::default();
            let first = t.scan(&stream[..split], || true);
            let second = t.scan(&stream[split..], || true).map(|o| o + split);
            let found = first.or(second.map(|o| o.max(split)));
            // Found in the chunk where the header completes, at its start or at 0 if it began earlier.
            let expected = if split > at + HEADER_LEN - 1 { at } else { at.max(split) };
            assert_eq!(found, Some(expected), "split at {split}");
        }
    }

    #[test]
    fn stream_id_reserved_bit_is_ignored() {
        let stream = frame(0, HEADERS, 0x8000_0000); // reserved bit only: stream 0
        let mut t = FrameTracker::default();
        assert_eq!(t.scan(&stream, || true), None);
    }
}
