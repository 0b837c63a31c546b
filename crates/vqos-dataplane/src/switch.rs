//! [`Switch`]: the data plane as a deterministic step function, smoltcp-style. It owns every
//! port, the MAC table, the scheduler (engine + ready set) and the uplink shaper, and never
//! reads a clock or waits: [`Switch::poll`]`(now)` does the work due at `now` and returns
//! whether it did any and when it next has something to do. The thread wrapper
//! ([`crate::SwitchHandle`]) owns the clock, epoll and the control channel; tests step
//! virtual time on in-memory ports.
//!
//! ## Behavior
//! One poll (1) ticks the engine when due, (2) serves one batch from the uplink if it is
//! ready, (3) if the uplink shaper has tokens, asks the scheduler which ready vif to serve and
//! reads at most the granted number of frames from that vif only, the engine admitting each
//! frame and being charged for the batch afterwards (bytes, or the cycles it measurably took),
//! and (4) sweeps the MAC table once a second. A port's ready flag is cleared by a short read
//! and set again by [`Switch::mark_ready`] / [`Switch::mark_all_ready`] (the caller's
//! readiness source). Control calls ([`Switch::add_port`], [`Switch::set_policies`], ...) are
//! validated as a whole and applied between batches; a refused one changes nothing.
//!
//! Measured cycles (rdtsc) are the one input not derived from `now`: C2QoS charges a batch what
//! it really cost. With the bytes cost model a run is a function of its inputs and `now`s.

use std::sync::Arc;

use vqos_sched::{Engine, EngineKind, PolicySet, Scheduler, Step, Usage, VifSpec};

use crate::addrs::{AddrView, SharedAddrs};
use crate::balance::Balance;
use crate::calib::CostSamples;
use crate::config::{EmulatedWork, PortSecurity, SwitchConfig};
use crate::downlink::{Downlink, Served};
use crate::error::SwitchError;
use crate::l2::{Addresses, IpTable, MacTable};
use crate::pipeline::{Admission, Parts, Pipeline};
use crate::port::BATCH_FRAMES;
use crate::ports::{PortIo, PortTable};
use crate::shaper::UplinkShaper;
use crate::stats::{LoopStats, PortRole};
use crate::sys::{cycles, CYCLES_UNIT};
use crate::uplink_queues::UplinkQueues;

/// Most downlink batches one [`Switch::poll`] serves.
const DOWNLINK_BATCHES_PER_POLL: usize = 4;

/// What one [`Switch::poll`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poll {
    /// A batch was served (a ready port read, possibly empty, which clears its flag): poll
    /// again at once; false only when no port may be read now.
    pub did_work: bool,
    /// Frames read by this poll.
    pub frames_read: usize,
    /// When the switch next has something to do without new frames (a tick, a refill, a
    /// stats publication, the MAC sweep), ns.
    pub next_deadline_ns: u64,
}

