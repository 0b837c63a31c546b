//! Shared by vqosd's real-traffic tests: the daemon as a child process, a lab of namespace
//! VMs on its TAP ports, iperf3 reports and the reference allocation.
#![allow(dead_code)]

pub mod cluster;
pub mod qemu;

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use vqos_sched::{allocate, Claim, VifPolicy};
use vqos_testkit::{poll, Netns, Proc};
use vqosd::client::{Client, Endpoint};

pub const BIN: &str = env!("CARGO_BIN_EXE_vqosd");
pub const CAPACITY_BPS: u64 = 940_000_000;

/// Tolerance and least aggregate for the checks beyond issue 3's numbers (5 %, 97 %, held by
/// `weights_then_live_policies`): wide enough for a busy machine, far narrower than the failures
/// they catch (an idle share not handed on, or policies not restored, are off by ≥ 30 %).
pub const LOOSE_TOL: f64 = 0.10;
pub const LOOSE_AGGREGATE: f64 = 0.93;

/// A running vqosd; stopped with SIGTERM (SIGKILL past 5 s) on drop.
pub struct Daemon {
    pub child: Option<Child>,
    pub socket: PathBuf,
    /// Everything it printed after "listening on" (drained so it never blocks on a pipe).
    pub log: Arc<Mutex<String>>,
}

impl Daemon {
    pub fn start(config: &Path, socket: &Path) -> Daemon {
        Daemon::start_args(config, socket, &[])
    }

    /// [`Daemon::start`] with more arguments (e.g. `--backend mock`).
    pub fn start_args(config: &Path, socket: &Path, args: &[&str]) -> Daemon {
        let mut cmd = Command::new(BIN);
        cmd.arg("--config").arg(config).args(args);
        Daemon::start_command(cmd, socket)
    }

