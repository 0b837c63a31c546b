//! docs/api.md is the contract of `/metrics`: every family its table lists is emitted, and every
//! emitted family is listed. Scraped through the real API server, on the mock switch (where every
//! family can be made to speak) and on the real switch over in-memory ports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use vqos_api::stats::{PortCounters, PortStatus};
use vqosd::api::Api;
use vqosd::backend::{Backend, MockBackend, PortStats};
use vqosd::client::{Client, Endpoint};
use vqosd::config::Config;
use vqosd::metrics::{self, Exposition};
use vqosd::server::{Server, ServerConfig};

/// The metric names (`vqos_*`, `process_*`) in the first column of the table under
/// `### GET /metrics` in docs/api.md.
fn documented() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let section = doc
        .split("### GET /metrics")
        .nth(1)
        .expect("docs/api.md has a GET /metrics section");
    let section = section.split("\n## ").next().unwrap();
    let mut names = BTreeSet::new();
    let metric_row = |l: &&str| l.starts_with("| `vqos_") || l.starts_with("| `process_");
    for line in section.lines().filter(metric_row) {
        let first = line.split('|').nth(1).unwrap();
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1 {
                names.insert(part.to_string());
            }
        }
    }
    assert!(
        names.len() > 10,
        "too few metrics found in docs/api.md: {names:?}"
    );
    names
}

/// Scrapes `/metrics` through the server: the exposition's text.
fn scrape_text(client: &Client) -> String {
    let r = client.request("GET", "/metrics", None).unwrap();
    assert_eq!(r.status, 200);
    String::from_utf8(r.body).unwrap()
}

/// Scrapes `/metrics` through the server and checks the exposition parses.
fn scrape(client: &Client) -> Exposition {
    metrics::parse(&scrape_text(client)).unwrap()
}

/// Runs `promtool check metrics` (Debian's `prometheus` package; `scripts/deps.sh test`
/// installs it) on `text` and requires it clean: exit 0, nothing said. `false` when promtool is
/// absent (the caller skips, saying so).
fn promtool_check(text: &str) -> bool {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
        Err(e) => panic!("promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics ({}):\n{said}\non:\n{text}",
        out.status
    );
    true
}

/// The families that have at least one sample.
fn emitted(e: &Exposition) -> BTreeSet<String> {
    e.samples.iter().map(|s| s.name.clone()).collect()
}

fn serve(config_text: &str, backend: Arc<dyn Backend>) -> (Server, Arc<Api>, Client) {
    let config = Config::parse(config_text, |_| None).unwrap();
    let api = Arc::new(Api::start(&config, backend).unwrap());
    let server = Server::start(&ServerConfig::from_config(&config), api.clone()).unwrap();
    (server, api, Client::new(Endpoint::Unix(config.socket_path)))
}

/// A daemon on the mock switch where every family has something to say.
fn full_daemon(dir: &Path) -> (Server, Client) {
    let text = format!(
        r#"
capacity = "1Gbit"
state_file = "{d}/state.json"
[api]
socket = "{d}/vqosd.sock"
[uplink]
name = "up0"
[[port]]
name = "vm1"
policy = {{ weight = 2, min = "100Mbit", max = "500Mbit", priority = 1, max_in = "50Mbit", burst = "64KiB" }}
"#,
        d = dir.display()
    );
    let mock = Arc::new(MockBackend::new());
    let (server, api, client) = serve(&text, mock.clone());
    mock.set_port_stats(PortStats {
        name: "vm1".into(),
        counters: PortCounters {
            ecn_marked: 3,
            ecn_not_ect: 1,
            rx_errors: 2,
            mac_learn_refused: 5,
            ..Default::default()
        },
        credit: Some(0),
        status: vhost_status(true, false, serde_json::json!({})).status,
        ..Default::default()
    });
    let vm1 = api.vifs().1[0];
    api.set_controller_limits(&BTreeMap::from([(vm1, 200_000_000)]))
        .unwrap();
    // The etcd agent's families (docs/cluster.md) appear with an agent.
    api.set_cluster_health(vqosd::wire::ClusterHealthView {
        host: "h1".into(),
        state: "connected".into(),
        ..Default::default()
    });
    let share = vqos_cluster::Share {
        min_bps: 150_000_000,
        max_bps: Some(300_000_000),
    };
    api.set_cluster_shares(&BTreeMap::from([("vm1".to_string(), share)]))
        .unwrap();
    // The leaders' families appear on a node that leads a shard (here with one tenant planned).
    api.set_aggregator(leading_one_shard());
    (server, client)
}

