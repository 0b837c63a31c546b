//! Flow queues inside one vif's downlink queue: FQ-CoDel's structure (RFC 8290), so that a
//! sparse flow (a probe, a DNS answer, an interactive session) does not wait behind a bulk
//! transfer to the same vif, and CoDel acts on each flow's own standing queue.
//!
//! ## Behavior
//! - **Flows.** An arrival goes to the flow queue its caller's hash picks among `flows`
//!   (multiply-shift of the 32-bit hash: no modulo). The caller hashes what makes a flow (the
//!   data plane: addresses, protocol and ports, with a seed of its own so that a sender
//!   cannot aim at a victim's flow queue). One flow queue is exactly a FIFO with one CoDel:
//!   `flows = 1` is the per-vif queue of before.
//! - **New and old flows.** A flow queue that was empty joins the *new* list with a quantum
//!   of credit ([`QUANTUM`], one full-sized frame on the wire). New flows are served before
//!   old ones; a flow that spends its credit goes to the end of the *old* list with a fresh
//!   quantum (deficit round robin by wire bytes between the flows that stay busy). A new flow
//!   that empties moves to the old list (when it is not empty) rather than leaving, so a flow
//!   that sends one frame each round cannot stay "new" forever and starve the old ones; an
//!   old flow that empties leaves.
//! - **CoDel per flow.** Each frame leaving is judged by its own flow's CoDel on its sojourn
//!   time; the backlog it weighs ("more than this frame behind it") is the whole queue's, as
//!   in Linux's fq_codel. The caller marks CE or drops on a signal.
//! - **Overflow.** [`FlowQueues::drop_fattest`] takes the head of the flow holding the most
//!   bytes (RFC 8290 §4.1): the flow that fills the queue pays for it, not a newcomer. The
//!   caller queues an arrival first and then drops until the queue is within its bound, as
//!   Linux does.
//!
//! ## Memory
//! The flow queues are allocated at the first arrival: `flows` × `size_of::<Flow<T>>()` (96
//! bytes for the data plane's frames). Their entries (the item, its wire bytes and arrival
//! time: 40 bytes for the data plane) take at most `16 × flows + 4 × items waiting` entries'
//! room: a flow queue that empties or shrinks gives back what it held beyond that, so a
//! sender that fills one flow after another cannot make every flow keep a long queue's room.

use std::collections::VecDeque;

use crate::aqm::{AqmParams, Codel};

/// Most flow queues one queue may have.
pub const MAX_FLOWS: usize = 1024;

/// Flow queues per vif unless configured.
pub const DEFAULT_FLOWS: usize = 64;

/// A flow's credit per round, wire bytes: one 1514-byte Ethernet frame with its FCS,
/// preamble and inter-frame gap.
pub const QUANTUM: i64 = 1538;

/// Which list a flow queue is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum List {
    #[default]
    None,
    New,
    Old,
}

/// One waiting item.
#[derive(Debug)]
struct Entry<T> {
    item: T,
    wire: u64,
    at_ns: u64,
}

/// One flow queue.
#[derive(Debug)]
struct Flow<T> {
    items: VecDeque<Entry<T>>,
    /// Wire bytes waiting.
    wire: u64,
    /// Credit left this round, wire bytes.
    deficit: i64,
    codel: Codel,
    list: List,
}

impl<T> Default for Flow<T> {
    fn default() -> Self {
        Flow {
            items: VecDeque::new(),
            wire: 0,
            deficit: 0,
            codel: Codel::default(),
            list: List::None,
        }
    }
}

/// An item leaving: it, its wire bytes, and whether its flow's CoDel signals it (CE if
/// ECN-capable, else drop).
#[derive(Debug, PartialEq, Eq)]
pub struct Popped<T> {
    /// The item.
    pub item: T,
    /// Its wire bytes.
    pub wire: u64,
    /// CoDel's signal.
    pub signal: bool,
}

/// The flow queues of one queue; see the module docs.
#[derive(Debug)]
pub struct FlowQueues<T> {
    /// The flow queues (empty until the first arrival).
    flows: Vec<Flow<T>>,
    /// How many there are once allocated.
    count: usize,
    /// Flows with credit that were idle before (served first).
    new: VecDeque<u16>,
    /// Busy flows, in round-robin order.
    old: VecDeque<u16>,
    /// Items waiting, all flows.
    len: usize,
    /// Wire bytes waiting, all flows.
    wire: u64,
}

impl<T> Default for FlowQueues<T> {
    fn default() -> Self {
        FlowQueues::new(DEFAULT_FLOWS)
    }
}

impl<T> FlowQueues<T> {
    /// `flows` flow queues (taken into 1..=[`MAX_FLOWS`]).
    pub fn new(flows: usize) -> Self {
        FlowQueues {
            flows: Vec::new(),
            count: flows.clamp(1, MAX_FLOWS),
            new: VecDeque::new(),
            old: VecDeque::new(),
            len: 0,
            wire: 0,
        }
    }