    /// Runs `cmd` (vqosd, possibly behind a wrapper such as `setpriv`) and waits until it
    /// serves on `socket`; panics with its stderr if it does not start.
    pub fn start_command(mut cmd: Command, socket: &Path) -> Daemon {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut stderr = child.stderr.take().unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        if !line.contains("listening on") {
            let mut err = String::new();
            let _ = stderr.read_to_string(&mut err);
            let _ = child.kill();
            let _ = child.wait();
            panic!("vqosd did not start: stdout {line:?}, stderr {err:?}");
        }
        let log = Arc::new(Mutex::new(String::new()));
        let l = log.clone();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                l.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                l.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        Daemon {
            child: Some(child),
            socket: socket.to_path_buf(),
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn client(&self) -> Client {
        Client::new(Endpoint::Unix(self.socket.clone()))
    }

    pub fn get(&self, path: &str) -> Value {
        self.client()
            .call("GET", path, None)
            .unwrap_or_else(|e| panic!("GET {path}: {e}; vqosd: {}", self.log()))
    }

    pub fn call(&self, method: &str, path: &str, body: Value) -> Value {
        self.client()
            .call(method, path, Some(&body))
            .unwrap_or_else(|e| panic!("{method} {path} {body}: {e}"))
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILL, and waits for it to be gone.
    pub fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        // SAFETY: kill on the PID of our own, not yet reaped, child.
        assert_eq!(unsafe { libc::kill(c.id() as i32, libc::SIGKILL) }, 0);
        let status = c.wait().unwrap();
        assert!(status.code().is_none(), "vqosd exited with {status}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // SAFETY: kill on the PID of our own, not yet reaped, child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(None) = c.try_wait() {
            if Instant::now() > deadline {
                let _ = c.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.wait();
    }
}

/// The port called `name` in a `/v1/stats` answer.
pub fn port<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no port {name} in {stats}"))
}

pub fn counter(stats: &Value, name: &str, key: &str) -> u64 {
    port(stats, name)[key].as_u64().unwrap()
}

/// Whether the vhost-user port `name` has a connected frontend in `stats`.
pub fn connected(stats: &Value, name: &str) -> bool {
    port(stats, name)["vhost_user"]["connected"] == true
}

/// The rates (bit/s) at which the named ports received (what their guests sent) over about
/// `secs`, from two `/v1/stats` snapshots (published every 25 ms: about 1 % of a 2 s window).
pub fn rx_rates(d: &Daemon, names: &[&str], secs: f64) -> Vec<f64> {
    let bytes =
        |s: &Value| -> Vec<u64> { names.iter().map(|n| counter(s, n, "rx_bytes")).collect() };
    let a = bytes(&d.get("/v1/stats"));
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let b = bytes(&d.get("/v1/stats"));
    let dt = t.elapsed().as_secs_f64();
    a.iter()
        .zip(b)
        .map(|(a, b)| (b - a) as f64 * 8.0 / dt)
        .collect()
}

/// Each named port's rate (bit/s) as the median of its one-second rates over about `secs`
/// (at least three samples), for checks of a division between vifs. The mean over one window
/// lets a transient that is no policy's doing decide the result: a TCP stream stalled by a
/// retransmission timeout for part of a window, its share going to the others as a
/// work-conserving switch must, was seen in CI to put a weight-1 VM 8 % above its share over
/// 9 s. The median of the seconds ignores up to half of them; the samples are printed, so a
/// failing check shows whether the division was off throughout or only for a moment.
pub fn rx_rates_median(d: &Daemon, names: &[&str], secs: f64) -> Vec<f64> {
    let n = (secs.round() as usize).max(3);
    let bytes =
        |s: &Value| -> Vec<u64> { names.iter().map(|n| counter(s, n, "rx_bytes")).collect() };
    let mut prev = bytes(&d.get("/v1/stats"));
    let mut t = Instant::now();
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(n); names.len()];
    for _ in 0..n {
        std::thread::sleep(Duration::from_secs(1));
        let now = bytes(&d.get("/v1/stats"));
        let dt = t.elapsed().as_secs_f64();
        t = Instant::now();
        for (i, (a, b)) in prev.iter().zip(&now).enumerate() {
            samples[i].push((b - a) as f64 * 8.0 / dt);
        }
        prev = now;
    }
    for (name, s) in names.iter().zip(&samples) {
        let mbit: Vec<f64> = s.iter().map(|r| r / 1e6).collect();
        println!("{name}: one-second rates {mbit:.1?} Mbit/s");
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort_by(f64::total_cmp);
            let m = s.len() / 2;
            if s.len() % 2 == 1 {
                s[m]
            } else {
                (s[m - 1] + s[m]) / 2.0
            }
        })
        .collect()
}

pub fn drop_count(stats: &Value, name: &str, reason: &str) -> u64 {
    port(stats, name)["drops"][reason].as_u64().unwrap()
}

/// vqosd (capacity 940 Mbit/s, engine vqos) with `weights.len()` vifs in namespace VMs and a sink
/// namespace on the uplink. Fields drop in order: the daemon, then the namespaces, then files.
pub struct Lab {
    pub daemon: Daemon,
    /// The sink (shared by several labs' uplinks when built with [`LabSpec::sink`]; deleted
    /// when the last one drops).
    pub sink: Arc<Netns>,
    pub uplink: String,
    /// (TAP name, its VM).
    pub vms: Vec<(String, Netns)>,
    pub net: String,
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
}

pub fn lab(test_id: u8, weights: &[u32]) -> Lab {
    lab_with(test_id, weights, "")
}

/// [`lab`] with `extra` appended to the daemon's config (e.g. a `[cluster]` section).
pub fn lab_with(test_id: u8, weights: &[u32], extra: &str) -> Lab {
    lab_spec(
        test_id,
        weights,
        LabSpec {
            extra,
            ..LabSpec::default()
        },
    )
}

/// How a lab differs from [`lab`]'s.
#[derive(Default)]
pub struct LabSpec<'a> {
    /// Appended to the daemon's config (e.g. a `[cluster]` section).
    pub extra: &'a str,
    /// The switch's capacity (default [`CAPACITY_BPS`]).
    pub capacity_bps: Option<u64>,
    /// No capacity at all (`capacity = "unlimited"`, vqosd's default): the core, not the
    /// link, is what the vifs share. Overrides `capacity_bps`.
    pub unlimited: bool,
    /// A sink namespace to share with other labs (the uplink goes there, on this lab's own
    /// subnet); default: a sink of its own.
    pub sink: Option<Arc<Netns>>,
    /// Forwarding threads (default: the daemon's, 1).
    pub threads: Option<usize>,
    /// Appended to every VM's `[[port]]` entry (e.g. `queues = 2`).
    pub port_extra: &'a str,
}