/// An aggregator node leading shard 0, whose plan has tenant acme on host h1.
fn leading_one_shard() -> vqos_cluster::rpc::server::AggregatorService {
    use vqos_cluster::aggregator::{Leader, Report};
    use vqos_cluster::rpc::server::{AggregatorService, Monotonic};
    use vqos_cluster::{Declared, HostStatus, TenantLimits, VifStatus};
    let service = AggregatorService::new(Arc::new(Monotonic::default()));
    let mut leader = Leader::new(1, 0, 2_000_000_000, 0);
    let declared = BTreeMap::from([(
        "h1".to_string(),
        BTreeMap::from([(
            "vm1".to_string(),
            Declared {
                tenant: "acme".into(),
                weight: 1,
                max_bps: None,
            },
        )]),
    )]);
    let limits = BTreeMap::from([(
        "acme".to_string(),
        TenantLimits {
            max_bps: Some(1_000_000_000),
            min_bps: 0,
        },
    )]);
    let report = Report {
        host: "h1".into(),
        status: HostStatus {
            vifs: BTreeMap::from([("vm1".to_string(), VifStatus::default())]),
            ..HostStatus::default()
        },
        enforcing: BTreeMap::new(),
    };
    leader.report(report, 0);
    leader.plan(&declared, &limits);
    service.lead(0, leader, u64::MAX);
    service
}

#[test]
fn every_documented_family_is_emitted_and_every_emitted_one_documented() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, client) = full_daemon(dir.path());
    let e = scrape(&client);
    let doc = documented();
    let declared: BTreeSet<String> = e.types.iter().map(|(n, _)| n.clone()).collect();
    let got = emitted(&e);
    let missing: Vec<_> = doc.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "documented but not emitted: {missing:?}"
    );
    let undocumented: Vec<_> = declared.union(&got).filter(|n| !doc.contains(*n)).collect();
    assert!(
        undocumented.is_empty(),
        "emitted but not in docs/api.md: {undocumented:?}"
    );
    // The data plane's counters arrive under their names.
    let value = |name: &str| {
        e.samples
            .iter()
            .find(|s| s.name == name && s.labels[0].1 == "vm1")
            .map(|s| s.value)
    };
    assert_eq!(value("vqos_port_ecn_marked_total"), Some(3.0));
    assert_eq!(value("vqos_port_ecn_not_ect_total"), Some(1.0));
    assert_eq!(value("vqos_port_rx_errors_total"), Some(2.0));
    assert_eq!(value("vqos_port_mac_learn_refused_total"), Some(5.0));
    assert_eq!(value("vqos_controller_limit_bps"), Some(200e6));
    assert_eq!(value("vqos_policy_max_in_bps"), Some(50e6));
    assert_eq!(value("vqos_policy_burst_bytes"), Some(65_536.0));
    // Every drop reason, `storm` included, is a series from the start.
    let reasons: BTreeSet<&str> = e
        .samples
        .iter()
        .filter(|s| s.name == "vqos_port_drops_total" && s.labels[0].1 == "vm1")
        .map(|s| s.labels[1].1.as_str())
        .collect();
    let all = vqos_api::stats::DropReason::ALL.map(|r| r.name());
    assert_eq!(reasons, all.into_iter().collect());
}

