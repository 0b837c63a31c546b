//! The switch's behaviour when a port misbehaves, on in-memory ports stepped in virtual time
//! ([`common::VRig`]): a port whose reads or writes fail, a port that reports more bytes than
//! its buffer holds, a port that errs after reading. Each affects only itself.

mod common;

use common::*;
use vqos_dataplane::{DropReason, FaultPlan, FaultPort, MemPort, PortSpec, Switch, SwitchConfig};
use vqos_sched::VifPolicy;

#[test]
fn faulty_port_does_not_stop_the_switch() {
    let (up, u) = MemPort::pair("up", 10_000);
    let mut sw = Switch::new(SwitchConfig::new(PortSpec::custom(Box::new(up))), 0).unwrap();
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
        0,
    )
    .unwrap();
    for i in 0..20 {
        a.inject(frame(MAC_U, MAC_A, i));
    }
    let mut now = 0;
    // Failed reads are retried at the next stats publication.
    while sw.stats(now).port("fa").unwrap().counters.rx_frames < 20 {
        run_switch(&mut sw, now);
        now += 25_000_000;
        assert!(
            now < 10_000_000_000,
            "the faulty port was not read to the end"
        );
    }
    let s = sw.stats(now);
    let d = s.port("fa").unwrap().counters.drops;
    // Frames 4, 8, 12, 16, 20 corrupted; 5, 10, 15, 20 truncated (20 counts as truncated).
    assert_eq!(d[DropReason::Truncated], 4);
    assert_eq!(d[DropReason::BadVnetHdr], 4);
    assert_eq!(u.take_sent().len(), 12);
    // Sends to the faulty port fail every other batch: counted, not fatal.
    for _ in 0..4 {
        u.inject(frame(MAC_A, MAC_U, 1));
        run_switch(&mut sw, now);
    }
    let s = sw.stats(now);
    assert_eq!(s.port("up").unwrap().counters.rx_frames, 4);
    let fa = s.port("fa").unwrap();
    assert_eq!(
        fa.counters.tx_frames + fa.counters.drops[DropReason::TxError],
        4
    );
    assert!(fa.counters.drops[DropReason::TxError] >= 1);
}

/// A port that reports reading more bytes than its buffer holds, then behaves.
struct Liar {
    inner: MemPort,
    lied: bool,
}

impl vqos_dataplane::Port for Liar {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn recv_batch(
        &mut self,
        batch: &mut vqos_dataplane::Batch,
        max_frames: usize,
    ) -> Result<usize, vqos_dataplane::PortError> {
        if !self.lied && self.inner.counters().rx_frames > 0 {
            self.lied = true;
            if batch.free_slot().is_some() {
                batch.commit(1 << 20);
                return Ok(1 + self.inner.recv_batch(batch, max_frames - 1)?);
            }
        }
        self.inner.recv_batch(batch, max_frames)
    }
    fn send_batch(
        &mut self,
        batch: &vqos_dataplane::Batch,
        indices: &[u8],
    ) -> Result<usize, vqos_dataplane::PortError> {
        self.inner.send_batch(batch, indices)
    }
    fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.readiness_fd()
    }
    fn counters(&self) -> vqos_dataplane::PortIoCounters {
        self.inner.counters()
    }
}

#[test]
fn a_port_reporting_a_length_past_its_buffer_does_not_stop_the_loop() {
    let mut r = VRig::new();
    let (inner, peer) = MemPort::pair("liar", 100);
    let liar = Liar { inner, lied: false };
    r.sw.add_port(PortSpec::custom(Box::new(liar)), VifPolicy::default(), 0)
        .unwrap();
    peer.inject(frame(MAC_U, 0x02_00_00_00_00_0c, 1));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![1]);
    peer.inject(frame(MAC_U, 0x02_00_00_00_00_0c, 2));
    r.run();
    assert_eq!(tags(&r.u.take_sent()), vec![2]);
    let s = r.stats();
    assert_eq!(s.port("liar").unwrap().counters.rx_frames, 3);
    assert_eq!(
        s.port("liar").unwrap().counters.drops[DropReason::Oversized],
        1
    );
}

#[test]
fn frames_read_before_a_port_error_are_forwarded_and_the_port_retried() {
    let (up, u) = MemPort::pair("up", 10_000);
    let mut sw = Switch::new(SwitchConfig::new(PortSpec::custom(Box::new(up))), 0).unwrap();
    let (pa, a) = MemPort::pair("fa", 10_000);
    let plan = FaultPlan {
        fail_recv_after_read_every: Some(1),
        ..Default::default()
    };
    let fa = FaultPort::new(Box::new(pa), plan);
    sw.add_port(PortSpec::custom(Box::new(fa)), VifPolicy::default(), 0)
        .unwrap();
    for i in 0..40 {
        a.inject(frame(MAC_U, MAC_A, i));
    }
    // Every read errs after reading: the frames still go out, the port is retried.
    run_switch(&mut sw, 0);
    assert_eq!(tags(&u.take_sent()), (0..40).collect::<Vec<u8>>());
    let s = sw.stats(0);
    let p = s.port("fa").unwrap();
    assert_eq!(p.counters.rx_frames, 40);
    assert!(p.counters.rx_errors >= 2, "{}", p.counters.rx_errors);
    assert_eq!(s.loops_total().burst_frames, 40);
}
