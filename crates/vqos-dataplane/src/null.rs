//! [`NullPort`]: a port that costs (almost) nothing, for benchmarks and load tests, as DPDK's
//! `net_null`: receiving makes valid frames from a template as fast as the loop asks, sending
//! counts and discards. It measures the switch alone: no kernel, no guest, no copy across a
//! boundary.
//!
//! ## Behavior
//! Every frame received is one of the port's templates, taken in turn: a virtio-net header (no
//! offload), then an Ethernet frame from the port's own MAC to a destination MAC carrying an
//! IPv4/UDP packet from the port's own address (so port security and the address guards do
//! the work they do on real traffic, and accept it), padded to `frame_len` bytes on the wire
//! (the FCS counted, as "64-byte frames" are: 60 bytes generated). A vif ([`NullPort::vif`])
//! sends to the null uplink's station; a generating uplink ([`NullPort::uplink`]) sends to
//! each of the null vifs it is given in turn (downloads). A port made with [`NullPort::sink`]
//! receives nothing (the uplink of a vifs→uplink benchmark, a vif that only receives). Its
//! readiness descriptor is an eventfd that is always readable: the loop reads a generating
//! port whenever it may.
//!
//! ## Limitations
//! The template is copied into each receive buffer (a DPDK `net_null` hands out buffers without
//! writing them): 60 bytes per 64-byte frame, ~1.5 KB per 1518-byte one.

use std::os::fd::RawFd;

use crate::frame::{build_frame, MacKey, VnetHdr, ETH_HDR_LEN};
use crate::port::{Batch, Port, PortError, PortIoCounters};
use crate::sys::EventFd;

/// The station a null uplink stands for: null vifs send to it, and it is pinned to the
/// uplink (so their frames are known unicast, as to a gateway).
pub const NULL_UPLINK_MAC: MacKey = 0x02_00_00_00_00_01;

/// Shortest frame, bytes on the wire with the FCS (Ethernet's minimum).
pub const NULL_MIN_FRAME: usize = 64;
/// Longest frame, bytes on the wire with the FCS (a 1500-byte MTU).
pub const NULL_MAX_FRAME: usize = 1518;

/// See the module docs. Aligned to 128 bytes so that two null ports' counters, written by
/// two shards every batch, never share a cache line.
#[derive(Debug)]
#[repr(align(128))]
pub struct NullPort {
    /// Port name.
    name: String,
    /// The frames receives yield in turn (virtio-net header included); none for a sink.
    templates: Vec<Vec<u8>>,
    /// The template the next frame received is.
    next: usize,
    /// Always readable while the port generates.
    event: EventFd,
    /// What it received and sent.
    counters: PortIoCounters,
    /// Receive queues it may still lend to other shards ([`Port::rx_queue`]), beyond its own.
    spare_queues: std::cell::Cell<usize>,
}

impl NullPort {
    /// A port generating `frame_len`-byte frames (FCS counted, [`NULL_MIN_FRAME`] to
    /// [`NULL_MAX_FRAME`]) from `src_mac` / IPv4 `src_ip` to `dst_mac`.
    pub fn source(
        name: &str,
        frame_len: usize,
        src_mac: MacKey,
        src_ip: [u8; 4],
        dst_mac: MacKey,
    ) -> Result<NullPort, PortError> {
        let t = template(name, frame_len, (src_mac, src_ip), (dst_mac, BENCH_IP))?;
        Self::with_templates(name, vec![t])
    }

    /// The station of the null vif called `name`: a MAC and an IPv4 address derived from the
    /// name (FNV-1a; a locally administered MAC, an address in 10.0.0.0/8), stable across
    /// runs, so that a generating uplink can address a vif it has never heard from.
    pub fn station(name: &str) -> (MacKey, [u8; 4]) {
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let mac = 0x02_00_00_00_00_00 | (h & 0xffff_ffff);
        // 10.a.b.c with c in 1..=254: never a network or broadcast address.
        let ip = [
            10,
            (h >> 32) as u8,
            (h >> 40) as u8,
            1 + ((h >> 48) % 254) as u8,
        ];
        (mac, ip)
    }

    /// A vif generating `frame_len`-byte frames to the null uplink ([`NULL_UPLINK_MAC`]) from
    /// its [`NullPort::station`].
    pub fn vif(name: &str, frame_len: usize) -> Result<NullPort, PortError> {
        let (mac, ip) = Self::station(name);
        Self::source(name, frame_len, mac, ip, NULL_UPLINK_MAC)
    }

