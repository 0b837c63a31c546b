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
                p.config.name.clone(),
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
            let socket = p.config.socket.as_deref().unwrap();
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

/// Why the end-to-end run cannot happen here, if it cannot.
fn e2e_missing(bins: &[PathBuf]) -> Option<String> {
    if let Some(why) = vqos_testkit::testpmd_missing() {
        return Some(why.to_string());
    }
    if !Path::new("/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk").exists() {
        return Some("OVS-DPDK not installed (apt-get install -y openvswitch-switch-dpdk)".into());
    }
    if let Some(b) = bins.iter().find(|b| !b.exists()) {
        return Some(format!(
            "{} not built (cargo build -p vqos-cli -p vqos-probe)",
            b.display()
        ));
    }
    // OVS-DPDK gets 1024 2-MiB hugepages (2 GiB) while it runs.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let avail_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    if avail_kib < 3 * 1024 * 1024 {
        return Some(format!(
            "{avail_kib} KiB available, OVS-DPDK's hugepages need 3 GiB"
        ));
    }
    None
}

/// The rows of the table in `md` whose first cell is `switch`, as cells.
fn rows(md: &str, switch: &str) -> Vec<Vec<String>> {
    md.lines()
        .filter(|l| l.starts_with(&format!("| {switch} |")))
        .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

/// The whole script for one second per phase: vqosd `tcm` and OVS-DPDK's policer (rate),
/// vqosd `c2qos-hbs` (latency). Asserts only what holds however loaded the machine is: every
/// run has its three phases, VM1's datagrams reach the sink, the floods are forwarded, the
/// probe gets answers, and nothing the script made is left (namespaces, hugepages). The
/// script takes the machine-wide real-traffic lock itself.
#[test]
fn the_script_runs_end_to_end_and_cleans_up() {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_vqosd")).parent().unwrap();
    let bins = [bin_dir.join("vqos"), bin_dir.join("vqos-probe")];
    if let Some(why) = e2e_missing(&bins) {
        println!("SKIP the_script_runs_end_to_end_and_cleans_up: {why}");
        return;
    }
    let hugepages = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out_dir = std::env::temp_dir().join(format!("vqos-c2qos-real-e2e-{}", std::process::id()));
    let child = Command::new("bash")
        .arg(root.join("scripts/lab-c2qos-real.sh"))
        .args(["-t", "1", "-s", "tcm,ovs-policer", "-l", "c2qos-hbs", "-o"])
        .arg(&out_dir)
        .env("VQOSD", env!("CARGO_BIN_EXE_vqosd"))
        .env("VQOS", &bins[0])
        .env("PROBE", &bins[1])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run bash");
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the script failed:\n{log}");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    for ns in [format!("vqc2v{pid}"), format!("vqc2s{pid}")] {
        let left = netns
            .lines()
            .any(|l| l.split_whitespace().next() == Some(ns.as_str()));
        assert!(!left, "namespace {ns} left behind");
    }
    // What the script found once it held the machine lock (read here, before it, another
    // benchmark's reservation could still have been in place).
    let huge_before = log
        .lines()
        .find_map(|l| l.split("2-MiB hugepages reserved before: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no hugepage line in the log:\n{log}"));
    assert_eq!(
        std::fs::read_to_string(hugepages).unwrap().trim(),
        huge_before,
        "hugepages given back"
    );
    let md_path = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "md"))
        .expect("the markdown table");
    let md = std::fs::read_to_string(md_path).unwrap();
    let num = |c: &str| c.parse::<f64>().unwrap_or(0.0);
    for switch in ["tcm", "ovs-policer"] {
        let r = rows(&md, switch);
        assert_eq!(r.len(), 3, "{switch}: three phases in\n{md}\n{log}");
        // Cells: "", switch, phase, sent, delivered, loss, kept, neighbours Mpps, ...
        assert!(
            num(&r[0][4]) > 0.0,
            "{switch}: VM1 reached the sink in phase 1:\n{md}"
        );
        assert!(
            num(&r[2][7]) > 0.0,
            "{switch}: the floods were forwarded:\n{md}"
        );
    }
    let r = rows(&md, "c2qos-hbs");
    assert_eq!(r.len(), 3, "c2qos-hbs: three phases in\n{md}\n{log}");
    for phase in &r {
        assert!(num(&phase[3]) > 0.0, "the probe got answers:\n{md}");
    }
    // The same rows as JSON, which `vqos lab paper c2qos-fig6 --baseline ovs-dpdk` reads
    // (its parsing is unit-tested in vqos-lab's real_load).
    let json_path = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("the JSON rows");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json_path).unwrap()).unwrap();
    let rows = v["rows"].as_array().expect("rows");
    let of = |kind: &str, sw: &str| {
        rows.iter()
            .filter(|r| r["kind"] == kind && r["switch"] == sw)
            .count()
    };
    assert_eq!(
        (
            of("rate", "tcm"),
            of("rate", "ovs-policer"),
            of("latency", "c2qos-hbs")
        ),
        (3, 3, 3),
        "{v}"
    );
    let tcm3 = rows
        .iter()
        .find(|r| r["kind"] == "rate" && r["switch"] == "tcm" && r["phase"] == 3)
        .unwrap();
    assert!(
        tcm3["loss_pct"].is_number() && tcm3["neighbours_mpps"].as_f64() > Some(0.0),
        "{v}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}
