//! `scripts/lab-c2qos-real.sh -n DIR` (C2QoS Fig. 6 on a real load) writes the configurations
//! it would run: every vqosd config must pass vqosd's own validation and say what the
//! experiment needs, and the OVS-DPDK commands must police each VM at its purchase. No root,
//! no traffic: the dry run starts nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use vqos_sched::engine::EngineKind;
use vqos_sched::policy::CostModel;
use vqosd::config::Config;

/// Runs the script's dry run with `args` into a fresh directory; returns the directory.
fn dry_run(tag: &str, args: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("vqos-c2qos-real-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("bash")
        .arg(root.join("scripts/lab-c2qos-real.sh"))
        .args(args)
        .args(["-H", "2000000000", "-n"])
        .arg(&dir)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "dry run failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

fn load(dir: &Path, switch: &str) -> Config {
    let text = std::fs::read_to_string(dir.join(format!("vqosd-{switch}.toml"))).unwrap();
    Config::parse(&text, |_| None).unwrap_or_else(|e| panic!("vqosd-{switch}.toml: {e}"))
}

/// (name, max Mbit/s, priority) of every vif.
fn vifs(c: &Config) -> Vec<(String, u64, u8)> {
    c.ports
        .iter()
        .map(|(p, pol)| {
            (
                p.name.clone(),
                pol.max_bps.unwrap() / 1_000_000,
                pol.priority,
            )
        })
        .collect()
}

#[test]
fn the_dry_run_writes_valid_vqosd_configs_for_each_engine() {
    let dir = dry_run("default", &[]);
    for (switch, engine, cost, prio1, prio_n) in [
        ("tcm", EngineKind::Tcm, CostModel::Bytes, 0, 0),
        ("c2qos", EngineKind::C2qos, CostModel::Cycles, 0, 0),
        ("c2qos-hbs", EngineKind::C2qos, CostModel::Cycles, 1, 7),
    ] {
        let c = load(&dir, switch);
        assert_eq!(c.engine, engine, "{switch}");
        assert_eq!(c.cost, cost, "{switch}");
        assert_eq!(c.capacity_bps, Some(1_000_000_000), "{switch}");
        assert_eq!(c.cycles_per_sec, 2_000_000_000, "{switch}");
        assert!(c.busy_poll, "{switch}: the switch core busy-polls");
        assert_eq!(
            c.storm_pps, 0,
            "{switch}: floods to nobody's MAC must not be storm-limited"
        );
        assert!(
            c.emulated_work.is_none(),
            "{switch}: no [emulate] on a real load"
        );
        assert!(c.uplink.is_some(), "{switch}");
        let v = vifs(&c);
        assert_eq!(v.len(), 4, "{switch}");
        assert!(v[0].0.starts_with("vqc2v"), "{switch}: VM1 is the TAP vif");
        assert_eq!((v[0].1, v[0].2), (400, prio1), "{switch}");
        let rest: Vec<_> = v[1..]
            .iter()
            .map(|(n, m, p)| (n.as_str(), *m, *p))
            .collect();
        assert_eq!(
            rest,
            [
                ("vm2", 400, prio_n),
                ("vm3", 100, prio_n),
                ("vm4", 100, prio_n)
            ],
            "{switch}"
        );
        for (p, _) in &c.ports[1..] {
            let socket = p.socket.as_deref().unwrap();
            assert!(
                socket.starts_with(dir.to_str().unwrap()),
                "{switch}: {socket}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_dry_run_polices_each_ovs_port_at_its_purchase() {
    let dir = dry_run("ovs", &["-c", "2000", "-p", "1000,600,300,50"]);
    let cmds = std::fs::read_to_string(dir.join("ovs-ovs-policer.sh")).unwrap();
    // kbit/s, and a burst of 10 ms of the rate but at least 64 KiB (524 kbit).
    for line in [
        "set Interface vm1 ingress_policing_rate=1000000 ingress_policing_burst=10000",
        "set Interface vm2 ingress_policing_rate=600000 ingress_policing_burst=6000",
        "set Interface vm3 ingress_policing_rate=300000 ingress_policing_burst=3000",
        "set Interface vm4 ingress_policing_rate=50000 ingress_policing_burst=524",
    ] {
        assert!(cmds.contains(line), "missing `{line}` in:\n{cmds}");
    }
    assert!(cmds.contains("type=dpdk options:dpdk-devargs=net_af_packet0,iface=vqc2a"));
    assert_eq!(cmds.matches("type=dpdkvhostuserclient").count(), 3);
    assert_eq!(cmds.matches(",actions=LOCAL").count(), 4);
    assert!(cmds.contains("in_port=LOCAL,actions=output:1"));
    let c = load(&dir, "c2qos");
    assert_eq!(c.capacity_bps, Some(2_000_000_000));
    let maxes: Vec<u64> = vifs(&c).iter().map(|v| v.1).collect();
    assert_eq!(maxes, [1000, 600, 300, 50]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_script_refuses_an_oversold_core_and_unknown_switches() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for args in [
        &["-c", "500", "-p", "400,400,100,100"][..],
        &["-s", "tcm,bogus"][..],
        &["-p", "400,400,100"][..],
    ] {
        let out = Command::new("bash")
            .arg(root.join("scripts/lab-c2qos-real.sh"))
            .args(args)
            .args(["-n", "/nonexistent-never-written"])
            .output()
            .expect("run bash");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?} must be refused as a usage error"
        );
    }
}
