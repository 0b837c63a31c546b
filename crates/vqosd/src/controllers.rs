//! The controllers beside the switch: the fairness adjuster and PID-ECN of `vqos-sched`,
//! driven by a thread of their own.
//!
//! [`Controllers`] is the step function: at a time `now_ns` it reads each vif's cumulative byte
//! counters from the switch's stats, feeds the controllers that are due, and applies what they
//! decide through the [`Api`]:
//! - the fairness adjuster sees the bytes each vif sent into the switch (towards the uplink,
//!   `rx_bytes`); its limits become the vif's effective maximum, `min(user max, limit)` and
//!   never below the user's minimum, installed with [`Api::set_controller_limits`] (the same
//!   snapshot path as a policy change; the user's policy stays as stored and answered);
//! - PID-ECN sees the bytes each vif sent and received (`rx_bytes + tx_bytes`, the paper's
//!   `B_i`); its probabilities go to the switch with [`Api::set_ecn_probabilities`], which marks
//!   CE on the vif's data whichever way it flows: ECT frames from the uplink to the vif and ECT
//!   frames the vif sends to the uplink.
//!
//! [`spawn`] runs the step function on a thread. It is the only place a clock is read: the time
//! is the switch's stats snapshot time when the backend has one (so the counters and their time
//! come from the same snapshot and the ~25 ms publication delay does not distort the
//! controllers' windows), else a monotonic clock started with the thread. It sleeps until the
//! controllers' next wake and waits for a snapshot taken at or after it.
//!
//! ## Port changes
//! The controllers index vifs in the API's order and know each by its port id
//! ([`PortId`]): limits and probabilities go to the API by id, which drops those of a port
//! deleted meanwhile, so they never reach a port made again under its name. When the set of
//! vifs changes (a port deleted and made again under its name is a change):
//! - ports only added at the end: PID-ECN grows (a new vif is measured from its next slot);
//!   otherwise it restarts (one baseline slot without marking);
//! - any change of the vifs or of their weights restarts the fairness adjuster: its limits are
//!   released and a new period begins (it has no notion of a vif leaving mid-probe).

use std::collections::BTreeMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vqos_sched::controllers::fairness::FairnessAdjuster;
use vqos_sched::controllers::pid_ecn::PidEcn;
use vqos_sched::units::format_rate;

use crate::api::Api;
use crate::backend::{BackendError, SwitchStats};
use crate::config::ControllersConfig;
use crate::wire::PortId;

/// A limit the fairness adjuster set (or released, `None`) in a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitLog {
    /// The vif.
    pub vif: String,
    /// Its new controller limit, bit/s.
    pub max_bps: Option<u64>,
}

/// The controllers' state between steps. See the module docs.
pub struct Controllers {
    /// What is enabled, with its parameters.
    config: ControllersConfig,
    /// True once the first step has taken the vifs and the counters' baseline.
    started: bool,
    /// The vifs the controllers index, in the API's order.
    names: Vec<String>,
    /// Their ports' ids.
    ids: Vec<PortId>,
    /// Their weights (the fairness adjuster's `W_i`).
    weights: Vec<u32>,
    /// The fairness adjuster.
    fairness: Option<FairnessAdjuster>,
    /// Clock time at which the adjuster's time 0 lies.
    fair_origin_ns: u64,
    /// Per-vif uplink-bound bytes at the adjuster's time 0.
    fair_base: Vec<u64>,
    /// The adjuster's current limit per vif.
    limits: Vec<Option<u64>>,
    /// True when the limits could not be installed and must be pushed again.
    limits_dirty: bool,
    /// PID-ECN.
    pid: Option<PidEcn>,
    /// Clock time at which PID-ECN's time 0 lies.
    pid_origin_ns: u64,
    /// The probabilities last pushed, per vif.
    probs: Vec<f64>,
    /// True when the probabilities could not be pushed and must be pushed again.
    probs_dirty: bool,
}

impl Controllers {
    /// Controllers as configured; nothing runs until the first [`Controllers::step`].
    pub fn new(config: ControllersConfig) -> Self {
        Controllers {
            config,
            started: false,
            names: Vec::new(),
            ids: Vec::new(),
            weights: Vec::new(),
            fairness: None,
            fair_origin_ns: 0,
            fair_base: Vec::new(),
            limits: Vec::new(),
            limits_dirty: false,
            pid: None,
            pid_origin_ns: 0,
            probs: Vec::new(),
            probs_dirty: false,
        }
    }

