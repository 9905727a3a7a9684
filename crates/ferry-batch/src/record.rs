//! The decoded forms of a batch's contents: [`Record`] and its ordered [`Header`]s.

use bytes::Bytes;

/// One header of a record: an ordered (key, value) pair. Keys may repeat within a record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Header {
    /// UTF-8 key.
    pub key: String,
    /// Value; `None` is a null value.
    pub value: Option<Bytes>,
}

/// A decoded record with its absolute offset and timestamp.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Record {
    /// Absolute offset in the partition.
    pub offset: u64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Key; `None` is a null key.
    pub key: Option<Bytes>,
    /// Value; `None` is a null value (a tombstone).
    pub value: Option<Bytes>,
    /// Ordered headers.
    pub headers: Vec<Header>,
}