    /// How many flow queues.
    pub fn flows(&self) -> usize {
        self.count
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Wire bytes waiting.
    pub fn wire(&self) -> u64 {
        self.wire
    }

    /// The flow queue of `hash`.
    pub fn flow_of(&self, hash: u32) -> usize {
        ((u64::from(hash) * self.count as u64) >> 32) as usize
    }

    /// Queues `item` (`wire` bytes on the wire, arrived at `at_ns`) on the flow of `hash`.
    pub fn push(&mut self, hash: u32, item: T, wire: u64, at_ns: u64) {
        if self.flows.is_empty() {
            self.flows.resize_with(self.count, Flow::default);
        }
        let f = self.flow_of(hash);
        let flow = &mut self.flows[f];
        flow.items.push_back(Entry { item, wire, at_ns });
        flow.wire += wire;
        self.len += 1;
        self.wire += wire;
        if flow.list == List::None {
            flow.list = List::New;
            flow.deficit = QUANTUM;
            // count ≤ MAX_FLOWS fits u16.
            self.new.push_back(f as u16);
        }
    }

    /// The next item to leave at `now_ns` (module docs), judged by its flow's CoDel under
    /// `aqm`; `None` when nothing waits.
    pub fn pop(&mut self, aqm: &AqmParams, now_ns: u64) -> Option<Popped<T>> {
        loop {
            let (f, from_new) = match (self.new.front(), self.old.front()) {
                (Some(&f), _) => (usize::from(f), true),
                (None, Some(&f)) => (usize::from(f), false),
                (None, None) => return None,
            };
            let list = if from_new {
                &mut self.new
            } else {
                &mut self.old
            };
            let flow = &mut self.flows[f];
            if flow.deficit <= 0 {
                flow.deficit += QUANTUM;
                list.pop_front();
                flow.list = List::Old;
                self.old.push_back(f as u16);
                continue;
            }
            let Some(e) = flow.items.pop_front() else {
                list.pop_front();
                if from_new && !self.old.is_empty() {
                    flow.list = List::Old;
                    self.old.push_back(f as u16);
                } else {
                    flow.list = List::None;
                }
                continue;
            };
            flow.wire -= e.wire;
            trim(&mut flow.items);
            flow.deficit -= i64::try_from(e.wire).unwrap_or(i64::MAX);
            self.len -= 1;
            self.wire -= e.wire;
            let sojourn = now_ns.saturating_sub(e.at_ns);
            // The backlog CoDel weighs is the whole queue's, as Linux's fq_codel does: with
            // TSO super-frames a flow often has less than one of them behind its head, and
            // judged on its own backlog its CoDel would hardly ever signal (measured: a tenth
            // of the marks, bigger windows, longer queues; docs/benchmarks.md).
            let signal = flow
                .codel
                .on_dequeue(aqm, sojourn, e.wire, self.wire, now_ns);
            return Some(Popped {
                item: e.item,
                wire: e.wire,
                signal,
            });
        }
    }

    /// The flow queue holding the most wire bytes (the lowest among equals), if any waits.
    pub fn fattest(&self) -> Option<usize> {
        (0..self.flows.len())
            .filter(|&f| !self.flows[f].items.is_empty())
            .max_by_key(|&f| (self.flows[f].wire, std::cmp::Reverse(f)))
    }

    /// Takes the oldest item of the fattest flow (to make room: RFC 8290 §4.1), with its
    /// wire bytes. The flow stays on its list until it is next visited.
    pub fn drop_fattest(&mut self) -> Option<(T, u64)> {
        let f = self.fattest()?;
        let flow = &mut self.flows[f];
        let e = flow.items.pop_front()?;
        flow.wire -= e.wire;
        trim(&mut flow.items);
        self.len -= 1;
        self.wire -= e.wire;
        Some((e.item, e.wire))
    }

    /// Takes every waiting item out (oldest first within each flow); the flows start over.
    pub fn drain(&mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.len);
        for flow in &mut self.flows {
            out.extend(flow.items.drain(..).map(|e| e.item));
            *flow = Flow::default();
        }
        self.new.clear();
        self.old.clear();
        self.len = 0;
        self.wire = 0;
        out
    }
}

/// Entries a flow queue keeps room for however short it gets.
const KEEP: usize = 16;

/// Gives back what a flow queue's storage holds beyond twice its length (at least [`KEEP`])
/// once it holds more than four times: a flow that was long once does not keep its room, so
/// the room of all of a queue's flows stays within `KEEP × flows + 4 × frames` entries.
fn trim<T>(items: &mut VecDeque<T>) {
    let cap = items.capacity();
    if cap > KEEP && cap > 4 * items.len() {
        items.shrink_to((2 * items.len()).max(KEEP));
    }
}

#[cfg(test)]
mod tests;