#[cfg(feature = "switch")]
#[test]
fn the_real_switch_emits_only_documented_families_and_all_its_counters() {
    use vqos_dataplane::{MemPort, PortSpec, SwitchConfig, SwitchHandle};
    use vqos_sched::VifPolicy;
    use vqosd::switch::SwitchBackend;

    let dir = tempfile::tempdir().unwrap();
    let (uplink, _up) = MemPort::pair("up0", 64);
    let mut sc = SwitchConfig::new(PortSpec::custom(Box::new(uplink)));
    sc.capacity_bps = Some(1_000_000_000);
    let interval_ns = sc.stats_interval_ns;
    let backend = SwitchBackend::from_handle(SwitchHandle::start(sc).unwrap(), interval_ns);
    let (vm1, _p1) = MemPort::pair("vm1", 64);
    backend
        .handle()
        .add_port(PortSpec::custom(Box::new(vm1)), VifPolicy::default())
        .unwrap();
    let backend = Arc::new(backend);
    // No ports in the config: the in-memory ports live in the switch only.
    let text = format!(
        "capacity = \"1Gbit\"\nstate_file = \"{d}/state.json\"\n[api]\nsocket = \"{d}/vqosd.sock\"\n",
        d = dir.path().display()
    );
    let (_server, _api, client) = serve(&text, backend.clone());
    let text = scrape_text(&client);
    backend.stop();
    if !promtool_check(&text) {
        eprintln!("SKIP promtool part: promtool not found (Debian package prometheus)");
    }
    let e = metrics::parse(&text).unwrap();
    let doc = documented();
    let got = emitted(&e);
    let undocumented: Vec<_> = got.iter().filter(|n| !doc.contains(*n)).collect();
    assert!(
        undocumented.is_empty(),
        "emitted but not in docs/api.md: {undocumented:?}"
    );
    for family in metrics::FAMILIES.iter().map(|f| f.0) {
        // Families of vifs with a policy, or of vhost-user ports (these are in-memory ones).
        let needs_policy = family.starts_with("vqos_policy_")
            || family.starts_with("vqos_controller_")
            || family == "vqos_ecn_probability"
            || family.starts_with("vqos_vhost_user_");
        if !needs_policy {
            assert!(
                got.contains(family),
                "{family} not emitted by the real switch"
            );
        }
    }
    let unit = e
        .samples
        .iter()
        .find(|s| s.name == "vqos_loop_busy_cycles_total")
        .and_then(|s| s.labels.iter().find(|(k, _)| k == "unit"))
        .map(|(_, v)| v.clone());
    assert!(matches!(unit.as_deref(), Some("tsc" | "ns")), "{unit:?}");
}

#[test]
fn promtool_finds_nothing_to_lint_in_a_scrape_of_every_family() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, client) = full_daemon(dir.path());
    let text = scrape_text(&client);
    if !promtool_check(&text) {
        eprintln!("SKIP: promtool not found (Debian package prometheus; scripts/deps.sh test)");
    }
}

#[test]
fn the_metrics_listener_serves_get_metrics_only_and_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "state_file = \"{d}/state.json\"\n[api]\nsocket = \"{d}/vqosd.sock\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n",
        d = dir.path().display()
    );
    let config = Config::parse(&text, |_| None).unwrap();
    let api = Arc::new(Api::start(&config, Arc::new(MockBackend::new())).unwrap());
    let server = Server::start(&ServerConfig::from_config(&config), api).unwrap();
    let addr = server.metrics_addr().expect("metrics listener bound");
    let client = Client::new(Endpoint::Tcp {
        addr: addr.to_string(),
        token: None,
    });
    let e = scrape(&client);
    assert!(emitted(&e).contains("vqos_info"));
    let status = |method: &str, path: &str| client.request(method, path, None).unwrap().status;
    assert_eq!(status("GET", "/v1/ports"), 404);
    assert_eq!(status("GET", "/v1/health"), 404);
    assert_eq!(status("DELETE", "/metrics"), 405);
    assert_eq!(status("POST", "/metrics"), 405);
}

