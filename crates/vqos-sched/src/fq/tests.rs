use proptest::prelude::*;

use super::*;

const MS: u64 = 1_000_000;

fn aqm() -> AqmParams {
    AqmParams::default()
}

/// A hash that `flow_of` maps to flow `f` of `n`.
fn hash_of(f: usize, n: usize) -> u32 {
    // The middle of flow f's range of hashes.
    (((2 * f + 1) as u64) << 31).div_ceil(n as u64) as u32
}

#[test]
fn hashes_spread_over_every_flow_and_a_flow_is_found_again() {
    let q: FlowQueues<()> = FlowQueues::new(64);
    let mut seen = [false; 64];
    for f in 0..64 {
        assert_eq!(q.flow_of(hash_of(f, 64)), f);
        seen[q.flow_of((f as u32).wrapping_mul(0x9e37_79b9))] = true;
    }
    assert_eq!(q.flow_of(0), 0);
    assert_eq!(q.flow_of(u32::MAX), 63);
    assert!(seen.iter().filter(|s| **s).count() > 32);
    assert_eq!(FlowQueues::<()>::new(0).flows(), 1);
    assert_eq!(FlowQueues::<()>::new(1 << 20).flows(), MAX_FLOWS);
}

#[test]
fn one_flow_is_a_fifo_with_the_codel_of_a_single_queue() {
    let mut q = FlowQueues::new(1);
    let mut codel = Codel::default();
    // A standing queue: 40 frames arrive in the first ms, one leaves every 500 µs.
    for i in 0..40u64 {
        q.push(i as u32 * 7919, i, 1538, i * 25_000);
    }
    let mut backlog = 40 * 1538;
    let mut signals = 0;
    for i in 0..40u64 {
        let now = MS + i * MS / 2;
        let p = q.pop(&aqm(), now).unwrap();
        assert_eq!((p.item, p.wire), (i, 1538));
        backlog -= 1538;
        let want = codel.on_dequeue(&aqm(), now - i * 25_000, 1538, backlog, now);
        assert_eq!(p.signal, want, "frame {i}");
        signals += u32::from(p.signal);
    }
    assert!(signals > 0, "the standing queue was never signalled");
    assert_eq!(q.pop(&aqm(), 100 * MS), None);
    assert!(q.is_empty());
}

#[test]
fn a_sparse_flow_leaves_before_a_bulk_backlog() {
    let mut q = FlowQueues::new(16);
    let bulk = hash_of(3, 16);
    for i in 0..100 {
        q.push(bulk, ("bulk", i), 1538, 0);
    }
    // The bulk flow is being served when the probe comes.
    for i in 0..10 {
        assert_eq!(q.pop(&aqm(), 10).unwrap().item, ("bulk", i));
    }
    q.push(hash_of(9, 16), ("probe", 0), 84, 20);
    let next = q.pop(&aqm(), 30).unwrap();
    assert_eq!(next.item, ("probe", 0));
    assert!(!next.signal);
    assert_eq!(q.pop(&aqm(), 40).unwrap().item, ("bulk", 10));
    assert_eq!(q.len(), 89);
}

#[test]
fn busy_flows_share_by_wire_bytes_not_by_frames() {
    let mut q = FlowQueues::new(8);
    let (big, small) = (hash_of(1, 8), hash_of(6, 8));
    for _ in 0..2_000 {
        q.push(big, 'b', 1538, 0);
        q.push(small, 's', 84, 0);
    }
    let (mut b, mut s) = (0u64, 0u64);
    for _ in 0..1_000 {
        match q.pop(&aqm(), 0).unwrap().item {
            'b' => b += 1538,
            _ => s += 84,
        }
    }
    // Within a quantum of each other, whatever their frame sizes.
    assert!(
        b.abs_diff(s) <= 2 * QUANTUM as u64,
        "big {b} B, small {s} B"
    );
}

#[test]
fn a_flow_that_keeps_coming_back_is_not_new_every_time() {
    // Flow B sends one full frame before every dequeue; it becomes an old flow and takes
    // turns with the backlogged flow A instead of starving it.
    let mut q = FlowQueues::new(8);
    let (a, b) = (hash_of(2, 8), hash_of(5, 8));
    for _ in 0..1_000 {
        q.push(a, 'a', 1538, 0);
    }
    let mut served_a = 0;
    for _ in 0..400 {
        q.push(b, 'b', 1538, 0);
        if q.pop(&aqm(), 0).unwrap().item == 'a' {
            served_a += 1;
        }
    }
    assert!(
        (180..=220).contains(&served_a),
        "A served {served_a} of 400"
    );
}

