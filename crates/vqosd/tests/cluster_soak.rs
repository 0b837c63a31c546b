//! The aggregators over minutes (issue 24's real test; docs/cluster.md, "Ten minutes on a real
//! etcd"): a 3-member etcd on loopback, `VQOS_SOAK_HOSTS` mock-switch vqosd agents (default
//! 100) on 2 aggregator shards, 3 of them candidates, 20 tenants of 100 Mbit/s each. A third of
//! the way in, the daemon leading shard 0 is killed (SIGKILL); half way, an etcd member is
//! killed, and the fleet runs on the other two to the end. (It is not restarted: its client
//! port on loopback lies in the ephemeral range, and one of the fleet's own connections took
//! it as a source port in the first run, so the member could not bind it again.) Every 5 s: each tenant's enforced maxes summed over
//! its live hosts (never above its max: asserted), and etcd's own counters (`/metrics` of
//! every live member: gRPC messages received, database size, revision). Printed at the end:
//! requests a second, the database's size, the failover time, the largest excess.
//!
//! Ignored by default (it runs for `VQOS_SOAK_SECS`, default 600); run it with
//! `scripts/cluster-soak.sh`. Skipped with a message when `etcd` is not installed.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::cluster::skip;
use common::Daemon;
use vqos_cluster::election::leader_of;
use vqos_cluster::EtcdSettings;
use vqos_testkit::{poll, EtcdCluster};

const TENANTS: usize = 20;
const MAX: u64 = 100_000_000;
const CANDIDATES: usize = 3;
const SAMPLE: Duration = Duration::from_secs(5);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Host `i`'s daemon: vm1 in tenant `t<i % 20>`; the first three are candidates.
fn daemon(dir: &std::path::Path, i: usize, endpoints: &str) -> Daemon {
    let host = format!("h{i}");
    let d = dir.join(&host);
    std::fs::create_dir_all(&d).unwrap();
    let (config, socket) = (d.join("vqosd.toml"), d.join("vqosd.sock"));
    let list: Vec<String> = endpoints.split(',').map(|e| format!("\"{e}\"")).collect();
    let listen = match i < CANDIDATES {
        true => "listen = \"127.0.0.1:0\"\n",
        false => "",
    };
    let text = format!(
        "capacity = \"1Gbit\"\nstate_file = \"{d}/state.json\"\n[api]\nsocket = \"{s}\"\n\
         [[port]]\nname = \"vm1\"\n[cluster]\nhost = \"{host}\"\nendpoints = [{list}]\n\
         period = \"500ms\"\nlease_ttl = \"3s\"\ntimeout = \"1s\"\n\
         [cluster.aggregators]\nshards = 2\n{listen}",
        d = d.display(),
        s = socket.display(),
        list = list.join(", "),
    );
    std::fs::write(&config, text).unwrap();
    Daemon::start_args(&config, &socket, &["--backend", "mock"])
}

/// etcd's `/metrics` from `url` (`http://127.0.0.1:PORT`), summed by metric name.
fn metrics(url: &str) -> Option<BTreeMap<String, f64>> {
    let addr = url.strip_prefix("http://")?;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let req = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let mut out = BTreeMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let metric = name.split('{').next().unwrap_or(name);
        *out.entry(metric.to_string()).or_insert(0.0) += v;
        // Requests by method too, `grpc_server_msg_received_total/Range`.
        if let Some(m) = name.split("grpc_method=\"").nth(1) {
            let method = m.split('"').next().unwrap_or("");
            *out.entry(format!("{metric}/{method}")).or_insert(0.0) += v;
        }
    }
    Some(out)
}

/// The test's own etcd client, to ask who leads; its calls are counted, to be left out of
/// the fleet's requests.
struct Probe {
    settings: EtcdSettings,
    rt: tokio::runtime::Runtime,
    client: Option<vqos_cluster::etcd_client::Client>,
    calls: u64,
}

impl Probe {
    /// Shard 0's leader's endpoint, if etcd answers and one leads.
    fn leader(&mut self) -> Option<String> {
        self.rt.block_on(async {
            if self.client.is_none() {
                let c = self.settings.connect(Duration::from_secs(2)).await.ok();
                self.client = c;
            }
            self.calls += 1;
            let c = self.client.as_mut()?;
            match leader_of(c, 0, Duration::from_secs(2)).await {
                Ok(l) => l.map(|(e, _)| e),
                Err(_) => {
                    self.client = None;
                    None
                }
            }
        })
    }
}

/// The endpoint a candidate serves on, from its log.
fn served_on(d: &Daemon) -> Option<String> {
    let log = d.log();
    let line = log.lines().find(|l| l.contains("serving on "))?;
    Some(format!(
        "http://{}",
        line.rsplit("serving on ").next()?.trim()
    ))
}

/// Per tenant, the Σ of the enforced maxes of its live hosts' vm1, and how many hosts had
/// none yet.
fn held(daemons: &[Option<Daemon>]) -> (BTreeMap<usize, u64>, usize) {
    let mut sum = BTreeMap::new();
    let mut missing = 0;
    for (i, d) in daemons.iter().enumerate() {
        let Some(d) = d else { continue };
        let max = d.get("/v1/policies/vm1")["enforced"]["max_bps"].as_u64();
        match max {
            Some(m) => *sum.entry(i % TENANTS).or_insert(0) += m,
            None => missing += 1,
        }
    }
    (sum, missing)
}

/// Counters summed over members, counting only rises (a restarted member starts from 0).
#[derive(Default)]
struct Rises {
    last: BTreeMap<usize, f64>,
    total: f64,
}

