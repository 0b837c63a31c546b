//! The control API end to end: a real unix socket (and TCP port) in a temp dir unique to each
//! test, the mock switch behind it, and the crate's own client in front.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use vqos_api::stats::{DropCounters, DropReason, PortCounters};
use vqosd::api::Api;
use vqosd::backend::{LoopHealth, MockBackend, MockCall, PortStats};
use vqosd::client::{Client, ClientError, Endpoint};
use vqosd::config::Config;
use vqosd::metrics::{self, Exposition};
use vqosd::server::{Server, ServerConfig, ServerError};
use vqosd::wire::{PolicyView, PortView, StatsView};

const TOKEN: &str = "test-token-0123456789";

/// A daemon on the mock switch, in its own temp dir.
struct Daemon {
    /// The API behind the server (for what the etcd agent and the controllers call).
    api: Arc<Api>,
    server: Server,
    mock: Arc<MockBackend>,
    client: Client,
    socket: PathBuf,
    state_file: PathBuf,
}

fn config_text(dir: &Path, extra_api: &str) -> String {
    format!(
        r#"
capacity = "1Gbit"
state_file = "{dir}/state/state.json"

[api]
socket = "{dir}/run/vqosd.sock"
{extra_api}

[uplink]
name = "up0"

[[port]]
name = "vm1"

[[port]]
name = "vm2"
create = false
macs = ["02:00:00:00:00:02"]
policy = {{ weight = 2, min = "400Mbit", max = "500Mbit", priority = 3 }}
"#,
        dir = dir.display()
    )
}

fn start_with(text: &str) -> Daemon {
    let config = Config::parse(text, |k| {
        (k == "VQOSD_TEST_TOKEN").then(|| TOKEN.to_string())
    })
    .expect("config");
    let mock = Arc::new(MockBackend::new());
    let api = Arc::new(Api::start(&config, mock.clone()).expect("api"));
    let server = Server::start(&ServerConfig::from_config(&config), api.clone()).expect("server");
    Daemon {
        api,
        client: Client::new(Endpoint::Unix(config.socket_path.clone())),
        socket: config.socket_path.clone(),
        state_file: config.state_file.clone(),
        server,
        mock,
    }
}

fn start(dir: &Path) -> Daemon {
    start_with(&config_text(dir, ""))
}

impl Daemon {
    fn get(&self, path: &str) -> Value {
        self.client.call("GET", path, None).expect(path)
    }

    /// Status and body (JSON, or Null) of a request.
    fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let r = self.client.request(method, path, body.as_ref()).unwrap();
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        )
    }

    /// Everything an invalid request must leave unchanged.
    fn snapshot(&self) -> (Value, Value, Vec<u8>, usize) {
        (
            self.get("/v1/ports"),
            self.get("/v1/policies"),
            fs::read(&self.state_file).unwrap(),
            self.mock.ports().len(),
        )
    }
}

#[test]
fn health_ports_and_policies() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let h = d.get("/v1/health");
    assert_eq!(h["status"], "ok");
    assert_eq!(h["engine"], "vqos");
    assert_eq!(h["capacity"], "1Gbit");
    assert_eq!(h["ports"], 2);

    let ports: Vec<PortView> = serde_json::from_value(d.get("/v1/ports")).unwrap();
    assert_eq!(ports.len(), 2);
    assert_eq!(ports[1].port.name, "vm2");
    assert!(!ports[1].port.create);
    assert_eq!(ports[1].port.macs[0].to_string(), "02:00:00:00:00:02");
    assert_eq!(ports[1].port.policy.max, "500Mbit");
    let one: PortView = serde_json::from_value(d.get("/v1/ports/vm2")).unwrap();
    assert_eq!(one, ports[1]);

    let p: PolicyView = serde_json::from_value(d.get("/v1/policies/vm2")).unwrap();
    assert_eq!(
        (p.weight, p.min_bps, p.max_bps, p.priority),
        (2, 400_000_000, Some(500_000_000), 3)
    );
    assert_eq!((p.min.as_str(), p.max.as_str()), ("400Mbit", "500Mbit"));
}

