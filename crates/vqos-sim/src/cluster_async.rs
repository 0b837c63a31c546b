//! The cluster with asynchrony: every host reads and reports at its own phase of the period,
//! some hosts are cut off from etcd for a while, and the shares in force are summed per tenant
//! at every tick, so that a moment above a tenant's max cannot hide between two snapshots.
//!
//! It runs the agents' own code: the statuses of [`World::statuses`], the split
//! ([`vqos_cluster::all_shares`] over the statuses in etcd when the host reads, with its
//! [`Guard::split_limits`]), and the grants ([`Guard::plan`], compare-and-puts on a [`Ledger`],
//! [`Guard::fallback`] once a cut host's view lapses). With `guarded: false` the hosts apply
//! the split as they read it, as the agents did before the grants.
//!
//! **Time.** A period is `ticks` ticks; host `h` runs its period at tick `phase_h` of each
//! period (drawn from the seed). At a tick, first every vif sends within its share in force,
//! then the hosts due publish their statuses, all read etcd (one revision), and each in turn
//! plans and commits: hosts of the same tick race for the same released capacity. A cut host
//! does nothing; its status key expires `lease_periods` after its last write, and its view
//! lapses as long after its last period (it then holds its fallback).
//!
//! **Excess.** After every tick, per tenant, `Σ share max in force − max` over its vifs that
//! have a share; the report keeps the largest (0: never above), from the second period on
//! (before its first period a host's vifs have no share yet).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use vqos_cluster::grants::changed;
use vqos_cluster::shares::{declared_by_statuses, Declarations};
use vqos_cluster::{all_shares, Guard, HostStatus, Ledger, Share, TenantLimits, View};

use crate::cluster::{ClusterSimConfig, ClusterSimError, World};

/// The asynchrony, the partition and the grants.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AsyncSimConfig {
    /// Ticks per period (each host's phase is one of them). The hosts of one tick read at one
    /// revision and race: a tick stands for the agent's read-to-commit time, a few ms of a
    /// 500 ms period (100 ticks: 5 ms).
    pub ticks: u32,
    /// Hosts cut off from etcd (the first ones by name).
    pub partitioned: u32,
    /// Periods the partition lasts (it starts after the shift has had `periods` periods).
    pub partition_periods: u32,
    /// The hosts' view lease and status lease, in periods (3 s / 500 ms).
    pub lease_periods: u32,
    /// How long past a silent host's lease the others wait, in periods.
    pub margin_periods: u32,
    /// Run the grants (else the split is applied as read, as before).
    pub guarded: bool,
}

impl Default for AsyncSimConfig {
    fn default() -> Self {
        AsyncSimConfig {
            ticks: 100,
            partitioned: 1,
            partition_periods: 20,
            lease_periods: 6,
            margin_periods: 3,
            guarded: true,
        }
    }
}

/// What [`simulate_async`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AsyncReport {
    /// The settings.
    pub config: AsyncSimConfig,
    /// The largest excess of any tenant's shares in force over its max, at any tick, bit/s.
    pub max_excess_bps: u64,
    /// The tenant and the tick (from the start) of that excess.
    pub max_excess_at: Option<(String, u64)>,
    /// Periods to converge after the demand shift (`None`: not within the periods).
    pub shift_periods: Option<u32>,
    /// Periods to converge after the partition heals (`None`: not within the periods).
    pub heal_periods: Option<u32>,
    /// Raises committed.
    pub raises_committed: u64,
    /// Raises refused because another grant of the tenant changed since the host read.
    pub raises_refused: u64,
}

/// One simulated host.
#[derive(Debug, Clone)]
struct SimHost {
    /// Its name.
    name: String,
    /// Its tick in the period.
    phase: u32,
    /// Its grant state.
    guard: Guard,
    /// Cut off from etcd.
    cut: bool,
    /// The tick of its last status write.
    wrote: u64,
    /// It holds its fallbacks.
    fallen: bool,
    /// Its vifs (indices into the world's).
    vifs: Vec<usize>,
}

/// The world, its hosts and etcd.
#[derive(Debug, Clone)]
pub struct AsyncWorld {
    /// The vifs, tenants, shares and rates.
    pub world: World,
    /// The settings.
    pub config: AsyncSimConfig,
    /// The hosts.
    hosts: Vec<SimHost>,
    /// The grants and heartbeats.
    ledger: Ledger,
    /// The status keys in etcd.
    board: BTreeMap<String, HostStatus>,
    /// What etcd declares (every vif, honestly).
    declared: Declarations,
    /// The hosts of each tenant.
    members: BTreeMap<String, BTreeSet<String>>,
    /// Ticks run.
    tick: u64,
    /// The largest excess and where.
    excess: (u64, Option<(String, u64)>),
    /// Raises committed and refused.
    raises: (u64, u64),
}

const PERIOD_NS: u64 = 500_000_000;

/// The splits computed in a tick, per the limits they split (hosts of a tick that see the same
/// limits read the same statuses, so they share one split).
type SplitCache = Vec<(
    BTreeMap<String, TenantLimits>,
    BTreeMap<(String, String), Share>,
)>;