/// The sink namespace of a test's labs, for [`LabSpec::sink`].
pub fn shared_sink(test_id: u8) -> Arc<Netns> {
    let pid = std::process::id() % 100_000;
    let prefix = format!("q{pid}{}", char::from(b'a' + test_id));
    Arc::new(Netns::new(format!("{prefix}-sink")).without_ipv6())
}

/// [`lab`] as `spec` says.
pub fn lab_spec(test_id: u8, weights: &[u32], spec: LabSpec) -> Lab {
    let pid = std::process::id() % 100_000;
    let prefix = format!("q{pid}{}", char::from(b'a' + test_id));
    let net = format!("10.{}.{test_id}", 200 + pid % 50);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vqosd.sock");
    let uplink = format!("{prefix}u");
    let capacity = match spec.capacity_bps {
        _ if spec.unlimited => "unlimited".to_string(),
        c => format!("{}bit", c.unwrap_or(CAPACITY_BPS)),
    };
    let mut text = format!(
        "capacity = \"{capacity}\"\nengine = \"vqos\"\nremove_taps_on_exit = true\nstate_file = \"{}\"\n\
         [api]\nsocket = \"{}\"\n[uplink]\nname = \"{uplink}\"\n",
        dir.path().join("state.json").display(),
        socket.display()
    );
    if let Some(n) = spec.threads {
        text.insert_str(0, &format!("threads = {n}\n"));
    }
    let taps: Vec<String> = (1..=weights.len())
        .map(|i| format!("{prefix}v{i}"))
        .collect();
    for (tap, w) in taps.iter().zip(weights) {
        text.push_str(&format!(
            "[[port]]\nname = \"{tap}\"\npolicy = {{ weight = {w} }}\n{}\n",
            spec.port_extra
        ));
    }
    text.push_str(spec.extra);
    let config = dir.path().join("vqosd.toml");
    fs::write(&config, text).unwrap();
    let daemon = Daemon::start(&config, &socket);
    let sink = spec
        .sink
        .unwrap_or_else(|| Arc::new(Netns::new(format!("{prefix}-sink")).without_ipv6()));
    sink.take_link(&uplink, &format!("{net}.254/24"));
    let vms = taps
        .into_iter()
        .enumerate()
        .map(|(i, tap)| {
            let ns = Netns::new(format!("{prefix}-vm{}", i + 1)).without_ipv6();
            ns.take_link(&tap, &format!("{net}.{}/24", i + 1));
            (tap, ns)
        })
        .collect();
    Lab {
        daemon,
        sink,
        uplink,
        vms,
        net,
        config,
        dir,
    }
}

impl Lab {
    pub fn tap(&self, vm: usize) -> &str {
        &self.vms[vm].0
    }

    pub fn sink_addr(&self) -> String {
        format!("{}.254", self.net)
    }

    /// An iperf3 server for one test on `port` in the sink (JSON report on exit).
    pub fn server(&self, port: u16) -> Proc {
        let port = port.to_string();
        let bind = self.sink_addr();
        self.sink
            .spawn(&["iperf3", "-s", "-1", "-J", "-p", &port, "-B", &bind])
    }

