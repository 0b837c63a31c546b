//! What the lab shapes with tc and the control API: the capacity and per-VM limits of each
//! baseline, live policy changes, and the router's bottleneck.

use std::sync::atomic::Ordering;

use vqos_sched::VifPolicy;
use vqos_sim::scenario::Direction;

use super::{Baseline, Topology, HTB_FLOOR_BPS, HTB_QUANTUM_PER_WEIGHT, SHARED_BOTTLENECK_DEV};
use crate::sys::{run, run_quiet};
use crate::LabError;

/// Formats bits/s for tc.
pub(super) fn tc_rate(bps: u64) -> String {
    format!("{bps}bit")
}

/// A tbf's burst for `bps`: 4 ms of it, at least 16 KiB, bytes.
pub(super) fn tbf_burst_bytes(bps: u64) -> u64 {
    (bps / 8 / 250).max(16 * 1024)
}

/// tbf arguments for `bps`: a burst of 4 ms (at least 16 KiB) and a queue of `queue_pkts`.
pub(super) fn tbf_args(bps: u64, queue_pkts: u32) -> Vec<String> {
    tbf_args_with_burst(bps, tbf_burst_bytes(bps), queue_pkts)
}

/// The router's bottleneck tbf at `bps` in a run whose bottleneck is at most `peak_bps`: the
/// burst of the peak rate, the same at every rate. A `tc qdisc change` that shrank the burst
/// would stall the router: the kernel's tbf takes a frame larger than the burst in place when
/// it was queued (a GSO frame is only cut when it exceeds the burst on arrival) and then never
/// has the tokens to send it, so its queue stays frozen until the next change raises the burst
/// again (docs/experiments.md, the 15 s stall under `policer`).
pub(super) fn bottleneck_tbf_args(bps: u64, peak_bps: u64, queue_pkts: u32) -> Vec<String> {
    tbf_args_with_burst(bps, tbf_burst_bytes(bps.max(peak_bps)), queue_pkts)
}

/// tbf arguments for `bps` with a burst of `burst` bytes and a queue of `queue_pkts` (at least
/// two bursts).
fn tbf_args_with_burst(bps: u64, burst: u64, queue_pkts: u32) -> Vec<String> {
    let limit = (u64::from(queue_pkts) * 1514).max(2 * burst);
    vec![
        "tbf".into(),
        "rate".into(),
        tc_rate(bps),
        "burst".into(),
        burst.to_string(),
        "limit".into(),
        limit.to_string(),
    ]
}

/// Runs `tc` with the static prefix `pre` and the dynamic tail.
pub(super) fn tc(pre: &[&str], tail: &[String]) -> Result<String, LabError> {
    let mut v: Vec<&str> = pre.to_vec();
    v.extend(tail.iter().map(String::as_str));
    run(&v)
}

impl Topology {
    /// The uplink's egress qdiscs and, per baseline, the per-VM shaping.
    pub(super) fn install_qos(&self, policies: &[VifPolicy]) -> Result<(), LabError> {
        let Some(sw) = &self.switch_ns else {
            return Ok(());
        };
        let cap = self.capacity_bps;
        match self.baseline {
            Baseline::Vqos => {}
            Baseline::Bridge | Baseline::Tbf | Baseline::Ovs => {
                // Toward the sink for upload, toward the VMs' ports for download.
                for dev in self.egress_devs() {
                    tc(
                        &["tc", "-n", sw, "qdisc", "replace", "dev", &dev, "root"],
                        &tbf_args(cap, 1000),
                    )?;
                }
                if self.baseline == Baseline::Tbf {
                    for (i, p) in policies.iter().enumerate() {
                        self.set_vm_tbf(i, p.max_bps)?;
                    }
                }
                if self.baseline == Baseline::Ovs {
                    for (i, p) in policies.iter().enumerate() {
                        self.set_vm_meter(i, p.max_bps)?;
                    }
                }
            }
            Baseline::Htb => {
                let dev = "upl";
                run(&[
                    "tc", "-n", sw, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb",
                    "default", "999",
                ])?;
                run(&[
                    "tc",
                    "-n",
                    sw,
                    "class",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:",
                    "classid",
                    "1:1",
                    "htb",
                    "rate",
                    &tc_rate(cap),
                    "ceil",
                    &tc_rate(cap),
                    "burst",
                    "128k",
                    "cburst",
                    "128k",
                ])?;
                run(&[
                    "tc",
                    "-n",
                    sw,
                    "class",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:1",
                    "classid",
                    "1:999",
                    "htb",
                    "rate",
                    &tc_rate(HTB_FLOOR_BPS),
                    "ceil",
                    &tc_rate(cap),
                ])?;
                for (i, p) in policies.iter().enumerate() {
                    self.htb_class(i, p, "add")?;
                    run(&[
                        "tc",
                        "-n",
                        sw,
                        "filter",
                        "add",
                        "dev",
                        dev,
                        "parent",
                        "1:",
                        "protocol",
                        "ip",
                        "prio",
                        "1",
                        "u32",
                        "match",
                        "ip",
                        "src",
                        &format!("{}/32", self.vm_ip[i]),
                        "flowid",
                        &format!("1:{}", 10 + i),
                    ])?;
                }
            }
        }
        Ok(())
    }