    /// An uplink generating `frame_len`-byte frames from its station ([`NULL_UPLINK_MAC`],
    /// 198.18.0.1) to the stations of the null vifs named `to`, one after another (download
    /// benchmarks); a sink when `to` is empty.
    pub fn uplink(name: &str, frame_len: usize, to: &[String]) -> Result<NullPort, PortError> {
        let templates = to
            .iter()
            .map(|vif| {
                let dst = Self::station(vif);
                template(name, frame_len, (NULL_UPLINK_MAC, BENCH_IP), dst)
            })
            .collect::<Result<_, _>>()?;
        Self::with_templates(name, templates)
    }

    /// A port that receives nothing and discards what it is sent.
    pub fn sink(name: &str) -> Result<NullPort, PortError> {
        Self::with_templates(name, Vec::new())
    }

    fn with_templates(name: &str, templates: Vec<Vec<u8>>) -> Result<NullPort, PortError> {
        let io = |source| PortError::Io {
            port: name.to_string(),
            op: "eventfd",
            source,
        };
        let event = EventFd::new().map_err(|e| io(std::io::Error::other(e.to_string())))?;
        if !templates.is_empty() {
            event.signal();
        }
        Ok(NullPort {
            name: name.to_string(),
            templates,
            next: 0,
            event,
            counters: PortIoCounters::default(),
            spare_queues: std::cell::Cell::new(0),
        })
    }

    /// The port with `queues` receive queues (at least 1): each further one, lent to another
    /// shard ([`Port::rx_queue`]), generates the same frames, as a multiqueue guest whose
    /// flows spread over its queues would send (a benchmark of one vif on several cores).
    pub fn with_queues(self, queues: usize) -> NullPort {
        self.spare_queues.set(queues.saturating_sub(1));
        self
    }
}

/// 198.18.0.1, the benchmarking range (RFC 2544): where null vifs send, and the null
/// uplink's own address.
const BENCH_IP: [u8; 4] = [198, 18, 0, 1];

/// The frame (virtio-net header included) of `frame_len` bytes on the wire from station `src`
/// to station `dst` (MAC, IPv4), for port `name`'s errors.
fn template(
    name: &str,
    frame_len: usize,
    src: (MacKey, [u8; 4]),
    dst: (MacKey, [u8; 4]),
) -> Result<Vec<u8>, PortError> {
    if !(NULL_MIN_FRAME..=NULL_MAX_FRAME).contains(&frame_len) {
        return Err(PortError::BadSetting {
            port: name.to_string(),
            message: format!(
                "frame_len {frame_len} is outside {NULL_MIN_FRAME}..={NULL_MAX_FRAME} \
                 (bytes on the wire, FCS included)"
            ),
        });
    }
    Ok(build_frame(
        VnetHdr::default(),
        dst.0,
        src.0,
        0x0800,
        &ipv4_udp(src.1, dst.1, frame_len - 4 - ETH_HDR_LEN),
    ))
}

/// An IPv4/UDP packet of `len` bytes (at least 28) from `src` to `dst`, valid header
/// checksum, zero payload.
fn ipv4_udp(src: [u8; 4], dst: [u8; 4], len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    p[..12].copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    let sum = crate::frame::ipv4_checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    // UDP 9 → 9 (discard), length, checksum 0 (none).
    p[20..24].copy_from_slice(&[0, 9, 0, 9]);
    p[24..26].copy_from_slice(&((len - 20) as u16).to_be_bytes());
    p
}