#[test]
fn health_reflects_the_forwarding_loop() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let (status, h) = d.send("GET", "/v1/health", None);
    assert_eq!((status, &h["status"]), (200, &json!("ok")));
    assert_eq!(h["loop"]["running"], true);
    assert!(h.get("error").is_none(), "{h}");
    // Hung: alive but silent for longer than 200 stats intervals.
    d.mock.set_loop_health(LoopHealth {
        running: true,
        stats_age_ns: 7_000_000_000,
        stats_interval_ns: 25_000_000,
    });
    let (status, h) = d.send("GET", "/v1/health", None);
    assert_eq!((status, &h["status"]), (503, &json!("unhealthy")));
    assert_eq!(
        h["error"],
        "The forwarding loop has not reported for 7000 ms (limit 5000 ms)"
    );
    // Dead: the thread exited. The client reports the reason as the error.
    d.mock.set_loop_health(LoopHealth {
        running: false,
        ..LoopHealth::alive(25_000_000)
    });
    let e = d
        .client
        .call::<Value>("GET", "/v1/health", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("The forwarding loop has stopped"), "{e}");
    // The rest of the API still answers (an operator can look before the restart).
    assert_eq!(d.get("/v1/ports").as_array().unwrap().len(), 2);
}

#[test]
fn put_policy_is_a_partial_update_and_reaches_switch_and_disk() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let (status, body) = d.send("PUT", "/v1/policies/vm2", Some(json!({"weight": 5})));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["weight"], 5);
    assert_eq!(body["min"], "400Mbit");
    assert_eq!(body["max"], "500Mbit");
    assert_eq!(body["priority"], 3);

    // Numbers are bit/s; null or "unlimited" removes the max.
    let (status, body) = d.send(
        "PUT",
        "/v1/policies/vm2",
        Some(json!({"min": 100000000, "max": null, "priority": 0})),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["min"].as_str(), body["max"].as_str()),
        (Some("100Mbit"), Some("unlimited"))
    );
    let (status, body) = d.send("PUT", "/v1/policies/vm1", Some(json!({"max": "150Mbit"})));
    assert_eq!(status, 200, "{body}");

    let switch: BTreeMap<String, _> = d
        .mock
        .ports()
        .into_iter()
        .map(|(p, pol)| (p.config.name, pol))
        .collect();
    assert_eq!(switch["vm2"].weight, 5);
    assert_eq!(switch["vm2"].min_bps, 100_000_000);
    assert_eq!(switch["vm2"].max_bps, None);
    assert_eq!(switch["vm2"].priority, 0);
    assert_eq!(switch["vm1"].max_bps, Some(150_000_000));

    let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
    assert_eq!(saved["ports"][1]["policy"]["weight"], 5);
    assert_eq!(saved["ports"][0]["policy"]["max_bps"], 150_000_000);
}

#[test]
fn add_and_remove_ports() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let (status, body) = d.send(
        "POST",
        "/v1/ports",
        Some(json!({"name": "vm3", "create": false, "policy": {"weight": 3, "max": "200Mbit"}, "macs": ["02:00:00:00:00:03"]})),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["name"], "vm3");
    assert_eq!(body["policy"]["max"], "200Mbit");
    assert_eq!(body["policy"]["weight"], 3);
    let (p, pol) = d.mock.ports().pop().unwrap();
    assert_eq!(
        (p.config.name.as_str(), p.config.create, pol.weight),
        ("vm3", false, 3)
    );
    assert_eq!(d.get("/v1/ports").as_array().unwrap().len(), 3);

    let (status, body) = d.send("DELETE", "/v1/ports/vm1", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["removed"], "vm1");
    let names = d.mock.port_names();
    assert_eq!(names, ["vm2", "vm3"]);
    let (status, _) = d.send("GET", "/v1/policies/vm1", None);
    assert_eq!(status, 404);
    let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
    assert_eq!(saved["ports"].as_array().unwrap().len(), 2);
}

#[test]
fn port_security_is_on_by_default_and_a_configured_mac_has_one_owner() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let (status, body) = d.send(
        "POST",
        "/v1/ports",
        Some(json!({"name": "vm3", "macs": ["02:00:00:00:00:03"]})),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["port_security"], true);
    // The same address on a second port: refused before the switch is touched.
    let calls = d.mock.calls().len();
    let (status, body) = d.send(
        "POST",
        "/v1/ports",
        Some(json!({"name": "vm4", "macs": ["02:00:00:00:00:03"]})),
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        body["error"],
        "MAC address 02:00:00:00:00:03 is in use by port 'vm3'"
    );
    assert_eq!(d.mock.calls().len(), calls);
    // The opt-out reaches the switch, the listing and the state file.
    let (status, body) = d.send(
        "POST",
        "/v1/ports",
        Some(json!({"name": "rtr", "port_security": false})),
    );
    assert_eq!(status, 201, "{body}");
    let (p, _) = d.mock.ports().pop().unwrap();
    assert!(!p.config.port_security);
    assert_eq!(d.get("/v1/ports/rtr")["port_security"], false);
    let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
    assert_eq!(saved["ports"][3]["port_security"], false);
}

