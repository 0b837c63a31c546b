//! `vqos cluster simulate`: the tenant split at scale, without etcd (vqos-sim's `cluster`).

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use serde_json::json;
use vqos_sched::units::parse_rate;
use vqos_sim::cluster::{measure_agent_cost, simulate_cluster, ClusterSimConfig, Traffic, World};
use vqos_sim::cluster_async::{simulate_async, AsyncReport, AsyncSimConfig};

use crate::exit::UsageError;
use crate::out::outln;

/// Arguments of `vqos cluster simulate`.
#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  vqos cluster simulate --hosts 10000 --vifs 100000 --tenants 1000\n\n\
    Every period each vif sends within its share, each host publishes its status, and the \
    shares are split again with the agents' own code (docs/cluster.md, \"Scale\"). With \
    --asynchrony each host reads and reports at its own phase of the period, --partitioned \
    hosts are cut off from etcd for --partition-periods, and the shares in force are summed \
    per tenant at every phase: the largest excess over a tenant's max must be 0 (it is run \
    again without the grants, as the agents were, for comparison; each host runs its own \
    period, so keep it to a few hundred hosts)."
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
    /// Also run the asynchronous model (phases, a partition, the grants).
    #[arg(long)]
    asynchrony: bool,
    /// Phases per period in the asynchronous model (the hosts of a phase race: a phase stands
    /// for the agent's read-to-commit time).
    #[arg(long, default_value_t = 100)]
    phases: u32,
    /// Hosts cut off from etcd in the asynchronous model.
    #[arg(long, default_value_t = 1)]
    partitioned: u32,
    /// Periods the partition lasts.
    #[arg(long, default_value_t = 20)]
    partition_periods: u32,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    agg: crate::cluster_agg_sim::AggArgs,
}

fn mib(bytes: f64) -> String {
    format!("{:.2} MiB", bytes / (1024.0 * 1024.0))
}

/// The asynchronous model with the grants and without them, when asked for.
fn run_async(
    args: &SimulateArgs,
    config: &ClusterSimConfig,
) -> Result<Option<(AsyncReport, AsyncReport)>> {
    if !args.asynchrony {
        return Ok(None);
    }
    let a = AsyncSimConfig {
        ticks: args.phases,
        partitioned: args.partitioned,
        partition_periods: args.partition_periods,
        ..AsyncSimConfig::default()
    };
    let with = simulate_async(config, &a).map_err(|e| UsageError(e.to_string()))?;
    let unguarded = AsyncSimConfig {
        guarded: false,
        ..a
    };
    Ok(Some((with, simulate_async(config, &unguarded)?)))
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
    if args.agg.wanted() {
        return run_aggregators(args, &config);
    }
    let t = Instant::now();
    let report = simulate_cluster(&config)?;
    let sim_s = t.elapsed().as_secs_f64();
    let cost = (args.cost_hosts > 0).then(|| {
        let mut w = World::new(&config).expect("validated above");
        w.run(config.periods);
        measure_agent_cost(&w, args.cost_hosts)
    });
    let asynchrony = run_async(args, &config)?;
    if args.json {
        let (with, without) = asynchrony.unzip();
        let v = json!({
            "report": report,
            "agent_cost": cost,
            "asynchrony": with,
            "asynchrony_without_grants": without,
            "simulation_s": sim_s,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    let periods =
        |p: Option<u32>| p.map_or(format!("not within {}", config.periods), |p| p.to_string());
    let hosts = f64::from(config.hosts);
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
    print_traffic(&report.traffic, config.period_ms)?;
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
    if let Some((with, without)) = &asynchrony {
        print_async(with, without)?;
    }
    outln!(
        "(simulated in {sim_s:.1} s; {:.0} statuses per agent per period)",
        hosts
    )?;
    Ok(())
}

/// `--aggregators`: the aggregators' model alone.
fn run_aggregators(args: &SimulateArgs, config: &ClusterSimConfig) -> Result<()> {
    let t = Instant::now();
    let r =
        crate::cluster_agg_sim::run(&args.agg, config, args.partitioned, args.partition_periods)?;
    let sim_s = t.elapsed().as_secs_f64();
    if args.json {
        let v = json!({ "aggregators": r, "simulation_s": sim_s });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    outln!(
        "{} hosts, {} vifs, {} tenants, seed {}",
        config.hosts,
        config.vifs,
        config.tenants,
        config.seed
    )?;
    crate::cluster_agg_sim::print(&r, config.period_ms)?;
    outln!("(simulated in {sim_s:.1} s)")?;
    Ok(())
}

/// The etcd traffic's lines.
fn print_traffic(t: &Traffic, period_ms: u64) -> Result<()> {
    let per_s = 1000.0 / period_ms as f64;
    outln!("etcd per period (every {} ms):", period_ms)?;
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
    Ok(())
}

/// The asynchronous model's lines.
fn print_async(with: &AsyncReport, without: &AsyncReport) -> Result<()> {
    let c = &with.config;
    let periods = |p: Option<u32>| p.map_or("not within the run".to_string(), |p| p.to_string());
    outln!(
        "asynchrony: {} phases per period, {} host(s) cut off from etcd for {} periods",
        c.ticks,
        c.partitioned,
        c.partition_periods
    )?;
    outln!(
        "  largest excess over any tenant's max  {} bit/s (without the grants: {} bit/s)",
        with.max_excess_bps,
        without.max_excess_bps
    )?;
    outln!(
        "  periods to converge after the shift   {} (without the grants: {})",
        periods(with.shift_periods),
        periods(without.shift_periods)
    )?;
    outln!(
        "  periods to converge after the heal    {} (without the grants: {})",
        periods(with.heal_periods),
        periods(without.heal_periods)
    )?;
    outln!(
        "  raises committed {}, refused (a grant of the tenant changed since the read) {}",
        with.raises_committed,
        with.raises_refused
    )?;
    Ok(())
}
