//! The calling protocol of an [`Engine`], written once: the data plane's poll loop, the
//! simulator and the test harness all drive their engine through a [`Scheduler`].
//!
//! ## Behavior
//! One scheduling step is: tick the engine when its accounting is due, then — if some vif is
//! ready — ask `select`. A grant comes back as a [`Granted`] batch that the caller serves
//! (reading at most `max_packets` frames of that vif, asking [`Scheduler::admit`] per frame)
//! and hands back to [`Scheduler::charge`] with what the batch really cost. A `Granted` is not
//! `Clone` and is `#[must_use]`: a batch is charged exactly once, after it ran (C2QoS charges
//! the cycles a batch took, known only afterwards; ANCS and the buckets charge bytes).
//! When nothing may be served, [`Step`] says until when the caller may sleep: the engine's next
//! tick, and while vifs wait, the time a refused vif becomes eligible.
//!
//! The scheduler owns the [`ReadySet`]: callers set readiness as they learn it (a short read
//! clears it, an event or a new arrival sets it), and the engine sees the same set at `tick`
//! and `select`.

use crate::engine::{Engine, EngineKind, Grant, ReadySet, Usage, Verdict, VifEngineState};
use crate::policy::{PolicyError, PolicySet, VifId};

/// What the scheduler counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerCounters {
    /// Engine accounting ticks run.
    pub ticks: u64,
    /// Batches granted (and charged).
    pub grants: u64,
    /// Steps where vifs were ready but the engine refused them all.
    pub refusals: u64,
}

/// A batch the engine granted; serve it, then give it to [`Scheduler::charge`].
#[must_use = "a granted batch must be charged"]
#[derive(Debug, PartialEq, Eq)]
pub struct Granted {
    /// The grant.
    grant: Grant,
}

impl Granted {
    /// The vif to serve.
    #[inline]
    pub fn vif(&self) -> VifId {
        self.grant.vif
    }

    /// Frames the batch may take, 1..=[`crate::MAX_BURST`].
    #[inline]
    pub fn max_packets(&self) -> usize {
        usize::from(self.grant.max_packets)
    }
}

/// The outcome of one [`Scheduler::step`].
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Serve this batch now.
    Serve(Granted),
    /// Vifs are ready but none may go before `until_ns` (a refill or the next tick), unless
    /// readiness changes.
    Refused {
        /// Earliest time a step can grant again.
        until_ns: u64,
    },
    /// No vif is ready; the engine wants its next tick at `until_ns` (`u64::MAX`: never).
    Idle {
        /// The engine's next tick.
        until_ns: u64,
    },
}

/// How a [`Scheduler`] holds its engine: owned (`Box<dyn Engine>`, the data plane and the
/// simulator) or borrowed (`&mut dyn Engine`, the test harness that keeps the engine across
/// runs).
pub trait EngineSlot {
    /// The engine.
    fn get(&self) -> &dyn Engine;
    /// The engine, mutable.
    fn get_mut(&mut self) -> &mut dyn Engine;
}

impl EngineSlot for Box<dyn Engine> {
    #[inline]
    fn get(&self) -> &dyn Engine {
        self.as_ref()
    }
    #[inline]
    fn get_mut(&mut self) -> &mut dyn Engine {
        self.as_mut()
    }
}

impl<'a, 'b: 'a> EngineSlot for &'a mut (dyn Engine + 'b) {
    #[inline]
    fn get(&self) -> &dyn Engine {
        &**self
    }
    #[inline]
    fn get_mut(&mut self) -> &mut dyn Engine {
        &mut **self
    }
}

/// An engine with its ready set, driven by the one protocol of this module.
pub struct Scheduler<E: EngineSlot = Box<dyn Engine>> {
    /// The algorithm.
    engine: E,
    /// Vifs with frames waiting, as the caller last saw them.
    ready: ReadySet,
    /// What happened so far.
    counters: SchedulerCounters,
    /// [`Engine::polices`], read once: the engine's kind never changes.
    polices: bool,
}

