//! The switch driven through in-memory ports: learning, flooding, drops by reason, engine
//! refusal as back-pressure, live policy changes, port removal, ECN marking, faults.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vqos_dataplane::frame::{
    build_frame, ipv4_checksum, ipv4_header, VnetHdr, MAX_FRAME_BYTES, VNET_F_NEEDS_CSUM,
    VNET_GSO_TCPV4,
};
use vqos_dataplane::{
    Batch, EmulatedWork, FaultPlan, FaultPort, MemPort, MemPortPeer, Port, PortError,
    PortIoCounters, PortSpec, Readiness, SwitchConfig, SwitchError, SwitchHandle, SwitchStats,
    VNET_HDR_LEN,
};
use vqos_sched::{
    Engine, EngineKind, Grant, PolicyError, PolicySet, ReadySet, Usage, VifId, VifPolicy, MAX_BURST,
};

const MAC_U: u64 = 0x02_00_00_00_00_01;
const MAC_A: u64 = 0x02_00_00_00_00_0a;
const MAC_B: u64 = 0x02_00_00_00_00_0b;
const BCAST: u64 = 0xff_ff_ff_ff_ff_ff;

fn frame(dst: u64, src: u64, tag: u8) -> Vec<u8> {
    build_frame(VnetHdr::default(), dst, src, 0x0800, &[tag; 60])
}

fn tag_of(f: &[u8]) -> u8 {
    f[VNET_HDR_LEN + 14]
}

/// Polls `cond` for up to 3 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("timed out waiting for: {what}");
}

/// Waits until `n` frames were sent to `peer` and returns them.
fn collect(peer: &MemPortPeer, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    eventually(&format!("{n} frames"), || {
        got.extend(peer.take_sent());
        got.len() >= n
    });
    got
}

/// Waits for a stats snapshot satisfying `cond`.
fn stats_where(sw: &SwitchHandle, mut cond: impl FnMut(&SwitchStats) -> bool) -> Arc<SwitchStats> {
    let mut last = sw.stats();
    eventually("stats", || {
        last = sw.stats();
        cond(&last)
    });
    last
}

struct Rig {
    sw: SwitchHandle,
    u: MemPortPeer,
    a: MemPortPeer,
    b: MemPortPeer,
}

fn rig_with(config: impl FnOnce(&mut SwitchConfig), allow_a: Option<Vec<u64>>) -> Rig {
    let (up, u) = MemPort::pair("up", 10_000);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    config(&mut cfg);
    let sw = SwitchHandle::start(cfg).unwrap();
    let (pa, a) = MemPort::pair("a", 10_000);
    let mut spec = PortSpec::custom(Box::new(pa));
    if let Some(macs) = allow_a {
        spec = spec.with_allowed_macs(macs);
    }
    sw.add_port(spec, VifPolicy::default()).unwrap();
    let (pb, b) = MemPort::pair("b", 10_000);
    sw.add_port(PortSpec::custom(Box::new(pb)), VifPolicy::default())
        .unwrap();
    Rig { sw, u, a, b }
}

fn rig() -> Rig {
    rig_with(|_| {}, None)
}

#[test]
fn learns_floods_unknown_and_broadcast_then_unicasts() {
    for readiness in [Readiness::Epoll, Readiness::BusyPoll] {
        let r = rig_with(|c| c.readiness = readiness, None);
        // Unknown destination: flooded to the uplink and b, not back to a.
        r.a.inject(frame(MAC_U, MAC_A, 1));
        assert_eq!(tag_of(&collect(&r.u, 1)[0]), 1);
        assert_eq!(tag_of(&collect(&r.b, 1)[0]), 1);
        // The uplink answers a: a was learnt, so only a gets it.
        r.u.inject(frame(MAC_A, MAC_U, 2));
        assert_eq!(tag_of(&collect(&r.a, 1)[0]), 2);
        // Now the uplink's MAC is learnt too: a → uplink is unicast.
        r.a.inject(frame(MAC_U, MAC_A, 3));
        assert_eq!(tag_of(&collect(&r.u, 1)[0]), 3);
        // Broadcast from b reaches everyone else.
        r.b.inject(frame(BCAST, MAC_B, 4));
        assert_eq!(tag_of(&collect(&r.u, 1)[0]), 4);
        assert_eq!(tag_of(&collect(&r.a, 1)[0]), 4);
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            r.b.take_sent().is_empty(),
            "no frame went back to its sender"
        );
        assert!(r.a.take_sent().is_empty(), "frame 3 was not flooded to a");
        let s = stats_where(&r.sw, |s| s.port("a").is_some_and(|p| p.rx_frames == 2));
        let a = s.port("a").unwrap();
        assert_eq!(a.rx_bytes, 2 * 74);
        assert_eq!(a.tx_frames, 2);
        assert_eq!(s.mac_entries, 3);
        assert_eq!(a.drops.total(), 0);
        assert!(s.loop_stats.bursts >= 4);
        assert!(s.loop_stats.busy_cycles > 0 && s.loop_stats.idle_cycles > 0);
        r.sw.stop().unwrap();
    }
}

