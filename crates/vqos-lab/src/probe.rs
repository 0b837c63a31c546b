//! Latency probes: `[[probe]]` tables of a scenario, run by the lab (the simulator ignores them).
//!
//! ```toml
//! [[probe]]
//! vm = "vm1"            # the VM the client runs in (required)
//! protocol = "udp"      # or "tcp" (default udp)
//! size = 64             # message bytes (default 64)
//! rate = "1000/s"       # requests per second (default 1000/s; a bare number is per second)
//! # optional expectation: p99 in `phase` at most `p99_within` × p99 in `of_phase`
//! p99_within = 1.5
//! phase = 3
//! of_phase = 1
//! ```
//!
//! ## Behavior
//! - A [`vqos_probe`] server runs for the whole run in the sink namespace (a thread that entered
//!   it with `setns`; the server's own threads inherit the namespace), one per probe, on port
//!   [`PROBE_BASE_PORT`]` + k`.
//! - The samples are split by phase by running **one client per phase**: phase `k`'s client
//!   runs in the VM's namespace over the phase minus its settle time ([`windows`]: the
//!   scenario's `settle`, at most half the phase), so each phase's p50/p99/p99.9 are exact
//!   nearest-rank percentiles of that phase's samples alone. Clients of two phases may overlap
//!   by up to the probe's timeout (1 s) while the older one waits for its last responses; the
//!   server tells them apart by session id.
//! - The probes' threads (client and server, and the threads they start) run at real-time
//!   priority ([`PROBE_RT_PRIORITY`], SCHED_FIFO): they are the instrument, and a VM's own
//!   traffic in a real host does not wait for the CPU of its neighbours' generators. On the
//!   lab's small machine every sender shares a core with the probes, and this kernel
//!   (PREEMPT_NONE, 250 Hz) lets a woken probe wait up to a scheduler slice (milliseconds)
//!   behind a busy generator; the RTT would then measure the host's scheduler, not the switch.
//!   The probes send 1000 small messages a second, so their priority takes next to nothing
//!   from the others. If the policy cannot be set (no CAP_SYS_NICE) they run as before.
//! - Results: `latency` in `results.json` (per probe, per phase: samples, lost, p50/p99/p99.9,
//!   mean and max in µs) and a table in `report.md`; a `p99_within` expectation becomes one more
//!   row of the report's expectations (the simulator has no latency: "–").
//!
//! ## Limitations
//! - The RTT includes both namespaces' stacks and the probe's thread scheduling on a small
//!   machine shared with iperf3 and the switch; compare phases and baselines of the same run
//!   kind, not absolute numbers with the papers' Xen hosts.
//! - On an interrupted or failed run the running clients are detached (they end by themselves
//!   within their phase plus 1 s) and their phases have no result.

use std::net::{IpAddr, SocketAddr};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vqos_probe::{run_client, spawn_server, ClientConfig, Protocol, ServerConfig, ServerHandle};
use vqos_sim::report::CheckResult;
use vqos_sim::Scenario;

use crate::sys::{self, in_netns};
use crate::LabError;

/// Port of the first probe's server in the sink.
pub const PROBE_BASE_PORT: u16 = 7101;

/// SCHED_FIFO priority of the probes' threads (see the module docs).
pub const PROBE_RT_PRIORITY: i32 = 10;

#[derive(Debug, Deserialize)]
struct RawFile {
    #[serde(default)]
    probe: Vec<RawProbe>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProbe {
    vm: String,
    protocol: Option<String>,
    size: Option<usize>,
    rate: Option<toml::Value>,
    p99_within: Option<f64>,
    phase: Option<usize>,
    of_phase: Option<usize>,
    claim: Option<String>,
}

/// One `[[probe]]` of the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSpec {
    /// The VM's name.
    pub vm: String,
    /// Its index in the scenario's VMs.
    pub vm_index: usize,
    /// Transport.
    pub protocol: Protocol,
    /// Message size, bytes.
    pub size: usize,
    /// Requests per second.
    pub rate_per_s: f64,
    /// Optional expectation: (phase, of_phase, factor), phases numbered from 1.
    pub p99_within: Option<(usize, usize, f64)>,
    /// The paper's claim its expectation checks (a key of the scenario's `[claims]`).
    pub claim: Option<String>,
}

fn invalid(msg: String) -> LabError {
    LabError::Invalid(msg)
}

