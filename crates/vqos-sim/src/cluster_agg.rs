//! The aggregators' design at scale (docs/cluster.md, "Design: aggregators"), run with the
//! leaders' and hosts' own code: [`Leader`] for each shard, [`Holder`] for each host.
//!
//! **Time.** A period is `ticks` ticks. Host `h` reports at tick `phase_h` of each period to
//! every shard it has tenants in, one message each: its vifs of the shard's tenants
//! ([`World::status_of`]) and what it enforces of each ([`Holder::enforcing`]). Shard `s`'s
//! leader plans at tick `s mod ticks`. Every message is delayed by 0 to `delay_ticks` ticks
//! and lost with probability `loss_percent` %; an answer is applied when it arrives, a lease
//! lapses at its tick. Ticks are the time step, so a lease or a delay is a whole number of
//! them.
//!
//! **Run.** A cold start, a demand shift, `partitioned` hosts cut off from every aggregator
//! for `partition_periods`, the heal, then shard 0's leader crashes: for `election_periods`
//! its tenants' reports go unanswered, then a leader of the next term starts knowing nothing.
//! Each stage is `periods` long (the partition its own).
//!
//! **Excess.** Every vif of a capped tenant holds a share from the start (a host's fallback
//! before any grant). After every event that changes a host's shares, the tenant's Σ share max
//! in force is compared with its max; the report keeps the largest excess (it must be 0).
//!
//! **Cost.** Messages are counted and sized as JSON (the types' serde form); the leaders'
//! `plan` and `report` calls are timed on this machine (measured, never asserted).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde::Serialize;
use vqos_cluster::aggregator::{shard_of, HostGrant, Leader, Report};
use vqos_cluster::holder::Holder;
use vqos_cluster::shares::{declared_by_statuses, Declarations};
use vqos_cluster::{Share, TenantLimits};

use crate::cluster::{next_u64, ClusterSimConfig, ClusterSimError, World};
use crate::settle::{Moved, Settled};

/// The aggregators, the network and the failures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AggSimConfig {
    /// Ticks per period (500 ms): 20 is 25 ms a tick.
    pub ticks: u32,
    /// Aggregator shards.
    pub shards: u32,
    /// Largest one-way delay of a message, in ticks.
    pub delay_ticks: u32,
    /// Messages lost, percent (every stage).
    pub loss_percent: u32,
    /// Hosts cut off from the aggregators (the first ones).
    pub partitioned: u32,
    /// Periods the partition lasts.
    pub partition_periods: u32,
    /// The grants' lease, in ticks.
    pub lease_ticks: u32,
    /// The bound on the clocks' disagreement over a lease, in ticks.
    pub drift_ticks: u32,
    /// Periods shard 0 has no leader after its crash (the election).
    pub election_periods: u32,
    /// The leaders push raises to the hosts they were waiting for
    /// (`vqos_cluster::aggregator`'s `push`); `false`: answers only to reports.
    pub push: bool,
}

impl Default for AggSimConfig {
    fn default() -> Self {
        AggSimConfig {
            ticks: 20,
            shards: 8,
            delay_ticks: 2,
            loss_percent: 1,
            partitioned: 1,
            partition_periods: 10,
            lease_ticks: 80,
            drift_ticks: 2,
            election_periods: 4,
            push: true,
        }
    }
}