/// The data plane's state; see the module docs. With several threads each runs one
/// `Switch`, a shard ([`Switch::shard`]): it reads its own ports and shares the address
/// tables, every port's I/O and the uplink capacity with the others (docs/dataplane.md,
/// "Shards").
pub struct Switch {
    /// Every port (this shard's and the others', to send to); slot 0 is the uplink. Slots
    /// are the same on every shard.
    pub(crate) ports: PortTable,
    /// This shard's view of the shared address tables.
    pub(crate) addrs: AddrView,
    /// The engine over this shard's vifs, and its ready set.
    pub(crate) sched: Scheduler,
    /// This shard's part of the uplink capacity.
    pub(crate) shaper: UplinkShaper,
    /// The batch in flight and its output queues.
    pub(crate) pipeline: Pipeline,
    /// The scheduled downlink (queues, AQM, engine), when on.
    pub(crate) downlink: Option<Downlink>,
    /// Which engine.
    pub(crate) engine_kind: EngineKind,
    /// The snapshot in force (every vif, on every shard).
    pub(crate) policies: Arc<PolicySet>,
    /// Slot of each vif of `policies`, by vif id.
    pub(crate) vif_slots: Vec<usize>,
    /// Snapshots applied.
    pub(crate) policy_epoch: u64,
    /// This shard's index (0 reads the uplink, sweeps the tables and divides the capacity).
    pub(crate) shard: usize,
    /// How the shards divide the uplink capacity.
    pub(crate) balance: Arc<Balance>,
    /// The capacity this shard was last given (`None`: unlimited).
    pub(crate) share_bps: Option<u64>,
    /// When the capacity is next divided (shard 0) or this shard's demands next published.
    pub(crate) next_balance_ns: u64,
    /// Stats publication period, ns.
    pub(crate) stats_interval_ns: u64,
    /// Enforce vif maximums on the downlink.
    pub(crate) downlink_max: bool,
    /// Extra work per vif frame (experiments).
    pub(crate) emulated_work: Option<EmulatedWork>,
    /// Storm control per port, frames per second (0 = off).
    pub(crate) storm_pps: u64,
    /// Unknown unicast from a vif is flooded to the other vifs too.
    pub(crate) flood_unknown_to_vifs: bool,
    /// This loop's counters, as published (`loops[]`: named for its shard).
    pub(crate) counters: LoopStats,
    /// The last vif batches' frames, bytes and cycles, for calibration (shared with readers).
    pub(crate) cost_samples: Arc<CostSamples>,
    /// When stats are next due, ns.
    pub(crate) next_stats_ns: u64,
    /// When the MAC table is next swept, ns.
    pub(crate) next_age_ns: u64,
    /// When this shard last published its demands, ns.
    pub(crate) balanced_at_ns: u64,
    /// The address tables' finished hand-overs this shard has applied to its ports
    /// ([`crate::migrate`]).
    pub(crate) handovers_seen: u64,
    /// The vifs this shard's engine last ran, as given to it (their parts, for those read on
    /// several shards: [`crate::spread`]).
    pub(crate) up_vifs: Vec<VifSpec>,
    /// The uplink's queues: steered to their vifs and read within budgets (shard 0).
    pub(crate) uplink_queues: UplinkQueues,
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Switch")
            .field("engine", &self.engine_kind)
            .field("policy_epoch", &self.policy_epoch)
            .finish_non_exhaustive()
    }
}

impl Switch {
    /// Opens the uplink and builds the engine; time starts at `now_ns`.
    pub fn new(config: SwitchConfig, now_ns: u64) -> Result<Switch, SwitchError> {
        let mut policies = PolicySet::new(config.capacity_bps);
        policies.cost = config.cost;
        policies.cycles_per_sec = config.cycles_per_sec;
        policies.cpu_fair = config.cpu_fair;
        policies.capacity_in_bps = config.capacity_in_bps;
        policies.variant = config.variant;
        policies.validate()?;
        let engine: Box<dyn Engine> = match config.custom_engine {
            Some(mut e) => {
                e.configure(&policies, now_ns)?;
                e
            }
            None => vqos_sched::build(config.engine, &policies, now_ns)?,
        };
        let mut macs = MacTable::new(
            config.mac_capacity,
            config.mac_capacity_per_vif,
            config.mac_age_ns,
        );
        macs.set_port_capacity(0, config.mac_capacity / 2);
        // Guarded vifs are limited by their own locks; the uplink records the on-link
        // addresses the network announces, at most as many as the MACs it may hold.
        let mut ips = IpTable::new(
            config.mac_capacity,
            config.mac_capacity_per_vif,
            config.mac_age_ns,
        );
        ips.set_port_capacity(0, config.mac_capacity / 2);
        let downlink = match config.downlink {
            Some(d) => {
                let set = policies.downlink(config.downlink_max);
                let cap = set.capacity_bps;
                Some(Downlink::new(engine.kind(), &set, cap, &[], d, now_ns)?)
            }
            None => None,
        };
        let (uplink, uplink_security, _) = config.uplink.open()?;
        let uplink_queues = UplinkQueues::new(uplink.steer_by_destination());
        let mut sw = Switch {
            ports: PortTable::default(),
            addrs: AddrView::new(SharedAddrs::new(Addresses::new(macs, ips))),
            engine_kind: engine.kind(),
            sched: Scheduler::new(engine, 0),
            shaper: UplinkShaper::default(),
            pipeline: Pipeline::default(),
            downlink,
            policies: Arc::new(policies.clone()),
            vif_slots: Vec::new(),
            policy_epoch: 0,
            shard: 0,
            balance: Balance::new(config.threads.max(1)),
            share_bps: policies.capacity_bps,
            next_balance_ns: now_ns,
            stats_interval_ns: config.stats_interval_ns.max(1_000_000),
            downlink_max: config.downlink_max,
            emulated_work: config.emulated_work,
            storm_pps: config.storm_pps,
            flood_unknown_to_vifs: config.flood_unknown_to_vifs,
            counters: LoopStats {
                name: "loop0".into(),
                cycles_unit: CYCLES_UNIT.into(),
                ..Default::default()
            },
            cost_samples: Arc::new(CostSamples::new()),
            next_stats_ns: now_ns,
            next_age_ns: now_ns.saturating_add(1_000_000_000),
            balanced_at_ns: now_ns,
            handovers_seen: 0,
            up_vifs: Vec::new(),
            uplink_queues,
        };
        if config.threads > 1 {
            // Until shard 0 first divides it: an even part each.
            sw.share_bps = policies.capacity_bps.map(|c| c / config.threads as u64);
        }
        let storm = sw.storm_bucket(now_ns);
        let io = PortIo::new(uplink);
        sw.ports.insert(
            0,
            (io, false),
            0,
            PortSecurity::open(),
            PortRole::Uplink,
            storm,
        )?;
        // Stations the uplink is configured with (a gateway's MAC, a null uplink's station)
        // are its own from the start: no vif can claim them.
        if let crate::MacPolicy::Fixed(list) = &uplink_security.macs {
            let mut t = sw.addrs.lock();
            for &mac in list {
                let _ = t.macs.pin(mac, 0, true, now_ns);
            }
        }
        sw.apply_policies(Arc::new(policies), now_ns)?;
        Ok(sw)
    }

