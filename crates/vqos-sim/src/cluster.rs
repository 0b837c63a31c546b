//! The cluster algorithm (docs/cluster.md) at scale, without etcd: many hosts, many vifs in
//! tenants of very different sizes, run period by period with the agents' own code.
//!
//! Every period, as every agent does: each vif sends what it wants within the share in force
//! (its rate), each host publishes a [`HostStatus`] (the demand estimate of
//! [`vqos_cluster::estimate`] over the peak of a window of its rates), and the shares for the next period are
//! [`vqos_cluster::all_shares`] of every status: the grouping and the split every agent runs
//! in `local_shares`, for every host at once. The model is synchronous (every agent reads the
//! statuses of the same period) and a vif fills a new share within one period (TCP at data
//! centre round trips does); host links are not modelled (a vif is held by its shares and its
//! own cap only).
//!
//! What it reports: the periods the shares take to converge from a cold start and after a
//! demand shift (a part of the vifs draws a new demand), the etcd keys and bytes written and
//! read per period (as implemented: each agent reads every status; and projected with keys
//! sharded per tenant), and, from [`measure_agent_cost`], the CPU one agent spends per period.
//!
//! **Converged** means every tenant's rates are within its estimator slack of the reference
//! allocation (the split of its limits by the true demands): the slack is what the non-greedy
//! vifs' estimates hold above their true demand (10 %, at least the probe), which the greedy
//! vifs cannot use, plus 0.1 % of the tenant's max for rounding. The periods to converge count
//! from the change to the first period from which it stays converged.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;
use thiserror::Error;
use vqos_cluster::shares::declared_by_statuses;
use vqos_cluster::{
    all_shares, estimate, local_shares, split, window_periods, HostStatus, Member, RateWindow,
    Share, TenantLimits, VifStatus,
};

/// Why a cluster simulation cannot run.
#[derive(Debug, Error)]
pub enum ClusterSimError {
    /// A setting out of range.
    #[error("Invalid cluster simulation: {0}")]
    Invalid(String),
}

/// What to simulate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterSimConfig {
    /// Hosts (agents).
    pub hosts: u32,
    /// Vifs, placed on hosts uniformly at random.
    pub vifs: u32,
    /// Tenants; vif `i` belongs to tenant `t` with probability ∝ 1 / (t + 1) (Zipf), so a few
    /// tenants span most hosts and most tenants a few.
    pub tenants: u32,
    /// Seed of every random choice (same seed, same result).
    pub seed: u64,
    /// Part of the vifs that draw a new demand at the shift (0 to 1).
    pub shift: f64,
    /// Periods simulated from the start, and again after the shift.
    pub periods: u32,
    /// The probe: least demand an idle vif publishes, bit/s.
    pub probe_bps: u64,
    /// The agents' period, ms (written in the statuses, so it counts in their size).
    pub period_ms: u64,
}

impl Default for ClusterSimConfig {
    fn default() -> Self {
        ClusterSimConfig {
            hosts: 100,
            vifs: 1000,
            tenants: 20,
            seed: 1,
            shift: 0.5,
            periods: 30,
            probe_bps: 1_000_000,
            period_ms: 500,
        }
    }
}

impl ClusterSimConfig {
    fn validate(&self) -> Result<(), ClusterSimError> {
        let bad = |m: &str| Err(ClusterSimError::Invalid(m.to_string()));
        if self.hosts == 0 || self.hosts > 1_000_000 {
            return bad("hosts must be 1 to 10^6");
        }
        if self.vifs == 0 || self.vifs > 10_000_000 {
            return bad("vifs must be 1 to 10^7");
        }
        if self.tenants == 0 || self.tenants > self.vifs {
            return bad("tenants must be 1 to the number of vifs");
        }
        if !(0.0..=1.0).contains(&self.shift) {
            return bad("shift must be 0 to 1");
        }
        if self.periods == 0 || self.periods > 10_000 {
            return bad("periods must be 1 to 10^4");
        }
        Ok(())
    }
}

/// What a vif wants to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Nothing.
    Idle,
    /// This many bit/s.
    Light(u64),
    /// Whatever it is given.
    Greedy,
}

/// A vif's line rate: what a greedy vif sends before it has a share, bit/s.
pub const LINE_BPS: u64 = 10_000_000_000;