/// What [`simulate_aggregators`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AggReport {
    /// The settings.
    pub config: AggSimConfig,
    /// The largest excess of any tenant's Σ share max in force over its max, bit/s.
    pub max_excess_bps: u64,
    /// The tenant and tick of that excess.
    pub max_excess_at: Option<(String, u64)>,
    /// Periods to converge: from the cold start, after the shift, after the heal, after the
    /// crash (`None`: not within the stage).
    pub start_periods: Option<u32>,
    /// After the demand shift.
    pub shift_periods: Option<u32>,
    /// After the demand shift, the tenants it moved, each on its own.
    pub shift_moved: Moved,
    /// After the partition heals.
    pub heal_periods: Option<u32>,
    /// After shard 0's leader crashed (its election included).
    pub failover_periods: Option<u32>,
    /// Reports and answers per period (mean over the run).
    pub messages_per_period: f64,
    /// Their bytes per period, as JSON.
    pub bytes_per_period: f64,
    /// The largest message, bytes.
    pub largest_message_bytes: u64,
    /// The busiest shard's leader time per period (plan and answers), ms, this machine.
    pub busiest_shard_ms: f64,
    /// All shards' leader time per period, ms.
    pub all_shards_ms: f64,
}

/// A message in flight.
enum Msg {
    /// Host, shard, report, sent at tick.
    Report(u32, u32, Report, u64),
    /// Host, answer, the tick its report was sent.
    Answer(u32, BTreeMap<String, HostGrant>, u64),
}

/// One shard: its leader (`None` during an election), term, tenants and declarations.
struct Shard {
    leader: Option<Leader>,
    term: u32,
    declared: Declarations,
    tenants: BTreeMap<String, TenantLimits>,
    busy_ns: u128,
}

/// Counts bytes written (a message's JSON size without keeping it).
struct Count(u64);

impl std::io::Write for Count {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn json_len<T: Serialize>(v: &T) -> u64 {
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).map_or(0, |_| c.0)
}

/// The simulated cluster under aggregators (module doc).
pub struct AggWorld {
    /// The vifs, tenants, shares and rates.
    pub world: World,
    config: AggSimConfig,
    shards: Vec<Shard>,
    holders: Vec<Holder>,
    /// Per host: its phase, its vifs by shard, cut off, the tick of its latest report to each
    /// shard (a pushed answer's lease is timed from it).
    phase: Vec<u32>,
    last_report: Vec<BTreeMap<u32, u64>>,
    /// Hosts by name (a pushed answer names its host).
    host_ids: BTreeMap<String, u32>,
    by_shard: Vec<BTreeMap<u32, Vec<usize>>>,
    cut: Vec<bool>,
    /// Per tenant index: Σ share max in force (u128: no overflow).
    sums: Vec<u128>,
    queue: BTreeMap<u64, Vec<Msg>>,
    tick: u64,
    rng: u64,
    excess: (u64, Option<(String, u64)>),
    /// Messages, bytes, largest.
    traffic: (u64, u64, u64),
}

impl AggWorld {
    /// The world of `base` under `config`'s aggregators; every host starts holding its
    /// fallback, `limits / N`, of each of its tenants.
    pub fn new(
        base: &ClusterSimConfig,
        config: &AggSimConfig,
    ) -> Result<AggWorld, ClusterSimError> {
        if config.ticks == 0 || config.shards == 0 || config.lease_ticks <= config.delay_ticks * 2 {
            return Err(ClusterSimError::Invalid(
                "ticks ≥ 1, shards ≥ 1 and a lease longer than a round trip".into(),
            ));
        }
        let mut world = World::new(base)?;
        world.sample_per_period(config.ticks);
        let declared = declared_by_statuses(&world.statuses());
        let hosts = base.hosts as usize;
        let mut members: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        let mut by_shard = vec![BTreeMap::<u32, Vec<usize>>::new(); hosts];
        let shard_of_tenant: Vec<u32> = (0..base.tenants)
            .map(|t| shard_of(&format!("t{t}"), config.shards))
            .collect();
        for (i, v) in world.vifs.iter().enumerate() {
            members.entry(v.tenant).or_default().insert(v.host);
            let s = shard_of_tenant[v.tenant as usize];
            by_shard[v.host as usize].entry(s).or_default().push(i);
        }
        let shards = shards(config, &world, declared, &shard_of_tenant);
        let holders = holders(&world, &members);
        let mut rng = base.seed ^ 0xa66_5eed;
        let phase = (0..hosts)
            .map(|_| (next_u64(&mut rng) % u64::from(config.ticks)) as u32)
            .collect();
        let host_ids = (0..hosts as u32)
            .map(|h| (world.host(h).to_string(), h))
            .collect();
        let mut w = AggWorld {
            sums: vec![0; base.tenants as usize],
            world,
            config: config.clone(),
            shards,
            holders,
            phase,
            last_report: vec![BTreeMap::new(); hosts],
            host_ids,
            by_shard,
            cut: vec![false; hosts],
            queue: BTreeMap::new(),
            tick: 0,
            rng,
            excess: (0, None),
            traffic: (0, 0, 0),
        };
        for h in 0..hosts as u32 {
            let tenants: Vec<String> = w.holders[h as usize]
                .iter()
                .map(|(t, _)| t.clone())
                .collect();
            w.enforce(h, &tenants);
        }
        Ok(w)
    }

