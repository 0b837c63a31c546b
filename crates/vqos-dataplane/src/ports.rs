//! The port table: every port the switch holds, by slot, with its counters, policy-derived
//! state and readiness; name → slot and vif id → slot in O(1).
//!
//! Slot 0 is the uplink. A removed vif leaves its slot empty and the next port added takes the
//! lowest empty slot, so slot numbers (epoll tokens, MAC-table values) stay small.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};

use vqos_sched::{PolicySet, TokenBucket, VifId, VifPolicy};

use crate::config::{IpAddrs, IpPolicy, Locks, MacPolicy, PortSecurity};
use crate::error::SwitchError;
use crate::frame::MacKey;
use crate::guard::{is_ipv4_key, IpKey, Services};
use crate::l2::AddrKey;
use crate::port::Port;
use crate::stats::{PortCounters, PortRole};

/// Samples kept per port for the rate window (window = (samples − 1) × stats interval).
pub(crate) const RATE_SAMPLES: usize = 5;

/// A port's source-address rule as the loop applies it ([`MacPolicy`], or one family of an
/// [`IpPolicy`], with its state).
#[derive(Debug, Clone)]
pub(crate) enum Security<K = MacKey> {
    /// Any address not owned by another port.
    Any,
    /// Only these (sorted, pinned to the port when it was added).
    Fixed(Vec<K>),
    /// Lock to the first `max` addresses seen (pinned as they are locked).
    Learn {
        /// Most addresses locked.
        max: usize,
        /// Locked so far.
        locked: Vec<K>,
    },
}

impl<K> Security<K> {
    fn learn(max: usize) -> Self {
        Security::Learn {
            max,
            locked: Vec::with_capacity(max.min(64)),
        }
    }
}

/// A guarded vif's rules above layer 2 ([`IpPolicy`], with its state).
#[derive(Debug, Clone)]
pub(crate) struct AddrGuard {
    /// IPv4 addresses it may claim.
    pub v4: Security<IpKey>,
    /// IPv6 addresses it may claim.
    pub v6: Security<IpKey>,
    /// What it may serve.
    pub services: Services,
}

impl AddrGuard {
    fn new(policy: IpPolicy) -> Self {
        let (v4, v6) = match policy.addrs {
            IpAddrs::Learn { v4, v6 } => (Security::learn(v4), Security::learn(v6)),
            IpAddrs::Fixed(mut list) => {
                list.sort_unstable();
                list.dedup();
                let (v4, v6) = list.into_iter().partition(|&k| is_ipv4_key(k));
                (Security::Fixed(v4), Security::Fixed(v6))
            }
        };
        AddrGuard {
            v4,
            v6,
            services: policy.services,
        }
    }

    /// The rule of `addr`'s family.
    #[inline]
    pub fn family(&mut self, addr: IpKey) -> &mut Security<IpKey> {
        if is_ipv4_key(addr) {
            &mut self.v4
        } else {
            &mut self.v6
        }
    }
}

impl<K: Copy + PartialEq> Security<K> {
    /// Adds `addr` to a first-come lock (restored from a previous run), within its size.
    fn lock(&mut self, addr: K) {
        if let Security::Learn { max, locked } = self {
            if locked.len() < *max && !locked.contains(&addr) {
                locked.push(addr);
            }
        }
    }

    /// Forgets `addr` from a first-come lock (an assignment took it).
    fn unlock(&mut self, addr: K) {
        if let Security::Learn { locked, .. } = self {
            locked.retain(|&a| a != addr);
        }
    }

    /// What the first-come lock holds.
    fn locked(&self) -> &[K] {
        match self {
            Security::Learn { locked, .. } => locked,
            _ => &[],
        }
    }
}

impl Security {
    fn new(policy: MacPolicy) -> Self {
        match policy {
            MacPolicy::Any => Security::Any,
            MacPolicy::Fixed(mut macs) => {
                // Sorted once, searched per frame.
                macs.sort_unstable();
                macs.dedup();
                Security::Fixed(macs)
            }
            MacPolicy::Learn { max } => Security::learn(max),
        }
    }
}

impl PortEntry {
    /// Locks `addr` to the port's first-come lists (a restored lock).
    pub fn lock(&mut self, addr: AddrKey) {
        match addr {
            AddrKey::Mac(m) => self.security.lock(m),
            AddrKey::Ip(ip) => {
                if let Some(g) = &mut self.guard {
                    g.family(ip).lock(ip);
                }
            }
        }
    }

