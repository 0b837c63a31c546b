//! A VM's CPU limit calibrated to the machine (`cpu_alone = "60%"` on a `[[vm]]`).
//!
//! The PID-ECN paper's receiver is short of CPU: alone it takes most of the link, beside an
//! equal neighbour it loses (§3, Fig. 4). A fixed quota (`cpu = "4%"`) means one thing on one
//! machine and another on the next: 4 % of a core gave the VM alone about 60 % of the link on
//! the machine the files were written on and 37 % on a later one, where 7 % was needed
//! (docs/experiments.md, "Calibrated by hand on a third machine"). `cpu_alone` names the
//! effect instead of the quota: before the run's clock starts, with no other VM sending, the
//! lab finds the share of a core at which the VM alone gets that fraction of the tightest
//! link, and runs with it.
//!
//! ## The search ([`search`])
//! The rate grows with the quota, about in proportion at small shares (4–8 % of a core gave
//! 348–615 Mbit/s by hand), and one measurement is noisy (up to ±10 % between runs there):
//! - the first guess is 5 % of a core; below the target the next guess scales the quota by
//!   target / rate (by at most ×4), above it likewise down, and once one measurement lies
//!   below the target and one above, the next interpolates between them (the midpoint when
//!   noise put them in the wrong order);
//! - it stops at a rate within [`TOLERANCE`] of the target, at a guess already measured (a
//!   whole core still below the target, the least quota still above), or after
//!   [`MAX_STEPS`] measurements, and keeps the quota whose rate came closest;
//! - a measurement is one iperf3 test of the VM's own load ([`STEP_SECS`] s after one second
//!   left out, `-O 1`: slow start), its endpoint in the VM's group.
//!
//! A VM that cannot reach the target keeps the quota that came closest, and the log says the
//! calibration fell short (`logs/cpu-limits.json`, `calibration.reached`).

use std::path::Path;
use std::time::{Duration, Instant};

use vqos_sim::scenario::Scenario;

use super::generators::{iperf_args, Load};
use super::IPERF_BASE_PORT;
use crate::cpu_limit::CpuLimit;
use crate::sys::{self, spawn};
use crate::topo::Topology;
use crate::LabError;

/// Measurements at most.
pub(crate) const MAX_STEPS: usize = 6;

/// Close enough: within this fraction of the target.
pub(crate) const TOLERANCE: f64 = 0.03;

/// Seconds measured per step (after one left out).
pub(crate) const STEP_SECS: f64 = 3.0;

/// The first guess, a share of a core.
const FIRST: f64 = 0.05;

/// The least share a CFS quota can take here (1 ms of a 30 ms period, rounded up).
const LEAST: f64 = 0.034;

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Step {
    /// The share of a core.
    pub fraction: f64,
    /// What the VM alone received (or sent), bit/s.
    pub rate_bps: f64,
}

/// What a calibration found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Calibration {
    /// The rate sought, bit/s.
    pub target_bps: f64,
    /// The share of a core kept (the step whose rate came closest).
    pub fraction: f64,
    /// Its rate, bit/s.
    pub rate_bps: f64,
    /// Whether that rate is within [`TOLERANCE`] of the target.
    pub reached: bool,
    /// Every measurement, in order.
    pub steps: Vec<Step>,
}

/// Finds the share of a core at which `measure` (the VM alone at a share, bit/s) gives
/// `target_bps`; see the module docs.
pub(crate) fn search(
    target_bps: f64,
    mut measure: impl FnMut(f64) -> Result<f64, LabError>,
) -> Result<Calibration, LabError> {
    let (mut below, mut above): (Option<Step>, Option<Step>) = (None, None);
    let mut steps: Vec<Step> = Vec::new();
    let mut q = FIRST;
    for _ in 0..MAX_STEPS {
        let step = Step {
            fraction: q,
            rate_bps: measure(q)?,
        };
        steps.push(step);
        let r = step.rate_bps;
        if (r - target_bps).abs() <= TOLERANCE * target_bps {
            break;
        }
        if r < target_bps {
            // The highest share still below.
            if below.is_none_or(|b| q > b.fraction) {
                below = Some(step);
            }
        } else if above.is_none_or(|a| q < a.fraction) {
            above = Some(step);
        }
        let next = match (below, above) {
            (Some(b), Some(a)) if a.fraction > b.fraction && a.rate_bps > b.rate_bps => {
                let slope = (a.fraction - b.fraction) / (a.rate_bps - b.rate_bps);
                b.fraction + (target_bps - b.rate_bps) * slope
            }
            (Some(b), Some(a)) => (b.fraction + a.fraction) / 2.0,
            _ => q * (target_bps / r.max(1.0)).clamp(0.25, 4.0),
        };
        // A share of 0.1 % of a core at the finest, between the least and a whole core.
        let next = ((next * 1000.0).round() / 1000.0).clamp(LEAST, 1.0);
        if steps.iter().any(|s| s.fraction == next) {
            break;
        }
        q = next;
    }
    let off = |s: &Step| (s.rate_bps - target_bps).abs();
    let best = steps
        .iter()
        .copied()
        .min_by(|a, b| off(a).total_cmp(&off(b)))
        .expect("at least one step");
    Ok(Calibration {
        target_bps,
        fraction: best.fraction,
        rate_bps: best.rate_bps,
        reached: off(&best) <= TOLERANCE * target_bps,
        steps,
    })
}

