//! The control commands' tables and one-line descriptions, as `vqos` prints them.

use std::io::Write;

use anyhow::Result;
use vqos_api::wire::{PolicyView, PortKind, PortView, Service, StatsView, VhostUserRole};
use vqos_sched::units::format_rate;

/// `weight 3, min 200Mbit, max 500Mbit, priority 1`, then `, max_in 100Mbit, burst 64KiB`
/// when they are set, then `; enforced: min 150Mbit, max 300Mbit (cluster)` when a cluster
/// share or a controller changes what the switch enforces.
pub(super) fn describe(p: &PolicyView) -> String {
    let mut s = format!(
        "weight {}, min {}, max {}, priority {}",
        p.weight, p.min, p.max, p.priority
    );
    if let Some(m) = &p.max_in {
        s.push_str(&format!(", max_in {m}"));
    }
    if let Some(b) = &p.burst {
        s.push_str(&format!(", burst {b}"));
    }
    if let Some(e) = &p.enforced {
        s.push_str(&format!(
            "; enforced: min {}, max {} ({})",
            e.min,
            e.max,
            e.by.join(", ")
        ));
    }
    s
}

/// A service as the API and the options spell it.
fn service_name(s: Service) -> &'static str {
    match s {
        Service::Router => "router",
        Service::DhcpServer => "dhcp-server",
    }
}

pub(crate) fn write_ports(
    out: &mut impl Write,
    ports: &[PortView],
    stats: Option<&StatsView>,
) -> Result<()> {
    writeln!(
        out,
        "{:<16} {:>4} {:<10} {:>6} {:>10} {:>10} {:>10} {:>8} {:>4}  MACS",
        "PORT", "ID", "KIND", "WEIGHT", "MIN", "MAX", "MAX_IN", "BURST", "PRIO"
    )?;
    for p in ports {
        let macs: Vec<String> = p.port.macs.iter().map(|m| m.to_string()).collect();
        let kind = match (p.port.kind, p.port.create) {
            (PortKind::VhostUser, _) => "vhost-user",
            (PortKind::AfPacket, _) => "af-packet",
            (PortKind::Null, _) => "null",
            (PortKind::Tap, true) => "tap",
            (PortKind::Tap, false) => "tap-attach",
        };
        let macs = match (macs.is_empty(), p.port.port_security) {
            (false, _) => macs.join(","),
            (true, true) => "locked to the first 4".to_string(),
            (true, false) => "any (port security off)".to_string(),
        };
        // Only what differs from the default is shown: configured addresses and services.
        let mut extra: Vec<String> = Vec::new();
        if !p.port.ips.is_empty() {
            let ips: Vec<String> = p.port.ips.iter().map(|ip| ip.to_string()).collect();
            extra.push(format!("ips {}", ips.join(",")));
        }
        if !p.port.serves.is_empty() {
            let serves: Vec<&str> = p.port.serves.iter().map(|s| service_name(*s)).collect();
            extra.push(format!("serves {}", serves.join(",")));
        }
        if p.port.socket.is_none() {
            if let Some(q) = p.port.queues.filter(|&q| q > 1) {
                extra.push(format!("{q} queues"));
            }
        }
        if let Some(t) = p.port.thread {
            extra.push(format!("thread {t}"));
        }
        if let Some(h) = &p.state.handover {
            let state = if h.complete {
                "handed over"
            } else {
                "migrating"
            };
            extra.push(format!("{state} to {}", h.to));
        }
        let macs = if extra.is_empty() {
            macs
        } else {
            format!("{macs}; {}", extra.join("; "))
        };
        // As the options spell them: MAX_IN "max" is the same as MAX, BURST "default" the
        // engine's own.
        let pol = &p.port.policy;
        writeln!(
            out,
            "{:<16} {:>4} {:<10} {:>6} {:>10} {:>10} {:>10} {:>8} {:>4}  {}",
            p.port.name,
            // A daemon older than ids gives none.
            if p.state.id.is_given() {
                p.state.id.to_string()
            } else {
                "-".to_string()
            },
            kind,
            pol.weight,
            pol.min,
            pol.max,
            pol.max_in.as_deref().unwrap_or("max"),
            pol.burst.as_deref().unwrap_or("default"),
            pol.priority,
            macs
        )?;
        if let Some(socket) = &p.port.socket {
            let status = stats
                .and_then(|s| s.ports.iter().find(|s| s.stats.name == p.port.name))
                .and_then(|s| s.stats.status.as_ref()?.vhost_user());
            let state = match status {
                Some(v) if v.connected => {
                    format!("connected, features {}", v.feature_names.join(","))
                }
                Some(v) if v.quarantined => "quarantined".to_string(),
                Some(v) => match &v.last_error {
                    Some(e) => format!("not connected (last error: {e})"),
                    None => "not connected".to_string(),
                },
                None => "state unknown".to_string(),
            };
            let mode = p.port.mode.map_or("server", |m| match m {
                VhostUserRole::Server => "server",
                VhostUserRole::Client => "client",
            });
            let queues = match p.port.queues {
                Some(q) if q > 1 => format!(", {q} queue pairs"),
                _ => String::new(),
            };
            // The server socket's owner, group and mode, where configured.
            let access: Vec<String> = [
                p.port.socket_owner.as_ref().map(|o| format!("owner {o}")),
                p.port.socket_group.as_ref().map(|g| format!("group {g}")),
                p.port.socket_mode.map(|m| format!("mode {m}")),
            ]
            .into_iter()
            .flatten()
            .collect();
            let access = match access.is_empty() {
                true => String::new(),
                false => format!(" ({})", access.join(", ")),
            };
            writeln!(out, "{:<16} {mode} {socket}{access}{queues}: {state}", "")?;
        }
    }
    Ok(())
}