#[test]
fn allow_list_drops_spoofed_sources() {
    let r = rig_with(|_| {}, Some(vec![MAC_A]));
    r.a.inject(frame(MAC_U, MAC_B, 1)); // pretends to be b
    r.a.inject(frame(MAC_U, 0x03_00_00_00_00_01, 2)); // group address as source
    r.a.inject(frame(MAC_U, MAC_A, 3));
    let got = collect(&r.u, 1);
    assert_eq!(tag_of(&got[0]), 3);
    let s = stats_where(&r.sw, |s| s.port("a").is_some_and(|p| p.drops.spoofed == 2));
    assert_eq!(s.port("a").unwrap().drops.total(), 2);
    assert!(r.u.take_sent().is_empty());
}

#[test]
fn malformed_frames_dropped_per_reason_and_others_still_forwarded() {
    let r = rig();
    let good = frame(MAC_U, MAC_A, 9);
    r.a.inject(good[..VNET_HDR_LEN + 10].to_vec());
    let mut big = vec![0u8; MAX_FRAME_BYTES + 100];
    big[VNET_HDR_LEN..VNET_HDR_LEN + 14].copy_from_slice(&good[VNET_HDR_LEN..VNET_HDR_LEN + 14]);
    r.a.inject(big);
    let bad_gso = VnetHdr {
        flags: VNET_F_NEEDS_CSUM,
        gso_type: VNET_GSO_TCPV4,
        gso_size: 0,
        ..Default::default()
    };
    r.a.inject(build_frame(bad_gso, MAC_U, MAC_A, 0x0800, &[0; 60]));
    let bad_csum = VnetHdr {
        flags: VNET_F_NEEDS_CSUM,
        csum_start: 60,
        csum_offset: 16,
        ..Default::default()
    };
    r.a.inject(build_frame(bad_csum, MAC_U, MAC_A, 0x0800, &[0; 60]));
    r.b.inject(frame(MAC_U, MAC_B, 7));
    r.a.inject(good);
    let got = collect(&r.u, 2);
    let mut tags: Vec<u8> = got.iter().map(|f| tag_of(f)).collect();
    tags.sort();
    assert_eq!(tags, vec![7, 9]);
    let s = stats_where(&r.sw, |s| s.port("a").is_some_and(|p| p.rx_frames == 5));
    let d = s.port("a").unwrap().drops;
    assert_eq!(
        (d.truncated, d.oversized, d.bad_vnet_hdr, d.total()),
        (1, 1, 2, 4)
    );
    let json = serde_json::to_value(&*s).unwrap();
    assert_eq!(json["ports"][1]["drops"]["bad_vnet_hdr"], 2);
    assert!(json["loop"]["busy_cycles"].as_u64().is_some());
}

/// An engine that never serves the vifs in `refused` (round-robin over the others) and records
/// what it was configured with and charged.
struct Refuser {
    refused: Vec<String>,
    names: Vec<String>,
    cursor: usize,
    log: Arc<Mutex<Log>>,
}

#[derive(Default)]
struct Log {
    configures: Vec<Vec<(String, u32)>>,
    charged_bytes: u64,
    charged_packets: u64,
    charged_cycles: u64,
    largest_batch: u64,
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

fn refuser_rig(refused: &[&str]) -> (Rig, Arc<Mutex<Log>>) {
    refuser_rig_with(refused, |_| {})
}

fn refuser_rig_with(
    refused: &[&str],
    config: impl FnOnce(&mut SwitchConfig),
) -> (Rig, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log::default()));
    let engine = Refuser {
        refused: refused.iter().map(|s| s.to_string()).collect(),
        names: Vec::new(),
        cursor: 0,
        log: log.clone(),
    };
    (
        rig_with(
            |c| {
                c.custom_engine = Some(Box::new(engine));
                config(c);
            },
            None,
        ),
        log,
    )
}

