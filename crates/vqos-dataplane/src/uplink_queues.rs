//! The uplink's queues ([`UplinkQueues`]): what the network sends steered to the queue of the
//! vif it is for ([`crate::tap_steer`], shard 0 keeps the map), and each vif's queue read
//! within a budget of its inbound max ([`crate::tap_budget`]) by whichever shard reads it:
//! shard 0 for the queues it keeps, another shard for the queue lent to it
//! ([`crate::Port::rx_queue`]). Both need a multiqueue TAP uplink.

use std::collections::HashMap;

use crate::frame::MacKey;
use crate::port::PortError;
use crate::switch::Switch;
use crate::tap_steer::{queue_of, Steering};

/// A shard's part in the uplink's queues.
#[derive(Debug)]
pub(crate) struct UplinkQueues {
    /// The steering program's map, or why the uplink is not steered (`Ok(None)`: one queue,
    /// not a TAP, or another shard).
    pub steering: Result<Option<Steering>, String>,
    /// The uplink's queues when its arrivals are steered by destination and this shard
    /// reads some of them (shard 0: those it keeps; another: the one lent to it).
    steered_queues: Option<usize>,
    /// Some queue has a read budget.
    budgeted: bool,
    /// When a queue held for its budget is read again.
    pub wake_at: Option<u64>,
}

impl UplinkQueues {
    /// What [`crate::Port::steer_by_destination`] gave.
    pub fn new(steering: Result<Option<Steering>, PortError>) -> UplinkQueues {
        let steering = steering.map_err(|e| vqos_api::chain(&e));
        UplinkQueues {
            steered_queues: steering
                .as_ref()
                .ok()
                .and_then(Option::as_ref)
                .map(Steering::queues),
            steering,
            budgeted: false,
            wake_at: None,
        }
    }

    /// Another shard's part: it reads the queue lent to it (`reads`) of an uplink whose
    /// queues shard 0's `home` steers.
    pub fn for_reader(home: &UplinkQueues, reads: bool) -> UplinkQueues {
        UplinkQueues {
            steering: Ok(None),
            steered_queues: home.steered_queues.filter(|_| reads),
            budgeted: false,
            wake_at: None,
        }
    }
}

impl Switch {
    /// Steers the uplink's arrivals by destination to the queues of the vifs the MAC table
    /// places them on (shard 0, once a second). A failed update is counted and tried again at
    /// the next.
    pub(crate) fn steer_uplink(&mut self, now_ns: u64) {
        let Ok(Some(steering)) = &mut self.uplink_queues.steering else {
            return;
        };
        let want: HashMap<MacKey, u32> = self
            .addrs
            .lock()
            .macs
            .placed(now_ns)
            .filter(|&(_, slot)| slot != 0)
            .map(|(mac, slot)| (mac, steering.queue_of(usize::from(slot))))
            .collect();
        if steering.sync(&want).is_err() {
            steering.errors += 1;
        }
    }

    /// Gives each steered uplink queue that carries one vif alone a read budget of that
    /// vif's inbound max (none where it has none). A queue two vifs share has none: a
    /// flood toward one would spend the budget and the kernel's FIFO would drop the other's
    /// frames with it, where unbudgeted the switch reads both and the downlink's queues keep
    /// them apart. Queue 0 (group and unknown destinations) has none. Called with every
    /// policy change, on every shard: each budgets the queues it reads (a queue is read by
    /// one shard alone, so its budget is the vif's whole inbound max).
    pub(crate) fn budget_uplink(&mut self, now_ns: u64) {
        let Some(queues) = self.uplink_queues.steered_queues else {
            return;
        };
        // Per queue: how many vifs, and the inbound max of the last one.
        let mut per_queue: Vec<(usize, Option<u64>)> = vec![(0, None); queues];
        for (id, spec) in self.policies.vifs.iter().enumerate() {
            let q = &mut per_queue[queue_of(queues, self.vif_slots[id]) as usize];
            *q = (q.0 + 1, spec.policy.inbound_max_bps(self.downlink_max));
        }
        let max: Vec<Option<u64>> = per_queue
            .iter()
            .enumerate()
            .map(|(q, &(vifs, max))| max.filter(|_| q != 0 && vifs == 1))
            .collect();
        self.uplink_queues.budgeted = max.iter().any(Option::is_some);
        if let Some(up) = self.ports.get(0) {
            let mut port = up.port.lock();
            port.budget_rx_queues(&max, now_ns);
            // A queue whose budget went is read again at once.
            self.uplink_queues.wake_at = port.refill_rx_budgets(now_ns);
        }
    }

    /// Refills the uplink queues' read budgets (every poll while any has one).
    pub(crate) fn refill_uplink(&mut self, now_ns: u64) {
        if !self.uplink_queues.budgeted && self.uplink_queues.wake_at.is_none() {
            return;
        }
        if let Some(up) = self.ports.get(0) {
            self.uplink_queues.wake_at = up.port.lock().refill_rx_budgets(now_ns);
        }
    }

    /// How the uplink's arrivals are steered: `Ok(Some(n))` to the queues of `n` stations'
    /// vifs, `Ok(None)` by the kernel's flow hash (one queue, or not a TAP), `Err` why a
    /// multiqueue TAP could not be steered (no eBPF: arrivals keep the flow hash).
    pub fn uplink_steering(&self) -> Result<Option<usize>, &str> {
        match &self.uplink_queues.steering {
            Ok(s) => Ok(s.as_ref().map(Steering::len)),
            Err(e) => Err(e),
        }
    }
}