/// One vif of the simulated cluster.
#[derive(Debug, Clone)]
pub struct SimVif {
    /// Its host (index).
    pub host: u32,
    /// Its tenant (index).
    pub tenant: u32,
    /// Its weight.
    pub weight: u32,
    /// Its own cap, bit/s.
    pub max_bps: Option<u64>,
    /// What it wants.
    pub want: Want,
}

/// splitmix64: one step of a Weyl sequence through a 64-bit mixer.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// [`next`] for the other cluster modules.
pub(crate) fn next_u64(state: &mut u64) -> u64 {
    next(state)
}

fn draw_want(rng: &mut u64) -> Want {
    match next(rng) % 10 {
        0..=3 => Want::Idle,
        4..=6 => Want::Light((1 + next(rng) % 100) * 1_000_000),
        _ => Want::Greedy,
    }
}

/// The simulated cluster: its vifs, tenants, and the shares in force.
#[derive(Debug, Clone)]
pub struct World {
    /// The settings.
    pub config: ClusterSimConfig,
    /// Every vif; vif `i` is port `v<i>` of its host.
    pub vifs: Vec<SimVif>,
    /// Tenant limits by name (`t<index>`): max 40 Mbit/s and min 10 Mbit/s per vif.
    pub tenants: BTreeMap<String, TenantLimits>,
    /// The share in force per vif (`None` before the first split).
    pub shares: Vec<Option<Share>>,
    /// What each vif sent over the last period, bit/s.
    pub rates_bps: Vec<u64>,
    /// Each vif's window of rates, whose peak its estimate reads (as the agent's).
    windows: Vec<RateWindow>,
    /// Each vif's port name and each host's name, made once (formatting them at every
    /// status was 12 % of the asynchronous simulation).
    names: (Vec<String>, Vec<String>),
    /// The random state.
    rng: u64,
}

fn host_name(h: u32) -> String {
    format!("host-{h:05}")
}

fn tenant_name(t: u32) -> String {
    format!("t{t}")
}

fn port_name(i: usize) -> String {
    format!("v{i}")
}

impl World {
    /// A cluster drawn from `config`'s seed.
    pub fn new(config: &ClusterSimConfig) -> Result<World, ClusterSimError> {
        config.validate()?;
        let mut rng = config.seed;
        // Zipf over tenants: cumulative weights 1 / (t + 1).
        let mut cum = Vec::with_capacity(config.tenants as usize);
        let mut total = 0.0;
        for t in 0..config.tenants {
            total += 1.0 / f64::from(t + 1);
            cum.push(total);
        }
        let mut vifs = Vec::with_capacity(config.vifs as usize);
        let mut sizes = vec![0u64; config.tenants as usize];
        for i in 0..config.vifs {
            // Every tenant has at least one vif; the rest are drawn.
            let tenant = if i < config.tenants {
                i
            } else {
                let u = (next(&mut rng) >> 11) as f64 / (1u64 << 53) as f64 * total;
                cum.partition_point(|&c| c < u).min(cum.len() - 1) as u32
            };
            sizes[tenant as usize] += 1;
            let weight = match next(&mut rng) % 10 {
                0..=6 => 1,
                7 | 8 => 2,
                _ => 4,
            };
            let max_bps = match next(&mut rng) % 10 {
                0 => Some(100_000_000),
                1 => Some(1_000_000_000),
                _ => None,
            };
            vifs.push(SimVif {
                host: (next(&mut rng) % u64::from(config.hosts)) as u32,
                tenant,
                weight,
                max_bps,
                want: draw_want(&mut rng),
            });
        }
        let tenants = sizes
            .iter()
            .enumerate()
            .map(|(t, &n)| {
                let limits = TenantLimits {
                    min_bps: n * 10_000_000,
                    max_bps: Some(n * 40_000_000),
                };
                (tenant_name(t as u32), limits)
            })
            .collect();
        let n = vifs.len();
        let window = window_periods(config.period_ms, config.probe_bps);
        Ok(World {
            config: config.clone(),
            vifs,
            tenants,
            shares: vec![None; n],
            rates_bps: vec![0; n],
            windows: vec![RateWindow::new(window); n],
            names: (
                (0..n).map(port_name).collect(),
                (0..config.hosts).map(host_name).collect(),
            ),
            rng,
        })
    }

