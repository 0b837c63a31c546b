//! A private Open vSwitch for the `ovs` baseline: its own ovsdb-server and ovs-vswitchd with
//! the userspace datapath (`datapath_type=netdev`), OpenFlow 1.3 meters as the per-VM limiter.
//!
//! ## Behavior
//! - [`OvsTools::find`] locates `ovsdb-tool`, `ovsdb-server`, `ovs-vswitchd`, `ovs-vsctl`,
//!   `ovs-ofctl`, `ovs-appctl` and the `vswitch.ovsschema` (Debian's `openvswitch-switch`); when
//!   one is missing the error names the package.
//! - [`Ovs::start`] creates a database in a scratch directory of the run and starts both daemons
//!   inside the switch namespace with their own database socket, unixctl sockets, pidfiles and
//!   logs (`OVS_RUNDIR`, `OVS_DBDIR`, `OVS_LOGDIR`, `OVS_SYSCONFDIR` point into the scratch
//!   directory too, so the bridge's management socket lands there). The system's OVS, if any, is
//!   never contacted: every command names the private socket. Userspace TSO is enabled before
//!   ovs-vswitchd starts (it is read once).
//! - The processes are registered in the run's [`Cleanup`] (killed by PID as a last resort); the
//!   [`Ovs`] handle's drop asks ovs-vswitchd to `exit --cleanup` and ovsdb-server to `exit`
//!   first, each with a timeout.
//! - Meters: one per VM with a maximum, `kbps` with a drop band at the maximum and a burst of
//!   [`METER_BURST_MS`] of the rate (ovs-vswitchd's default burst is one second of the rate);
//!   a flow at priority 10 sends the VM's packets through it, then `NORMAL` (L2 learning).
//!   Changing a maximum is a `mod-meter`; removing it deletes the flow and the meter.
//!
//! ## Limitations
//! - A meter is a policer: it drops what exceeds the rate, it cannot queue, so TCP through it
//!   runs somewhat under the rate; it cannot express minimums, weights or priorities.
//! - A deleted meter's counters are gone; the bytes each meter dropped are accumulated here
//!   across a delete and a later add ([`Ovs::meter_drops`]); `mod-meter` keeps them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sys::{run, run_quiet, spawn, Cleanup};
use crate::LabError;

/// The Debian package that has every tool the baseline needs.
pub const OVS_PACKAGE: &str = "openvswitch-switch";

/// Burst of a meter, in milliseconds of its rate (at least one 64 KiB TSO super-packet).
/// Measured with one Reno flow (TSO on, sub-millisecond RTT) against a 100 Mbit/s meter on an
/// uncongested uplink: 100 ms gave 73 Mbit/s, 300 ms 104 Mbit/s over 8 s (the first 300 ms of
/// the rate pass as the initial burst), ovs-vswitchd's default (1 s) 111 Mbit/s.
pub const METER_BURST_MS: u64 = 300;

/// Name of the OVS bridge (inside the switch namespace, private to the run).
pub const BRIDGE: &str = "br0";

/// Absolute paths of the Open vSwitch programs and schema.
#[derive(Debug, Clone)]
pub struct OvsTools {
    /// `ovsdb-tool`.
    pub ovsdb_tool: PathBuf,
    /// `ovsdb-server`.
    pub ovsdb_server: PathBuf,
    /// `ovs-vswitchd`.
    pub vswitchd: PathBuf,
    /// `ovs-vsctl`.
    pub vsctl: PathBuf,
    /// `ovs-ofctl`.
    pub ofctl: PathBuf,
    /// `ovs-appctl`.
    pub appctl: PathBuf,
    /// The database schema.
    pub schema: PathBuf,
}

/// The error for a missing piece of Open vSwitch.
pub fn missing(what: &str) -> LabError {
    LabError::MissingTool(format!(
        "{what}: the ovs baseline needs Open vSwitch (apt-get install -y {OVS_PACKAGE})"
    ))
}

