//! Shared by the data plane's in-memory tests: frames, a recording engine, misbehaving ports,
//! and [`VRig`], a [`Switch`] stepped in virtual time.
#![allow(dead_code)]

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vqos_dataplane::frame::{build_frame, ipv4_header, VnetHdr, VNET_F_NEEDS_CSUM, VNET_GSO_TCPV4};
use vqos_dataplane::{
    Batch, MacPolicy, MemPort, MemPortPeer, Port, PortError, PortIoCounters, PortSpec, Shards,
    Switch, SwitchConfig, SwitchStats, VNET_HDR_LEN,
};
use vqos_sched::{
    Engine, EngineKind, Grant, PolicyError, PolicySet, ReadySet, Usage, VifId, VifPolicy, MAX_BURST,
};

pub const MAC_U: u64 = 0x02_00_00_00_00_01;
pub const MAC_A: u64 = 0x02_00_00_00_00_0a;
pub const MAC_B: u64 = 0x02_00_00_00_00_0b;
pub const BCAST: u64 = 0xff_ff_ff_ff_ff_ff;

/// An IPv4 header from the station of MAC `src` (source 10.0.0.x, x the MAC's last byte:
/// each station its own address, as the address guards expect), valid checksum.
pub fn station_ipv4(src: u64, tos: u8, total_len: u16) -> Vec<u8> {
    let mut p = ipv4_header(tos, total_len).to_vec();
    p[15] = src as u8;
    p[10..12].copy_from_slice(&[0, 0]);
    let sum = vqos_dataplane::frame::ipv4_checksum(&p);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p
}

/// A test frame tagged `tag`, of the local experimental EtherType (0x88b5): its payload is
/// no IP packet, so the address guards claim nothing for it.
pub fn frame(dst: u64, src: u64, tag: u8) -> Vec<u8> {
    build_frame(VnetHdr::default(), dst, src, 0x88b5, &[tag; 60])
}

pub fn tag_of(f: &[u8]) -> u8 {
    f[VNET_HDR_LEN + 14]
}

pub fn tags(frames: &[Vec<u8>]) -> Vec<u8> {
    frames.iter().map(|f| tag_of(f)).collect()
}

/// Adds `bits` to `got[i]` for each frame of `frames` sent from `macs[i]` (the source MAC
/// after the virtio-net header).
pub fn count_by_source(frames: Vec<Vec<u8>>, macs: &[u64], got: &mut [u64], bits: u64) {
    for f in frames {
        let src = u64::from_be_bytes([0, 0, f[18], f[19], f[20], f[21], f[22], f[23]]);
        if let Some(i) = macs.iter().position(|&m| m == src) {
            got[i] += bits;
        }
    }
}

/// A TCPv4 super-frame from `src`: IPv4 + TCP (20 bytes each) + `data` bytes, cut by the
/// receiver into segments of `gso_size`. Each station has its own IPv4 source address
/// (10.0.0.x, x the MAC's last byte), as real ones do.
pub fn tso_frame(dst: u64, src: u64, gso_size: u16, data: usize) -> Vec<u8> {
    let mut p = station_ipv4(src, 0x02, 0);
    let mut tcp = [0u8; 20];
    tcp[12] = 5 << 4;
    p.extend_from_slice(&tcp);
    p.extend(std::iter::repeat(0u8).take(data));
    let hdr = VnetHdr {
        flags: VNET_F_NEEDS_CSUM,
        gso_type: VNET_GSO_TCPV4,
        hdr_len: 54,
        gso_size,
        csum_start: 34,
        csum_offset: 16,
    };
    build_frame(hdr, dst, src, 0x0800, &p)
}

/// An ECN-capable (ECT(0)) IPv4 frame.
pub fn ect_frame(dst: u64, src: u64) -> Vec<u8> {
    let mut p = station_ipv4(src, 0x02, 60);
    p.extend_from_slice(&[0; 40]);
    build_frame(VnetHdr::default(), dst, src, 0x0800, &p)
}

/// A switch with an uplink `u` and vifs `a` and `b` (MemPorts), stepped in virtual time: no
/// thread, no clock, no sleeps.
pub struct VRig {
    pub sw: Switch,
    /// Virtual time, ns.
    pub now: u64,
    pub u: MemPortPeer,
    pub a: MemPortPeer,
    pub b: MemPortPeer,
}

impl VRig {
    pub fn new() -> Self {
        Self::with(|_| {}, MacPolicy::default())
    }

    /// Vif `a` gets the source-address policy `a_macs`, `b` the default.
    pub fn with(config: impl FnOnce(&mut SwitchConfig), a_macs: MacPolicy) -> Self {
        let (up, u) = MemPort::pair("up", 10_000);
        let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
        config(&mut cfg);
        let mut sw = Switch::new(cfg, 0).unwrap();
        let (pa, a) = MemPort::pair("a", 10_000);
        let spec = PortSpec::custom(Box::new(pa)).with_mac_policy(a_macs);
        sw.add_port(spec, VifPolicy::default(), 0).unwrap();
        let (pb, b) = MemPort::pair("b", 10_000);
        sw.add_port(PortSpec::custom(Box::new(pb)), VifPolicy::default(), 0)
            .unwrap();
        VRig {
            sw,
            now: 0,
            u,
            a,
            b,
        }
    }

    /// Polls at the current time until the switch has nothing left to do: every port is
    /// marked ready (as busy polling would) whenever a poll finds no work, and the run ends
    /// when a whole round after marking read nothing.
    pub fn run(&mut self) {
        run_switch(&mut self.sw, self.now);
    }

