//! The standard `process_*` metrics of the daemon (the names and meanings every Prometheus client
//! library exports, so the usual dashboards and alerts work), read from `/proc/self` at scrape.
//!
//! Read by hand rather than through a library, for the reason the rest of the exposition is
//! rendered by hand ([`super`]): the daemon keeps no metrics registry. `prometheus-client` has no
//! process collector of its own (add-on crates for it fill its registry), the `prometheus`
//! crate's (its `process` feature, over the `procfs` crate) comes with that crate's registry,
//! and `metrics-process` with the `metrics` facade: each a second metrics model and a
//! dependency tree for six numbers that three files and a directory of `/proc` and one
//! `getrlimit` give directly. What is read follows client_golang's `process_collector` (the reference the
//! others copy): `stat`'s utime + stime, vsize and rss, `fd/`'s entries, the soft
//! `RLIMIT_NOFILE`, and the start as boot time (`/proc/stat`'s `btime`) plus `stat`'s
//! starttime. A value that cannot be read is left out, never replaced by a made-up one.

use std::fmt::Write;

/// The families: name, type, help.
pub const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
    ),
    (
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
    ),
    (
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
    ),
    (
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
    ),
    (
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
    ),
    (
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
    ),
];

/// What `/proc/self/stat` says (the fields after the command name).
struct Stat {
    /// utime + stime, clock ticks.
    cpu_ticks: u64,
    /// Start after boot, clock ticks.
    start_ticks: u64,
    /// Virtual memory size, bytes.
    vsize: u64,
    /// Resident set, pages.
    rss_pages: u64,
}

/// Parses `/proc/PID/stat`: the command name (field 2) is in parentheses and may hold spaces
/// and parentheses itself, so the fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is index 0 here; field N is index N - 3.
    let f: Vec<&str> = after.split_whitespace().collect();
    let num = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: num(14)? + num(15)?,
        start_ticks: num(22)?,
        vsize: num(23)?,
        rss_pages: num(24)?,
    })
}

/// `btime` of `/proc/stat`: when the machine booted, Unix seconds.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// `sysconf(name)`, `None` when the system does not say.
fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf reads a system constant; no memory is passed.
    let v = unsafe { libc::sysconf(name) };
    u64::try_from(v).ok().filter(|&v| v > 0)
}

/// The soft limit on open files (`+Inf` when unlimited).
fn max_fds() -> Option<f64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the one rlimit it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return None;
    }
    Some(if rl.rlim_cur == libc::RLIM_INFINITY {
        f64::INFINITY
    } else {
        rl.rlim_cur as f64
    })
}

/// Formats a sample value as the exposition spells it.
fn value(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".to_string()
    } else {
        v.to_string()
    }
}

/// The samples, by family name; families that could not be read are absent.
fn samples() -> Vec<(&'static str, f64)> {
    let mut out = Vec::new();
    let stat = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| parse_stat(&t));
    let tick = sysconf(libc::_SC_CLK_TCK);
    if let (Some(s), Some(hz)) = (&stat, tick) {
        out.push(("process_cpu_seconds_total", s.cpu_ticks as f64 / hz as f64));
    }
    if let (Some(s), Some(page)) = (&stat, sysconf(libc::_SC_PAGESIZE)) {
        out.push(("process_resident_memory_bytes", (s.rss_pages * page) as f64));
    }
    if let Some(s) = &stat {
        out.push(("process_virtual_memory_bytes", s.vsize as f64));
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        out.push(("process_open_fds", dir.count() as f64));
    }
    if let Some(m) = max_fds() {
        out.push(("process_max_fds", m));
    }
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| boot_time(&t));
    if let (Some(s), Some(hz), Some(boot)) = (&stat, tick, boot) {
        let start = boot as f64 + s.start_ticks as f64 / hz as f64;
        out.push(("process_start_time_seconds", start));
    }
    out
}

/// Appends the families and their samples to `out`.
pub fn render(out: &mut String) {
    let samples = samples();
    for &(name, kind, help) in FAMILIES {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (_, v) in samples.iter().filter(|(n, _)| *n == name) {
            let _ = writeln!(out, "{name} {}", value(*v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a ")" in it, as a process may call itself.
        let line = "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 3 0 \
                    12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            (s.cpu_ticks, s.start_ticks, s.vsize, s.rss_pages),
            (200, 12345, 104_857_600, 2560)
        );
        assert!(parse_stat("42 (x) S 1").is_none());
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\nprocesses 5\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn every_family_has_a_sample_on_linux() {
        let mut out = String::new();
        render(&mut out);
        let e = super::super::parse(&out).unwrap();
        for (name, _, _) in FAMILIES {
            assert!(e.samples.iter().any(|s| s.name == *name), "{name}:\n{out}");
        }
    }
}