#[test]
fn configured_ip_addresses_and_services_have_one_owner_and_need_port_security() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let body = json!({"name": "dhcp", "ips": ["10.0.0.5", "fd00::5"], "serves": ["dhcp-server"]});
    let (status, body) = d.send("POST", "/v1/ports", Some(body));
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["ips"], json!(["10.0.0.5", "fd00::5"]));
    assert_eq!(body["serves"], json!(["dhcp-server"]));
    let (p, _) = d.mock.ports().pop().unwrap();
    assert_eq!(p.config.ips.len(), 2);
    let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
    let last = saved["ports"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["serves"], json!(["dhcp-server"]));
    let calls = d.mock.calls().len();
    let cases = [
        (
            json!({"name": "vm9", "ips": ["fd00::5"]}),
            409,
            "IP address fd00::5 is in use by port 'dhcp'",
        ),
        (
            json!({"name": "vm9", "ips": ["10.0.0.9"], "port_security": false}),
            422,
            "Port 'vm9': ips and serves need port_security (without it no address is checked)",
        ),
        (
            json!({"name": "vm9", "ips": ["224.0.0.1"]}),
            422,
            "Port 'vm9': 224.0.0.1 cannot be a vif's address (unspecified, multicast or loopback)",
        ),
    ];
    for (req, want_status, want) in cases {
        let (status, body) = d.send("POST", "/v1/ports", Some(req.clone()));
        assert_eq!(
            (status, body["error"].as_str()),
            (want_status, Some(want)),
            "{req}"
        );
    }
    let (status, _) = d.send(
        "POST",
        "/v1/ports",
        Some(json!({"name": "vm9", "serves": ["bgp"]})),
    );
    assert_eq!(status, 400);
    assert_eq!(
        d.mock.calls().len(),
        calls,
        "a refused port reached the switch"
    );
}

#[test]
fn null_ports_take_a_frame_length_and_nothing_of_other_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let (status, body) = d.send(
        "POST",
        "/v1/ports",
        Some(json!({"name": "n1", "kind": "null"})),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        (body["kind"].as_str(), body["frame_len"].as_u64()),
        (Some("null"), Some(64))
    );
    let body = json!({"name": "n2", "kind": "null", "frame_len": 1518});
    assert_eq!(d.send("POST", "/v1/ports", Some(body)).0, 201);
    let calls = d.mock.calls().len();
    let cases = [
        (
            json!({"name": "n3", "kind": "null", "frame_len": 63}),
            "Port 'n3': frame_len 63 is outside 64..=1518 (bytes on the wire, FCS included), or 0 (it only receives)",
        ),
        (
            json!({"name": "n3", "kind": "null", "socket": "/tmp/x"}),
            "Port 'n3': a null port has no socket, mode nor TAP to attach",
        ),
        (
            json!({"name": "n3", "frame_len": 64}),
            "Port 'n3': frame_len is for kind = \"null\"",
        ),
    ];
    for (req, want) in cases {
        let (status, body) = d.send("POST", "/v1/ports", Some(req.clone()));
        assert_eq!((status, body["error"].as_str()), (422, Some(want)), "{req}");
    }
    assert_eq!(d.mock.calls().len(), calls);
}