#[test]
fn emulated_work_is_spent_per_frame_and_charged_as_cycles() {
    // 2 M counter cycles per frame (about 1 ms): far above the real cost of a frame on an
    // in-memory port, so the charge shows whether the work was done.
    let per_frame = 2_000_000;
    let (r, log) = refuser_rig_with(&[], |c| {
        c.emulated_work = Some(EmulatedWork {
            per_frame_cycles: per_frame,
            per_byte_cycles: 1000.0,
            batch_frames: 0,
        })
    });
    for i in 0..10 {
        r.b.inject(frame(MAC_U, MAC_B, i));
    }
    collect(&r.u, 10);
    // Frames leave before the work is spent and charged.
    eventually("10 frames charged", || {
        log.lock().unwrap().charged_packets == 10
    });
    let log = log.lock().unwrap();
    assert_eq!(log.charged_bytes, 10 * 74);
    assert!(
        log.charged_cycles >= 10 * per_frame + 10 * 74 * 1000,
        "charged {} cycles for 10 frames",
        log.charged_cycles
    );
    assert_eq!(
        EmulatedWork {
            per_frame_cycles: 5,
            per_byte_cycles: 0.5,
            batch_frames: 0
        }
        .cycles(3, 10),
        20
    );
}

#[test]
fn emulated_batches_are_at_most_batch_frames() {
    for (limit, most) in [(2usize, 2u64), (0, 10)] {
        let log = Arc::new(Mutex::new(Log::default()));
        let engine = Refuser {
            refused: Vec::new(),
            names: Vec::new(),
            cursor: 0,
            log: log.clone(),
        };
        let (up, u) = MemPort::pair("up", 10_000);
        let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
        cfg.custom_engine = Some(Box::new(engine));
        cfg.emulated_work = Some(EmulatedWork {
            per_frame_cycles: 0,
            per_byte_cycles: 0.0,
            batch_frames: limit,
        });
        let sw = SwitchHandle::start(cfg).unwrap();
        // All ten frames wait in the port before the switch sees it, so without a limit they
        // are read in one batch.
        let (pb, b) = MemPort::pair("b", 10_000);
        for i in 0..10 {
            b.inject(frame(MAC_U, MAC_B, i));
        }
        sw.add_port(PortSpec::custom(Box::new(pb)), VifPolicy::default())
            .unwrap();
        collect(&u, 10);
        eventually("10 frames charged", || {
            log.lock().unwrap().charged_packets == 10
        });
        let l = log.lock().unwrap();
        assert_eq!(
            l.largest_batch, most,
            "batch_frames {limit}: largest batch {}",
            l.largest_batch
        );
        drop(l);
        sw.stop().unwrap();
    }
}

#[test]
fn refused_vif_is_not_read_its_frames_stay_in_its_port() {
    let (r, log) = refuser_rig(&["a"]);
    for i in 0..50 {
        r.a.inject(frame(MAC_U, MAC_A, i));
    }
    for i in 0..40 {
        r.b.inject(frame(MAC_U, MAC_B, i));
    }
    collect(&r.u, 40);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        r.a.pending(),
        50,
        "refused vif's frames wait in its own queue"
    );
    assert_eq!(r.b.pending(), 0);
    assert!(r.u.take_sent().is_empty());
    let s = stats_where(&r.sw, |s| s.port("b").is_some_and(|p| p.rx_frames == 40));
    assert_eq!(s.port("a").unwrap().rx_frames, 0);
    assert!(s.loop_stats.engine_refusals > 0);
    assert_eq!(log.lock().unwrap().charged_bytes, 40 * 74);
}

