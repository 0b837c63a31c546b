//! [`Steering`]: what the network sends into a multiqueue TAP uplink goes to the queue of the
//! vif it is for, so that a flood toward one vif fills that vif's queue and no other.
//!
//! ## Why
//! The kernel puts each frame the host sends into a TAP on one queue; with no program it
//! picks by flow hash. Frames for every vif then share the same few queues, and a queue that
//! overflows drops what arrives whatever it is for: a 64-byte flood from the network toward a
//! capped vif took its neighbours' TCP acknowledgements with it (they kept 33–37 % of their
//! rate with one queue, issue 27). Steered by destination, the flood fills its vif's queue
//! only: the kernel drops the excess there, at no cost to the switch's core, and the reader,
//! which takes the queues in turn, reaches the other vifs' frames at once.
//!
//! ## Behavior
//! - A socket-filter eBPF program attached with `TUNSETSTEERINGEBPF` reads the destination MAC
//!   and looks it up in a hash map (MAC → queue) that the switch fills; the kernel takes the
//!   program's answer modulo the queues. Group and unknown destinations go to queue 0.
//! - [`Steering::sync`] makes the map what the switch's MAC table says (the switch calls it
//!   with every address a vif owns about once a second, [`Steering::queue_of`] its slot): a new
//!   station is steered within a second, before which its frames take queue 0.
//! - One program per TAP: attaching replaces whatever a previous run left, and the program
//!   stays with the TAP until the next start replaces it (the TAP is read by nobody between).
//!
//! ## Why by hand
//! The program is 16 instructions, encoded here (`PROGRAM`), and loaded with the `bpf(2)`
//! system call. A compiled object would need clang with a BPF target (not on a stock Debian
//! host) and a loader crate (aya, libbpf-rs) for one map and one program.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::frame::MacKey;

/// Most MACs steered; beyond, new stations take queue 0 ([`Steering::sync`] counts them).
pub const MAX_STEERED: u32 = 16_384;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy)]
#[repr(C)]
struct Insn {
    code: u8,
    /// dst in the low nibble, src in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// The map's descriptor goes into instruction `MAP_INSN`'s immediate.
const MAP_INSN: usize = 6;

/// The program: r0 = map[dst MAC] or 0. `LD_ABS` reads the frame (big-endian, as
/// [`MacKey`] packs it) with the context in r6 and ends the program with 0 past its end.
const PROGRAM: [Insn; 16] = [
    insn(0xbf, 6, 1, 0, 0),   // r6 = r1 (the frame)
    insn(0x28, 0, 0, 0, 0),   // r0 = octets 0..2
    insn(0xbf, 7, 0, 0, 0),   // r7 = r0
    insn(0x67, 7, 0, 0, 32),  // r7 <<= 32
    insn(0x20, 0, 0, 0, 2),   // r0 = octets 2..6
    insn(0x4f, 7, 0, 0, 0),   // r7 |= r0: the MacKey
    insn(0x18, 1, 1, 0, 0),   // r1 = the map (BPF_PSEUDO_MAP_FD, 2 slots)
    insn(0x00, 0, 0, 0, 0),   //
    insn(0x7b, 10, 7, -8, 0), // *(u64 *)(r10 - 8) = r7
    insn(0xbf, 2, 10, 0, 0),  // r2 = r10
    insn(0x07, 2, 0, 0, -8),  // r2 += -8: the key
    insn(0x85, 0, 0, 0, 1),   // call bpf_map_lookup_elem
    insn(0x15, 0, 0, 2, 0),   // if r0 == 0 goto +2
    insn(0x61, 0, 0, 0, 0),   // r0 = *(u32 *)r0: the queue
    insn(0x95, 0, 0, 0, 0),   // exit
    insn(0x95, 0, 0, 0, 0),   // exit (r0 = 0: queue 0)
];

/// `bpf(2)` with `attr` of type `A`.
fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: attr is a live, initialised `union bpf_attr` prefix of the size given.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, size_of::<A>()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
}

