//! The switch's control calls: ports added and removed, policy sets, ECN probabilities, and
//! the shards of a multi-threaded switch ([`Switch::shard`]). Each is validated as a whole and
//! applied between batches; a refused call changes nothing.
//!
//! With several shards every call is applied on each of them, in the same order (the thread
//! wrapper sees to it): the shard that reads a new port ([`Place::Home`]) pins its addresses
//! in the shared tables and says which first-come locks it took, and the others add the same
//! slot to send to ([`Place::Replica`]) and forget those locks if they hold them.

use std::sync::Arc;

use vqos_sched::{PolicySet, Scheduler, TokenBucket, VifPolicy, VifSpec};

use crate::addrs::AddrView;
use crate::config::{PortSecurity, PortSpec};
use crate::downlink::Downlink;
use crate::error::SwitchError;
use crate::l2::AddrKey;
use crate::migrate::Identity;
use crate::pipeline::Pipeline;
use crate::port::Port;
use crate::ports::{PortIo, PortTable};
use crate::rehome::{Given, Rehomed};
use crate::shaper::{rebucket, UplinkShaper};
use crate::stats::{LoopStats, PortRole};
use crate::switch::Switch;

/// Where a port is added on a shard.
#[derive(Debug, Clone)]
pub(crate) enum Place {
    /// This shard reads it from `slot` (`None`: the lowest free one) and pins its addresses.
    Home(Option<usize>),
    /// Shard `home` reads it from `slot`; `taken` are the first-come locks its addresses took
    /// (address, slot that held it).
    Replica {
        /// The slot it has on every shard.
        slot: usize,
        /// The shard that reads it.
        home: usize,
        /// The port given is a transmit queue of this shard's own ([`PortIo::for_sender`]).
        own_queue: bool,
        /// Locks it took.
        taken: Vec<(AddrKey, u16)>,
    },
}

/// A control operation, applied to one shard ([`Switch::apply`]).
pub(crate) enum Op {
    /// Add an opened vif port, to read ([`Place::Home`]) or to send to.
    AddPort {
        port: Arc<PortIo>,
        macs: PortSecurity,
        policy: VifPolicy,
        place: Place,
    },
    /// Forget first-come locks another shard's new port took (address, slot).
    Unlock { taken: Vec<(AddrKey, u16)> },
    /// Shard `reader` reads vif `name` too, on `port` (given to `reader` only; the others
    /// learn that it does): [`crate::spread`].
    Read {
        name: String,
        reader: usize,
        port: Option<Arc<PortIo>>,
    },
    /// Remove a vif port.
    RemovePort { name: String },
    /// What shard `from` reads of vif `name` (the port, or the receive queue lent to it) is
    /// read by shard `to` from now on ([`crate::rehome`]): `from` gives it up (answering with
    /// it in [`Answer::given`]), `to` takes it (`given`), the others learn of it.
    Rehome {
        name: String,
        from: usize,
        to: usize,
        given: Option<Given>,
    },
    /// Replace the policy set.
    SetPolicies { policies: PolicySet },
    /// Replace one vif's policy (read-modify-write on the shard: concurrent calls never undo
    /// each other).
    SetPolicy { name: String, policy: VifPolicy },
    /// New CE marking probabilities, by vif name (others get 0).
    SetEcn { probabilities: Vec<(String, f64)> },
    /// Hand vif `src`'s identity over to vif `dst` ([`crate::migrate`]): without `identity`
    /// on the shard that reads `src` (which answers with it), then with it on the others.
    Handover {
        src: String,
        dst: String,
        identity: Option<Identity>,
    },
}