    /// Removes `addr` from the port's first-come lists (an assignment took it).
    pub fn unlock(&mut self, addr: AddrKey) {
        match addr {
            AddrKey::Mac(m) => self.security.unlock(m),
            AddrKey::Ip(ip) => {
                if let Some(g) = &mut self.guard {
                    g.family(ip).unlock(ip);
                }
            }
        }
    }

    /// The addresses locked to it first come (configured ones are not).
    pub fn locks(&self) -> Locks {
        let ips = self.guard.as_ref().map_or(Vec::new(), |g| {
            g.v4.locked().iter().chain(g.v6.locked()).copied().collect()
        });
        Locks {
            macs: self.security.locked().to_vec(),
            ips,
        }
    }
}

/// A port's I/O, shared by the shards ([`crate::Switch::shard`]): the shard that owns the
/// port's receive side reads it, every shard sends to it, one short lock per batch (a
/// port with one queue is shared the way OVS shares a tx queue among PMD threads). No code
/// holds two of these locks, or one of them and the address tables' lock, at once.
///
/// Aligned to 128 bytes (two cache lines, what adjacent-line prefetch pulls in): two ports'
/// locks allocated one after the other would otherwise share a line, and two shards each
/// locking only its own port per batch would still pass that line back and forth (measured:
/// 190 instead of 120 cycles per frame on two null vifs, one per shard).
#[repr(align(128))]
pub(crate) struct PortIo(Mutex<Box<dyn Port>>);

impl PortIo {
    /// Shares `port`.
    pub fn new(port: Box<dyn Port>) -> Arc<PortIo> {
        Arc::new(PortIo(Mutex::new(port)))
    }

    /// What a shard that does not read the port sends through: a transmit queue of its own
    /// if the port has several ([`Port::tx_queue`]; `true`), else the port itself.
    pub fn for_sender(io: &Arc<PortIo>) -> (Arc<PortIo>, bool) {
        match io.lock().tx_queue() {
            Ok(Some(q)) => (PortIo::new(q), true),
            // A port that has one queue, or could not open another, is shared.
            _ => (io.clone(), false),
        }
    }