impl OvsTools {
    /// Finds the tools in `path` (a `PATH`-style list) and the sbin directories.
    pub fn find_in(path: &str) -> Result<OvsTools, LabError> {
        let mut dirs: Vec<PathBuf> = std::env::split_paths(path).collect();
        for d in ["/usr/local/sbin", "/usr/sbin", "/sbin"] {
            dirs.push(PathBuf::from(d));
        }
        let find = |name: &str| -> Result<PathBuf, LabError> {
            dirs.iter()
                .map(|d| d.join(name))
                .find(|p| p.is_file())
                .ok_or_else(|| missing(name))
        };
        let vswitchd = find("ovs-vswitchd")?;
        let ovsdb_server = find("ovsdb-server")?;
        let ovsdb_tool = find("ovsdb-tool")?;
        let vsctl = find("ovs-vsctl")?;
        let ofctl = find("ovs-ofctl")?;
        let appctl = find("ovs-appctl")?;
        let schema = [
            "/usr/share/openvswitch/vswitch.ovsschema",
            "/usr/local/share/openvswitch/vswitch.ovsschema",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| missing("vswitch.ovsschema"))?;
        Ok(OvsTools {
            ovsdb_tool,
            ovsdb_server,
            vswitchd,
            vsctl,
            ofctl,
            appctl,
            schema,
        })
    }

    /// Finds the tools in `$PATH` and the sbin directories.
    pub fn find() -> Result<OvsTools, LabError> {
        let path = std::env::var("PATH").unwrap_or_default();
        OvsTools::find_in(&path)
    }
}

/// What one VM's meter matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeterMatch {
    /// Packets the VM sends (`in_port`): upload.
    InPort(u32),
    /// Packets to the VM's MAC address (`dl_dst`): download.
    DlDst(String),
}

impl MeterMatch {
    fn flow(&self) -> String {
        match self {
            MeterMatch::InPort(p) => format!("in_port={p}"),
            MeterMatch::DlDst(mac) => format!("dl_dst={mac}"),
        }
    }
}

/// A running private Open vSwitch.
#[derive(Debug)]
pub struct Ovs {
    tools: OvsTools,
    dir: PathBuf,
    logs: PathBuf,
    /// PID of ovs-vswitchd.
    pub vswitchd_pid: Option<u32>,
    /// Meter id → (bytes dropped by earlier incarnations of the meter).
    drops_base: Mutex<HashMap<u32, u64>>,
    stopped: bool,
}

/// The meter's `add-meter`/`mod-meter` argument for `max_bps`.
pub fn meter_spec(id: u32, max_bps: u64) -> String {
    let kbps = (max_bps / 1000).max(1);
    let burst_kbit = (kbps * METER_BURST_MS / 1000).max(64 * 1024 * 8 / 1000 + 1);
    format!("meter={id},kbps,burst,band=type=drop,rate={kbps},burst_size={burst_kbit}")
}

/// Parses `ovs-ofctl meter-stats`: meter id → bytes dropped by its bands.
pub fn parse_meter_stats(text: &str) -> HashMap<u32, u64> {
    let mut out = HashMap::new();
    let mut cur: Option<u32> = None;
    for tok in text.split_whitespace() {
        if let Some(id) = tok.strip_prefix("meter:") {
            cur = id.parse().ok();
            if let Some(id) = cur {
                out.entry(id).or_insert(0);
            }
        } else if let Some(b) = tok.strip_prefix("byte_count:") {
            if let (Some(id), Ok(b)) = (cur, b.parse::<u64>()) {
                *out.entry(id).or_insert(0) += b;
            }
        }
    }
    out
}

impl Ovs {
    /// The private directory's path of `file`.
    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// The environment that keeps every default path of OVS inside `dir`.
    fn env_args(dir: &Path) -> Vec<String> {
        let d = dir.display().to_string();
        ["OVS_RUNDIR", "OVS_DBDIR", "OVS_LOGDIR", "OVS_SYSCONFDIR"]
            .iter()
            .map(|k| format!("{k}={d}"))
            .collect()
    }

