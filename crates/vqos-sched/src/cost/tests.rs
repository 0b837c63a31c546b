use super::*;
use crate::engine::EngineKind;
use crate::policy::{CostModel, PolicyError, PolicySet, VifPolicy};
use crate::sold::format_cost;

fn max(gbit: u64) -> VifPolicy {
    VifPolicy {
        max_bps: Some(gbit * 1_000_000_000),
        ..Default::default()
    }
}

/// The paper's 4/4/1/1 Gbit/s purchases on a 1.54 GHz core sold as 10 Gbit/s, priced in
/// cycles with `model` at `frame_bytes`.
fn purchases(model: Option<FrameCost>, frame_bytes: u32) -> PolicySet {
    let mut set = PolicySet::new(Some(10_000_000_000))
        .with_vif("vm1", max(4))
        .with_vif("vm2", max(4))
        .with_vif("vm3", max(1))
        .with_vif("vm4", max(1));
    set.cost = CostModel::Cycles;
    set.cycles_per_sec = 1_540_000_000;
    set.pricing = Pricing {
        model,
        frame_bytes,
        ..Pricing::default()
    };
    set
}

#[test]
fn a_model_is_finite_non_negative_and_not_free() {
    let m = FrameCost::new(1300.0, 0.25).unwrap();
    assert_eq!(m.cycles(1518), 1300.0 + 379.5);
    for (a, b, msg) in [
        (
            f64::NAN,
            1.0,
            "base_cycles = NaN must be a finite number in 0..=100000000",
        ),
        (
            1.0,
            f64::INFINITY,
            "cycles_per_byte = inf must be a finite number in 0..=1000000",
        ),
        (
            -1.0,
            1.0,
            "base_cycles = -1 must be a finite number in 0..=100000000",
        ),
        (
            1.0,
            -0.5,
            "cycles_per_byte = -0.5 must be a finite number in 0..=1000000",
        ),
        (
            2e8,
            0.0,
            "base_cycles = 200000000 must be a finite number in 0..=100000000",
        ),
        (0.0, 0.0, "base_cycles and cycles_per_byte cannot both be 0"),
    ] {
        assert_eq!(FrameCost::new(a, b).unwrap_err().to_string(), msg);
    }
    // Deserialised models are validated too.
    let ok: FrameCost = serde_json::from_str(r#"{"base_cycles":10,"cycles_per_byte":0}"#).unwrap();
    assert_eq!(ok.base_cycles(), 10.0);
    let e =
        serde_json::from_str::<FrameCost>(r#"{"base_cycles":0,"cycles_per_byte":0}"#).unwrap_err();
    assert!(e.to_string().contains("cannot both be 0"), "{e}");
}

#[test]
fn purchases_are_priced_at_the_reference_frame() {
    let m = FrameCost::new(1300.0, 0.25).unwrap();
    // 4 Gbit/s of 1518-byte frames = 329 381 frames/s × 1679.5 cycles.
    let set = purchases(Some(m), 1518);
    let expect = (4e9 / (8.0 * 1518.0) * 1679.5_f64).round() as u64;
    assert_eq!(set.cost_per_sec(4_000_000_000), expect);
    assert_eq!(expect, 553_194_993);
    // At the iMIX average the same purchase is 4.3 times as many frames, 3.5 times the cycles.
    let imix = purchases(Some(m), IMIX_FRAME_BYTES);
    assert_eq!(imix.cost_per_sec(4_000_000_000), 1_961_158_192);
    // Without a model: the purchase's share of the capacity is its share of the core.
    let linear = purchases(None, IMIX_FRAME_BYTES);
    assert_eq!(linear.cost_per_sec(4_000_000_000), 616_000_000);
    // Bytes are bytes whatever the pricing.
    let mut bytes = set.clone();
    bytes.cost = CostModel::Bytes;
    assert_eq!(bytes.cost_per_sec(8_000), 1_000);
    // A burst is priced as a rate over one second.
    assert_eq!(set.burst_cost(1518), 1680);
}

#[test]
fn c2qos_refuses_a_set_that_oversells_the_core() {
    let m = FrameCost::new(1300.0, 0.25).unwrap();
    // At 1518-byte frames the 10 Gbit/s of purchases need 90 % of the core (the paper's
    // 36/36/9/9 %): accepted.
    let set = purchases(Some(m), 1518);
    let sold = set.sold(EngineKind::C2qos).unwrap();
    assert_eq!(sold.budget_per_sec, 1_540_000_000);
    assert_eq!(sold.sold_per_sec, 1_382_987_482);
    assert!(set.check_sold(EngineKind::C2qos).is_ok());
    // Priced at iMIX frames they need 3 × the core: refused, with the numbers.
    let imix = purchases(Some(m), IMIX_FRAME_BYTES);
    assert_eq!(
        imix.check_sold(EngineKind::C2qos).unwrap_err().to_string(),
        "Purchases need 4.903G cycles/s, more than the 1.540G cycles/s the switch may sell (c2qos)"
    );
    // Selling only 85 % of the core refuses the 90 % too.
    let mut share = set.clone();
    share.pricing.core_share = 0.85;
    assert!(matches!(
        share.check_sold(EngineKind::C2qos),
        Err(PolicyError::Oversold { .. })
    ));
    // A vif without a max is committed its min; a max counts whatever the min.
    let mut floors = set.with_vif(
        "vm5",
        VifPolicy {
            min_bps: 2_000_000_000,
            ..Default::default()
        },
    );
    assert!(floors.check_sold(EngineKind::C2qos).is_err());
    floors.vifs[4].policy.min_bps = 1_000_000_000;
    assert!(floors.check_sold(EngineKind::C2qos).is_ok());
}

#[test]
fn vqos_sells_floors_and_other_engines_sell_nothing_in_cycles() {
    let m = FrameCost::new(1300.0, 0.25).unwrap();
    // Maximums above the core are limits, not guarantees, for the work-conserving engine.
    let set = purchases(Some(m), IMIX_FRAME_BYTES);
    assert_eq!(set.sold(EngineKind::Vqos).unwrap().sold_per_sec, 0);
    assert!(set.check_sold(EngineKind::Vqos).is_ok());
    let floored = set
        .with_policy(
            "vm1",
            VifPolicy {
                min_bps: 4_000_000_000,
                ..max(4)
            },
        )
        .unwrap();
    assert!(matches!(
        floored.check_sold(EngineKind::Vqos),
        Err(PolicyError::Oversold { .. })
    ));
    for e in [
        EngineKind::Rr,
        EngineKind::Ancs,
        EngineKind::Policer,
        EngineKind::Tcm,
    ] {
        assert_eq!(floored.sold(e), None, "{e}");
    }
    // Under bytes, c2qos sells the link: Σ max above the capacity is refused.
    let mut bytes = purchases(None, IMIX_FRAME_BYTES).with_vif("vm5", max(1));
    bytes.cost = CostModel::Bytes;
    assert_eq!(
        bytes.check_sold(EngineKind::C2qos).unwrap_err().to_string(),
        "Purchases need 1.375G bytes/s, more than the 1.250G bytes/s the switch may sell (c2qos)"
    );
    // Nothing to price against: no model and no capacity.
    let mut open = purchases(None, IMIX_FRAME_BYTES);
    open.capacity_bps = None;
    assert_eq!(open.sold(EngineKind::C2qos), None);
}

#[test]
fn pricing_is_validated_with_the_set() {
    let mut set = purchases(None, 0);
    assert_eq!(
        set.validate().unwrap_err().to_string(),
        "price_frame_bytes = 0 must be in 1..=65536"
    );
    set.pricing.frame_bytes = 64;
    for share in [0.0, 1.5, f64::NAN] {
        set.pricing.core_share = share;
        assert!(matches!(
            set.validate(),
            Err(PolicyError::Pricing(CostError::BadCoreShare(_)))
        ));
    }
    set.pricing.core_share = 1.0;
    assert!(set.validate().is_ok());
}

#[test]
fn the_simulators_model_prices_small_packets_per_bit_and_linearises() {
    let m = CycleCostModel::default();
    let per_bit_small = m.cycles(64, 10) / 512.0;
    let per_bit_big = m.cycles(1518, 10) / (1518.0 * 8.0);
    let ratio = per_bit_small / per_bit_big;
    assert!((7.0..=13.0).contains(&ratio), "ratio {ratio}");
    assert!(m.cycles(1518, 100_000) > m.cycles(1518, 10));
    let l = m.linear().unwrap();
    assert_eq!(l.cycles(1518), m.cycles(1518, 1));
    assert_eq!(m.pricing().unwrap(), None);
    let priced = CycleCostModel {
        price_frame_bytes: Some(1518),
        ..m
    };
    let p = priced.pricing().unwrap().unwrap();
    assert_eq!((p.model, p.frame_bytes, p.core_share), (Some(l), 1518, 1.0));
    let bad = CycleCostModel {
        price_frame_bytes: Some(0),
        ..m
    };
    assert_eq!(bad.pricing().unwrap_err(), CostError::BadFrameBytes(0));
}

#[test]
fn cost_rates_read_well() {
    assert_eq!(
        format_cost(1_540_000_000, CostModel::Cycles),
        "1.540G cycles/s"
    );
    assert_eq!(format_cost(2_500, CostModel::Bytes), "2.500k bytes/s");
    assert_eq!(format_cost(7, CostModel::Cycles), "7.000 cycles/s");
}