#[test]
fn a_policy_shows_what_a_cluster_share_and_a_controller_make_the_switch_enforce() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let policy = |d: &Daemon| d.get("/v1/policies/vm1");
    assert!(policy(&d).get("enforced").is_none(), "{}", policy(&d));
    let share = vqos_cluster::Share {
        min_bps: 150_000_000,
        max_bps: Some(300_000_000),
    };
    d.api
        .set_cluster_shares(&BTreeMap::from([("vm1".to_string(), share)]))
        .unwrap();
    let p = policy(&d);
    assert_eq!(p["max"], "unlimited", "its own policy is unchanged: {p}");
    assert_eq!(
        p["enforced"],
        json!({"min": "150Mbit", "max": "300Mbit", "min_bps": 150_000_000,
               "max_bps": 300_000_000, "by": ["cluster"]})
    );
    let vm1 = d.api.vifs().1[0];
    d.api
        .set_controller_limits(&BTreeMap::from([(vm1, 200_000_000)]))
        .unwrap();
    let p = policy(&d);
    assert_eq!(
        (&p["enforced"]["max"], &p["enforced"]["by"]),
        (&json!("200Mbit"), &json!(["cluster", "controller"]))
    );
    // The list says the same, and a vif nothing changes has no `enforced`.
    let all = d.get("/v1/policies");
    assert_eq!(all["vm1"]["enforced"], p["enforced"]);
    assert!(all["vm2"].get("enforced").is_none(), "{all}");
}

#[test]
fn vhost_user_ports_and_taps_take_1_to_16_queues_and_null_ports_none() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let sock = dir.path().join("mq.sock");
    let sock = sock.to_str().unwrap();
    let body = json!({"name": "mq", "kind": "vhost-user", "socket": sock, "queues": 4});
    let (status, body) = d.send("POST", "/v1/ports", Some(body));
    assert_eq!((status, body["queues"].as_u64()), (201, Some(4)), "{body}");
    let (_, list) = d.send("GET", "/v1/ports", None);
    let listed = list.as_array().unwrap().iter().find(|p| p["name"] == "mq");
    assert_eq!(listed.and_then(|p| p["queues"].as_u64()), Some(4), "{list}");
    // A multiqueue TAP.
    let (status, body) = d.send(
        "POST",
        "/v1/ports",
        Some(json!({"name": "tq", "queues": 2})),
    );
    assert_eq!((status, body["queues"].as_u64()), (201, Some(2)), "{body}");
    let calls = d.mock.calls().len();
    let cases = [
        (
            json!({"name": "q0", "kind": "vhost-user", "socket": sock, "queues": 0}),
            "Port 'q0': queues = 0 is outside 1..=16 (queue pairs offered to the guest)",
        ),
        (
            json!({"name": "q17", "kind": "vhost-user", "socket": sock, "queues": 17}),
            "Port 'q17': queues = 17 is outside 1..=16 (queue pairs offered to the guest)",
        ),
        (
            json!({"name": "tq17", "queues": 17}),
            "Port 'tq17': queues = 17 is outside 1..=16 (queues of the TAP, IFF_MULTI_QUEUE \
             above 1)",
        ),
        (
            json!({"name": "t1", "thread": 1}),
            "Port 't1': thread = 1, but the switch has 1 forwarding thread(s) (0..=0)",
        ),
        (
            json!({"name": "nq", "kind": "null", "queues": 17}),
            "Port 'nq': queues = 17 is outside 1..=16 (receive queues of the generator, read on \
             as many threads)",
        ),
    ];
    for (req, want) in cases {
        let (status, body) = d.send("POST", "/v1/ports", Some(req.clone()));
        assert_eq!((status, body["error"].as_str()), (422, Some(want)), "{req}");
    }
    assert_eq!(d.mock.calls().len(), calls);
}