/// Parses a rate: `"1000/s"`, `"1000"` or a number (per second).
pub fn parse_rate(v: &toml::Value) -> Result<f64, String> {
    let r = match v {
        toml::Value::Integer(i) => *i as f64,
        toml::Value::Float(f) => *f,
        toml::Value::String(s) => {
            let t = s.trim();
            let t = t.strip_suffix("/s").unwrap_or(t).trim();
            t.parse::<f64>()
                .map_err(|_| format!("rate '{s}': expected e.g. \"1000/s\""))?
        }
        other => return Err(format!("rate {other}: expected e.g. \"1000/s\"")),
    };
    if !(r > 0.0 && r <= vqos_probe::MAX_RATE) {
        return Err(format!(
            "rate {r}: expected more than 0 and at most {} per second",
            vqos_probe::MAX_RATE
        ));
    }
    Ok(r)
}

/// The `[[probe]]` tables of a scenario file's text, checked against the parsed scenario.
pub fn parse_probes(text: &str, sc: &Scenario) -> Result<Vec<ProbeSpec>, LabError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| invalid(format!("[[probe]]: {e}")))?;
    let nphases = sc.phases().len();
    raw.probe
        .into_iter()
        .enumerate()
        .map(|(k, p)| {
            let what = format!("probe {}", k + 1);
            let vm_index = sc
                .vms
                .iter()
                .position(|v| v.name == p.vm)
                .ok_or_else(|| invalid(format!("{what}: unknown vm '{}'", p.vm)))?;
            let protocol = match p.protocol.as_deref().unwrap_or("udp") {
                "udp" => Protocol::Udp,
                "tcp" => Protocol::Tcp,
                other => {
                    return Err(invalid(format!(
                        "{what}: protocol '{other}': expected \"udp\" or \"tcp\""
                    )))
                }
            };
            let size = p.size.unwrap_or(64);
            if !(vqos_probe::wire::MIN_SIZE..=vqos_probe::wire::MAX_SIZE).contains(&size) {
                return Err(invalid(format!(
                    "{what}: size {size}: expected {}..={}",
                    vqos_probe::wire::MIN_SIZE,
                    vqos_probe::wire::MAX_SIZE
                )));
            }
            let rate_per_s = match &p.rate {
                None => 1000.0,
                Some(v) => parse_rate(v).map_err(|e| invalid(format!("{what}: {e}")))?,
            };
            let p99_within = match (p.p99_within, p.phase, p.of_phase) {
                (None, None, None) => None,
                (Some(f), Some(ph), Some(of)) => {
                    for x in [ph, of] {
                        if x == 0 || x > nphases {
                            return Err(invalid(format!(
                                "{what}: phase {x}: the scenario has phases 1..={nphases}"
                            )));
                        }
                    }
                    if !(f > 0.0 && f.is_finite()) {
                        return Err(invalid(format!("{what}: p99_within must be positive")));
                    }
                    Some((ph, of, f))
                }
                _ => {
                    return Err(invalid(format!(
                        "{what}: p99_within needs phase and of_phase (and they need it)"
                    )))
                }
            };
            if let Some(c) = &p.claim {
                if p99_within.is_none() {
                    return Err(invalid(format!(
                        "{what}: claim needs p99_within (the check that tests it)"
                    )));
                }
                sc.claim_text(c).ok_or_else(|| {
                    invalid(format!("{what}: claim `{c}` is not a key of [claims]"))
                })?;
            }
            Ok(ProbeSpec {
                vm: p.vm,
                vm_index,
                protocol,
                size,
                rate_per_s,
                p99_within,
                claim: p.claim,
            })
        })
        .collect()
}

/// The measuring window of each phase: from its start plus the settle time (the scenario's
/// `settle`, at most half the phase) to its end, ns.
pub fn windows(sc: &Scenario) -> Vec<(u64, u64)> {
    sc.phases()
        .into_iter()
        .map(|(a, b)| (a + sc.settle_ns.min((b - a) / 2), b))
        .collect()
}