    /// The uplink's name.
    pub fn uplink_name(&self) -> &str {
        self.ports.get(0).map_or("", |p| p.name.as_str())
    }

    /// The policy set in force.
    pub fn policies(&self) -> &Arc<PolicySet> {
        &self.policies
    }

    /// Which engine runs.
    pub fn engine_kind(&self) -> EngineKind {
        self.engine_kind
    }

    /// The last vif batches' costs ([`CostSamples`]; share the `Arc` with readers).
    pub fn cost_samples(&self) -> &Arc<CostSamples> {
        &self.cost_samples
    }

    /// The experiments' emulated work, if any.
    pub fn emulated_work(&self) -> Option<EmulatedWork> {
        self.emulated_work
    }

    /// True when this shard reads the port in `slot`.
    pub fn reads(&self, slot: usize) -> bool {
        self.ports.get(slot).is_some_and(|s| s.local)
    }

    /// This shard's index (0 for a switch with one thread).
    pub fn shard_index(&self) -> usize {
        self.shard
    }

    /// Marks the port in slot `slot` (its readiness token) as having frames.
    pub fn mark_ready(&mut self, slot: usize) {
        if let Some(s) = self.ports.get_mut(slot).filter(|s| s.local) {
            s.ready = true;
            if let Some(v) = s.vif {
                self.sched.set_ready(v, true);
            }
        }
    }

    /// Marks every port this shard reads (busy polling), or only those without a readiness
    /// descriptor.
    pub fn mark_all_ready(&mut self, poll_only: bool) {
        for s in self.ports.iter_mut() {
            if !s.local || (poll_only && s.fd.is_some()) {
                continue;
            }
            s.ready = true;
            if let Some(v) = s.vif {
                self.sched.set_ready(v, true);
            }
        }
    }

    /// True when some port has no readiness descriptor and must be polled.
    pub fn has_poll_only_ports(&self) -> bool {
        self.ports.has_poll_only()
    }

