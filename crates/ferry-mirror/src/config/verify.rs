//! `[verify]`: the background verifier, which re-reads mirrored ranges on both sides and compares them.

use ferry_config::{Problems, de};
use serde::Deserialize;

/// The smallest rate that is not off: below it a step would read almost nothing.
const MIN_BYTES_PER_SEC: u64 = 4 << 10;

/// `[verify]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifyConfig {
    /// Bytes per second read from each side at most ("0" turns verification off). The source reads cross the WAN:
    /// the default, 512 KiB/s (about 4 Mbit/s), is under 5% of a 100 Mbit/s link.
    #[serde(deserialize_with = "de::size")]
    pub bytes_per_sec: u64,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        VerifyConfig { bytes_per_sec: 512 << 10 }
    }
}

impl VerifyConfig {
    /// Every problem of `[verify]`.
    pub(super) fn validate(&self, p: &mut Problems) {
        if self.bytes_per_sec != 0 && self.bytes_per_sec < MIN_BYTES_PER_SEC {
            p.push("verify.bytes_per_sec", "must be 0 (off) or at least 4KiB");
        }
    }
}