    /// Vif `i`'s port name (`v<i>`).
    pub fn port(&self, i: usize) -> &str {
        &self.names.0[i]
    }

    /// Rates are sent `per_period` times a period (the asynchronous model's ticks): each
    /// window spans as many samples as the agent's spans periods.
    pub fn sample_per_period(&mut self, per_period: u32) {
        let window = window_periods(self.config.period_ms, self.config.probe_bps);
        let samples = window.saturating_mul(per_period.max(1) as usize);
        self.windows = vec![RateWindow::new(samples); self.vifs.len()];
    }

    /// A part `shift` of the vifs draws a new demand.
    pub fn shift(&mut self) {
        let threshold = (self.config.shift * u64::MAX as f64) as u64;
        for v in &mut self.vifs {
            if next(&mut self.rng) < threshold {
                v.want = draw_want(&mut self.rng);
            }
        }
    }

    /// The cap a vif is held to: its share max, its own cap, the line rate.
    fn cap(&self, i: usize) -> u64 {
        let own = self.vifs[i].max_bps.unwrap_or(LINE_BPS).min(LINE_BPS);
        match self.shares[i].and_then(|s| s.max_bps) {
            Some(s) => s.min(own),
            None => own,
        }
    }

    /// Every host's status for the period just ended (what the agents write), by host name.
    pub fn statuses(&self) -> BTreeMap<String, HostStatus> {
        let mut all: BTreeMap<String, HostStatus> = (0..self.config.hosts)
            .map(|h| (self.names.1[h as usize].clone(), self.empty_status()))
            .collect();
        for (i, v) in self.vifs.iter().enumerate() {
            if let Some(h) = all.get_mut(&self.names.1[v.host as usize]) {
                h.vifs.insert(self.names.0[i].clone(), self.vif_status(i));
            }
        }
        all
    }

    /// The status of the vifs `vifs` (indices), as their host publishes or reports it.
    pub fn status_of(&self, vifs: &[usize]) -> HostStatus {
        let mut s = self.empty_status();
        for &i in vifs {
            s.vifs.insert(self.names.0[i].clone(), self.vif_status(i));
        }
        s
    }

    /// Host `h`'s name.
    pub fn host(&self, h: u32) -> &str {
        &self.names.1[h as usize]
    }

    fn empty_status(&self) -> HostStatus {
        HostStatus {
            health: "ok".into(),
            updated_unix_ms: 1_795_999_999_123,
            period_ms: self.config.period_ms,
            ..Default::default()
        }
    }

    fn vif_status(&self, i: usize) -> VifStatus {
        let v = &self.vifs[i];
        let share = self.shares[i];
        let peak = self.windows[i].peak();
        let e = estimate(peak, share.as_ref(), v.max_bps, self.config.probe_bps);
        VifStatus {
            tenant: Some(tenant_name(v.tenant)),
            weight: v.weight,
            min_bps: 0,
            max_bps: v.max_bps,
            rate_bps: self.rates_bps[i],
            demand_bps: e.demand_bps,
            floor_greedy: e.floor_greedy,
            idle: e.idle,
            share_max_bps: share.and_then(|s| s.max_bps),
            share_min_bps: share.map(|s| s.min_bps),
        }
    }

    /// Every vif sends what it wants within the share in force (its rate).
    pub fn send(&mut self) {
        for i in 0..self.vifs.len() {
            let cap = self.cap(i);
            self.rates_bps[i] = match self.vifs[i].want {
                Want::Idle => 0,
                Want::Light(x) => x.min(cap),
                Want::Greedy => cap,
            };
            self.windows[i].push(self.rates_bps[i]);
        }
    }

    /// One period: every vif sends within its share, every host publishes, the shares are
    /// split again.
    pub fn step(&mut self) {
        self.send();
        let all = self.statuses();
        // The simulated hosts are honest: what they publish is what etcd declares.
        let shares = all_shares(&all, &declared_by_statuses(&all), &self.tenants);
        for s in &mut self.shares {
            *s = None;
        }
        for ((_, port), share) in shares {
            if let Some(i) = port.strip_prefix('v').and_then(|n| n.parse::<usize>().ok()) {
                self.shares[i] = Some(share);
            }
        }
    }

