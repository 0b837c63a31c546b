//! The order in which control calls reach the shards of a switch (`Placement`), shared by
//! the thread wrapper ([`crate::SwitchHandle`], over channels) and by [`Shards`], the same
//! shards stepped in virtual time by tests.
//!
//! ## Behavior
//! - A port is read by the shard reading the fewest vif queues (round-robin as one-queue
//!   ports come; refilled where ports went), or by the shard a caller names. Its slot is the lowest free one, the
//!   same on every shard. The other shards add it first, to send to; then its own shard adds
//!   it, pins its addresses and starts reading it. So no shard learns an address on it before
//!   every shard can send there. The first-come locks its addresses took are then forgotten
//!   on the others.
//! - A port is removed from its own shard first (it stops reading and its addresses are
//!   forgotten), then from the others; the last hold on it closes it. Then ports and lent
//!   queues move from the most loaded shard to the least loaded while they differ by two or
//!   more, leaving those an operator placed (`rehome.rs`).
//! - Policy sets, one vif's policy, and ECN probabilities go to every shard in order. They are
//!   validated the same way on each; if a shard's engine still refuses what an earlier one
//!   accepted, the earlier ones get the previous policy back.

use std::collections::HashMap;
use std::sync::Arc;

use vqos_sched::{PolicySet, VifPolicy, VifSpec};

use crate::config::{PortSecurity, PortSpec, SwitchConfig};
use crate::control::{Answer, Op, Place};
use crate::error::SwitchError;
use crate::ports::PortIo;
use crate::stats::SwitchStats;
use crate::switch::Switch;

/// The most forwarding threads (shards): the shards that read a port are a bit each of a
/// `u64` (`PortEntry::carriers`, `Home::readers`).
pub const MAX_THREADS: usize = 64;

/// How a control call reaches shard `shard`.
pub(crate) trait Caller {
    /// Applies `op` on `shard` and returns its answer.
    fn call(&mut self, shard: usize, op: Op) -> Answer;
    /// Applies `op` on `shard` without waiting.
    fn post(&mut self, shard: usize, op: Op);
}

/// Where a vif port is read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Home {
    /// The shard that reads it (holds the port itself).
    pub shard: usize,
    /// The shards that read it, a bit each: `shard`'s, and those its receive queues were
    /// lent to ([`crate::spread`]).
    pub readers: u64,
    /// Its slot (the same on every shard).
    pub slot: usize,
    /// An operator placed it there (`thread = N`): re-placing leaves it ([`crate::rehome`]).
    pub pinned: bool,
}

/// Where each port is read, which slots are used, and the policy set in force.
#[derive(Debug)]
pub(crate) struct Placement {
    /// Where each vif port is read.
    pub(crate) homes: HashMap<String, Home>,
    /// Slots in use (the uplink's, 0, included).
    slots: Vec<bool>,
    /// How many shards.
    pub(crate) shards: usize,
    /// The policy set the shards run with (from their last answer).
    pub policies: Arc<PolicySet>,
}

impl Placement {
    /// `shards` shards holding the uplink only, under `policies`.
    pub fn new(shards: usize, policies: Arc<PolicySet>) -> Self {
        Placement {
            homes: HashMap::new(),
            slots: vec![true],
            shards,
            policies,
        }
    }

    /// How many vif receive queues each shard reads (a port read on several shards counts
    /// on each).
    pub(crate) fn load(&self) -> Vec<usize> {
        let mut load = vec![0usize; self.shards];
        for h in self.homes.values() {
            for (i, l) in load.iter_mut().enumerate().take(64) {
                *l += usize::from(h.readers & (1 << i) != 0);
            }
        }
        load
    }

    /// The shard reading the fewest vif queues; among equals the one home to the fewest
    /// ports (two ports whose queues spread over both of two shards get a home each), then
    /// the lowest index.
    fn least_loaded(&self) -> usize {
        let load = self.load();
        let mut homes = vec![0usize; self.shards];
        for h in self.homes.values() {
            homes[h.shard] += 1;
        }
        (0..self.shards)
            .min_by_key(|&i| (load[i], homes[i], i))
            .unwrap_or(0)
    }

    /// The lowest free vif slot.
    fn free_slot(&self) -> usize {
        (1..self.slots.len())
            .find(|&i| !self.slots[i])
            .unwrap_or(self.slots.len().max(1))
    }

