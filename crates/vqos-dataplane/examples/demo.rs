//! Runs the switch with TAP ports and a live policy schedule, printing per-vif rates.
//!
//! ```text
//! demo --uplink vqdu --vifs vqd0,vqd1,vqd2 [--engine vqos] [--capacity 940Mbit] [--phase-secs 8]
//! ```
//! Creates the TAPs, prints `READY` (the caller moves them into namespaces and starts traffic),
//! then runs three phases: weights 1:2:3; + the last vif max 150 Mbit/s; + the first vif min
//! 400 Mbit/s. Every second it prints each vif's rate (stats over the last ~100 ms) and the
//! reference allocation for greedy senders. Stand-in for `vqosd` in scripts/demo.sh.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use vqos_dataplane::{PortSpec, SwitchConfig, SwitchHandle};
use vqos_sched::units::{format_rate, parse_rate};
use vqos_sched::{allocate, Claim, EngineKind, VifPolicy};

/// A live policy change applied at the start of a phase.
type PhaseFn = dyn Fn(&SwitchHandle) -> Result<()>;

fn main() -> Result<()> {
    let mut uplink = None;
    let mut vifs: Vec<String> = Vec::new();
    let mut engine = EngineKind::Vqos;
    let mut capacity = Some(940_000_000u64);
    let mut phase_secs = 8u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--uplink" => uplink = Some(val()?),
            "--vifs" => vifs = val()?.split(',').map(str::to_string).collect(),
            "--engine" => engine = val()?.parse().map_err(anyhow::Error::msg)?,
            "--capacity" => capacity = parse_rate(&val()?).map_err(anyhow::Error::msg)?,
            "--phase-secs" => phase_secs = val()?.parse()?,
            _ => bail!("Unknown argument {a}"),
        }
    }
    let uplink = uplink.context("--uplink is required")?;
    if vifs.is_empty() {
        bail!("--vifs is required");
    }
    let mut cfg = SwitchConfig::new(PortSpec::tap(&uplink));
    cfg.engine = engine;
    cfg.capacity_bps = capacity;
    let sw = SwitchHandle::start(cfg)?;
    for (i, name) in vifs.iter().enumerate() {
        let policy = VifPolicy {
            weight: i as u32 + 1,
            ..Default::default()
        };
        sw.add_port(PortSpec::tap(name), policy)?;
    }
    println!("READY");
    let last = vifs.len() - 1;
    let phases: Vec<(&str, Box<PhaseFn>)> = vec![
        (
            "phase 1: weights 1:2:3...",
            Box::new(|_: &SwitchHandle| Ok(())),
        ),
        (
            "phase 2: last vif max 150 Mbit/s",
            Box::new(move |sw: &SwitchHandle| {
                let mut p = sw.policies().vifs[last].policy.clone();
                p.max_bps = Some(150_000_000);
                let name = sw.policies().vifs[last].name.clone();
                Ok(sw.set_policy(&name, p)?)
            }),
        ),
        (
            "phase 3: first vif min 400 Mbit/s",
            Box::new(|sw: &SwitchHandle| {
                let mut p = sw.policies().vifs[0].policy.clone();
                p.min_bps = 400_000_000;
                let name = sw.policies().vifs[0].name.clone();
                Ok(sw.set_policy(&name, p)?)
            }),
        ),
    ];
    for (title, apply) in phases {
        apply(&sw)?;
        let set = sw.policies();
        let claims: Vec<Claim> = set
            .vifs
            .iter()
            .map(|v| Claim::new(&v.policy, None))
            .collect();
        let reference = match set.capacity_bps {
            Some(c) => allocate(c, &claims)?,
            None => Vec::new(),
        };
        println!(
            "== {title} (engine {engine}, capacity {})",
            format_rate(capacity)
        );
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(phase_secs) {
            std::thread::sleep(Duration::from_secs(1));
            let s = sw.stats();
            let mut line = format!("t={:>5.1}s", s.time_ns as f64 / 1e9);
            for (i, v) in set.vifs.iter().enumerate() {
                let rate = s.port(&v.name).map_or(0, |p| p.rx_rate_bps);
                let want = reference.get(i).map_or(String::new(), |r| {
                    format!(" (ref {:>5.1})", *r as f64 / 1e6)
                });
                line += &format!("  {}: {:>6.1}{want}", v.name, rate as f64 / 1e6);
            }
            println!("{line}  Mbit/s");
        }
    }
    let s = sw.stats();
    println!(
        "loop: {} bursts, busy {:.1} %",
        s.loop_stats.bursts,
        100.0 * s.loop_stats.busy_cycles as f64
            / (s.loop_stats.busy_cycles + s.loop_stats.idle_cycles).max(1) as f64
    );
    sw.stop()?;
    Ok(())
}
