//! `vqos`: placeholder being written in this session; behaves as round-robin for now.

use crate::engine::{Engine, EngineKind, Grant, ReadySet, Usage};
use crate::engines::rr::RoundRobin;
use crate::policy::{PolicyError, PolicySet, VifId};

/// Placeholder engine.
#[derive(Debug, Default)]
pub struct Vqos {
    inner: RoundRobin,
}

impl Vqos {
    /// A new engine.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Engine for Vqos {
    fn kind(&self) -> EngineKind {
        EngineKind::Vqos
    }
    fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError> {
        self.inner.configure(policies, now_ns)
    }
    fn select(&mut self, ready: &ReadySet, now_ns: u64) -> Option<Grant> {
        self.inner.select(ready, now_ns)
    }
    fn charge(&mut self, vif: VifId, usage: Usage, now_ns: u64) {
        self.inner.charge(vif, usage, now_ns)
    }
}