    /// The vifs the controllers currently index.
    pub fn vifs(&self) -> &[String] {
        &self.names
    }

    /// The clock time of the next step that can do something: 0 before the first step,
    /// `u64::MAX` when no controller is enabled.
    pub fn next_wake_ns(&self) -> u64 {
        if self.config.is_empty() {
            return u64::MAX;
        }
        if !self.started {
            return 0;
        }
        let f = self.fairness.as_ref().map_or(u64::MAX, |f| {
            self.fair_origin_ns.saturating_add(f.next_wake())
        });
        let p = self.pid.as_ref().map_or(u64::MAX, |p| {
            self.pid_origin_ns.saturating_add(p.next_slot())
        });
        f.min(p)
    }

    /// One step at clock time `now_ns` with the switch's counters read from the API's backend.
    pub fn step(&mut self, now_ns: u64, api: &Api) -> Result<Vec<LimitLog>, BackendError> {
        let stats = api.backend().stats();
        self.step_with(now_ns, &stats, api)
    }

    /// One step at clock time `now_ns` with the counters of `stats` (taken at `now_ns`).
    /// Controllers that are not due do nothing. Returns the fairness adjuster's limit changes
    /// (for the daemon's log). Installing limits or probabilities may fail (the switch
    /// stopped); the step then returns the error and pushes them again next time.
    pub fn step_with(
        &mut self,
        now_ns: u64,
        stats: &SwitchStats,
        api: &Api,
    ) -> Result<Vec<LimitLog>, BackendError> {
        let mut log = Vec::new();
        if self.config.is_empty() {
            return Ok(log);
        }
        let (set, ids) = api.vifs();
        let names: Vec<String> = set.vifs.iter().map(|v| v.name.clone()).collect();
        let weights: Vec<u32> = set.vifs.iter().map(|v| v.policy.weight).collect();
        let counter = |name: &str, f: fn(u64, u64) -> u64| {
            (stats.port(name)).map_or(0, |p| f(p.counters.rx_bytes, p.counters.tx_bytes))
        };
        let uplink_bound: Vec<u64> = names.iter().map(|n| counter(n, |rx, _| rx)).collect();
        let both: Vec<u64> = names
            .iter()
            .map(|n| counter(n, |rx, tx| rx.saturating_add(tx)))
            .collect();
        if !self.started || ids != self.ids || weights != self.weights {
            self.resync(now_ns, (names, ids), weights, &uplink_bound);
        }
        let mut result = Ok(());
        if let Some(f) = self.fairness.as_mut() {
            let t = now_ns.saturating_sub(self.fair_origin_ns);
            if t >= f.next_wake() {
                let bytes: Vec<u64> = uplink_bound
                    .iter()
                    .zip(&self.fair_base)
                    .map(|(b, base)| b.saturating_sub(*base))
                    .collect();
                for c in f.on_sample(t, &bytes) {
                    if let Some(l) = self.limits.get_mut(c.vif) {
                        *l = c.max_bps;
                        self.limits_dirty = true;
                        log.push(LimitLog {
                            vif: self.names[c.vif].clone(),
                            max_bps: c.max_bps,
                        });
                    }
                }
            }
        }
        if self.limits_dirty {
            let map: BTreeMap<PortId, u64> = (self.ids.iter().zip(&self.limits))
                .filter_map(|(id, l)| l.map(|l| (*id, l)))
                .collect();
            match api.set_controller_limits(&map) {
                Ok(()) => self.limits_dirty = false,
                Err(e) => result = Err(e),
            }
        }
        if let Some(p) = self.pid.as_mut() {
            let t = now_ns.saturating_sub(self.pid_origin_ns);
            if t >= p.next_slot() {
                p.on_slot(t, &both);
                let probs: Vec<f64> = (0..self.names.len()).map(|i| p.probability(i)).collect();
                if probs != self.probs {
                    self.probs = probs;
                    self.probs_dirty = true;
                }
            }
        }
        if self.probs_dirty {
            let map: BTreeMap<PortId, f64> = (self.ids.iter().copied())
                .zip(self.probs.iter().copied())
                .collect();
            match api.set_ecn_probabilities(&map) {
                Ok(()) => self.probs_dirty = false,
                Err(e) => result = result.and(Err(e)),
            }
        }
        result.map(|()| log)
    }

