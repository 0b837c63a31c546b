//! [`MockBackend`]: an in-memory switch for tests and API demos. It remembers ports and
//! policies, reports the counters tests set, and can be made to fail.

use std::collections::BTreeMap;
use std::sync::Mutex;

use vqos_sched::calibrate::Sample;
use vqos_sched::{PolicySet, VifPolicy};

use super::{
    Backend, BackendError, LoopHealth, LoopStats, Port, PortOpened, PortStats, SwitchStats,
};

/// A call the mock received, for tests that check what reached the switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MockCall {
    /// `add_port(name)`.
    AddPort(String),
    /// `remove_port(name)`.
    RemovePort(String),
    /// `migrate_port(src, dst)`.
    MigratePort(String, String),
    /// `set_policies` with that many vifs.
    SetPolicies(usize),
    /// `set_ecn_probabilities` with that many vifs.
    SetEcn(usize),
    /// `stop()`.
    Stop,
}

#[derive(Debug, Default)]
struct MockState {
    /// Ports in the order they were added, with their policies.
    ports: Vec<(Port, VifPolicy)>,
    /// Counters returned by `stats`, by port name (missing ports report zeros).
    counters: BTreeMap<String, PortStats>,
    /// Every call received.
    calls: Vec<MockCall>,
    /// The last ECN probabilities received, by vif name.
    ecn: BTreeMap<String, f64>,
    /// When set, the next `add_port` fails with this message.
    fail_next_add: Option<String>,
    /// True once `stop` was called.
    stopped: bool,
    /// What `loop_health` reports; `None`: a live loop (dead once stopped).
    health: Option<LoopHealth>,
    /// What `cost_samples` reports.
    samples: Vec<Sample>,
    /// The last set `set_policies` installed.
    last_set: Option<PolicySet>,
}

/// The stats interval the mock pretends its loop has, ns (the data plane's default).
pub const MOCK_STATS_INTERVAL_NS: u64 = 25_000_000;

/// An in-memory switch: remembers ports and policies, reports counters that tests set.
#[derive(Debug, Default)]
pub struct MockBackend {
    state: Mutex<MockState>,
}

impl MockBackend {
    /// An empty mock switch.
    pub fn new() -> Self {
        MockBackend::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MockState> {
        // A panicking test thread must not hide the state from the others.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ports and their policies as the switch has them.
    pub fn ports(&self) -> Vec<(Port, VifPolicy)> {
        self.lock().ports.clone()
    }

    /// The names of the ports the switch has, in order.
    pub fn port_names(&self) -> Vec<String> {
        (self.lock().ports.iter())
            .map(|(p, _)| p.config.name.clone())
            .collect()
    }

    /// Every call received so far.
    pub fn calls(&self) -> Vec<MockCall> {
        self.lock().calls.clone()
    }

    /// Sets the counters `stats` reports for a port (`stats.name` selects it).
    pub fn set_port_stats(&self, stats: PortStats) {
        self.lock().counters.insert(stats.name.clone(), stats);
    }

    /// The ECN probabilities last set, by vif name (a vif not named in the last call is absent).
    pub fn ecn_probabilities(&self) -> BTreeMap<String, f64> {
        self.lock().ecn.clone()
    }

    /// Makes the next `add_port` fail as a TAP that cannot be opened would.
    pub fn fail_next_add(&self, message: &str) {
        self.lock().fail_next_add = Some(message.to_string());
    }

    /// True once `stop` was called.
    pub fn stopped(&self) -> bool {
        self.lock().stopped
    }

    /// Makes `cost_samples` report `samples` from now on (batches a loop would have measured).
    pub fn set_cost_samples(&self, samples: Vec<Sample>) {
        self.lock().samples = samples;
    }

    /// The policy set last installed by `set_policies` with its pricing, if any.
    pub fn last_policies(&self) -> Option<PolicySet> {
        self.lock().last_set.clone()
    }

    /// Makes `loop_health` report `health` from now on (simulates a dead or hung loop).
    pub fn set_loop_health(&self, health: LoopHealth) {
        self.lock().health = Some(health);
    }
}

impl Backend for MockBackend {
    fn add_port(&self, port: &Port, policy: &VifPolicy) -> Result<PortOpened, BackendError> {
        let mut s = self.lock();
        s.calls.push(MockCall::AddPort(port.config.name.clone()));
        if let Some(message) = s.fail_next_add.take() {
            return Err(BackendError::Port {
                name: port.config.name.clone(),
                message,
            });
        }
        if s.ports
            .iter()
            .any(|(p, _)| p.config.name == port.config.name)
        {
            return Err(BackendError::PortExists(port.config.name.clone()));
        }
        policy.validate(&port.config.name)?;
        s.ports.push((port.clone(), policy.clone()));
        Ok(PortOpened::fresh(port))
    }

    fn remove_port(&self, name: &str) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.push(MockCall::RemovePort(name.to_string()));
        let i = s
            .ports
            .iter()
            .position(|(p, _)| p.config.name == name)
            .ok_or_else(|| BackendError::UnknownPort(name.to_string()))?;
        s.ports.remove(i);
        Ok(())
    }

    /// Copies `src`'s policy to `dst`, as the switch does (the addresses are the switch's).
    fn migrate_port(&self, src: &str, dst: &str) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls
            .push(MockCall::MigratePort(src.to_string(), dst.to_string()));
        let find = |s: &MockState, n: &str| {
            s.ports
                .iter()
                .position(|(p, _)| p.config.name == n)
                .ok_or_else(|| BackendError::UnknownPort(n.to_string()))
        };
        let (i, j) = (find(&s, src)?, find(&s, dst)?);
        if i == j {
            return Err(BackendError::Migrate(format!(
                "Cannot migrate '{src}' to '{dst}': a port cannot be migrated to itself"
            )));
        }
        s.ports[j].1 = s.ports[i].1.clone();
        Ok(())
    }