    /// Each vif's rate in the reference allocation: its tenant's limits split by the true
    /// demands (in the agents' order), and what it wants within that.
    pub fn reference_bps(&self) -> Vec<u64> {
        let mut by_tenant: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, v) in self.vifs.iter().enumerate() {
            by_tenant.entry(v.tenant).or_default().push(i);
        }
        let mut out = vec![0; self.vifs.len()];
        for (t, idx) in by_tenant {
            let members: Vec<Member> = idx
                .iter()
                .map(|&i| {
                    let v = &self.vifs[i];
                    Member {
                        weight: v.weight,
                        max_bps: v.max_bps,
                        demand_bps: match v.want {
                            Want::Idle => Some(0),
                            Want::Light(x) => Some(x),
                            Want::Greedy => None,
                        },
                        floor_greedy: false,
                        idle: false,
                    }
                })
                .collect();
            let shares = split(&self.tenants[&tenant_name(t)], &members);
            for (&i, s) in idx.iter().zip(shares) {
                let cap = s.max_bps.unwrap_or(LINE_BPS).min(LINE_BPS);
                let cap = cap.min(self.vifs[i].max_bps.unwrap_or(LINE_BPS));
                out[i] = match self.vifs[i].want {
                    Want::Idle => 0,
                    Want::Light(x) => x.min(cap),
                    Want::Greedy => cap,
                };
            }
        }
        out
    }

    /// How far the rates are from the reference, beyond each tenant's slack: the worst
    /// tenant's excess error as a part of its max (≤ 0: converged), and the worst tenant's
    /// aggregate above its max (bit/s; > 0 would break the cap).
    pub fn distance(&self, reference: &[u64]) -> (f64, i128) {
        let (each, over) = self.tenant_distances(reference);
        (each.into_iter().fold(f64::NEG_INFINITY, f64::max), over)
    }

    /// Each tenant's distance as [`World::distance`] reads it (≤ 0: converged), by tenant
    /// number, and the worst tenant's aggregate above its max (bit/s).
    pub fn tenant_distances(&self, reference: &[u64]) -> (Vec<f64>, i128) {
        let t_count = self.config.tenants as usize;
        let mut err = vec![0u128; t_count];
        let mut slack = vec![0u128; t_count];
        let mut sum = vec![0u128; t_count];
        for (i, v) in self.vifs.iter().enumerate() {
            let t = v.tenant as usize;
            err[t] += u128::from(self.rates_bps[i].abs_diff(reference[i]));
            sum[t] += u128::from(self.rates_bps[i]);
            let held = match v.want {
                Want::Greedy => 0,
                Want::Idle => self.config.probe_bps,
                Want::Light(x) => (x + x / 10).max(self.config.probe_bps) - x,
            };
            slack[t] += u128::from(held);
        }
        let mut each = Vec::with_capacity(t_count);
        let mut over = i128::MIN;
        for t in 0..t_count {
            let max = self.tenants[&tenant_name(t as u32)].max_bps.unwrap_or(1);
            let allowed = slack[t] + u128::from(max / 1000);
            each.push((err[t] as f64 - allowed as f64) / max as f64);
            over = over.max(sum[t] as i128 - i128::from(max));
        }
        (each, over)
    }

    /// Runs `periods` periods; the periods to converge (see the module doc; `None`: not
    /// converged for the last two periods), the worst tenant's distance each period, and the
    /// largest aggregate above a tenant max seen (bit/s; from a cold start, not counting the
    /// first period, when no share is in force yet).
    pub fn run(&mut self, periods: u32) -> (Option<u32>, Vec<f64>, i128) {
        let reference = self.reference_bps();
        let mut curve = Vec::with_capacity(periods as usize);
        let mut last_off = None;
        let mut over = i128::MIN;
        // Before the first split no share is in force (a vif has its own policy only).
        let cold = self.shares.iter().all(Option::is_none);
        for p in 1..=periods {
            self.step();
            // The rates of period p are sent within the shares computed at p − 1.
            let (d, o) = self.distance(&reference);
            if !(cold && p == 1) {
                over = over.max(o);
            }
            if d > 0.0 {
                last_off = Some(p);
            }
            curve.push(d);
        }
        let converged = settled(last_off, periods);
        (converged, curve, over)
    }
}

pub(crate) use crate::settle::{settle, settled};