fn tenant_of(world: &World, i: usize) -> String {
    format!("t{}", world.vifs[i].tenant)
}

impl AsyncWorld {
    /// The world of `base` with the asynchrony of `config` (phases drawn from the seed).
    pub fn new(
        base: &ClusterSimConfig,
        config: &AsyncSimConfig,
    ) -> Result<AsyncWorld, ClusterSimError> {
        if config.ticks == 0 || config.lease_periods < 2 {
            return Err(ClusterSimError::Invalid(
                "ticks ≥ 1 and lease_periods ≥ 2".into(),
            ));
        }
        let mut world = World::new(base)?;
        world.sample_per_period(config.ticks);
        let all = world.statuses();
        let declared = declared_by_statuses(&all);
        let mut members: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (h, vifs) in &declared {
            for d in vifs.values() {
                members
                    .entry(d.tenant.clone())
                    .or_default()
                    .insert(h.clone());
            }
        }
        let tick_ns = PERIOD_NS / u64::from(config.ticks);
        let lease_ms = u64::from(config.lease_periods) * PERIOD_NS / 1_000_000;
        let margin_ns = u64::from(config.margin_periods) * PERIOD_NS + tick_ns;
        let mut rng = base.seed ^ 0x5eed_a5a5;
        let mut hosts: Vec<SimHost> = all
            .keys()
            .map(|h| SimHost {
                name: h.clone(),
                phase: (crate::cluster::next_u64(&mut rng) % u64::from(config.ticks)) as u32,
                guard: Guard::new(h, lease_ms, margin_ns),
                cut: false,
                wrote: 0,
                fallen: false,
                vifs: Vec::new(),
            })
            .collect();
        for (i, v) in world.vifs.iter().enumerate() {
            hosts[v.host as usize].vifs.push(i);
        }
        Ok(AsyncWorld {
            world,
            config: config.clone(),
            hosts,
            ledger: Ledger::default(),
            board: BTreeMap::new(),
            declared,
            members,
            tick: 0,
            excess: (0, None),
            raises: (0, 0),
        })
    }

    fn now_ns(&self) -> u64 {
        self.tick * (PERIOD_NS / u64::from(self.config.ticks))
    }

    /// Cuts the first `n` hosts off from etcd, or heals them all.
    pub fn cut(&mut self, n: u32, cut: bool) {
        for h in self.hosts.iter_mut().take(n as usize) {
            h.cut = cut;
        }
    }

    /// By tenant then port, the shares of host `h`'s vifs in `shares`.
    fn by_tenant(
        &self,
        h: usize,
        shares: impl Fn(usize) -> Option<Share>,
    ) -> BTreeMap<String, BTreeMap<String, Share>> {
        let mut out: BTreeMap<String, BTreeMap<String, Share>> = BTreeMap::new();
        for &i in &self.hosts[h].vifs {
            if let Some(s) = shares(i) {
                out.entry(tenant_of(&self.world, i))
                    .or_default()
                    .insert(self.world.port(i).to_string(), s);
            }
        }
        out
    }

    /// Host `h`'s period on what it read (`view`), the split of the statuses cached per limits.
    fn host_period(&mut self, h: usize, view: &View, cache: &mut SplitCache) {
        let now = self.now_ns();
        let board = &self.board;
        let lims = if self.config.guarded {
            let g = &mut self.hosts[h].guard;
            g.observe(now, view);
            g.split_limits(now, view, &self.world.tenants, &self.members, |x| {
                board.contains_key(x)
            })
        } else {
            self.world.tenants.clone()
        };
        let split = match cache.iter().position(|(l, _)| *l == lims) {
            Some(k) => &cache[k].1,
            None => {
                cache.push((lims.clone(), all_shares(board, &self.declared, &lims)));
                &cache[cache.len() - 1].1
            }
        };
        let name = self.hosts[h].name.clone();
        let world = &self.world;
        let target = |i: usize| {
            split
                .get(&(name.clone(), world.port(i).to_string()))
                .copied()
        };
        if !self.config.guarded {
            let got: Vec<(usize, Option<Share>)> =
                self.hosts[h].vifs.iter().map(|&i| (i, target(i))).collect();
            for (i, s) in got {
                self.world.shares[i] = s;
            }
            return;
        }
        let targets = self.by_tenant(h, target);
        let enforced = self.by_tenant(h, |i| self.world.shares[i]);
        let host = &mut self.hosts[h];
        let plan = host.guard.plan(
            now,
            view,
            &targets,
            &enforced,
            &self.world.tenants,
            &self.members,
        );
        let mut hold = BTreeMap::new();
        for (t, st) in plan {
            if st.raise {
                let g = st.grant.clone().unwrap_or_default();
                if self.ledger.commit_raise(&t, &host.name, g.clone(), view) {
                    host.guard.set_committed(&t, Some(g));
                    self.raises.0 += 1;
                    hold.extend(st.raised);
                } else {
                    self.raises.1 += 1;
                    hold.extend(st.hold);
                }
                continue;
            }
            hold.extend(st.hold);
            if changed(host.guard.committed().get(&t), st.grant.as_ref()) {
                self.ledger.put(&t, &host.name, st.grant.clone());
                host.guard.set_committed(&t, st.grant);
            }
        }
        for &i in &host.vifs {
            self.world.shares[i] = hold.get(self.world.port(i)).copied();
        }
        host.guard.confirm(now);
        host.fallen = false;
    }