    /// The port, locked (a shard that panicked mid-call left a port whose next call reports
    /// its own errors).
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, Box<dyn Port>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The port, once no shard holds it any more.
    pub fn into_port(io: Arc<PortIo>) -> Option<Box<dyn Port>> {
        Arc::into_inner(io).map(|m| m.0.into_inner().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One port as the loop holds it.
pub(crate) struct PortEntry {
    /// The port.
    pub port: Arc<PortIo>,
    /// The shard that reads the port.
    pub home: usize,
    /// The shards that read it, a bit each (`home`'s, and those its receive queues were
    /// spread to: [`crate::Switch::read_queue`]); known on every shard.
    pub carriers: u64,
    /// This shard reads the port (owns its receive side, its vif's engine state and its
    /// source-address locks); other shards hold the entry to send to it.
    pub local: bool,
    /// Its name (copied once, for stats and lookups).
    pub name: String,
    /// Uplink or vif.
    pub role: PortRole,
    /// This shard sends to the port on a transmit queue of its own ([`Port::tx_queue`]).
    pub own_queue: bool,
    /// Vif id in the whole policy set (`vif` is the id in this shard's engine).
    pub global_vif: Option<VifId>,
    /// Vif id in this shard's engine (local vifs only).
    pub vif: Option<VifId>,
    /// The vif's policy.
    pub policy: Option<VifPolicy>,
    /// Frames may be waiting (set by readiness, cleared by a short read).
    pub ready: bool,
    /// The last read failed: retried at the next stats publication (frames may still wait,
    /// and an edge-triggered descriptor will not fire for them again).
    pub rx_failed: bool,
    /// Readiness descriptor (registered with epoll by the thread wrapper).
    pub fd: Option<RawFd>,
    /// Which source addresses it may send from.
    pub security: Security,
    /// Its rules above layer 2 (a guarded vif), or none (the uplink, an unguarded vif).
    pub guard: Option<AddrGuard>,
    /// Storm control: broadcast, multicast and unknown-unicast frames it may still send
    /// (tokens are frames).
    pub storm: Option<TokenBucket>,
    /// Counters.
    pub c: PortCounters,
    /// The vif's maximum enforced on uplink→vif frames.
    pub down_bucket: Option<TokenBucket>,
    /// The vif's CE marking probability (PID-ECN), scaled to 2^32 (2^32 = always): applied to
    /// uplink→vif unicast frames and to the frames the vif sends to the uplink alone.
    pub ecn_threshold: u64,
    /// The last read took all it asked for: more frames were likely waiting (what the
    /// capacity balance takes for "wants more than it gets"; true until first read).
    pub backlogged: bool,
    /// `rx_bytes` when the shard last published the vif's demand ([`crate::balance`]).
    pub balance_bytes: u64,
    /// The vif's rate smoothed over the last few balance periods, bits/s.
    pub balance_rate: u64,
    /// Moving average of frame size read from this port, bytes (to size capacity-limited
    /// batches).
    pub avg_frame_bytes: u64,
    /// Recent (time ns, rx bytes, tx bytes) samples for rates.
    pub rate_hist: [(u64, u64, u64); RATE_SAMPLES],
    /// Next sample to overwrite.
    pub rate_pos: usize,
    /// The slot of the port its identity is handed over to (`vqos port migrate`,
    /// [`crate::migrate`]), and whether the hand-over completed.
    pub heir: Option<(usize, bool)>,
}

impl PortEntry {
    fn new(
        port: Arc<PortIo>,
        home: usize,
        local: bool,
        security: PortSecurity,
        role: PortRole,
        storm: Option<TokenBucket>,
    ) -> Self {
        let (name, fd) = {
            let p = port.lock();
            (p.name().to_string(), p.readiness_fd())
        };
        PortEntry {
            name,
            fd: fd.filter(|_| local),
            port,
            home,
            carriers: 1 << home.min(63),
            local,
            own_queue: false,
            role,
            global_vif: None,
            vif: None,
            policy: None,
            // A new port may already hold frames: the edge may have passed before we watched.
            ready: local,
            rx_failed: false,
            guard: match role {
                PortRole::Uplink => None,
                PortRole::Vif => security.ips.map(AddrGuard::new),
            },
            security: Security::new(match role {
                PortRole::Uplink => MacPolicy::Any,
                PortRole::Vif => security.macs,
            }),
            storm,
            c: PortCounters::default(),
            down_bucket: None,
            ecn_threshold: 0,
            backlogged: true,
            balance_bytes: 0,
            balance_rate: 0,
            // Start pessimistic (a super-frame) so that the first capacity-limited read is small.
            avg_frame_bytes: 65_536,
            rate_hist: [(0, 0, 0); RATE_SAMPLES],
            rate_pos: 0,
            heir: None,
        }
    }
}

/// Every port, by slot.
#[derive(Default)]
pub(crate) struct PortTable {
    /// The shard holding this table.
    pub shard: usize,
    /// Ports by slot; slot 0 is the uplink; removed ports leave `None`.
    slots: Vec<Option<PortEntry>>,
    /// Name → slot.
    by_name: HashMap<String, usize>,
    /// Vif id → slot, for the policy set in force.
    vif_slots: Vec<usize>,
}

impl PortTable {
    /// An empty table for shard `shard`.
    pub fn for_shard(shard: usize) -> Self {
        PortTable {
            shard,
            ..PortTable::default()
        }
    }

    /// The slot a new port takes: 0 for the uplink, else the lowest free one.
    pub fn free_slot(&self, role: PortRole) -> usize {
        match role {
            PortRole::Uplink => 0,
            PortRole::Vif => self
                .slots
                .iter()
                .skip(1)
                .position(Option::is_none)
                .map_or(self.slots.len().max(1), |p| p + 1),
        }
    }

    /// Puts `port`, read by shard `home`, in slot `idx` (from [`PortTable::free_slot`], on
    /// every shard the same); refused if its name or the slot is taken. The uplink accepts
    /// any source address.
    pub fn insert(
        &mut self,
        idx: usize,
        io: (Arc<PortIo>, bool),
        home: usize,
        security: PortSecurity,
        role: PortRole,
        storm: Option<TokenBucket>,
    ) -> Result<(), SwitchError> {
        let local = home == self.shard;
        self.insert_entry(idx, io, (home, local), security, role, storm)
    }

    /// [`PortTable::insert`] of a receive queue of a port `home` reads too
    /// ([`crate::Port::rx_queue`]: the uplink read on every shard): this shard reads it.
    pub fn insert_reader(
        &mut self,
        idx: usize,
        port: Arc<PortIo>,
        home: usize,
        security: PortSecurity,
        role: PortRole,
        storm: Option<TokenBucket>,
    ) -> Result<(), SwitchError> {
        self.insert_entry(idx, (port, true), (home, true), security, role, storm)
    }

    fn insert_entry(
        &mut self,
        idx: usize,
        (port, own_queue): (Arc<PortIo>, bool),
        (home, local): (usize, bool),
        security: PortSecurity,
        role: PortRole,
        storm: Option<TokenBucket>,
    ) -> Result<(), SwitchError> {
        let mut entry = PortEntry::new(port, home, local, security, role, storm);
        entry.own_queue = own_queue;
        if self.by_name.contains_key(&entry.name) || self.get(idx).is_some() {
            return Err(SwitchError::DuplicatePort(entry.name));
        }
        if idx >= self.slots.len() {
            self.slots.resize_with(idx + 1, || None);
        }
        self.by_name.insert(entry.name.clone(), idx);
        self.slots[idx] = Some(entry);
        Ok(())
    }

    /// Empties slot `idx` and returns its entry.
    pub fn remove(&mut self, idx: usize) -> Option<PortEntry> {
        let entry = self.slots.get_mut(idx)?.take()?;
        self.by_name.remove(&entry.name);
        Some(entry)
    }

    /// The slot of the port called `name`.
    #[inline]
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Number of slots (some may be empty).
    #[inline]
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The port in slot `idx`.
    #[inline]
    pub fn get(&self, idx: usize) -> Option<&PortEntry> {
        self.slots.get(idx).and_then(Option::as_ref)
    }

    /// The port in slot `idx`, mutable.
    #[inline]
    pub fn get_mut(&mut self, idx: usize) -> Option<&mut PortEntry> {
        self.slots.get_mut(idx).and_then(Option::as_mut)
    }

    /// The slot of vif `vif` of this shard's engine.
    #[inline]
    pub fn vif_slot(&self, vif: VifId) -> Option<usize> {
        self.vif_slots.get(vif).copied()
    }

    /// Every port with its slot.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &PortEntry)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
    }

    /// Every port with its slot, mutable.
    pub fn iter_mut_slots(&mut self) -> impl Iterator<Item = (usize, &mut PortEntry)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|s| (i, s)))
    }

    /// Every port, mutable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut PortEntry> {
        self.slots.iter_mut().flatten()
    }

    /// The vif slot of every vif of `policies`, by vif id; an error if a vif names no vif
    /// slot, names one twice, or a vif slot is not named (the loop does not trust its caller
    /// here: a wrong mapping would serve one tenant's port under another's policy). Slot
    /// `removed`, if any, counts as gone already. O(vifs).
    pub fn resolve(
        &self,
        policies: &PolicySet,
        removed: Option<usize>,
    ) -> Result<Vec<usize>, SwitchError> {
        let mut named = vec![false; self.slots.len()];
        let mut slots = Vec::with_capacity(policies.len());
        for spec in &policies.vifs {
            match self.index_of(&spec.name) {
                Some(0) => return Err(SwitchError::Uplink(spec.name.clone())),
                Some(idx) if Some(idx) != removed && !named[idx] => {
                    named[idx] = true;
                    slots.push(idx);
                }
                _ => return Err(SwitchError::UnknownPort(spec.name.clone())),
            }
        }
        for (idx, s) in self.iter().skip_while(|(i, _)| *i == 0) {
            if Some(idx) != removed && !named[idx] {
                return Err(SwitchError::MissingVif(s.name.clone()));
            }
        }
        Ok(slots)
    }

    /// Installs a resolved vif → slot mapping (from [`PortTable::resolve`]) and each vif's
    /// policy, and the ids of this shard's vifs in its engine (`local_slots`, by engine id);
    /// slots not in them lose their ids.
    pub fn assign(&mut self, vif_slots: &[usize], local_slots: Vec<usize>, policies: &PolicySet) {
        for s in self.iter_mut() {
            s.vif = None;
            s.global_vif = None;
        }
        for (id, &idx) in vif_slots.iter().enumerate() {
            if let Some(s) = self.get_mut(idx) {
                s.global_vif = Some(id);
                s.policy = Some(policies.vifs[id].policy.clone());
            }
        }
        for (id, &idx) in local_slots.iter().enumerate() {
            if let Some(s) = self.get_mut(idx) {
                s.vif = Some(id);
            }
        }
        self.vif_slots = local_slots;
    }

    /// True when some port this shard reads has no readiness descriptor (it must be polled).
    pub fn has_poll_only(&self) -> bool {
        self.iter().any(|(_, s)| s.local && s.fd.is_none())
    }
}