/// Calibrates the limit of every VM of `sc` with `cpu_alone` (before the run's clock, no
/// other VM sending) and leaves its group at the share found; `None` for the other VMs.
pub(super) fn vms(
    sc: &Scenario,
    topo: &Topology,
    limits: &[Option<CpuLimit>],
    logs: &Path,
) -> Result<Vec<Option<Calibration>>, LabError> {
    let mut out = Vec::new();
    for (i, v) in sc.vms.iter().enumerate() {
        let (Some(share), Some(limit)) = (v.cpu_alone, limits.get(i).and_then(Option::as_ref))
        else {
            out.push(None);
            continue;
        };
        let target = share * sc.tightest_at(v.start_ns) as f64;
        let load = Load::of(&v.initial);
        let mut n = 0;
        let c = search(target, |q| {
            limit.set(q)?;
            n += 1;
            let log = logs.join(format!("calibrate-{}-{n}.json", v.name));
            alone(sc, topo, (i, &load), limit, &log)
        })?;
        limit.set(c.fraction)?;
        eprintln!(
            "vqos lab: {}'s cpu calibrated to {:.1} % of a core: alone {:.1} Mbit/s against \
             {:.1} ({:.0} % of the link){}",
            v.name,
            c.fraction * 100.0,
            c.rate_bps / 1e6,
            target / 1e6,
            share * 100.0,
            if c.reached { "" } else { ", not reached" }
        );
        out.push(Some(c));
    }
    Ok(out)
}

/// How many times a measurement is tried while iperf3 cannot connect or finds its server busy:
/// the servers start just before the calibration, and on a loaded machine one may not listen
/// yet (seen in CI: the first measurement's "unable to connect").
const TRIES: usize = 40;

/// One measurement ([`once`]), tried again after 250 ms while the server is not there yet.
fn alone(
    sc: &Scenario,
    topo: &Topology,
    vm: (usize, &Load),
    limit: &CpuLimit,
    log: &Path,
) -> Result<f64, LabError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match once(sc, topo, vm, limit, log)? {
            Ok(rate) => return Ok(rate),
            Err(text) if tries < TRIES && not_there_yet(&text) => {
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(_) => {
                return Err(LabError::Invalid(format!(
                    "calibrating {}'s cpu: no rate in iperf3's output after {tries} tries ({})",
                    sc.vms[vm.0].name,
                    log.display()
                )))
            }
        }
    }
}

/// Whether iperf3's output says its server is not listening yet, or busy.
fn not_there_yet(output: &str) -> bool {
    output.contains("unable to connect") || output.contains("busy")
}

