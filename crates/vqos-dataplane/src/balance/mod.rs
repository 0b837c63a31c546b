//! How the shards of a switch divide the capacity of each direction: every [`BALANCE_NS`]
//! each shard publishes what its vifs want, shard 0 divides the capacity by the reference
//! allocator (`vqos_sched::alloc::allocate`, the same weighted max-min with floors, caps and
//! demands the engines are judged against, `plan`), and each shard runs its shaper at its
//! part and its engine over the vifs it carries at that capacity. The uplink's capacity is
//! divided among the shards that read the vifs; the downlink's (`capacity_in`) among the
//! shards whose downlinks queue frames for them, and with it each vif's inbound floor and
//! max, which are one floor and one max whichever shards carry its frames (`plan`'s docs).
//!
//! ## Why this gives one shard's allocation
//! Weighted max-min is consistent: if a set of vifs is given exactly the sum of their
//! reference allocations, weighted max-min among them alone gives each the same rate. So a
//! shard whose capacity is the sum of its vifs' reference rates, and whose engine divides it
//! by the same policy, gives each vif what one shard over every vif would. What is left
//! when every vif wants less than the capacity is split evenly, so a vif that starts
//! sending finds room at once and the next period gives it its share.
//!
//! ## Demands
//! Uplink: a vif whose last read took all the shard asked for (frames were likely left: the
//! engine or the shard's share held it back) wants more than it gets: greedy. Downlink: a
//! vif whose queue on the shard holds frames at the period's end is greedy there; its rate
//! is what joined the queue. Any other vif wants
//! what it sent, smoothed over about four periods (a slow vif sends a few frames a period:
//! the larger of the raw and the smoothed rate was measured to give away 1 % of a 20 Mbit/s
//! capacity), plus 1 % and 10 kbit/s; if it wants more, its reads fill up under its shard's
//! share and it counts as greedy at the next period. The estimate is the bytes read from the
//! vif (vif-to-vif frames included). The headroom is what the division costs: capacity given
//! to a vif that does not use it (1 % of that vif's rate) is not used by the others.
//!
//! ## Bound and cost
//! A change in demand is followed within two periods (published at the next period of its
//! shard, divided at the next of shard 0). The shapers' rates add up to the capacity at all
//! times; each keeps its tokens across a change. Per period: O(vifs) on every shard (every
//! vif on each shard for the downlink), one mutex per direction, and an O(vifs log vifs)
//! allocation per direction on shard 0.

mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use vqos_sched::{PolicySet, VifPolicy, VifSpec};

use plan::{plan, undivided, VifIn};
pub(crate) use plan::{Local, Plan, Want};

use crate::switch::Switch;

/// How often shards publish demands and shard 0 divides the capacity, ns.
pub const BALANCE_NS: u64 = 10_000_000;

/// A direction of traffic, each divided on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// What the vifs send (read by each vif's shard).
    Up = 0,
    /// What the vifs receive (queued on the downlink of the shard that switched it).
    Down = 1,
}

/// A division and the vif slots it was made for (vif `i` of the plan in `slots[i]`).
#[derive(Debug)]
pub(crate) struct Division {
    /// The vifs' slots, in the plan's order.
    slots: Vec<usize>,
    /// The division.
    plan: Plan,
}

