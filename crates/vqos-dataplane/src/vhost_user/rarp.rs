//! `VHOST_USER_SEND_RARP` (protocol feature `RARP`): after a live migration the destination
//! QEMU asks the backend to announce the guest, whose MAC the message carries, for guests
//! that cannot announce themselves (no `VIRTIO_NET_F_GUEST_ANNOUNCE`, which needs the control
//! queue this port does not offer).
//!
//! ## Behavior
//! As DPDK's vhost library does, the announce is a RARP frame (broadcast, EtherType 0x8035,
//! "reverse request" from the guest's MAC) put at the head of the port's next batch, as if the
//! guest had sent it: the switch handles it as any frame from the port. So port security
//! decides, and is not weakened: the MAC is learnt or locked only if the port may own it (its
//! own, a first-come lock with room, or one handed over to it by `vqos port migrate`, whose
//! hand-over it then completes); a hostile frontend's announce of another guest's MAC is
//! dropped and counted as `spoofed` on the port, and reaches no one. An accepted announce is
//! flooded, so the uplink's network learns where the guest now is.
//!
//! The `vhost` crate does not parse `SEND_RARP` (it refuses it as an unknown request, after
//! reading it whole): the session's request loop looks at each message's header first
//! (`MSG_PEEK`) and, when the crate refuses a `SEND_RARP`, applies it here and answers the
//! frontend's `NEED_REPLY` itself. A group or zero MAC is refused (`rarp_refused`, and a
//! failure in the reply). Several announces before the port is read make one frame.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use super::backend::Shared;
use super::counters::bump;
use crate::frame::{build_frame, is_group, MacKey, VnetHdr};
use crate::port::Batch;

/// `VHOST_USER_SEND_RARP`.
const SEND_RARP: u32 = 19;
/// Header flags: version 1.
const VERSION: u32 = 0x1;
/// Header flags: a reply.
const REPLY: u32 = 0x4;
/// Header flags: the frontend wants an acknowledgement.
const NEED_REPLY: u32 = 0x8;
/// Marks a pending announce in [`Shared::rarp`] (above the 48 bits of a MAC).
const PENDING: u64 = 1 << 63;

/// A `SEND_RARP` message at the head of a connection: the MAC, and whether to acknowledge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendRarp {
    /// The guest's MAC (the payload's first 6 bytes).
    pub(crate) mac: MacKey,
    /// `NEED_REPLY` was set.
    pub(crate) need_reply: bool,
}

/// Parses a peeked message (header and payload, 20 bytes) as a `SEND_RARP`.
pub(crate) fn parse(buf: &[u8; 20]) -> Option<SendRarp> {
    let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    if word(0) != SEND_RARP || word(8) != 8 {
        return None;
    }
    let mac = buf[12..18]
        .iter()
        .fold(0u64, |m, &b| (m << 8) | u64::from(b));
    Some(SendRarp {
        mac,
        need_reply: word(4) & NEED_REPLY != 0,
    })
}

/// Applies a `SEND_RARP` the `vhost` crate read and refused: queues the announce (a unicast,
/// non-zero MAC) and wakes the loop; acknowledges on `fd` if asked.
pub(crate) fn apply(shared: &Shared, fd: RawFd, msg: SendRarp) {
    let ok = msg.mac != 0 && !is_group(msg.mac);
    if ok {
        shared.rarp.store(msg.mac | PENDING, Ordering::Release);
        bump(&shared.counters.rarp_announces, 1);
        shared.ready.signal();
    } else {
        bump(&shared.counters.rarp_refused, 1);
    }
    if msg.need_reply {
        let mut reply = Vec::with_capacity(20);
        for w in [SEND_RARP, VERSION | REPLY, 8] {
            reply.extend_from_slice(&w.to_le_bytes());
        }
        reply.extend_from_slice(&u64::from(!ok).to_le_bytes());
        // SAFETY: sends from a live buffer on the session's socket; a failure ends the session
        // at the next read.
        unsafe {
            libc::send(fd, reply.as_ptr().cast(), reply.len(), libc::MSG_NOSIGNAL);
        }
    }
}

/// Whether an announce waits to be read.
pub(crate) fn pending(shared: &Shared) -> bool {
    shared.rarp.load(Ordering::Acquire) != 0
}

/// Puts the pending announce, if any, in `batch` (before the guest's frames); 1 if it did.
pub(crate) fn take(shared: &Shared, batch: &mut Batch) -> usize {
    if shared.rarp.load(Ordering::Relaxed) == 0 || batch.is_full() {
        return 0;
    }
    let mac = shared.rarp.swap(0, Ordering::AcqRel) & !PENDING;
    usize::from(mac != 0 && batch.push(&frame(mac)))
}

/// The announce of `mac`: a RARP reverse request from it, broadcast.
pub(crate) fn frame(mac: MacKey) -> Vec<u8> {
    let m = &mac.to_be_bytes()[2..];
    let mut p = vec![0, 1, 0x08, 0x00, 6, 4, 0, 3];
    for _ in 0..2 {
        p.extend_from_slice(m);
        p.extend_from_slice(&[0; 4]);
    }
    p.resize(46, 0);
    build_frame(VnetHdr::default(), 0xff_ff_ff_ff_ff_ff, mac, 0x8035, &p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_send_rarp_and_builds_the_announce() {
        let mut buf = [0u8; 20];
        for (i, w) in [SEND_RARP, VERSION | NEED_REPLY, 8].iter().enumerate() {
            buf[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        buf[12..18].copy_from_slice(&[2, 0, 0, 0, 0, 0x0a]);
        let msg = parse(&buf).unwrap();
        assert_eq!(msg.mac, 0x02_00_00_00_00_0a);
        assert!(msg.need_reply);
        buf[8] = 4;
        assert_eq!(parse(&buf), None, "wrong size");
        let f = frame(0x02_00_00_00_00_0a);
        let eth = &f[crate::frame::VNET_HDR_LEN..];
        assert_eq!(&eth[..6], &[0xff; 6]);
        assert_eq!(&eth[6..12], &[2, 0, 0, 0, 0, 0x0a]);
        assert_eq!(&eth[12..14], &[0x80, 0x35]);
        assert_eq!(&eth[20..22], &[0, 3], "reverse request");
        assert_eq!(&eth[22..28], &eth[6..12], "sender hardware address");
        assert!(crate::frame::validate(&f).is_ok());
    }
}
