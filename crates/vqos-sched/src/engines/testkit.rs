//! A tiny virtual-time poll loop for the engines' unit tests (shared by the `ancs`, `policer`
//! and `tcm` tests): sources, a link of fixed capacity, batches of [`MAX_BURST`] frames.

use crate::engine::{Engine, ReadySet, Usage, Verdict};
use crate::units::NS_PER_SEC;

/// What a vif's guest sends.
#[derive(Debug, Clone)]
pub(crate) enum Demand {
    /// Always has frames waiting.
    Greedy,
    /// Frames arrive at a constant rate (bits/s); at most 256 frames queue, the rest are
    /// lost in the guest.
    Rate(u64),
    /// Sends nothing.
    Off,
    /// Always has frames, but at most this many waiting at a time: a backlogged TCP sender
    /// over a TAP with TSO, whose queue refills as fast as it is read but shows only a few
    /// super-frames (or a poll loop that reads fewer frames than granted), so every batch
    /// is shorter than the grant.
    Short(u64),
}

/// One vif's source and counters.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    /// What it sends.
    pub demand: Demand,
    /// Size of its frames on the wire, bytes.
    pub frame_bytes: u32,
    /// Frames waiting (for `Rate` sources).
    backlog: u64,
    /// Fraction of a frame's bits accrued (numerator over frame bits × 10⁹).
    arrival_frac: u128,
    /// Bytes forwarded so far.
    pub forwarded_bytes: u64,
    /// Frames forwarded so far.
    pub forwarded_frames: u64,
    /// Frames dropped by `admit`.
    pub dropped_frames: u64,
}

impl Source {
    pub(crate) fn new(demand: Demand, frame_bytes: u32) -> Self {
        Source {
            demand,
            frame_bytes,
            backlog: 0,
            arrival_frac: 0,
            forwarded_bytes: 0,
            forwarded_frames: 0,
            dropped_frames: 0,
        }
    }

    pub(crate) fn greedy() -> Self {
        Source::new(Demand::Greedy, 1500)
    }

    fn accrue(&mut self, dt_ns: u64) {
        if let Demand::Rate(bps) = self.demand {
            let frame_bits = u128::from(self.frame_bytes) * 8 * u128::from(NS_PER_SEC);
            let acc = self.arrival_frac + u128::from(bps) * u128::from(dt_ns);
            self.backlog = (self.backlog + (acc / frame_bits) as u64).min(256);
            self.arrival_frac = acc % frame_bits;
        }
    }

    fn waiting(&self) -> u64 {
        match self.demand {
            Demand::Greedy => u64::MAX,
            Demand::Short(n) => n,
            Demand::Rate(_) => self.backlog,
            Demand::Off => 0,
        }
    }

    /// When the next frame arrives, given that none is waiting.
    fn next_arrival_ns(&self) -> Option<u64> {
        match self.demand {
            Demand::Rate(bps) if bps > 0 => {
                let frame_bits = u128::from(self.frame_bytes) * 8 * u128::from(NS_PER_SEC);
                Some((frame_bits - self.arrival_frac).div_ceil(u128::from(bps)) as u64)
            }
            _ => None,
        }
    }
}

/// The poll loop: a link of `capacity_bps`, each frame read costing `read_ns` of loop time
/// on top of the link time of what is forwarded.
pub(crate) struct Harness {
    /// Virtual now, ns.
    pub now_ns: u64,
    /// Link capacity, bits/s.
    pub capacity_bps: u64,
    /// Loop time per frame read, ns (so batches that forward nothing still take time).
    pub read_ns: u64,
    /// The vifs' sources, by vif id.
    pub sources: Vec<Source>,
    /// Link time owed, as a fraction of a ns (numerator over capacity_bps).
    link_frac: u128,
}

impl Harness {
    pub(crate) fn new(capacity_bps: u64, sources: Vec<Source>) -> Self {
        Harness {
            now_ns: 0,
            capacity_bps,
            read_ns: 0,
            sources,
            link_frac: 0,
        }
    }

    fn advance(&mut self, to_ns: u64) {
        let dt = to_ns.saturating_sub(self.now_ns);
        for s in &mut self.sources {
            s.accrue(dt);
        }
        self.now_ns = self.now_ns.max(to_ns);
    }

    fn ready(&self) -> ReadySet {
        let mut r = ReadySet::new(self.sources.len());
        for (i, s) in self.sources.iter().enumerate() {
            r.set(i, s.waiting() > 0);
        }
        r
    }

    /// Runs the loop until `until_ns`.
    pub(crate) fn run(&mut self, engine: &mut dyn Engine, until_ns: u64) {
        while self.now_ns < until_ns {
            let ready = self.ready();
            if self.now_ns >= engine.next_tick() {
                engine.tick(&ready, self.now_ns);
            }
            let Some(grant) = engine.select(&ready, self.now_ns) else {
                let mut wake = engine.next_tick().min(engine.eligible_at(self.now_ns));
                for s in &self.sources {
                    if s.waiting() == 0 {
                        if let Some(dt) = s.next_arrival_ns() {
                            wake = wake.min(self.now_ns + dt);
                        }
                    }
                }
                self.advance(wake.clamp(self.now_ns + 1, until_ns));
                continue;
            };
            let v = grant.vif;
            assert!(ready.contains(v), "granted a vif with nothing waiting");
            let frames = self.sources[v].waiting().min(u64::from(grant.max_packets));
            let len = self.sources[v].frame_bytes;
            let mut usage = Usage::default();
            for _ in 0..frames {
                match engine.admit(v, len, self.now_ns) {
                    Verdict::Drop => self.sources[v].dropped_frames += 1,
                    _ => {
                        usage.packets += 1;
                        usage.bytes += u64::from(len);
                    }
                }
            }
            if let Demand::Rate(_) = self.sources[v].demand {
                self.sources[v].backlog -= frames;
            }
            self.sources[v].forwarded_bytes += usage.bytes;
            self.sources[v].forwarded_frames += u64::from(usage.packets);
            // Link time of the forwarded bits, fractions of a ns carried.
            let num = u128::from(usage.bytes) * 8 * u128::from(NS_PER_SEC) + self.link_frac;
            let cap = u128::from(self.capacity_bps);
            self.link_frac = num % cap;
            let busy = (num / cap) as u64 + frames * self.read_ns;
            let end = self.now_ns + busy.max(1);
            engine.charge(v, usage, end);
            self.advance(end);
        }
    }

    /// Bytes forwarded per vif so far.
    pub(crate) fn forwarded(&self) -> Vec<u64> {
        self.sources.iter().map(|s| s.forwarded_bytes).collect()
    }
}

/// Rate in bits/s of `bytes` over `ns`.
pub(crate) fn bps(bytes: u64, ns: u64) -> f64 {
    bytes as f64 * 8.0 * 1e9 / ns as f64
}

/// Per-vif rates between two snapshots of [`Harness::forwarded`].
pub(crate) fn rates(before: &[u64], after: &[u64], ns: u64) -> Vec<f64> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| bps(a - b, ns))
        .collect()
}