/// What the shards share to divide the capacities.
#[derive(Debug)]
pub(crate) struct Balance {
    /// Per direction, per `(vif slot, shard)`, what that shard last said.
    wants: [Mutex<HashMap<(usize, usize), Want>>; 2],
    /// Per direction, the last division (`None`: not divided yet).
    divisions: [Mutex<Option<Arc<Division>>>; 2],
    /// How many shards.
    shards: usize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Balance {
    /// Nothing divided yet among `shards` shards.
    pub fn new(shards: usize) -> Arc<Balance> {
        Arc::new(Balance {
            wants: Default::default(),
            divisions: Default::default(),
            shards: shards.max(1),
        })
    }

    /// How many shards.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// The last division of `dir`.
    fn division(&self, dir: Dir) -> Option<Arc<Division>> {
        lock(&self.divisions[dir as usize]).clone()
    }

    /// Shard `shard`'s part of the uplink's `capacity` (`None`: not divided yet).
    pub fn share(&self, shard: usize, capacity: u64) -> Option<u64> {
        let d = self.division(Dir::Up)?;
        (d.plan.capacity == Some(capacity))
            .then(|| d.plan.parts.get(shard).copied())
            .flatten()
    }

    /// Records what `shard` says about the vifs in `wants` (`(slot, want)`).
    fn publish(&self, dir: Dir, shard: usize, wants: impl Iterator<Item = (usize, Want)>) {
        let mut d = lock(&self.wants[dir as usize]);
        d.extend(wants.map(|(slot, w)| ((slot, shard), w)));
    }

    /// What every shard said, per vif slot.
    fn wants_by_slot(&self, dir: Dir) -> HashMap<usize, Vec<(usize, Want)>> {
        let mut by: HashMap<usize, Vec<(usize, Want)>> = HashMap::new();
        for (&(slot, shard), &w) in lock(&self.wants[dir as usize]).iter() {
            by.entry(slot).or_default().push((shard, w));
        }
        by
    }

    /// Divides `dir`'s `capacity` for `policies` (the direction's policies; vif `i` in slot
    /// `slots[i]`, its home shard and the shards that may carry it in `carriers[i]`).
    fn divide(&self, dir: Dir, policies: &PolicySet, slots: &[usize], carriers: &[(usize, u64)]) {
        let mut wants = self.wants_by_slot(dir);
        let vifs: Vec<VifIn> = policies
            .vifs
            .iter()
            .zip(slots)
            .zip(carriers)
            .map(|((v, slot), &(home, carriers))| VifIn {
                policy: &v.policy,
                home,
                carriers,
                wants: wants.remove(slot).unwrap_or_default(),
            })
            .collect();
        let plan = plan(policies.capacity_bps, &vifs, self.shards);
        *lock(&self.divisions[dir as usize]) = Some(Arc::new(Division {
            slots: slots.to_vec(),
            plan,
        }));
    }

    /// The last division of `dir` if it was made for `capacity` and these vif slots.
    fn division_for(
        &self,
        dir: Dir,
        capacity: Option<u64>,
        slots: &[usize],
    ) -> Option<Arc<Division>> {
        self.division(dir)
            .filter(|d| d.plan.capacity == capacity && d.slots == slots)
    }

    /// How `shard` runs vif `i` of `division` (`None`: none yet for this set), whose home is
    /// `home` and which `carriers` shards carry ([`plan::undivided`] before a division).
    pub(crate) fn local(
        division: Option<&Division>,
        shard: usize,
        i: usize,
        (home, carriers): (usize, u32),
        capped: bool,
    ) -> Local {
        match division {
            Some(d) => d.plan.locals[i][shard],
            None => undivided(shard == home, carriers, capped),
        }
    }

    /// Forgets what was said about a slot whose port went away.
    pub fn forget(&self, slot: usize) {
        for w in &self.wants {
            lock(w).retain(|&(s, _), _| s != slot);
        }
    }
}

impl Switch {
    /// Every [`BALANCE_NS`] with several shards: publishes what this shard's vifs want in
    /// each direction, divides the capacities (shard 0), and takes this shard's parts.
    pub(crate) fn rebalance(&mut self, now_ns: u64) {
        if self.balance.shards() == 1 {
            self.next_balance_ns = u64::MAX;
            return;
        }
        let dt = now_ns.saturating_sub(self.balanced_at_ns).max(1);
        self.balanced_at_ns = now_ns;
        self.next_balance_ns = now_ns + BALANCE_NS;
        self.publish_up(dt);
        if let Some(d) = &mut self.downlink {
            let wants = d.sample(dt);
            self.balance
                .publish(Dir::Down, self.shard, wants.into_iter());
        }
        if self.shard == 0 {
            let carriers: Vec<(usize, u64)> = (self.vif_slots.iter())
                .map(|&slot| {
                    self.ports
                        .get(slot)
                        .map_or((0, 1), |s| (s.home, s.carriers))
                })
                .collect();
            if self.up_divided() {
                let b = &self.balance;
                b.divide(Dir::Up, &self.policies, &self.vif_slots, &carriers);
            }
            if self.downlink.is_some() {
                let set = self.policies.downlink(self.downlink_max);
                let all = vec![(0, u64::MAX); carriers.len()];
                self.balance.divide(Dir::Down, &set, &self.vif_slots, &all);
            }
        }
        self.take_up_share(now_ns);
        if self.downlink.is_some() {
            let (set, shaper_bps) = self.downlink_set(&self.policies, &self.vif_slots);
            let slots = self.vif_slots.clone();
            if let Some(d) = &mut self.downlink {
                // The set was accepted whole before; a refusal here (a part below a floor
                // by rounding) keeps the last one, the shaper still holds the shard's part.
                let _ = d.update(&set, shaper_bps, &slots, now_ns);
            }
        }
    }

