//! The switch records every forwarded vif batch for calibration ([`vqos_dataplane::calib`]).

mod common;

use common::*;
use vqos_dataplane::{EmulatedWork, MemPort, PortSpec, Switch, SwitchConfig};
use vqos_sched::VifPolicy;

#[test]
fn every_forwarded_vif_batch_is_sampled_with_its_frames_bytes_and_cycles() {
    let (engine, log) = Refuser::new(&[]);
    let (up, u) = MemPort::pair("up", 10_000);
    let mut cfg = SwitchConfig::new(PortSpec::custom(Box::new(up)));
    cfg.custom_engine = Some(Box::new(engine));
    // Batches of 2 frames, each taking at least 1000 counter cycles per frame.
    cfg.emulated_work = Some(EmulatedWork {
        per_frame_cycles: 1000,
        per_byte_cycles: 0.0,
        batch_frames: 2,
    });
    let mut sw = Switch::new(cfg, 0).unwrap();
    let (pb, b) = MemPort::pair("b", 10_000);
    for i in 0..10 {
        b.inject(frame(MAC_U, MAC_B, i));
    }
    sw.add_port(PortSpec::custom(Box::new(pb)), VifPolicy::default(), 0)
        .unwrap();
    run_switch(&mut sw, 0);
    assert_eq!(u.take_sent().len(), 10);
    let samples = sw.cost_samples().snapshot();
    assert_eq!(samples.len(), 5, "{samples:?}");
    assert!(samples
        .iter()
        .all(|s| s.frames == 2 && s.bytes == 2 * 74 && s.cycles >= 2000));
    // The samples are the batches the engine was charged for (it was also charged for the
    // read that found the port empty, which is no sample).
    let l = log.lock().unwrap();
    let cycles: u64 = samples.iter().map(|s| s.cycles).sum();
    assert_eq!(l.charged_packets, 10);
    assert!(cycles <= l.charged_cycles && cycles >= 10_000);
    assert_eq!(sw.cost_samples().recorded(), 5);
}
