//! Process gauges for `/metrics`: resident memory and CPU time, read from `/proc/self` at scrape time.
//!
//! `/proc/self/statm` gives the resident set in pages and `/proc/self/stat` the user and system CPU time in clock
//! ticks; the page size and the tick rate come from the kernel's auxiliary vector (`rustix::param`, no unsafe code
//! here). Where `/proc` is missing (not Linux) the gauges are simply not updated.

/// Reads the process's resident memory and CPU time.
#[derive(Debug, Clone, Copy)]
pub struct ProcessStats {
    page_size: u64,
    ticks_per_second: u64,
}

impl Default for ProcessStats {
    fn default() -> Self {
        ProcessStats {
            page_size: rustix::param::page_size() as u64,
            ticks_per_second: rustix::param::clock_ticks_per_second(),
        }
    }
}

impl ProcessStats {
    /// `(resident bytes, CPU seconds)` now, or `None` where `/proc/self` cannot be read.
    pub fn sample(&self) -> Option<(u64, f64)> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let rss = resident_pages(&statm)? * self.page_size;
        let cpu = cpu_ticks(&stat)? as f64 / self.ticks_per_second.max(1) as f64;
        Some((rss, cpu))
    }
}

/// The second field of `statm`: resident pages.
fn resident_pages(statm: &str) -> Option<u64> {
    statm.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// `utime + stime` (fields 14 and 15) of `stat`. The command name (field 2) is in parentheses and may itself
/// contain spaces and parentheses, so fields are counted from the last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    // After ")" comes field 3 (state); utime is field 14, i.e. the 12th field from here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_statm_and_stat() {
        assert_eq!(resident_pages("5000 1234 300 10 0 900 0\n"), Some(1234));
        let stat = "42 (ferry (mirror) x) S 1 42 42 0 -1 4194304 100 0 0 0 250 75 0 0 20 0 8 0 100 1000 1234";
        assert_eq!(cpu_ticks(stat), Some(325));
        assert_eq!(cpu_ticks("garbage"), None);
        assert_eq!(resident_pages(""), None);
    }

    #[test]
    fn samples_this_process() {
        let ticks = || cpu_ticks(&std::fs::read_to_string("/proc/self/stat").unwrap()).unwrap();
        // Spin until a first tick is used, so that a sample stuck at 0 cannot pass.
        while ticks() == 0 {}
        let stats = ProcessStats::default();
        let before = ticks();
        let (rss, cpu) = stats.sample().expect("/proc/self is readable on Linux");
        let after = ticks();
        let sampled = (cpu * stats.ticks_per_second as f64).round();
        assert!((before as f64..=after as f64).contains(&sampled), "{sampled} ticks, read {before}..={after}");
        assert!(rss > 0 && rss % stats.page_size == 0, "whole pages: {rss}");
    }
}
