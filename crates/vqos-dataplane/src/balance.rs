//! How the shards of a switch divide the uplink capacity: every [`BALANCE_NS`] each shard
//! publishes what its vifs want, shard 0 divides the capacity by the reference allocator
//! (`vqos_sched::alloc::allocate`, the same weighted max-min with floors, caps and demands
//! the engines are judged against), and each shard runs its shaper at its part and its
//! engine over its own vifs at that capacity.
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
//! A vif whose last read took all the shard asked for (frames were likely left: the engine
//! or the shard's share held it back) wants more than it gets: greedy. Any other vif wants
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
//! times; each keeps its tokens across a change. Per period: O(vifs) on every shard, one
//! mutex, and an O(vifs log vifs) allocation on shard 0.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use vqos_sched::alloc::{allocate, Claim};
use vqos_sched::PolicySet;

use crate::switch::Switch;

/// How often shards publish demands and shard 0 divides the capacity, ns.
pub const BALANCE_NS: u64 = 10_000_000;

/// What a vif that is not held back is given beyond its rate, bits/s (and 1 % more): room to
/// grow before its reads fill up and it counts as greedy.
const HEADROOM_BPS: u64 = 10_000;

/// A demand meaning "more than it gets".
const GREEDY: u64 = u64::MAX;

/// What the shards share to divide the capacity.
#[derive(Debug)]
pub(crate) struct Balance {
    /// Per vif slot, what its shard last said it wants, bits/s.
    demands: Mutex<HashMap<usize, u64>>,
    /// The capacity last divided, and each shard's part of it, bits/s (empty: not divided
    /// yet). A part is taken only under the capacity it was computed for, so a shard never
    /// runs at a part of an old capacity after a change.
    shares: Mutex<(u64, Vec<u64>)>,
    /// How many shards.
    shards: usize,
}

impl Balance {
    /// Nothing divided yet among `shards` shards.
    pub fn new(shards: usize) -> Arc<Balance> {
        Arc::new(Balance {
            demands: Mutex::new(HashMap::new()),
            shares: Mutex::new((0, Vec::new())),
            shards: shards.max(1),
        })
    }

    /// How many shards.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// Shard `shard`'s part of `capacity` (`None`: that capacity is not divided yet).
    pub fn share(&self, shard: usize, capacity: u64) -> Option<u64> {
        let s = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        if s.0 != capacity {
            return None;
        }
        s.1.get(shard).copied()
    }

    /// Records what the vifs in `slots` want (`(slot, bits/s)`, [`GREEDY`] for more).
    fn publish(&self, wants: impl Iterator<Item = (usize, u64)>) {
        let mut d = self.demands.lock().unwrap_or_else(|e| e.into_inner());
        d.extend(wants);
    }

    /// Divides `capacity` among the shards for `policies` (vif `i` in slot `slots[i]`, read by
    /// shard `homes[i]`), from the demands published.
    fn divide(&self, policies: &PolicySet, slots: &[usize], homes: &[usize], capacity: u64) {
        let d = self.demands.lock().unwrap_or_else(|e| e.into_inner());
        let claims: Vec<Claim> = policies
            .vifs
            .iter()
            .zip(slots)
            .map(|(v, slot)| {
                let want = d.get(slot).copied().unwrap_or(GREEDY);
                Claim::new(&v.policy, (want != GREEDY).then_some(want))
            })
            .collect();
        drop(d);
        let parts = split(capacity, &claims, homes, self.shards());
        *self.shares.lock().unwrap_or_else(|e| e.into_inner()) = (capacity, parts);
    }

    /// Forgets the demand of a slot whose port went away.
    pub fn forget(&self, slot: usize) {
        self.demands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&slot);
    }
}

/// Each of `shards` shards' part of `capacity`: the reference allocations of its vifs
/// (`homes[i]`: vif `i`'s shard), and an even part of what nobody wants. The parts add up to
/// `capacity`. Policies the allocator refuses (floors above the capacity: the set was
/// validated, so only a race with a change) leave an even split.
pub(crate) fn split(capacity: u64, claims: &[Claim], homes: &[usize], shards: usize) -> Vec<u64> {
    let shards = shards.max(1);
    let mut parts = vec![0u64; shards];
    if let Ok(rates) = allocate(capacity, claims) {
        for (rate, &home) in rates.iter().zip(homes) {
            if let Some(p) = parts.get_mut(home) {
                *p += rate;
            }
        }
    }
    let used: u64 = parts.iter().sum();
    let spare = capacity.saturating_sub(used);
    let each = spare / shards as u64;
    for p in &mut parts {
        *p += each;
    }
    parts[0] += spare - each * shards as u64;
    parts
}

