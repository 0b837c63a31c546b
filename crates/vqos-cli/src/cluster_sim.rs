//! `vqos cluster simulate`: the tenant split at scale, without etcd (vqos-sim's `cluster`).

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use serde_json::json;
use vqos_sched::units::parse_rate;
use vqos_sim::cluster::{measure_agent_cost, simulate_cluster, ClusterSimConfig, World};

use crate::exit::UsageError;
use crate::out::outln;

/// Arguments of `vqos cluster simulate`.
#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  vqos cluster simulate --hosts 10000 --vifs 100000 --tenants 1000\n\n\
    Every period each vif sends within its share, each host publishes its status, and the \
    shares are split again with the agents' own code (docs/cluster.md, \"Scale\")."
)]
pub struct SimulateArgs {
    /// Hosts (agents).
    #[arg(long, default_value_t = 10_000)]
    hosts: u32,
    /// Vifs, placed on hosts uniformly at random.
    #[arg(long, default_value_t = 100_000)]
    vifs: u32,
    /// Tenants, Zipf-sized (tenant t draws vifs in proportion to 1 / (t + 1)).
    #[arg(long, default_value_t = 1_000)]
    tenants: u32,
    /// Part of the vifs that draw a new demand at the shift (0 to 1).
    #[arg(long, default_value_t = 0.5)]
    shift: f64,
    /// Periods simulated from the start, and again after the shift.
    #[arg(long, default_value_t = 20)]
    periods: u32,
    /// Least demand an idle vif publishes.
    #[arg(long, default_value = "1Mbit", value_name = "RATE")]
    probe: String,
    /// The agents' period in milliseconds (it only counts in the statuses' size here).
    #[arg(long, default_value_t = 500)]
    period_ms: u64,
    /// Hosts whose per-period CPU cost is measured (0: none).
    #[arg(long, default_value_t = 20)]
    cost_hosts: u32,
    /// Seed of every random choice (same seed, same result but the measured cost).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

fn mib(bytes: f64) -> String {
    format!("{:.2} MiB", bytes / (1024.0 * 1024.0))
}

/// Runs `vqos cluster simulate`.
pub fn run(args: &SimulateArgs) -> Result<()> {
    let probe_bps = parse_rate(&args.probe)
        .map_err(|e| UsageError(format!("--probe: {e}")))?
        .ok_or_else(|| UsageError("--probe must be a rate, not unlimited".into()))?;
    let config = ClusterSimConfig {
        hosts: args.hosts,
        vifs: args.vifs,
        tenants: args.tenants,
        seed: args.seed,
        shift: args.shift,
        periods: args.periods,
        probe_bps,
        period_ms: args.period_ms,
    };
    World::new(&config).map_err(|e| UsageError(e.to_string()))?;
    let t = Instant::now();
    let report = simulate_cluster(&config)?;
    let sim_s = t.elapsed().as_secs_f64();
    let cost = (args.cost_hosts > 0).then(|| {
        let mut w = World::new(&config).expect("validated above");
        w.run(config.periods);
        measure_agent_cost(&w, args.cost_hosts)
    });
    if args.json {
        let v = json!({ "report": report, "agent_cost": cost, "simulation_s": sim_s });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    let periods =
        |p: Option<u32>| p.map_or(format!("not within {}", config.periods), |p| p.to_string());
    let t = &report.traffic;
    let hosts = f64::from(config.hosts);
    let per_s = 1000.0 / config.period_ms as f64;
    outln!(
        "{} hosts, {} vifs, {} tenants (largest: {} vifs on {} hosts; at most {} tenants on a host), seed {}",
        config.hosts,
        config.vifs,
        config.tenants,
        report.largest_tenant_vifs,
        report.largest_tenant_hosts,
        report.max_tenants_per_host,
        config.seed
    )?;
    outln!(
        "periods to converge from a cold start   {}",
        periods(report.start_periods)
    )?;
    outln!(
        "periods to converge after the shift     {} ({:.0} % of the vifs drew a new demand)",
        periods(report.shift_periods),
        config.shift * 100.0
    )?;
    outln!(
        "largest tenant aggregate above its max  {} bit/s",
        report.max_over_bps.max(0)
    )?;
    outln!("etcd per period (every {} ms):", config.period_ms)?;
    outln!(
        "  written: {} keys, {} ({}/s)",
        t.keys_written,
        mib(t.bytes_written as f64),
        mib(t.bytes_written as f64 * per_s)
    )?;
    outln!(
        "  read, each agent reads every status: {} per agent, {} in all ({}/s)",
        mib(t.bytes_read_per_agent as f64),
        mib(t.bytes_read_total as f64),
        mib(t.bytes_read_total as f64 * per_s)
    )?;
    outln!(
        "  sharded per tenant (projected): {} keys written; read {} per agent (max {}), {} in all ({}/s)",
        t.sharded_keys_written,
        mib(t.sharded_read_per_agent_mean as f64),
        mib(t.sharded_read_per_agent_max as f64),
        mib(t.sharded_read_total as f64),
        mib(t.sharded_read_total as f64 * per_s)
    )?;
    outln!(
        "  two levels, per-host aggregates per tenant (projected): read {} per agent (max {}), {} in all ({}/s)",
        mib(t.aggregate_read_per_agent_mean as f64),
        mib(t.aggregate_read_per_agent_max as f64),
        mib(t.aggregate_read_total as f64),
        mib(t.aggregate_read_total as f64 * per_s)
    )?;
    outln!(
        "  per-tenant aggregators (projected): read {} in all ({}/s); each agent its own shares key",
        mib(t.aggregator_read_total as f64),
        mib(t.aggregator_read_total as f64 * per_s)
    )?;
    if let Some(c) = cost {
        outln!(
            "agent CPU per period (this machine, {} hosts): parse every status {:.1} ms, \
             shares {:.1} ms (max {:.1} ms)",
            c.hosts_measured,
            c.parse_ns as f64 / 1e6,
            c.shares_mean_ns as f64 / 1e6,
            c.shares_max_ns as f64 / 1e6
        )?;
    }
    outln!(
        "(simulated in {sim_s:.1} s; {:.0} statuses per agent per period)",
        hosts
    )?;
    Ok(())
}
