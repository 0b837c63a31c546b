//! Prometheus text exposition (format 0.0.4) of the switch's stats.
//!
//! Every family in [`FAMILIES`] gets its `# HELP` and `# TYPE` lines, then one sample per port,
//! loop or drop reason; the standard `process_*` families of the daemon follow. Counters end in `_total` and count in base units (frames, bytes,
//! cycles); rates are left to Prometheus (`rate()`), so no sample is a short-window rate that a
//! scrape would alias. Gauges are levels: configuration (policies, capacity, bit/s like the
//! API), engine state, controller outputs.
//!
//! The renderer is written by hand rather than with `prometheus-client`: the stats arrive as a
//! fresh snapshot per scrape, which the crate's model (long-lived metric objects updated in
//! place, or a collector re-encoding them) would only copy into its registry and back out;
//! [`parse`] checks the output strictly in the tests instead, and `promtool check metrics` lints
//! a real scrape (crates/vqosd/tests/metrics_doc.rs).

use std::fmt::Write;

use crate::backend::{LoopStats, PortStats};
use crate::wire::{HealthView, PortStatsView, StatsView};

mod families;
mod parse;
mod process;
mod vhost;

pub use families::FAMILIES;
pub use parse::{parse, Exposition, Sample};
/// The standard `process_*` families, rendered beside [`FAMILIES`].
pub use process::FAMILIES as PROCESS_FAMILIES;

/// Content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Reads one counter out of a port's, a loop's or a vhost-user session's stats.
type Counter<T> = fn(&T) -> u64;

/// The per-port counters: family and value.
const PORT_COUNTERS: &[(&str, Counter<PortStats>)] = &[
    ("vqos_port_rx_frames_total", |s| s.counters.rx_frames),
    ("vqos_port_rx_bytes_total", |s| s.counters.rx_bytes),
    ("vqos_port_tx_frames_total", |s| s.counters.tx_frames),
    ("vqos_port_tx_bytes_total", |s| s.counters.tx_bytes),
    ("vqos_port_tx_cut_through_total", |s| {
        s.counters.tx_cut_through
    }),
    ("vqos_port_ecn_marked_total", |s| s.counters.ecn_marked),
    ("vqos_port_ecn_not_ect_total", |s| s.counters.ecn_not_ect),
    ("vqos_port_rx_errors_total", |s| s.counters.rx_errors),
    ("vqos_port_mac_learn_refused_total", |s| {
        s.counters.mac_learn_refused
    }),
    ("vqos_port_queued_frames", |s| s.queued_frames),
    ("vqos_port_queued_bytes", |s| s.queued_bytes),
];

/// The per-loop counters (the cycle counters also carry their unit).
const LOOP_COUNTERS: &[(&str, Counter<LoopStats>)] = &[
    ("vqos_loop_busy_cycles_total", |l| l.busy_cycles),
    ("vqos_loop_idle_cycles_total", |l| l.idle_cycles),
    ("vqos_loop_iterations_total", |l| l.iterations),
    ("vqos_loop_bursts_total", |l| l.bursts),
    ("vqos_loop_burst_frames_total", |l| l.burst_frames),
    ("vqos_loop_engine_ticks_total", |l| l.engine_ticks),
    ("vqos_loop_engine_refusals_total", |l| l.engine_refusals),
    ("vqos_loop_capacity_waits_total", |l| l.capacity_waits),
    ("vqos_loop_commands_total", |l| l.commands),
    ("vqos_loop_epoll_errors_total", |l| l.epoll_errors),
];