#[test]
fn bad_requests_get_the_right_status_and_message_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let before = d.snapshot();
    let calls_before = d.mock.calls();
    let cases: Vec<(&str, &str, Option<Value>, u16, &str)> = vec![
        (
            "PUT",
            "/v1/policies/nope",
            Some(json!({"weight": 2})),
            404,
            "Unknown vif 'nope'",
        ),
        ("GET", "/v1/policies/nope", None, 404, "Unknown vif 'nope'"),
        ("DELETE", "/v1/ports/nope", None, 404, "Unknown vif 'nope'"),
        (
            "PUT",
            "/v1/policies/vm1",
            Some(json!({"min": "600Mbit", "max": "500Mbit"})),
            422,
            "Vif 'vm1': min 600Mbit is above max 500Mbit",
        ),
        (
            "PUT",
            "/v1/policies/vm1",
            Some(json!({"min": "700Mbit"})),
            422,
            "Sum of minimums 1.1Gbit exceeds capacity 1Gbit",
        ),
        (
            "PUT",
            "/v1/policies/vm1",
            Some(json!({"weight": 0})),
            422,
            "Vif 'vm1': weight must be greater than 0",
        ),
        (
            "PUT",
            "/v1/policies/vm1",
            Some(json!({"priority": 9})),
            422,
            "priority 9 is out of range 0..=7",
        ),
        (
            "PUT",
            "/v1/policies/vm1",
            Some(json!({"min": "unlimited"})),
            422,
            "Vif 'vm1': min cannot be unlimited",
        ),
        (
            "POST",
            "/v1/ports",
            Some(json!({"name": "eth1", "kind": "af-packet"})),
            422,
            "Port 'eth1': kind = \"af-packet\" is for the uplink only",
        ),
        (
            "PUT",
            "/v1/policies/vm1",
            Some(json!({"wieght": 2})),
            400,
            "unknown field `wieght`",
        ),
        (
            "PUT",
            "/v1/policies/vm1",
            Some(json!({"max": "5Mbyte"})),
            400,
            "Invalid rate '5Mbyte'",
        ),
        (
            "PUT",
            "/v1/policies/vm1",
            Some(json!({"weight": -1})),
            400,
            "Invalid JSON body",
        ),
        ("PUT", "/v1/policies/vm1", None, 400, "Invalid JSON body"),
        (
            "POST",
            "/v1/ports",
            Some(json!({"name": "vm1"})),
            409,
            "Duplicate vif 'vm1'",
        ),
        (
            "POST",
            "/v1/ports",
            Some(json!({"name": "up0"})),
            409,
            "Port 'up0' is the uplink",
        ),
        (
            "POST",
            "/v1/ports",
            Some(json!({"name": "a/b"})),
            422,
            "Invalid port name 'a/b'",
        ),
        (
            "POST",
            "/v1/ports",
            Some(json!({"name": "vm3", "policy": {"min": "700Mbit"}})),
            422,
            "Sum of minimums 1.1Gbit exceeds capacity 1Gbit",
        ),
        (
            "POST",
            "/v1/ports",
            Some(json!({"name": "vm3", "policy": {"weight": 0}})),
            422,
            "weight must be greater than 0",
        ),
        (
            "POST",
            "/v1/ports",
            Some(json!({"name": "vm3", "macs": ["nope"]})),
            400,
            "Invalid MAC address 'nope'",
        ),
        (
            "POST",
            "/v1/ports",
            Some(json!({"create": true})),
            400,
            "missing field `name`",
        ),
        (
            "GET",
            "/v1/nothing",
            None,
            404,
            "Unknown endpoint GET /v1/nothing",
        ),
        ("GET", "/", None, 404, "Unknown endpoint GET /"),
        (
            "DELETE",
            "/v1/stats",
            None,
            405,
            "Method DELETE not allowed on /v1/stats (allowed: GET)",
        ),
        (
            "PATCH",
            "/v1/policies/vm1",
            None,
            405,
            "(allowed: GET, PUT)",
        ),
        ("PUT", "/v1/ports", None, 405, "(allowed: GET, POST)"),
    ];
    for (method, path, body, status, message) in cases {
        let (got, answer) = d.send(method, path, body.clone());
        let error = answer["error"].as_str().unwrap_or_default().to_string();
        assert_eq!(got, status, "{method} {path} {body:?}: {answer}");
        assert!(
            error.contains(message),
            "{method} {path}: {error:?} lacks {message:?}"
        );
        assert!(
            error.starts_with(|c: char| c.is_uppercase()),
            "{error:?} not capitalised"
        );
        assert_eq!(d.snapshot(), before, "{method} {path} changed the state");
    }
    // Nothing invalid reached the switch.
    assert_eq!(d.mock.calls(), calls_before);

    // Garbage that is not JSON at all, and a 405 names what is allowed.
    let raw = b"PUT /v1/policies/vm1 HTTP/1.1\r\nContent-Length: 9\r\n\r\n{weight:3";
    let r = d.client.raw(raw).unwrap();
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("Invalid JSON body"));
    let r = d.client.request("DELETE", "/v1/stats", None).unwrap();
    assert!(r
        .headers
        .contains(&("allow".to_string(), "GET".to_string())));
    // Not HTTP, and too big.
    let r = d.client.raw(b"HELLO\r\n\r\n").unwrap();
    assert_eq!(r.status, 400);
    let mut big = format!(
        "PUT /v1/policies/vm1 HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        70 * 1024
    )
    .into_bytes();
    big.extend(std::iter::repeat_n(b' ', 70 * 1024));
    let r = d.client.raw(&big).unwrap();
    assert_eq!(r.status, 413);
    assert!(String::from_utf8_lossy(&r.body).contains("Request body larger than 65536 bytes"));
    assert_eq!(d.snapshot(), before);
}

