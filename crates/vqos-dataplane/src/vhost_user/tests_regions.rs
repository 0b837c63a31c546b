//! Guest memory in several regions (no socket): buffers across a region boundary, a chain
//! whose buffers move between regions (the cached region no longer holds the next one), a
//! buffer running into a hole, a ring across two regions, the legacy header widened inside a
//! split buffer, one used-index publication per burst, and TX kicks under busy polling.

use vhost_user_backend::{VringRwLock, VringT};
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
};

use super::backend::{Health, Shared};
use super::datapath::{Ctx, DataPath};
use super::dirty::DirtyLog;
use super::features::{F_EVENT_IDX, F_MRG_RXBUF, F_VERSION_1};
use super::VhostUserConfig;
use crate::frame::{build_frame, VnetHdr};
use crate::port::{Batch, PortIoCounters};

/// Ring size.
pub(super) const SIZE: u16 = 16;
/// First region: [0, 64 KiB); the second is adjacent: [64 KiB, 128 KiB); the third lies after
/// a hole: [192 KiB, 256 KiB).
const BOUNDARY: u64 = 0x1_0000;
/// Start of the third region (the hole is [128 KiB, 192 KiB)).
const AFTER_HOLE: u64 = 0x3_0000;
/// Descriptor flags.
pub(super) const NEXT: u16 = 1;
pub(super) const WRITE: u16 = 2;

/// Ring addresses of queue `q` (0: guest RX, 1: guest TX): descriptor table, avail, used.
pub(super) fn ring(q: u64) -> (u64, u64, u64) {
    let base = 0x1000 + q * 0x1000;
    (base, base + 0x400, base + 0x800)
}

/// A guest over three regions, with the port's data path.
pub(super) struct Guest {
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    pub(super) vrings: Vec<VringRwLock>,
    pub(super) shared: Shared,
    pub(super) dp: DataPath,
    /// The dirty log the data path marks (a live migration), if any.
    pub(super) log: Option<DirtyLog>,
    health: Health,
    io: PortIoCounters,
    features: u64,
    /// Next avail index the guest writes, per queue.
    avail_idx: Vec<u16>,
}

impl Guest {
    pub(super) fn new(features: u64) -> Guest {
        Self::with_rings(features, &[ring(0), ring(1)])
    }

