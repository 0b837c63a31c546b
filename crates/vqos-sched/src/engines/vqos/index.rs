//! The index behind `Vqos::select`: the decision the scan of every ready vif makes
//! (`scan.rs`), found by visiting only what changed since the previous decision.
//!
//! - Ready vifs are diffed against the previous decision's a 64-bit word at a time; a vif that
//!   became ready and eligible is woken (idle → busy) and placed, one that did not stay is
//!   removed.
//! - Placed vifs are in the floor tier (a list, scanned: its order changes with time) or in the
//!   fair heap of their priority, keyed on (tag, vif id). The heaps are std `BinaryHeap`s with
//!   lazy invalidation: every push carries a fresh stamp, a vif's one live entry is the one with
//!   its current stamp, and stale entries are dropped when they surface at the top (a heap more
//!   than twice its live size plus a margin is compacted, so charging a vif that is never
//!   chosen cannot grow it without bound). No decrease-key is needed, so no hand-written
//!   indexed heap.
//! - Empty buckets wait in timer heaps keyed on when they turn positive. An entry is never
//!   later than that instant (charging only moves it later; refilling does not move it), so
//!   when it falls due the bucket is checked for real and re-armed if still empty.
//!
//! Refills are deferred, not skipped: the scan refilled every ready vif's buckets at every
//! decision; the index refills a bucket only when it is looked at. A refill composes (refilled
//! at t₁ then at t₂ ≥ t₁ is the same as refilled at t₂), so on a monotonic clock every bucket
//! reads the same whenever a decision, a charge or a new configuration looks at it. The one
//! reading of an unrefilled bucket, a throttled cap's credit in the stats, is refilled to the
//! instant the scan would have (`cap_credit`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{owed_ns, Core, VifState};
use crate::bucket::TokenBucket;
use crate::engine::ReadySet;
use crate::policy::{VifId, PRIORITY_LEVELS};

/// A fair-heap entry, smallest (tag, vif) on top: (tag, vif, stamp).
type FairEntry = Reverse<(u128, VifId, u64)>;

/// A timer entry, earliest on top: (when the bucket may turn positive, ns; vif).
type TimerEntry = Reverse<(u64, VifId)>;

/// A stale entry never lets a heap grow past twice its live entries plus this margin.
pub(super) const COMPACT_MARGIN: usize = 32;

/// Where a vif sits in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Place {
    /// Not placed: not ready and eligible at the last decision.
    #[default]
    Idle,
    /// In the fair heap of `priority`; its live entry carries `stamp`.
    Fair {
        /// The heap's priority.
        priority: u8,
        /// Stamp of the live entry.
        stamp: u64,
    },
    /// In the floor tier, at `pos` in [`Index::floor_tier`].
    Floor {
        /// Position in the floor tier list.
        pos: usize,
    },
}

/// The index's view of one vif.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Where the vif sits.
    place: Place,
    /// The cap timer heap holds an entry for the vif (at most one).
    cap_timer: bool,
    /// The floor timer heap holds an entry for the vif (at most one).
    floor_timer: bool,
}

/// Eligible vifs ordered for `select`. Rebuilt by every `configure`.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// Per-vif index state, by vif id.
    slots: Vec<Slot>,
    /// Vifs seen ready and eligible at the last decision (placed), as bitset words.
    active: Vec<u64>,
    /// Vifs whose cap bucket is empty (not positive) as last refilled, as bitset words.
    throttled: Vec<u64>,
    /// Throttled vifs found positive by their timer while not ready: refilled when next ready.
    due: Vec<u64>,
    /// The ready set at the last decision (limited to the configured vifs), as bitset words.
    last_ready: Vec<u64>,
    /// When the last decision was made, ns.
    last_select_ns: u64,
    /// The fair tier: one heap per priority of placed vifs not owed floor service.
    fair: [BinaryHeap<FairEntry>; PRIORITY_LEVELS],
    /// Live entries (placed vifs) per fair heap.
    fair_live: [usize; PRIORITY_LEVELS],
    /// The floor tier: placed vifs owed floor service, in no order.
    floor_tier: Vec<VifId>,
    /// When throttled caps may turn positive.
    cap_timers: BinaryHeap<TimerEntry>,
    /// When empty floors of vifs in the fair tier may turn positive.
    floor_timers: BinaryHeap<TimerEntry>,
    /// Next fair-entry stamp (never reused, so no entry of an old configuration is live).
    next_stamp: u64,
}