    /// Takes a new set of vifs (or weights): see the module docs.
    fn resync(
        &mut self,
        now_ns: u64,
        (names, ids): (Vec<String>, Vec<PortId>),
        weights: Vec<u32>,
        uplink_bound: &[u64],
    ) {
        let n = ids.len();
        if let Some(params) = &self.config.fairness {
            self.fairness = Some(FairnessAdjuster::new(params.clone(), &weights));
            self.fair_origin_ns = now_ns;
            self.fair_base = uplink_bound.to_vec();
            if self.limits.iter().any(Option::is_some) {
                self.limits_dirty = true;
            }
            self.limits = vec![None; n];
        }
        if let Some(params) = &self.config.pid_ecn {
            let appended =
                self.started && n >= self.ids.len() && ids[..self.ids.len()] == self.ids[..];
            match self.pid.as_mut() {
                Some(p) if appended => p.resize(n),
                _ => {
                    self.pid = Some(PidEcn::new(params.clone(), n));
                    self.pid_origin_ns = now_ns;
                }
            }
            if self.ids != ids {
                let keep = if appended { self.probs.len() } else { 0 };
                self.probs.truncate(keep);
                self.probs.resize(n, 0.0);
                self.probs_dirty = true;
            }
        }
        self.names = names;
        self.ids = ids;
        self.weights = weights;
        self.started = true;
    }
}

/// The controller thread; [`ControllerThread::stop`] (or dropping it) ends it.
pub struct ControllerThread {
    /// Dropping the sender wakes the thread and ends it.
    stop: Option<mpsc::Sender<()>>,
    /// The thread.
    handle: Option<JoinHandle<()>>,
}

impl ControllerThread {
    /// Stops the thread and waits for it. Idempotent.
    pub fn stop(&mut self) {
        self.stop.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for ControllerThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Shortest wait between two looks at the switch's stats while a fresh snapshot is awaited.
const POLL: Duration = Duration::from_millis(2);

/// Starts the controller thread for `config` on the switch behind `api`.
pub fn spawn(config: ControllersConfig, api: Arc<Api>) -> std::io::Result<ControllerThread> {
    let (tx, rx) = mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("vqosd-controllers".into())
        .spawn(move || run(Controllers::new(config), &api, &rx))?;
    Ok(ControllerThread {
        stop: Some(tx),
        handle: Some(handle),
    })
}

/// The thread's loop: wait for the next wake, step, repeat, until the stop channel closes.
fn run(mut ctl: Controllers, api: &Api, stop: &mpsc::Receiver<()>) {
    let origin = Instant::now();
    let mut last_error: Option<String> = None;
    loop {
        let stats = api.backend().stats();
        let now = stats
            .time_ns
            .unwrap_or_else(|| origin.elapsed().as_nanos() as u64);
        let wake = ctl.next_wake_ns();
        let wait = if now >= wake {
            match ctl.step_with(now, &stats, api) {
                Ok(changes) => {
                    last_error = None;
                    for c in changes {
                        tracing::info!(
                            "Fairness: t={:.3} s {} limit {}",
                            now as f64 / 1e9,
                            c.vif,
                            format_rate(c.max_bps)
                        );
                    }
                }
                Err(e) => {
                    // Once per distinct error, not once per step.
                    let msg = e.to_string();
                    if last_error.as_deref() != Some(msg.as_str()) {
                        tracing::warn!("Controllers: {msg}");
                        last_error = Some(msg);
                    }
                }
            }
            Duration::from_nanos(ctl.next_wake_ns().saturating_sub(now))
        } else {
            Duration::from_nanos(wake - now)
        };
        match stop.recv_timeout(wait.max(POLL)) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, MockBackend, MockCall, PortStats};
    use crate::config::Config;
    use crate::http::Request;
    use vqos_sched::controllers::fairness::unfairness;

    const MS: u64 = 1_000_000;

    struct Rig {
        api: Arc<Api>,
        mock: Arc<MockBackend>,
        _dir: tempfile::TempDir,
    }

    fn rig(extra: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "capacity = \"1Gbit\"\nstate_file = \"{}/state.json\"\n{extra}\n[[port]]\nname = \"vm1\"\n[[port]]\nname = \"vm2\"\n",
            dir.path().display()
        );
        let config = Config::parse(&text, |_| None).unwrap();
        let mock = Arc::new(MockBackend::new());
        let api = Arc::new(Api::start(&config, mock.clone()).unwrap());
        Rig {
            api,
            mock,
            _dir: dir,
        }
    }

    fn controllers(text: &str) -> Controllers {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("state_file = \"{}/s.json\"\n{text}", dir.path().display());
        Controllers::new(Config::parse(&text, |_| None).unwrap().controllers)
    }

    fn request(api: &Api, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
        let r = api.handle(&Request {
            method: method.into(),
            path: path.into(),
            headers: vec![],
            body: body.as_bytes().to_vec(),
        });
        let v = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
        (r.status, v)
    }

    /// Adds `rate` bit/s over `dt_ns` to a port's counters in the mock.
    fn add_bytes(mock: &MockBackend, name: &str, rx_bps: f64, tx_bps: f64, dt_ns: u64) {
        let mut s = mock
            .stats()
            .ports
            .into_iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| PortStats {
                name: name.into(),
                ..Default::default()
            });
        s.counters.rx_bytes += (rx_bps * dt_ns as f64 / 8e9) as u64;
        s.counters.tx_bytes += (tx_bps * dt_ns as f64 / 8e9) as u64;
        mock.set_port_stats(s);
    }