#[test]
fn stats_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let mut drops = DropCounters::default();
    drops[DropReason::Spoofed] = 4;
    d.mock.set_port_stats(PortStats {
        name: "vm2".into(),
        counters: PortCounters {
            rx_frames: 100,
            rx_bytes: 150_000,
            tx_frames: 90,
            tx_bytes: 120_000,
            drops,
            ecn_marked: 2,
            ..Default::default()
        },
        rate_bps: 480_000_000,
        tx_rate_bps: 1_000,
        credit: Some(-1200),
        throttled: true,
        ..Default::default()
    });
    let stats: StatsView = d.client.call("GET", "/v1/stats", None).unwrap();
    assert_eq!(stats.engine, "vqos");
    assert_eq!(stats.capacity_bps, Some(1_000_000_000));
    let vm2 = stats.ports.iter().find(|p| p.stats.name == "vm2").unwrap();
    assert_eq!(vm2.role, "vif");
    assert_eq!(vm2.stats.rate_bps, 480_000_000);
    assert_eq!(vm2.stats.counters.drops[DropReason::Spoofed], 4);
    assert_eq!(vm2.policy.as_ref().unwrap().max, "500Mbit");
    // An inbound max and a burst on vm2, so that their families have a sample to check.
    let (status, body) = d.send(
        "PUT",
        "/v1/policies/vm2",
        Some(json!({"max_in": "200Mbit", "burst": "64KiB"})),
    );
    assert_eq!(status, 200, "{body}");

    let r = d.client.request("GET", "/metrics", None).unwrap();
    assert_eq!(r.status, 200);
    assert!(r
        .headers
        .iter()
        .any(|(k, v)| k == "content-type" && v.starts_with("text/plain; version=0.0.4")));
    let text = String::from_utf8(r.body).unwrap();
    let Exposition { samples, types } = metrics::parse(&text).unwrap();
    // vqos's own families and the standard process_* ones.
    assert_eq!(
        types.len(),
        metrics::FAMILIES.len() + metrics::PROCESS_FAMILIES.len()
    );
    for (name, _) in &types {
        // Without a controller no vif has a controller limit, and without a vhost-user port
        // there is no guest session to report (those families are declared, empty; the
        // metrics_doc tests emit them).
        if name == "vqos_controller_limit_bps" || name.starts_with("vqos_vhost_user_") {
            continue;
        }
        assert!(
            samples.iter().any(|s| &s.name == name),
            "metric {name} is declared but never emitted"
        );
    }
    let value = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|s| s.value)
    };
    assert_eq!(
        value(
            "vqos_port_drops_total",
            &[("port", "vm2"), ("reason", "spoofed")]
        ),
        Some(4.0)
    );
    assert_eq!(
        value(
            "vqos_port_drops_total",
            &[("port", "vm1"), ("reason", "truncated")]
        ),
        Some(0.0)
    );
    assert_eq!(
        value("vqos_port_ecn_marked_total", &[("port", "vm2")]),
        Some(2.0)
    );
    assert_eq!(
        value("vqos_port_rx_bytes_total", &[("port", "vm2")]),
        Some(150e3)
    );
    assert_eq!(value("vqos_port_credit", &[("port", "vm2")]), Some(-1200.0));
    assert_eq!(
        value("vqos_policy_max_bps", &[("port", "vm2")]),
        Some(500e6)
    );
    assert_eq!(value("vqos_policy_max_bps", &[("port", "vm1")]), None);
    assert_eq!(
        value("vqos_policy_max_in_bps", &[("port", "vm2")]),
        Some(200e6)
    );
    assert_eq!(
        value("vqos_policy_burst_bytes", &[("port", "vm2")]),
        Some(65_536.0)
    );
    assert_eq!(value("vqos_policy_max_in_bps", &[("port", "vm1")]), None);
    assert_eq!(value("vqos_capacity_bps", &[]), Some(1e9));
    assert_eq!(
        value(
            "vqos_loop_busy_cycles_total",
            &[("loop", "mock0"), ("unit", "ns")]
        ),
        Some(0.0)
    );
}

mod migrate;
mod persistence;
mod server;