/// The vifs whose bit is set in `word`, word `w` of a bitset.
fn bits(mut word: u64, w: usize) -> impl Iterator<Item = VifId> {
    std::iter::from_fn(move || {
        (word != 0).then(|| {
            let b = word.trailing_zeros() as usize;
            word &= word - 1;
            w * 64 + b
        })
    })
}

fn bit(words: &[u64], vif: VifId) -> bool {
    words[vif / 64] >> (vif % 64) & 1 != 0
}

fn set_bit(words: &mut [u64], vif: VifId, on: bool) {
    if on {
        words[vif / 64] |= 1 << (vif % 64);
    } else {
        words[vif / 64] &= !(1 << (vif % 64));
    }
}

impl Index {
    /// Rebuilds the index for a new configuration: `vifs` keep their `active` flags (they follow
    /// the vif's name) and their buckets were just refilled to the configuration's instant.
    pub(super) fn rebuild(&mut self, vifs: &[VifState]) {
        let words = vifs.len().div_ceil(64);
        *self = Index {
            slots: vec![Slot::default(); vifs.len()],
            active: vec![0; words],
            throttled: vec![0; words],
            due: vec![0; words],
            // Every cap was refilled by `configure`, later than the last decision: no refill
            // to that decision is owed.
            last_ready: vec![0; words],
            next_stamp: self.next_stamp,
            ..Index::default()
        };
        for (id, v) in vifs.iter().enumerate() {
            if let Some(cap) = v.cap.as_ref().filter(|c| !c.positive()) {
                set_bit(&mut self.throttled, id, true);
                self.arm_cap(id, cap.positive_at());
            }
            if v.active {
                set_bit(&mut self.active, id, true);
                self.place(vifs, id);
            }
        }
    }