/// A shard's answer to an [`Op`]: the result, what an added port became, its hold on a port
/// it let go of (removed, or refused on add) for the control thread to drop — closing a TAP
/// can take tens to hundreds of milliseconds (RTNL) that a loop must not stall for — and the
/// policy set in force after it.
pub(crate) struct Answer {
    /// What the shard said.
    pub result: Result<(), SwitchError>,
    /// What an added port became (slot, locks taken).
    pub added: Option<Added>,
    /// A port to close off the loop thread (once every shard let go of it).
    pub released: Option<Arc<PortIo>>,
    /// The policy set now in force.
    pub policies: Arc<PolicySet>,
    /// The identity a hand-over's source gave ([`Op::Handover`]).
    pub identity: Option<Identity>,
    /// A port its old home gave up, or one a refused move hands back ([`Op::Rehome`]).
    pub given: Option<Given>,
}

/// What adding a port did.
#[derive(Debug)]
pub(crate) struct Added {
    /// Its slot.
    pub slot: usize,
    /// First-come locks its assigned addresses took (for the other shards to forget).
    pub taken: Vec<(AddrKey, u16)>,
}

impl Switch {
    /// Applies `op` (see [`Op`]).
    pub(crate) fn apply(&mut self, op: Op, now_ns: u64) -> Answer {
        let mut added = None;
        let mut released = None;
        let mut identity = None;
        let mut moved = None;
        let result = match op {
            Op::AddPort {
                port,
                macs,
                policy,
                place,
            } => match self.add_shared(port.clone(), macs, policy, place, now_ns) {
                Ok(a) => {
                    added = Some(a);
                    Ok(())
                }
                Err(e) => {
                    released = Some(port);
                    Err(e)
                }
            },
            Op::Unlock { taken } => {
                self.unlock(&taken);
                Ok(())
            }
            Op::Read { name, reader, port } => {
                let reads = reader == self.shard && port.is_some();
                self.read_queue(&name, reader, port, now_ns)
                    .map(|(slot, old)| {
                        released = old;
                        // The runner watches what this shard now reads.
                        added = reads.then(|| Added {
                            slot,
                            taken: Vec::new(),
                        });
                    })
            }
            Op::RemovePort { name } => self.remove_shared(&name, now_ns).map(|p| {
                released = p;
            }),
            Op::Rehome {
                name,
                from,
                to,
                given,
            } => match self.rehome(&name, (from, to), given, now_ns) {
                Ok((slot, done)) => {
                    match done {
                        Rehomed::Gave(g) => moved = Some(g),
                        Rehomed::Took(old, _) => {
                            released = Some(old);
                            // The runner watches what this shard now reads.
                            added = Some(Added {
                                slot,
                                taken: Vec::new(),
                            });
                        }
                        Rehomed::Learnt => {}
                    }
                    Ok(())
                }
                Err(refused) => {
                    let (e, back) = *refused;
                    moved = back;
                    Err(e)
                }
            },
            Op::SetPolicies { policies } => self.set_policies(policies, now_ns),
            Op::SetPolicy { name, policy } => self.set_policy(&name, policy, now_ns),
            Op::SetEcn { probabilities } => self.set_ecn_probabilities(&probabilities, now_ns),
            Op::Handover {
                src,
                dst,
                identity: given,
            } => self
                .handover(&src, &dst, given, now_ns)
                .map(|id| identity = id),
        };
        Answer {
            result,
            added,
            released,
            policies: self.policies.clone(),
            identity,
            given: moved,
        }
    }

    /// The name of the port in `slot` (empty if none).
    pub(crate) fn port_name(&self, slot: usize) -> String {
        self.ports
            .get(slot)
            .map_or_else(String::new, |s| s.name.clone())
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
    pub(crate) fn storm_bucket(&self, now_ns: u64) -> Option<TokenBucket> {
        self.storm_part(1, now_ns)
    }

    /// A full storm-control bucket for one of `readers` shards that read one port: each its
    /// part of the port's `storm_pps` (at least a frame a second), so that a port read on
    /// several shards floods no more than on one.
    pub(crate) fn storm_part(&self, readers: u32, now_ns: u64) -> Option<TokenBucket> {
        let pps = (self.storm_pps / u64::from(readers.max(1))).max(1);
        (self.storm_pps > 0).then(|| TokenBucket::new(pps, pps, 0, now_ns))
    }

    /// Adds an opened port as a vif with `policy`, read by this shard, validated with every
    /// other vif; returns its slot. Its configured addresses
    /// ([`MacPolicy::Fixed`](crate::MacPolicy::Fixed),
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
        let io = PortIo::new(port);
        match self.add_shared(io.clone(), security, policy, Place::Home(None), now_ns) {
            Ok(added) => Ok(added.slot),
            Err(e) => Err((e, PortIo::into_port(io))),
        }
    }