#[test]
fn the_grafana_dashboard_uses_only_emitted_families() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/grafana/vqos.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let families: BTreeSet<&str> = metrics::FAMILIES.iter().map(|f| f.0).collect();
    let mut used = BTreeSet::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("vqos_") {
                    assert!(families.contains(word), "dashboard uses unknown {word}");
                    used.insert(word.to_string());
                }
            }
        }
    }
    assert!(used.len() > 5);
    // The operator sees which guests are connected (and which are quarantined).
    assert!(used.contains("vqos_vhost_user_connected"), "{used:?}");
    assert!(used.contains("vqos_vhost_user_quarantined"), "{used:?}");
}

/// The value of the sample of `name` whose labels include every pair of `labels`.
fn sample(e: &Exposition, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    e.samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
        })
        .map(|s| s.value)
}

/// A daemon on the mock switch with one vif, `vm1`, without a cluster.
fn small_daemon(dir: &Path) -> (Server, Arc<MockBackend>, Client) {
    let text = format!(
        "state_file = \"{d}/state.json\"\n[api]\nsocket = \"{d}/vqosd.sock\"\n\
         [uplink]\nname = \"up0\"\n[[port]]\nname = \"vm1\"\n",
        d = dir.display()
    );
    let mock = Arc::new(MockBackend::new());
    let (server, _api, client) = serve(&text, mock.clone());
    (server, mock, client)
}

#[test]
fn a_vif_without_a_bucket_has_no_credit_rather_than_a_sentinel() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mock, client) = small_daemon(dir.path());
    // A vqos vif without a cap: no bucket, no credit.
    mock.set_port_stats(PortStats {
        name: "vm1".into(),
        credit: None,
        ..Default::default()
    });
    let e = scrape(&client);
    assert_eq!(sample(&e, "vqos_port_credit", &[("port", "vm1")]), None);
    // Nor in /v1/stats: `credit` is null there, not 9223372036854775807.
    let r = client.request("GET", "/v1/stats", None).unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let vm1 = stats["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "vm1")
        .unwrap();
    assert!(vm1["credit"].is_null(), "{vm1}");
    assert_eq!(
        sample(&e, "vqos_port_throttled", &[("port", "vm1")]),
        Some(0.0)
    );
    mock.set_port_stats(PortStats {
        name: "vm1".into(),
        credit: Some(-1_500),
        ..Default::default()
    });
    let e = scrape(&client);
    assert_eq!(
        sample(&e, "vqos_port_credit", &[("port", "vm1")]),
        Some(-1_500.0)
    );
}

#[test]
fn health_is_a_metric_an_operator_can_alert_on() {
    use vqosd::backend::LoopHealth;
    let dir = tempfile::tempdir().unwrap();
    let (_server, mock, client) = small_daemon(dir.path());
    let e = scrape(&client);
    let status = |e: &Exposition, s: &str| sample(e, "vqos_health_status", &[("status", s)]);
    assert_eq!(status(&e, "ok"), Some(1.0));
    assert_eq!(status(&e, "degraded"), Some(0.0));
    assert_eq!(status(&e, "unhealthy"), Some(0.0));
    assert_eq!(sample(&e, "vqos_forwarding_running", &[]), Some(1.0));
    // A hung loop: alive, but silent for 7.5 s, beyond the 5 s limit of a 25 ms interval.
    mock.set_loop_health(LoopHealth {
        running: true,
        stats_age_ns: 7_500_000_000,
        stats_interval_ns: 25_000_000,
    });
    let e = scrape(&client);
    assert_eq!(status(&e, "ok"), Some(0.0));
    assert_eq!(status(&e, "unhealthy"), Some(1.0));
    assert_eq!(
        sample(&e, "vqos_forwarding_stats_age_seconds", &[]),
        Some(7.5)
    );
    assert_eq!(
        sample(&e, "vqos_forwarding_stale_after_seconds", &[]),
        Some(5.0)
    );
    // A loop that has stopped.
    mock.set_loop_health(LoopHealth {
        running: false,
        stats_age_ns: 0,
        stats_interval_ns: 25_000_000,
    });
    let e = scrape(&client);
    assert_eq!(sample(&e, "vqos_forwarding_running", &[]), Some(0.0));
    assert_eq!(status(&e, "unhealthy"), Some(1.0));
    // No cluster configured: no cluster family claims a disconnected agent.
    assert!(!e.samples.iter().any(|s| s.name == "vqos_cluster_connected"));
}