/// Latency of one probe in one phase, µs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PhaseLatency {
    /// Phase number, from 1.
    pub phase: usize,
    /// Start of the measuring window, s.
    pub from_s: f64,
    /// End of the measuring window, s.
    pub to_s: f64,
    /// RTT samples.
    pub samples: u64,
    /// Requests without a response within 1 s.
    pub lost: u64,
    /// Median.
    pub p50_us: Option<f64>,
    /// 99th percentile.
    pub p99_us: Option<f64>,
    /// 99.9th percentile.
    pub p999_us: Option<f64>,
    /// Mean.
    pub mean_us: Option<f64>,
    /// Largest.
    pub max_us: Option<f64>,
    /// Why there is no result, if there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PhaseLatency {
    /// From one phase's client summary.
    pub fn from_summary(phase: usize, w: (u64, u64), s: &vqos_probe::Summary) -> PhaseLatency {
        PhaseLatency {
            phase,
            from_s: w.0 as f64 / 1e9,
            to_s: w.1 as f64 / 1e9,
            samples: s.samples,
            lost: s.lost,
            p50_us: s.p50_us,
            p99_us: s.p99_us,
            p999_us: s.p999_us,
            mean_us: s.mean_us,
            max_us: s.max_us,
            error: None,
        }
    }

    /// A phase whose client failed.
    pub fn failed(phase: usize, w: (u64, u64), error: String) -> PhaseLatency {
        PhaseLatency {
            phase,
            from_s: w.0 as f64 / 1e9,
            to_s: w.1 as f64 / 1e9,
            samples: 0,
            lost: 0,
            p50_us: None,
            p99_us: None,
            p999_us: None,
            mean_us: None,
            max_us: None,
            error: Some(error),
        }
    }
}

/// One probe's results.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProbeResult {
    /// The VM.
    pub vm: String,
    /// `udp` or `tcp`.
    pub protocol: Protocol,
    /// Message size, bytes.
    pub size: usize,
    /// Requests per second.
    pub rate_per_s: f64,
    /// Per phase.
    pub phases: Vec<PhaseLatency>,
}

/// The `p99_within` expectations of the probes as report rows.
pub fn checks(specs: &[ProbeSpec], results: &[ProbeResult]) -> Vec<CheckResult> {
    let mut out = Vec::new();
    for (spec, res) in specs.iter().zip(results) {
        let Some((ph, of, f)) = spec.p99_within else {
            continue;
        };
        let p99 = |k: usize| {
            res.phases
                .iter()
                .find(|p| p.phase == k)
                .and_then(|p| p.p99_us)
        };
        let expectation = format!(
            "phase {ph}: {} {} probe p99 RTT ≤ {f} × phase {of}'s",
            spec.vm, spec.protocol
        );
        let (measured, pass) = match (p99(ph), p99(of)) {
            (Some(a), Some(b)) if b > 0.0 => (
                format!("{a:.0} µs vs {b:.0} µs = {:.2}×", a / b),
                a <= f * b,
            ),
            _ => ("no samples".to_string(), false),
        };
        out.push(CheckResult {
            expectation,
            measured,
            pass,
        });
    }
    out
}

type ClientThread = JoinHandle<Result<Result<vqos_probe::Summary, String>, String>>;

/// The probes of one run: servers in the sink, a client per phase in the VMs.
pub struct Probes {
    specs: Vec<ProbeSpec>,
    windows: Vec<(u64, u64)>,
    servers: Vec<ServerHandle>,
    target: Vec<SocketAddr>,
    /// `clients[probe][phase]`.
    clients: Vec<Vec<Option<ClientThread>>>,
    next_phase: usize,
}

impl Probes {
    /// Starts one server per probe in `sink_ns`, bound to `sink_ip`.
    pub fn start(
        specs: Vec<ProbeSpec>,
        sc: &Scenario,
        sink_ns: &str,
        sink_ip: &str,
    ) -> Result<Probes, LabError> {
        let ip: IpAddr = sink_ip
            .parse()
            .map_err(|_| LabError::Setup(format!("bad sink address {sink_ip}")))?;
        let mut servers = Vec::new();
        let mut target = Vec::new();
        for (k, s) in specs.iter().enumerate() {
            let addr = SocketAddr::new(ip, PROBE_BASE_PORT + k as u16);
            let protocol = s.protocol;
            let h = in_netns(sink_ns, move || {
                sys::realtime_priority(PROBE_RT_PRIORITY);
                spawn_server(ServerConfig::new(addr, protocol)).map_err(|e| format!("{e:#}"))
            })?;
            let server = h
                .join()
                .map_err(|_| LabError::Setup("probe server thread panicked".into()))?
                .and_then(|r| r)
                .map_err(|e| LabError::Setup(format!("Probe server in {sink_ns}: {e}")))?;
            target.push(server.local_addr());
            servers.push(server);
        }
        let windows = windows(sc);
        let clients = specs
            .iter()
            .map(|_| windows.iter().map(|_| None).collect())
            .collect();
        Ok(Probes {
            specs,
            windows,
            servers,
            target,
            clients,
            next_phase: 0,
        })
    }