    /// One greedy TCP stream from VM `vm` to the sink's `port` for `secs`.
    pub fn client(&self, vm: usize, port: u16, secs: u32) -> Proc {
        let (port, secs) = (port.to_string(), secs.to_string());
        let dst = self.sink_addr();
        self.vms[vm]
            .1
            .spawn(&["iperf3", "-c", &dst, "-p", &port, "-t", &secs, "-J"])
    }

    pub fn stats(&self) -> Value {
        self.daemon.get("/v1/stats")
    }
}

/// An iperf3 server's report.
pub struct Report(pub Value);

impl Report {
    pub fn of(server: Proc, limit: Duration) -> Report {
        let out = server.output_within(limit);
        let v: Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("iperf3 output ({e}): {out}"));
        assert!(
            v["intervals"].as_array().is_some_and(|a| !a.is_empty()),
            "iperf3 failed: {out}"
        );
        Report(v)
    }

    /// Mbit/s received over the 1 s intervals inside [`from_s`, `to_s`] of the run.
    pub fn mbit(&self, from_s: f64, to_s: f64) -> f64 {
        let (mut bytes, mut secs) = (0.0, 0.0);
        for i in self.0["intervals"].as_array().unwrap() {
            let s = &i["sum"];
            let (start, end) = (s["start"].as_f64().unwrap(), s["end"].as_f64().unwrap());
            if start >= from_s - 0.05 && end <= to_s + 0.05 {
                bytes += s["bytes"].as_f64().unwrap();
                secs += s["seconds"].as_f64().unwrap();
            }
        }
        assert!(
            secs >= 0.8 * (to_s - from_s),
            "the run does not cover {from_s}..{to_s} s: {}",
            self.0["intervals"]
        );
        bytes * 8.0 / secs / 1e6
    }

    /// The received bytes of every (whole) 1 s interval from `from_s` on.
    pub fn interval_bytes_from(&self, from_s: f64) -> Vec<u64> {
        self.0["intervals"]
            .as_array()
            .unwrap()
            .iter()
            // The last interval may be a sliver of a second.
            .filter(|i| {
                i["sum"]["start"].as_f64().unwrap() >= from_s - 0.05
                    && i["sum"]["seconds"].as_f64().unwrap() >= 0.5
            })
            .map(|i| i["sum"]["bytes"].as_u64().unwrap())
            .collect()
    }
}

/// The reference allocation (Mbit/s) of `capacity_bps` among greedy vifs with `policies`.
pub fn reference(policies: &[VifPolicy], capacity_bps: u64) -> Vec<f64> {
    let claims: Vec<Claim> = policies.iter().map(|p| Claim::new(p, None)).collect();
    allocate(capacity_bps, &claims)
        .unwrap()
        .into_iter()
        .map(|r| r as f64 / 1e6)
        .collect()
}

pub fn weights(ws: &[u32]) -> Vec<VifPolicy> {
    ws.iter()
        .map(|&weight| VifPolicy {
            weight,
            ..Default::default()
        })
        .collect()
}

/// On-wire bytes per TCP payload byte as the switch charges them: a 1448-byte segment (MSS
/// with timestamps) travels in a 1514-byte frame (Ethernet 14 + IPv4 20 + TCP 32 bytes of
/// headers; the switch charges every segment of a TSO super-frame its headers, as the kernel's
/// qdisc layer does, and no preamble, gap or FCS). The capacity is such an L2 rate.
pub const WIRE_PER_PAYLOAD: f64 = 1514.0 / 1448.0;

/// The least part of the capacity the switch must forward, however busy the machine.
pub const MIN_FORWARDED: f64 = 0.5;