/// What a vhost-user port's stats carry (`vhost_user`: the data plane's `VhostUserStatus`).
fn vhost_status(connected: bool, quarantined: bool, counters: serde_json::Value) -> PortStats {
    PortStats {
        name: "vm1".into(),
        status: status_of(serde_json::json!({"vhost_user": {
            "name": "vm1",
            "mode": "server",
            "socket": "/run/vqos/vm1.sock",
            "connected": connected,
            "quarantined": quarantined,
            "negotiated_features": 0,
            "feature_names": [],
            "rx_frames": 0, "rx_bytes": 0, "tx_frames": 0, "tx_bytes": 0,
            "last_error": null,
            "queues": 2,
            "pair_frames": [[2_001, 2_002], [2_003, 2_004]],
            "counters": counters,
        }})),
        ..Default::default()
    }
}

/// A port's status as JSON (`{"vhost_user": {...}}`) in the API's form.
fn status_of(v: serde_json::Value) -> Option<PortStatus> {
    Some(serde_json::from_value(v).unwrap())
}

#[test]
fn a_vhost_user_port_says_whether_its_guest_is_connected_and_how_it_misbehaves() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mock, client) = small_daemon(dir.path());
    let e = scrape(&client);
    // A TAP (no vhost_user status) has no vhost-user samples.
    assert!(!e
        .samples
        .iter()
        .any(|s| s.name.starts_with("vqos_vhost_user_")));
    mock.set_port_stats(vhost_status(
        true,
        false,
        serde_json::json!({"sessions": 3, "disconnects": 2, "chain_loop": 4,
            "guest_rx_no_buffers_frames": 9}),
    ));
    let e = scrape(&client);
    let vm1 = [("port", "vm1")];
    assert_eq!(sample(&e, "vqos_vhost_user_connected", &vm1), Some(1.0));
    assert_eq!(sample(&e, "vqos_vhost_user_quarantined", &vm1), Some(0.0));
    assert_eq!(
        sample(&e, "vqos_vhost_user_sessions_total", &vm1),
        Some(3.0)
    );
    assert_eq!(
        sample(&e, "vqos_vhost_user_disconnects_total", &vm1),
        Some(2.0)
    );
    let error = [("port", "vm1"), ("error", "chain_loop")];
    assert_eq!(
        sample(&e, "vqos_vhost_user_guest_errors_total", &error),
        Some(4.0)
    );
    let lost = [("port", "vm1"), ("reason", "no_buffers")];
    assert_eq!(
        sample(&e, "vqos_vhost_user_guest_rx_dropped_frames_total", &lost),
        Some(9.0)
    );
    // Counters the status does not carry are 0 (a series from the start), not absent.
    let lost = [("port", "vm1"), ("reason", "disconnected")];
    assert_eq!(
        sample(&e, "vqos_vhost_user_guest_rx_dropped_frames_total", &lost),
        Some(0.0)
    );
    mock.set_port_stats(vhost_status(false, true, serde_json::json!({})));
    let e = scrape(&client);
    assert_eq!(sample(&e, "vqos_vhost_user_connected", &vm1), Some(0.0));
    assert_eq!(sample(&e, "vqos_vhost_user_quarantined", &vm1), Some(1.0));
    let pair = |pair: &'static str, direction: &'static str| {
        let labels = [("port", "vm1"), ("pair", pair), ("direction", direction)];
        sample(&e, "vqos_vhost_user_queue_frames_total", &labels)
    };
    assert_eq!(
        [
            pair("0", "from_guest"),
            pair("0", "to_guest"),
            pair("1", "from_guest"),
            pair("1", "to_guest")
        ],
        [Some(2_001.0), Some(2_002.0), Some(2_003.0), Some(2_004.0)]
    );
    // The AF_PACKET uplink's status: no vhost-user port.
    mock.set_port_stats(PortStats {
        name: "vm1".into(),
        status: status_of(
            serde_json::json!({"af_packet": {"ifindex": 2, "vnet_hdr_bytes": 12,
            "qdisc_bypass": true, "kernel_drops": 0, "skipped_host": 0, "skipped_outgoing": 0, "readers": 1}}),
        ),
        ..Default::default()
    });
    let e = scrape(&client);
    assert!(!e
        .samples
        .iter()
        .any(|s| s.name.starts_with("vqos_vhost_user_")));
}

