//! Repository hygiene, crate by crate: no two modules import each other (directly or around a circle), and no
//! source file (library, binaries, tests, benches, build script) grows past `MAX_LINES`. The cycle check is
//! `scripts/module-cycles.py` (python3, standard library only). Both checks cover every crate under crates/, so a
//! new crate is held to them from its first commit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Longest source file allowed in any crate (conventions: split by responsibility before ~700).
const MAX_LINES: usize = 600;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every crate directory under crates/, by name.
fn crates() -> BTreeMap<String, PathBuf> {
    let dir = repo().join("crates");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.join("Cargo.toml").is_file())
        .map(|path| (path.file_name().expect("crate dir name").to_string_lossy().into_owned(), path))
        .collect()
}

/// Runs the cycle script on `src_dirs`; returns its exit code and stdout.
fn module_cycles(src_dirs: &[&Path]) -> (i32, String) {
    let script = repo().join("scripts/module-cycles.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(src_dirs)
        .output()
        .unwrap_or_else(|e| panic!("running python3 {}: {e} (python3 must be on PATH)", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "module-cycles.py wrote to stderr (a module file it could not find?):\n{stderr}");
    let code = out.status.code().expect("module-cycles.py was killed by a signal");
    (code, String::from_utf8(out.stdout).expect("UTF-8 output"))
}

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
    let crates = crates();
    // One run over every crate; its report names each crate's src dir on every line about it.
    let src_dirs: Vec<PathBuf> = crates.values().map(|dir| dir.join("src")).collect();
    let (code, out) = module_cycles(&src_dirs.iter().map(PathBuf::as_path).collect::<Vec<_>>());
    println!("{out}");
    assert!(code == 0 || code == 1, "module-cycles.py failed with exit code {code}:\n{out}");
    let mut with_cycles = BTreeMap::new();
    for (name, dir) in &crates {
        let src = dir.join("src").display().to_string();
        let cycles: Vec<&str> = out.lines().filter(|line| line.starts_with(&format!("cycle in {src}/"))).collect();
        let clean = out.lines().any(|line| line == format!("{src}: no module cycles"));
        assert!(cycles.is_empty() == clean, "the report says nothing clear about {name}:\n{out}");
        if !cycles.is_empty() {
            with_cycles.insert(name.as_str(), cycles);
        }
    }
    assert_eq!(code == 1, !with_cycles.is_empty(), "exit code {code} disagrees with the report:\n{out}");
    assert!(with_cycles.is_empty(), "module cycles in {:?} (details above):\n{with_cycles:#?}", with_cycles.keys());
}

/// `.rs` files under `dir`, recursively, with their line counts.
fn line_counts(dir: &Path, out: &mut Vec<(PathBuf, usize)>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            line_counts(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            out.push((path, text.lines().count()));
        }
    }
}

#[test]
fn no_source_file_of_any_crate_is_over_the_limit() {
    let crates = crates();
    let mut too_long = Vec::new();
    for (name, dir) in &crates {
        // The whole crate: its library and binaries, its tests and their helper modules, benches, build script.
        let mut files = Vec::new();
        line_counts(dir, &mut files);
        assert!(files.iter().any(|(path, _)| path.starts_with(dir.join("src"))), "{name} has no .rs file under src/");
        for (path, lines) in files.into_iter().filter(|(_, lines)| *lines > MAX_LINES) {
            let shown = path.strip_prefix(repo()).unwrap_or(&path).display().to_string();
            too_long.push(format!("{shown}: {lines} lines"));
        }
    }
    assert!(too_long.is_empty(), "files over {MAX_LINES} lines: split them by responsibility\n{}", too_long.join("\n"));
}

/// Writes `files` (relative path, contents) under a fresh temp dir and returns it.
fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (path, contents) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("fixture dir");
        std::fs::write(path, contents).expect("fixture file");
    }
    dir
}

/// The script finds each kind of reference (grouped `use`, a parent's re-export, `super::`, paths in code) at the
/// top level and in nested directory modules, and ignores comments and strings. Without this, a broken script
/// that finds nothing would pass the check above.
#[test]
fn the_cycle_script_reports_exactly_the_cycles_of_a_known_crate() {
    let crate_dir = fixture(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\nmod quiet;\npub use b::Thing;\n"),
        // a -> b through the root's re-export of b::Thing; b -> a through a grouped use.
        ("src/a.rs", "use crate::Thing;\nuse crate::quiet::f;\n"),
        ("src/b.rs", "use crate::{a as alias, d::Y};\npub struct Thing;\n"),
        // c -> a in code, and nothing leads back to c: no cycle.
        ("src/c.rs", "fn f() { let _ = crate::a::g; }\n"),
        // a -> quiet; quiet's mentions of a in comments and strings are not references (else quiet <-> a).
        ("src/quiet.rs", "// use crate::a;\n/* crate::a::x */\nconst S: &str = \"crate::a::y\";\npub fn f() {}\n"),
        ("src/d/mod.rs", "mod p;\nmod q;\nmod r;\npub struct Y;\n"),
        // Inside d: p -> q -> r -> p, around a circle, with super:: and crate:: paths.
        ("src/d/p.rs", "use super::q::Z;\nfn lt<'a>(x: &'a str) -> char { '{' }\n"),
        ("src/d/q.rs", "pub struct Z;\nfn g() { crate::d::r::h(); }\n"),
        ("src/d/r.rs", "pub fn h() {}\n#[cfg(test)]\nmod tests { use super::super::p; }\n"),
    ]);
    let src = crate_dir.path().join("src");
    let (code, out) = module_cycles(&[&src]);
    let cycles: Vec<String> = out
        .lines()
        .filter(|line| line.starts_with("cycle in "))
        .map(|line| line.replace(&src.display().to_string(), "SRC"))
        .collect();
    assert_eq!(
        cycles,
        ["cycle in SRC/lib.rs under crate: a -> b -> a", "cycle in SRC/lib.rs under crate::d: p -> q -> r -> p"],
        "full output:\n{out}"
    );
    assert_eq!(code, 1);

    let clean = fixture(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::X;\n// use crate::a;\n"),
        ("src/b.rs", "pub struct X;\n#[cfg(test)]\nmod tests { use super::*; }\n"),
    ]);
    let clean_src = clean.path().join("src");
    let (code, out) = module_cycles(&[&clean_src]);
    assert_eq!((code, out), (0, format!("{}: no module cycles\n", clean_src.display())));
}
