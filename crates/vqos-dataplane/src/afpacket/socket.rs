//! The packet sockets under an [`AfPacketPort`](super::AfPacketPort): a reader or a
//! transmit queue on one interface, its options, and the fanout group its readers share.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::{io_err, AfPacketOptions, LEGACY_VNET_HDR_LEN, ONE};
use crate::frame::VNET_HDR_LEN;
use crate::port::PortError;
use crate::tap::set_link_up;

/// `PACKET_FANOUT_FLAG_UNIQUEID` (Linux ≥ 4.12): the kernel picks a free group id.
const FANOUT_FLAG_UNIQUEID: libc::c_uint = 0x2000;

/// `setsockopt(fd, level, opt, &value)`.
pub(super) fn setsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: the option value is a live `T` of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A `sockaddr_ll` with every field zero.
pub(super) fn sockaddr_ll_zeroed() -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// A packet socket on interface `ifindex` set up per `opts`, and the header size the kernel
/// uses: a reader (`receive`: every frame of the interface, promiscuous) or a transmit queue
/// (no frame is queued on it).
pub(super) fn socket(
    name: &str,
    ifindex: u32,
    opts: AfPacketOptions,
    receive: bool,
) -> Result<(OwnedFd, usize), PortError> {
    // Protocol 0: nothing is queued until the socket is bound below.
    // SAFETY: socket() has no memory arguments; checked below.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io_err(name, "socket(AF_PACKET)"));
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    let sol = libc::SOL_PACKET;
    let hdr12 = VNET_HDR_LEN as libc::c_int;
    let vnet_hdr_bytes = if !opts.legacy_vnet_hdr
        && setsockopt(raw, sol, libc::PACKET_VNET_HDR_SZ, &hdr12).is_ok()
    {
        VNET_HDR_LEN
    } else {
        setsockopt(raw, sol, libc::PACKET_VNET_HDR, &ONE)
            .map_err(|source| op_err(name, "PACKET_VNET_HDR", source))?;
        LEGACY_VNET_HDR_LEN
    };
    // Before Linux 4.20 this option does not exist; the packet type check in
    // `recv_batch` skips those frames then.
    if receive {
        let _ = setsockopt(raw, sol, libc::PACKET_IGNORE_OUTGOING, &ONE);
    }
    if opts.qdisc_bypass {
        setsockopt(raw, sol, libc::PACKET_QDISC_BYPASS, &ONE)
            .map_err(|source| op_err(name, "PACKET_QDISC_BYPASS", source))?;
    }
    for (force, plain, bytes, op) in [
        (
            libc::SO_RCVBUFFORCE,
            libc::SO_RCVBUF,
            opts.rcvbuf_bytes,
            "SO_RCVBUF",
        ),
        (
            libc::SO_SNDBUFFORCE,
            libc::SO_SNDBUF,
            opts.sndbuf_bytes,
            "SO_SNDBUF",
        ),
    ] {
        if !receive && force == libc::SO_RCVBUFFORCE {
            continue;
        }
        let v = bytes.min(i32::MAX as usize / 2) as libc::c_int;
        if setsockopt(raw, libc::SOL_SOCKET, force, &v).is_err() {
            setsockopt(raw, libc::SOL_SOCKET, plain, &v)
                .map_err(|source| op_err(name, op, source))?;
        }
    }
    // Up before the bind: a socket bound to a link that is down starts with a pending
    // ENETDOWN, which its first send or receive would report. (A transmit queue's link is
    // up: its reader brought it up.)
    if receive {
        set_link_up(name)?;
    }
    let mut addr = sockaddr_ll_zeroed();
    addr.sll_family = libc::AF_PACKET as libc::c_ushort;
    // Protocol 0 for a transmit queue: bound to the interface, it is handed no frame.
    addr.sll_protocol = if receive {
        (libc::ETH_P_ALL as u16).to_be()
    } else {
        0
    };
    addr.sll_ifindex = ifindex as libc::c_int;
    // SAFETY: addr is a live sockaddr_ll of the size passed.
    let r = unsafe {
        libc::bind(
            raw,
            (&addr as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io_err(name, "bind"));
    }
    if !receive {
        return Ok((fd, vnet_hdr_bytes));
    }
    // SAFETY: packet_mreq is plain old data; all-zero is a valid value.
    let mut mreq: libc::packet_mreq = unsafe { std::mem::zeroed() };
    mreq.mr_ifindex = ifindex as libc::c_int;
    mreq.mr_type = libc::PACKET_MR_PROMISC as libc::c_ushort;
    setsockopt(raw, sol, libc::PACKET_ADD_MEMBERSHIP, &mreq)
        .map_err(|source| op_err(name, "PACKET_ADD_MEMBERSHIP", source))?;
    Ok((fd, vnet_hdr_bytes))
}

pub(super) fn op_err(port: &str, op: &'static str, source: io::Error) -> PortError {
    PortError::Io {
        port: port.to_string(),
        op,
        source,
    }
}

/// Joins the bound socket `fd` to fanout group `id` (hash by flow), or to a new group whose
/// id the kernel picks (`None`); returns the group's id.
pub(super) fn join_fanout(fd: RawFd, id: Option<u16>) -> io::Result<u16> {
    let hash = libc::PACKET_FANOUT_HASH;
    let value = match id {
        Some(id) => (hash << 16) | libc::c_uint::from(id),
        None => (hash | FANOUT_FLAG_UNIQUEID) << 16,
    } as libc::c_int;
    setsockopt(fd, libc::SOL_PACKET, libc::PACKET_FANOUT, &value)?;
    let mut got: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: got and len are live and of the sizes the kernel expects.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_FANOUT,
            (&mut got as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((got & 0xffff) as u16)
}
