//! The config machinery both daemons share, so that `ferry-broker` and `ferry-mirror` (and the mirror's alarm
//! rules file) read their files one way:
//!
//! - every section is a typed serde struct with `#[serde(deny_unknown_fields, default)]` whose `Default` impl is
//!   the single source of its defaults;
//! - [`load::tree`] reads the TOML text and the `PREFIX__SECTION__KEY` environment overrides (the `config`
//!   crate), and [`load::deserialize`] turns the tree into the typed sections, collecting **every** unknown key and
//!   bad value into one [`Problems`] report instead of stopping at the first;
//! - each section then checks its ranges with a `validate(&self, .., &mut Problems)` of its own, and the
//!   cross-section rules sit in one small function per daemon;
//! - [`de`] holds the deserializers for durations (`"5s"`) and sizes (`"64MiB"`) with messages that say what is
//!   expected;
//! - [`documented`] reads the documented defaults of a reference config file (see its module docs for the
//!   convention), so a test can check every one against the compiled default.
//!
//! Dependencies point one way: this crate knows nothing of Ferry; the daemons depend on it.

#![deny(missing_docs)]

pub mod allocator;
pub mod de;
pub mod documented;
pub mod load;
mod problems;

pub use load::{Env, deserialize, toml_tree, tree};
pub use problems::Problems;