/// One iperf3 test of VM `i`'s own load with its endpoint in `limit`'s group: the rate it
/// received (or sent), bit/s, read from iperf3's JSON in `log`; or, without one, the output.
fn once(
    sc: &Scenario,
    topo: &Topology,
    (i, load): (usize, &Load),
    limit: &CpuLimit,
    log: &Path,
) -> Result<Result<f64, String>, LabError> {
    let name = &sc.vms[i].name;
    let title = format!("{}-{name}-calibrate", topo.prefix);
    let port = IPERF_BASE_PORT + 2 * i as u16;
    let mut args = iperf_args(
        &title,
        &topo.sink_ip,
        port,
        STEP_SECS,
        load,
        sc.is_download(i),
    );
    args.extend(crate::cpu_limit::iperf_args(sc, load.packet_size));
    args.extend(["-O".to_string(), "1".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut p = spawn(
        &format!("iperf3 calibration of {name}"),
        Some(&topo.vm_ns[i]),
        &args,
        Some(log),
    )?;
    if let Some(pid) = p.pid() {
        limit.add(pid)?;
    }
    let deadline = Instant::now() + Duration::from_secs_f64(STEP_SECS + 15.0);
    while !p.exited() {
        if sys::interrupted() {
            p.stop(Duration::from_secs(1));
            return Err(LabError::Interrupted);
        }
        if Instant::now() > deadline {
            p.stop(Duration::from_secs(1));
            return Err(LabError::Invalid(format!(
                "calibrating {name}'s cpu: iperf3 did not finish (log {})",
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(log).map_err(|source| LabError::Io {
        what: log.display().to_string(),
        source,
    })?;
    Ok(received_bps(&text).ok_or(text))
}

/// The rate iperf3's JSON says the receiver got, bit/s.
fn received_bps(json: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.get("end")?
        .get("sum_received")?
        .get("bits_per_second")?
        .as_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VM alone at `q` of a core on a machine where the rate is `per_core × q`, capped at
    /// the link (940 Mbit/s).
    fn proportional(per_core: f64) -> impl FnMut(f64) -> Result<f64, LabError> {
        move |q| Ok((per_core * q).min(940e6))
    }

    #[test]
    fn a_proportional_machine_is_found_in_a_few_steps() {
        // 7 % of a core gives 560 Mbit/s (the third machine, by hand); 60 % of 940 sought.
        let c = search(564e6, proportional(8e9)).unwrap();
        assert!(c.reached, "{c:?}");
        assert!(c.steps.len() <= 3, "{c:?}");
        assert!((c.fraction - 0.0705).abs() < 0.002, "{c:?}");
        assert_eq!(c.steps[0].fraction, FIRST);
        // On a machine twice as slow, twice the share.
        let c = search(564e6, proportional(4e9)).unwrap();
        assert!(c.reached && (c.fraction - 0.141).abs() < 0.004, "{c:?}");
    }

    #[test]
    fn noise_is_bracketed_and_the_closest_step_is_kept() {
        // ±8 %, alternating, around a proportional machine.
        let mut k = 0;
        let noisy = |q: f64| {
            k += 1;
            let f = if k % 2 == 1 { 1.08 } else { 0.92 };
            Ok(8e9 * q * f)
        };
        let c = search(564e6, noisy).unwrap();
        let closest = c
            .steps
            .iter()
            .map(|s| (s.rate_bps - 564e6).abs())
            .fold(f64::INFINITY, f64::min);
        assert_eq!((c.rate_bps - 564e6).abs(), closest, "{c:?}");
        assert!(c.steps.len() <= MAX_STEPS);
        assert!((c.rate_bps / 564e6 - 1.0).abs() < 0.1, "{c:?}");
    }

    #[test]
    fn a_target_out_of_reach_stops_and_says_so() {
        // The rate stops at 400 Mbit/s whatever the share: the search climbs for its
        // [`MAX_STEPS`] steps, all at 400, keeps the first of them, and says it fell short.
        let c = search(564e6, |q| Ok((8e9 * q).min(400e6))).unwrap();
        assert!(!c.reached, "{c:?}");
        assert_eq!(c.rate_bps, 400e6);
        assert!(c.steps.len() <= MAX_STEPS);
        // The least quota already above the target: kept, reached or not.
        let c = search(100e6, proportional(8e9)).unwrap();
        assert_eq!(c.fraction, LEAST, "{c:?}");
        assert!(!c.reached && c.steps.len() == 2, "{c:?}");
    }

    #[test]
    fn a_failed_measurement_fails_the_calibration() {
        let e = search(564e6, |_| Err(LabError::Invalid("iperf3 is gone".into()))).unwrap_err();
        assert!(e.to_string().contains("iperf3 is gone"), "{e}");
    }

    #[test]
    fn a_server_not_there_yet_is_tried_again_and_nothing_else_is() {
        let refused = r#"{"start": {}, "error": "unable to connect to server - server may have stopped running or use a different port, firewall issue, etc.: Connection refused"}"#;
        let busy = r#"{"error": "the server is busy running a test. try again later"}"#;
        assert!(not_there_yet(refused) && not_there_yet(busy));
        assert!(!not_there_yet(
            r#"{"error": "interrupt - the client has terminated"}"#
        ));
        assert!(!not_there_yet(""));
    }

    #[test]
    fn the_rate_is_what_the_receiver_got() {
        let json = r#"{"end": {"sum_sent": {"bits_per_second": 9e8},
                               "sum_received": {"bits_per_second": 5.5e8}}}"#;
        assert_eq!(received_bps(json), Some(5.5e8));
        assert_eq!(received_bps("{\"error\": \"unable to connect\"}"), None);
        assert_eq!(received_bps("not json"), None);
    }
}