    /// Starts the clients of every phase whose window has begun by `now_ns`.
    pub fn poll(&mut self, now_ns: u64, vm_ns: &[String]) -> Result<(), LabError> {
        while self.next_phase < self.windows.len() && self.windows[self.next_phase].0 <= now_ns {
            let (_, end) = self.windows[self.next_phase];
            let secs = end.saturating_sub(now_ns);
            for (k, s) in self.specs.iter().enumerate() {
                let mut cfg = ClientConfig::new(self.target[k], s.protocol);
                cfg.size = s.size;
                cfg.interval = Duration::from_secs_f64(1.0 / s.rate_per_s);
                cfg.duration = Duration::from_nanos(secs.max(1_000_000));
                let h = in_netns(&vm_ns[s.vm_index], move || {
                    sys::realtime_priority(PROBE_RT_PRIORITY);
                    run_client(cfg).map_err(|e| {
                        let mut m = e.to_string();
                        let mut src = std::error::Error::source(&e);
                        while let Some(c) = src {
                            m.push_str(&format!(": {c}"));
                            src = c.source();
                        }
                        m
                    })
                })?;
                self.clients[k][self.next_phase] = Some(h);
            }
            self.next_phase += 1;
        }
        Ok(())
    }

    /// Waits for every client (they end within their window plus the 1 s timeout), stops the
    /// servers and returns the per-phase results.
    pub fn finish(mut self) -> Vec<ProbeResult> {
        let mut out = Vec::new();
        for (k, s) in self.specs.iter().enumerate() {
            let phases = self.clients[k]
                .iter_mut()
                .enumerate()
                .map(|(ph, c)| {
                    let w = self.windows[ph];
                    match c.take().map(|h| h.join()) {
                        None => PhaseLatency::failed(ph + 1, w, "not run".into()),
                        Some(Ok(Ok(Ok(sum)))) => PhaseLatency::from_summary(ph + 1, w, &sum),
                        Some(Ok(Ok(Err(e)) | Err(e))) => PhaseLatency::failed(ph + 1, w, e),
                        Some(Err(_)) => PhaseLatency::failed(ph + 1, w, "panicked".into()),
                    }
                })
                .collect();
            out.push(ProbeResult {
                vm: s.vm.clone(),
                protocol: s.protocol,
                size: s.size,
                rate_per_s: s.rate_per_s,
                phases,
            });
        }
        for srv in self.servers.drain(..) {
            srv.stop();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SC: &str = "name = \"t\"\nduration = \"30s\"\ncapacity = \"1Gbit\"\nsettle = \"2s\"\n\
        [[vm]]\nname = \"vm1\"\n[[vm]]\nname = \"vm2\"\nstart = \"10s\"\n\
        [[event]]\nat = \"20s\"\nvm = \"vm2\"\npacket_size = 64\n";

    fn sc_with(extra: &str) -> (String, Scenario) {
        let text = format!("{SC}{extra}");
        let sc = Scenario::parse(&text).expect("the simulator accepts [[probe]]");
        (text, sc)
    }

    #[test]
    fn probes_are_parsed_with_defaults_and_expectations() {
        let (text, sc) = sc_with(
            "[[probe]]\nvm = \"vm1\"\n\
             [[probe]]\nvm = \"vm2\"\nprotocol = \"tcp\"\nsize = 32\nrate = \"200/s\"\n\
             p99_within = 1.5\nphase = 3\nof_phase = 1\n",
        );
        let p = parse_probes(&text, &sc).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].vm_index, p[0].protocol, p[0].size, p[0].rate_per_s),
            (0, Protocol::Udp, 64, 1000.0)
        );
        assert_eq!(p[0].p99_within, None);
        assert_eq!(
            (p[1].vm_index, p[1].protocol, p[1].size, p[1].rate_per_s),
            (1, Protocol::Tcp, 32, 200.0)
        );
        assert_eq!(p[1].p99_within, Some((3, 1, 1.5)));
        // No probes at all.
        assert!(parse_probes(SC, &Scenario::parse(SC).unwrap())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn bad_probes_are_refused() {
        for (extra, want) in [
            ("[[probe]]\nvm = \"vm9\"\n", "unknown vm 'vm9'"),
            ("[[probe]]\nvm = \"vm1\"\nprotocol = \"icmp\"\n", "protocol"),
            ("[[probe]]\nvm = \"vm1\"\nrate = \"fast\"\n", "rate 'fast'"),
            ("[[probe]]\nvm = \"vm1\"\nrate = 0\n", "more than 0"),
            ("[[probe]]\nvm = \"vm1\"\nsize = 1\n", "size 1"),
            ("[[probe]]\nvm = \"vm1\"\nsizes = 64\n", "unknown field"),
            ("[[probe]]\nvm = \"vm1\"\np99_within = 1.5\n", "needs phase"),
            (
                "[[probe]]\nvm = \"vm1\"\np99_within = 1.5\nphase = 4\nof_phase = 1\n",
                "phase 4",
            ),
        ] {
            let (text, sc) = sc_with(extra);
            let e = parse_probes(&text, &sc).unwrap_err().to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
    }

    #[test]
    fn rates_accept_per_second_strings_and_numbers() {
        assert_eq!(parse_rate(&toml::Value::from("1000/s")).unwrap(), 1000.0);
        assert_eq!(parse_rate(&toml::Value::from("250")).unwrap(), 250.0);
        assert_eq!(parse_rate(&toml::Value::from(50)).unwrap(), 50.0);
        assert_eq!(parse_rate(&toml::Value::from(0.5)).unwrap(), 0.5);
    }

    #[test]
    fn each_phase_is_measured_after_its_settle_time() {
        let (_, mut sc) = sc_with("");
        // Phases 0-10, 10-20, 20-30 s; settle 2 s.
        let s = 1_000_000_000;
        assert_eq!(
            windows(&sc),
            vec![(2 * s, 10 * s), (12 * s, 20 * s), (22 * s, 30 * s)]
        );
        // A settle longer than half a phase is cut to half the phase.
        sc.settle_ns = 8 * s;
        assert_eq!(windows(&sc)[0], (5 * s, 10 * s));
    }

    fn phase(k: usize, p99: Option<f64>) -> PhaseLatency {
        PhaseLatency {
            p99_us: p99,
            samples: u64::from(p99.is_some()),
            ..PhaseLatency::failed(k, (0, 1), String::new())
        }
    }

    #[test]
    fn the_p99_expectation_compares_two_phases() {
        let spec = ProbeSpec {
            vm: "vm1".into(),
            vm_index: 0,
            protocol: Protocol::Udp,
            size: 64,
            rate_per_s: 1000.0,
            p99_within: Some((3, 1, 1.5)),
            claim: None,
        };
        let res = |p3| ProbeResult {
            vm: "vm1".into(),
            protocol: Protocol::Udp,
            size: 64,
            rate_per_s: 1000.0,
            phases: vec![phase(1, Some(100.0)), phase(2, Some(900.0)), phase(3, p3)],
        };
        let c = checks(std::slice::from_ref(&spec), &[res(Some(140.0))]);
        assert!(c[0].pass, "{c:?}");
        assert!(c[0].measured.contains("1.40×"), "{c:?}");
        let c = checks(std::slice::from_ref(&spec), &[res(Some(160.0))]);
        assert!(!c[0].pass);
        let c = checks(&[spec], &[res(None)]);
        assert!(!c[0].pass && c[0].measured == "no samples");
    }

    #[test]
    fn a_summary_becomes_a_phase_row() {
        // A real client run against a loopback server: the phase row carries its percentiles.
        let srv = spawn_server(ServerConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            Protocol::Udp,
        ))
        .unwrap();
        let mut cfg = ClientConfig::new(srv.local_addr(), Protocol::Udp);
        cfg.duration = Duration::from_millis(200);
        let sum = run_client(cfg).unwrap();
        srv.stop();
        let row = PhaseLatency::from_summary(2, (1_000_000_000, 3_000_000_000), &sum);
        assert_eq!((row.phase, row.from_s, row.to_s), (2, 1.0, 3.0));
        assert_eq!(row.samples, sum.samples);
        assert!(row.samples > 150, "{row:?}");
        assert!(row.p50_us.unwrap() <= row.p99_us.unwrap());
        assert!(row.p99_us.unwrap() <= row.p999_us.unwrap());
        let v = serde_json::to_value(&row).unwrap();
        assert!(v.get("error").is_none() && v["p99_us"].is_number(), "{v}");
    }
}