    /// A guest with the rings at `rings` (two per queue pair).
    pub(super) fn with_rings(features: u64, rings: &[(u64, u64, u64)]) -> Guest {
        let m = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), BOUNDARY as usize),
            (GuestAddress(BOUNDARY), BOUNDARY as usize),
            (GuestAddress(AFTER_HOLE), BOUNDARY as usize),
        ])
        .unwrap();
        let mem = GuestMemoryAtomic::new(m);
        let vrings = rings
            .iter()
            .map(|&(d, a, u)| {
                let v = VringRwLock::new(mem.clone(), SIZE).unwrap();
                v.set_queue_size(SIZE);
                v.set_queue_info(d, a, u).unwrap();
                v.set_queue_event_idx(features & F_EVENT_IDX != 0);
                v.set_queue_ready(true);
                v.set_enabled(true);
                v
            })
            .collect();
        Guest {
            mem,
            vrings,
            shared: Shared::new(
                "regions",
                VhostUserConfig {
                    queues: (rings.len() / 2) as u16,
                    ..VhostUserConfig::server("/nonexistent/r.sock")
                },
            )
            .unwrap(),
            dp: DataPath::default(),
            log: None,
            health: Health::default(),
            io: PortIoCounters::default(),
            features,
            avail_idx: vec![0; rings.len()],
        }
    }

    pub(super) fn set_desc(&self, q: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        let m = self.mem.memory();
        m.write_slice(&raw, GuestAddress(ring(q).0 + 16 * u64::from(i)))
            .unwrap();
    }

    pub(super) fn publish(&mut self, q: u64, head: u16) {
        let (_, a, _) = ring(q);
        let idx = &mut self.avail_idx[q as usize];
        let m = self.mem.memory();
        m.write_obj(
            head.to_le(),
            GuestAddress(a + 4 + 2 * u64::from(*idx % SIZE)),
        )
        .unwrap();
        *idx = idx.wrapping_add(1);
        m.write_obj(idx.to_le(), GuestAddress(a + 2)).unwrap();
    }

    /// Where guest-physical `gpa` is mapped in this process (benchmarks write the rings
    /// through it, without `vm-memory`'s per-access lookups).
    pub(super) fn host_ptr(&self, gpa: u64) -> *mut u8 {
        self.mem
            .memory()
            .get_host_address(GuestAddress(gpa))
            .unwrap()
    }

    /// Writes `bytes` at `addr` (across regions if need be).
    pub(super) fn write(&self, addr: u64, bytes: &[u8]) {
        self.mem
            .memory()
            .write_slice(bytes, GuestAddress(addr))
            .unwrap();
    }

    pub(super) fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .memory()
            .read_slice(&mut v, GuestAddress(addr))
            .unwrap();
        v
    }

    pub(super) fn used_idx(&self, q: u64) -> u16 {
        let m = self.mem.memory();
        u16::from_le(m.read_obj(GuestAddress(ring(q).2 + 2)).unwrap())
    }

    pub(super) fn used_flags(&self, q: u64) -> u16 {
        let m = self.mem.memory();
        u16::from_le(m.read_obj(GuestAddress(ring(q).2)).unwrap())
    }

    /// Used element `pos` of queue `q`: (head, len).
    pub(super) fn used(&self, q: u64, pos: u16) -> (u16, u32) {
        let e = self.read(ring(q).2 + 4 + 8 * u64::from(pos % SIZE), 8);
        let id = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
        (id as u16, u32::from_le_bytes([e[4], e[5], e[6], e[7]]))
    }

    pub(super) fn recv(&mut self, batch: &mut Batch) -> usize {
        batch.clear();
        self.recv_max(batch, 32)
    }

    /// Reads up to `max` more frames into `batch`, from every TX queue not lent (what the
    /// port reads).
    pub(super) fn recv_max(&mut self, batch: &mut Batch, max: usize) -> usize {
        let mine = !self.shared.lent.load(std::sync::atomic::Ordering::Relaxed);
        self.recv_from(batch, max, mine, None)
    }

    /// Reads up to `max` more frames into `batch` from the TX queues of `mine` (a bit per
    /// pair), waking `pair`'s readiness eventfd (`None`: the port's).
    pub(super) fn recv_from(
        &mut self,
        batch: &mut Batch,
        max: usize,
        mine: u64,
        pair: Option<usize>,
    ) -> usize {
        let mem = self.mem.memory();
        let ready = pair.map_or(&self.shared.ready, |p| self.shared.ready_of(p));
        self.dp.recv(
            &Ctx {
                shared: &self.shared,
                vrings: Some(&self.vrings),
                mem: &mem,
                health: &self.health,
                features: self.features,
                log: self.log.as_ref(),
            },
            (self.vrings.len() / 2, mine),
            ready,
            batch,
            max,
            &mut self.io,
        )
    }

    pub(super) fn send(&mut self, batch: &Batch, indices: &[u8]) -> usize {
        self.send_on(0, batch, indices)
    }

    /// Writes frames on the RX queue of `pair`.
    pub(super) fn send_on(&mut self, pair: usize, batch: &Batch, indices: &[u8]) -> usize {
        let mem = self.mem.memory();
        self.dp.send(
            &Ctx {
                shared: &self.shared,
                vrings: Some(&self.vrings),
                mem: &mem,
                health: &self.health,
                features: self.features,
                log: self.log.as_ref(),
            },
            pair,
            batch,
            indices,
            &mut self.io,
        )
    }
}

pub(super) fn frame(tag: u8, len: usize) -> Vec<u8> {
    build_frame(
        VnetHdr::default(),
        0x02_00_00_00_00_0b,
        2,
        0x0800,
        &vec![tag; len],
    )
}

#[test]
fn a_buffer_across_two_adjacent_regions_is_read_whole() {
    let mut g = Guest::new(F_VERSION_1);
    let f = frame(7, 500);
    let at = BOUNDARY - 100;
    g.write(at, &f);
    g.set_desc(1, 0, at, f.len() as u32, 0, 0);
    g.publish(1, 0);
    let mut b = Batch::new();
    assert_eq!(g.recv(&mut b), 1);
    assert_eq!(b.frame(0), &f[..]);
    assert_eq!(g.shared.counters.snapshot().malformed(), 0);
}

#[test]
fn a_chain_moving_between_regions_is_read_in_order() {
    // The first buffer fills the cache with the first region, the second lies in the second
    // region, the third in the first again, the fourth after the hole.
    let mut g = Guest::new(F_VERSION_1);
    let f = frame(9, 300);
    let parts = [(0x8000, 40), (BOUNDARY + 0x100, 100), (0x9000, 60)];
    let mut off = 0;
    for (i, &(addr, len)) in parts.iter().enumerate() {
        g.write(addr, &f[off..off + len]);
        g.set_desc(1, i as u16, addr, len as u32, NEXT, i as u16 + 1);
        off += len;
    }
    g.write(AFTER_HOLE + 8, &f[off..]);
    g.set_desc(1, 3, AFTER_HOLE + 8, (f.len() - off) as u32, 0, 0);
    g.publish(1, 0);
    let mut b = Batch::new();
    assert_eq!(g.recv(&mut b), 1);
    assert_eq!(b.frame(0), &f[..]);
}

