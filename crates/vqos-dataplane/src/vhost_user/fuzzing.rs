//! Fuzzing support (not a stable API; used by `fuzz/fuzz_targets/vhost_rings.rs`): the data
//! path of a vhost-user port, without a socket, over guest memory whose bytes — descriptor
//! tables, avail rings, buffers — come from the fuzzer.

use vhost_user_backend::{VringRwLock, VringT};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};

use super::backend::{Health, Shared};
use super::datapath::{Ctx, DataPath};
use super::features::OFFERED_FEATURES;
use super::VhostUserConfig;
use crate::frame::{build_frame, VnetHdr, FRAME_BUF_BYTES};
use crate::port::{Batch, PortIoCounters};

/// Bytes of guest memory.
const MEM_BYTES: u64 = 0x1_0000;
/// Largest ring size.
const MAX_SIZE: u16 = 64;
/// Rings of queue `q` (0: guest RX, 1: guest TX): descriptor table, avail ring, used ring,
/// packed into the first 4 KiB (the guest TX ring first) so that short inputs reach them.
const fn rings(q: u64) -> (u64, u64, u64) {
    if q == 1 {
        (0x000, 0x400, 0xa00)
    } else {
        (0x500, 0x900, 0xe00)
    }
}

/// Runs the data path over guest memory built from `data` and panics if an invariant breaks:
/// `data[0..8]` masks the offered features, `data[8]` picks the ring size (1 to 64, a power
/// of two) and event-index use, `data[9]` splits memory into two regions (adjacent or with a
/// hole) or not, `data[10]` how many bursts; the rest fills guest memory from address 0 (see
/// `rings`: both queues' rings lie in the first 4 KiB). Each burst reads
/// the guest's TX ring and writes a few frames to its RX ring; every chain taken must be a frame
/// or a counted misbehaviour, and no frame may exceed a batch buffer. Returns the frames read
/// from the guest and written to it.
pub fn run_rings(data: &[u8]) -> (u64, u64) {
    if data.len() < 11 {
        return (0, 0);
    }
    let features = OFFERED_FEATURES & u64::from_le_bytes(data[..8].try_into().unwrap_or([0; 8]));
    let size = 1u16 << (data[8] % 7);
    let event_idx = data[8] & 0x80 != 0;
    let split = 0x8000 + 0x1000 * u64::from(data[9] % 8);
    let hole = 0x1000 * u64::from((data[9] >> 3) % 2);
    let ranges: Vec<(GuestAddress, usize)> = if data[9] & 0x80 != 0 {
        vec![(GuestAddress(0), MEM_BYTES as usize)]
    } else {
        vec![
            (GuestAddress(0), split as usize),
            (GuestAddress(split + hole), (MEM_BYTES - split) as usize),
        ]
    };
    let Ok(m) = GuestMemoryMmap::from_ranges(&ranges) else {
        return (0, 0);
    };
    let body = &data[11..];
    let first = body.len().min(split as usize);
    let _ = m.write_slice(&body[..first], GuestAddress(0));
    let mem = GuestMemoryAtomic::new(m);
    let Ok(shared) = Shared::new("fuzz", VhostUserConfig::server("/nonexistent/fuzz.sock")) else {
        return (0, 0);
    };
    let vrings: Vec<VringRwLock> = (0..2)
        .filter_map(|q| {
            let v = VringRwLock::new(mem.clone(), MAX_SIZE).ok()?;
            let (d, a, u) = rings(q);
            v.set_queue_size(size);
            v.set_queue_info(d, a, u).ok()?;
            v.set_queue_event_idx(event_idx);
            v.set_queue_ready(true);
            v.set_enabled(true);
            Some(v)
        })
        .collect();
    if vrings.len() != 2 {
        return (0, 0);
    }
    let mut out = Batch::new();
    for i in 0..4u8 {
        out.push(&build_frame(
            VnetHdr::default(),
            2,
            4,
            0x0800,
            &vec![i; 60 + 500 * usize::from(i)],
        ));
    }
    let mut dp = DataPath::default();
    let health = Health::default();
    let mut io = PortIoCounters::default();
    let mut batch = Batch::new();
    for _ in 0..1 + data[10] % 4 {
        let snapshot = mem.memory();
        let tx_avail = vrings[1].queue_next_avail();
        let bad_before = shared.counters.snapshot().malformed();
        batch.clear();
        let n = dp.recv(
            &Ctx {
                shared: &shared,
                vrings: Some(&vrings),
                mem: &snapshot,
                health: &health,
                features,
                log: None,
            },
            (1, u64::MAX),
            &shared.ready,
            &mut batch,
            32,
            &mut io,
        );
        assert!(n <= 32 && n == batch.len());
        for f in 0..n {
            assert!(batch.frame(f).len() < FRAME_BUF_BYTES);
        }
        let taken = vrings[1].queue_next_avail().wrapping_sub(tx_avail);
        let bad = shared.counters.snapshot().malformed() - bad_before;
        if !health.is_quarantined() {
            assert_eq!(u64::from(taken), n as u64 + bad);
        }
        let sent = dp.send(
            &Ctx {
                shared: &shared,
                vrings: Some(&vrings),
                mem: &snapshot,
                health: &health,
                features,
                log: None,
            },
            0,
            &out,
            &[0, 1, 2, 3],
            &mut io,
        );
        assert!(sent <= 4);
        if health.is_quarantined() {
            break;
        }
    }
    (io.rx_frames, io.tx_frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_ring_and_arbitrary_bytes_run_without_panic() {
        // One TX chain: descriptor 0 → 72 bytes at 0x7c00, published (avail idx 1, ring[0] 0).
        let mut data = vec![0xffu8; 8];
        data.extend([4u8, 0x80, 1]); // ring of 16, one region, two bursts
        let mut mem = vec![0u8; 0x1000];
        let (d, a, _) = rings(1);
        mem[d as usize..d as usize + 8].copy_from_slice(&0x7c00u64.to_le_bytes());
        mem[d as usize + 8..d as usize + 12].copy_from_slice(&72u32.to_le_bytes());
        mem[a as usize + 2] = 1;
        data.extend(mem);
        assert_eq!(run_rings(&data).0, 1);
        // And noise.
        let noise: Vec<u8> = (0..0x9000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        run_rings(&noise);
    }

    #[test]
    fn the_committed_seeds_run_clean() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/vhost_rings");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let (read, _) = run_rings(&std::fs::read(&path).unwrap());
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let want = match name.as_str() {
                "one-frame" | "split-hdr-hole" | "legacy" => Some(1),
                "two-frames-two-regions" | "event-idx-small-ring" => Some(2),
                "loop" => Some(0),
                _ => None,
            };
            if let Some(want) = want {
                assert_eq!(read, want, "{name}");
            }
            seen += 1;
        }
        assert!(seen >= 5, "{seen} seeds");
    }
}
