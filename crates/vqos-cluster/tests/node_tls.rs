//! The aggregators over mutual TLS (`[cluster.aggregators]` ca_file, cert_file, key_file), on
//! a real etcd and real TLS on loopback with certificates of a CA made for the test: a node
//! that serves over TLS advertises `https://`; hosts with their own certificates are granted
//! their tenant's shares; a host reporting with another host's certificate, and a host without
//! TLS settings, get nothing and say why; no tenant's vifs hold more than its max.
//! Skipped with a message when `etcd` or `openssl` is not installed.

use std::time::{Duration, Instant};

use tokio::sync::watch;
use vqos_cluster::election::leader_of;
use vqos_cluster::node::host::HostSide;
use vqos_cluster::node::{follow, start, NodeSpec, SharedDesired};
use vqos_cluster::rpc::tls::RpcTls;
use vqos_cluster::{EtcdSettings, HostStatus, VifStatus};
use vqos_testkit::{Etcd, TestCa};

mod common;
use common::timing;

const MAX: u64 = 1_000_000_000;

#[test]
fn hosts_reach_a_tls_leader_only_with_their_own_certificates() {
    if let Some(why) = vqos_testkit::etcd_missing().or_else(vqos_testkit::openssl_missing) {
        println!("SKIP node over TLS: {why}");
        return;
    }
    let etcd = Etcd::start(2);
    let settings = EtcdSettings::from_list(&etcd.url()).unwrap();
    // Removed on drop, also when the test fails.
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let tls = |name: &str| {
        let (cert_file, key_file) = ca.host(name);
        RpcTls {
            ca_file: ca.ca_file(),
            cert_file,
            key_file,
        }
    };
    let rt = common::runtime(2);
    let vifs: Vec<_> = ["h0", "h1", "h2"]
        .map(|h| (h.to_string(), "vm0".to_string(), "acme".to_string()))
        .into();
    let mut c = common::declare(&rt, &settings, &["acme".to_string()], &vifs);
    let (stop, stopped) = watch::channel(false);
    let spec = NodeSpec {
        shards: 1,
        listen: "127.0.0.1:0".parse().unwrap(),
        endpoint: None,
        timing: timing(),
        tls: Some(tls("n1")),
    };
    let node = rt
        .block_on(start(settings.clone(), spec, stopped.clone()))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let endpoint = loop {
        let l = rt.block_on(leader_of(&mut c, 0, Duration::from_secs(2)));
        if let Ok(Some((e, _))) = l {
            break e;
        }
        assert!(Instant::now() < deadline, "the node never led shard 0");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(endpoint, format!("https://{}", node.local));

    let desired = SharedDesired::default();
    rt.spawn(follow(settings.clone(), timing(), desired.clone(), stopped));
    let side =
        |host: &str, tls: Option<RpcTls>| HostSide::new(host, 1, settings.clone()).with_tls(tls);
    // h0 and h1 with their own certificates; "h2" with h0's; h2 again without TLS settings.
    let mut hosts = [
        side("h0", Some(tls("h0"))),
        side("h1", Some(tls("h1"))),
        side("h2", Some(tls("h0"))),
    ];
    let mut plain = side("h2", None);
    let status = HostStatus {
        vifs: [("vm0".to_string(), VifStatus::default())].into(),
        ..HostStatus::default()
    };
    let t = timing();
    let granted = |h: &HostSide| h.holder.get("acme").is_some_and(|x| x.epoch >> 32 >= 1);
    let mut errors = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(granted(&hosts[0]) && granted(&hosts[1])) {
        assert!(Instant::now() < deadline, "never granted: {errors:?}");
        let snapshot = desired.lock().state.clone();
        errors.clear();
        for h in hosts.iter_mut().chain([&mut plain]) {
            let failed = rt.block_on(h.period(&snapshot, &status, t.period / 2, t.period));
            errors.push((
                h.host.clone(),
                failed.iter().map(|e| e.to_string()).collect(),
            ));
        }
        // `plain` is host h2 again (its other try), so it is not counted twice.
        let held: u64 = hosts
            .iter()
            .filter_map(|h| h.holder.get("acme"))
            .flat_map(|x| x.shares.values().map(|s| s.max_bps.unwrap_or(u64::MAX)))
            .fold(0, u64::saturating_add);
        assert!(held <= MAX, "{held} held in all under a max of {MAX}");
        std::thread::sleep(t.period);
    }
    // The impostor and the plain host were never granted, and were told why.
    for (h, why) in [
        (&hosts[2], "certificate is host 'h0's"),
        (&plain, "needs cluster.aggregators.ca_file"),
    ] {
        assert!(!granted(h), "{} was granted", h.host);
        let said: Vec<String> = errors
            .iter()
            .filter(|(n, _)| *n == h.host)
            .flat_map(|(_, e): &(String, Vec<String>)| e.clone())
            .collect();
        assert!(said.iter().any(|e| e.contains(why)), "{}: {said:?}", h.host);
    }
    let _ = stop.send(true);
    rt.block_on(node.stopped(Duration::from_secs(5)));
}
