//! `vqos status`: the state of the switch at a glance, in one command — its health (the loop,
//! the etcd agent), every port with its whole policy and its guest (vhost-user connected or
//! not), and what each vif sends and drops. `--json` gives the three API answers it is made of
//! (`/v1/health`, `/v1/ports`, `/v1/stats`). An unhealthy daemon is shown and then exits 1,
//! so a script can test it.

use std::io::Write;

use anyhow::{anyhow, Result};
use clap::Args;
use vqos_api::client::Client;
use vqos_api::wire::{HealthView, PortView, StatsView};

use super::table::{write_ports, write_stats};
use super::ConnArgs;

/// Arguments of `vqos status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print `{"health": ..., "ports": [...], "stats": {...}}` (the API's own answers).
    #[arg(long)]
    pub(super) json: bool,
}

/// `vqos status`.
pub fn status(conn: &ConnArgs, args: StatusArgs) -> Result<()> {
    status_to(&conn.client()?, args, &mut crate::out::stdout())
}

pub(super) fn status_to(c: &Client, args: StatusArgs, out: &mut impl Write) -> Result<()> {
    // 503 when unhealthy, with the same body: read it either way.
    let resp = c.request("GET", "/v1/health", None)?;
    let health: HealthView = serde_json::from_slice(&resp.body)
        .map_err(|e| anyhow!("Unexpected answer from vqosd to /v1/health: {e}"))?;
    let ports: Vec<PortView> = c.call("GET", "/v1/ports", None)?;
    let stats: StatsView = c.call("GET", "/v1/stats", None)?;
    if args.json {
        let all = serde_json::json!({"health": health, "ports": ports, "stats": stats});
        writeln!(out, "{}", serde_json::to_string_pretty(&all)?)?;
    } else {
        write_health(out, &health)?;
        writeln!(out)?;
        write_ports(out, &ports, Some(&stats))?;
        writeln!(out)?;
        write_stats(out, &stats)?;
    }
    match health.status.as_str() {
        "unhealthy" => Err(anyhow!(
            "vqosd is unhealthy: {}",
            health.error.as_deref().unwrap_or("no reason given")
        )),
        _ => Ok(()),
    }
}

fn write_health(out: &mut impl Write, h: &HealthView) -> Result<()> {
    let why = h
        .error
        .as_deref()
        .map(|e| format!(" ({e})"))
        .unwrap_or_default();
    writeln!(
        out,
        "vqosd {}: {}{why}; engine {}, capacity {}, {} port(s), up {} s",
        h.version, h.status, h.engine, h.capacity, h.ports, h.uptime_s
    )?;
    let l = &h.forwarding;
    writeln!(
        out,
        "forwarding loop: {}, stats {} ms old (dead after {} ms)",
        if l.running { "running" } else { "stopped" },
        l.stats_age_ms,
        l.stale_after_ms
    )?;
    if let Some(cl) = &h.cluster {
        writeln!(out, "etcd agent: host {}, {}", cl.host, cl.state)?;
    }
    Ok(())
}