impl Port for NullPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        let (mut n, mut bytes) = (0, 0);
        while n < max_frames {
            let Some(t) = self.templates.get(self.next) else {
                break;
            };
            if !batch.push(t) {
                break;
            }
            n += 1;
            bytes += t.len() + 4;
            self.next = (self.next + 1) % self.templates.len();
        }
        self.counters.rx_frames += n as u64;
        self.counters.rx_bytes += bytes as u64;
        Ok(n)
    }

    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        self.counters.tx_frames += indices.len() as u64;
        self.counters.tx_bytes += indices
            .iter()
            .map(|&i| batch.frame(usize::from(i)).len() as u64)
            .sum::<u64>();
        Ok(indices.len())
    }

    fn readiness_fd(&self) -> Option<RawFd> {
        Some(self.event.raw())
    }

    fn counters(&self) -> PortIoCounters {
        self.counters
    }

    /// A sink of the same name: a null port has as many transmit queues as threads want, as
    /// DPDK's `net_null` has.
    fn tx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        Ok(Some(Box::new(NullPort::sink(&self.name)?)))
    }

    /// Another generator of the same frames while the port has queues to lend
    /// ([`NullPort::with_queues`]).
    fn rx_queue(&self) -> Result<Option<Box<dyn Port>>, PortError> {
        let left = self.spare_queues.get();
        if left == 0 || self.templates.is_empty() {
            return Ok(None);
        }
        self.spare_queues.set(left - 1);
        Ok(Some(Box::new(NullPort::with_templates(
            &self.name,
            self.templates.clone(),
        )?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{validate, VNET_HDR_LEN};

    #[test]
    fn generates_valid_frames_of_the_length_asked_and_discards_what_it_is_sent() {
        let mut p = NullPort::source("n", 64, 0x02_00_00_00_00_0a, [10, 0, 0, 10], 1).unwrap();
        let mut b = Batch::new();
        assert_eq!(p.recv_batch(&mut b, 5).unwrap(), 5);
        for i in 0..5 {
            let f = b.frame(i);
            assert!(validate(f).is_ok());
            assert_eq!(f.len() - VNET_HDR_LEN + 4, 64, "64 bytes on the wire");
            assert_eq!(
                crate::frame::ipv4_checksum(&f[VNET_HDR_LEN + 14..][..20]),
                0
            );
        }
        let big = NullPort::source("n", 1518, 2, [10, 0, 0, 1], 1).unwrap();
        assert_eq!(big.templates[0].len() - VNET_HDR_LEN, 1514);
        assert_eq!(p.send_batch(&b, &[0, 1, 2]).unwrap(), 3);
        let c = p.counters();
        assert_eq!(
            (c.rx_frames, c.tx_frames, c.tx_bytes),
            (5, 3, 3 * (12 + 60))
        );
        assert_eq!(
            NullPort::sink("s").unwrap().recv_batch(&mut b, 32).unwrap(),
            0
        );
        for bad in [63, 1519] {
            let e = NullPort::source("n", bad, 2, [10, 0, 0, 1], 1).unwrap_err();
            assert!(e.to_string().contains("frame_len"), "{e}");
        }
    }

    #[test]
    fn a_generating_uplink_sends_to_each_vif_station_in_turn() {
        let to = ["vm1".to_string(), "vm2".to_string()];
        let mut up = NullPort::uplink("up", 64, &to).unwrap();
        let mut b = Batch::new();
        assert_eq!(up.recv_batch(&mut b, 5).unwrap(), 5);
        let (m1, ip1) = NullPort::station("vm1");
        let (m2, ip2) = NullPort::station("vm2");
        assert_ne!(m1, m2);
        for (i, (mac, ip)) in [(m1, ip1), (m2, ip2), (m1, ip1), (m2, ip2), (m1, ip1)]
            .into_iter()
            .enumerate()
        {
            let f = b.frame(i);
            assert!(validate(f).is_ok());
            let eth = &f[VNET_HDR_LEN..];
            assert_eq!(
                crate::frame::mac_key(&eth[..6]),
                mac,
                "frame {i}'s destination"
            );
            assert_eq!(crate::frame::mac_key(&eth[6..12]), NULL_UPLINK_MAC);
            assert_eq!(&eth[14 + 16..14 + 20], &ip, "frame {i}'s IPv4 destination");
        }
        // The next call goes on where this one stopped.
        let mut c = Batch::new();
        up.recv_batch(&mut c, 1).unwrap();
        assert_eq!(crate::frame::mac_key(&c.frame(0)[VNET_HDR_LEN..][..6]), m2);
        // The vif's own frames come from the station the uplink addresses.
        let mut v = NullPort::vif("vm1", 64).unwrap();
        v.recv_batch(&mut c, 1).unwrap();
        assert_eq!(
            crate::frame::mac_key(&c.frame(1)[VNET_HDR_LEN + 6..][..6]),
            m1
        );
        let mut none = NullPort::uplink("up", 64, &[]).unwrap();
        assert_eq!(none.recv_batch(&mut b, 32).unwrap(), 0, "no vif: a sink");
        assert!(NullPort::uplink("up", 40, &to).is_err());
    }

    #[test]
    fn a_port_with_queues_lends_generators_of_the_same_frames_and_no_more() {
        let p = NullPort::vif("v", 64).unwrap().with_queues(3);
        let mut lent: Vec<Box<dyn Port>> = std::iter::from_fn(|| p.rx_queue().unwrap()).collect();
        assert_eq!(lent.len(), 2, "queues beyond its own");
        let (mut a, mut b) = (Batch::new(), Batch::new());
        lent[1].recv_batch(&mut a, 1).unwrap();
        let mut own = NullPort::vif("v", 64).unwrap();
        own.recv_batch(&mut b, 1).unwrap();
        assert_eq!(a.frame(0), b.frame(0), "the same frames");
        assert!(NullPort::vif("v", 64)
            .unwrap()
            .rx_queue()
            .unwrap()
            .is_none());
        assert!(NullPort::sink("s")
            .unwrap()
            .with_queues(2)
            .rx_queue()
            .unwrap()
            .is_none());
    }
}
