//! The data directory's identity and ownership: its exclusive lock, and the cluster id it was created with.

use std::path::Path;

use ferry_storage::fs::{FsRef, OpenMode};

use super::META_DIR;
use crate::error::{BrokerError, Result};
use crate::node::topic::write_atomic;

const CLUSTER_ID_FILE: &str = "cluster_id";
/// The data directory lock file, inside [`META_DIR`].
const LOCK_FILE: &str = "lock";

/// Takes the data directory's exclusive lock (`flock` on `__ferry_meta/lock`, released by the kernel when the
/// process ends, even by kill -9) and records this process in the file. A held lock is an error naming its holder.
pub(super) fn lock_data_dir(fs: &FsRef, data_dir: &Path) -> Result<ferry_storage::fs::LockGuard> {
    let path = data_dir.join(META_DIR).join(LOCK_FILE);
    let io = |source| BrokerError::Io { path: path.clone(), source };
    let guard = match fs.lock_exclusive(&path) {
        Ok(guard) => guard,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            let holder = fs.read(&path).map(|b| String::from_utf8_lossy(&b).trim().to_owned()).unwrap_or_default();
            let holder =
                if holder.is_empty() { "a process that has not recorded itself yet".to_owned() } else { holder };
            return Err(BrokerError::DataDirInUse { path: data_dir.to_owned(), holder });
        }
        Err(e) => return Err(io(e)),
    };
    let file = fs.open(&path, OpenMode::Create).map_err(io)?;
    file.set_len(0).map_err(io)?;
    file.append(&[format!("pid {}\n", std::process::id()).as_bytes()]).map_err(io)?;
    Ok(guard)
}

/// The data directory's cluster id: the one stored there, which a configured one must match; else the configured
/// one, or a new UUID, stored.
pub(super) fn resolve_cluster_id(fs: &FsRef, data_dir: &Path, configured: Option<&str>) -> Result<String> {
    let path = data_dir.join(META_DIR).join(CLUSTER_ID_FILE);
    let stored = match ferry_storage::fs::read_optional(&**fs, &path) {
        Ok(s) => s.map(|b| String::from_utf8_lossy(&b).trim().to_owned()),
        Err(source) => return Err(BrokerError::Io { path, source }),
    };
    match (configured.filter(|c| !c.is_empty()), stored) {
        (Some(c), Some(s)) if c != s => Err(BrokerError::InvalidArgument(format!(
            "the data dir {} belongs to cluster \"{s}\" but the config says cluster_id = \"{c}\"; \
             point data_dir elsewhere or fix cluster_id",
            data_dir.display()
        ))),
        (_, Some(s)) => Ok(s),
        (Some(c), None) => {
            write_atomic(&**fs, &path, c.as_bytes())?;
            Ok(c.to_owned())
        }
        (None, None) => {
            let id = uuid::Uuid::new_v4().to_string();
            write_atomic(&**fs, &path, id.as_bytes())?;
            Ok(id)
        }
    }
}