/// The per-vif table: rate, share of the uplink, policy, drops.
pub(crate) fn write_stats(out: &mut impl Write, s: &StatsView) -> Result<()> {
    let vifs: Vec<_> = s.ports.iter().filter(|p| p.role == "vif").collect();
    let total: u64 = vifs.iter().map(|p| p.stats.rate_bps).sum();
    // Share of the uplink's capacity, or of what all vifs send when it is unlimited.
    let base = s.capacity_bps.unwrap_or(total);
    writeln!(
        out,
        "engine {}, capacity {}, vifs sending {}",
        s.engine,
        format_rate(s.capacity_bps),
        format_rate(Some(total))
    )?;
    if let Some(m) = &s.cost_model {
        writeln!(out, "{}", m.describe())?;
    }
    writeln!(
        out,
        "{:<16} {:>10} {:>6} {:>6} {:>10} {:>10} {:>4} {:>8} {:>9}",
        "VIF", "RATE", "SHARE", "WEIGHT", "MIN", "MAX", "PRIO", "DROPS", "THROTTLED"
    )?;
    for p in vifs {
        let share = if base == 0 {
            0.0
        } else {
            100.0 * p.stats.rate_bps as f64 / base as f64
        };
        let (weight, min, max, prio) = match &p.policy {
            Some(pol) => (
                pol.weight.to_string(),
                pol.min.clone(),
                pol.max.clone(),
                pol.priority.to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let drops = p.stats.counters.drops.total();
        writeln!(
            out,
            "{:<16} {:>10} {:>5.1}% {:>6} {:>10} {:>10} {:>4} {:>8} {:>9}",
            p.stats.name,
            format_rate(Some(p.stats.rate_bps)),
            share,
            weight,
            min,
            max,
            prio,
            drops,
            if p.stats.throttled { "yes" } else { "no" }
        )?;
    }
    let dropping: Vec<String> = s
        .ports
        .iter()
        .flat_map(|p| {
            p.stats
                .counters
                .drops
                .iter()
                .filter(|&(_, n)| n > 0)
                .map(move |(r, n)| format!("{} {}={n}", p.stats.name, r.name()))
        })
        .collect();
    if !dropping.is_empty() {
        writeln!(out, "drops: {}", dropping.join(", "))?;
    }
    if s.loops.len() > 1 {
        writeln!(out, "threads: {}", readers_by_loop(s))?;
    }
    Ok(())
}

/// Which vifs each forwarding loop reads (`loop0 reads vm1, vm2; loop1 reads vm2`): a vif
/// whose queues are spread over the threads is under each loop that reads one.
fn readers_by_loop(s: &StatsView) -> String {
    (0..s.loops.len())
        .map(|l| {
            let vifs: Vec<&str> = s
                .ports
                .iter()
                .filter(|p| p.role == "vif")
                .filter(|p| match p.stats.readers.as_slice() {
                    [] => p.stats.shard == l,
                    r => r.contains(&l),
                })
                .map(|p| p.stats.name.as_str())
                .collect();
            let name = s.loops[l].name.as_str();
            match vifs.is_empty() {
                true => format!("{name} reads no vif"),
                false => format!("{name} reads {}", vifs.join(", ")),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}