#[test]
fn policy_change_reaches_engine_between_batches_and_bad_ones_change_nothing() {
    let (r, log) = refuser_rig(&[]);
    let epoch0 = stats_where(&r.sw, |s| s.ports.len() == 3).policy_epoch;
    let t = Instant::now();
    r.sw.set_policy(
        "b",
        VifPolicy {
            weight: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let s = stats_where(&r.sw, |s| s.policy_epoch == epoch0 + 1);
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "stats show it fast"
    );
    assert_eq!(s.port("b").unwrap().policy.as_ref().unwrap().weight, 3);
    assert_eq!(
        log.lock().unwrap().configures.last().unwrap(),
        &vec![("a".to_string(), 1), ("b".to_string(), 3)]
    );
    // Invalid: min above max (refused by validation), weight 99 (refused by the engine),
    // unknown vif, a set missing a port.
    let bad = VifPolicy {
        min_bps: 10,
        max_bps: Some(5),
        ..Default::default()
    };
    assert!(matches!(
        r.sw.set_policy("a", bad),
        Err(SwitchError::Policy(PolicyError::MinAboveMax { .. }))
    ));
    let w99 = VifPolicy {
        weight: 99,
        ..Default::default()
    };
    assert!(r.sw.set_policy("a", w99).is_err());
    assert!(r.sw.set_policy("zz", VifPolicy::default()).is_err());
    let mut missing = r.sw.policies();
    missing.vifs.pop();
    assert!(matches!(
        r.sw.set_policies(missing),
        Err(SwitchError::MissingVif(_))
    ));
    assert_eq!(r.sw.policies().vifs[0].policy, VifPolicy::default());
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(r.sw.stats().policy_epoch, epoch0 + 1);
    // Traffic still flows after the refused changes.
    r.a.inject(frame(MAC_U, MAC_A, 5));
    assert_eq!(tag_of(&collect(&r.u, 1)[0]), 5);
}

/// A TCPv4 super-frame from `src`: IPv4 + TCP (20 bytes each) + `data` bytes, cut by the
/// receiver into segments of `gso_size`.
fn tso_frame(dst: u64, src: u64, gso_size: u16, data: usize) -> Vec<u8> {
    let mut p = ipv4_header(0x02, 0).to_vec();
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

#[test]
fn gso_frames_are_charged_as_their_segments_and_tiny_gso_size_is_refused() {
    let (r, log) = refuser_rig(&[]);
    // gso_size 1 would be 14 480 segments on the wire for one charged frame.
    r.a.inject(tso_frame(MAC_U, MAC_A, 1, 14_480));
    // 10 segments of 54 + 1448 bytes.
    r.a.inject(tso_frame(MAC_U, MAC_A, 1448, 14_480));
    let got = collect(&r.u, 1);
    assert_eq!(got[0].len(), VNET_HDR_LEN + 54 + 14_480, "sent unchanged");
    let wire = 10 * (54 + 1448);
    let s = stats_where(&r.sw, |s| s.port("up").is_some_and(|p| p.tx_frames == 1));
    let a = s.port("a").unwrap();
    assert_eq!(a.drops.bad_vnet_hdr, 1);
    assert_eq!(
        a.rx_bytes,
        (54 + 14_480) + wire,
        "the refused frame as read"
    );
    assert_eq!(s.port("up").unwrap().tx_bytes, wire);
    assert_eq!(log.lock().unwrap().charged_bytes, wire);
}

#[test]
fn removing_a_port_affects_only_that_port() {
    let r = rig();
    r.a.inject(frame(BCAST, MAC_A, 1));
    r.b.inject(frame(BCAST, MAC_B, 2));
    collect(&r.u, 2);
    r.sw.remove_port("a").unwrap();
    assert!(matches!(
        r.sw.remove_port("a"),
        Err(SwitchError::UnknownPort(_))
    ));
    assert!(matches!(
        r.sw.remove_port("up"),
        Err(SwitchError::Uplink(_))
    ));
    // a's MAC is forgotten: a frame for it is flooded (to b only), b keeps forwarding.
    r.u.inject(frame(MAC_A, MAC_U, 3));
    r.b.inject(frame(MAC_U, MAC_B, 4));
    assert_eq!(tag_of(&collect(&r.u, 1)[0]), 4);
    let got_b = collect(&r.b, 2);
    assert!(got_b.iter().any(|f| tag_of(f) == 3));
    let s = r.sw.stats();
    assert!(s.port("a").is_none());
    assert_eq!(r.sw.policies().len(), 1);
    // The name can be reused.
    let (pa, _a2) = MemPort::pair("a", 10);
    r.sw.add_port(PortSpec::custom(Box::new(pa)), VifPolicy::default())
        .unwrap();
    assert!(matches!(
        r.sw.add_port(
            PortSpec::custom(Box::new(MemPort::pair("a", 1).0)),
            VifPolicy::default()
        ),
        Err(SwitchError::DuplicatePort(_))
    ));
}

fn ect_frame(dst: u64, src: u64) -> Vec<u8> {
    let mut p = ipv4_header(0x02, 60).to_vec();
    p.extend_from_slice(&[0; 40]);
    build_frame(VnetHdr::default(), dst, src, 0x0800, &p)
}

#[test]
fn ecn_probability_marks_uplink_to_vif_frames() {
    let r = rig();
    r.u.inject(frame(BCAST, MAC_U, 1));
    collect(&r.a, 1);
    collect(&r.b, 1);
    r.a.inject(frame(MAC_U, MAC_A, 1));
    r.b.inject(frame(MAC_U, MAC_B, 1));
    collect(&r.u, 2);
    assert!(r.sw.set_ecn_probabilities(vec![1.0]).is_err());
    assert!(r.sw.set_ecn_probabilities(vec![1.5, 0.0]).is_err());
    r.sw.set_ecn_probabilities(vec![1.0, 0.0]).unwrap();
    // Let the loop apply it (it is applied before the next batch; give it an iteration).
    stats_where(&r.sw, |s| {
        s.port("a").is_some_and(|p| p.ecn_probability == 1.0)
    });
    for _ in 0..10 {
        r.u.inject(ect_frame(MAC_A, MAC_U));
        r.u.inject(ect_frame(MAC_B, MAC_U));
    }
    let to_a = collect(&r.a, 10);
    let to_b = collect(&r.b, 10);
    for f in &to_a {
        let ip = &f[VNET_HDR_LEN + 14..VNET_HDR_LEN + 34];
        assert_eq!(ip[1] & 3, 3, "CE set");
        assert_eq!(ipv4_checksum(ip), 0, "checksum fixed");
    }
    for f in &to_b {
        assert_eq!(f[VNET_HDR_LEN + 15] & 3, 2, "b not marked");
    }
    stats_where(&r.sw, |s| s.port("a").is_some_and(|p| p.ecn_marked == 10));
    // Not-ECT frames chosen for marking are left alone and counted.
    for _ in 0..3 {
        r.u.inject(frame(MAC_A, MAC_U, 9));
    }
    for f in collect(&r.a, 3) {
        assert_eq!(f, frame(MAC_A, MAC_U, 9), "unchanged");
    }
    let s = stats_where(&r.sw, |s| s.port("a").is_some_and(|p| p.ecn_not_ect == 3));
    assert_eq!(s.port("a").unwrap().ecn_marked, 10);
}

#[test]
fn allow_list_of_several_unsorted_addresses() {
    let allowed = vec![0x02_00_00_00_00_99, MAC_A, 0x02_00_00_00_00_03, MAC_A];
    let r = rig_with(|_| {}, Some(allowed));
    r.a.inject(frame(MAC_U, 0x02_00_00_00_00_03, 1));
    r.a.inject(frame(MAC_U, 0x02_00_00_00_00_04, 2));
    r.a.inject(frame(MAC_U, 0x02_00_00_00_00_99, 3));
    r.a.inject(frame(MAC_U, MAC_A, 4));
    let tags: Vec<u8> = collect(&r.u, 3).iter().map(|f| tag_of(f)).collect();
    assert_eq!(tags, vec![1, 3, 4]);
    let s = stats_where(&r.sw, |s| s.port("a").is_some_and(|p| p.rx_frames == 4));
    assert_eq!(s.port("a").unwrap().drops.spoofed, 1);
}

#[test]
fn downlink_max_drops_excess_as_rate_limited() {
    let r = rig();
    r.a.inject(frame(MAC_U, MAC_A, 1));
    collect(&r.u, 1);
    let slow = VifPolicy {
        max_bps: Some(1_000_000), // depth: 2 × 64 KiB
        ..Default::default()
    };
    r.sw.set_policy("a", slow).unwrap();
    let big = build_frame(VnetHdr::default(), MAC_A, MAC_U, 0x0800, &[0; 9000]);
    for _ in 0..40 {
        r.u.inject(big.clone());
    }
    let s = stats_where(&r.sw, |s| s.port("up").is_some_and(|p| p.rx_frames >= 40));
    let a = s.port("a").unwrap();
    assert!(a.drops.rate_limited > 0, "{:?}", a.drops);
    assert_eq!(a.drops.rate_limited + a.tx_frames, 40);
    assert!(a.tx_frames >= 14, "the bucket's depth passes");
}

#[test]
fn capacity_holds_vif_frames_back_without_dropping() {
    let r = rig_with(|c| c.capacity_bps = Some(8_000_000), None); // 1 MB/s, depth 128 KiB
    let big = build_frame(VnetHdr::default(), MAC_U, MAC_A, 0x0800, &[0; 16_000]);
    for _ in 0..100 {
        r.a.inject(big.clone());
    }
    std::thread::sleep(Duration::from_millis(100));
    let sent = r.u.take_sent().len();
    // 128 KiB depth + 100 ms at 1 MB/s ≈ 231 kB ≈ 14 frames (+1 of debt, + scheduling slack).
    assert!((8..=25).contains(&sent), "sent {sent}");
    assert!(r.a.pending() >= 70, "the rest waits in the port");
    let s = r.sw.stats();
    assert_eq!(s.port("a").unwrap().drops.total(), 0);
    assert!(s.loop_stats.capacity_waits > 0);
}

#[test]
fn faulty_port_does_not_stop_the_switch() {
    let (up, u) = MemPort::pair("up", 10_000);
    let sw = SwitchHandle::start(SwitchConfig::new(PortSpec::custom(Box::new(up)))).unwrap();
    let (pa, a) = MemPort::pair("fa", 10_000);
    let plan = FaultPlan {
        fail_recv_every: Some(3),
        corrupt_hdr_every: Some(4),
        truncate_rx_every: Some(5),
        fail_send_every: Some(2),
        ..Default::default()
    };
    sw.add_port(
        PortSpec::custom(Box::new(FaultPort::new(Box::new(pa), plan))),
        VifPolicy::default(),
    )
    .unwrap();
    for i in 0..20 {
        a.inject(frame(MAC_U, MAC_A, i));
    }
    let s = stats_where(&sw, |s| s.port("fa").is_some_and(|p| p.rx_frames == 20));
    let d = s.port("fa").unwrap().drops;
    // Frames 4, 8, 12, 16, 20 corrupted; 5, 10, 15, 20 truncated (20 counts as truncated).
    assert_eq!(d.truncated, 4);
    assert_eq!(d.bad_vnet_hdr, 4);
    assert_eq!(u.take_sent().len(), 12);
    // Sends to the faulty port fail every other batch: counted, not fatal.
    for _ in 0..4 {
        u.inject(frame(MAC_A, MAC_U, 1));
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = stats_where(&sw, |s| s.port("up").is_some_and(|p| p.rx_frames == 4));
    let fa = s.port("fa").unwrap();
    assert_eq!(fa.tx_frames + fa.drops.tx_error, 4);
    assert!(fa.drops.tx_error >= 1);
    sw.stop().unwrap();
    assert!(matches!(
        sw.add_port(
            PortSpec::custom(Box::new(MemPort::pair("x", 1).0)),
            VifPolicy::default()
        ),
        Err(SwitchError::Stopped)
    ));
}

/// What a [`Spy`] port saw.
#[derive(Default)]
struct SpyLog {
    /// Name of the thread that dropped the port.
    dropped_on: Mutex<Option<String>>,
    /// The next `recv_batch` sleeps this long first, ms (then resets to 0).
    stall_ms: AtomicU64,
    /// A stalled `recv_batch` began.
    stalled: AtomicBool,
}

/// A [`MemPort`] that records where it is dropped and can stall the loop in `recv_batch`.
struct Spy {
    inner: MemPort,
    log: Arc<SpyLog>,
}

fn spy(name: &str) -> (Spy, MemPortPeer, Arc<SpyLog>) {
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

#[test]
fn removed_and_refused_ports_are_closed_off_the_loop_thread() {
    let (r, _log) = refuser_rig(&[]);
    let (p, _peer, log) = spy("s");
    r.sw.add_port(PortSpec::custom(Box::new(p)), VifPolicy::default())
        .unwrap();
    r.sw.remove_port("s").unwrap();
    let on = log.dropped_on.lock().unwrap().clone();
    assert_ne!(on.as_deref(), Some("vqos-loop"), "dropped on {on:?}");
    // Refused by the engine (weight 99) once the loop holds it.
    let (p, _peer, log) = spy("s2");
    let w99 = VifPolicy {
        weight: 99,
        ..Default::default()
    };
    assert!(r.sw.add_port(PortSpec::custom(Box::new(p)), w99).is_err());
    let on = log.dropped_on.lock().unwrap().clone();
    assert!(on.is_some(), "dropped");
    assert_ne!(on.as_deref(), Some("vqos-loop"), "dropped on {on:?}");
    assert!(r.sw.stats().port("s2").is_none());
}

#[test]
fn a_slow_loop_delays_a_control_call_but_never_loses_its_answer() {
    let r = rig();
    let (p, peer, log) = spy("slow");
    r.sw.add_port(PortSpec::custom(Box::new(p)), VifPolicy::default())
        .unwrap();
    // The loop stalls 5.5 s in a read (longer than the old 5 s reply timeout).
    log.stall_ms.store(5_500, Ordering::SeqCst);
    peer.inject(frame(MAC_U, 0x02_00_00_00_00_0c, 1));
    eventually("the loop stalls", || log.stalled.load(Ordering::SeqCst));
    let w3 = VifPolicy {
        weight: 3,
        ..Default::default()
    };
    r.sw.set_policy("a", w3.clone()).unwrap();
    assert_eq!(r.sw.policies().vifs[0].policy, w3);
    let s = stats_where(&r.sw, |s| {
        s.port("a").and_then(|p| p.policy.as_ref()) == Some(&w3)
    });
    assert_eq!(s.ports.len(), 4);
    assert_eq!(tag_of(&collect(&r.u, 1)[0]), 1);
}

#[test]
fn one_vif_cannot_fill_the_mac_table_for_the_others() {
    let r = rig_with(
        |c| {
            c.mac_capacity = 32;
            c.mac_capacity_per_vif = 8;
        },
        None,
    );
    // a (no allow-list) sends from 100 addresses.
    for m in 0..100u64 {
        r.a.inject(frame(MAC_U, 0x02_00_00_00_10_00 + m, 1));
    }
    collect(&r.u, 100);
    collect(&r.b, 100); // flooded: the uplink's address is not known yet
    let s = stats_where(&r.sw, |s| s.port("a").is_some_and(|p| p.rx_frames == 100));
    assert_eq!(s.port("a").unwrap().mac_learn_refused, 92);
    assert_eq!(s.mac_entries, 8);
    // b is still learnt, so the uplink's reply to b is not flooded to a.
    r.b.inject(frame(MAC_U, MAC_B, 2));
    collect(&r.u, 1);
    collect(&r.a, 1);
    r.u.inject(frame(MAC_B, MAC_U, 3));
    assert_eq!(tag_of(&collect(&r.b, 1)[0]), 3);
    std::thread::sleep(Duration::from_millis(30));
    assert!(r.a.take_sent().is_empty(), "b's unicast did not leak to a");
    let s = r.sw.stats();
    assert_eq!(s.port("b").unwrap().mac_learn_refused, 0);
}

/// A port that reports reading more bytes than its buffer holds, then behaves.
struct Liar {
    inner: MemPort,
    lied: bool,
}

impl Port for Liar {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        if !self.lied && self.inner.counters().rx_frames > 0 {
            self.lied = true;
            if batch.free_slot().is_some() {
                batch.commit(1 << 20);
                return Ok(1 + self.inner.recv_batch(batch, max_frames - 1)?);
            }
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

#[test]
fn a_port_reporting_a_length_past_its_buffer_does_not_stop_the_loop() {
    let r = rig();
    let (inner, peer) = MemPort::pair("liar", 100);
    let liar = Liar { inner, lied: false };
    r.sw.add_port(PortSpec::custom(Box::new(liar)), VifPolicy::default())
        .unwrap();
    peer.inject(frame(MAC_U, 0x02_00_00_00_00_0c, 1));
    assert_eq!(tag_of(&collect(&r.u, 1)[0]), 1);
    peer.inject(frame(MAC_U, 0x02_00_00_00_00_0c, 2));
    assert_eq!(tag_of(&collect(&r.u, 1)[0]), 2);
    let s = stats_where(&r.sw, |s| s.port("liar").is_some_and(|p| p.rx_frames == 3));
    assert_eq!(s.port("liar").unwrap().drops.oversized, 1);
}

/// A [`MemPort`] that offers no readiness descriptor (can only be polled).
struct NoFd(MemPort);

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

#[test]
fn a_port_without_readiness_fd_keeps_being_read_in_epoll_mode() {
    let r = rig();
    let (inner, peer) = MemPort::pair("nofd", 100);
    r.sw.add_port(
        PortSpec::custom(Box::new(NoFd(inner))),
        VifPolicy::default(),
    )
    .unwrap();
    for tag in 1..=3 {
        // Each frame arrives after the loop found the port drained and went idle.
        std::thread::sleep(Duration::from_millis(40));
        peer.inject(frame(MAC_U, 0x02_00_00_00_00_0c, tag));
        assert_eq!(tag_of(&collect(&r.u, 1)[0]), tag);
    }
}

#[test]
fn concurrent_set_policy_calls_never_undo_each_other() {
    let r = Arc::new(rig());
    let lost = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = ["a", "b"]
        .into_iter()
        .enumerate()
        .map(|(id, name)| {
            let (r, lost) = (r.clone(), lost.clone());
            std::thread::spawn(move || {
                for w in 1..=1000 {
                    let p = VifPolicy {
                        weight: w,
                        ..Default::default()
                    };
                    r.sw.set_policy(name, p).unwrap();
                    // Only this thread raises this vif's weight: lower means another call
                    // wrote back a stale copy of it.
                    if r.sw.policies().vifs[id].policy.weight < w {
                        lost.store(true, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(!lost.load(Ordering::SeqCst), "an update was lost");
    let p = r.sw.policies();
    assert_eq!(
        (p.vifs[0].policy.weight, p.vifs[1].policy.weight),
        (1000, 1000)
    );
}

#[test]
fn frames_read_before_a_port_error_are_forwarded_and_the_port_retried() {
    let (up, u) = MemPort::pair("up", 10_000);
    let sw = SwitchHandle::start(SwitchConfig::new(PortSpec::custom(Box::new(up)))).unwrap();
    let (pa, a) = MemPort::pair("fa", 10_000);
    let plan = FaultPlan {
        fail_recv_after_read_every: Some(1),
        ..Default::default()
    };
    let fa = FaultPort::new(Box::new(pa), plan);
    sw.add_port(PortSpec::custom(Box::new(fa)), VifPolicy::default())
        .unwrap();
    for i in 0..40 {
        a.inject(frame(MAC_U, MAC_A, i));
    }
    // Every read errs after reading: the frames still go out, the port is retried.
    let got = collect(&u, 40);
    let tags: Vec<u8> = got.iter().map(|f| tag_of(f)).collect();
    assert_eq!(tags, (0..40).collect::<Vec<u8>>());
    let s = stats_where(&sw, |s| s.port("fa").is_some_and(|p| p.rx_frames == 40));
    let p = s.port("fa").unwrap();
    assert!(p.rx_errors >= 2, "{}", p.rx_errors);
    assert_eq!(s.loop_stats.burst_frames, 40);
}

/// An uplink whose writes take 5 µs per frame, as a TAP write that delivers the frame to the
/// sink's socket does in the lab: it makes the loop slower than the vifs' senders.
struct SlowSink(MemPort);

impl Port for SlowSink {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn recv_batch(&mut self, batch: &mut Batch, max_frames: usize) -> Result<usize, PortError> {
        self.0.recv_batch(batch, max_frames)
    }
    fn send_batch(&mut self, batch: &Batch, indices: &[u8]) -> Result<usize, PortError> {
        std::thread::sleep(Duration::from_micros(5 * indices.len() as u64));
        self.0.send_batch(batch, indices)
    }
    fn readiness_fd(&self) -> Option<RawFd> {
        self.0.readiness_fd()
    }
    fn counters(&self) -> PortIoCounters {
        self.0.counters()
    }
}

/// C2QoS Fig. 6(e) under `tcm` (docs/experiments.md): three vifs with a standing backlog of
/// 64-byte frames kept the loop busy without a pause, and a vif whose short read had cleared
/// its ready flag was not marked ready again (readiness was only collected when the loop went
/// idle): VM1 starved for seconds at a time although the engine reads every ready vif.
#[test]
fn a_drained_vif_is_served_again_while_others_stay_backlogged() {
    const MAC_1: u64 = 0x02_00_00_00_00_21;
    let floods = [
        0x02_00_00_00_00_22u64,
        0x02_00_00_00_00_23,
        0x02_00_00_00_00_24,
    ];
    for readiness in [Readiness::Epoll, Readiness::BusyPoll] {
        let (up, u) = MemPort::pair("up", 1_000);
        let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(SlowSink(up))));
        cfg.engine = EngineKind::Tcm;
        cfg.capacity_bps = Some(1_000_000_000);
        cfg.readiness = readiness;
        let sw = SwitchHandle::start(cfg).unwrap();
        let mut peers = Vec::new();
        for (name, max) in [("vm1", 400), ("vm2", 400), ("vm3", 100), ("vm4", 100)] {
            let (p, peer) = MemPort::pair(name, 1_000);
            let policy = VifPolicy {
                max_bps: Some(max * 1_000_000),
                ..Default::default()
            };
            sw.add_port(PortSpec::custom(Box::new(p)), policy).unwrap();
            peers.push(peer);
        }
        // The sink's address is learnt on the uplink, so nothing is flooded to the vifs.
        u.inject(frame(BCAST, MAC_U, 0));
        stats_where(&sw, |s| s.mac_entries == 1);
        // The neighbours: 64-byte frames, topped up so that every read of them is a full one.
        let stop = Arc::new(AtomicBool::new(false));
        let small: Vec<Vec<u8>> = floods
            .iter()
            .map(|&m| build_frame(VnetHdr::default(), MAC_U, m, 0x0800, &[0; 50]))
            .collect();
        let feeder = {
            let (stop, peers) = (stop.clone(), peers[1..].to_vec());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (p, f) in peers.iter().zip(&small) {
                        while p.pending() < 4_096 {
                            p.inject(f.clone());
                        }
                    }
                    std::thread::yield_now();
                }
            })
        };
        eventually("backlogged neighbours", || {
            peers[1..].iter().all(|p| p.pending() >= 1_024)
        });
        // VM1: steady 1500-byte frames, 4 every millisecond (~49 Mbit/s), for 0.5 s.
        let big = build_frame(VnetHdr::default(), MAC_U, MAC_1, 0x0800, &[0; 1_486]);
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < Duration::from_millis(500) {
            for _ in 0..4 {
                peers[0].inject(big.clone());
            }
            sent += 4;
            std::thread::sleep(Duration::from_millis(1));
            u.take_sent();
        }
        std::thread::sleep(Duration::from_millis(50));
        let backlogged = peers[1..].iter().all(|p| p.pending() > 0);
        let s = sw.stats();
        stop.store(true, Ordering::Relaxed);
        feeder.join().unwrap();
        let vm1 = s.port("vm1").unwrap();
        assert!(backlogged, "{readiness:?}: the neighbours' backlog ran out");
        assert!(
            vm1.rx_frames * 10 >= sent * 9,
            "{readiness:?}: vm1 read {} of {sent} frames, {} still waiting",
            vm1.rx_frames,
            peers[0].pending()
        );
        assert_eq!(vm1.drops.total(), 0, "{readiness:?}");
        sw.stop().unwrap();
    }
}

/// A wall-clock test of the thread wrapper: a live loop reports itself running and publishes
/// within a few stats intervals; a stopped one reports not running.
#[test]
fn loop_health_follows_the_thread() {
    let r = rig();
    eventually("a fresh stats snapshot", || {
        let h = r.sw.loop_health();
        h.running && h.stats_age_ns < 1_000_000_000
    });
    r.sw.stop().unwrap();
    assert!(!r.sw.loop_health().running);
}