#[test]
fn overflow_takes_from_the_fattest_flow() {
    let mut q = FlowQueues::new(4);
    let (fat, thin) = (hash_of(0, 4), hash_of(3, 4));
    for i in 0..5 {
        q.push(fat, i, 1538, 0);
    }
    q.push(thin, 100, 1538, 0);
    q.push(thin, 101, 1538, 0);
    assert_eq!(q.fattest(), Some(0));
    assert_eq!(q.drop_fattest(), Some((0, 1538)));
    assert_eq!((q.len(), q.wire()), (6, 6 * 1538));
    let mut left: Vec<u32> = std::iter::from_fn(|| q.pop(&aqm(), 0).map(|p| p.item)).collect();
    left.sort_unstable();
    assert_eq!(left, [1, 2, 3, 4, 100, 101]);
    assert_eq!(q.drop_fattest(), None);
}

#[derive(Debug, Clone)]
enum Op {
    Push { flow: u8, wire: u16 },
    Pop { advance: u16 },
    Drop,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, 60u16..1600).prop_map(|(flow, wire)| Op::Push { flow, wire }),
        3 => (0u16..2000).prop_map(|advance| Op::Pop { advance }),
        1 => Just(Op::Drop),
    ]
}

proptest! {
    #![proptest_config(crate::proptest_config::config(256))]

    /// Nothing is lost or made up, each flow leaves in order, and the counts hold.
    #[test]
    fn conservation_and_order_within_each_flow(
        flows in 1usize..20,
        ops in proptest::collection::vec(op(), 1..400),
    ) {
        let mut q = FlowQueues::new(flows);
        let mut now = 0u64;
        let mut next_seq = [0u32; 12];
        let mut last_out: std::collections::HashMap<usize, u32> = Default::default();
        let (mut pushed, mut out) = (0usize, 0usize);
        let mut wire_in = 0u64;
        for op in ops {
            match op {
                Op::Push { flow, wire } => {
                    let f = usize::from(flow);
                    let hash = (f as u32).wrapping_mul(0x9e37_79b9);
                    q.push(hash, (f, next_seq[f]), u64::from(wire), now);
                    next_seq[f] += 1;
                    pushed += 1;
                    wire_in += u64::from(wire);
                }
                Op::Pop { advance } => {
                    now += u64::from(advance) * 1_000;
                    if let Some(p) = q.pop(&aqm(), now) {
                        let (f, seq) = p.item;
                        if let Some(&prev) = last_out.get(&f) {
                            prop_assert!(seq > prev, "flow {f}: {seq} after {prev}");
                        }
                        last_out.insert(f, seq);
                        out += 1;
                        wire_in -= p.wire;
                    } else {
                        prop_assert!(q.is_empty());
                    }
                }
                Op::Drop => {
                    if let Some(((f, seq), wire)) = q.drop_fattest() {
                        if let Some(&prev) = last_out.get(&f) {
                            prop_assert!(seq > prev);
                        }
                        last_out.insert(f, seq);
                        out += 1;
                        wire_in -= wire;
                    }
                }
            }
            prop_assert_eq!(q.len(), pushed - out);
            prop_assert_eq!(q.wire(), wire_in);
        }
        let rest = q.drain();
        prop_assert_eq!(rest.len(), pushed - out);
        prop_assert!(q.is_empty() && q.wire() == 0 && q.pop(&aqm(), now).is_none());
    }
}

/// Two flows of TSO super-frames, each with one frame behind its head, in a queue whose
/// frames wait 4 ms: CoDel weighs the whole queue's backlog (as fq_codel), so it signals; on
/// each flow's own backlog (one frame, "nothing behind") it never would.
#[test]
fn codel_weighs_the_whole_queues_backlog_not_the_flows() {
    let mut q = FlowQueues::new(8);
    let (a, b) = (hash_of(1, 8), hash_of(4, 8));
    let big = 65_536;
    for h in [a, b, a, b] {
        q.push(h, (), big, 0);
    }
    let mut signals = 0;
    for k in 1..=40u64 {
        let now = k * MS;
        let p = q.pop(&aqm(), now).unwrap();
        signals += u32::from(p.signal);
        // One frame leaves, one joins: four in all, a frame waits about 4 ms.
        q.push(if k % 2 == 1 { a } else { b }, (), big, now);
    }
    assert!(signals > 0, "never signalled a 4 ms standing queue");
}

/// A sender that fills one flow after another: each flow's room is given back as it drains,
/// so the queue's room stays within 16 per flow plus four per waiting item.
#[test]
fn flows_that_were_long_once_give_their_room_back() {
    let mut q = FlowQueues::new(64);
    for f in 0..64 {
        for i in 0..1024 {
            q.push(hash_of(f, 64), i, 1538, 0);
            if q.len() > 1024 {
                q.drop_fattest();
            }
        }
    }
    let room: usize = q.flows.iter().map(|f| f.items.capacity()).sum();
    assert!(
        room <= 16 * 64 + 4 * q.len(),
        "room for {room} entries, {} waiting",
        q.len()
    );
    while q.pop(&aqm(), 0).is_some() {}
    let room: usize = q.flows.iter().map(|f| f.items.capacity()).sum();
    assert!(
        room <= 16 * 64,
        "room for {room} entries with nothing waiting"
    );
}