    /// Where the capacity tbf goes: the uplink's egress when some VM uploads, each download
    /// VM's port.
    pub(super) fn egress_devs(&self) -> Vec<String> {
        let mut devs = Vec::new();
        if self.directions.contains(&Direction::Upload) {
            devs.push("upl".to_string());
        }
        for (port, d) in self.ports.iter().zip(&self.directions) {
            if *d == Direction::Download {
                devs.push(port.clone());
            }
        }
        devs
    }

    pub(super) fn htb_class(&self, i: usize, p: &VifPolicy, verb: &str) -> Result<(), LabError> {
        let sw = self.switch_ns.as_deref().unwrap_or_default();
        let cap = self.capacity_bps;
        let rate = p.min_bps.max(HTB_FLOOR_BPS);
        let ceil = p.max_bps.unwrap_or(cap).min(cap).max(rate);
        let quantum = HTB_QUANTUM_PER_WEIGHT * u64::from(p.weight);
        run(&[
            "tc",
            "-n",
            sw,
            "class",
            verb,
            "dev",
            "upl",
            "parent",
            "1:1",
            "classid",
            &format!("1:{}", 10 + i),
            "htb",
            "rate",
            &tc_rate(rate),
            "ceil",
            &tc_rate(ceil),
            "quantum",
            &quantum.to_string(),
            "burst",
            "64k",
            "cburst",
            "64k",
        ])?;
        Ok(())
    }

    pub(super) fn set_vm_tbf(&self, i: usize, max_bps: Option<u64>) -> Result<(), LabError> {
        let ns = &self.vm_ns[i];
        let dev = &self.vm_if[i];
        match max_bps {
            Some(m) => {
                tc(
                    &["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root"],
                    &tbf_args(m, 1000),
                )?;
            }
            None => run_quiet(&["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"]),
        }
        Ok(())
    }