    /// The vif to serve among `ready` at `now_ns` (the scan's choice), or `None` when no ready
    /// vif is eligible. Wakes, refills and advances the system virtual time as the scan does.
    pub(super) fn select(
        &mut self,
        core: &mut Core,
        ready: &ReadySet,
        now_ns: u64,
    ) -> Option<VifId> {
        let n = core.vifs.len();
        // Caps whose timer fell due: positive now (refilled when the vif is ready, as the scan
        // refills an empty cap only when it finds the vif ready), or re-armed.
        while let Some(&Reverse((at, id))) = self.cap_timers.peek() {
            if at > now_ns {
                break;
            }
            self.cap_timers.pop();
            self.slots[id].cap_timer = false;
            if !bit(&self.throttled, id) {
                continue;
            }
            if let Some(cap) = core.vifs[id].cap.as_ref() {
                match cap.positive_at() {
                    at if at > now_ns => self.arm_cap(id, at),
                    _ => set_bit(&mut self.due, id, true),
                }
            }
        }
        // Who is ready and eligible now, against who was at the last decision.
        let vtime = core.vtime;
        for w in 0..self.active.len() {
            let mask = match n - w * 64 {
                r if r >= 64 => u64::MAX,
                r => (1 << r) - 1,
            };
            let ready_w = ready.word(w) & mask;
            // Empty caps of vifs ready at the last decision but not now: the scan refilled
            // them at that decision.
            for id in bits(self.last_ready[w] & !ready_w & self.throttled[w], w) {
                self.refill_cap(core, id, self.last_select_ns);
            }
            for id in bits(ready_w & self.due[w], w) {
                set_bit(&mut self.due, id, false);
                self.refill_cap(core, id, now_ns);
            }
            self.last_ready[w] = ready_w;
            let eligible = ready_w & !self.throttled[w];
            let was = self.active[w];
            for id in bits(was & !eligible, w) {
                core.vifs[id].active = false;
                self.unplace(id);
            }
            for id in bits(eligible & !was, w) {
                let v = &mut core.vifs[id];
                v.active = true;
                if let Some(f) = v.floor.as_mut() {
                    f.refill(now_ns);
                }
                v.wake(vtime, core.max_batch_cost);
                self.place(&core.vifs, id);
            }
            self.active[w] = eligible;
        }
        self.last_select_ns = now_ns;
        // Floors in the fair tier whose timer fell due: into the floor tier, or re-armed.
        while let Some(&Reverse((at, id))) = self.floor_timers.peek() {
            if at > now_ns {
                break;
            }
            self.floor_timers.pop();
            self.slots[id].floor_timer = false;
            if !matches!(self.slots[id].place, Place::Fair { .. }) {
                continue;
            }
            let v = &mut core.vifs[id];
            let Some(f) = v.floor.as_mut() else {
                continue;
            };
            f.refill(now_ns);
            if f.positive() {
                self.unplace(id);
                self.place(&core.vifs, id);
            } else {
                self.arm_floor(id, f.positive_at());
            }
        }
        // The floor tier: most owed first, then the smallest tag, then the smallest id.
        let window = vtime + core.slack;
        let mut lowest: Option<(u128, VifId)> = None;
        let mut floor_pick: Option<(Reverse<u64>, u128, VifId)> = None;
        for &id in &self.floor_tier {
            let v = &mut core.vifs[id];
            if lowest.is_none_or(|l| (v.tag, id) < l) {
                lowest = Some((v.tag, id));
            }
            // A floor in the tier holds tokens (only charging and waking take them, and both
            // re-place the vif), so it is owed service.
            if let Some(owed) = v.floor.as_mut().and_then(|f| {
                f.refill(now_ns);
                owed_ns(f)
            }) {
                let key = (Reverse(owed), v.tag, id);
                if floor_pick.is_none_or(|b| key < b) {
                    floor_pick = Some(key);
                }
            }
        }
        // The fair tier: the most urgent priority whose smallest tag is within the window.
        let mut fair_pick: Option<VifId> = None;
        for (p, heap) in self.fair.iter_mut().enumerate() {
            if self.fair_live[p] == 0 {
                heap.clear();
                continue;
            }
            while let Some(&Reverse((tag, id, stamp))) = heap.peek() {
                if self.slots[id].place
                    == (Place::Fair {
                        priority: p as u8,
                        stamp,
                    })
                {
                    if lowest.is_none_or(|l| (tag, id) < l) {
                        lowest = Some((tag, id));
                    }
                    if fair_pick.is_none() && tag <= window {
                        fair_pick = Some(id);
                    }
                    break;
                }
                heap.pop();
            }
        }
        let (vmin, lowest_id) = lowest?;
        core.vtime = core.vtime.max(vmin);
        // If every tag has moved past the window, the smallest tag is served.
        Some(floor_pick.map(|k| k.2).or(fair_pick).unwrap_or(lowest_id))
    }

    /// Updates the index after `vif` was charged (its tag and buckets changed).
    pub(super) fn charged(&mut self, vifs: &[VifState], vif: VifId) {
        let Some(v) = vifs.get(vif) else {
            return;
        };
        if let Some(cap) = v.cap.as_ref() {
            // Charging refilled the cap: whatever was due is settled.
            set_bit(&mut self.due, vif, false);
            set_bit(&mut self.throttled, vif, !cap.positive());
            if !cap.positive() {
                self.arm_cap(vif, cap.positive_at());
            }
        }
        if v.active {
            self.unplace(vif);
            self.place(vifs, vif);
        }
    }

