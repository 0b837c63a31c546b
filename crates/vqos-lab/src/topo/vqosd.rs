//! vqosd for a lab run: where its binary is and the config generated from the scenario.

use std::path::{Path, PathBuf};

use vqos_sched::{CostModel, VifPolicy};
use vqos_sim::scenario::Scenario;

use crate::sys::run;
use crate::LabError;

/// Where to find vqosd: `explicit`, else `$VQOSD_BIN`, else next to the running binary, else
/// `target/release/vqosd` of the workspace, built with cargo when missing.
pub fn find_vqosd(explicit: Option<&Path>) -> Result<PathBuf, LabError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("VQOSD_BIN") {
        return Ok(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let p = dir.join("vqosd");
            if p.is_file() && dir.ends_with("release") {
                return Ok(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let p = root.join("target/release/vqosd");
    if !p.is_file() {
        let root_s = root.display().to_string();
        run(&[
            "cargo",
            "build",
            "--release",
            "-p",
            "vqosd",
            "--manifest-path",
            &format!("{root_s}/Cargo.toml"),
        ])?;
    }
    Ok(p)
}

/// The vqosd config for the scenario's capacity, engine, cost and initial policies.
pub fn vqosd_config(
    sc: &Scenario,
    work: &Path,
    uplink: &str,
    ports: &[String],
    policies: &[VifPolicy],
) -> String {
    let cost = match sc.cost {
        CostModel::Bytes => "bytes",
        CostModel::Cycles => "cycles",
    };
    let mut names = Vec::new();
    if sc.fairness {
        names.push("\"fairness\"");
    }
    if sc.pid_ecn {
        names.push("\"pid-ecn\"");
    }
    let mut s = format!(
        "capacity = {}\nengine = \"{}\"\ncost = \"{cost}\"\ncycles_per_sec = {}\ncpu_fair = {}\nvariant = \"{}\"\nthreads = {}\n\
         state_file = \"{}\"\nremove_taps_on_exit = true\ncontrollers = [{}]\n\n[api]\nsocket = \"{}\"\n\n[uplink]\nname = \"{uplink}\"\ncreate = true\n",
        sc.capacity_bps,
        sc.engine,
        sc.cpu_hz,
        sc.cpu_fair,
        sc.variant,
        sc.threads,
        work.join("state.json").display(),
        names.join(", "),
        work.join("vqosd.sock").display(),
    );
    if sc.threads > 1 {
        // One queue of the uplink TAP per thread: what the VMs receive is read on every one.
        s.push_str(&format!("queues = {}\n", sc.threads.min(16)));
    }
    if sc.cost_model.emulate_in_lab {
        // The model's per-packet and per-byte cycles, at the VMs' initial flow counts.
        let flows: u32 = sc.vms.iter().map(|v| v.initial.flows.max(1)).sum();
        s.push_str(&format!(
            "\n[emulate]\nframe_cycles = {}\nbyte_cycles = {:?}\nbatch = {}\n",
            sc.cost_model.frame_cycles(flows).round() as u64,
            sc.cost_model.byte_cycles(),
            sc.cost_model.emulate_batch
        ));
    }
    if let Ok(Some(p)) = sc.cost_model.pricing() {
        // Purchases priced with the scenario's model, as the simulator prices them.
        if let Some(m) = p.model {
            s.push_str(&format!(
                "\n[cost_model]\nbase_cycles = {:?}\ncycles_per_byte = {:?}\n\
                 price_frame_bytes = {}\n",
                m.base_cycles(),
                m.cycles_per_byte(),
                p.frame_bytes
            ));
        }
    }
    // The downlink as the simulator models it: its capacity (a top-level key: first, before
    // any table), scheduled or only bucketed.
    match sc.capacity_in_bps {
        Some(vqos_sched::policy::UNLIMITED_IN_BPS) => {
            s.insert_str(0, "capacity_in = \"unlimited\"\n")
        }
        Some(c) => s.insert_str(0, &format!("capacity_in = {c}\n")),
        None => {}
    }
    if !sc.downlink_scheduled {
        s.push_str("\n[downlink]\nschedule = false\n");
    } else if sc.downlink_flows != vqos_sched::fq::DEFAULT_FLOWS {
        s.push_str(&format!("\n[downlink]\nflows = {}\n", sc.downlink_flows));
    }
    let c = &sc.controller;
    if sc.fairness {
        s.push_str("\n[fairness]\n");
        if let Some(p) = c.fairness_period_s {
            s.push_str(&format!("period = \"{}ns\"\n", (p * 1e9) as u64));
        }
    }
    if sc.pid_ecn {
        // NC = the tightest link, as the simulator takes it (the router's bottleneck when
        // there is one, else the host's capacity).
        s.push_str(&format!("\n[pid_ecn]\ncapacity = {}\n", sc.tightest_bps()));
        for (k, v) in [("kp", c.kp), ("ki", c.ki), ("kd", c.kd)] {
            if let Some(v) = v {
                s.push_str(&format!("{k} = {v:?}\n"));
            }
        }
    }
    for (name, p) in ports.iter().zip(policies) {
        let max = p
            .max_bps
            .map_or_else(|| "\"unlimited\"".to_string(), |m| m.to_string());
        // max_in and burst only when the scenario states them (absent: vqosd's defaults).
        let mut extra = String::new();
        if let Some(m) = p.max_in_bps {
            extra.push_str(&match m {
                vqos_sched::policy::UNLIMITED_IN_BPS => ", max_in = \"unlimited\"".to_string(),
                m => format!(", max_in = {m}"),
            });
        }
        if let Some(b) = p.burst_bytes {
            extra.push_str(&format!(", burst = {b}"));
        }
        s.push_str(&format!(
            "\n[[port]]\nname = \"{name}\"\ncreate = true\npolicy = {{ weight = {}, min = {}, max = {max}, priority = {}{extra} }}\n",
            p.weight, p.min_bps, p.priority
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vqosd_config_carries_capacity_engine_and_policies() {
        let sc = Scenario::parse(
            "name = \"t\"\nduration = \"2s\"\ncapacity = \"200Mbit\"\nengine = \"ancs\"\n\
             [[vm]]\nname = \"vm1\"\nweight = 3\nmax = \"50Mbit\"\n",
        )
        .unwrap();
        let p = vec![sc.vms[0].initial.policy.clone()];
        let cfg = vqosd_config(&sc, Path::new("/tmp/x"), "up", &["p0".to_string()], &p);
        let parsed = vqosd::config::Config::parse(&cfg, |_| None).unwrap();
        assert_eq!(parsed.capacity_bps, Some(200_000_000));
        assert_eq!(parsed.engine.to_string(), "ancs");
        assert_eq!(parsed.ports.len(), 1);
        assert!(cfg.contains("weight = 3"), "{cfg}");
        assert!(cfg.contains("max = 50000000"), "{cfg}");
        assert!(parsed.controllers.is_empty());
        // max_in and burst reach vqosd when the scenario states them.
        let sc = Scenario::parse(
            "name = \"t\"\nduration = \"2s\"\ncapacity = \"200Mbit\"\n[[vm]]\nname = \"vm1\"\n\
             max_in = \"20Mbit\"\nburst = \"64KiB\"\n[[vm]]\nname = \"vm2\"\nmax_in = \"unlimited\"\n",
        )
        .unwrap();
        let p: Vec<_> = sc.vms.iter().map(|v| v.initial.policy.clone()).collect();
        let ports = ["p0".to_string(), "p1".to_string()];
        let cfg = vqosd_config(&sc, Path::new("/tmp/x"), "up", &ports, &p);
        let parsed = vqosd::config::Config::parse(&cfg, |_| None).unwrap();
        assert_eq!(parsed.ports[0].1, p[0], "{cfg}");
        assert_eq!(parsed.ports[1].1, p[1], "{cfg}");
        assert_eq!(p[0].burst_bytes, Some(65_536));
        assert_eq!(parsed.threads, 1);
    }

    #[test]
    fn the_scenarios_downlink_reaches_vqosd() {
        let parse = |keys: &str| {
            let sc = Scenario::parse(&format!(
                "name = \"t\"\nduration = \"2s\"\ncapacity = \"1Gbit\"\n{keys}\n\
                 [[vm]]\nname = \"vm1\"\ndirection = \"download\"\n"
            ))
            .unwrap();
            let p = vec![sc.vms[0].initial.policy.clone()];
            let cfg = vqosd_config(&sc, Path::new("/tmp/x"), "up", &["p0".to_string()], &p);
            vqosd::config::Config::parse(&cfg, |_| None)
                .unwrap_or_else(|e| panic!("{keys}: {e}\n{cfg}"))
        };
        let c = parse("");
        assert_eq!((c.capacity_in_bps, c.downlink.is_some()), (None, true));
        let c = parse("capacity_in = \"400Mbit\"\ndownlink = \"bucket\"");
        assert_eq!((c.capacity_in_bps, c.downlink), (Some(400_000_000), None));
        let c = parse("capacity_in = \"unlimited\"");
        assert_eq!(c.policy_set().downlink_capacity_bps(), None);
        let flows = |keys: &str| parse(keys).downlink.map(|d| d.flows);
        assert_eq!(flows(""), Some(64));
        assert_eq!(flows("downlink_flows = 1"), Some(1));
        assert_eq!(flows("downlink_flows = 8"), Some(8));
    }

    #[test]
    fn a_scenarios_threads_reach_vqosd_and_bad_ones_are_refused() {
        let sc = Scenario::parse(
            "name = \"t\"\nduration = \"2s\"\ncapacity = \"200Mbit\"\nthreads = 2\n\
             [[vm]]\nname = \"vm1\"\n",
        )
        .unwrap();
        assert_eq!(sc.threads, 2);
        let p = vec![sc.vms[0].initial.policy.clone()];
        let cfg = vqosd_config(&sc, Path::new("/tmp/x"), "up", &["p0".to_string()], &p);
        assert!(cfg.contains("threads = 2\n"), "{cfg}");
        // One uplink queue per thread, so that what the VMs receive is read on both.
        let up_queues = vqosd::config::Config::parse(&cfg, |_| None)
            .map(|c| c.uplink.map(|u| u.config.queues))
            .unwrap_or_else(|e| panic!("{e}\n{cfg}"));
        assert_eq!(up_queues, Some(Some(2)), "{cfg}");
        for bad in ["threads = 0", "threads = 65"] {
            let text = format!(
                "name = \"t\"\nduration = \"2s\"\ncapacity = \"1Mbit\"\n{bad}\n[[vm]]\nname = \"a\"\n"
            );
            let e = Scenario::parse(&text).unwrap_err().to_string();
            assert!(e.contains("threads: must be 1..=64"), "{bad}: {e}");
        }
    }

    #[test]
    fn vqosd_config_carries_the_controllers_and_their_gains() {
        let sc = Scenario::parse(
            "name = \"t\"\nduration = \"2s\"\ncapacity = \"10Gbit\"\n\
             [topology]\nbottleneck = \"940Mbit\"\ncontrollers = [\"fairness\", \"pid-ecn\"]\n\
             [controller]\nkp = 0.002\nkd = 1e-5\nfairness_period_s = 2.5\n\
             [[vm]]\nname = \"vm1\"\n",
        )
        .unwrap();
        let p = vec![sc.vms[0].initial.policy.clone()];
        let cfg = vqosd_config(&sc, Path::new("/tmp/x"), "up", &["p0".to_string()], &p);
        let parsed = vqosd::config::Config::parse(&cfg, |_| None).unwrap();
        let f = parsed.controllers.fairness.expect("fairness");
        assert_eq!(f.period_ns, 2_500_000_000);
        let pid = parsed.controllers.pid_ecn.expect("pid-ecn");
        assert_eq!((pid.kp, pid.kd), (0.002, 1e-5));
        assert_eq!(
            pid.ki,
            vqos_sched::controllers::pid_ecn::PidParams::default().ki
        );
        // NC is the router's bottleneck, not the host's 10 Gbit/s.
        assert_eq!(pid.capacity_bps, 940_000_000);
    }

    #[test]
    fn vqosd_config_prices_purchases_as_the_simulator_does() {
        let sc = Scenario::parse(
            "name = \"t\"\nduration = \"2s\"\ncapacity = \"10Gbit\"\nengine = \"c2qos\"\n\
             cpu_hz = 1540000000\n[cost_model]\nper_packet_cycles = 1000.0\n\
             per_byte_cycles = 0.25\nclassify_cycles = 300.0\nprice_frame_bytes = 1518\n\
             [[vm]]\nname = \"vm1\"\nmax = \"4Gbit\"\n",
        )
        .unwrap();
        let p = vec![sc.vms[0].initial.policy.clone()];
        let cfg = vqosd_config(&sc, Path::new("/tmp/x"), "up", &["p0".to_string()], &p);
        let parsed = vqosd::config::Config::parse(&cfg, |_| None).unwrap();
        let (switch, sim) = (parsed.policy_set(), sc.policies_at(0));
        assert_eq!(switch.pricing, sim.pricing, "{cfg}");
        assert_eq!(switch.pricing.frame_bytes, 1518);
        assert_eq!(
            switch.cost_per_sec(4_000_000_000),
            sim.cost_per_sec(4_000_000_000)
        );
    }
}