    /// The readiness descriptor of every port, with its slot (the token to give back to
    /// [`Switch::mark_ready`]).
    pub fn readiness_fds(&self) -> impl Iterator<Item = (usize, std::os::fd::RawFd)> + '_ {
        self.ports
            .iter()
            .filter_map(|(i, s)| s.fd.map(|fd| (i, fd)))
    }

    /// The slot of the port called `name`.
    pub fn slot_of(&self, name: &str) -> Option<usize> {
        self.ports.index_of(name)
    }

    /// Tells the port in `slot` that the loop busy-polls it ([`crate::Port::set_busy_poll`]).
    pub fn set_busy_poll(&mut self, slot: usize) {
        if let Some(s) = self.ports.get_mut(slot) {
            s.port.lock().set_busy_poll(true);
        }
    }

    /// The readiness descriptor of the port in `slot`.
    pub fn readiness_fd(&self, slot: usize) -> Option<std::os::fd::RawFd> {
        self.ports.get(slot).and_then(|s| s.fd)
    }

    /// Does the work due at `now_ns`; see the module docs.
    pub fn poll(&mut self, now_ns: u64) -> Poll {
        self.counters.iterations += 1;
        self.apply_handovers();
        if self.sched.tick_if_due(now_ns) {
            self.counters.engine_ticks += 1;
        }
        let mut did_work = false;
        let mut frames_read = 0;
        self.refill_uplink(now_ns);
        if self.ports.get(0).is_some_and(|s| s.ready) {
            frames_read += self.serve_uplink(now_ns);
            did_work = true;
        }
        if !self.sched.ready().none() {
            if !self.shaper.allows(now_ns) {
                self.counters.capacity_waits += 1;
            } else {
                match self.sched.step(now_ns) {
                    Step::Serve(granted) => {
                        frames_read += self.serve_vif(granted, now_ns);
                        did_work = true;
                    }
                    Step::Refused { .. } => self.counters.engine_refusals += 1,
                    Step::Idle { .. } => {}
                }
            }
        }
        if let Some(d) = &mut self.downlink {
            // Up to a batch's worth of frames per vif with frames, while they are still in
            // the cache the uplink's read put them in (measured: one batch per poll cost 15 %
            // more CPU per received Gbit/s than the unscheduled path, the kernel copying
            // frames that had gone cold in the queues).
            for _ in 0..DOWNLINK_BATCHES_PER_POLL {
                match d.serve(&mut self.ports, now_ns) {
                    Served::Batch(_) => did_work = true,
                    Served::CapacityWait => {
                        self.counters.capacity_waits += 1;
                        break;
                    }
                    Served::Refused => {
                        self.counters.engine_refusals += 1;
                        break;
                    }
                    Served::Idle => break,
                }
            }
        }
        if now_ns >= self.next_age_ns {
            if self.shard == 0 {
                self.addrs.lock().expire(now_ns);
                self.steer_uplink(now_ns);
            }
            self.next_age_ns = now_ns + 1_000_000_000;
        }
        if now_ns >= self.next_balance_ns {
            self.rebalance(now_ns);
        }
        Poll {
            did_work,
            frames_read,
            next_deadline_ns: self.next_deadline(now_ns),
        }
    }

    /// When the switch next has something to do without new readiness.
    fn next_deadline(&self, now_ns: u64) -> u64 {
        let mut at = self
            .next_stats_ns
            .min(self.next_age_ns)
            .min(self.next_balance_ns)
            .min(self.sched.wake_at(now_ns));
        if !self.sched.ready().none() {
            if let Some(t) = self.shaper.blocked_until() {
                at = at.min(t);
            }
        }
        if let Some(d) = &self.downlink {
            at = at.min(d.wake_at(now_ns));
        }
        if let Some(t) = self.uplink_queues.wake_at {
            at = at.min(t);
        }
        at
    }

    /// Serves one batch of the uplink; returns the frames read.
    fn serve_uplink(&mut self, now_ns: u64) -> usize {
        let Some(entry) = self.ports.get_mut(0) else {
            return 0;
        };
        let got = self.pipeline.read(entry, BATCH_FRAMES);
        self.counters.bursts += 1;
        self.counters.burst_frames += got as u64;
        let parts = Parts {
            ports: &mut self.ports,
            addrs: &mut self.addrs,
            shaper: &mut self.shaper,
            downlink: self.downlink.as_mut(),
            flood_unknown_to_vifs: self.flood_unknown_to_vifs,
            mark_sent: !self.policies.variant.is_paper(),
        };
        self.pipeline.forward(parts, 0, None, now_ns);
        got
    }

    /// Serves one granted batch of a vif and charges it; returns the frames read.
    fn serve_vif(&mut self, granted: vqos_sched::Granted, now_ns: u64) -> usize {
        let vif = granted.vif();
        let t0 = cycles();
        let Some(idx) = self.ports.vif_slot(vif) else {
            self.sched.charge(granted, Usage::default(), now_ns);
            return 0;
        };
        let Some(entry) = self.ports.get_mut(idx) else {
            self.sched.charge(granted, Usage::default(), now_ns);
            return 0;
        };
        let mut want = granted.max_packets().clamp(1, BATCH_FRAMES);
        if let Some(w) = self.emulated_work.filter(|w| w.batch_frames > 0) {
            want = want.min(w.batch_frames);
        }
        want = want.min(self.shaper.frames_within(entry.avg_frame_bytes));
        let got = self.pipeline.read(entry, want);
        if !entry.ready {
            self.sched.set_ready(vif, false);
        }
        self.counters.bursts += 1;
        self.counters.burst_frames += got as u64;
        let parts = Parts {
            ports: &mut self.ports,
            addrs: &mut self.addrs,
            shaper: &mut self.shaper,
            downlink: self.downlink.as_mut(),
            flood_unknown_to_vifs: self.flood_unknown_to_vifs,
            mark_sent: !self.policies.variant.is_paper(),
        };
        let admission = Admission {
            sched: &mut self.sched,
            granted: &granted,
        };
        let done = self.pipeline.forward(parts, idx, Some(admission), now_ns);
        if let Some(w) = self.emulated_work {
            let until = t0.wrapping_add(w.cycles(got as u64, done.bytes));
            while (until.wrapping_sub(cycles()) as i64) > 0 {
                // Yield while spinning: kernel work queued on this core (the deliveries of the
                // frames this loop wrote into TAPs, run by ksoftirqd when the core is busy)
                // runs inside the emulated time instead of waiting behind it.
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
        let usage = Usage {
            packets: done.charged_packets,
            bytes: done.charged_bytes,
            cycles: cycles().wrapping_sub(t0),
        };
        self.cost_samples
            .record(usage.packets, usage.bytes, usage.cycles);
        self.sched.charge(granted, usage, now_ns);
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PortSpec;
    use crate::mem::MemPort;
    use vqos_sched::{VifPolicy, VifSpec};

    fn set(vifs: &[&str]) -> PolicySet {
        let mut p = PolicySet::new(None);
        for name in vifs {
            p.vifs.push(VifSpec {
                name: name.to_string(),
                policy: VifPolicy::default(),
            });
        }
        p
    }

    /// A switch with an uplink and vif ports `vifs`, configured with `vifs` in order.
    fn switch(vifs: &[&str]) -> Switch {
        let up = PortSpec::custom(Box::new(MemPort::pair("up", 1).0));
        let mut sw = Switch::new(SwitchConfig::new(up), 0).unwrap();
        for name in vifs {
            let p = PortSpec::custom(Box::new(MemPort::pair(name, 1).0));
            sw.add_port(p, VifPolicy::default(), 0).unwrap();
        }
        sw
    }

    fn vif_slots(sw: &Switch) -> Vec<usize> {
        (0..sw.policies.len())
            .map(|v| sw.ports.vif_slot(v).unwrap())
            .collect()
    }

    #[test]
    fn snapshot_naming_a_missing_port_is_refused_before_anything_changes() {
        let mut sw = switch(&["a", "b", "c"]);
        assert_eq!(vif_slots(&sw), vec![1, 2, 3]);
        let epoch = sw.policy_epoch;
        // "zz" has no slot: by position, b and c would have been served as vifs 0 and 1.
        for bad in [
            &["zz", "b", "c"][..],
            &["b", "c"],
            &["a", "a", "c"],
            &["up", "b", "c"],
        ] {
            assert!(sw.apply_policies(Arc::new(set(bad)), 1).is_err(), "{bad:?}");
            assert_eq!(vif_slots(&sw), vec![1, 2, 3], "{bad:?}");
            assert_eq!(sw.policy_epoch, epoch);
            assert_eq!(sw.policies.len(), 3);
        }
        // Reordered: mapped by name, not by position.
        sw.apply_policies(Arc::new(set(&["c", "a", "b"])), 2)
            .unwrap();
        assert_eq!(vif_slots(&sw), vec![3, 1, 2]);
        for (idx, vif) in [(1, 1), (2, 2), (3, 0)] {
            assert_eq!(sw.ports.get(idx).unwrap().vif, Some(vif));
        }
    }

    #[test]
    fn a_removed_slot_is_reused_and_the_uplink_cannot_be_removed() {
        let mut sw = switch(&["a", "b"]);
        assert!(matches!(
            sw.remove_port("up", 0),
            Err(SwitchError::Uplink(_))
        ));
        assert!(sw.remove_port("a", 0).unwrap().is_some());
        assert!(matches!(
            sw.remove_port("a", 0),
            Err(SwitchError::UnknownPort(_))
        ));
        let c = PortSpec::custom(Box::new(MemPort::pair("c", 1).0));
        assert_eq!(sw.add_port(c, VifPolicy::default(), 0).unwrap(), 1);
        let dup = PortSpec::custom(Box::new(MemPort::pair("b", 1).0));
        assert!(matches!(
            sw.add_port(dup, VifPolicy::default(), 0),
            Err(SwitchError::DuplicatePort(_))
        ));
        assert_eq!(sw.policies.len(), 2);
    }
}