    fn now_ns(&self) -> u64 {
        self.tick * (500_000_000 / u64::from(self.config.ticks))
    }

    /// Sends `m` (counted, sized) with a random delay, unless it is lost.
    fn send(&mut self, m: Msg) {
        let size = match &m {
            Msg::Report(_, _, r, _) => json_len(r),
            Msg::Answer(_, a, _) => json_len(a),
        };
        self.traffic.0 += 1;
        self.traffic.1 += size;
        self.traffic.2 = self.traffic.2.max(size);
        if next_u64(&mut self.rng) % 100 < u64::from(self.config.loss_percent) {
            return;
        }
        let delay = next_u64(&mut self.rng) % (u64::from(self.config.delay_ticks) + 1);
        self.queue.entry(self.tick + delay).or_default().push(m);
    }

    /// Puts host `h`'s holdings of `tenants` in force on its vifs, and checks the tenants'
    /// sums against their maxes.
    fn enforce(&mut self, h: u32, tenants: &[String]) {
        for t in tenants {
            let Some(held) = self.holders[h as usize].get(t) else {
                continue;
            };
            let k: usize = t[1..].parse().unwrap_or(0);
            for (port, s) in &held.shares {
                let i: usize = port[1..].parse().unwrap_or(0);
                let old = self.world.shares[i].map_or(0, |s| share_max(&s));
                self.sums[k] = self.sums[k] - old + share_max(s);
                self.world.shares[i] = Some(*s);
            }
            let Some(max) = self.world.tenants[t].max_bps else {
                continue;
            };
            let over = self.sums[k].saturating_sub(u128::from(max));
            let over = u64::try_from(over).unwrap_or(u64::MAX);
            if over > self.excess.0 {
                self.excess = (over, Some((t.clone(), self.tick)));
            }
        }
    }

    /// Host `h` reports to each shard it has tenants in.
    fn report(&mut self, h: u32) {
        let shards: Vec<u32> = self.by_shard[h as usize].keys().copied().collect();
        for s in shards {
            self.report_to(h, s);
        }
    }

    /// Host `h` reports to shard `s`: its vifs of the shard's tenants, what it enforces of them.
    fn report_to(&mut self, h: u32, s: u32) {
        let Some(vifs) = self.by_shard[h as usize].get(&s) else {
            return;
        };
        let status = self.world.status_of(vifs);
        let tenants = &self.shards[s as usize].tenants;
        let r = Report {
            host: self.world.host(h).to_string(),
            enforcing: self.holders[h as usize]
                .enforcing()
                .into_iter()
                .filter(|(t, _)| tenants.contains_key(t))
                .collect(),
            status,
        };
        self.last_report[h as usize].insert(s, self.tick);
        self.send(Msg::Report(h, s, r, self.tick));
    }

    /// Delivers the messages due at this tick.
    fn deliver(&mut self) {
        let now = self.now_ns();
        let tick_ns = 500_000_000 / u64::from(self.config.ticks);
        // An answer sent without delay is due at this tick too: deliver until none is left.
        while let Some(due) = self.queue.remove(&self.tick) {
            for m in due {
                self.deliver_one(m, now, tick_ns);
            }
        }
    }