    /// Starts ovsdb-server and ovs-vswitchd inside namespace `ns`, with everything in `dir`
    /// (created; removed by `cleanup`), logs copied to `logs` when it stops, and creates the
    /// bridge with the userspace datapath.
    pub fn start(
        tools: OvsTools,
        ns: &str,
        dir: &Path,
        logs: &Path,
        cleanup: &mut Cleanup,
    ) -> Result<Ovs, LabError> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|source| LabError::Io {
            what: dir.display().to_string(),
            source,
        })?;
        cleanup.dirs.push(dir.to_path_buf());
        let mut ovs = Ovs {
            tools,
            dir: dir.to_path_buf(),
            logs: logs.to_path_buf(),
            vswitchd_pid: None,
            drops_base: Mutex::new(HashMap::new()),
            stopped: false,
        };
        let db = ovs.path("conf.db");
        let schema = ovs.tools.schema.display().to_string();
        run(&[&path_s(&ovs.tools.ovsdb_tool), "create", &db, &schema])?;

        let env = Ovs::env_args(dir);
        let mut args: Vec<String> = vec!["env".into()];
        args.extend(env.iter().cloned());
        args.extend([
            path_s(&ovs.tools.ovsdb_server),
            db,
            format!("--remote=punix:{}", ovs.path("db.sock")),
            format!("--pidfile={}", ovs.path("ovsdb-server.pid")),
            format!("--unixctl={}", ovs.path("ovsdb-server.ctl")),
            format!("--log-file={}", ovs.path("ovsdb-server.log")),
        ]);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut proc = spawn("ovsdb-server", Some(ns), &a, None)?;
        let sock = dir.join("db.sock");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            if proc.exited() || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("ovsdb-server.log")).unwrap_or_default();
                return Err(LabError::Setup(format!(
                    "ovsdb-server did not start: {}",
                    log.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        cleanup.services.push(proc);
        ovs.vsctl(&["--no-wait", "init"])?;
        ovs.vsctl(&[
            "--no-wait",
            "set",
            "Open_vSwitch",
            ".",
            "other_config:userspace-tso-enable=true",
        ])?;

        let mut args: Vec<String> = vec!["env".into()];
        args.extend(env.iter().cloned());
        args.extend([
            path_s(&ovs.tools.vswitchd),
            format!("unix:{}", ovs.path("db.sock")),
            format!("--pidfile={}", ovs.path("ovs-vswitchd.pid")),
            format!("--unixctl={}", ovs.path("ovs-vswitchd.ctl")),
            format!("--log-file={}", ovs.path("ovs-vswitchd.log")),
        ]);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut proc = spawn("ovs-vswitchd", Some(ns), &a, None)?;
        ovs.vswitchd_pid = proc.pid();
        let ctl = dir.join("ovs-vswitchd.ctl");
        let deadline = Instant::now() + Duration::from_secs(15);
        while !ctl.exists() {
            if proc.exited() || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("ovs-vswitchd.log")).unwrap_or_default();
                return Err(LabError::Setup(format!(
                    "ovs-vswitchd did not start: {}",
                    log.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        cleanup.services.push(proc);
        // Without --no-wait, ovs-vsctl waits until ovs-vswitchd has created the bridge.
        ovs.vsctl(&[
            "add-br",
            BRIDGE,
            "--",
            "set",
            "bridge",
            BRIDGE,
            "datapath_type=netdev",
            "protocols=OpenFlow10,OpenFlow13",
        ])?;
        Ok(ovs)
    }

    /// Runs ovs-vsctl on the private database.
    pub fn vsctl(&self, args: &[&str]) -> Result<String, LabError> {
        let vsctl = path_s(&self.tools.vsctl);
        let db = format!("--db=unix:{}", self.path("db.sock"));
        let mut v = vec![vsctl.as_str(), db.as_str(), "--timeout=20"];
        v.extend_from_slice(args);
        run(&v)
    }

    /// Runs `ovs-ofctl -O OpenFlow13 CMD <the bridge's socket> ARGS`.
    pub fn ofctl(&self, cmd: &str, args: &[&str]) -> Result<String, LabError> {
        let ofctl = path_s(&self.tools.ofctl);
        let target = format!("unix:{}", self.path(&format!("{BRIDGE}.mgmt")));
        let mut v = vec![ofctl.as_str(), "-O", "OpenFlow13", cmd, target.as_str()];
        v.extend_from_slice(args);
        run(&v)
    }

    /// Adds `dev` (a link in the switch namespace) to the bridge as OpenFlow port `ofport`
    /// (`type=system`: the userspace datapath reads and writes it through a packet socket).
    pub fn add_port(&self, dev: &str, ofport: Option<u32>) -> Result<(), LabError> {
        let mut args = vec!["add-port", BRIDGE, dev];
        let req = ofport.map(|p| format!("ofport_request={p}"));
        if let Some(r) = &req {
            args.extend(["--", "set", "interface", dev, r.as_str()]);
        }
        self.vsctl(&args)?;
        Ok(())
    }

    /// Sets meter `id` to `max_bps` on the packets `m` matches (`prev`: the maximum in place),
    /// or removes it (`None`).
    pub fn set_meter(
        &self,
        id: u32,
        m: &MeterMatch,
        prev: Option<u64>,
        max_bps: Option<u64>,
    ) -> Result<(), LabError> {
        let flow = m.flow();
        match (prev, max_bps) {
            (None, None) => {}
            (None, Some(b)) => {
                self.ofctl("add-meter", &[&meter_spec(id, b)])?;
                self.ofctl(
                    "add-flow",
                    &[&format!("priority=10,{flow},actions=meter:{id},NORMAL")],
                )?;
            }
            (Some(_), Some(b)) => {
                // mod-meter keeps the meter's counters (measured on 3.1).
                self.ofctl("mod-meter", &[&meter_spec(id, b)])?;
            }
            (Some(_), None) => {
                self.bank_drops(id);
                self.ofctl("del-flows", &["--strict", &format!("priority=10,{flow}")])?;
                self.ofctl("del-meter", &[&format!("meter={id}")])?;
            }
        }
        Ok(())
    }

    /// Adds what meter `id` dropped so far to its base (before it is deleted: a meter added
    /// again later starts from zero).
    fn bank_drops(&self, id: u32) {
        let now = self.read_meter_stats();
        if let Some(b) = now.get(&id) {
            if let Ok(mut base) = self.drops_base.lock() {
                *base.entry(id).or_insert(0) += b;
            }
        }
    }

    fn read_meter_stats(&self) -> HashMap<u32, u64> {
        self.ofctl("meter-stats", &[])
            .map(|t| parse_meter_stats(&t))
            .unwrap_or_default()
    }

    /// Bytes each meter dropped since it was first added, by meter id.
    pub fn meter_drops(&self) -> HashMap<u32, u64> {
        let mut now = self.read_meter_stats();
        if let Ok(base) = self.drops_base.lock() {
            for (id, b) in base.iter() {
                *now.entry(*id).or_insert(0) += b;
            }
        }
        now
    }

    /// Copies the daemons' logs, the flows and the meters into the run's logs.
    fn save_logs(&self) {
        let logs = &self.logs;
        for f in ["ovs-vswitchd.log", "ovsdb-server.log"] {
            let _ = std::fs::copy(self.dir.join(f), logs.join(f));
        }
        if let Ok(t) = self.ofctl("dump-flows", &[]) {
            let m = self.ofctl("dump-meters", &[]).unwrap_or_default();
            let s = self.ofctl("meter-stats", &[]).unwrap_or_default();
            let _ = std::fs::write(logs.join("ovs-flows.txt"), format!("{t}\n{m}\n{s}"));
        }
    }

    /// Asks ovs-vswitchd to exit and remove its datapath (`exit --cleanup`), then ovsdb-server
    /// to exit; each with a timeout. The run's [`Cleanup`] still kills them by PID if they
    /// did not. Idempotent.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        self.save_logs();
        let appctl = path_s(&self.tools.appctl);
        let vctl = self.path("ovs-vswitchd.ctl");
        if Path::new(&vctl).exists() {
            run_quiet(&[&appctl, "--timeout=10", "-t", &vctl, "exit", "--cleanup"]);
        }
        let dctl = self.path("ovsdb-server.ctl");
        if Path::new(&dctl).exists() {
            run_quiet(&[&appctl, "--timeout=5", "-t", &dctl, "exit"]);
        }
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        self.stop();
    }
}

fn path_s(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tools_name_the_package() {
        let err = OvsTools::find_in("/nonexistent").map(|_| ());
        // On a machine with OVS in an sbin directory the search succeeds; the error text is
        // what a machine without it sees.
        if let Err(e) = err {
            let text = e.to_string();
            assert!(
                text.contains("apt-get install -y openvswitch-switch"),
                "{text}"
            );
        }
        let text = missing("ovs-vswitchd").to_string();
        assert_eq!(
            text,
            "Missing tool: ovs-vswitchd: the ovs baseline needs Open vSwitch \
             (apt-get install -y openvswitch-switch)"
        );
    }

    #[test]
    fn meter_spec_is_kbps_with_a_burst() {
        assert_eq!(
            meter_spec(3, 100_000_000),
            "meter=3,kbps,burst,band=type=drop,rate=100000,burst_size=30000"
        );
        // A small rate still lets one 64 KiB super-packet through.
        assert!(meter_spec(1, 1_000_000).ends_with("burst_size=525"));
    }

    #[test]
    fn meter_stats_are_parsed() {
        let text = "OFPST_METER reply (OF1.3) (xid=0x2):\n\
meter:1 flow_count:1 packet_in_count:2383 byte_in_count:107899317 duration:7.568s bands:\n\
0: packet_count:388 byte_count:21862896\n\
meter:2 flow_count:1 packet_in_count:5 byte_in_count:500 duration:1.0s bands:\n\
0: packet_count:0 byte_count:0\n";
        let m = parse_meter_stats(text);
        assert_eq!(m.get(&1), Some(&21_862_896));
        assert_eq!(m.get(&2), Some(&0));
    }
}
