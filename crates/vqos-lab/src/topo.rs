//! The lab's topology in network namespaces, for vqosd and for the kernel baselines.
//!
//! ## Behavior
//! Names are `vl<pid><n>` plus a suffix (at most 12 characters, so interface names stay within
//! IFNAMSIZ); every address is private to its namespace, in `10.<x>.1.0/24` on the switch side
//! and `10.<x>.2.0/24` between the router and the sink.
//!
//! ```text
//!  vm0 ns ─┐                                   (optional)
//!  vm1 ns ─┼─ vqosd TAP ports │ Linux bridge ── uplink ── router ns (tbf at the bottleneck) ── sink ns
//!  ...    ─┘  (vqos)          │ (bridge/htb/tbf)
//! ```
//!
//! - `vqos`: vqosd creates one TAP per VM and the uplink TAP; the lab moves each into its
//!   namespace (the switch keeps its file descriptors), so traffic crosses vqosd.
//! - `bridge`: a switch namespace with a Linux bridge, a veth pair per VM and one toward the
//!   sink; the uplink's egress has a tbf at the scenario's capacity (the host's NIC).
//! - `htb`: the bridge plus an HTB tree on the uplink's egress: parent at the capacity, one class
//!   per VM (u32 filter on the source address) with rate = max(min, 1 Mbit), ceil = max or the
//!   capacity, quantum = 64 KiB × weight.
//! - `tbf`: the bridge with the capacity tbf on the uplink plus one tbf per VM at its max, on the
//!   VM's own interface (as the Kubernetes bandwidth plugin does).
//! - `ovs`: the same switch namespace and veths, but the switch is a private Open vSwitch
//!   ([`crate::ovs`]) with the userspace datapath (`datapath_type=netdev`, the veths as
//!   `type=system` ports); the capacity tbf on the uplink's egress; one OpenFlow meter per VM
//!   with a max (a flow matching the VM's `in_port`, or its MAC for download, then `NORMAL`).
//!   ovs-vswitchd's PID stands in `vqosd_pid`, so its CPU is measured.
//!
//! ## Limitations
//! Per-VM counters are what each VM sent into the switch (received bytes of its port); behind an
//! external bottleneck that can exceed what reached the sink.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vqos_api::client::{Client, Endpoint};
use vqos_api::wire::StatsView;
use vqos_sched::VifPolicy;
use vqos_sim::scenario::{Direction, Scenario};

use crate::ovs::{MeterMatch, Ovs, OvsTools};
use crate::sys::{self, run, spawn, Cleanup, NetnsCounters};
use crate::LabError;

mod baseline;
mod qos;
mod vqosd;

pub use baseline::Baseline;
pub use vqosd::{find_vqosd, vqosd_config};

/// For scenarios whose switch core is the resource under test (`[cost_model] emulate_in_lab`)
/// on a machine with at least two CPUs: the CPU vqosd is pinned to, and the others, where the
/// lab, its generators and its probes run. A real host gives the switch cores of its own and
/// every VM its own vCPUs; sharing one core between the switch and a spinning generator would
/// measure the host's scheduler instead of the switch.
pub fn dedicated_cpus(sc: &Scenario, baseline: Baseline) -> Option<(usize, Vec<usize>)> {
    // Only vqosd is pinned: a kernel baseline or OVS confined to the other CPUs would be
    // compared on one CPU fewer.
    if !sc.cost_model.emulate_in_lab || baseline != Baseline::Vqos {
        return None;
    }
    let cpus = sys::allowed_cpus();
    let (&first, rest) = cpus.split_first()?;
    (!rest.is_empty()).then(|| (first, rest.to_vec()))
}

/// Runs of this process so far (unique names for consecutive runs).
static RUNS: AtomicU32 = AtomicU32::new(0);

/// Congestion control of the lab's TCP endpoints (always allowed in a namespace).
pub const TCP_CC: &str = "reno";

/// Smallest HTB class rate (HTB needs a rate; a VM without a minimum gets this floor).
pub const HTB_FLOOR_BPS: u64 = 1_000_000;

/// HTB quantum per unit of weight: one TSO super-packet, so weights are not flattened.
pub const HTB_QUANTUM_PER_WEIGHT: u64 = 65_536;