/// Escapes a label value (backslash, double quote, newline).
fn esc(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The samples of the per-port family `name` for port `p` (labels after `port`, value).
fn port_samples(name: &str, p: &PortStatsView) -> Vec<(String, String)> {
    let s = &p.stats;
    if name.starts_with("vqos_vhost_user_") {
        return vhost::port_samples(name, s);
    }
    if let Some((_, get)) = PORT_COUNTERS.iter().find(|(n, _)| *n == name) {
        return vec![(String::new(), get(s).to_string())];
    }
    let one = |v: String| vec![(String::new(), v)];
    let pol = p.policy.as_ref();
    match name {
        "vqos_port_info" => vec![(format!(",role=\"{}\"", esc(&p.role)), "1".into())],
        "vqos_port_drops_total" => s
            .counters
            .drops
            .iter()
            .map(|(reason, n)| (format!(",reason=\"{}\"", reason.name()), n.to_string()))
            .collect(),
        // No bucket, no level to graph or alert on: no sample rather than a sentinel.
        "vqos_port_credit" => s.credit.map(|c| c.to_string()).map_or_else(Vec::new, one),
        "vqos_port_throttled" => one(u8::from(s.throttled).to_string()),
        "vqos_controller_limit_bps" => p
            .controller_limit_bps
            .map(|l| l.to_string())
            .map_or_else(Vec::new, one),
        "vqos_ecn_probability" => p
            .ecn_probability
            .map(|e| e.to_string())
            .map_or_else(Vec::new, one),
        "vqos_policy_weight" => pol.map(|x| x.weight.to_string()).map_or_else(Vec::new, one),
        "vqos_policy_min_bps" => pol
            .map(|x| x.min_bps.to_string())
            .map_or_else(Vec::new, one),
        "vqos_policy_max_bps" => pol
            .and_then(|x| x.max_bps)
            .map(|m| m.to_string())
            .map_or_else(Vec::new, one),
        "vqos_policy_priority" => pol
            .map(|x| x.priority.to_string())
            .map_or_else(Vec::new, one),
        "vqos_policy_max_in_bps" => pol
            .and_then(|x| x.max_in_bps)
            .map(|m| m.to_string())
            .map_or_else(Vec::new, one),
        "vqos_policy_burst_bytes" => pol
            .and_then(|x| x.burst_bytes)
            .map(|b| b.to_string())
            .map_or_else(Vec::new, one),
        _ => Vec::new(),
    }
}

/// The samples of the daemon-wide family `name` (labels, value), `None` if it is not one.
fn daemon_samples(
    name: &str,
    stats: &StatsView,
    health: &HealthView,
    start_time_s: f64,
) -> Option<Vec<(String, String)>> {
    let one = |v: String| vec![(String::new(), v)];
    let seconds = |ms: u64| (ms as f64 / 1000.0).to_string();
    Some(match name {
        "vqos_info" => vec![(
            format!(
                "engine=\"{}\",version=\"{}\"",
                esc(&stats.engine),
                env!("CARGO_PKG_VERSION")
            ),
            "1".into(),
        )],
        "vqos_capacity_bps" => stats
            .capacity_bps
            .map_or_else(Vec::new, |c| one(c.to_string())),
        "vqos_mac_entries" => one(stats.mac_entries.to_string()),
        "vqos_start_time_seconds" => one(start_time_s.to_string()),
        // A state set: every status has a series, 1 for the current one.
        "vqos_health_status" => ["ok", "degraded", "unhealthy"]
            .iter()
            .map(|s| {
                let on = u8::from(health.status == *s);
                (format!("status=\"{s}\""), on.to_string())
            })
            .collect(),
        "vqos_forwarding_running" => one(u8::from(health.forwarding.running).to_string()),
        "vqos_forwarding_stats_age_seconds" => one(seconds(health.forwarding.stats_age_ms)),
        "vqos_forwarding_stale_after_seconds" => one(seconds(health.forwarding.stale_after_ms)),
        _ => return None,
    })
}

/// The samples of the per-loop family `name` (labels, value).
fn loop_samples(name: &str, stats: &StatsView) -> Vec<(String, String)> {
    let label = |l: &LoopStats| format!("loop=\"{}\"", esc(&l.name));
    if name == "vqos_loop_epoll_wait_fallback" {
        return stats
            .loops
            .iter()
            .map(|l| (label(l), u8::from(l.epoll_wait_fallback).to_string()))
            .collect();
    }
    let Some((_, get)) = LOOP_COUNTERS.iter().find(|(n, _)| *n == name) else {
        return Vec::new();
    };
    stats
        .loops
        .iter()
        .map(|l| {
            let mut labels = label(l);
            if name.ends_with("_cycles_total") {
                let _ = write!(labels, ",unit=\"{}\"", esc(&l.cycles_unit));
            }
            (labels, get(l).to_string())
        })
        .collect()
}

/// Appends one family to `out`: its HELP and TYPE lines, then a line per (labels, value)
/// sample (labels already rendered, `a="x",b="y"`; empty: none). The one writer of a family,
/// for these metrics and the cluster agent's.
pub(crate) fn write_family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: &[(String, impl std::fmt::Display)],
) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

