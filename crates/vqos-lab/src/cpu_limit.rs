//! A VM's CPU limit in the lab (`cpu = "25%"` on a `[[vm]]`): a cgroup of the cpu controller
//! whose CFS quota is that share of one core, holding the VM's TCP endpoint (its iperf3).
//!
//! The PID-ECN paper traces its unfairness to the receiving VMs' CPU: under Xen's credit
//! scheduler a VM that is not running when its packets arrive leaves them unread, its TCP
//! window closes, and the sender backs off. The lab's VMs are namespaces whose endpoints are
//! ordinary processes, so the nearest thing is a CPU bandwidth limit on them: throttled, the
//! endpoint stops reading for the rest of the period and its socket's receive window fills.
//!
//! Choices:
//! - The period is 30 ms, the default time slice of Xen's credit scheduler (the paper's
//!   hypervisor): a throttled VM waits at most about as long as a descheduled Xen VM would.
//! - Both hierarchies: cgroup v1's `cpu` controller (`cpu.cfs_quota_us`, as on this lab's
//!   machine) and cgroup v2 (`cpu.max`, the cpu controller enabled for the root's children).
//! - The kernel's receive processing of the VM's packets runs where they are delivered (in
//!   the switch's write to the VM's TAP or veth), not in the cgroup: the limit reaches what
//!   a guest's own CPU does in the paper, reading its socket, and not the host's share.
//! - On drop the group's remaining processes move back to the root group and the group is
//!   removed, so nothing is left behind even when a run fails.

use std::cell::Cell;
use std::fs;
use std::path::{Path, PathBuf};

use crate::LabError;

/// The CFS period, µs: Xen's credit scheduler's default time slice.
pub const PERIOD_US: u64 = 30_000;

/// The kernel's least CFS quota, µs.
const MIN_QUOTA_US: u64 = 1_000;

const V1_ROOT: &str = "/sys/fs/cgroup/cpu";
const V2_ROOT: &str = "/sys/fs/cgroup";

/// The CFS quota of `fraction` of a core, µs; refused below the kernel's least.
fn quota_us(name: &str, fraction: f64) -> Result<u64, LabError> {
    let quota_us = (fraction * PERIOD_US as f64).round() as u64;
    if quota_us < MIN_QUOTA_US {
        return Err(LabError::Invalid(format!(
            "cpu limit for '{name}': {:.1} % of a core is {quota_us} µs per {} ms period, \
             below the kernel's least CFS quota of 1 ms (3.4 %)",
            fraction * 100.0,
            PERIOD_US / 1000
        )));
    }
    Ok(quota_us)
}

/// One VM's cpu cgroup (removed on drop).
#[derive(Debug)]
pub struct CpuLimit {
    dir: PathBuf,
    root: PathBuf,
    v2: bool,
    /// The share of a core in force.
    fraction: Cell<f64>,
}

/// How often a group was throttled, from its `cpu.stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Throttling {
    /// CFS periods in which the group ran.
    pub periods: u64,
    /// Of those, the periods that ended with the group throttled.
    pub throttled: u64,
    /// Time spent throttled, µs.
    pub throttled_us: u64,
}