    /// Adds a port shared with the other shards ([`Place`]).
    pub(crate) fn add_shared(
        &mut self,
        io: Arc<PortIo>,
        security: PortSecurity,
        policy: VifPolicy,
        place: Place,
        now_ns: u64,
    ) -> Result<Added, SwitchError> {
        let name = io.lock().name().to_string();
        if self.ports.index_of(&name).is_some() {
            return Err(SwitchError::DuplicatePort(name));
        }
        let mut next = (*self.policies).clone();
        next.vifs.push(VifSpec { name, policy });
        next.validate()?;
        let storm = self.storm_bucket(now_ns);
        let (idx, home, own_queue) = match &place {
            Place::Home(slot) => (
                slot.unwrap_or_else(|| self.ports.free_slot(PortRole::Vif)),
                self.shard,
                false,
            ),
            Place::Replica {
                slot,
                home,
                own_queue,
                ..
            } => (*slot, *home, *own_queue),
        };
        let pinned = security.clone();
        self.ports
            .insert(idx, (io, own_queue), home, security, PortRole::Vif, storm)?;
        let taken = match place {
            Place::Home(_) => {
                let done = self.addrs.lock().pin_assigned(&pinned, idx as u16, now_ns);
                match done {
                    Ok(done) => {
                        if let Some(p) = self.ports.get_mut(idx) {
                            done.locked.into_iter().for_each(|a| p.lock(a));
                        }
                        done.taken
                    }
                    Err((kind, addr, owner)) => {
                        let owner = owner
                            .and_then(|o| self.ports.get(usize::from(o)).map(|p| p.name.clone()));
                        self.release(idx);
                        return Err(SwitchError::MacInUse {
                            kind,
                            mac: addr,
                            owner,
                        });
                    }
                }
            }
            Place::Replica { taken, .. } => taken,
        };
        self.unlock(&taken);
        match self.apply_policies(Arc::new(next), now_ns) {
            Ok(()) => Ok(Added { slot: idx, taken }),
            Err(e) => {
                self.release(idx);
                Err(e)
            }
        }
    }

    /// Forgets first-come locks that another shard's new port took (`(address, slot)`).
    pub(crate) fn unlock(&mut self, taken: &[(AddrKey, u16)]) {
        for &(addr, from) in taken {
            if let Some(p) = self.ports.get_mut(usize::from(from)) {
                p.unlock(addr);
            }
        }
    }

    /// Removes vif port `name` and hands it back (closing a TAP can take long: the caller
    /// drops it where that does not stall forwarding). Other ports keep forwarding.
    pub fn remove_port(
        &mut self,
        name: &str,
        now_ns: u64,
    ) -> Result<Option<Box<dyn Port>>, SwitchError> {
        Ok(self
            .remove_shared(name, now_ns)?
            .and_then(PortIo::into_port))
    }