    fn deliver_one(&mut self, m: Msg, now: u64, tick_ns: u64) {
        match m {
            Msg::Report(h, s, r, sent) => {
                let shard = &mut self.shards[s as usize];
                let Some(leader) = shard.leader.as_mut() else {
                    return;
                };
                let t0 = Instant::now();
                let answer = leader.report(r, now);
                shard.busy_ns += t0.elapsed().as_nanos();
                if !self.cut[h as usize] {
                    self.send(Msg::Answer(h, answer, sent));
                }
                self.push(s);
            }
            Msg::Answer(h, answer, sent) => {
                let changed = self.holders[h as usize].apply(&answer, sent * tick_ns, now);
                self.enforce(h, &changed);
            }
        }
    }

    /// Shard `s`'s leader pushes what it has to (`config.push`): each answer's lease timed
    /// from the host's latest report to the shard.
    fn push(&mut self, s: u32) {
        let now = self.now_ns();
        let shard = &mut self.shards[s as usize];
        let Some(leader) = shard.leader.as_mut().filter(|_| self.config.push) else {
            return;
        };
        let t0 = Instant::now();
        let pushed = leader.push(now);
        shard.busy_ns += t0.elapsed().as_nanos();
        for (host, answer) in pushed {
            let Some(&to) = self.host_ids.get(&host) else {
                continue;
            };
            let last = self.last_report[to as usize].get(&s).copied();
            if let (Some(sent), false) = (last, self.cut[to as usize]) {
                self.send(Msg::Answer(to, answer, sent));
            }
        }
    }

    /// One tick (module doc).
    pub fn step(&mut self) {
        self.world.send();
        let phase = (self.tick % u64::from(self.config.ticks)) as u32;
        for s in 0..self.shards.len() {
            let shard = &mut self.shards[s];
            if s as u64 % u64::from(self.config.ticks) != u64::from(phase) {
                continue;
            }
            if let Some(l) = shard.leader.as_mut() {
                let t0 = Instant::now();
                l.plan(&shard.declared, &shard.tenants);
                shard.busy_ns += t0.elapsed().as_nanos();
                self.push(s as u32);
            }
        }
        for h in 0..self.phase.len() as u32 {
            if self.phase[h as usize] == phase && !self.cut[h as usize] {
                self.report(h);
            }
        }
        self.deliver();
        let now = self.now_ns();
        for h in 0..self.holders.len() as u32 {
            if self.holders[h as usize]
                .next_lapse_ns()
                .is_some_and(|t| t <= now)
            {
                let changed = self.holders[h as usize].lapse(now);
                self.enforce(h, &changed);
            }
        }
        self.tick += 1;
    }

    /// Runs `periods` periods; how the world and its tenants settled (as [`World::run`]).
    pub fn run(&mut self, periods: u32) -> Settled {
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
    }

    /// Shard `s`'s leader crashes (`up: false`), or a leader of the next term starts.
    pub fn leader(&mut self, s: usize, up: bool) {
        let tick_ns = 500_000_000 / u64::from(self.config.ticks);
        let now = self.now_ns();
        let (lease, drift) = (
            u64::from(self.config.lease_ticks) * tick_ns,
            u64::from(self.config.drift_ticks) * tick_ns,
        );
        let shard = &mut self.shards[s];
        shard.leader = None;
        if up {
            shard.term += 1;
            shard.leader = Some(Leader::new(shard.term, now, lease, drift));
        }
    }

    /// Cuts the first `n` hosts off from the aggregators, or heals them.
    pub fn cut(&mut self, n: u32, cut: bool) {
        for c in self.cut.iter_mut().take(n as usize) {
            *c = cut;
        }
    }
}

