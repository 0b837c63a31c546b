//! Null ports (benchmarks' zero-cost ports) through the switch, in virtual time: their frames
//! pass port security and the address guards as a real station's would, go to the null
//! uplink as known unicast, and the engine shares the capacity among them by weight.

mod common;

use common::run_switch;
use vqos_dataplane::null::{NullPort, NULL_UPLINK_MAC};
use vqos_dataplane::{MacPolicy, PortSpec, Switch, SwitchConfig};
use vqos_sched::{EngineKind, VifPolicy};

#[test]
fn null_vifs_share_the_capacity_by_weight_and_nothing_is_dropped() {
    let sink = NullPort::sink("up").unwrap();
    let uplink =
        PortSpec::custom(Box::new(sink)).with_mac_policy(MacPolicy::Fixed(vec![NULL_UPLINK_MAC]));
    let mut cfg = SwitchConfig::new(uplink);
    cfg.engine = EngineKind::Vqos;
    cfg.capacity_bps = Some(100_000_000);
    let mut sw = Switch::new(cfg, 0).unwrap();
    for (name, weight) in [("n1", 1), ("n3", 3)] {
        let port = NullPort::vif(name, 1518).unwrap();
        let policy = VifPolicy {
            weight,
            ..VifPolicy::default()
        };
        sw.add_port(PortSpec::custom(Box::new(port)), policy, 0)
            .unwrap();
    }
    // One virtual second in 1 ms steps.
    let mut now = 0;
    for _ in 0..1_000 {
        now += 1_000_000;
        run_switch(&mut sw, now);
    }
    let s = sw.stats(now);
    let port = |n: &str| s.port(n).unwrap().counters;
    let (n1, n3, up) = (port("n1"), port("n3"), port("up"));
    for c in [n1, n3, up] {
        assert_eq!(c.drops.total(), 0, "{c:?}");
    }
    assert_eq!(
        up.tx_frames,
        n1.rx_frames + n3.rx_frames,
        "every frame to the uplink"
    );
    // 12.5 MB in the second (the capacity), split 1:3.
    let sent = up.tx_bytes as f64;
    assert!(
        (sent / 12_500_000.0 - 1.0).abs() < 0.03,
        "{sent} bytes in 1 s"
    );
    let ratio = n3.rx_bytes as f64 / n1.rx_bytes as f64;
    assert!((ratio / 3.0 - 1.0).abs() < 0.03, "n3/n1 = {ratio}");
}