    /// The uplink direction is divided: under a finite capacity, or while some vif is read
    /// on several shards (its floor and cap are divided among them).
    fn up_divided(&self) -> bool {
        self.policies.capacity_bps.is_some()
            || (self.ports.iter()).any(|(_, s)| s.carriers.count_ones() > 1)
    }

    /// Publishes what this shard's vifs send (uplink direction).
    fn publish_up(&mut self, dt: u64) {
        if !self.up_divided() {
            return;
        }
        let wants: Vec<(usize, Want)> = self
            .ports
            .iter_mut_slots()
            .filter(|(_, s)| s.local && s.vif.is_some())
            .map(|(slot, s)| {
                let bytes = s.c.rx_bytes - s.balance_bytes;
                s.balance_bytes = s.c.rx_bytes;
                s.balance_rate = smooth(s.balance_rate, bytes, dt);
                let want = Want {
                    greedy: s.backlogged,
                    rate: s.balance_rate,
                };
                (slot, want)
            })
            .collect();
        self.balance.publish(Dir::Up, self.shard, wants.into_iter());
    }

    /// Takes this shard's part of the uplink capacity when shard 0 divided it anew, and the
    /// parts of the vifs it reads with other shards ([`crate::spread`]) when they moved.
    fn take_up_share(&mut self, now_ns: u64) {
        let share = (self.policies.capacity_bps).and_then(|c| self.balance.share(self.shard, c));
        let moved = share.is_some() && share != self.share_bps;
        if moved {
            self.share_bps = share;
        }
        let spread = (self.ports.iter()).any(|(_, s)| s.local && s.carriers.count_ones() > 1);
        if !moved && !spread {
            return;
        }
        let (local, _) = self.local_set(&self.policies, &self.vif_slots, None);
        if moved || local.vifs != self.up_vifs {
            // The floors were validated with the whole set and the local capacity is at
            // least this shard's floors: a refusal here would be a bug; keep the old engine
            // capacity then, the shaper still holds the shard to its part.
            let _ = self.sched.configure(&local, now_ns);
            self.restore_ready();
            self.up_vifs = local.vifs;
        }
        if moved {
            self.shaper.retarget(share, now_ns);
        }
    }

    /// Tells a freshly configured engine which of this shard's vifs have frames waiting:
    /// configuring forgets it, and a vif whose frames wait without a new readiness event (a
    /// vhost-user guest kicks once, then waits for the switch to drain its ring) would never
    /// be served again. (Found on a QEMU guest under two threads: its TCP stalled after the
    /// first part moved.)
    pub(crate) fn restore_ready(&mut self) {
        for s in self.ports.iter_mut() {
            if let (Some(v), true) = (s.vif, s.ready) {
                self.sched.set_ready(v, true);
            }
        }
    }