/// How far the sum of the rates may exceed the capacity: the rates come from separate iperf3
/// reports whose windows are only roughly aligned (a VM restarted mid-test has its own clock),
/// so one VM's window can include a second in which another was still idle. Seen: 961 of 940
/// Mbit/s (+2.3 %) on a busy machine when VM3 came back. The switch's own capacity is tested on
/// its counters over one common window (crates/vqos-dataplane/tests/netns.rs, +2 %).
pub const WINDOW_SLACK: f64 = 0.05;

/// Every rate within `tol` of its reference share of what the switch forwarded (greedy vifs
/// with `policies`), the sum not above the capacity by more than [`WINDOW_SLACK`],
/// and at least `expected_aggregate` of it — or, on a busy machine, [`MIN_FORWARDED`], said
/// in the output. `goodputs` are iperf3's received payload rates, converted to the L2 rate
/// they took on the switch before they are compared with the reference of the L2 capacity.
///
/// Why the share of what was forwarded: on a busy machine the one switch thread does not get
/// the CPU to forward the whole link; how much a starved switch forwards is a benchmark's
/// question, how it divides what it forwards (weights, floors, caps) is the test's.
pub fn check(
    what: &str,
    goodputs: &[f64],
    policies: &[VifPolicy],
    tol: f64,
    expected_aggregate: f64,
) {
    let rates: Vec<f64> = goodputs.iter().map(|g| g * WIRE_PER_PAYLOAD).collect();
    check_l2(
        what,
        &rates,
        policies,
        CAPACITY_BPS,
        tol,
        expected_aggregate,
    );
}

/// [`check`] of L2 rates (Mbit/s, as the switch counts them: e.g. a vif's `rx_bytes` over a
/// window) on a switch of `capacity_bps`.
pub fn check_l2(
    what: &str,
    rates: &[f64],
    policies: &[VifPolicy],
    capacity_bps: u64,
    tol: f64,
    expected_aggregate: f64,
) {
    let total: f64 = rates.iter().sum();
    let cap = capacity_bps as f64 / 1e6;
    assert!(
        total <= cap * (1.0 + WINDOW_SLACK),
        "{what}: aggregate {total:.1} above the capacity {cap}"
    );
    assert!(
        total >= MIN_FORWARDED * cap,
        "{what}: aggregate {total:.1} < {:.0} % of {cap}",
        MIN_FORWARDED * 100.0
    );
    if total < expected_aggregate * cap {
        println!(
            "{what}: aggregate {total:.1} < {:.0} % of {cap}: a busy machine; shares of what was forwarded",
            expected_aggregate * 100.0
        );
    }
    let want = reference(policies, ((total * 1e6) as u64).min(capacity_bps));
    println!("{what}: measured {rates:.1?} (Σ {total:.1}) Mbit/s, reference {want:.1?}");
    for (got, want) in rates.iter().zip(&want) {
        assert!(
            (got - want).abs() <= tol * want,
            "{what}: measured {rates:.1?} vs reference {want:.1?} (±{:.0} %)",
            tol * 100.0
        );
    }
}

/// PUTs `patch` on `vif`'s policy and polls /v1/stats until its policy shows `field` = `want`;
/// returns the time from the call to the first stats answer showing it.
pub fn set_and_watch(lab: &Lab, vif: &str, patch: Value, field: &str, want: Value) -> Duration {
    let before = port(&lab.stats(), vif)["policy"][field].clone();
    assert_ne!(before, want, "{vif}: {field} is already {want}");
    let t = Instant::now();
    let answer = lab
        .daemon
        .call("PUT", &format!("/v1/policies/{vif}"), patch);
    let answered = t.elapsed();
    assert_eq!(answer[field], want, "{answer}");
    let visible = poll(Duration::from_secs(5), || {
        (port(&lab.stats(), vif)["policy"][field] == want).then(|| t.elapsed())
    })
    .unwrap_or_else(|| panic!("{vif}: the stats never showed {field} = {want}"));
    println!(
        "{vif} {field} = {want}: PUT answered in {answered:?}, in /v1/stats after {visible:?}"
    );
    visible
}