impl<E: EngineSlot> std::fmt::Debug for Scheduler<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("engine", &self.engine.get().kind())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// Builds and configures an engine of `kind` for `policies`.
    pub fn build(kind: EngineKind, policies: &PolicySet, now_ns: u64) -> Result<Self, PolicyError> {
        Ok(Self::new(
            crate::build(kind, policies, now_ns)?,
            policies.len(),
        ))
    }
}

impl<E: EngineSlot> Scheduler<E> {
    /// Drives `engine` (already configured) over `vifs` vifs, none ready.
    pub fn new(engine: E, vifs: usize) -> Self {
        Scheduler {
            polices: engine.get().polices(),
            engine,
            ready: ReadySet::new(vifs),
            counters: SchedulerCounters::default(),
        }
    }

    /// Which algorithm runs.
    pub fn kind(&self) -> EngineKind {
        self.engine.get().kind()
    }

    /// Installs a new policy snapshot; on success the ready set is resized to its vifs and
    /// cleared (vif ids may have moved: the caller sets readiness again). On error nothing
    /// changed.
    pub fn configure(&mut self, policies: &PolicySet, now_ns: u64) -> Result<(), PolicyError> {
        self.engine.get_mut().configure(policies, now_ns)?;
        self.ready = ReadySet::new(policies.len());
        Ok(())
    }

    /// Marks `vif` as having frames waiting, or not. Out-of-range ids are ignored.
    #[inline]
    pub fn set_ready(&mut self, vif: VifId, ready: bool) {
        if vif < self.ready.len() {
            self.ready.set(vif, ready);
        }
    }

    /// The ready set.
    #[inline]
    pub fn ready(&self) -> &ReadySet {
        &self.ready
    }

    /// Runs the engine's accounting if due; true if it ran.
    #[inline]
    pub fn tick_if_due(&mut self, now_ns: u64) -> bool {
        if self.engine.get().next_tick() > now_ns {
            return false;
        }
        self.engine.get_mut().tick(&self.ready, now_ns);
        self.counters.ticks += 1;
        true
    }

    /// One step: tick when due, then a grant among the ready vifs, or until when to wait.
    pub fn step(&mut self, now_ns: u64) -> Step {
        self.tick_if_due(now_ns);
        if self.ready.none() {
            return Step::Idle {
                until_ns: self.engine.get().next_tick(),
            };
        }
        match self.engine.get_mut().select(&self.ready, now_ns) {
            Some(grant) => {
                self.counters.grants += 1;
                Step::Serve(Granted { grant })
            }
            None => {
                self.counters.refusals += 1;
                Step::Refused {
                    until_ns: self
                        .engine
                        .get()
                        .eligible_at(now_ns)
                        .min(self.engine.get().next_tick()),
                }
            }
        }
    }

    /// The verdict on one frame of `batch` (`len_bytes` on the wire) at `now_ns`: always
    /// [`Verdict::Forward`], without a call, for an engine that does not police.
    #[inline]
    pub fn admit(&mut self, batch: &Granted, len_bytes: u32, now_ns: u64) -> Verdict {
        if !self.polices {
            return Verdict::Forward;
        }
        self.engine
            .get_mut()
            .admit(batch.grant.vif, len_bytes, now_ns)
    }

    /// Charges a served batch with what it cost, at `now_ns` (when it ended).
    #[inline]
    pub fn charge(&mut self, batch: Granted, usage: Usage, now_ns: u64) {
        self.engine.get_mut().charge(batch.grant.vif, usage, now_ns);
    }

    /// Earliest time a step could do something without new readiness: the next tick, and
    /// while vifs wait, when a refused one becomes eligible.
    pub fn wake_at(&self, now_ns: u64) -> u64 {
        let tick = self.engine.get().next_tick();
        if self.ready.none() {
            tick
        } else {
            tick.min(self.engine.get().eligible_at(now_ns))
        }
    }