    /// This shard's part of `policies` (vif slots `vif_slots`, slot `removed` gone): its own
    /// vifs, in order, with the capacity it was given (at least their floors: the shaper
    /// holds the shard to its share, the engine must accept its floors); and their slots.
    pub(crate) fn local_set(
        &self,
        policies: &PolicySet,
        vif_slots: &[usize],
        removed: Option<usize>,
    ) -> (PolicySet, Vec<usize>) {
        let mut local = PolicySet {
            vifs: Vec::new(),
            ..policies.clone()
        };
        let mut slots = Vec::new();
        for (i, (spec, &slot)) in policies.vifs.iter().zip(vif_slots).enumerate() {
            if Some(slot) != removed && self.ports.get(slot).is_some_and(|s| s.local) {
                local.vifs.push(VifSpec {
                    name: spec.name.clone(),
                    policy: self.up_policy(policies, vif_slots, i),
                });
                slots.push(slot);
            }
        }
        if self.balance.shards() > 1 {
            let floors: u64 = local.vifs.iter().map(|v| v.policy.min_bps).sum();
            local.capacity_bps = policies
                .capacity_bps
                .map(|c| self.share_bps.unwrap_or(c).max(floors));
        }
        (local, slots)
    }

    /// The policy this shard's engine runs vif `i` (in slot `slot`) of `policies` under:
    /// its own, or its part of it where other shards read it too.
    pub(crate) fn up_policy(
        &self,
        policies: &PolicySet,
        vif_slots: &[usize],
        i: usize,
    ) -> VifPolicy {
        let policy = &policies.vifs[i].policy;
        let Some(s) = self.ports.get(vif_slots[i]) else {
            return policy.clone();
        };
        let n = s.carriers.count_ones();
        if n <= 1 {
            return policy.clone();
        }
        let division = (self.balance).division_for(Dir::Up, policies.capacity_bps, vif_slots);
        let at = (s.home, n);
        Balance::local(
            division.as_deref(),
            self.shard,
            i,
            at,
            policy.max_bps.is_some(),
        )
        .apply(policy)
    }

    /// The set this shard's downlink runs for `policies` (vif `i` in slot `vif_slots[i]`):
    /// every vif turned inbound and run as the last division says this shard runs it (the
    /// engine at the whole `capacity_in`, at least its floors); and the rate of the
    /// downlink's shaper, this shard's part of `capacity_in`. Before a division for these vifs and this
    /// capacity: an even part, each vif run by shard 0 and a sliver elsewhere.
    pub(crate) fn downlink_set(
        &self,
        policies: &PolicySet,
        vif_slots: &[usize],
    ) -> (PolicySet, Option<u64>) {
        let mut set = policies.downlink(self.downlink_max);
        let shards = self.balance.shards();
        if shards == 1 {
            let c = set.capacity_bps;
            return (set, c);
        }
        let division = (self.balance).division_for(Dir::Down, set.capacity_bps, vif_slots);
        for (i, v) in set.vifs.iter_mut().enumerate() {
            let everywhere = (0, shards as u32);
            let capped = v.policy.max_bps.is_some();
            let local = Balance::local(division.as_deref(), self.shard, i, everywhere, capped);
            v.policy = local.apply(&v.policy);
        }
        let part = set.capacity_bps.map(|c| match &division {
            Some(d) => d.plan.parts[self.shard],
            None => c / shards as u64,
        });
        // The engine keeps the whole capacity: only the shaper follows this shard's part. A
        // part that moves every period would otherwise configure the engine every period,
        // and its restarts disturbed what it paces (TCP's ACKs: a VM's uplink share, measured
        // ±7 % off on two threads). Caps and floors are the engine's, divided above; weights
        // share whatever rate the shaper lets through.
        let floors: u64 = set.vifs.iter().map(|v| v.policy.min_bps).sum();
        set.capacity_bps = set.capacity_bps.map(|c| c.max(floors));
        (set, part)
    }
}

/// `rate` (bits/s) after `bytes` more in `dt` ns, smoothed over about four periods: a slow
/// vif sends a few frames per period, and one frame more or less would swing its demand by
/// a quarter.
pub(crate) fn smooth(rate: u64, bytes: u64, dt: u64) -> u64 {
    let sent = (u128::from(bytes) * 8_000_000_000 / u128::from(dt.max(1))) as u64;
    rate - rate / 4 + sent / 4
}
