//! `vqos alloc`: the reference allocator on the command line.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::Serialize;
use vqos_sched::alloc::{allocate, Claim};
use vqos_sched::change::{ChangeError, PolicyChange};
use vqos_sched::units::{format_rate, parse_rate};
use vqos_sched::VifPolicy;

use crate::exit::UsageError;
use crate::out::outln;

/// Arguments of `vqos alloc`.
#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  vqos alloc --capacity 940Mbit --vif vm1:weight=1 \
    --vif vm5:weight=5,max=150Mbit,min=0,demand=unlimited --json\n  \
    vqos alloc --direction in --capacity 400Mbit --vif vm1:min=250Mbit --vif vm2:weight=3,max_in=100Mbit"
)]
pub struct AllocArgs {
    /// Link capacity, e.g. 940Mbit or 10Gbit (with --direction in: the downlink's,
    /// vqosd's capacity_in).
    #[arg(long)]
    capacity: String,
    /// A vif: NAME[:key=value,...] with keys weight (default 1), min (default 0),
    /// max (default unlimited), max_in (default: as max), demand (default unlimited);
    /// priority and burst are taken as a policy's and change no rate. Repeat for each vif.
    #[arg(long = "vif", required = true)]
    vifs: Vec<String>,
    /// Which direction to allocate: out (what the vifs send, default) or in (what they
    /// receive: the same weight and min, max_in else max as the max, the min capped by it,
    /// as the scheduled downlink does).
    #[arg(long, value_parser = ["out", "in"], default_value = "out")]
    direction: String,
    /// Print JSON: {"capacity_bps": N, "vifs": [{"name": .., "rate_bps": N}, ...]}.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Out {
    capacity_bps: u64,
    vifs: Vec<OutVif>,
}

#[derive(Serialize)]
struct OutVif {
    name: String,
    rate_bps: u64,
}

/// Parses `vm5:weight=5,max=150Mbit` into a name and a claim (`inbound`: of the policy's
/// inbound direction, `VifPolicy::inbound`).
fn parse_vif(spec: &str, inbound: bool) -> Result<(String, Claim)> {
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    if name.is_empty() {
        bail!("Vif '{spec}': missing name (expected NAME:key=value,...)");
    }
    let mut change = PolicyChange::default();
    let mut demand = None;
    for kv in rest.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("Vif '{name}': expected key=value, got '{kv}'"))?;
        if k == "demand" {
            demand = parse_rate(v).with_context(|| format!("Vif '{name}': demand"))?;
            continue;
        }
        change.set(k, v).map_err(|e| match e {
            ChangeError::UnknownField(k) => anyhow!(
                "Vif '{name}': unknown key '{k}' (expected weight, min, max, max_in, priority, \
                 burst or demand)"
            ),
            e => anyhow!("Vif '{name}': {e}"),
        })?;
    }
    let mut policy = change
        .apply(&VifPolicy::default())
        .map_err(|e| anyhow!("Vif '{name}': {e}"))?;
    policy.validate(name)?;
    if inbound {
        policy = policy.inbound(true);
    }
    Ok((name.to_string(), Claim::new(&policy, demand)))
}

/// The capacity, the vifs' names and their claims, checked.
fn parse(args: &AllocArgs) -> Result<(u64, Vec<String>, Vec<Claim>)> {
    let capacity = parse_rate(&args.capacity)
        .context("--capacity")?
        .context("Capacity must be finite to allocate it")?;
    let mut names = Vec::new();
    let mut claims = Vec::new();
    for spec in &args.vifs {
        let (name, claim) = parse_vif(spec, args.direction == "in")?;
        if names.contains(&name) {
            bail!("Duplicate vif '{name}'");
        }
        names.push(name);
        claims.push(claim);
    }
    Ok((capacity, names, claims))
}

/// Runs `vqos alloc`.
pub fn run(args: AllocArgs) -> Result<()> {
    // All of it comes from the command line: what is wrong with it is a usage error.
    let usage = |e: anyhow::Error| UsageError(format!("{e:#}"));
    let (capacity, names, claims) = parse(&args).map_err(usage)?;
    let rates = allocate(capacity, &claims).map_err(|e| usage(e.into()))?;
    if args.json {
        let out = Out {
            capacity_bps: capacity,
            vifs: names
                .into_iter()
                .zip(&rates)
                .map(|(name, &rate_bps)| OutVif { name, rate_bps })
                .collect(),
        };
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        outln!("{:<12} {:>14} {:>8}", "vif", "rate", "share")?;
        for (name, r) in names.iter().zip(&rates) {
            let share = *r as f64 / capacity as f64 * 100.0;
            outln!("{name:<12} {:>14} {share:>7.1}%", format_rate(Some(*r)))?;
        }
        let total: u64 = rates.iter().sum();
        outln!(
            "{:<12} {:>14} {:>7.1}%",
            "total",
            format_rate(Some(total)),
            total as f64 / capacity as f64 * 100.0
        )?;
    }
    Ok(())
}
