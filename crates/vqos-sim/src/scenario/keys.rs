//! The keys a `[[vm]]` and an `[[event]]` share, applied on top of a VM's settings; rates and
//! times with the key named in errors; the direction and what a download VM may not set.

use vqos_sched::policy::UNLIMITED_IN_BPS;
use vqos_sched::units::{parse_bytes, parse_duration_ns, parse_rate};
use vqos_sched::VifPolicy;

use super::raw::RawVmKeys;
use super::{invalid, Direction, ScenarioError, Traffic, VmSettings};

pub(super) fn rate(what: &str, text: &str) -> Result<Option<u64>, ScenarioError> {
    parse_rate(text).map_err(|e| invalid(format!("{what}: {e}")))
}

pub(super) fn time(what: &str, text: &str) -> Result<u64, ScenarioError> {
    parse_duration_ns(text).map_err(|e| invalid(format!("{what}: {e}")))
}

/// `"upload"` or `"download"` (`None` when not given).
pub(super) fn parse_direction(
    what: &str,
    text: Option<&str>,
) -> Result<Option<Direction>, ScenarioError> {
    match text {
        None => Ok(None),
        Some("upload") => Ok(Some(Direction::Upload)),
        Some("download") => Ok(Some(Direction::Download)),
        Some(other) => Err(invalid(format!(
            "{what}: '{other}' (expected \"upload\" or \"download\")"
        ))),
    }
}

/// The CPU limit of a VM (`cpu`): a share of one core, written as a percentage, `"25%"`, from
/// 3.4 % (the lab's CFS quota is taken per 30 ms period and the kernel's least quota is 1 ms)
/// to 6400 %; returned as a fraction (0.25).
pub(super) fn cpu_limit(what: &str, text: &str) -> Result<f64, ScenarioError> {
    let pct = text
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<f64>().ok())
        .ok_or_else(|| {
            invalid(format!(
                "{what}: '{text}' is not a share of a core (expected a percentage, e.g. \"25%\")"
            ))
        })?;
    if !(3.4..=6400.0).contains(&pct) {
        return Err(invalid(format!(
            "{what}: {pct} % is outside 3.4 % to 6400 % of a core (the least is 1 ms of CPU \
             per 30 ms period, the kernel's least CFS quota)"
        )));
    }
    Ok(pct / 100.0)
}

/// The share of the tightest link a VM should get alone (`cpu_alone`), written as a
/// percentage, `"60%"`, above 0 and at most 100 %; returned as a fraction (0.6).
pub(super) fn link_share(what: &str, text: &str) -> Result<f64, ScenarioError> {
    let pct = text
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.trim().parse::<f64>().ok())
        .filter(|p| *p > 0.0 && *p <= 100.0)
        .ok_or_else(|| {
            invalid(format!(
                "{what}: '{text}' is not a share of the link (expected a percentage above 0 \
                 and at most 100, e.g. \"60%\")"
            ))
        })?;
    Ok(pct / 100.0)
}

/// A download VM's data passes the switch's inbound path, which has no scheduler: only the
/// inbound maximum (`max_in`, else `max`) and PID-ECN act on it. A weight, a minimum or a
/// priority there is accepted (the format requires it) but acts on nothing, by the switch as
/// by the simulator: the warning says so, naming the key.
pub(super) fn download_policy_warning(what: &str, p: &VifPolicy) -> Option<String> {
    let d = VifPolicy::default();
    let keys: Vec<&str> = [
        ("weight", p.weight != d.weight),
        ("min", p.min_bps != d.min_bps),
        ("priority", p.priority != d.priority),
    ]
    .iter()
    .filter(|(_, set)| *set)
    .map(|(k, _)| *k)
    .collect();
    (!keys.is_empty()).then(|| {
        format!(
            "{what}: {} cannot act on a download VM and is ignored (the switch schedules only \
             what VMs send; what they receive passes only its inbound maximum, max_in or max)",
            keys.join(", ")
        )
    })
}

pub(super) fn apply_keys(
    what: &str,
    base: &VmSettings,
    k: &RawVmKeys,
) -> Result<(VmSettings, Option<u64>, Option<u64>), ScenarioError> {
    let mut s = base.clone();
    if let Some(w) = k.weight {
        s.policy.weight = w;
    }
    if let Some(m) = &k.min {
        s.policy.min_bps = rate(&format!("{what}.min"), m)?
            .ok_or_else(|| invalid(format!("{what}.min: a minimum cannot be unlimited")))?;
    }
    if let Some(m) = &k.max {
        s.policy.max_bps = rate(&format!("{what}.max"), m)?;
    }
    if let Some(m) = &k.max_in {
        s.policy.max_in_bps = Some(rate(&format!("{what}.max_in"), m)?.unwrap_or(UNLIMITED_IN_BPS));
    }
    if let Some(b) = &k.burst {
        s.policy.burst_bytes =
            Some(parse_bytes(b).map_err(|e| invalid(format!("{what}.burst: {e}")))?);
    }
    if let Some(p) = k.priority {
        s.policy.priority = p;
    }
    if let Some(f) = k.flows {
        if f == 0 || f > 10_000 {
            return Err(invalid(format!(
                "{what}.flows: {f} is out of range 1..=10000"
            )));
        }
        s.flows = f;
    }
    if let Some(t) = &k.traffic {
        s.traffic = match t.as_str() {
            "tcp" => Traffic::Tcp,
            "udp" => Traffic::Udp,
            other => {
                return Err(invalid(format!(
                    "{what}.traffic: '{other}' (expected \"tcp\" or \"udp\")"
                )))
            }
        };
    }
    if let Some(p) = k.packet_size {
        if !(64..=65_535).contains(&p) {
            return Err(invalid(format!(
                "{what}.packet_size: {p} is out of range 64..=65535"
            )));
        }
        s.packet_size = p;
    }
    if let Some(r) = &k.rate {
        s.rate_bps = rate(&format!("{what}.rate"), r)?;
        if s.rate_bps == Some(0) {
            return Err(invalid(format!("{what}.rate: must be greater than 0")));
        }
    }
    if let Some(r) = &k.rtt {
        s.rtt_ns = time(&format!("{what}.rtt"), r)?.max(1_000);
    }
    match (&k.on, &k.off) {
        (None, None) => {}
        (Some(on), Some(off)) => {
            let on = time(&format!("{what}.on"), on)?;
            let off = time(&format!("{what}.off"), off)?;
            if on == 0 {
                return Err(invalid(format!("{what}.on: must be greater than 0")));
            }
            s.on_off_ns = (off > 0).then_some((on, off));
        }
        _ => return Err(invalid(format!("{what}: give both on and off, or neither"))),
    }
    let start = k
        .start
        .as_deref()
        .map(|t| time(&format!("{what}.start"), t))
        .transpose()?;
    let stop = k
        .stop
        .as_deref()
        .map(|t| time(&format!("{what}.stop"), t))
        .transpose()?;
    Ok((s, start, stop))
}