    #[test]
    fn effective_max_is_min_of_user_max_and_limit_never_below_the_floor() {
        let p = vqos_sched::VifPolicy {
            min_bps: 10,
            max_bps: Some(100),
            ..Default::default()
        };
        let eff = |l| crate::api::effective_policy(&p, l).max_bps;
        assert_eq!(eff(None), Some(100));
        assert_eq!(eff(Some(50)), Some(50));
        assert_eq!(eff(Some(500)), Some(100));
        assert_eq!(eff(Some(3)), Some(10));
        let open = vqos_sched::VifPolicy::default();
        assert_eq!(
            crate::api::effective_policy(&open, Some(7)).max_bps,
            Some(7)
        );
    }

    /// The plant: a 100 Mbit/s bottleneck outside the host shared by connection count (vm1 10
    /// connections, vm2 one), each vif capped by the max the switch enforces. vm2 also receives
    /// 500 Mbit/s, which the adjuster must not count (it limits what vifs send).
    #[test]
    fn fairness_adjuster_evens_out_a_10_to_1_split_without_touching_the_user_policy() {
        let r = rig("controllers = [\"fairness\"]");
        let mut ctl = controllers("controllers = [\"fairness\"]");
        let step = 10 * MS;
        let mut window_start = (0u64, 0u64);
        let mut first_window = None;
        for k in 0..=6000u64 {
            let now = k * step;
            ctl.step(now, &r.api).unwrap();
            let eff = r.api.effective_policies();
            let cap = |i: usize| eff.vifs[i].policy.max_bps.map_or(f64::MAX, |m| m as f64);
            let mut r1: f64 = (100e6_f64 * 10.0 / 11.0).min(cap(0));
            let r2: f64 = (100e6 - r1).min(cap(1));
            r1 = r1.max((100e6 - r2).min(cap(0)));
            add_bytes(&r.mock, "vm1", r1, 0.0, step);
            add_bytes(&r.mock, "vm2", r2, 500e6, step);
            let st = r.mock.stats();
            let rx = |n: &str| st.port(n).unwrap().counters.rx_bytes;
            if now == 10_000 * MS {
                // The first 10 s window, as the paper's iperf reports.
                first_window = Some((rx("vm1"), rx("vm2")));
            }
            if now == 50_000 * MS {
                window_start = (rx("vm1"), rx("vm2"));
            }
        }
        let st = r.mock.stats();
        let rx = |n: &str| st.port(n).unwrap().counters.rx_bytes;
        let rates = [
            (rx("vm1") - window_start.0) * 8 / 10,
            (rx("vm2") - window_start.1) * 8 / 10,
        ];
        let u = unfairness(&rates, &[1, 1]);
        assert!(u < 0.10, "unfairness {u} over 50-60 s, rates {rates:?}");
        let (a, b) = first_window.unwrap();
        assert!(
            unfairness(&[a, b], &[1, 1]) > 0.3,
            "the first window is still unfair"
        );
        // The limit is on vm1 only, through the snapshot path, not in the user's policy.
        let limits = r.api.controller_limits();
        assert!(
            limits.contains_key("vm1") && !limits.contains_key("vm2"),
            "{limits:?}"
        );
        assert_eq!(r.api.policies().vifs[0].policy.max_bps, None);
        assert_eq!(
            r.api.effective_policies().vifs[0].policy.max_bps,
            Some(limits["vm1"])
        );
        assert_eq!(r.mock.ports()[0].1.max_bps, Some(limits["vm1"]));
        let (status, pol) = request(&r.api, "GET", "/v1/policies", "");
        assert_eq!(status, 200);
        assert_eq!(pol["vm1"]["max_bps"], serde_json::Value::Null);
        let (_, stats) = request(&r.api, "GET", "/v1/stats", "");
        let vm1 = stats["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "vm1")
            .unwrap();
        assert_eq!(vm1["controller_limit_bps"], limits["vm1"]);
        let metrics = String::from_utf8(
            r.api
                .handle(&Request {
                    method: "GET".into(),
                    path: "/metrics".into(),
                    headers: vec![],
                    body: vec![],
                })
                .body,
        )
        .unwrap();
        assert!(
            metrics.contains(&format!(
                "vqos_controller_limit_bps{{port=\"vm1\"}} {}",
                limits["vm1"]
            )),
            "{metrics}"
        );
        // A user max below the limit wins; the stored policy is the user's.
        let (status, body) = request(&r.api, "PUT", "/v1/policies/vm1", r#"{"max": "20Mbit"}"#);
        assert_eq!((status, body["max_bps"].as_u64()), (200, Some(20_000_000)));
        assert_eq!(r.mock.ports()[0].1.max_bps, Some(20_000_000));
        // A user min above the limit is a floor for the effective max.
        let (status, _) = request(
            &r.api,
            "PUT",
            "/v1/policies/vm1",
            r#"{"max": "unlimited", "min": "80Mbit"}"#,
        );
        assert_eq!(status, 200);
        assert_eq!(r.mock.ports()[0].1.max_bps, Some(80_000_000));
        assert_eq!(r.api.policies().vifs[0].policy.max_bps, None);
    }

    #[test]
    fn a_step_before_the_wake_does_nothing() {
        let r = rig("");
        let mut ctl = controllers("controllers = [\"fairness\", \"pid-ecn\"]");
        assert_eq!(ctl.next_wake_ns(), 0);
        ctl.step(1_000 * MS, &r.api).unwrap();
        // First step: the baseline; then the next wake is PID's first slot (200 ms later).
        assert_eq!(ctl.next_wake_ns(), 1_200 * MS);
        let calls = r.mock.calls().len();
        add_bytes(&r.mock, "vm1", 900e6, 0.0, 100 * MS);
        ctl.step(1_100 * MS, &r.api).unwrap();
        assert_eq!(r.mock.calls().len(), calls);
        assert_eq!(r.api.controller_limits().len(), 0);
        let none = Controllers::new(ControllersConfig::default());
        assert_eq!(none.next_wake_ns(), u64::MAX);
    }

    /// PID-ECN counts what a vif sent and received: vm1 receives 400 Mbit/s; vm2 sends 300 and
    /// receives 300. Counting only received bytes would mark vm1.
    #[test]
    fn pid_ecn_marks_the_vif_over_its_share_of_sent_plus_received() {
        let r = rig("");
        let mut ctl =
            controllers("controllers = [\"pid-ecn\"]\n[pid_ecn]\nkp = 0.05\nki = 0.03\nkd = 0.002");
        let step = 10 * MS;
        let mut t = 0;
        while t <= 2_000 * MS {
            ctl.step(t, &r.api).unwrap();
            add_bytes(&r.mock, "vm1", 0.0, 400e6, step);
            add_bytes(&r.mock, "vm2", 300e6, 300e6, step);
            t += step;
        }
        let p = r.mock.ecn_probabilities();
        assert_eq!(p["vm1"], 0.0, "{p:?}");
        assert!(p["vm2"] > 0.0, "{p:?}");
        let (_, stats) = request(&r.api, "GET", "/v1/stats", "");
        let ports = stats["ports"].as_array().unwrap();
        let vm2 = ports.iter().find(|q| q["name"] == "vm2").unwrap();
        assert_eq!(vm2["ecn_probability"].as_f64(), Some(p["vm2"]));
        // vm1 stops: vm2 is alone and is not marked any more after the next slot.
        let end = t + 400 * MS;
        while t <= end {
            ctl.step(t, &r.api).unwrap();
            add_bytes(&r.mock, "vm2", 300e6, 300e6, step);
            t += step;
        }
        assert_eq!(r.mock.ecn_probabilities()["vm2"], 0.0);
        assert!(r.mock.calls().contains(&MockCall::SetEcn(2)));
    }

    /// Both controllers, vm1 strong and vm2 weak, stepped every 10 ms until the adjuster has
    /// a limit on vm1: the rig, the controllers and the clock.
    fn limited_vm1() -> (Rig, Controllers, u64) {
        let r = rig("");
        let mut ctl = controllers(
            "controllers = [\"fairness\", \"pid-ecn\"]\n[fairness]\nperiod = \"1s\"\nprobe = \"100ms\"",
        );
        let step = 10 * MS;
        let mut t = 0;
        while r.api.controller_limits().is_empty() && t < 5_000 * MS {
            ctl.step(t, &r.api).unwrap();
            add_bytes(&r.mock, "vm1", 90e6, 0.0, step);
            add_bytes(&r.mock, "vm2", 10e6, 0.0, step);
            t += step;
        }
        assert!(r.api.controller_limits().contains_key("vm1"));
        (r, ctl, t)
    }

    #[test]
    fn port_changes_resize_the_controllers_and_release_the_limits() {
        let (r, mut ctl, mut t) = limited_vm1();
        let step = 10 * MS;
        let (status, _) = request(&r.api, "POST", "/v1/ports", r#"{"name": "vm3"}"#);
        assert_eq!(status, 201);
        ctl.step(t, &r.api).unwrap();
        assert_eq!(ctl.vifs(), ["vm1", "vm2", "vm3"]);
        assert!(r.api.controller_limits().is_empty());
        assert_eq!(r.mock.ports()[0].1.max_bps, None);
        assert_eq!(r.mock.ecn_probabilities().len(), 3);
        let (status, _) = request(&r.api, "DELETE", "/v1/ports/vm1", "");
        assert_eq!(status, 200);
        t += step;
        ctl.step(t, &r.api).unwrap();
        assert_eq!(ctl.vifs(), ["vm2", "vm3"]);
        let p = r.mock.ecn_probabilities();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["vm2", "vm3"]);
    }

    #[test]
    fn a_port_made_again_under_a_deleted_ones_name_gets_nothing_of_it() {
        let (r, mut ctl, t) = limited_vm1();
        let (_, old) = r.api.vifs();
        // What the controllers computed for the old vm2 arrives after it was made again.
        assert_eq!(request(&r.api, "DELETE", "/v1/ports/vm2", "").0, 200);
        assert_eq!(
            request(&r.api, "POST", "/v1/ports", r#"{"name": "vm2"}"#).0,
            201
        );
        let limits = BTreeMap::from([(old[0], 50_000_000), (old[1], 1_000_000)]);
        r.api.set_controller_limits(&limits).unwrap();
        r.api
            .set_ecn_probabilities(&BTreeMap::from([(old[1], 0.5)]))
            .unwrap();
        assert_eq!(
            r.api.controller_limits(),
            BTreeMap::from([("vm1".to_string(), 50_000_000)])
        );
        assert_eq!(r.mock.ecn_probabilities()["vm2"], 0.0);
        let vm2 = r
            .mock
            .ports()
            .into_iter()
            .find(|(p, _)| p.config.name == "vm2");
        assert_eq!(vm2.unwrap().1.max_bps, None);
        // The same names in the same order, but another port: the controllers start over.
        ctl.step(t, &r.api).unwrap();
        assert_eq!(ctl.vifs(), ["vm1", "vm2"]);
        assert!(r.api.controller_limits().is_empty());
    }

    #[test]
    fn the_thread_stops_promptly() {
        let r = rig("");
        let cfg = Config::parse(
            "state_file = \"/nonexistent/s.json\"\ncontrollers = [\"pid-ecn\"]",
            |_| None,
        )
        .unwrap()
        .controllers;
        let mut th = spawn(cfg, r.api.clone()).unwrap();
        let t0 = Instant::now();
        th.stop();
        assert!(t0.elapsed() < Duration::from_secs(2));
    }
}