    /// The credit a stats reader sees in `vif`'s `cap`: the scan refilled an empty cap at every
    /// decision that found the vif ready, so one ready at the last decision reads as refilled
    /// to it (a vif ready before, but not at the last, was refilled when it stopped being).
    pub(super) fn cap_credit(&self, vif: VifId, cap: &TokenBucket) -> i64 {
        if !cap.positive() && vif / 64 < self.last_ready.len() && bit(&self.last_ready, vif) {
            let mut c = cap.clone();
            c.refill(self.last_select_ns);
            c.tokens()
        } else {
            cap.tokens()
        }
    }

    /// Vifs in the floor tier.
    #[cfg(test)]
    pub(super) fn floor_tier_len(&self) -> usize {
        self.floor_tier.len()
    }

    /// Entries in the fair heaps, live and stale.
    #[cfg(test)]
    pub(super) fn fair_entries(&self) -> usize {
        self.fair.iter().map(BinaryHeap::len).sum()
    }

    /// Refills `vif`'s cap to `at_ns` and re-reads whether it is empty.
    fn refill_cap(&mut self, core: &mut Core, vif: VifId, at_ns: u64) {
        if let Some(cap) = core.vifs[vif].cap.as_mut() {
            cap.refill(at_ns);
            set_bit(&mut self.throttled, vif, !cap.positive());
            if !cap.positive() {
                self.arm_cap(vif, cap.positive_at());
            }
        }
    }

    /// Places a vif just seen ready and eligible (or just charged) in its tier.
    fn place(&mut self, vifs: &[VifState], vif: VifId) {
        let v = &vifs[vif];
        if v.owed_floor() {
            self.slots[vif].place = Place::Floor {
                pos: self.floor_tier.len(),
            };
            self.floor_tier.push(vif);
            return;
        }
        let p = usize::from(v.priority);
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.fair[p].push(Reverse((v.tag, vif, stamp)));
        self.fair_live[p] += 1;
        self.slots[vif].place = Place::Fair {
            priority: v.priority,
            stamp,
        };
        if self.fair[p].len() > 2 * self.fair_live[p] + COMPACT_MARGIN {
            let slots = &self.slots;
            self.fair[p].retain(|&Reverse((_, id, stamp))| {
                matches!(slots[id].place, Place::Fair { stamp: s, .. } if s == stamp)
            });
        }
        if let Some(f) = v.floor.as_ref().filter(|f| f.rate_per_sec() > 0) {
            self.arm_floor(vif, f.positive_at());
        }
    }

    /// Takes a vif out of its tier (its fair entry, if any, goes stale).
    fn unplace(&mut self, vif: VifId) {
        match std::mem::take(&mut self.slots[vif].place) {
            Place::Idle => {}
            Place::Fair { priority, .. } => self.fair_live[usize::from(priority)] -= 1,
            Place::Floor { pos } => {
                self.floor_tier.swap_remove(pos);
                if let Some(&moved) = self.floor_tier.get(pos) {
                    self.slots[moved].place = Place::Floor { pos };
                }
            }
        }
    }

    /// Arms `vif`'s cap timer at `at_ns` unless one is armed (never later: see the module docs).
    fn arm_cap(&mut self, vif: VifId, at_ns: u64) {
        if !self.slots[vif].cap_timer {
            self.slots[vif].cap_timer = true;
            self.cap_timers.push(Reverse((at_ns, vif)));
        }
    }

    /// Arms `vif`'s floor timer at `at_ns` unless one is armed.
    fn arm_floor(&mut self, vif: VifId, at_ns: u64) {
        if !self.slots[vif].floor_timer {
            self.slots[vif].floor_timer = true;
            self.floor_timers.push(Reverse((at_ns, vif)));
        }
    }
}