    /// One tick (module doc).
    pub fn step(&mut self) {
        self.world.send();
        let phase = (self.tick % u64::from(self.config.ticks)) as u32;
        let due: Vec<usize> = (0..self.hosts.len())
            .filter(|&h| self.hosts[h].phase == phase && !self.hosts[h].cut)
            .collect();
        if !due.is_empty() {
            let mut all = self.world.statuses();
            for &h in &due {
                let name = self.hosts[h].name.clone();
                if let Some(s) = all.remove(&name) {
                    self.board.insert(name.clone(), s);
                }
                self.ledger.beat(&name);
                self.hosts[h].wrote = self.tick;
            }
            // All the hosts due read at one revision, then commit in turn.
            let view = self.ledger.read();
            let mut cache = Vec::new();
            for &h in &due {
                self.host_period(h, &view, &mut cache);
            }
        }
        self.lapse();
        self.tick += 1;
        if self.tick > u64::from(self.config.ticks) {
            self.measure();
        }
    }

    /// Cut hosts: their status keys expire, and their views lapse to the fallbacks.
    fn lapse(&mut self) {
        let lease_ticks = u64::from(self.config.lease_periods) * u64::from(self.config.ticks);
        let now = self.now_ns();
        for h in 0..self.hosts.len() {
            let host = &self.hosts[h];
            if host.cut && self.tick >= host.wrote + lease_ticks {
                let name = host.name.clone();
                self.board.remove(&name);
                self.ledger.expire(&name);
            }
            let host = &self.hosts[h];
            if !self.config.guarded || host.fallen || !host.guard.lapsed(now) {
                continue;
            }
            let enforced: BTreeMap<String, Share> = host
                .vifs
                .iter()
                .filter_map(|&i| Some((self.world.port(i).to_string(), self.world.shares[i]?)))
                .collect();
            let tenants = host
                .vifs
                .iter()
                .map(|&i| (self.world.port(i).to_string(), tenant_of(&self.world, i)))
                .collect();
            let fb = host.guard.fallback(&enforced, &tenants);
            for &i in &host.vifs {
                self.world.shares[i] = fb.get(self.world.port(i)).copied();
            }
            self.hosts[h].fallen = true;
        }
    }

    /// Notes the largest Σ share max in force above a tenant's max.
    fn measure(&mut self) {
        let mut sums: BTreeMap<u32, u128> = BTreeMap::new();
        for (i, v) in self.world.vifs.iter().enumerate() {
            let s = self.world.shares[i].and_then(|s| s.max_bps);
            *sums.entry(v.tenant).or_default() += u128::from(s.unwrap_or(0));
        }
        for (t, sum) in sums {
            let name = format!("t{t}");
            let Some(max) = self.world.tenants[&name].max_bps else {
                continue;
            };
            let over = u64::try_from(sum.saturating_sub(u128::from(max))).unwrap_or(u64::MAX);
            if over > self.excess.0 {
                self.excess = (over, Some((name, self.tick)));
            }
        }
    }

    /// Runs `periods` periods; the periods to converge (as [`World::run`]: the first period
    /// from which the rates stay within the slack of the reference, `None` if not converged for
    /// the last two).
    pub fn run(&mut self, periods: u32) -> Option<u32> {
        let ticks = self.config.ticks;
        crate::cluster::settle(
            periods,
            self,
            |w| &w.world,
            |w| {
                for _ in 0..ticks {
                    w.step();
                }
            },
        )
        .all
    }
}

/// A cold start, a demand shift, a partition of `partitioned` hosts, its healing: each
/// `base.periods` long (the partition `partition_periods`).
pub fn simulate_async(
    base: &ClusterSimConfig,
    config: &AsyncSimConfig,
) -> Result<AsyncReport, ClusterSimError> {
    let mut w = AsyncWorld::new(base, config)?;
    w.run(base.periods);
    w.world.shift();
    let shift_periods = w.run(base.periods);
    w.cut(config.partitioned, true);
    w.run(config.partition_periods);
    w.cut(config.partitioned, false);
    let heal_periods = w.run(base.periods);
    Ok(AsyncReport {
        config: config.clone(),
        max_excess_bps: w.excess.0,
        max_excess_at: w.excess.1.clone(),
        shift_periods,
        heal_periods,
        raises_committed: w.raises.0,
        raises_refused: w.raises.1,
    })
}

#[cfg(test)]
#[path = "cluster_async_tests.rs"]
mod tests;