/// What [`simulate_cluster`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterSimReport {
    /// The settings.
    pub config: ClusterSimConfig,
    /// Vifs of the largest tenant, and the hosts it spans.
    pub largest_tenant_vifs: u64,
    /// Hosts the largest tenant spans.
    pub largest_tenant_hosts: u64,
    /// The most tenants on one host.
    pub max_tenants_per_host: u64,
    /// Periods to converge from the cold start (`None`: not within `periods`).
    pub start_periods: Option<u32>,
    /// Periods to converge after the demand shift (`None`: not within `periods`).
    pub shift_periods: Option<u32>,
    /// The worst tenant's distance to the reference beyond its slack, per period after the
    /// shift (part of its max; ≤ 0 is converged).
    pub shift_distance: Vec<f64>,
    /// The most any tenant's aggregate went above its max, bit/s (≤ 0: never).
    pub max_over_bps: i128,
    /// etcd traffic per period.
    pub traffic: Traffic,
}

/// Simulates `config`: a cold start, then a demand shift; see the module doc.
pub fn simulate_cluster(config: &ClusterSimConfig) -> Result<ClusterSimReport, ClusterSimError> {
    let mut w = World::new(config)?;
    let (start_periods, _, over1) = w.run(config.periods);
    w.shift();
    let (shift_periods, shift_distance, over2) = w.run(config.periods);
    let all = w.statuses();
    let mut sizes: BTreeMap<u32, (u64, std::collections::BTreeSet<u32>)> = BTreeMap::new();
    for v in &w.vifs {
        let e = sizes.entry(v.tenant).or_default();
        e.0 += 1;
        e.1.insert(v.host);
    }
    let largest = sizes.values().max_by_key(|(n, _)| *n);
    let max_tenants_per_host = all
        .values()
        .map(|s| {
            let ts: std::collections::BTreeSet<_> = s.vifs.values().map(|v| &v.tenant).collect();
            ts.len() as u64
        })
        .max()
        .unwrap_or(0);
    Ok(ClusterSimReport {
        config: config.clone(),
        largest_tenant_vifs: largest.map_or(0, |l| l.0),
        largest_tenant_hosts: largest.map_or(0, |l| l.1.len() as u64),
        max_tenants_per_host,
        start_periods,
        shift_periods,
        shift_distance,
        max_over_bps: over1.max(over2),
        traffic: traffic(&all),
    })
}

/// The CPU one agent spends per period, measured (wall clock, this machine).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentCost {
    /// Parsing every host's status (the whole prefix), ns.
    pub parse_ns: u64,
    /// `local_shares` for one host (grouping every vif by tenant, the splits of its tenants):
    /// the mean over the hosts measured, ns.
    pub shares_mean_ns: u64,
    /// The most of them, ns.
    pub shares_max_ns: u64,
    /// Hosts measured.
    pub hosts_measured: u32,
}

/// Measures one agent's per-period work on `world`'s current statuses for up to `sample`
/// hosts (spread over all of them).
pub fn measure_agent_cost(world: &World, sample: u32) -> AgentCost {
    let all = world.statuses();
    let texts: Vec<(String, Vec<u8>)> = all
        .iter()
        .map(|(h, s)| (h.clone(), serde_json::to_vec(s).unwrap_or_default()))
        .collect();
    let t = Instant::now();
    let parsed: BTreeMap<String, HostStatus> = texts
        .iter()
        .filter_map(|(h, b)| Some((h.clone(), serde_json::from_slice(b).ok()?)))
        .collect();
    let parse_ns = t.elapsed().as_nanos() as u64;
    let hosts = world.config.hosts;
    let n = sample.clamp(1, hosts);
    let declared = declared_by_statuses(&parsed);
    let (mut sum, mut max) = (0u64, 0u64);
    for k in 0..n {
        let h = host_name((u64::from(k) * u64::from(hosts) / u64::from(n)) as u32);
        let t = Instant::now();
        let s = local_shares(&h, &parsed, &declared, &world.tenants);
        let ns = t.elapsed().as_nanos() as u64;
        std::hint::black_box(s);
        sum += ns;
        max = max.max(ns);
    }
    AgentCost {
        parse_ns,
        shares_mean_ns: sum / u64::from(n),
        shares_max_ns: max,
        hosts_measured: n,
    }
}

#[path = "cluster_traffic.rs"]
mod traffic_model;
pub use traffic_model::{traffic, Traffic};

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