    /// Moves virtual time forward by `ns`, then [`VRig::run`].
    pub fn advance(&mut self, ns: u64) {
        self.now += ns;
        self.run();
    }

    /// A stats snapshot now.
    pub fn stats(&mut self) -> SwitchStats {
        self.sw.stats(self.now)
    }
}

/// What tests step in virtual time: one switch, or a switch's shards ([`Shards`]).
pub trait Stepped {
    /// Every switch to poll, in order.
    fn switches(&mut self) -> Vec<&mut Switch>;
}

impl Stepped for Switch {
    fn switches(&mut self) -> Vec<&mut Switch> {
        vec![self]
    }
}

impl Stepped for Shards {
    fn switches(&mut self) -> Vec<&mut Switch> {
        self.iter_mut().collect()
    }
}

/// See [`VRig::run`]; with shards, each in turn.
pub fn run_switch(sw: &mut impl Stepped, now: u64) {
    for _ in 0..100_000 {
        let mut frames = 0;
        for sw in sw.switches() {
            sw.mark_all_ready(false);
            loop {
                let p = sw.poll(now);
                frames += p.frames_read;
                if !p.did_work {
                    break;
                }
            }
        }
        if frames == 0 {
            return;
        }
    }
    panic!("the switch never ran out of work");
}

/// What a [`Refuser`] was configured with and charged.
#[derive(Default)]
pub struct Log {
    pub configures: Vec<Vec<(String, u32)>>,
    pub charged_bytes: u64,
    pub charged_packets: u64,
    pub charged_cycles: u64,
    pub largest_batch: u64,
}

/// An engine that never serves the vifs in `refused` (round-robin over the others) and records
/// what it was configured with and charged.
pub struct Refuser {
    pub refused: Vec<String>,
    pub names: Vec<String>,
    pub cursor: usize,
    pub log: Arc<Mutex<Log>>,
}

impl Refuser {
    pub fn new(refused: &[&str]) -> (Self, Arc<Mutex<Log>>) {
        let log = Arc::new(Mutex::new(Log::default()));
        let engine = Refuser {
            refused: refused.iter().map(|s| s.to_string()).collect(),
            names: Vec::new(),
            cursor: 0,
            log: log.clone(),
        };
        (engine, log)
    }
}

impl Engine for Refuser {
    fn kind(&self) -> EngineKind {
        EngineKind::Rr
    }
    fn configure(&mut self, p: &PolicySet, _now_ns: u64) -> Result<(), PolicyError> {
        p.validate()?;
        if p.vifs.iter().any(|v| v.policy.weight == 99) {
            return Err(PolicyError::UnknownVif("engine refuses weight 99".into()));
        }
        self.names = p.vifs.iter().map(|v| v.name.clone()).collect();
        self.log.lock().unwrap().configures.push(
            p.vifs
                .iter()
                .map(|v| (v.name.clone(), v.policy.weight))
                .collect(),
        );
        Ok(())
    }
    fn select(&mut self, ready: &ReadySet, _now_ns: u64) -> Option<Grant> {
        let n = self.names.len();
        for k in 0..n {
            let v = (self.cursor + k) % n;
            if ready.contains(v) && !self.refused.contains(&self.names[v]) {
                self.cursor = v + 1;
                return Some(Grant {
                    vif: v,
                    max_packets: MAX_BURST,
                });
            }
        }
        None
    }
    fn charge(&mut self, _vif: VifId, usage: Usage, _now_ns: u64) {
        let mut log = self.log.lock().unwrap();
        log.charged_bytes += usage.bytes;
        log.charged_packets += u64::from(usage.packets);
        log.charged_cycles += usage.cycles;
        log.largest_batch = log.largest_batch.max(u64::from(usage.packets));
    }
}

/// What a [`Spy`] port saw.
#[derive(Default)]
pub struct SpyLog {
    /// Name of the thread that dropped the port.
    pub dropped_on: Mutex<Option<String>>,
    /// The next `recv_batch` sleeps this long first, ms (then resets to 0).
    pub stall_ms: AtomicU64,
    /// A stalled `recv_batch` began.
    pub stalled: AtomicBool,
}

/// A [`MemPort`] that records where it is dropped and can stall the loop in `recv_batch`.
pub struct Spy {
    pub inner: MemPort,
    pub log: Arc<SpyLog>,
}

pub fn spy(name: &str) -> (Spy, MemPortPeer, Arc<SpyLog>) {
    let (inner, peer) = MemPort::pair(name, 10_000);
    let log = Arc::new(SpyLog::default());
    (
        Spy {
            inner,
            log: log.clone(),
        },
        peer,
        log,
    )
}

impl Port for Spy {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        let ms = self.log.stall_ms.swap(0, Ordering::SeqCst);
        if ms > 0 {
            self.log.stalled.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(ms));
        }
        self.inner.recv_batch(batch, max_frames)
    }
    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        self.inner.send_batch(batch, indices)
    }
    fn readiness_fd(&self) -> Option<RawFd> {
        self.inner.readiness_fd()
    }
    fn counters(&self) -> PortIoCounters {
        self.inner.counters()
    }
}

impl Drop for Spy {
    fn drop(&mut self) {
        *self.log.dropped_on.lock().unwrap() = std::thread::current().name().map(String::from);
    }
}

/// A [`MemPort`] that offers no readiness descriptor (can only be polled).
pub struct NoFd(pub MemPort);

impl Port for NoFd {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        self.0.recv_batch(batch, max_frames)
    }
    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        self.0.send_batch(batch, indices)
    }
    fn readiness_fd(&self) -> Option<RawFd> {
        None
    }
    fn counters(&self) -> PortIoCounters {
        self.0.counters()
    }
}
