//! `vqos cluster simulate --aggregators`: the aggregators' design (docs/cluster.md) run with the
//! leaders' and hosts' own code (vqos-sim's `cluster_agg`).

use anyhow::Result;
use clap::Args;
use vqos_sim::cluster::ClusterSimConfig;
use vqos_sim::cluster_agg::{simulate_aggregators, AggReport, AggSimConfig};

use crate::exit::UsageError;
use crate::out::outln;

/// The aggregators' options of `vqos cluster simulate`.
#[derive(Args, Debug)]
pub struct AggArgs {
    /// Run the aggregators' design instead of the etcd agents': hosts report to a leader per
    /// shard of tenants, which answers with grants (a cold start, a demand shift, a partition,
    /// shard 0's leader crashing).
    #[arg(long)]
    aggregators: bool,
    /// Aggregator shards (tenants are hashed to them).
    #[arg(long, default_value_t = 8)]
    shards: u32,
    /// The time step of the aggregators' model, ms (a period's ticks; delays and leases are
    /// whole ticks).
    #[arg(long, default_value_t = 25, value_name = "MS")]
    tick_ms: u64,
    /// Largest one-way delay of a report or an answer, ms.
    #[arg(long, default_value_t = 50, value_name = "MS")]
    delay_ms: u64,
    /// Reports and answers lost, percent.
    #[arg(long, default_value_t = 1, value_name = "PERCENT")]
    loss: u32,
    /// The grants' lease, ms.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    lease_ms: u64,
    /// How long shard 0 has no leader after its crash, ms.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    election_ms: u64,
    /// The leaders answer only reports: no raise pushed to a host when the capacity it waits
    /// for is released (the design before pushes, for comparison).
    #[arg(long)]
    no_push: bool,
}

impl AggArgs {
    /// Whether `--aggregators` was given.
    pub fn wanted(&self) -> bool {
        self.aggregators
    }

    fn config(
        &self,
        period_ms: u64,
        partitioned: u32,
        partition_periods: u32,
    ) -> Result<AggSimConfig> {
        let tick = self.tick_ms;
        if tick == 0 || !period_ms.is_multiple_of(tick) {
            return Err(
                UsageError(format!("--tick-ms must divide the period ({period_ms} ms)")).into(),
            );
        }
        if self.loss > 100 {
            return Err(UsageError("--loss is a percentage, 0 to 100".into()).into());
        }
        let ticks = |ms: u64, what: &str| {
            u32::try_from(ms / tick).map_err(|_| UsageError(format!("{what} is too long")))
        };
        Ok(AggSimConfig {
            ticks: ticks(period_ms, "the period")?,
            shards: self.shards,
            delay_ticks: ticks(self.delay_ms, "--delay-ms")?,
            loss_percent: self.loss,
            partitioned,
            partition_periods,
            lease_ticks: ticks(self.lease_ms, "--lease-ms")?,
            // The clocks drift by at most 1 ms a second, and a tick at least.
            drift_ticks: ticks(self.lease_ms / 1000, "--lease-ms")?.max(1),
            election_periods: u32::try_from(self.election_ms.div_ceil(period_ms))
                .map_err(|_| UsageError("--election-ms is too long".into()))?,
            push: !self.no_push,
        })
    }
}

/// Runs the aggregators' model.
pub fn run(
    args: &AggArgs,
    base: &ClusterSimConfig,
    partitioned: u32,
    partition_periods: u32,
) -> Result<AggReport> {
    let config = args.config(base.period_ms, partitioned, partition_periods)?;
    Ok(simulate_aggregators(base, &config).map_err(|e| UsageError(e.to_string()))?)
}

/// The aggregators' lines.
pub fn print(r: &AggReport, period_ms: u64) -> Result<()> {
    let c = &r.config;
    let tick_ms = period_ms / u64::from(c.ticks.max(1));
    let periods = |p: Option<u32>| p.map_or("not within the stage".to_string(), |p| p.to_string());
    outln!(
        "aggregators: {} shards; delays up to {} ms, {} % lost; leases {} ms; {} host(s) cut off for {} periods; shard 0's leader down {} periods",
        c.shards,
        u64::from(c.delay_ticks) * tick_ms,
        c.loss_percent,
        u64::from(c.lease_ticks) * tick_ms,
        c.partitioned,
        c.partition_periods,
        c.election_periods
    )?;
    outln!(
        "  largest excess over any tenant's max  {} bit/s",
        r.max_excess_bps
    )?;
    outln!(
        "  periods to converge: from a cold start {}, after the shift {}, after the heal {}, after the crash {}",
        periods(r.start_periods),
        periods(r.shift_periods),
        periods(r.heal_periods),
        periods(r.failover_periods)
    )?;
    let m = &r.shift_moved;
    let secs = |p: Option<u32>| {
        p.map_or("not within the stage".to_string(), |p| {
            format!("{p} ({:.1} s)", f64::from(p) * period_ms as f64 / 1000.0)
        })
    };
    outln!(
        "  the {} tenants the shift moved, each settled in: median {}, p90 {}, p99 {}",
        m.tenants,
        secs(m.p50),
        secs(m.p90),
        secs(m.p99)
    )?;
    let per_s = 1000.0 / period_ms as f64;
    outln!(
        "  reports and answers per period {:.0} ({:.0}/s), {:.2} MiB as JSON ({:.2} MiB/s); largest {} bytes; etcd: none",
        r.messages_per_period,
        r.messages_per_period * per_s,
        r.bytes_per_period / 1048576.0,
        r.bytes_per_period * per_s / 1048576.0,
        r.largest_message_bytes
    )?;
    outln!(
        "  leader CPU per period (this machine): busiest shard {:.1} ms, all shards {:.1} ms",
        r.busiest_shard_ms,
        r.all_shards_ms
    )?;
    Ok(())
}
