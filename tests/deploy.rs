//! The shipped deployment files against the real tools: the Prometheus alert rules pass `promtool check rules`
//! and their unit tests (`alerts/prometheus-rules.test.yaml`, synthetic series), which make every rule fire once
//! and stay quiet once; the systemd units pass `systemd-analyze verify` with the built binaries in place of the
//! installed ones, and their Exec command lines are accepted by those binaries.
//!
//! promtool comes with Debian's `prometheus` package, which scripts/test.sh installs: a missing promtool fails
//! here. `systemd-analyze` is checked where the machine has it (Debian's systemd package).
//!
//! The dashboard's and the rules' metric names are checked against the monitor's real exposition in
//! crates/ferry-mirror/tests/monitor/metrics.rs
//! (`metrics::the_dashboard_and_the_alert_rules_query_only_series_the_monitor_serves`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, ensure};
use ferry_testkit::{BROKER_BIN, MIRROR_BIN, binary_path, workspace_root};
use serde_json::Value;

fn run(program: &str, args: &[&str], dir: &Path) -> anyhow::Result<Output> {
    Command::new(program).args(args).current_dir(dir).output().with_context(|| match program {
        "promtool" => "promtool not found: install Debian's prometheus package (scripts/test.sh does)".to_owned(),
        _ => format!("cannot run {program}"),
    })
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn the_alert_rules_pass_promtool_and_every_rule_is_tested_firing_and_quiet() -> anyhow::Result<()> {
    let alerts = workspace_root().join("alerts");
    let check = run("promtool", &["check", "rules", "prometheus-rules.yaml"], &alerts)?;
    ensure!(check.status.success(), "promtool check rules: {}{}", text(&check.stdout), text(&check.stderr));
    let test = run("promtool", &["test", "rules", "prometheus-rules.test.yaml"], &alerts)?;
    ensure!(test.status.success(), "promtool test rules: {}{}", text(&test.stdout), text(&test.stderr));
    ensure!(text(&test.stdout).contains("SUCCESS"), "{}", text(&test.stdout));

    // Every rule has a test that makes it fire and one where it must not.
    let read = |name: &str| -> anyhow::Result<Value> {
        Ok(serde_norway::from_str(&std::fs::read_to_string(alerts.join(name))?)?)
    };
    let rules = read("prometheus-rules.yaml")?;
    let names: BTreeSet<String> = rules["groups"]
        .as_array()
        .context("groups")?
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect();
    ensure!(names.len() == 11, "{names:?}");
    let tests = read("prometheus-rules.test.yaml")?;
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .context("tests")?
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    for name in &names {
        let of: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == name.as_str()).collect();
        let fires = of.iter().any(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()));
        let quiet = of.iter().any(|c| c["exp_alerts"].as_array().is_some_and(|a| a.is_empty()));
        ensure!(fires && quiet, "{name}: needs a case where it fires and one where it does not ({} cases)", of.len());
    }
    let tested: BTreeSet<String> = cases.iter().filter_map(|c| c["alertname"].as_str().map(str::to_owned)).collect();
    ensure!(tested == names, "tests of rules that do not exist: {:?}", tested.difference(&names).collect::<Vec<_>>());
    Ok(())
}

/// `systemd-analyze`, where the machine has it.
fn systemd_analyze() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("systemd-analyze"))
        .find(|p| p.is_file())
}

#[test]
fn the_systemd_units_verify_with_the_built_binaries_and_their_command_lines_parse() -> anyhow::Result<()> {
    let Some(analyze) = systemd_analyze() else {
        println!("systemd-analyze is not installed: the units are not verified on this machine");
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let shipped = workspace_root().join("systemd");
    // The units as shipped, with the installed binaries' paths in the Exec lines pointing at the built ones: the one
    // change made.
    let units = [("ferry-broker.service", BROKER_BIN, 1), ("ferry-mirror@.service", MIRROR_BIN, 2)];
    let mut files = Vec::new();
    let mut exec_lines = Vec::new();
    for (unit, bin, uses) in units {
        let original = std::fs::read_to_string(shipped.join(unit))?;
        let installed = format!("/usr/local/bin/{bin}");
        let built = binary_path(bin)?;
        let mut replaced = 0;
        let copy: String = original
            .lines()
            .map(|l| {
                if l.starts_with("Exec") && l.contains(&installed) {
                    replaced += 1;
                    l.replace(&installed, &built.to_string_lossy())
                } else {
                    l.to_owned()
                }
            })
            .map(|l| l + "\n")
            .collect();
        ensure!(replaced == uses, "{unit} runs {installed} in {uses} Exec lines, found {replaced}");
        let path = dir.path().join(unit);
        std::fs::write(&path, &copy)?;
        files.push(path);
        exec_lines.extend(
            copy.lines()
                .filter(|l| l.starts_with("ExecStart=") || l.starts_with("ExecStartPre="))
                .map(|l| l.split_once('=').map_or("", |(_, cmd)| cmd).replace("%i", "dc-a_to_dc-b")),
        );
    }
    // An instance of the template too, as `systemctl enable ferry-mirror@dc-a_to_dc-b` would load it.
    let instance = dir.path().join("ferry-mirror@dc-a_to_dc-b.service");
    std::fs::copy(dir.path().join("ferry-mirror@.service"), &instance)?;
    files.push(instance);

    let mut args = vec!["verify".to_owned(), "--man=no".to_owned()];
    args.extend(files.iter().map(|f| f.to_string_lossy().into_owned()));
    let out = Command::new(&analyze).args(&args).current_dir(dir.path()).output()?;
    // A warning (an unknown key, a bad value) is a defect of the unit as much as an error.
    ensure!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "systemd-analyze verify: {}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );

    // Each Exec command line is one the binary accepts: it gets as far as reading the (absent) config file.
    ensure!(exec_lines.len() == 3, "{exec_lines:?}");
    for line in &exec_lines {
        let mut words = line.split_whitespace();
        let program = words.next().context("a program")?;
        let args: Vec<&str> = words.collect();
        let config = args.iter().position(|a| *a == "--config").and_then(|i| args.get(i + 1)).context("--config")?;
        let out = Command::new(program).args(&args).output()?;
        let stderr = text(&out.stderr);
        ensure!(
            out.status.code() == Some(2) && stderr.contains(config) && !stderr.contains("Usage:"),
            "{line}: {:?}\n{stderr}",
            out.status
        );
    }
    Ok(())
}