    fn set_policies(&self, policies: &PolicySet) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.push(MockCall::SetPolicies(policies.len()));
        policies.validate()?;
        for v in &policies.vifs {
            if !s.ports.iter().any(|(p, _)| p.config.name == v.name) {
                return Err(BackendError::UnknownPort(v.name.clone()));
            }
        }
        for v in &policies.vifs {
            if let Some(slot) = s.ports.iter_mut().find(|(p, _)| p.config.name == v.name) {
                slot.1 = v.policy.clone();
            }
        }
        s.last_set = Some(policies.clone());
        Ok(())
    }

    fn set_ecn_probabilities(&self, probabilities: &[(String, f64)]) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.push(MockCall::SetEcn(probabilities.len()));
        if s.stopped {
            return Err(BackendError::Switch("stopped".into()));
        }
        for (name, p) in probabilities {
            if !s.ports.iter().any(|(q, _)| &q.config.name == name) {
                return Err(BackendError::UnknownPort(name.clone()));
            }
            if !(0.0..=1.0).contains(p) {
                return Err(BackendError::Switch(format!(
                    "ECN probability {p} of '{name}' is outside [0, 1]"
                )));
            }
        }
        s.ecn = probabilities.iter().cloned().collect();
        Ok(())
    }

    fn stats(&self) -> SwitchStats {
        let s = self.lock();
        let ports = s
            .ports
            .iter()
            .map(|(p, _)| {
                let mut st = s.counters.get(&p.config.name).cloned().unwrap_or_default();
                st.name = p.config.name.clone();
                st
            })
            .collect();
        SwitchStats {
            time_ns: None,
            ports,
            loops: vec![LoopStats {
                name: "mock0".to_string(),
                cycles_unit: "ns".to_string(),
                ..Default::default()
            }],
            mac_entries: 0,
        }
    }

    fn loop_health(&self) -> LoopHealth {
        let s = self.lock();
        s.health.unwrap_or(LoopHealth {
            running: !s.stopped,
            ..LoopHealth::alive(MOCK_STATS_INTERVAL_NS)
        })
    }

    fn cost_samples(&self) -> Vec<Sample> {
        self.lock().samples.clone()
    }

    fn stop(&self) {
        let mut s = self.lock();
        s.calls.push(MockCall::Stop);
        s.stopped = true;
    }
}