impl Rises {
    fn add(&mut self, member: usize, value: f64) {
        let before = self.last.insert(member, value).unwrap_or(0.0);
        self.total += (value - before).max(0.0);
    }
}

#[test]
#[ignore = "minutes long: scripts/cluster-soak.sh"]
fn a_fleet_on_the_aggregators_for_minutes_never_exceeds_a_max_and_keeps_etcd_small() {
    if skip("cluster soak") {
        return;
    }
    let hosts = env("VQOS_SOAK_HOSTS", 100) as usize;
    let secs = env("VQOS_SOAK_SECS", 600);
    let mut etcd = EtcdCluster::start(0, 3);
    let urls = etcd.urls();
    let settings = EtcdSettings::from_list(&urls).unwrap();
    let member = &etcd.members[0];
    for t in 0..TENANTS {
        member.ctl(&[
            "put",
            &format!("/vqos/v1/tenants/t{t}"),
            r#"{"max":"100Mbit"}"#,
        ]);
    }
    for i in 0..hosts {
        let key = format!("/vqos/v1/hosts/h{i}/vifs/vm1");
        let doc = format!(r#"{{"tenant":"t{}"}}"#, i % TENANTS);
        member.ctl(&["put", &key, &doc]);
    }
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut daemons: Vec<Option<Daemon>> = (0..hosts)
        .map(|i| Some(daemon(dir.path(), i, &urls)))
        .collect();
    println!("{hosts} daemons started in {:?}", started.elapsed());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut probe = Probe {
        settings,
        rt,
        client: None,
        calls: 0,
    };
    let first = poll(Duration::from_secs(30), || probe.leader()).expect("a leader");
    let t0 = Instant::now();
    let (mut msgs, mut excess, mut db_peak) = (Rises::default(), 0u64, 0f64);
    let mut by_method: BTreeMap<String, Rises> = BTreeMap::new();
    let (mut killed_leader, mut killed_member) = (false, false);
    let mut failover = None;
    let mut last_sample = Instant::now() - SAMPLE;
    let mut samples = Vec::new();
    while t0.elapsed() < Duration::from_secs(secs) {
        let at = t0.elapsed().as_secs();
        if !killed_leader && at >= secs / 3 {
            let old = probe.leader().expect("shard 0 led");
            let gone = (0..CANDIDATES)
                .find(|&i| daemons[i].as_ref().and_then(served_on).as_ref() == Some(&old))
                .expect("shard 0's leader is a candidate");
            daemons[gone].take().unwrap().kill9();
            let killed_at = Instant::now();
            let next = poll(Duration::from_secs(30), || {
                std::thread::sleep(Duration::from_millis(100));
                probe.leader().filter(|l| *l != old)
            });
            failover = Some((killed_at.elapsed(), next.expect("a new leader in 30 s")));
            println!("t={at}s: h{gone} (shard 0's leader) killed; {failover:?}");
            killed_leader = true;
        }
        if !killed_member && at >= secs / 2 {
            etcd.members[2].kill();
            println!("t={at}s: etcd member 2 killed");
            killed_member = true;
        }
        if last_sample.elapsed() >= SAMPLE {
            last_sample = Instant::now();
            let (sums, missing) = held(&daemons);
            let over = sums
                .values()
                .map(|s| s.saturating_sub(MAX))
                .max()
                .unwrap_or(0);
            excess = excess.max(over);
            assert_eq!(over, 0, "t={at}s: a tenant above its max: {sums:?}");
            let (mut db, mut rev) = (0f64, 0f64);
            for (m, e) in etcd.members.iter().enumerate() {
                let Some(x) = metrics(&e.url()) else { continue };
                let get = |k: &str| x.get(k).copied().unwrap_or(0.0);
                msgs.add(m, get("grpc_server_msg_received_total"));
                let prefix = "grpc_server_msg_received_total/";
                for (k, v) in x.iter().filter(|(k, _)| k.starts_with(prefix)) {
                    let method = k[prefix.len()..].to_string();
                    by_method.entry(method).or_default().add(m, *v);
                }
                db = db.max(get("etcd_mvcc_db_total_size_in_bytes"));
                rev = rev.max(get("etcd_debugging_mvcc_current_revision"));
            }
            db_peak = db_peak.max(db);
            let fleet = msgs.total - probe.calls as f64;
            let rate = fleet / t0.elapsed().as_secs_f64().max(1.0);
            println!(
                "t={at}s requests {:.0} ({rate:.1}/s) db {:.0} KiB revision {rev:.0} hosts \
                 without a share {missing}",
                msgs.total,
                db / 1024.0
            );
            samples.push((at, msgs.total, db, rev));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let methods: Vec<String> = by_method
        .iter()
        .filter(|(_, r)| r.total > 0.0)
        .map(|(m, r)| format!("{m} {:.2}/s", r.total / elapsed))
        .collect();
    println!(
        "by method (the test's own {} leader calls included): {methods:?}",
        probe.calls
    );
    let (_, _, db_end, rev_end) = *samples.last().expect("samples");
    println!(
        "SUMMARY hosts {hosts} seconds {elapsed:.0} requests/s {:.1} db_end_kib {:.0} \
         db_peak_kib {:.0} revision {rev_end:.0} first_leader {first} failover {failover:?} \
         largest_excess_bps {excess}",
        (msgs.total - probe.calls as f64) / elapsed,
        db_end / 1024.0,
        db_peak / 1024.0,
    );
    assert_eq!(excess, 0);
}