/// Renders the exposition of `stats` and `health` (the body of `GET /v1/health`);
/// `start_time_s` is the daemon's start, Unix seconds.
pub fn render(stats: &StatsView, health: &HealthView, start_time_s: f64) -> String {
    let mut out = String::new();
    for &(name, kind, help) in FAMILIES {
        let samples = if let Some(s) = daemon_samples(name, stats, health, start_time_s) {
            s
        } else if name.starts_with("vqos_loop_") {
            loop_samples(name, stats)
        } else {
            let mut all = Vec::new();
            for p in &stats.ports {
                let port = format!("port=\"{}\"", esc(&p.stats.name));
                for (more, value) in port_samples(name, p) {
                    all.push((format!("{port}{more}"), value));
                }
            }
            all
        };
        write_family(&mut out, name, kind, help, &samples);
    }
    process::render(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{LoopStats, PortStats};
    use crate::wire::{PolicyView, PortStatsView};
    use vqos_api::stats::{
        DropCounters, DropReason, PortCounters, PortStatus, VhostUserCounters, VhostUserStatus,
    };
    use vqos_sched::VifPolicy;

    /// A switch where every metric has something to say.
    fn full() -> StatsView {
        let policy = VifPolicy {
            weight: 2,
            min_bps: 1_000,
            max_bps: Some(5_000),
            priority: 1,
            max_in_bps: Some(4_000),
            burst_bytes: Some(1_500),
        };
        let mut drops = DropCounters::default();
        drops[DropReason::Spoofed] = 3;
        StatsView {
            engine: "vqos".into(),
            capacity_bps: Some(940_000_000),
            ports: vec![
                PortStatsView {
                    stats: PortStats {
                        name: "vm\"1".into(),
                        counters: PortCounters {
                            rx_frames: 10,
                            drops,
                            ..Default::default()
                        },
                        credit: Some(-5),
                        throttled: true,
                        status: Some(PortStatus::VhostUser(Box::new(VhostUserStatus {
                            socket: "/run/vqos/vm1.sock".into(),
                            connected: true,
                            counters: VhostUserCounters {
                                chain_loop: 2,
                                ..Default::default()
                            },
                            pair_frames: vec![[5, 6]],
                            ..Default::default()
                        }))),
                        ..Default::default()
                    },
                    role: "vif".into(),
                    id: vqos_api::wire::PortId(1),
                    policy: Some(PolicyView::from(&policy)),
                    controller_limit_bps: Some(3_000),
                    ecn_probability: Some(0.25),
                },
                PortStatsView {
                    stats: PortStats {
                        name: "up0".into(),
                        ..Default::default()
                    },
                    role: "uplink".into(),
                    id: Default::default(),
                    policy: None,
                    controller_limit_bps: None,
                    ecn_probability: None,
                },
            ],
            loops: vec![LoopStats {
                name: "pmd0".into(),
                busy_cycles: 7,
                idle_cycles: 9,
                bursts: 2,
                cycles_unit: "tsc".into(),
                ..Default::default()
            }],
            mac_entries: 4,
            cost_model: None,
        }
    }

    /// A degraded daemon whose loop published 1.25 s ago.
    fn health() -> HealthView {
        HealthView {
            status: "degraded".into(),
            error: Some("etcd disconnected".into()),
            version: "0".into(),
            engine: "vqos".into(),
            capacity: "940Mbit".into(),
            ports: 1,
            uptime_s: 5,
            forwarding: crate::wire::LoopView {
                running: true,
                stats_age_ms: 1_250,
                stale_after_ms: 5_000,
            },
            cluster: None,
        }
    }

    #[test]
    fn every_declared_family_is_emitted_and_parses() {
        let text = render(&full(), &health(), 1_700_000_000.5);
        let Exposition { samples, types } = parse(&text).unwrap();
        assert_eq!(types.len(), FAMILIES.len() + process::FAMILIES.len());
        for (name, kind) in &types {
            assert!(
                samples.iter().any(|s| &s.name == name),
                "metric {name} ({kind}) is declared but never emitted"
            );
            assert_eq!(kind == "counter", name.ends_with("_total"), "{name}");
        }
        for s in &samples {
            assert!(
                types.iter().any(|(n, _)| n == &s.name),
                "{} undeclared",
                s.name
            );
        }
        let drop = samples
            .iter()
            .find(|s| s.name == "vqos_port_drops_total" && s.labels[1].1 == "spoofed")
            .unwrap();
        assert_eq!(drop.labels[0], ("port".to_string(), "vm\"1".to_string()));
        assert_eq!(drop.value, 3.0);
        let start = samples
            .iter()
            .find(|s| s.name == "vqos_start_time_seconds")
            .unwrap();
        assert_eq!(start.value, 1_700_000_000.5);
        let status: Vec<(&str, f64)> = samples
            .iter()
            .filter(|s| s.name == "vqos_health_status")
            .map(|s| (s.labels[0].1.as_str(), s.value))
            .collect();
        assert_eq!(status, [("ok", 0.0), ("degraded", 1.0), ("unhealthy", 0.0)]);
        let age = samples
            .iter()
            .find(|s| s.name == "vqos_forwarding_stats_age_seconds")
            .unwrap();
        assert_eq!(age.value, 1.25);
        let credit = samples
            .iter()
            .find(|s| s.name == "vqos_port_credit")
            .unwrap();
        assert_eq!(credit.value, -5.0);
        let ecn = samples
            .iter()
            .find(|s| s.name == "vqos_ecn_probability")
            .unwrap();
        assert_eq!((ecn.labels[0].1.as_str(), ecn.value), ("vm\"1", 0.25));
        // The uplink has no policy or controller samples.
        assert!(!samples.iter().any(|s| (s.name.starts_with("vqos_ecn")
            || s.name.starts_with("vqos_controller"))
            && s.labels[0].1 == "up0"));
        assert!(!samples
            .iter()
            .any(|s| s.name.starts_with("vqos_policy_") && s.labels[0].1 == "up0"));
    }
}
