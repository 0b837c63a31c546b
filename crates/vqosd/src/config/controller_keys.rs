//! The `controllers` list and the `[fairness]` / `[pid_ecn]` tables.

use serde::Deserialize;
use vqos_sched::controllers::fairness::FairnessParams;
use vqos_sched::controllers::pid_ecn::PidParams;
use vqos_sched::units::parse_duration_ns;

use super::ConfigError;
use crate::wire::Rate;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFairness {
    period: Option<String>,
    probe: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPid {
    slot: Option<String>,
    kp: Option<f64>,
    ki: Option<f64>,
    kd: Option<f64>,
    capacity: Option<Rate>,
}

/// The controllers the daemon runs beside the switch, with their parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControllersConfig {
    /// The fairness adjuster (`"fairness"`), if enabled.
    pub fairness: Option<FairnessParams>,
    /// PID-ECN (`"pid-ecn"`), if enabled.
    pub pid_ecn: Option<PidParams>,
}

impl ControllersConfig {
    /// True when no controller is enabled.
    pub fn is_empty(&self) -> bool {
        self.fairness.is_none() && self.pid_ecn.is_none()
    }
}

fn duration(key: &str, text: &Option<String>, default: u64) -> Result<u64, ConfigError> {
    match text {
        None => Ok(default),
        Some(t) => match parse_duration_ns(t) {
            Ok(0) => Err(ConfigError::Controllers(format!("{key} must be positive"))),
            Ok(ns) => Ok(ns),
            Err(e) => Err(ConfigError::Controllers(format!("{key}: {e}"))),
        },
    }
}

fn gain(key: &str, v: Option<f64>, default: f64) -> Result<f64, ConfigError> {
    match v {
        None => Ok(default),
        Some(k) if k.is_finite() && k >= 0.0 => Ok(k),
        Some(k) => Err(ConfigError::Controllers(format!(
            "{key} = {k}: a gain must be a finite number >= 0"
        ))),
    }
}

/// The `controllers` list and the `[fairness]` / `[pid_ecn]` tables, validated.
pub(super) fn controllers(
    names: &[String],
    fairness: Option<RawFairness>,
    pid: Option<RawPid>,
    capacity_bps: Option<u64>,
) -> Result<ControllersConfig, ConfigError> {
    let mut out = ControllersConfig::default();
    let (mut want_fair, mut want_pid) = (false, false);
    for n in names {
        let slot = match n.as_str() {
            "fairness" => &mut want_fair,
            "pid-ecn" => &mut want_pid,
            other => {
                return Err(ConfigError::Controllers(format!(
                    "unknown controller '{other}' (expected \"fairness\" or \"pid-ecn\")"
                )))
            }
        };
        if *slot {
            return Err(ConfigError::Controllers(format!(
                "controller '{n}' is listed twice"
            )));
        }
        *slot = true;
    }
    if fairness.is_some() && !want_fair {
        return Err(ConfigError::Controllers(
            "[fairness] is given but controllers does not list \"fairness\"".into(),
        ));
    }
    if pid.is_some() && !want_pid {
        return Err(ConfigError::Controllers(
            "[pid_ecn] is given but controllers does not list \"pid-ecn\"".into(),
        ));
    }
    if want_fair {
        let raw = fairness.unwrap_or_default();
        let d = FairnessParams::default();
        let period_ns = duration("fairness.period", &raw.period, d.period_ns)?;
        let probe_ns = duration("fairness.probe", &raw.probe, d.probe_ns)?;
        if probe_ns.saturating_mul(2) > period_ns {
            return Err(ConfigError::Controllers(format!(
                "fairness.period must be at least two probes (period {period_ns} ns, probe {probe_ns} ns)"
            )));
        }
        out.fairness = Some(FairnessParams {
            period_ns,
            probe_ns,
            ..d
        });
    }
    if want_pid {
        let raw = pid.unwrap_or_default();
        let d = PidParams::default();
        let capacity_bps = match raw.capacity {
            Some(Rate(Some(0))) | Some(Rate(None)) => {
                return Err(ConfigError::Controllers(
                    "pid_ecn.capacity must be a positive rate".into(),
                ))
            }
            Some(Rate(Some(c))) => c,
            None => capacity_bps.filter(|&c| c > 0).unwrap_or(d.capacity_bps),
        };
        out.pid_ecn = Some(PidParams {
            slot_ns: duration("pid_ecn.slot", &raw.slot, d.slot_ns)?,
            kp: gain("pid_ecn.kp", raw.kp, d.kp)?,
            ki: gain("pid_ecn.ki", raw.ki, d.ki)?,
            kd: gain("pid_ecn.kd", raw.kd, d.kd)?,
            capacity_bps,
            ..d
        });
    }
    Ok(out)
}
