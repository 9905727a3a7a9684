//! `ferryctl demo --duration 8`: two brokers, the mirror and the load in one process. It prints the monitor URL and
//! token, live lines, then a final verification that says identical, with as many records compared as were produced,
//! and exits 0. Needs nothing built but ferryctl itself.

mod common;

use std::time::Duration;

use common::ferryctl_with;

/// The number in `text` right after `prefix` (digits and thousands commas).
fn number_after(text: &str, prefix: &str) -> u64 {
    let start = text.find(prefix).unwrap_or_else(|| panic!("{prefix:?} not in:\n{text}")) + prefix.len();
    let digits: String =
        text[start..].chars().take_while(|c| c.is_ascii_digit() || *c == ',').filter(|c| *c != ',').collect();
    digits.parse().unwrap_or_else(|_| panic!("no number after {prefix:?} in:\n{text}"))
}

#[tokio::test]
async fn demo_runs_mirrors_and_verifies_identical() {
    ferry_testkit::init_tracing();
    let out = ferryctl_with(&["demo", "--duration", "8"], &[], Duration::from_secs(300)).await;
    assert_eq!(out.code, 0, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    let text = &out.stdout;
    assert!(text.contains("  monitor: http://127.0.0.1:"), "{text}");
    assert!(text.contains("  console: http://127.0.0.1:"), "{text}");
    let token_line = text.lines().find(|l| l.starts_with("  monitor token ")).unwrap_or_else(|| panic!("{text}"));
    let token = token_line.trim_start_matches("  monitor token ").trim();
    assert_eq!(token.len(), 24, "{token_line}");

    let produced = number_after(text, "\nproduced ");
    assert!(produced > 0, "{text}");
    // Not a terminal: one live line per 2 s tick within the 8 s, so at most four (a starved process's timer may
    // fire late and show fewer, never more); each shows counts that only grow, up to the final ones.
    let live: Vec<&str> = text.lines().filter(|l| l.starts_with("mirrored ")).collect();
    assert!((1..=4).contains(&live.len()), "{text}");
    let mut last = (0, 0);
    for line in &live {
        for part in [" records | lag ", " | source ", " rec/s | target ", " rec/s | produced "] {
            assert!(line.contains(part), "{line}");
        }
        let now = (number_after(line, "mirrored "), number_after(line, " rec/s | produced "));
        assert!(now.0 >= last.0 && now.1 >= last.1 && now.0 <= produced && now.1 <= produced, "{text}");
        last = now;
    }

    // The mirror's counter of records it wrote to the target is exactly what was produced; the verification
    // proves they are the same records.
    assert_eq!(number_after(text, "the mirror appended "), produced, "{text}");
    for p in 0..4 {
        assert!(text.contains(&format!("  orders/{p}: identical (")), "{text}");
    }
    assert_eq!(number_after(text, "identical: 4 partitions of 1 mirror topics, "), produced, "{text}");
    assert!(text.ends_with("the target equals the source: every record, offset, key, value and header\n"), "{text}");
}
