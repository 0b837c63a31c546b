//! Random guest rings (fixed seed, no socket) over guest memory of one region or two (adjacent
//! or with a hole): the data path never panics, never reads past a batch buffer, never takes
//! more than the ring offered, and every chain it consumes is either a frame or a counted
//! misbehaviour.

use std::sync::atomic::Ordering;

use vhost_user_backend::{VringRwLock, VringT};
use vm_memory::GuestAddressSpace;
use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

use super::backend::{Health, Shared};
use super::datapath::{Ctx, DataPath};
use super::features::OFFERED_FEATURES;
use super::VhostUserConfig;
use crate::frame::{build_frame, VnetHdr, FRAME_BUF_BYTES};
use crate::port::{Batch, PortIoCounters};

/// Guest memory size.
const MEM: u64 = 0x4_0000;
/// Ring size.
const SIZE: u16 = 64;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Ring addresses of queue `q`: descriptor table, avail ring, used ring.
fn ring(q: u64) -> (u64, u64, u64) {
    let base = 0x1000 + q * 0x2000;
    (base, base + 0x400, base + 0x800)
}

fn vring(mem: &GuestMemoryAtomic<GuestMemoryMmap>, q: u64, event_idx: bool) -> VringRwLock {
    let v = VringRwLock::new(mem.clone(), SIZE).unwrap();
    let (d, a, u) = ring(q);
    v.set_queue_size(SIZE);
    v.set_queue_info(d, a, u).unwrap();
    v.set_queue_event_idx(event_idx);
    v.set_queue_ready(true);
    v.set_enabled(true);
    v
}

/// Fills queue `q`'s descriptor table and avail ring with hostile-ish values and publishes up
/// to a ring and a bit beyond `next_avail`.
fn scribble(rng: &mut Rng, mem: &GuestMemoryMmap, q: u64, next_avail: u16) {
    let (d, a, _) = ring(q);
    for i in 0..u64::from(SIZE) {
        let addr = match rng.below(8) {
            0 => rng.next(),
            1 => MEM - rng.below(64),
            _ => 0x8000 + rng.below(MEM - 0x9000),
        };
        let len: u32 = match rng.below(8) {
            0 => 0,
            1 => u32::MAX,
            2 => rng.below(70_000) as u32,
            _ => 1 + rng.below(1600) as u32,
        };
        let flags = rng.below(8) as u16;
        let next = rng.below(u64::from(SIZE) + 8) as u16;
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&raw, GuestAddress(d + 16 * i)).unwrap();
        let head = rng.below(u64::from(SIZE) + 4) as u16;
        mem.write_obj(head.to_le(), GuestAddress(a + 4 + 2 * i))
            .unwrap();
    }
    let ahead = rng.below(u64::from(SIZE) + 3) as u16;
    mem.write_obj(next_avail.wrapping_add(ahead).to_le(), GuestAddress(a + 2))
        .unwrap();
}

/// Guest memory of `MEM` bytes: one region in even rounds; in odd ones two, split at a random
/// page after the rings, adjacent or with a one-page hole between them (buffers then cross
/// region boundaries and run into holes).
fn memory(rng: &mut Rng, round: u32) -> GuestMemoryMmap {
    if round % 2 == 0 {
        return GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
    }
    let split = 0x8000 + 0x1000 * rng.below((MEM - 0x9000) / 0x1000);
    let hole = 0x1000 * rng.below(2);
    GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), split as usize),
        (GuestAddress(split + hole), (MEM - split - hole) as usize),
    ])
    .unwrap()
}

#[test]
fn random_rings_are_survived_and_accounted_for() {
    let mut rng = Rng(0x005e_ed0f_7a11_u64);
    let shared = Shared::new("fuzz", VhostUserConfig::server("/nonexistent/fuzz.sock")).unwrap();
    let mut dp = DataPath::default();
    let mut io = PortIoCounters::default();
    let mut out = Batch::new();
    for i in 0..8u8 {
        let mut h = VnetHdr::default();
        if i % 3 == 0 {
            h.flags = crate::frame::VNET_F_NEEDS_CSUM;
        }
        let payload = vec![i; 60 + 300 * usize::from(i)];
        assert!(out.push(&build_frame(h, 2, 4, 0x0800, &payload)));
    }
    let mut batch = Batch::new();
    for round in 0..400 {
        let features = OFFERED_FEATURES & rng.next();
        let atomic = GuestMemoryAtomic::new(memory(&mut rng, round));
        let vrings = vec![
            vring(&atomic, 0, rng.below(2) == 0),
            vring(&atomic, 1, rng.below(2) == 0),
        ];
        let health = Health::default();
        for _ in 0..4 {
            let mem = atomic.memory();
            let tx_avail = vrings[1].queue_next_avail();
            scribble(&mut rng, &mem, 1, tx_avail);
            scribble(&mut rng, &mem, 0, vrings[0].queue_next_avail());
            let before = shared.counters.snapshot();
            let frames_before = io.rx_frames;
            batch.clear();
            let max = 1 + rng.below(32) as usize;
            let n = dp.recv(
                &Ctx {
                    shared: &shared,
                    vrings: Some(&vrings),
                    mem: &mem,
                    health: &health,
                    features,
                    log: None,
                },
                (1, u64::MAX),
                &shared.ready,
                &mut batch,
                max,
                &mut io,
            );
            assert!(n <= max && n == batch.len(), "round {round}");
            assert_eq!(io.rx_frames - frames_before, n as u64);
            for f in 0..n {
                assert!(batch.frame(f).len() < FRAME_BUF_BYTES);
            }
            // Every chain taken is a frame or a counted misbehaviour (or quarantine).
            let taken = vrings[1].queue_next_avail().wrapping_sub(tx_avail);
            let after = shared.counters.snapshot();
            let bad = after.malformed() - before.malformed();
            if !health.is_quarantined() {
                assert_eq!(u64::from(taken), n as u64 + bad, "round {round}");
            }
            let k = rng.below(12) as usize;
            let idx: Vec<u8> = (0..k).map(|_| rng.below(8) as u8).collect();
            let sent = dp.send(
                &Ctx {
                    shared: &shared,
                    vrings: Some(&vrings),
                    mem: &mem,
                    health: &health,
                    features,
                    log: None,
                },
                0,
                &out,
                &idx,
                &mut io,
            );
            assert!(sent <= idx.len());
            if health.is_quarantined() {
                break;
            }
        }
    }
    let c = shared.counters.snapshot();
    // The run met every kind of misbehaviour (so the test exercises what it claims).
    assert!(c.head_out_of_range > 0 && c.next_out_of_range > 0 && c.chain_loop > 0);
    assert!(c.zero_length_desc > 0 && c.bad_desc_address > 0 && c.wrong_direction_desc > 0);
    assert!(c.indirect_desc > 0 && c.bad_avail_index > 0 && c.quarantines > 0);
    assert!(io.rx_frames > 0 && io.tx_frames > 0, "{io:?}");
    assert!(shared.io[0].load(Ordering::Relaxed) == io.rx_frames);
}