    /// The engine's state of one vif, for stats.
    pub fn vif_state(&self, vif: VifId) -> VifEngineState {
        self.engine.get().vif_state(vif)
    }

    /// What was counted so far.
    pub fn counters(&self) -> SchedulerCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{VifPolicy, VifSpec};

    fn two_vifs() -> PolicySet {
        let mut p = PolicySet::new(Some(1_000_000_000));
        for name in ["a", "b"] {
            p.vifs.push(VifSpec {
                name: name.into(),
                policy: VifPolicy::default(),
            });
        }
        p
    }

    #[test]
    fn idle_until_ready_then_grants_round_robin_and_counts() {
        let mut s = Scheduler::build(EngineKind::Rr, &two_vifs(), 0).unwrap();
        assert!(matches!(s.step(0), Step::Idle { .. }));
        s.set_ready(0, true);
        s.set_ready(1, true);
        s.set_ready(7, true); // out of range: ignored
        let mut served = Vec::new();
        for t in 1..=4 {
            let Step::Serve(b) = s.step(t) else {
                panic!("rr refused a ready vif");
            };
            served.push(b.vif());
            assert_eq!(s.admit(&b, 100, t), Verdict::Forward);
            s.charge(
                b,
                Usage {
                    packets: 1,
                    bytes: 100,
                    cycles: 0,
                },
                t,
            );
        }
        assert_eq!(served, vec![0, 1, 0, 1]);
        assert_eq!(s.counters().grants, 4);
        // A new snapshot clears readiness (ids may have moved).
        s.configure(&two_vifs(), 5).unwrap();
        assert!(s.ready().none());
    }

    /// The scheduler skips `admit` for engines that say they do not police: an engine that
    /// drops or marks a frame must say it does.
    #[test]
    fn only_an_engine_that_says_it_polices_rules_on_frames() {
        for kind in EngineKind::ALL {
            let mut p = PolicySet::new(Some(10_000_000));
            for name in ["a", "b"] {
                p.vifs.push(VifSpec {
                    name: name.into(),
                    policy: VifPolicy {
                        max_bps: Some(1_000_000),
                        burst_bytes: Some(3_000),
                        ..VifPolicy::default()
                    },
                });
            }
            let mut engine = crate::build(kind, &p, 0).unwrap();
            // Far more than the cap and the burst, in a millisecond.
            let ruled = (0..1_000u64)
                .map(|i| engine.admit((i % 2) as usize, 1_500, i * 1_000))
                .filter(|v| *v != Verdict::Forward)
                .count();
            assert_eq!(
                engine.polices(),
                ruled > 0,
                "{kind:?}: ruled on {ruled} frames"
            );
        }
    }

    #[test]
    fn a_refusing_engine_reports_when_to_come_back() {
        let mut p = two_vifs();
        p.vifs[0].policy.max_bps = Some(8_000); // 1000 bytes/s
        p.vifs.truncate(1);
        let mut s = Scheduler::build(EngineKind::Policer, &p, 0).unwrap();
        s.set_ready(0, true);
        // Serve until the bucket refuses; then the step names a time in the future.
        let mut t = 0;
        loop {
            match s.step(t) {
                Step::Serve(b) => s.charge(
                    b,
                    Usage {
                        packets: 10,
                        bytes: 15_000,
                        cycles: 0,
                    },
                    t,
                ),
                Step::Refused { until_ns } => {
                    assert!(until_ns > t && until_ns < u64::MAX, "{until_ns}");
                    assert_eq!(s.wake_at(t), until_ns);
                    break;
                }
                Step::Idle { .. } => panic!("vif 0 is ready"),
            }
            t += 1;
            assert!(t < 100, "the policer never refused");
        }
        assert_eq!(s.counters().refusals, 1);
    }
}
