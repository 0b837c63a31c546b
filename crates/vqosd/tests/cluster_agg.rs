//! The agent on the aggregators (`[cluster.aggregators]`, docs/cluster.md): two mock-switch
//! vqosd daemons on one etcd, both candidates for 2 shards on loopback. Tenant acme (max
//! 100 Mbit/s) has vm1 on each host. The shares come from the shards' leader: each host
//! enforces one, and the two add up to at most the max. The daemon that leads shard 0 is
//! killed (SIGKILL: no resign); the other one leads both shards in the next term, and its vif
//! is granted by it again, and its etcd session lasted the whole run. The statuses are written
//! every 30 s. Skipped with a message when `etcd` is not installed.

mod common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{skip, LIMIT};
use common::Daemon;
use vqos_cluster::election::leader_of;
use vqos_cluster::EtcdSettings;
use vqos_testkit::{poll, Etcd};

const MAX: u64 = 100_000_000;

/// A mock-switch vqosd as `host` with port vm1, an agent of `etcd` on the aggregators, serving
/// on a port of loopback the kernel gives.
fn daemon(dir: &Path, host: &str, etcd: &Etcd) -> Daemon {
    common::cluster::mock_daemon(
        dir,
        host,
        etcd,
        "period = \"200ms\"\nlease_ttl = \"2s\"\ntimeout = \"2s\"\n",
        "[cluster.aggregators]\nshards = 2\nlisten = \"127.0.0.1:0\"\n",
    )
}

/// The max vqosd enforces on vm1, from its own API.
fn enforced_max(d: &Daemon) -> Option<u64> {
    d.get("/v1/policies/vm1")["enforced"]["max_bps"].as_u64()
}

/// The endpoints leading shards 0 and 1, and the term of shard 0.
fn leaders(etcd: &Etcd) -> (Vec<Option<String>>, Option<u32>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let settings = EtcdSettings::from_list(&etcd.url()).unwrap();
        let Ok(mut c) = settings.connect(Duration::from_secs(2)).await else {
            return (vec![None, None], None);
        };
        let mut out = Vec::new();
        for s in 0..2 {
            let l = leader_of(&mut c, s, Duration::from_secs(2)).await;
            out.push(l.ok().flatten().map(|(e, _)| e));
        }
        let term = etcd.ctl(&["get", "/vqos/v1/aggregators/0/term", "--print-value-only"]);
        (out, term.trim().parse().ok())
    })
}

/// The port a daemon's node serves on, from its log line.
fn served_on(d: &Daemon) -> Option<String> {
    let log = d.log();
    let line = log
        .lines()
        .find(|l| l.contains("aggregator shard(s), serving on "))?;
    let addr = line.rsplit("serving on ").next()?.trim().to_string();
    Some(format!("http://{addr}"))
}

#[test]
fn shares_come_from_the_elected_leader_and_move_when_it_dies() {
    if skip("shares_come_from_the_elected_leader_and_move_when_it_dies") {
        return;
    }
    let etcd = Etcd::start(0);
    let dir = tempfile::tempdir().unwrap();
    etcd.ctl(&["put", "/vqos/v1/tenants/acme", r#"{"max":"100Mbit"}"#]);
    for h in ["h1", "h2"] {
        let key = format!("/vqos/v1/hosts/{h}/vifs/vm1");
        etcd.ctl(&["put", &key, r#"{"tenant":"acme"}"#]);
    }
    let mut daemons = [
        daemon(dir.path(), "h1", &etcd),
        daemon(dir.path(), "h2", &etcd),
    ];
    let endpoints: Vec<String> = daemons
        .iter()
        .map(|d| poll(LIMIT, || served_on(d)).unwrap_or_else(|| panic!("{}", d.log())))
        .collect();
    // Both shards led, each vif holding a share, the two within the max.
    let (led, term) = poll(LIMIT, || {
        let (l, t) = leaders(&etcd);
        l.iter().all(Option::is_some).then_some((l, t))
    })
    .expect("both shards led");
    assert_eq!(term, Some(1), "{led:?}");
    let held =
        |ds: &[&Daemon]| -> Option<u64> { ds.iter().map(|d| enforced_max(d)).sum::<Option<u64>>() };
    let both = poll(LIMIT, || held(&[&daemons[0], &daemons[1]])).unwrap_or_else(|| {
        panic!(
            "shares never held:\n{}\n{}",
            daemons[0].log(),
            daemons[1].log()
        )
    });
    assert!(both <= MAX, "{both} held under a max of {MAX}");
    // The status, the operators' view only here, is written every 30 s (150 periods of
    // 200 ms), and says so.
    let st = common::cluster::status(&etcd, "h1").expect("h1's status");
    assert_eq!(st["period_ms"], 30_000, "{st}");
    // The leader of shard 0 (acme's shard or not, it is a leader) is killed.
    let gone = endpoints
        .iter()
        .position(|e| Some(e) == led[0].as_ref())
        .unwrap_or_else(|| panic!("{led:?} is none of {endpoints:?}"));
    let left = 1 - gone;
    daemons[gone].kill9();
    let want = vec![Some(endpoints[left].clone()); 2];
    let after = poll(Duration::from_secs(30), || {
        let (l, t) = leaders(&etcd);
        (l == want).then_some(t)
    })
    .unwrap_or_else(|| {
        panic!(
            "{} never led both:\n{}",
            endpoints[left],
            daemons[left].log()
        )
    });
    assert_eq!(after, Some(2));
    // Its vif is granted again, by the new term, within the max; and its health says no
    // leader is out of reach.
    let survivor = &daemons[left];
    poll(LIMIT, || {
        let p = survivor.get("/v1/health")["cluster"]["problems"].to_string();
        (!p.contains("shard") && enforced_max(survivor).is_some()).then_some(())
    })
    .unwrap_or_else(|| panic!("never settled:\n{}", survivor.log()));
    assert!(enforced_max(survivor).unwrap() <= MAX);
    // Its etcd session lasted all along: one sync, though the run took longer than etcd's
    // least ping interval (5 s; an agent that pinged every second was cut off every 4 s and
    // read everything again each time).
    let uptime = |d: &Daemon| d.get("/v1/health")["uptime_s"].as_u64().unwrap_or(0);
    poll(Duration::from_secs(30), || {
        (uptime(survivor) >= 12).then_some(())
    });
    let syncs = &survivor.get("/v1/health")["cluster"]["syncs"];
    assert_eq!(syncs, 1, "{}", survivor.log());
}
