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

use vqos_sched::{
    Engine, EngineKind, PolicySet, Scheduler, Step, TokenBucket, Usage, VifPolicy, VifSpec,
};

use crate::calib::CostSamples;
use crate::config::{EmulatedWork, PortSecurity, PortSpec, SwitchConfig};
use crate::error::SwitchError;
use crate::l2::{Addresses, IpTable, MacTable};
use crate::pipeline::{Admission, Parts, Pipeline};
use crate::port::{Port, BATCH_FRAMES};
use crate::ports::{PortTable, RATE_SAMPLES};
use crate::shaper::{rebucket, UplinkShaper};
use crate::stats::{LoopStats, PortRole, PortStats, SwitchStats};
use crate::sys::{cycles, CYCLES_UNIT};

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

/// The data plane's state; see the module docs.
pub struct Switch {
    /// Every port; slot 0 is the uplink.
    ports: PortTable,
    /// MAC learning table and the IP address guard's table.
    addrs: Addresses,
    /// The engine and its ready set.
    sched: Scheduler,
    /// The uplink capacity.
    shaper: UplinkShaper,
    /// The batch in flight and its output queues.
    pipeline: Pipeline,
    /// Which engine.
    engine_kind: EngineKind,
    /// The snapshot in force.
    policies: Arc<PolicySet>,
    /// Snapshots applied.
    policy_epoch: u64,
    /// Stats publication period, ns.
    stats_interval_ns: u64,
    /// Enforce vif maximums on the downlink.
    downlink_max: bool,
    /// Extra work per vif frame (experiments).
    emulated_work: Option<EmulatedWork>,
    /// Storm control per port, frames per second (0 = off).
    storm_pps: u64,
    /// Unknown unicast from a vif is flooded to the other vifs too.
    flood_unknown_to_vifs: bool,
    /// Loop counters.
    pub(crate) counters: LoopStats,
    /// The last vif batches' frames, bytes and cycles, for calibration (shared with readers).
    cost_samples: Arc<CostSamples>,
    /// When stats are next due, ns.
    next_stats_ns: u64,
    /// When the MAC table is next swept, ns.
    next_age_ns: u64,
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
        let (uplink, uplink_security, _) = config.uplink.open()?;
        let mut sw = Switch {
            ports: PortTable::default(),
            addrs: Addresses { macs, ips },
            engine_kind: engine.kind(),
            sched: Scheduler::new(engine, 0),
            shaper: UplinkShaper::default(),
            pipeline: Pipeline::default(),
            policies: Arc::new(policies.clone()),
            policy_epoch: 0,
            stats_interval_ns: config.stats_interval_ns.max(1_000_000),
            downlink_max: config.downlink_max,
            emulated_work: config.emulated_work,
            storm_pps: config.storm_pps,
            flood_unknown_to_vifs: config.flood_unknown_to_vifs,
            counters: LoopStats {
                cycles_unit: CYCLES_UNIT,
                ..Default::default()
            },
            cost_samples: Arc::new(CostSamples::new()),
            next_stats_ns: now_ns,
            next_age_ns: now_ns.saturating_add(1_000_000_000),
        };
        let storm = sw.storm_bucket(now_ns);
        sw.ports
            .insert(uplink, PortSecurity::open(), PortRole::Uplink, storm)
            .map_err(|(e, _)| e)?;
        // Stations the uplink is configured with (a gateway's MAC, a null uplink's station)
        // are its own from the start: no vif can claim them.
        if let crate::MacPolicy::Fixed(list) = &uplink_security.macs {
            for &mac in list {
                let _ = sw.addrs.macs.pin(mac, 0, true, now_ns);
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

    /// Opens `spec` and adds it as a vif port with `policy` (see [`Switch::add_opened`]).
    pub fn add_port(
        &mut self,
        spec: PortSpec,
        policy: VifPolicy,
        now_ns: u64,
    ) -> Result<usize, SwitchError> {
        let (port, security, _) = spec.open()?;
        self.add_opened(port, security, policy, now_ns)
            .map_err(|(e, _)| e)
    }

    /// A full storm-control bucket (frames), if storm control is on.
    fn storm_bucket(&self, now_ns: u64) -> Option<TokenBucket> {
        (self.storm_pps > 0).then(|| TokenBucket::new(self.storm_pps, self.storm_pps, 0, now_ns))
    }

    /// Adds an opened port as a vif with `policy`, validated with every other vif; returns its
    /// slot. Its configured addresses ([`MacPolicy::Fixed`](crate::MacPolicy::Fixed),
    /// [`IpAddrs::Fixed`](crate::IpAddrs::Fixed)) become its own at once (taken from a port
    /// that only learnt them; refused if another port owns one). On refusal nothing changed
    /// and the port is handed back.
    pub fn add_opened(
        &mut self,
        port: Box<dyn Port>,
        security: PortSecurity,
        policy: VifPolicy,
        now_ns: u64,
    ) -> Result<usize, (SwitchError, Option<Box<dyn Port>>)> {
        if self.ports.index_of(port.name()).is_some() {
            return Err((
                SwitchError::DuplicatePort(port.name().to_string()),
                Some(port),
            ));
        }
        let mut next = (*self.policies).clone();
        next.vifs.push(VifSpec {
            name: port.name().to_string(),
            policy,
        });
        if let Err(e) = next.validate() {
            return Err((e.into(), Some(port)));
        }
        let storm = self.storm_bucket(now_ns);
        let pinned = security.clone();
        let idx = self
            .ports
            .insert(port, security, PortRole::Vif, storm)
            .map_err(|(e, p)| (e, Some(p)))?;
        match self.addrs.pin_assigned(&pinned, idx as u16, now_ns) {
            Ok(done) => {
                for (addr, from) in done.taken {
                    if let Some(p) = self.ports.get_mut(usize::from(from)) {
                        p.unlock(addr);
                    }
                }
                if let Some(p) = self.ports.get_mut(idx) {
                    done.locked.into_iter().for_each(|a| p.lock(a));
                }
            }
            Err((kind, addr, owner)) => {
                let owner =
                    owner.and_then(|o| self.ports.get(usize::from(o)).map(|p| p.name.clone()));
                let err = SwitchError::MacInUse {
                    kind,
                    mac: addr,
                    owner,
                };
                return Err((err, self.release(idx)));
            }
        }
        match self.apply_policies(Arc::new(next), now_ns) {
            Ok(()) => Ok(idx),
            Err(e) => Err((e, self.release(idx))),
        }
    }

    /// Removes vif port `name` and hands it back (closing a TAP can take long: the caller
    /// drops it where that does not stall forwarding). Other ports keep forwarding.
    pub fn remove_port(
        &mut self,
        name: &str,
        now_ns: u64,
    ) -> Result<Option<Box<dyn Port>>, SwitchError> {
        let idx = match self.ports.index_of(name) {
            Some(0) => return Err(SwitchError::Uplink(name.to_string())),
            Some(idx) => idx,
            None => return Err(SwitchError::UnknownPort(name.to_string())),
        };
        let mut next = (*self.policies).clone();
        next.vifs.retain(|v| v.name != name);
        // Check the snapshot and configure the engine first: if either refuses, the port stays.
        self.ports.resolve(&next, Some(idx))?;
        self.sched.configure(&next, now_ns)?;
        let port = self.release(idx);
        self.apply_policies(Arc::new(next), now_ns)?;
        Ok(port)
    }

    /// Releases every port ([`Port::release`]) ahead of a shutdown that removes them for good.
    pub fn release_ports(&mut self) {
        for s in self.ports.iter_mut() {
            s.port.release();
        }
    }

    /// Empties slot `idx` and forgets what was learnt there.
    fn release(&mut self, idx: usize) -> Option<Box<dyn Port>> {
        let entry = self.ports.remove(idx)?;
        self.addrs.purge_slot(idx as u16);
        Some(entry.port)
    }

    /// Replaces the whole policy set; it must name exactly the vif ports.
    pub fn set_policies(&mut self, policies: PolicySet, now_ns: u64) -> Result<(), SwitchError> {
        policies.validate()?;
        self.apply_policies(Arc::new(policies), now_ns)
    }

    /// Replaces one vif's policy (validated against the others).
    pub fn set_policy(
        &mut self,
        name: &str,
        policy: VifPolicy,
        now_ns: u64,
    ) -> Result<(), SwitchError> {
        if self.ports.index_of(name) == Some(0) {
            return Err(SwitchError::Uplink(name.to_string()));
        }
        let next = self.policies.with_policy(name, policy)?;
        self.set_policies(next, now_ns)
    }

    /// Sets each vif's CE marking probability, one per vif in policy order: ECT frames of the
    /// vif's data direction are marked with it, whichever way the vif's traffic goes —
    /// uplink→vif unicast frames, and frames the vif sends to the uplink alone (after the
    /// engine admitted them). Counted on the vif's port (`ecn_marked`, `ecn_not_ect`).
    pub fn set_ecn_probabilities(
        &mut self,
        probabilities: &[f64],
        now_ns: u64,
    ) -> Result<(), SwitchError> {
        if probabilities.len() != self.policies.len()
            || probabilities.iter().any(|p| !(0.0..=1.0).contains(p))
        {
            return Err(SwitchError::BadEcnProbabilities {
                expected: self.policies.len(),
                got: probabilities.to_vec(),
            });
        }
        for (vif, p) in probabilities.iter().enumerate() {
            if let Some(slot) = self.ports.vif_slot(vif).and_then(|i| self.ports.get_mut(i)) {
                slot.ecn_threshold = (p * 4_294_967_296.0) as u64;
            }
        }
        self.next_stats_ns = now_ns;
        Ok(())
    }

    /// Installs a snapshot whose vifs name exactly the vif slots; refused before any state
    /// (engine included) is touched otherwise.
    fn apply_policies(&mut self, policies: Arc<PolicySet>, now_ns: u64) -> Result<(), SwitchError> {
        let vif_slots = self.ports.resolve(&policies, None)?;
        self.sched.configure(&policies, now_ns)?;
        self.ports.assign(vif_slots, &policies);
        for (id, spec) in policies.vifs.iter().enumerate() {
            let Some(slot) = self.ports.vif_slot(id).and_then(|i| self.ports.get_mut(i)) else {
                continue;
            };
            self.sched.set_ready(id, slot.ready);
            // The downlink's own max when the policy states one, else the vif's max (when
            // `downlink_max` is on, as before max_in existed).
            let max = spec.policy.inbound_max_bps(self.downlink_max);
            slot.down_bucket = rebucket(slot.down_bucket.take(), max, now_ns);
        }
        self.shaper.configure(policies.capacity_bps, now_ns);
        self.policies = policies;
        self.policy_epoch += 1;
        // Show the change in the stats right away.
        self.next_stats_ns = now_ns;
        Ok(())
    }

    /// Marks the port in slot `slot` (its readiness token) as having frames.
    pub fn mark_ready(&mut self, slot: usize) {
        if let Some(s) = self.ports.get_mut(slot) {
            s.ready = true;
            if let Some(v) = s.vif {
                self.sched.set_ready(v, true);
            }
        }
    }

    /// Marks every port (busy polling), or only those without a readiness descriptor.
    pub fn mark_all_ready(&mut self, poll_only: bool) {
        for s in self.ports.iter_mut() {
            if poll_only && s.fd.is_some() {
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

    /// Tells the port in `slot` that the loop busy-polls it ([`Port::set_busy_poll`]).
    pub fn set_busy_poll(&mut self, slot: usize) {
        if let Some(s) = self.ports.get_mut(slot) {
            s.port.set_busy_poll(true);
        }
    }

    /// The readiness descriptor of the port in `slot`.
    pub fn readiness_fd(&self, slot: usize) -> Option<std::os::fd::RawFd> {
        self.ports.get(slot).and_then(|s| s.fd)
    }

    /// Does the work due at `now_ns`; see the module docs.
    pub fn poll(&mut self, now_ns: u64) -> Poll {
        self.counters.iterations += 1;
        if self.sched.tick_if_due(now_ns) {
            self.counters.engine_ticks += 1;
        }
        let mut did_work = false;
        let mut frames_read = 0;
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
        if now_ns >= self.next_age_ns {
            self.addrs.expire(now_ns);
            self.next_age_ns = now_ns + 1_000_000_000;
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
            .min(self.sched.wake_at(now_ns));
        if !self.sched.ready().none() {
            if let Some(t) = self.shaper.blocked_until() {
                at = at.min(t);
            }
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
            flood_unknown_to_vifs: self.flood_unknown_to_vifs,
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
            flood_unknown_to_vifs: self.flood_unknown_to_vifs,
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

    /// True when a stats snapshot is due (every `stats_interval_ns`, and right after a
    /// change).
    pub fn stats_due(&self, now_ns: u64) -> bool {
        now_ns >= self.next_stats_ns
    }

    /// A snapshot of every port and the loop. Ports whose last read failed are retried from
    /// here (their frames may still wait, and an edge-triggered descriptor will not say so).
    pub fn stats(&mut self, now_ns: u64) -> SwitchStats {
        self.next_stats_ns = now_ns + self.stats_interval_ns;
        let mut ports = Vec::new();
        for s in self.ports.iter_mut() {
            if s.rx_failed {
                s.rx_failed = false;
                s.ready = true;
                if let Some(v) = s.vif {
                    self.sched.set_ready(v, true);
                }
            }
            let oldest = s.rate_hist[s.rate_pos];
            s.rate_hist[s.rate_pos] = (now_ns, s.c.rx_bytes, s.c.tx_bytes);
            s.rate_pos = (s.rate_pos + 1) % RATE_SAMPLES;
            let dt = now_ns.saturating_sub(oldest.0).max(1);
            // bytes < 2^64, ×8e9 fits in u128.
            let rate = |b: u64| (u128::from(b) * 8_000_000_000 / u128::from(dt)) as u64;
            ports.push(PortStats {
                name: s.name.clone(),
                role: s.role,
                vif: s.vif,
                policy: s.policy.clone(),
                counters: s.c,
                ecn_probability: s.ecn_threshold as f64 / 4_294_967_296.0,
                engine: s.vif.map(|v| self.sched.vif_state(v)),
                rx_rate_bps: rate(s.c.rx_bytes - oldest.1),
                tx_rate_bps: rate(s.c.tx_bytes - oldest.2),
                io: s.port.counters(),
                status: s.port.status(),
                locked: s.locks(),
            });
        }
        SwitchStats {
            time_ns: now_ns,
            policy_epoch: self.policy_epoch,
            engine: self.engine_kind,
            capacity_bps: self.policies.capacity_bps,
            mac_entries: self.addrs.macs.len(),
            ports,
            loop_stats: self.counters.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemPort;

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