#[test]
fn a_buffer_running_into_a_hole_is_a_bad_address_and_the_next_frame_flows() {
    let mut g = Guest::new(F_VERSION_1);
    // Starts in the second region, ends in the hole after it.
    g.set_desc(1, 0, 2 * BOUNDARY - 50, 200, 0, 0);
    g.publish(1, 0);
    // Starts in the hole.
    g.set_desc(1, 1, 2 * BOUNDARY + 10, 60, 0, 0);
    g.publish(1, 1);
    let f = frame(1, 60);
    g.write(0x8000, &f);
    g.set_desc(1, 2, 0x8000, f.len() as u32, 0, 0);
    g.publish(1, 2);
    let mut b = Batch::new();
    assert_eq!(g.recv(&mut b), 1);
    assert_eq!(b.frame(0), &f[..]);
    let c = g.shared.counters.snapshot();
    assert_eq!((c.bad_desc_address, c.malformed()), (2, 2), "{c:?}");
    // All three chains went back in one burst: one used-index store covering them.
    assert_eq!(g.used_idx(1), 3);
    assert_eq!(
        (g.used(1, 0), g.used(1, 1), g.used(1, 2)),
        ((0, 0), (1, 0), (2, 0))
    );
}

#[test]
fn an_oversized_chain_beyond_memory_is_a_bad_address() {
    let mut g = Guest::new(F_VERSION_1);
    g.set_desc(1, 0, 0x8000, u32::MAX, 0, 0);
    g.publish(1, 0);
    let mut b = Batch::new();
    assert_eq!(g.recv(&mut b), 0);
    let c = g.shared.counters.snapshot();
    assert_eq!((c.bad_desc_address, c.oversized_chain), (1, 0));
}

#[test]
fn a_receive_buffer_across_two_regions_gets_the_frame_whole() {
    let mut g = Guest::new(F_VERSION_1 | F_MRG_RXBUF);
    let at = BOUNDARY - 30;
    g.set_desc(0, 0, at, 2048, WRITE, 0);
    g.publish(0, 0);
    let f = frame(3, 700);
    let mut b = Batch::new();
    b.push(&f);
    assert_eq!(g.send(&b, &[0]), 1);
    let mut want = f.clone();
    want[10] = 1; // num_buffers
    assert_eq!(g.read(at, f.len()), want);
    assert_eq!((g.used_idx(0), g.used(0, 0)), (1, (0, f.len() as u32)));
}

#[test]
fn a_legacy_header_is_widened_inside_a_buffer_across_regions() {
    // No VERSION_1, no MRG_RXBUF: the guest's header is 10 bytes; header and frame in one
    // buffer that a region boundary cuts inside the header.
    let mut g = Guest::new(0);
    let f = frame(5, 80);
    let mut guest = f[..10].to_vec();
    guest.extend_from_slice(&f[12..]);
    let at = BOUNDARY - 4;
    g.write(at, &guest);
    g.set_desc(1, 0, at, guest.len() as u32, 0, 0);
    g.publish(1, 0);
    let mut b = Batch::new();
    assert_eq!(g.recv(&mut b), 1);
    assert_eq!(b.frame(0), &f[..]);
}

#[test]
fn a_ring_across_two_regions_quarantines() {
    let (_, a, u) = ring(1);
    let straddling = (BOUNDARY - 8 * 16, a, u);
    let mut g = Guest::with_rings(F_VERSION_1, &[ring(0), straddling]);
    g.publish(1, 0);
    let mut b = Batch::new();
    assert_eq!(g.recv(&mut b), 0);
    let c = g.shared.counters.snapshot();
    assert_eq!((c.bad_ring_address, c.quarantines), (1, 1));
    assert!(g.health.is_quarantined());
}

#[test]
fn many_frames_one_used_index_store_and_tx_kicks_follow_the_polling_mode() {
    for busy in [false, true] {
        let mut g = Guest::new(F_VERSION_1);
        g.dp.busy_poll = busy;
        for i in 0..5u16 {
            let f = frame(i as u8, 60);
            let at = 0x8000 + 0x800 * u64::from(i);
            g.write(at, &f);
            g.set_desc(1, i, at, f.len() as u32, 0, 0);
            g.publish(1, i);
        }
        let mut b = Batch::new();
        assert_eq!(g.recv(&mut b), 5);
        assert_eq!(g.used_idx(1), 5);
        for i in 0..5u16 {
            assert_eq!(g.used(1, i), (i, 0));
        }
        // Drained: kicks back on in epoll mode; under busy polling they stay off.
        assert_eq!(g.used_flags(1), u16::from(busy), "busy {busy}");
        if busy {
            // The guest reset its ring (flags cleared): the next burst turns kicks off again.
            g.write(ring(1).2, &[0, 0]);
            assert_eq!(g.recv(&mut b), 0);
            assert_eq!(g.used_flags(1), 1);
        }
    }
}