    /// Sets (or removes) VM `i`'s meter (ovs): meter `i + 1`.
    pub(super) fn set_vm_meter(&self, i: usize, max_bps: Option<u64>) -> Result<(), LabError> {
        let Some(o) = &self.ovs else {
            return Ok(());
        };
        let mut maxes = self
            .meter_max
            .lock()
            .map_err(|_| LabError::Setup("meter state poisoned".into()))?;
        let prev = maxes[i];
        if prev == max_bps {
            return Ok(());
        }
        o.set_meter(i as u32 + 1, &self.meter_match[i], prev, max_bps)?;
        maxes[i] = max_bps;
        if max_bps.is_some() {
            self.meters_used.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Applies VM `i`'s new policy (the baselines apply what they can express).
    pub fn set_policy(&self, i: usize, name: &str, p: &VifPolicy) -> Result<(), LabError> {
        match self.baseline {
            Baseline::Vqos => {
                let client = self
                    .client
                    .as_ref()
                    .ok_or_else(|| LabError::Vqosd("no client".into()))?;
                let mut body = serde_json::json!({
                    "weight": p.weight,
                    "min": p.min_bps,
                    "max": p.max_bps.map_or(serde_json::Value::from("unlimited"), serde_json::Value::from),
                    "priority": p.priority,
                });
                // Only when the scenario states them (a scenario cannot unset them), so that a
                // vqosd from before these keys still takes the others.
                if let Some(m) = p.max_in_bps {
                    body["max_in"] = match m {
                        vqos_sched::policy::UNLIMITED_IN_BPS => "unlimited".into(),
                        m => m.into(),
                    };
                }
                if let Some(b) = p.burst_bytes {
                    body["burst"] = b.into();
                }
                client
                    .call::<serde_json::Value>(
                        "PUT",
                        &format!("/v1/policies/{}", self.ports[i]),
                        Some(&body),
                    )
                    .map_err(|e| {
                        LabError::Vqosd(format!("Cannot set the policy of {name}: {e}"))
                    })?;
            }
            Baseline::Bridge => {}
            Baseline::Htb => self.htb_class(i, p, "change")?,
            Baseline::Tbf => self.set_vm_tbf(i, p.max_bps)?,
            Baseline::Ovs => self.set_vm_meter(i, p.max_bps)?,
        }
        Ok(())
    }

    /// The router's device that holds the bottleneck: its interface toward the sink when
    /// every VM uploads, toward the switch's uplink when every VM downloads, and the IFB
    /// device both interfaces' egress is redirected to when the directions are mixed (one
    /// queue for both, as the simulator's bottleneck).
    pub fn bottleneck_dev(&self) -> Option<(&str, &str)> {
        let up = self.directions.contains(&Direction::Upload);
        let down = self.directions.contains(&Direction::Download);
        self.router
            .as_ref()
            .map(|(ns, to_sink, to_switch)| match (up, down) {
                (true, true) => (ns.as_str(), SHARED_BOTTLENECK_DEV),
                (_, false) => (ns.as_str(), to_sink.as_str()),
                (false, true) => (ns.as_str(), to_switch.as_str()),
            })
    }

    /// Sets (or removes, `None`) the router's bottleneck; `prev` is the one in place. A rate
    /// change on an existing tbf is a `tc qdisc change` (the queue is kept) that keeps the
    /// burst of the run's fastest bottleneck (a smaller one could freeze the queue).
    pub fn set_bottleneck(
        &self,
        prev: Option<u64>,
        bps: Option<u64>,
        queue_pkts: u32,
    ) -> Result<(), LabError> {
        let Some((ns, dev)) = self.bottleneck_dev() else {
            return Ok(());
        };
        match (prev, bps) {
            (_, Some(b)) => {
                let verb = if prev.is_some() { "change" } else { "replace" };
                tc(
                    &["tc", "-n", ns, "qdisc", verb, "dev", dev, "root"],
                    &bottleneck_tbf_args(b, self.bottleneck_peak_bps, queue_pkts),
                )?;
            }
            (_, None) => run_quiet(&["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"]),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The burst and the rate of tbf arguments, bytes and bits/s.
    fn burst_and_rate(a: &[String]) -> (u64, u64) {
        let rate = a[2].trim_end_matches("bit").parse().unwrap();
        (a[4].parse().unwrap(), rate)
    }

    #[test]
    fn a_bottleneck_change_never_shrinks_the_burst() {
        // The fluctuating fairness scenario's router: 100, 70, 90, 60, 100, 80 Mbit/s. A frame
        // of 43 kB fits the burst at 90 Mbit/s (45 000 bytes) and is queued whole; at 60 Mbit/s
        // with a 4 ms burst (30 000 bytes) the kernel's tbf could never send it.
        let sc = vqos_sim::scenario::Scenario::parse(include_str!(
            "../../../../scenarios/fairness-fluctuating.toml"
        ))
        .unwrap();
        let peak = super::super::bottleneck_peak_bps(&sc);
        assert_eq!(peak, 100_000_000);
        let mut bursts = Vec::new();
        for t_s in [0, 15, 30, 45, 60, 75] {
            let b = sc.bottleneck_at(t_s * 1_000_000_000).unwrap();
            let (burst, rate) = burst_and_rate(&bottleneck_tbf_args(b, peak, 100));
            assert_eq!(rate, b);
            bursts.push(burst);
        }
        assert!(bursts.iter().all(|&b| b == 50_000), "{bursts:?}");
    }

    #[test]
    fn tbf_burst_covers_a_tso_frame() {
        let a = tbf_args(940_000_000, 100);
        assert_eq!(a[2], "940000000bit");
        let burst: u64 = a[4].parse().unwrap();
        assert!(burst >= 16 * 1024);
    }
}
