//! Where the Ferry binaries are. The end-to-end tests spawn the real `ferry-broker`, `ferry-mirror` and
//! `ferryctl` executables, which `cargo test` does not build for another package's tests, so the test command
//! builds them first (`cargo build --workspace --bins`) and this module finds them, or says clearly that they
//! are missing.
//!
//! Lookup order for a binary `NAME`:
//! 1. `$FERRY_BIN_DIR/NAME` when `FERRY_BIN_DIR` is set (e.g. to point at `target/release`);
//! 2. `$CARGO_TARGET_DIR/debug/NAME` when `CARGO_TARGET_DIR` is set (a relative value is taken relative to the
//!    workspace root, where cargo is normally run);
//! 3. `<workspace root>/target/debug/NAME`.
//!
//! Only the first applicable location is checked, so a stale binary elsewhere is never picked up by accident.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The broker binary name.
pub const BROKER_BIN: &str = "ferry-broker";
/// The mirror binary name.
pub const MIRROR_BIN: &str = "ferry-mirror";
/// The operator CLI binary name.
pub const FERRYCTL_BIN: &str = "ferryctl";
/// The web console binary name.
pub const CONSOLE_BIN: &str = "ferry-console";

/// The workspace root: two levels above this crate's manifest directory (`crates/ferry-testkit`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().nth(2).map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// The directory the binaries are expected in, following the lookup order in the module docs.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FERRY_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        let dir = if dir.is_absolute() { dir } else { workspace_root().join(dir) };
        return dir.join("debug");
    }
    workspace_root().join("target").join("debug")
}

/// The path of the built binary `name` (e.g. [`BROKER_BIN`]).
///
/// Fails with [`Error::BinaryNotFound`] ("ferry-broker not found at PATH: run `cargo build --workspace --bins`
/// first") when the file does not exist.
pub fn binary_path(name: &str) -> Result<PathBuf> {
    let path = bin_dir().join(name);
    if path.is_file() { Ok(path) } else { Err(Error::BinaryNotFound { name: name.to_owned(), path }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        let root = workspace_root();
        assert!(root.join("Cargo.toml").is_file(), "{}", root.display());
        assert!(root.join("crates").join("ferry-testkit").is_dir());
    }

    #[test]
    fn missing_binary_is_a_clear_error() {
        let err = binary_path("ferry-no-such-binary").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("ferry-no-such-binary not found at "), "{msg}");
        assert!(msg.ends_with("run `cargo build --workspace --bins` first"), "{msg}");
    }
}