/// Each shard with its leader of term 1, its tenants' limits and declarations.
fn shards(
    config: &AggSimConfig,
    world: &World,
    declared: Declarations,
    shard_of_tenant: &[u32],
) -> Vec<Shard> {
    let tick_ns = 500_000_000 / u64::from(config.ticks);
    let (lease_ns, drift_ns) = (
        u64::from(config.lease_ticks) * tick_ns,
        u64::from(config.drift_ticks) * tick_ns,
    );
    let mut shards: Vec<Shard> = (0..config.shards)
        .map(|_| Shard {
            leader: Some(Leader::new(1, 0, lease_ns, drift_ns)),
            term: 1,
            declared: Declarations::new(),
            tenants: BTreeMap::new(),
            busy_ns: 0,
        })
        .collect();
    for (h, vifs) in declared {
        for (port, d) in vifs {
            let t: usize = d.tenant[1..].parse().unwrap_or(0);
            let s = &mut shards[shard_of_tenant[t] as usize];
            s.tenants.insert(d.tenant.clone(), world.tenants[&d.tenant]);
            s.declared.entry(h.clone()).or_default().insert(port, d);
        }
    }
    shards
}

/// Each host holding `limits / N` of each of its tenants over its vifs' own caps, as an
/// agent starts.
fn holders(world: &World, members: &BTreeMap<u32, BTreeSet<u32>>) -> Vec<Holder> {
    let hosts = world.config.hosts as usize;
    let mut own: Vec<BTreeMap<u32, BTreeMap<String, Share>>> = vec![BTreeMap::new(); hosts];
    for (i, v) in world.vifs.iter().enumerate() {
        let s = Share {
            min_bps: 0,
            max_bps: v.max_bps,
        };
        own[v.host as usize]
            .entry(v.tenant)
            .or_default()
            .insert(world.port(i).to_string(), s);
    }
    let mut holders = vec![Holder::default(); hosts];
    for (h, tenants) in own.iter().enumerate() {
        for (t, vifs) in tenants {
            let limits = world.tenants[&format!("t{t}")];
            let n = members[t].len() as u64;
            let cap = (limits.max_bps.map(|m| m / n), limits.min_bps / n);
            holders[h].start(&format!("t{t}"), cap, vifs);
        }
    }
    holders
}

fn share_max(s: &Share) -> u128 {
    u128::from(s.max_bps.unwrap_or(u64::MAX))
}

/// The run of the module doc.
pub fn simulate_aggregators(
    base: &ClusterSimConfig,
    config: &AggSimConfig,
) -> Result<AggReport, ClusterSimError> {
    let mut w = AggWorld::new(base, config)?;
    let start_periods = w.run(base.periods).all;
    w.world.shift();
    let shift = w.run(base.periods);
    w.cut(config.partitioned, true);
    w.run(config.partition_periods);
    w.cut(config.partitioned, false);
    let heal_periods = w.run(base.periods).all;
    w.leader(0, false);
    w.run(config.election_periods);
    w.leader(0, true);
    let failover = w.run(base.periods).all.map(|p| p + config.election_periods);
    let periods = w.tick as f64 / f64::from(config.ticks);
    let busiest = w.shards.iter().map(|s| s.busy_ns).max().unwrap_or(0);
    let all: u128 = w.shards.iter().map(|s| s.busy_ns).sum();
    Ok(AggReport {
        config: config.clone(),
        max_excess_bps: w.excess.0,
        max_excess_at: w.excess.1.clone(),
        start_periods,
        shift_periods: shift.all,
        shift_moved: shift.moved,
        heal_periods,
        failover_periods: failover,
        messages_per_period: w.traffic.0 as f64 / periods,
        bytes_per_period: w.traffic.1 as f64 / periods,
        largest_message_bytes: w.traffic.2,
        busiest_shard_ms: busiest as f64 / 1e6 / periods,
        all_shards_ms: all as f64 / 1e6 / periods,
    })
}

#[cfg(test)]
#[path = "cluster_agg_tests.rs"]
mod tests;