    fn use_slot(&mut self, slot: usize, used: bool) {
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, false);
        }
        self.slots[slot] = used;
    }

    pub(crate) fn call(&mut self, c: &mut dyn Caller, shard: usize, op: Op) -> Answer {
        let a = c.call(shard, op);
        self.policies = a.policies.clone();
        a
    }

    /// Refuses a port that exists or a policy the set cannot take, before anything opens.
    pub fn check_new(
        &self,
        name: &str,
        uplink: &str,
        policy: &VifPolicy,
    ) -> Result<(), SwitchError> {
        if name == uplink || self.policies.id(name).is_ok() {
            return Err(SwitchError::DuplicatePort(name.to_string()));
        }
        let mut next = (*self.policies).clone();
        next.vifs.push(VifSpec {
            name: name.to_string(),
            policy: policy.clone(),
        });
        next.validate()?;
        Ok(())
    }

    /// Adds `io` on every shard, read by `home` (`None`: the least loaded); see the module
    /// docs. On refusal every shard is as before and the holds are dropped.
    pub fn add(
        &mut self,
        c: &mut dyn Caller,
        io: Arc<PortIo>,
        macs: PortSecurity,
        policy: VifPolicy,
        home: Option<usize>,
    ) -> Result<(), SwitchError> {
        let name = io.lock().name().to_string();
        let pinned = home.is_some_and(|h| h < self.shards);
        let home = home
            .filter(|&h| h < self.shards)
            .unwrap_or_else(|| self.least_loaded());
        let slot = self.free_slot();
        let others: Vec<usize> = (0..self.shards).filter(|&i| i != home).collect();
        let mut added = Vec::new();
        let mut result = Ok(None);
        for &i in &others {
            let (port, own_queue) = PortIo::for_sender(&io);
            let op = Op::AddPort {
                port,
                macs: macs.clone(),
                policy: policy.clone(),
                place: Place::Replica {
                    slot,
                    home,
                    own_queue,
                    taken: Vec::new(),
                },
            };
            match self.call(c, i, op).result {
                Ok(()) => added.push(i),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if result.is_ok() {
            let op = Op::AddPort {
                port: io.clone(),
                macs,
                policy,
                place: Place::Home(Some(slot)),
            };
            let a = self.call(c, home, op);
            result = a.result.map(|()| a.added);
        }
        let mut readers = 1u64 << home;
        if let Ok(done) = result {
            // Its other receive queues go to the least loaded shards (`crate::spread`).
            result = self.spread(c, &io, &name, home).map(|lent| {
                readers |= lent;
                done
            });
        }
        match result {
            Ok(done) => {
                let taken = done.map(|a| a.taken).unwrap_or_default();
                if !taken.is_empty() {
                    for &i in &others {
                        c.post(
                            i,
                            Op::Unlock {
                                taken: taken.clone(),
                            },
                        );
                    }
                }
                let place = Home {
                    shard: home,
                    readers,
                    slot,
                    pinned,
                };
                self.homes.insert(name, place);
                self.use_slot(slot, true);
                Ok(())
            }
            Err(e) => {
                for i in std::iter::once(home).chain(added) {
                    let _ = self.call(c, i, Op::RemovePort { name: name.clone() });
                }
                Err(e)
            }
        }
    }

    /// Lends the receive queues of `name` (read by `home`) beyond its first to the least
    /// loaded shards not reading it yet (among equals the next after `home` in turn), one
    /// each, while the port has any: each goes to its reader, and
    /// every shard (the home first, whose locks then become the port's shared list) learns
    /// who reads it. Returns the readers it lent a queue to, a bit each. Refused on one
    /// shard: the caller removes the port.
    fn spread(
        &mut self,
        c: &mut dyn Caller,
        io: &Arc<PortIo>,
        name: &str,
        home: usize,
    ) -> Result<u64, SwitchError> {
        let mut lent = 0u64;
        // The port is not in `homes` yet: its home's queue counts here.
        let mut load = self.load();
        load[home] += 1;
        let n = self.shards.min(64);
        // The least loaded shard not reading the vif yet; among equals the next after the
        // home in turn (`min_by_key` keeps the first of equals).
        let next = |lent: u64, load: &[usize]| {
            (1..n)
                .map(|k| (home + k) % n)
                .filter(|&i| lent & (1 << i) == 0)
                .min_by_key(|&i| load[i])
        };
        while let Some(reader) = next(lent, &load) {
            let Ok(Some(queue)) = io.lock().rx_queue() else {
                break;
            };
            load[reader] += 1;
            let mut queue = Some(PortIo::new(queue));
            let order = std::iter::once(home).chain((0..self.shards).filter(|&i| i != home));
            for i in order {
                let port = if i == reader { queue.take() } else { None };
                let op = Op::Read {
                    name: name.to_string(),
                    reader,
                    port,
                };
                self.call(c, i, op).result?;
            }
            lent |= 1 << reader;
        }
        Ok(lent)
    }

    /// Removes `name` from every shard, its own first; returns the last hold on it (the
    /// caller closes the port).
    pub fn remove(
        &mut self,
        c: &mut dyn Caller,
        name: &str,
    ) -> Result<Option<Arc<PortIo>>, SwitchError> {
        let (home, slot) = self.homes.get(name).map_or((0, 0), |h| (h.shard, h.slot));
        let order: Vec<usize> = std::iter::once(home)
            .chain((0..self.shards).filter(|&i| i != home))
            .collect();
        let mut holds = Vec::new();
        let mut refused = None;
        for (k, i) in order.into_iter().enumerate() {
            let a = self.call(
                c,
                i,
                Op::RemovePort {
                    name: name.to_string(),
                },
            );
            match a.result {
                Err(e) if k == 0 => return Err(e),
                // Validated the same way on every shard: a later refusal is a bug; the port
                // is gone from the others, so say so.
                Err(e) => refused = Some(e),
                Ok(()) => {}
            }
            holds.extend(a.released);
        }
        self.homes.remove(name);
        if slot > 0 {
            self.use_slot(slot, false);
        }
        // The home's hold first: the others are its clones or queues of their own, dropped
        // here, so that the port itself is the last to go.
        let mut holds = holds.into_iter();
        let last = holds.next();
        drop(holds);
        // The ports left are spread evenly again (`crate::rehome`).
        self.rebalance(c);
        match refused {
            Some(e) => Err(e),
            None => Ok(last),
        }
    }

    /// Applies `make()` on every shard in order; on a refusal, `undo()` on those that
    /// accepted.
    pub fn broadcast(
        &mut self,
        c: &mut dyn Caller,
        make: &dyn Fn() -> Op,
        undo: &dyn Fn() -> Op,
    ) -> Result<(), SwitchError> {
        for i in 0..self.shards {
            if let Err(e) = self.call(c, i, make()).result {
                for j in 0..i {
                    let _ = self.call(c, j, undo());
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Replaces the policy set on every shard.
    pub fn set_policies(
        &mut self,
        c: &mut dyn Caller,
        policies: PolicySet,
    ) -> Result<(), SwitchError> {
        let before = (*self.policies).clone();
        self.broadcast(
            c,
            &|| Op::SetPolicies {
                policies: policies.clone(),
            },
            &|| Op::SetPolicies {
                policies: before.clone(),
            },
        )
    }

    /// Replaces one vif's policy on every shard.
    pub fn set_policy(
        &mut self,
        c: &mut dyn Caller,
        name: &str,
        policy: VifPolicy,
    ) -> Result<(), SwitchError> {
        let before = (*self.policies).clone();
        self.broadcast(
            c,
            &|| Op::SetPolicy {
                name: name.to_string(),
                policy: policy.clone(),
            },
            &|| Op::SetPolicies {
                policies: before.clone(),
            },
        )
    }
}

impl Placement {
    /// Hands vif `src`'s identity over to vif `dst` on every shard ([`crate::migrate`]):
    /// `dst` gets `src`'s policy on every shard, then `src`'s shard starts the hand-over in
    /// the shared tables and gives `src`'s port security, which every other shard then
    /// applies (`dst`'s shard installs it). On refusal every shard is as before.
    pub fn migrate(
        &mut self,
        c: &mut dyn Caller,
        (src, dst): (&str, &str),
        uplink: &str,
    ) -> Result<(), SwitchError> {
        // Names the shards would refuse are refused before any change.
        let home = |n: &str| match self.homes.get(n) {
            _ if n == uplink => Err(SwitchError::Uplink(n.to_string())),
            Some(h) => Ok(h.shard),
            None => Err(SwitchError::UnknownPort(n.to_string())),
        };
        let src_home = home(src)?;
        home(dst)?;
        if src == dst {
            return Err(crate::migrate::refused(
                src,
                dst,
                "a port cannot be migrated to itself",
            ));
        }
        let before = (*self.policies).clone();
        let policy = before.policy(before.id(src)?).clone();
        if before.policy(before.id(dst)?) != &policy {
            self.set_policy(c, dst, policy)?;
        }
        let undo = |p: &mut Placement, c: &mut dyn Caller| {
            if *p.policies != before {
                let _ = p.set_policies(c, before.clone());
            }
        };
        let a = self.call(c, src_home, crate::migrate::op(src, dst, None));
        let identity = match a.result {
            Ok(()) => a.identity,
            Err(e) => {
                undo(self, c);
                return Err(e);
            }
        };
        for i in (0..self.shards).filter(|&i| i != src_home) {
            // Validated the same way on every shard: a refusal here is a bug; say so.
            self.call(c, i, crate::migrate::op(src, dst, identity.clone()))
                .result?;
        }
        Ok(())
    }
}

/// Applies ops on shards in this thread at one virtual time.
struct Direct<'a> {
    switches: &'a mut [Switch],
    now: u64,
}

impl Caller for Direct<'_> {
    fn call(&mut self, shard: usize, op: Op) -> Answer {
        self.switches[shard].apply(op, self.now)
    }
    fn post(&mut self, shard: usize, op: Op) {
        let _ = self.switches[shard].apply(op, self.now);
    }
}

/// A switch's shards without threads, stepped in virtual time: what `threads = N` runs, one
/// [`Switch`] per shard, for tests. Control calls reach the shards in the same order as
/// through [`crate::SwitchHandle`].
pub struct Shards {
    switches: Vec<Switch>,
    placement: Placement,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("shards", &self.switches.len())
            .field("placement", &self.placement)
            .finish()
    }
}

/// The `n` shards of `config` (at least one; shard 0 first, the others made from it), each
/// told which of them read the uplink ([`Switch::set_uplink_readers`]). What [`Shards`] and
/// the threaded [`crate::SwitchHandle`] both start from.
pub(crate) fn build(
    config: SwitchConfig,
    n: usize,
    now_ns: u64,
) -> Result<Vec<Switch>, SwitchError> {
    if n > MAX_THREADS {
        return Err(SwitchError::Threads(format!(
            "{n} threads: at most {MAX_THREADS} (a port's readers are a bit each of a 64-bit set)"
        )));
    }
    let first = Switch::new(config, now_ns)?;
    let mut switches = Vec::with_capacity(n.max(1));
    for i in 1..n {
        switches.push(first.shard(i, now_ns)?);
    }
    switches.insert(0, first);
    let readers = (switches.iter().enumerate())
        .filter(|(_, s)| s.reads_uplink())
        .fold(0u64, |m, (i, _)| m | 1 << i.min(63));
    for s in &mut switches {
        s.set_uplink_readers(readers, now_ns);
    }
    Ok(switches)
}

impl Shards {
    /// `config.threads` shards (shard 0 reads the uplink); time starts at `now_ns`.
    pub fn new(config: SwitchConfig, now_ns: u64) -> Result<Shards, SwitchError> {
        let n = config.threads.max(1);
        let switches = build(config, n, now_ns)?;
        let placement = Placement::new(n, switches[0].policies().clone());
        Ok(Shards {
            switches,
            placement,
        })
    }

    /// How many shards.
    pub fn len(&self) -> usize {
        self.switches.len()
    }

    /// Never: a switch has at least one shard.
    pub fn is_empty(&self) -> bool {
        self.switches.is_empty()
    }

    /// Shard `i`.
    pub fn shard_mut(&mut self, i: usize) -> &mut Switch {
        &mut self.switches[i]
    }

    /// Every shard.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Switch> {
        self.switches.iter_mut()
    }

    /// The policy set in force.
    pub fn policies(&self) -> &Arc<PolicySet> {
        &self.placement.policies
    }

    /// Opens `spec` and adds it as a vif read by shard `home` (`None`: the least loaded).
    pub fn add_port(
        &mut self,
        spec: PortSpec,
        policy: VifPolicy,
        home: Option<usize>,
        now_ns: u64,
    ) -> Result<(), SwitchError> {
        let uplink = self.switches[0].uplink_name().to_string();
        self.placement.check_new(&spec.name, &uplink, &policy)?;
        let (port, macs, _) = spec.open()?;
        let mut c = Direct {
            switches: &mut self.switches,
            now: now_ns,
        };
        self.placement
            .add(&mut c, PortIo::new(port), macs, policy, home)
    }

    /// Removes vif `name` from every shard and closes it.
    pub fn remove_port(&mut self, name: &str, now_ns: u64) -> Result<(), SwitchError> {
        let mut c = Direct {
            switches: &mut self.switches,
            now: now_ns,
        };
        let last = self.placement.remove(&mut c, name)?;
        drop(last.and_then(PortIo::into_port));
        Ok(())
    }

    /// Hands vif `src`'s identity over to vif `dst` ([`crate::SwitchHandle::migrate_port`]).
    pub fn migrate_port(&mut self, src: &str, dst: &str, now_ns: u64) -> Result<(), SwitchError> {
        let mut c = Direct {
            switches: &mut self.switches,
            now: now_ns,
        };
        let uplink = c.switches[0].uplink_name().to_string();
        self.placement.migrate(&mut c, (src, dst), &uplink)
    }

    /// Replaces the policy set on every shard.
    pub fn set_policies(&mut self, policies: PolicySet, now_ns: u64) -> Result<(), SwitchError> {
        let mut c = Direct {
            switches: &mut self.switches,
            now: now_ns,
        };
        self.placement.set_policies(&mut c, policies)
    }

    /// One snapshot of every shard, merged ([`crate::stats::merge`]).
    pub fn stats(&mut self, now_ns: u64) -> SwitchStats {
        let snaps: Vec<Arc<SwitchStats>> = self
            .switches
            .iter_mut()
            .map(|s| Arc::new(s.stats(now_ns)))
            .collect();
        crate::stats::merge(&snaps)
    }
}