/// Every counter of `VhostUserCounters` (what the data plane fills) reaches `/metrics`: each
/// is given a distinct value, found by the names the type serialises, and each value must
/// appear.
#[test]
fn every_vhost_user_counter_is_exported() {
    use vqos_api::port::VhostUserRole;
    use vqos_api::stats::{VhostUserCounters, VhostUserStatus};
    let mut counters = serde_json::to_value(VhostUserCounters::default()).unwrap();
    let map = counters.as_object_mut().unwrap();
    let keys: Vec<String> = map.keys().cloned().collect();
    for (i, v) in map.values_mut().enumerate() {
        *v = serde_json::json!(1_000 + i);
    }
    let counters: VhostUserCounters = serde_json::from_value(counters).unwrap();
    let status = VhostUserStatus {
        name: "vm1".into(),
        mode: VhostUserRole::Client,
        socket: "/run/vqos/vm1.sock".into(),
        connected: true,
        quarantined: true,
        negotiated_features: 0,
        feature_names: Vec::new(),
        rx_frames: 0,
        rx_bytes: 0,
        tx_frames: 0,
        tx_bytes: 0,
        last_error: Some("bad ring".into()),
        queues: 2,
        pair_frames: vec![[2_001, 2_002], [2_003, 2_004]],
        counters,
    };
    let dir = tempfile::tempdir().unwrap();
    let (_server, mock, client) = small_daemon(dir.path());
    mock.set_port_stats(PortStats {
        name: "vm1".into(),
        status: Some(PortStatus::VhostUser(Box::new(status))),
        ..Default::default()
    });
    let e = scrape(&client);
    let vm1 = [("port", "vm1")];
    assert_eq!(sample(&e, "vqos_vhost_user_connected", &vm1), Some(1.0));
    assert_eq!(sample(&e, "vqos_vhost_user_quarantined", &vm1), Some(1.0));
    let seen: BTreeSet<u64> = e
        .samples
        .iter()
        .filter(|s| s.name.starts_with("vqos_vhost_user_") && s.labels[0].1 == "vm1")
        .map(|s| s.value as u64)
        .collect();
    let missing: Vec<&String> = (0..keys.len())
        .filter(|i| !seen.contains(&(1_000 + *i as u64)))
        .map(|i| &keys[i])
        .collect();
    assert!(missing.is_empty(), "counters not exported: {missing:?}");
}

#[test]
fn the_standard_process_metrics_come_from_proc_self() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, _mock, client) = small_daemon(dir.path());
    let e = scrape(&client);
    let value = |n: &str| sample(&e, n, &[]).unwrap_or_else(|| panic!("no {n}"));
    let types: BTreeMap<&str, &str> = e
        .types
        .iter()
        .map(|(n, k)| (n.as_str(), k.as_str()))
        .collect();
    assert_eq!(types.get("process_cpu_seconds_total"), Some(&"counter"));
    assert!(value("process_cpu_seconds_total") >= 0.0);
    let rss = value("process_resident_memory_bytes");
    assert!(rss > 1_000_000.0, "resident {rss}");
    assert!(value("process_virtual_memory_bytes") >= rss);
    let (open, max) = (value("process_open_fds"), value("process_max_fds"));
    assert!(open >= 3.0 && open <= max, "open {open} max {max}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let start = value("process_start_time_seconds");
    // The test process started a moment ago (the clock tick is 10 ms; allow a slow machine).
    assert!(
        start <= now + 1.0 && start > now - 600.0,
        "start {start} now {now}"
    );
    for (name, kind) in [
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        assert_eq!(types.get(name), Some(&kind), "{name}");
    }
}