/// The built topology.
pub struct Topology {
    /// Name prefix of everything this run created.
    pub prefix: String,
    /// Which switch.
    pub baseline: Baseline,
    /// Namespace of each VM.
    pub vm_ns: Vec<String>,
    /// Address of each VM.
    pub vm_ip: Vec<String>,
    /// Interface each VM sends on, inside its namespace.
    pub vm_if: Vec<String>,
    /// The sink's namespace.
    pub sink_ns: String,
    /// The sink's address.
    pub sink_ip: String,
    /// The router's namespace, its interface toward the sink and its interface toward the
    /// switch's uplink, when there is a bottleneck.
    pub router: Option<(String, String, String)>,
    /// The bridge's namespace (baselines).
    pub switch_ns: Option<String>,
    /// Per-VM port names on the switch (TAP names for vqos, bridge ports otherwise).
    pub ports: Vec<String>,
    /// The control API client (vqos).
    pub client: Option<Client>,
    /// vqosd's PID (vqos).
    pub vqosd_pid: Option<u32>,
    /// Counter reader inside the switch namespace (baselines).
    counters: Option<NetnsCounters>,
    /// The private Open vSwitch (ovs).
    ovs: Option<Ovs>,
    /// What each VM's meter matches (ovs).
    meter_match: Vec<MeterMatch>,
    /// Each VM's maximum in place as a meter (ovs).
    meter_max: Mutex<Vec<Option<u64>>>,
    /// Whether any meter was ever installed (ovs; meter drops are then read per sample).
    meters_used: AtomicBool,
    /// Capacity of the host link, bits/s.
    capacity_bps: u64,
    /// Each VM's direction.
    directions: Vec<Direction>,
    /// The fastest rate the router's bottleneck takes in the run, bits/s (0 = none): its
    /// tbf keeps this rate's burst at every rate ([`qos::bottleneck_tbf_args`]).
    bottleneck_peak_bps: u64,
}

/// The fastest rate the scenario's bottleneck takes, bits/s (0 without one).
pub(crate) fn bottleneck_peak_bps(sc: &Scenario) -> u64 {
    let events = sc.events.iter().filter_map(|e| e.bottleneck_bps);
    sc.bottleneck_bps
        .into_iter()
        .chain(events)
        .filter(|&b| b != u64::MAX)
        .max()
        .unwrap_or(0)
}

/// The IFB device in the router's namespace that holds the bottleneck shared by both
/// directions (scenarios whose VMs upload and download).
const SHARED_BOTTLENECK_DEV: &str = "ifb0";

