//! `threads` and `cpus`: how many forwarding threads (shards) vqosd runs and where, checked
//! against the CPUs the process may use (docs/dataplane.md, "Shards").

use super::ConfigError;

/// The CPUs this process may run on.
#[cfg(feature = "switch")]
pub(super) fn allowed_cpus() -> Result<Vec<usize>, ConfigError> {
    vqos_dataplane::sys::allowed_cpus()
        .map_err(|e| ConfigError::Threads(format!("cannot read this process's CPUs: {e}")))
}

/// Without the switch (a config read by the lab, not run) every CPU number is taken as
/// existing: only the shape of `threads` and `cpus` is checked.
#[cfg(not(feature = "switch"))]
pub(super) fn allowed_cpus() -> Result<Vec<usize>, ConfigError> {
    Ok((0..4096).collect())
}

/// `threads` (default 1) and `cpus` checked against the CPUs this process may use: at least
/// one thread, no more threads than CPUs, one existing, distinct CPU per thread.
pub(super) fn check(
    threads: Option<usize>,
    cpus: Option<Vec<usize>>,
) -> Result<(usize, Vec<usize>), ConfigError> {
    let cpus = cpus.unwrap_or_default();
    let n = threads.unwrap_or(if cpus.is_empty() { 1 } else { cpus.len() });
    let bad = |m: String| Err(ConfigError::Threads(m));
    if n == 0 {
        return bad("threads must be at least 1".into());
    }
    let allowed = allowed_cpus()?;
    if n > allowed.len() {
        return bad(format!(
            "threads = {n} but this host gives vqosd {} CPU(s) ({allowed:?}): a forwarding \
             thread polls, two on one CPU take turns",
            allowed.len()
        ));
    }
    if !cpus.is_empty() && cpus.len() != n {
        return bad(format!(
            "cpus lists {} CPU(s) for threads = {n}: give one CPU per thread",
            cpus.len()
        ));
    }
    for (i, c) in cpus.iter().enumerate() {
        if !allowed.contains(c) {
            return bad(format!(
                "cpus: CPU {c} does not exist or vqosd may not use it (allowed: {allowed:?})"
            ));
        }
        if cpus[..i].contains(c) {
            return bad(format!("cpus: CPU {c} is listed twice"));
        }
    }
    Ok((n, cpus))
}