    /// Removes vif port `name` from this shard; returns this shard's hold on it.
    pub(crate) fn remove_shared(
        &mut self,
        name: &str,
        now_ns: u64,
    ) -> Result<Option<Arc<PortIo>>, SwitchError> {
        let idx = match self.ports.index_of(name) {
            Some(0) => return Err(SwitchError::Uplink(name.to_string())),
            Some(idx) => idx,
            None => return Err(SwitchError::UnknownPort(name.to_string())),
        };
        let mut next = (*self.policies).clone();
        next.vifs.retain(|v| v.name != name);
        // Check the snapshot and configure the engine first: if either refuses, the port stays.
        let vif_slots = self.ports.resolve(&next, Some(idx))?;
        let (local, _) = self.local_set(&next, &vif_slots, Some(idx));
        self.sched.configure(&local, now_ns)?;
        self.handover_removal(idx);
        let port = self.release(idx);
        self.apply_policies(Arc::new(next), now_ns)?;
        Ok(port)
    }

    /// Releases every port this shard reads ([`Port::release`]) ahead of a shutdown that
    /// removes them for good.
    pub fn release_ports(&mut self) {
        for s in self.ports.iter_mut().filter(|s| s.local) {
            s.port.lock().release();
        }
    }

    /// Empties slot `idx`; the shard that reads it forgets what was learnt there.
    fn release(&mut self, idx: usize) -> Option<Arc<PortIo>> {
        let entry = self.ports.remove(idx)?;
        if entry.local {
            self.addrs.lock().purge_slot(idx as u16);
            self.balance.forget(idx);
        }
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

    /// Installs a snapshot whose vifs name exactly the vif slots; refused before any state
    /// (engine included) is touched otherwise.
    pub(crate) fn apply_policies(
        &mut self,
        policies: Arc<PolicySet>,
        now_ns: u64,
    ) -> Result<(), SwitchError> {
        let vif_slots = self.ports.resolve(&policies, None)?;
        let shards = self.balance.shards();
        let old_share = self.share_bps;
        if shards > 1 && policies.capacity_bps != self.policies.capacity_bps {
            // A new capacity: an even part until shard 0 divides it (parts of the old one
            // could add up to more than the new capacity).
            self.share_bps = policies.capacity_bps.map(|c| c / shards as u64);
        }
        let (local, local_slots) = self.local_set(&policies, &vif_slots, None);
        let local_vifs = local.vifs.clone();
        let (down, down_bps) = self.downlink_set(&policies, &vif_slots);
        if let Some(d) = &mut self.downlink {
            if let Err(e) = d.configure(&down, down_bps, &vif_slots, now_ns) {
                self.share_bps = old_share;
                return Err(e);
            }
        }
        if let Err(e) = self.sched.configure(&local, now_ns) {
            self.share_bps = old_share;
            let (down, down_bps) = self.downlink_set(&self.policies, &self.vif_slots);
            if let Some(d) = &mut self.downlink {
                // The set in force was accepted before: taking it back cannot fail.
                let _ = d.configure(&down, down_bps, &self.vif_slots, now_ns);
            }
            return Err(e.into());
        }
        self.up_vifs = local_vifs;
        self.ports.assign(&vif_slots, local_slots, &policies);
        for (id, spec) in policies.vifs.iter().enumerate() {
            let Some(slot) = self.ports.get_mut(vif_slots[id]) else {
                continue;
            };
            if let Some(v) = slot.vif {
                self.sched.set_ready(v, slot.ready);
            }
            // The downlink's own max when the policy states one, else the vif's max (when
            // `downlink_max` is on, as before max_in existed). Enforced by the shard that
            // reads the uplink, for every vif.
            let max = spec.policy.inbound_max_bps(self.downlink_max);
            slot.down_bucket = rebucket(slot.down_bucket.take(), max, now_ns);
        }
        let share = match self.balance.shards() {
            1 => policies.capacity_bps,
            _ => policies.capacity_bps.and(self.share_bps),
        };
        self.shaper.configure(share, now_ns);
        self.policies = policies;
        self.vif_slots = vif_slots;
        self.budget_uplink(now_ns);
        self.policy_epoch += 1;
        // Show the change in the stats right away.
        self.next_stats_ns = now_ns;
        Ok(())
    }

    /// A new shard of this switch (index `index`): the same ports, to send to, none of them
    /// its own yet; the same address tables, policies and capacity balance; an engine of the
    /// same kind over no vif. A custom engine cannot be copied: refused.
    pub fn shard(&self, index: usize, now_ns: u64) -> Result<Switch, SwitchError> {
        if index == 0 || index >= self.balance.shards() {
            return Err(SwitchError::Threads(format!(
                "shard {index} of {}",
                self.balance.shards()
            )));
        }
        let mut none = PolicySet {
            vifs: Vec::new(),
            ..(*self.policies).clone()
        };
        none.capacity_bps = none
            .capacity_bps
            .map(|c| self.share_bps.unwrap_or(c).max(1));
        let engine = vqos_sched::build(self.engine_kind, &none, now_ns).map_err(|e| {
            SwitchError::Threads(format!("engine {} on shard {index}: {e}", self.engine_kind))
        })?;
        let downlink = match &self.downlink {
            Some(d) => {
                // Built over no vif: the shard's first snapshot gives it its set.
                let set = self.policies.downlink(self.downlink_max);
                let empty = PolicySet {
                    vifs: Vec::new(),
                    ..set
                };
                let cap = empty.capacity_bps;
                Some(Downlink::new(
                    self.engine_kind,
                    &empty,
                    cap,
                    &[],
                    d.config(),
                    now_ns,
                )?)
            }
            None => None,
        };
        let mut ports = PortTable::for_shard(index);
        let mut reads_uplink = false;
        for (slot, s) in self.ports.iter() {
            let security = PortSecurity::open();
            // The uplink is read on every shard where it has receive queues (its frames
            // spread by flow), when the downlink is scheduled: what each shard then queues
            // for a vif is divided among them (`balance`). Else shard 0 reads it alone.
            let reader = match (slot, &self.downlink) {
                (0, Some(_)) => s.port.lock().rx_queue().ok().flatten(),
                _ => None,
            };
            reads_uplink |= slot == 0 && reader.is_some();
            match reader {
                Some(q) => {
                    let storm = self.storm_bucket(now_ns);
                    ports.insert_reader(slot, PortIo::new(q), s.home, security, s.role, storm)?
                }
                None => {
                    let io = PortIo::for_sender(&s.port);
                    ports.insert(slot, io, s.home, security, s.role, None)?
                }
            }
        }
        let mut sw = Switch {
            ports,
            addrs: AddrView::new(self.addrs.shared().clone()),
            sched: Scheduler::new(engine, 0),
            shaper: UplinkShaper::default(),
            pipeline: Pipeline::default(),
            downlink,
            engine_kind: self.engine_kind,
            policies: self.policies.clone(),
            vif_slots: Vec::new(),
            policy_epoch: self.policy_epoch,
            shard: index,
            balance: self.balance.clone(),
            share_bps: self.share_bps,
            next_balance_ns: now_ns,
            stats_interval_ns: self.stats_interval_ns,
            downlink_max: self.downlink_max,
            emulated_work: self.emulated_work,
            storm_pps: self.storm_pps,
            flood_unknown_to_vifs: self.flood_unknown_to_vifs,
            counters: LoopStats {
                name: format!("loop{index}"),
                cycles_unit: self.counters.cycles_unit.clone(),
                ..Default::default()
            },
            cost_samples: Arc::new(crate::calib::CostSamples::new()),
            next_stats_ns: now_ns,
            next_age_ns: now_ns,
            balanced_at_ns: now_ns,
            handovers_seen: 0,
            up_vifs: Vec::new(),
            // Shard 0 steers the uplink for every shard; this one budgets the queue it reads.
            uplink_queues: crate::uplink_queues::UplinkQueues::for_reader(
                &self.uplink_queues,
                reads_uplink,
            ),
        };
        sw.apply_policies(self.policies.clone(), now_ns)?;
        Ok(sw)
    }
}