impl CpuLimit {
    /// Makes group `name` (e.g. `vqos-lab-<run>-vm1`) allowed `fraction` of one core.
    pub fn create(name: &str, fraction: f64) -> Result<CpuLimit, LabError> {
        quota_us(name, fraction)?;
        let (root, v2) = if Path::new(V1_ROOT).join("cpu.cfs_quota_us").exists() {
            (PathBuf::from(V1_ROOT), false)
        } else if fs::read_to_string(Path::new(V2_ROOT).join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|k| k == "cpu"))
        {
            (PathBuf::from(V2_ROOT), true)
        } else {
            return Err(LabError::Invalid(format!(
                "cpu limit for '{name}': no cgroup cpu controller here (neither \
                 {V1_ROOT}/cpu.cfs_quota_us nor \"cpu\" in {V2_ROOT}/cgroup.subtree_control)"
            )));
        };
        let dir = root.join(name);
        let group = |dir: PathBuf| CpuLimit {
            dir,
            root: root.clone(),
            v2,
            fraction: Cell::new(fraction),
        };
        if dir.exists() {
            // A group left by a run that was killed: empty it and start afresh.
            drop(group(dir.clone()));
        }
        fs::create_dir(&dir).map_err(|source| LabError::Io {
            what: format!("creating cgroup {}", dir.display()),
            source,
        })?;
        let limit = group(dir);
        if !v2 {
            limit.write("cpu.cfs_period_us", &PERIOD_US.to_string())?;
        }
        limit.set(fraction)?;
        Ok(limit)
    }

    /// Allows the group `fraction` of one core from now on (the processes in it keep running).
    pub fn set(&self, fraction: f64) -> Result<(), LabError> {
        let name = self
            .dir
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        let quota = quota_us(&name, fraction)?;
        if self.v2 {
            self.write("cpu.max", &format!("{quota} {PERIOD_US}"))?;
        } else {
            self.write("cpu.cfs_quota_us", &quota.to_string())?;
        }
        self.fraction.set(fraction);
        Ok(())
    }

    /// The share of a core in force.
    pub fn fraction(&self) -> f64 {
        self.fraction.get()
    }

    /// Moves process `pid` (and, in v1, only that thread group's leader: the endpoints are
    /// single-threaded iperf3 clients) into the group.
    pub fn add(&self, pid: u32) -> Result<(), LabError> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// What the kernel counted so far (zeros where a field is missing).
    pub fn throttling(&self) -> Throttling {
        let text = fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
                .unwrap_or(0u64)
        };
        Throttling {
            periods: field("nr_periods"),
            throttled: field("nr_throttled"),
            throttled_us: match self.v2 {
                true => field("throttled_usec"),
                false => field("throttled_time") / 1_000,
            },
        }
    }

    fn write(&self, file: &str, value: &str) -> Result<(), LabError> {
        let path = self.dir.join(file);
        fs::write(&path, value).map_err(|source| LabError::Io {
            what: format!("writing {value} to {}", path.display()),
            source,
        })
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        let procs = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace() {
            let _ = fs::write(self.root.join("cgroup.procs"), pid);
        }
        if let Err(e) = fs::remove_dir(&self.dir) {
            eprintln!(
                "vqos lab: could not remove cgroup {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// A group per VM of `sc` that has a `cpu` limit or one to calibrate (`cpu_alone`: a whole
/// core until calibrated), `None` for the others, named after the run's `prefix`.
pub fn for_vms(sc: &vqos_sim::Scenario, prefix: &str) -> Result<Vec<Option<CpuLimit>>, LabError> {
    sc.vms
        .iter()
        .map(|v| {
            v.cpu_limit
                .or(v.cpu_alone.map(|_| 1.0))
                .map(|f| CpuLimit::create(&format!("vqos-lab-{prefix}-{}", v.name), f))
                .transpose()
        })
        .collect()
}

/// The iperf3 arguments of every VM's endpoint in a scenario where some VM has a CPU limit:
/// reads and writes of one segment (`packet_size` less the IP and TCP headers with
/// timestamps), so the endpoint's CPU work is per packet, as a guest's is (a guest's vCPU runs
/// its virtio queue and TCP stack for every packet; the lab's kernel does that work in the
/// switch's context, leaving the endpoint only its reads, which at iperf3's default 128 KiB
/// cost under 1 % of a core at 940 Mbit/s, below any quota CFS can set). The VMs without a
/// limit read the same way, so the limit is the only difference between them.
pub fn iperf_args(sc: &vqos_sim::Scenario, packet_size: u32) -> Vec<String> {
    if sc
        .vms
        .iter()
        .all(|v| v.cpu_limit.is_none() && v.cpu_alone.is_none())
    {
        return Vec::new();
    }
    vec![
        "-l".into(),
        packet_size.saturating_sub(52).max(88).to_string(),
    ]
}

/// Writes `logs/cpu-limits.json`: each limited VM's share of a core, how often the kernel
/// throttled it and, for a calibrated one, the calibration (nothing when no VM is limited).
pub fn write_log<C: serde::Serialize>(
    limits: &[Option<CpuLimit>],
    calibrations: &[Option<C>],
    sc: &vqos_sim::Scenario,
    logs: &Path,
) {
    let per: serde_json::Map<String, serde_json::Value> = sc
        .vms
        .iter()
        .zip(limits)
        .enumerate()
        .filter_map(|(i, (v, l))| {
            let l = l.as_ref()?;
            let mut value = serde_json::json!({
                "cpu": l.fraction(),
                "period_us": PERIOD_US,
                "throttling": l.throttling(),
            });
            if let Some(c) = calibrations.get(i).and_then(Option::as_ref) {
                value["calibration"] = serde_json::to_value(c).unwrap_or_default();
            }
            Some((v.name.clone(), value))
        })
        .collect();
    if !per.is_empty() {
        let text = serde_json::to_string_pretty(&per).unwrap_or_default();
        let _ = fs::write(logs.join("cpu-limits.json"), text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(limit: &CpuLimit) -> String {
        let file = if limit.v2 {
            "cpu.max"
        } else {
            "cpu.cfs_quota_us"
        };
        fs::read_to_string(limit.dir.join(file)).unwrap()
    }

    /// A real group (root only, skipped otherwise): its quota is the share of the period, a
    /// process moved in is listed, a new share is written in place, and drop moves the
    /// process out and removes the group.
    #[test]
    fn a_group_limits_what_it_holds_and_leaves_nothing_behind() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let name = format!("vqos-lab-test-{}", std::process::id());
        let limit = CpuLimit::create(&name, 0.25).unwrap();
        let dir = limit.dir.clone();
        assert!(quota(&limit).starts_with("7500"), "{}", quota(&limit));
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        limit.add(child.id()).unwrap();
        let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap();
        assert!(procs
            .split_whitespace()
            .any(|p| p == child.id().to_string()));
        assert_eq!(limit.throttling().throttled, 0);
        // Calibration moves the share while the process runs; below the least, refused.
        limit.set(0.07).unwrap();
        assert!(quota(&limit).starts_with("2100"), "{}", quota(&limit));
        assert_eq!(limit.fraction(), 0.07);
        assert!(limit.set(0.02).is_err());
        assert_eq!(limit.fraction(), 0.07);
        drop(limit);
        assert!(!dir.exists());
        // Below the kernel's least quota: refused, nothing made.
        let e = CpuLimit::create(&name, 0.02).unwrap_err().to_string();
        assert!(
            e.contains("below the kernel's least CFS quota of 1 ms"),
            "{e}"
        );
        assert!(!dir.exists());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