#[repr(C)]
struct MapElem {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
}

/// The queue, of a TAP's `queues`, that what is for port slot `slot` (a vif's, from 1) is
/// steered to: the slots in turn over queues 1 and up, queue 0 being for group and unknown
/// destinations. Every shard computes it alike ([`Steering::queue_of`]).
pub fn queue_of(queues: usize, slot: usize) -> u32 {
    match queues {
        0 | 1 => 0,
        n => (1 + slot.saturating_sub(1) % (n - 1)) as u32,
    }
}

/// The steering of one TAP: its map and program, and what the map holds. Dropping it
/// detaches the program (the TAP's arrivals go back to the kernel's flow hash).
#[derive(Debug)]
pub struct Steering {
    /// A descriptor of the TAP (a `dup` of one of its queues), to detach the program.
    tap: OwnedFd,
    map: OwnedFd,
    /// The program (the TAP holds its own reference once attached).
    _prog: OwnedFd,
    /// MAC → queue, as the map holds it.
    held: HashMap<MacKey, u32>,
    /// The TAP's queues.
    queues: usize,
    /// Stations not steered for want of room, at the last sync.
    pub left_out: usize,
    /// Syncs that failed (tried again at the next).
    pub errors: u64,
}

impl Steering {
    /// Loads the program and attaches it to the TAP of `queues` queues that `tap_fd` is a
    /// queue of. Needs CAP_BPF (or CAP_SYS_ADMIN) and CAP_NET_ADMIN.
    pub fn attach(tap_fd: RawFd, queues: usize) -> io::Result<Steering> {
        // SAFETY: dup of a descriptor the caller holds open; checked below.
        let tap = unsafe { libc::fcntl(tap_fd, libc::F_DUPFD_CLOEXEC, 0) };
        if tap < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor, ours.
        let tap = unsafe { OwnedFd::from_raw_fd(tap) };
        let mut create = MapCreate {
            map_type: BPF_MAP_TYPE_HASH,
            key_size: 8,
            value_size: 4,
            max_entries: MAX_STEERED,
        };
        // SAFETY: a new descriptor the kernel just returned.
        let map = unsafe { OwnedFd::from_raw_fd(bpf(BPF_MAP_CREATE, &mut create)? as RawFd) };
        let mut code = PROGRAM;
        code[MAP_INSN].imm = map.as_raw_fd();
        let mut log = vec![0u8; 4096];
        let license = c"Apache-2.0";
        let mut load = ProgLoad {
            prog_type: BPF_PROG_TYPE_SOCKET_FILTER,
            insn_cnt: code.len() as u32,
            insns: code.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 1,
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
        };
        let prog = bpf(BPF_PROG_LOAD, &mut load).map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let verifier = String::from_utf8_lossy(&log[..end]);
            io::Error::new(e.kind(), format!("BPF_PROG_LOAD: {e}: {}", verifier.trim()))
        })?;
        // SAFETY: as above.
        let prog = unsafe { OwnedFd::from_raw_fd(prog as RawFd) };
        let fd: libc::c_int = prog.as_raw_fd();
        // SAFETY: TUNSETSTEERINGEBPF reads an int through the pointer, which is live.
        if unsafe { libc::ioctl(tap_fd, libc::TUNSETSTEERINGEBPF, &fd) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("TUNSETSTEERINGEBPF: {e}")));
        }
        Ok(Steering {
            tap,
            map,
            _prog: prog,
            held: HashMap::new(),
            queues: queues.max(1),
            left_out: 0,
            errors: 0,
        })
    }

    /// The queue of what is for port slot `slot` (a vif's, from 1): the slots in turn over
    /// queues 1 and up, queue 0 being for group and unknown destinations.
    pub fn queue_of(&self, slot: usize) -> u32 {
        queue_of(self.queues, slot)
    }

    /// Makes the map hold `want` (MAC → queue): adds, moves and removes entries, one system
    /// call each. Returns the changes made.
    pub fn sync(&mut self, want: &HashMap<MacKey, u32>) -> io::Result<usize> {
        let mut changes = 0;
        let gone: Vec<MacKey> = self
            .held
            .keys()
            .filter(|k| !want.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            self.elem(BPF_MAP_DELETE_ELEM, key, 0)?;
            self.held.remove(&key);
            changes += 1;
        }
        self.left_out = 0;
        for (&key, &queue) in want {
            if self.held.get(&key) == Some(&queue) {
                continue;
            }
            if !self.held.contains_key(&key) && self.held.len() >= MAX_STEERED as usize {
                // No room: not asked again of the kernel until an entry goes.
                self.left_out += 1;
                continue;
            }
            match self.elem(BPF_MAP_UPDATE_ELEM, key, queue) {
                Ok(()) => {
                    self.held.insert(key, queue);
                    changes += 1;
                }
                Err(e) if e.raw_os_error() == Some(libc::E2BIG) => self.left_out += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(changes)
    }

    /// The TAP's queues.
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// MACs steered now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True when no MAC is steered.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Detaches whatever steering program TAP queue `tap_fd` has (one a previous run left
    /// steering by a map nobody updates any more); an error if the kernel refuses.
    pub fn detach(tap_fd: RawFd) -> io::Result<()> {
        let none: libc::c_int = -1;
        // SAFETY: TUNSETSTEERINGEBPF reads an int through the pointer, which is live.
        if unsafe { libc::ioctl(tap_fd, libc::TUNSETSTEERINGEBPF, &none) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn elem(&self, cmd: libc::c_long, key: MacKey, queue: u32) -> io::Result<()> {
        let mut attr = MapElem {
            map_fd: self.map.as_raw_fd() as u32,
            pad: 0,
            key: &key as *const MacKey as u64,
            // A delete must leave the fields past its key zero (the kernel checks).
            value: if cmd == BPF_MAP_UPDATE_ELEM {
                &queue as *const u32 as u64
            } else {
                0
            },
            flags: 0,
        };
        bpf(cmd, &mut attr).map(|_| ())
    }
}

impl Drop for Steering {
    fn drop(&mut self) {
        // Nothing else can be done about a refusal: the next start attaches anew.
        let _ = Self::detach(self.tap.as_raw_fd());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{build_frame, mac_key, VnetHdr, VNET_HDR_LEN};
    use crate::port::{Batch, Port};
    use crate::tap::{TapMode, TapPort};
    use crate::tap_uring::TapIo;

    /// Sends `frame` into TAP `name` from the host's side (an AF_PACKET socket on it), as the
    /// network would.
    fn send_from_host(name: &str, frame: &[u8]) {
        let cname = std::ffi::CString::new(name).unwrap();
        // SAFETY: plain calls on a descriptor owned here; every pointer outlives its call.
        unsafe {
            let ifindex = libc::if_nametoindex(cname.as_ptr());
            assert!(ifindex > 0, "no interface {name}");
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
            assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
            let fd = OwnedFd::from_raw_fd(fd);
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_ifindex = ifindex as i32;
            sll.sll_halen = 6;
            let r = libc::sendto(
                fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(r, frame.len() as isize, "{}", io::Error::last_os_error());
        }
    }

    /// Which of the TAP's queues `frame` (sent from the host) lands in; the kernel's own
    /// frames (IPv6 router solicitations on a new link) are not counted.
    fn lands_in(tap: &mut TapPort, frame: &[u8]) -> usize {
        send_from_host(tap.name(), frame);
        let mut hits = Vec::new();
        for _ in 0..100 {
            for q in 0..tap.queue_count() {
                let mut batch = Batch::new();
                let n = tap.recv_queue(q, &mut batch).unwrap();
                if (0..n).any(|i| &batch.frame(i)[VNET_HDR_LEN..] == frame) {
                    hits.push(q);
                }
            }
            if !hits.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(hits.len(), 1, "the frame was read from queues {hits:?}");
        hits[0]
    }

    #[test]
    fn frames_from_the_host_land_in_the_queue_of_their_destination() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP: needs root");
            return;
        }
        let name = format!("vqt{}q", std::process::id() % 100_000);
        let mut tap = TapPort::open_queues(&name, TapMode::Create, TapIo::Syscall, 4).unwrap();
        let mut steer = tap.steer_by_destination().unwrap().expect("4 queues steer");
        let (a, b) = (0x02_00_00_00_0a_01u64, 0x02_00_00_00_0b_02u64);
        let frame = |dst: MacKey| {
            let f = build_frame(
                VnetHdr::default(),
                dst,
                0x02_00_00_00_00_99,
                0x0800,
                &[7; 46],
            );
            f[VNET_HDR_LEN..].to_vec()
        };
        assert_eq!(mac_key(&frame(a)[..6]), a);
        let want: HashMap<MacKey, u32> = [(a, 2), (b, 3)].into();
        assert_eq!(steer.sync(&want).unwrap(), 2);
        assert_eq!(steer.len(), 2);
        // Each to its own queue, again and again (no flow hash decides).
        for _ in 0..4 {
            assert_eq!(lands_in(&mut tap, &frame(a)), 2);
            assert_eq!(lands_in(&mut tap, &frame(b)), 3);
        }
        // Unknown and group destinations: queue 0.
        assert_eq!(lands_in(&mut tap, &frame(0x02_00_00_00_0c_03)), 0);
        assert_eq!(lands_in(&mut tap, &frame(0xff_ff_ff_ff_ff_ff)), 0);
        // A station moved, one gone: the map follows, nothing else changes.
        let want: HashMap<MacKey, u32> = [(a, 1)].into();
        assert_eq!(steer.sync(&want).unwrap(), 2);
        assert_eq!(steer.sync(&want).unwrap(), 0, "nothing left to change");
        assert_eq!(lands_in(&mut tap, &frame(a)), 1);
        assert_eq!(lands_in(&mut tap, &frame(b)), 0);
        // Vifs' slots over queues 1..=3 in turn; queue 0 is for group and unknown ones.
        let queues: Vec<u32> = (1..=7).map(|s| steer.queue_of(s)).collect();
        assert_eq!(queues, [1, 2, 3, 1, 2, 3, 1]);
        // Sixteen flows (distinct IPv4 addresses) to one station steered to queue 3: all in 3.
        let flows: Vec<Vec<u8>> = (0..16u8)
            .map(|i| {
                let mut f = frame(a);
                f[14..34].copy_from_slice(&[
                    0x45, 0, 0, 46, 0, 0, 0, 0, 64, 17, 0, 0, 10, 9, 0, i, 10, 9, 1, i,
                ]);
                f
            })
            .collect();
        steer.sync(&[(a, 3)].into()).unwrap();
        assert!(flows.iter().all(|f| lands_in(&mut tap, f) == 3));
        // Dropped, the program goes: the flows are spread by their hash again (all sixteen in
        // queue 3 by chance: one in 4^16).
        drop(steer);
        let landed: Vec<usize> = flows.iter().map(|f| lands_in(&mut tap, f)).collect();
        assert!(landed.iter().any(|&q| q != 3), "still steered: {landed:?}");
    }

    /// True when the port's readiness descriptor (its epoll set) says frames wait.
    fn ready(port: &dyn Port) -> bool {
        let mut fds = libc::pollfd {
            fd: port.readiness_fd().unwrap(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd, no wait.
        unsafe { libc::poll(&mut fds, 1, 0) == 1 }
    }

    /// 300 frames of 1514 bytes wait in queue `q` of a four-queue TAP, read by `port` (the TAP
    /// itself, or the queue it lent); its budget is 10 Mbit/s (a 256 KiB burst: 171 of them,
    /// the 172nd overdraws). Read to the budget and one frame past it, then held out of the
    /// port's epoll set until earned back, then read again; everything once it is lifted.
    fn held_until_earned(tap_name: &str, port: &mut dyn Port, q: usize) {
        let f = build_frame(
            VnetHdr::default(),
            0x02_00_00_00_0a_01,
            0x02_00_00_00_00_99,
            0x0800,
            &[7; 1500],
        );
        for _ in 0..300 {
            send_from_host(tap_name, &f[VNET_HDR_LEN..]);
        }
        let mut max = [None; 4];
        max[q] = Some(10_000_000);
        port.budget_rx_queues(&max, 0);
        let read = |port: &dyn Port| match port.status() {
            Some(crate::port::PortStatus::Tap(s)) => s.queue_rx_frames[q] as usize,
            other => panic!("{other:?}"),
        };
        while port.recv_batch(&mut Batch::new(), 32).unwrap() > 0 {}
        let burst = (256 * 1024) / (1514 + VNET_HDR_LEN);
        assert_eq!(
            read(port),
            burst + 1,
            "read up to the budget and one frame past it"
        );
        assert!(ready(port), "not held before the refill");
        // Held: out of the set, though frames wait; nothing more is read.
        let wake = port.refill_rx_budgets(0).expect("held until a time");
        assert!(!ready(port), "a held queue wakes no one");
        assert_eq!(port.recv_batch(&mut Batch::new(), 32).unwrap(), 0);
        // Earned back at `wake`: in the set again, read again.
        assert_eq!(port.refill_rx_budgets(wake - 1), Some(wake));
        assert_eq!(port.refill_rx_budgets(wake), None);
        assert!(ready(port));
        assert_eq!(port.recv_batch(&mut Batch::new(), 1).unwrap(), 1);
        assert_eq!(read(port), burst + 2);
        // The budget lifted: everything left is read.
        port.budget_rx_queues(&[None; 4], wake);
        assert_eq!(port.refill_rx_budgets(wake), None);
        while port.recv_batch(&mut Batch::new(), 32).unwrap() > 0 {}
        assert_eq!(read(port), 300);
        let Some(crate::port::PortStatus::Tap(s)) = port.status() else {
            unreachable!()
        };
        assert_eq!(s.budget_holds, 1);
    }

    #[test]
    fn a_queue_past_its_budget_is_held_out_of_the_epoll_set_until_earned_back() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP: needs root");
            return;
        }
        let name = format!("vqt{}b", std::process::id() % 100_000);
        let mut tap = TapPort::open_queues(&name, TapMode::Create, TapIo::Syscall, 4).unwrap();
        let mut steer = tap.steer_by_destination().unwrap().unwrap();
        // (The kernel's own frames, IPv6 solicitations, go to queue 0.)
        steer.sync(&[(0x02_00_00_00_0a_01, 1)].into()).unwrap();
        held_until_earned(&name, &mut tap, 1);
    }

    /// The same for the queue a TAP lent to another shard ([`Port::rx_queue`]): its reader
    /// holds it out of an epoll set of its own, so its loop is not woken for it.
    #[test]
    fn a_lent_queue_past_its_budget_is_held_by_its_reader() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP: needs root");
            return;
        }
        let name = format!("vqt{}l", std::process::id() % 100_000);
        let tap = TapPort::open_queues(&name, TapMode::Create, TapIo::Syscall, 4).unwrap();
        let mut steer = tap.steer_by_destination().unwrap().unwrap();
        steer.sync(&[(0x02_00_00_00_0a_01, 3)].into()).unwrap();
        let mut lent = tap.rx_queue().unwrap().expect("queue 3 lent");
        held_until_earned(&name, lent.as_mut(), 3);
    }

    #[test]
    fn a_single_queue_tap_is_not_steered() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP: needs root");
            return;
        }
        let name = format!("vqt{}r", std::process::id() % 100_000);
        let tap = TapPort::open(&name, TapMode::Create).unwrap();
        assert!(tap.steer_by_destination().unwrap().is_none());
    }
}