impl Topology {
    /// Builds the topology for `sc` under `baseline`, registering everything in `cleanup`;
    /// vqosd is pinned to `switch_cpu` when given ([`dedicated_cpus`]). `logs` receives
    /// vqosd's output.
    pub fn build(
        sc: &Scenario,
        switch_cpu: Option<usize>,
        baseline: Baseline,
        vqosd_bin: Option<&Path>,
        logs: &Path,
        cleanup: &mut Cleanup,
    ) -> Result<Topology, LabError> {
        // Before anything is created: the ovs baseline needs Open vSwitch installed.
        let ovs_tools = match baseline {
            Baseline::Ovs => Some(OvsTools::find()?),
            _ => None,
        };
        let pid = std::process::id() % 100_000;
        let n = RUNS.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("vl{pid}{}", (b'a' + (n % 26) as u8) as char);
        let net = format!("10.{}", 50 + pid % 150);
        let nvm = sc.vms.len();
        let policies: Vec<VifPolicy> = sc.state_at(0).into_iter().map(|s| s.0.policy).collect();

        let sink_ns = format!("{prefix}-sink");
        cleanup.netns(&sink_ns)?;
        let needs_router =
            sc.bottleneck_bps.is_some() || sc.events.iter().any(|e| e.bottleneck_bps.is_some());
        let router_ns = format!("{prefix}-rtr");
        let edge_ns = if needs_router {
            cleanup.netns(&router_ns)?;
            router_ns.clone()
        } else {
            sink_ns.clone()
        };
        let vm_ns: Vec<String> = (0..nvm).map(|i| format!("{prefix}-vm{i}")).collect();
        for ns in &vm_ns {
            cleanup.netns(ns)?;
        }
        let vm_ip: Vec<String> = (0..nvm).map(|i| format!("{net}.1.{}", i + 1)).collect();
        let edge_ip = format!("{net}.1.254");

        let mut topo = Topology {
            prefix: prefix.clone(),
            baseline,
            vm_ns: vm_ns.clone(),
            vm_ip: vm_ip.clone(),
            vm_if: Vec::new(),
            sink_ns: sink_ns.clone(),
            sink_ip: edge_ip.clone(),
            router: None,
            switch_ns: None,
            ports: Vec::new(),
            client: None,
            vqosd_pid: None,
            counters: None,
            ovs: None,
            meter_match: Vec::new(),
            meter_max: Mutex::new(vec![None; nvm]),
            meters_used: AtomicBool::new(false),
            capacity_bps: sc.capacity_bps,
            directions: sc.vms.iter().map(|v| v.direction).collect(),
            bottleneck_peak_bps: bottleneck_peak_bps(sc),
        };

        // The switch and the links from the VMs to the edge (router or sink).
        match baseline {
            Baseline::Vqos => {
                let work = std::env::temp_dir().join(format!("vqos-lab-{prefix}"));
                let _ = std::fs::remove_dir_all(&work);
                std::fs::create_dir_all(&work).map_err(|source| LabError::Io {
                    what: work.display().to_string(),
                    source,
                })?;
                cleanup.dirs.push(work.clone());
                let uplink = format!("{prefix}u");
                let ports: Vec<String> = (0..nvm).map(|i| format!("{prefix}v{i}")).collect();
                let cfg_path = work.join("vqosd.toml");
                let cfg = vqosd_config(sc, &work, &uplink, &ports, &policies);
                std::fs::write(&cfg_path, cfg).map_err(|source| LabError::Io {
                    what: cfg_path.display().to_string(),
                    source,
                })?;
                let bin = find_vqosd(vqosd_bin)?;
                let log = logs.join("vqosd.log");
                let cfg_s = cfg_path.display().to_string();
                let bin_s = bin.display().to_string();
                let mut proc = spawn("vqosd", None, &[&bin_s, "--config", &cfg_s], Some(&log))?;
                let client = Client::new(Endpoint::Unix(work.join("vqosd.sock")));
                let deadline = Instant::now() + Duration::from_secs(15);
                loop {
                    if client
                        .call::<serde_json::Value>("GET", "/v1/health", None)
                        .is_ok()
                    {
                        break;
                    }
                    if proc.exited() || Instant::now() > deadline {
                        let text = std::fs::read_to_string(&log).unwrap_or_default();
                        proc.stop(Duration::from_secs(1));
                        return Err(LabError::Vqosd(format!(
                            "vqosd did not start: {}",
                            text.trim()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                topo.vqosd_pid = proc.pid();
                if let (Some(cpu), Some(pid)) = (switch_cpu, proc.pid()) {
                    sys::pin_process(pid, &[cpu])?;
                }
                cleanup.services.push(proc);
                topo.client = Some(client);
                move_link(&uplink, &edge_ns, &format!("{edge_ip}/24"))?;
                for (i, port) in ports.iter().enumerate() {
                    move_link(port, &vm_ns[i], &format!("{}/24", vm_ip[i]))?;
                }
                topo.vm_if = ports.clone();
                topo.ports = ports;
            }
            _ => {
                let sw = format!("{prefix}-sw");
                cleanup.netns(&sw)?;
                let ovs = baseline == Baseline::Ovs;
                if !ovs {
                    run(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"])?;
                    run(&["ip", "-n", &sw, "link", "set", "br0", "up"])?;
                }
                for (i, ns) in vm_ns.iter().enumerate() {
                    let port = format!("v{i}");
                    run(&[
                        "ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name",
                        &port, "netns", &sw,
                    ])?;
                    if ovs {
                        // A known MAC: the download meter matches it (dl_dst).
                        let mac = vm_mac(i);
                        run(&["ip", "-n", ns, "link", "set", "eth0", "address", &mac])?;
                        run(&["ip", "-n", &sw, "link", "set", &port, "up"])?;
                        topo.meter_match.push(match sc.vms[i].direction {
                            Direction::Upload => MeterMatch::InPort(i as u32 + 1),
                            Direction::Download => MeterMatch::DlDst(mac),
                        });
                    } else {
                        run(&["ip", "-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
                    }
                    run(&[
                        "ip",
                        "-n",
                        ns,
                        "addr",
                        "add",
                        &format!("{}/24", vm_ip[i]),
                        "dev",
                        "eth0",
                    ])?;
                    run(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
                    topo.ports.push(port);
                    topo.vm_if.push("eth0".into());
                }
                run(&[
                    "ip", "-n", &sw, "link", "add", "upl", "type", "veth", "peer", "name", "eth0",
                    "netns", &edge_ns,
                ])?;
                if ovs {
                    run(&["ip", "-n", &sw, "link", "set", "upl", "up"])?;
                } else {
                    run(&["ip", "-n", &sw, "link", "set", "upl", "master", "br0", "up"])?;
                }
                run(&[
                    "ip",
                    "-n",
                    &edge_ns,
                    "addr",
                    "add",
                    &format!("{edge_ip}/24"),
                    "dev",
                    "eth0",
                ])?;
                run(&["ip", "-n", &edge_ns, "link", "set", "eth0", "up"])?;
                if let Some(tools) = ovs_tools {
                    let dir = std::env::temp_dir().join(format!("vqos-lab-{prefix}-ovs"));
                    let o = Ovs::start(tools, &sw, &dir, logs, cleanup)?;
                    for (i, port) in topo.ports.iter().enumerate() {
                        o.add_port(port, Some(i as u32 + 1))?;
                    }
                    o.add_port("upl", None)?;
                    topo.vqosd_pid = o.vswitchd_pid;
                    topo.ovs = Some(o);
                }
                topo.counters = Some(NetnsCounters::start(&sw)?);
                topo.switch_ns = Some(sw);
                topo.install_qos(&policies)?;
            }
        }

        if !sc.tso {
            // MTU frames, as the papers' Xen netback saw them: TCP builds one segment per
            // frame when the device takes no more (`sk_gso_max_segs`).
            for (ns, dev) in vm_ns.iter().zip(&topo.vm_if) {
                run(&[
                    "ip",
                    "-n",
                    ns,
                    "link",
                    "set",
                    "dev",
                    dev,
                    "gso_max_segs",
                    "1",
                ])?;
            }
        }
        // The router between the uplink and the sink.
        if needs_router {
            run(&[
                "ip", "-n", &router_ns, "link", "add", "r0", "type", "veth", "peer", "name", "s0",
                "netns", &sink_ns,
            ])?;
            run(&[
                "ip",
                "-n",
                &router_ns,
                "addr",
                "add",
                &format!("{net}.2.1/24"),
                "dev",
                "r0",
            ])?;
            run(&["ip", "-n", &router_ns, "link", "set", "r0", "up"])?;
            run(&[
                "ip",
                "-n",
                &sink_ns,
                "addr",
                "add",
                &format!("{net}.2.2/24"),
                "dev",
                "s0",
            ])?;
            run(&["ip", "-n", &sink_ns, "link", "set", "s0", "up"])?;
            run(&[
                "ip",
                "-n",
                &sink_ns,
                "route",
                "add",
                &format!("{net}.1.0/24"),
                "via",
                &format!("{net}.2.1"),
            ])?;
            run(&[
                "ip",
                "netns",
                "exec",
                &router_ns,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ])?;
            for (ns, dev) in vm_ns.iter().zip(&topo.vm_if) {
                run(&[
                    "ip", "-n", ns, "route", "add", "default", "via", &edge_ip, "dev", dev,
                ])?;
            }
            topo.sink_ip = format!("{net}.2.2");
            let toward_switch = match baseline {
                Baseline::Vqos => format!("{prefix}u"),
                _ => "eth0".to_string(),
            };
            if sc.mixed_directions() {
                // One queue for both directions: each router interface's egress is redirected
                // to an IFB device that holds the bottleneck's tbf (the packets then leave by
                // the interface they were going to).
                let ifb = SHARED_BOTTLENECK_DEV;
                run(&["ip", "-n", &router_ns, "link", "add", ifb, "type", "ifb"])?;
                run(&["ip", "-n", &router_ns, "link", "set", ifb, "up"])?;
                for dev in ["r0", toward_switch.as_str()] {
                    run(&["tc", "-n", &router_ns, "qdisc", "add", "dev", dev, "clsact"])?;
                    run(&[
                        "tc", "-n", &router_ns, "filter", "add", "dev", dev, "egress", "protocol",
                        "all", "u32", "match", "u32", "0", "0", "action", "mirred", "egress",
                        "redirect", "dev", ifb,
                    ])?;
                }
            }
            topo.router = Some((router_ns, "r0".into(), toward_switch));
            topo.set_bottleneck(None, sc.bottleneck_at(0), sc.bottleneck_queue)?;
        }
        // The TCP endpoints (the VMs and the sink) run loss- and ECN-driven AIMD (Reno, the
        // simulator's model), with ECN requested, so CE marks (PID-ECN) reach the senders and
        // a shared bottleneck is split by connection count. The kernel's ECN default (2) only
        // accepts ECN, never asks for it; a host default of BBR ignores CE marks; CUBIC can only
        // be chosen in a namespace when the host allows it (tcp_allowed_congestion_control).
        for ns in vm_ns.iter().chain([&sink_ns]) {
            run(&[
                "ip",
                "netns",
                "exec",
                ns,
                "sysctl",
                "-qw",
                "net.ipv4.tcp_ecn=1",
                &format!("net.ipv4.tcp_congestion_control={TCP_CC}"),
            ])?;
        }
        Ok(topo)
    }

    /// Cumulative bytes each VM has sent (upload) or received (download) through the switch.
    pub fn vm_bytes(&self) -> Result<Vec<u64>, LabError> {
        let upload = |i: usize| self.directions[i] == Direction::Upload;
        if let Some(client) = &self.client {
            let v: StatsView = client
                .call("GET", "/v1/stats", None)
                .map_err(|e| LabError::Vqosd(format!("Cannot read stats: {e}")))?;
            return Ok(self
                .ports
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let port = v.ports.iter().find(|p| p.stats.name == *name);
                    let c = port.map(|p| p.stats.counters).unwrap_or_default();
                    if upload(i) {
                        c.rx_bytes
                    } else {
                        c.tx_bytes
                    }
                })
                .collect());
        }
        let all = self.counters.as_ref().map(|c| c.read()).unwrap_or_default();
        // OVS counts a VM's packets on its port before the meter drops them: what the switch
        // let through is the port's bytes less the meter's drops (upload).
        let drops = match &self.ovs {
            Some(o) if self.meters_used.load(Ordering::SeqCst) => o.meter_drops(),
            _ => Default::default(),
        };
        Ok(self
            .ports
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let bytes = all
                    .iter()
                    .find(|(n, _, _)| n == name)
                    .map_or(0, |&(_, rx, tx)| if upload(i) { rx } else { tx });
                if !upload(i) {
                    // A download meter drops after the port's counter: tx is what passed.
                    return bytes;
                }
                bytes.saturating_sub(drops.get(&(i as u32 + 1)).copied().unwrap_or(0))
            })
            .collect())
    }
}

/// The MAC address of VM `i`'s interface under the ovs baseline (locally administered).
fn vm_mac(i: usize) -> String {
    format!("02:76:71:00:{:02x}:{:02x}", (i >> 8) & 0xff, i & 0xff)
}

/// Moves `link` into `ns`, gives it `addr` and brings it up.
fn move_link(link: &str, ns: &str, addr: &str) -> Result<(), LabError> {
    run(&["ip", "link", "set", link, "netns", ns])?;
    run(&["ip", "-n", ns, "addr", "add", addr, "dev", link])?;
    run(&["ip", "-n", ns, "link", "set", link, "up"])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_names_round_trip() {
        for b in [
            Baseline::Vqos,
            Baseline::Bridge,
            Baseline::Htb,
            Baseline::Tbf,
            Baseline::Ovs,
        ] {
            assert_eq!(b.name().parse::<Baseline>().unwrap(), b);
        }
        assert_eq!("ovs".parse::<Baseline>().unwrap(), Baseline::Ovs);
        let err = "openvswitch".parse::<Baseline>().unwrap_err().to_string();
        assert_eq!(
            err,
            "Unknown baseline 'openvswitch': expected vqos, bridge, htb, tbf or ovs (and, for \
             `vqos lab paper c2qos-fig6` only, ovs-dpdk: the real load)"
        );
        assert!(Baseline::Ovs.capabilities().contains("meter"));
        assert_eq!(vm_mac(258), "02:76:71:00:01:02");
    }
}
