//! What a client reads of an error: its message without the broker's on-disk paths.

use ferry_storage::StorageError;

use super::BrokerError;

/// A storage error as a client may read it: what went wrong, without the broker's on-disk paths (the data
/// directory's layout is the operator's business, and a path can name things a client should not learn).
fn storage_without_paths(e: &StorageError) -> String {
    match e {
        StorageError::Io { source, .. } => format!("I/O error on a partition file: {source}"),
        StorageError::OffsetOutOfRange { offset, log_start, log_end, .. } => {
            format!("offset {offset} is out of range: the log holds [{log_start}, {log_end})")
        }
        StorageError::BatchTooLarge { offset, size, max, .. } => {
            format!("batch of {size} bytes at offset {offset} exceeds max_batch_bytes ({max})")
        }
        StorageError::InvalidBatch { offset, source, .. } => format!("invalid batch at offset {offset}: {source}"),
        StorageError::CorruptSegment { position, offset, source, .. } => format!(
            "corrupt batch in a segment at byte {position}{}: {source}",
            offset.map(|o| format!(" (batch offset {o})")).unwrap_or_default()
        ),
        StorageError::OffsetAppendRefused { offset, reason, .. } => {
            format!("offset append refused at offset {offset}: {reason}")
        }
        StorageError::OffsetOverflow { offset, .. } => {
            format!("offsets of a batch (or a log start) at {offset} would pass the largest offset, 2^63 - 2")
        }
        StorageError::BadFile { reason, .. } => format!("unexpected content in a partition file: {reason}"),
        StorageError::Closed { .. } => "the partition's log is closed".into(),
    }
}

impl BrokerError {
    /// The message sent to clients: [`Display`](std::fmt::Display), except that storage and I/O errors leave out
    /// the broker's on-disk paths (they are logged, with the paths, where the error is answered).
    pub fn client_message(&self) -> String {
        match self {
            BrokerError::Storage { topic, partition, source } => {
                tracing::warn!(topic, partition, error = %self, "storage error answered to a client");
                format!(
                    "storage error on {topic}/{partition}: {}; the broker's log names the file",
                    storage_without_paths(source)
                )
            }
            BrokerError::Io { source, .. } => {
                tracing::warn!(error = %self, "I/O error answered to a client");
                format!("I/O error on a broker metadata file: {source}; the broker's log names the file")
            }
            BrokerError::DataDirInUse { holder, .. } => {
                format!("the data directory is in use by another broker ({holder})")
            }
            other => other.to_string(),
        }
    }
}