impl Switch {
    /// Every [`BALANCE_NS`] with several shards and a capacity: publishes what this shard's
    /// vifs want, divides the capacity (shard 0), and takes this shard's part.
    pub(crate) fn rebalance(&mut self, now_ns: u64) {
        if self.balance.shards() == 1 {
            self.next_balance_ns = u64::MAX;
            return;
        }
        let dt = now_ns.saturating_sub(self.balanced_at_ns).max(1);
        self.balanced_at_ns = now_ns;
        self.next_balance_ns = now_ns + BALANCE_NS;
        let Some(capacity) = self.policies.capacity_bps else {
            return;
        };
        let wants: Vec<(usize, u64)> = self
            .ports
            .iter_mut_slots()
            .filter(|(_, s)| s.local && s.vif.is_some())
            .map(|(slot, s)| {
                let bytes = s.c.rx_bytes - s.balance_bytes;
                s.balance_bytes = s.c.rx_bytes;
                let sent = (u128::from(bytes) * 8_000_000_000 / u128::from(dt)) as u64;
                // Smoothed over about four periods: a slow vif sends a few frames per period,
                // and one frame more or less would swing its demand by a quarter.
                s.balance_rate = s.balance_rate - s.balance_rate / 4 + sent / 4;
                let rate = s.balance_rate;
                let want = if s.backlogged {
                    GREEDY
                } else {
                    rate + rate / 100 + HEADROOM_BPS
                };
                (slot, want)
            })
            .collect();
        self.balance.publish(wants.into_iter());
        if self.shard == 0 {
            let homes: Vec<usize> = self
                .vif_slots
                .iter()
                .map(|&slot| self.ports.get(slot).map_or(0, |s| s.home))
                .collect();
            self.balance
                .divide(&self.policies, &self.vif_slots, &homes, capacity);
        }
        let share = self.balance.share(self.shard, capacity);
        if share.is_some() && share != self.share_bps {
            self.share_bps = share;
            let (local, _) = self.local_set(&self.policies, &self.vif_slots, None);
            // The floors were validated with the whole set and the local capacity is at
            // least this shard's floors: a refusal here would be a bug; keep the old engine
            // capacity then, the shaper still holds the shard to its part.
            let _ = self.sched.configure(&local, now_ns);
            self.shaper.retarget(share, now_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vqos_sched::VifPolicy;

    fn claim(weight: u32, min: u64, demand: Option<u64>) -> Claim {
        Claim::new(
            &VifPolicy {
                weight,
                min_bps: min,
                ..VifPolicy::default()
            },
            demand,
        )
    }

    #[test]
    fn parts_are_the_sums_of_the_reference_rates_and_add_up_to_the_capacity() {
        // Weights 1:2:3 over 600: 100/200/300; vifs 0 and 2 on shard 0, vif 1 on shard 1.
        let claims = [claim(1, 0, None), claim(2, 0, None), claim(3, 0, None)];
        assert_eq!(split(600, &claims, &[0, 1, 0], 2), vec![400, 200]);
        // Vif 1 wants only 50: the others split the rest by weight (137.5 / 412.5).
        let claims = [claim(1, 0, None), claim(2, 0, Some(50)), claim(3, 0, None)];
        let parts = split(600, &claims, &[0, 1, 0], 2);
        assert_eq!(parts[1], 50);
        assert_eq!(parts.iter().sum::<u64>(), 600);
        // Nobody wants much: what is left is split evenly (the odd unit to shard 0).
        let claims = [claim(1, 0, Some(10)), claim(1, 0, Some(20))];
        assert_eq!(split(101, &claims, &[0, 1], 2), vec![10 + 36, 20 + 35]);
        // A floor binds: vif 0 (weight 1, floor 500) on shard 1.
        let claims = [claim(1, 500, None), claim(9, 0, None)];
        assert_eq!(split(1000, &claims, &[1, 0], 2), vec![500, 500]);
    }
}
