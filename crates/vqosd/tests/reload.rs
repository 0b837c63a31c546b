//! Reloading the config file live: `POST /v1/reload` on the mock switch (in this process), and
//! SIGHUP to the `vqosd` binary on real TAP ports.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use vqosd::api::Api;
use vqosd::backend::{MockBackend, MockCall};
use vqosd::client::{Client, Endpoint};
use vqosd::config::Config;
use vqosd::server::{Server, ServerConfig};

/// A daemon on the mock switch whose config file is `dir/vqosd.toml`.
struct Daemon {
    _server: Server,
    mock: Arc<MockBackend>,
    client: Client,
    config: PathBuf,
    state_file: PathBuf,
}

fn head(dir: &Path) -> String {
    format!(
        "capacity = \"1Gbit\"\nstate_file = \"{0}/state.json\"\n[api]\nsocket = \"{0}/s.sock\"\n",
        dir.display()
    )
}

const PORTS: &str = r#"
[[port]]
name = "vm1"
create = false

[[port]]
name = "vm2"
create = false
macs = ["02:00:00:00:00:02"]
policy = { weight = 2, max = "500Mbit" }
"#;

fn start(dir: &Path) -> Daemon {
    let path = dir.join("vqosd.toml");
    fs::write(&path, format!("{}{PORTS}", head(dir))).unwrap();
    let config = Config::load(&path).unwrap();
    let mock = Arc::new(MockBackend::new());
    let api = Arc::new(Api::start(&config, mock.clone()).unwrap());
    api.set_config_path(path.clone());
    let server = Server::start(&ServerConfig::from_config(&config), api).unwrap();
    Daemon {
        _server: server,
        mock,
        client: Client::new(Endpoint::Unix(config.socket_path.clone())),
        config: path,
        state_file: config.state_file.clone(),
    }
}

impl Daemon {
    fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let r = self.client.request(method, path, body.as_ref()).unwrap();
        (
            r.status,
            serde_json::from_slice(&r.body).unwrap_or(Value::Null),
        )
    }

    fn reload(&self, file: &str) -> (u16, Value) {
        fs::write(&self.config, file).unwrap();
        self.send("POST", "/v1/reload", None)
    }

    /// Everything a refused reload must leave unchanged.
    fn snapshot(&self) -> (Value, Value, Vec<u8>, usize) {
        (
            self.send("GET", "/v1/ports", None).1,
            self.send("GET", "/v1/policies", None).1,
            fs::read(&self.state_file).unwrap(),
            self.mock.calls().len(),
        )
    }
}

#[test]
fn reload_adds_a_port_and_changes_a_policy_and_keeps_the_api_changes() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    // Changes through the API: vm1's policy, a port the file does not name.
    let (s, _) = d.send("PUT", "/v1/policies/vm1", Some(json!({"weight": 7})));
    assert_eq!(s, 200);
    let (s, _) = d.send(
        "POST",
        "/v1/ports",
        Some(json!({"name": "api1", "create": false, "policy": {"max": "10Mbit"}})),
    );
    assert_eq!(s, 201);
    let calls_before = d.mock.calls().len();
    // The file: a new port vm3, vm2's policy changed (max_in and burst too), capacity.
    let file = format!(
        "{}{}\n[[port]]\nname = \"vm3\"\ncreate = false\npolicy = {{ weight = 3 }}\n",
        head(dir.path()).replace("1Gbit", "2Gbit"),
        PORTS.replace(
            "weight = 2, max = \"500Mbit\"",
            "weight = 2, max_out = \"600Mbit\", max_in = \"100Mbit\", burst = \"64KiB\""
        )
    );
    let (s, r) = d.reload(&file);
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r,
        json!({"added": ["vm3"], "removed": [], "policies": ["vm2"], "capacity": "2Gbit"})
    );
    let (_, p) = d.send("GET", "/v1/policies", None);
    assert_eq!(p["vm2"]["max"], "600Mbit");
    assert_eq!(p["vm2"]["max_in"], "100Mbit");
    assert_eq!(p["vm2"]["burst"], "64KiB");
    assert_eq!(p["vm3"]["weight"], 3);
    // Not changed in the file: the API's changes stay.
    assert_eq!(p["vm1"]["weight"], 7);
    assert_eq!(p["api1"]["max"], "10Mbit");
    let (_, h) = d.send("GET", "/v1/health", None);
    assert_eq!(
        (h["capacity"].as_str(), h["ports"].as_u64()),
        (Some("2Gbit"), Some(4))
    );
    // The switch saw policy snapshots and one port added; nothing was removed (no flap).
    let calls = d.mock.calls()[calls_before..].to_vec();
    assert!(
        calls.contains(&MockCall::AddPort("vm3".into())),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| matches!(c, MockCall::RemovePort(_))),
        "{calls:?}"
    );
    let (_, pol) = d
        .mock
        .ports()
        .into_iter()
        .find(|(p, _)| p.config.name == "vm2")
        .unwrap();
    assert_eq!(
        (pol.max_bps, pol.max_in_bps, pol.burst_bytes),
        (Some(600_000_000), Some(100_000_000), Some(65_536))
    );
    // The state file has it all.
    let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
    let names: Vec<&str> = saved["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["vm1", "vm2", "api1", "vm3"]);
    // The same file again: nothing to do, nothing touched.
    let calls_before = d.mock.calls().len();
    let (s, r) = d.reload(&file);
    assert_eq!(
        (s, r),
        (200, json!({"added": [], "removed": [], "policies": []}))
    );
    assert_eq!(d.mock.calls().len(), calls_before);
    // vm3 leaves the file: removed. vm1 leaves too, after it was deleted through the API.
    let (s, _) = d.send("DELETE", "/v1/ports/vm1", None);
    assert_eq!(s, 200);
    let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
    assert_eq!(saved["removed"], json!(["vm1"]));
    let file = file.replace(
        "[[port]]\nname = \"vm3\"\ncreate = false\npolicy = { weight = 3 }\n",
        "",
    );
    let file = file.replace("[[port]]\nname = \"vm1\"\ncreate = false\n", "");
    let (s, r) = d.reload(&file);
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["removed"], json!(["vm3"]));
    assert!(d.mock.calls().contains(&MockCall::RemovePort("vm3".into())));
    let (s, _) = d.send("GET", "/v1/ports/vm3", None);
    assert_eq!(s, 404);
    // vm1's deletion needs no memory once the file no longer names it.
    let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
    assert!(
        saved["removed"].as_array().is_none_or(|r| r.is_empty()),
        "{saved}"
    );
    // vm1 back in the file: a new entry, so it comes back (its deletion is forgotten).
    let (s, r) = d.reload(&format!("{file}[[port]]\nname = \"vm1\"\ncreate = false\n"));
    assert_eq!((s, &r["added"]), (200, &json!(["vm1"])), "{r}");
}

#[test]
fn an_invalid_or_restart_only_file_is_refused_as_a_whole() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let before = d.snapshot();
    let good = format!("{}{PORTS}", head(dir.path()));
    let add_vm3 = "[[port]]\nname = \"vm3\"\ncreate = false\n";
    for (file, status, needle) in [
        // Syntax, named with its line.
        (
            format!("{good}{add_vm3}wieght = 1\n"),
            422,
            "unknown field `wieght`",
        ),
        // A port added with minimums beyond the capacity.
        (
            format!("{good}{add_vm3}policy = {{ min = \"2Gbit\" }}\n"),
            422,
            "Sum of minimums 2Gbit exceeds capacity 1Gbit",
        ),
        (
            format!("{good}{add_vm3}policy = {{ burst = 0 }}\n"),
            422,
            "burst 0B is out of range",
        ),
        // A key that needs a restart, with a valid port added beside it.
        (
            format!("engine = \"tcm\"\n{good}{add_vm3}"),
            409,
            "engine cannot change without a restart",
        ),
        // A port's settings other than its policy.
        (
            good.replace("02:00:00:00:00:02", "02:00:00:00:00:09"),
            409,
            "port 'vm2': its macs changed",
        ),
        // A new port taking another's MAC.
        (
            format!("{good}{add_vm3}macs = [\"02:00:00:00:00:02\"]\n"),
            409,
            "MAC address 02:00:00:00:00:02 is in use by port 'vm2'",
        ),
    ] {
        let (s, r) = d.reload(&file);
        let msg = r["error"].as_str().unwrap_or_default();
        assert_eq!(s, status, "{file}: {r}");
        assert!(
            msg.starts_with("Reload refused, nothing changed: "),
            "{msg}"
        );
        assert!(msg.contains(needle), "{needle}: {msg}");
        assert_eq!(d.snapshot(), before, "{file}");
    }
    // max_ports lowered below the ports there are.
    let (s, r) = d.reload(&good.replace("[api]", "max_ports = 1\n[api]"));
    assert_eq!(s, 422, "{r}");
    assert_eq!(d.snapshot(), before);
    // A missing file.
    fs::remove_file(&d.config).unwrap();
    let (s, r) = d.send("POST", "/v1/reload", None);
    assert_eq!(s, 422);
    assert!(
        r["error"].as_str().unwrap().contains("Cannot read config"),
        "{r}"
    );
    assert_eq!(d.snapshot(), before);
    // GET is not a reload.
    let (s, _) = d.send("GET", "/v1/reload", None);
    assert_eq!(s, 405);
}

/// SIGHUP on the real switch: a port added as a TAP, a policy changed, the TAP that stays is
/// the same interface (no flap), and each change has its audit line.
#[test]
fn sighup_reloads_the_config_on_real_taps() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP sighup_reloads_the_config_on_real_taps: needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tag = std::process::id() % 100_000;
    let (up, vm1, vm2) = (
        format!("vqru{tag}"),
        format!("vqra{tag}"),
        format!("vqrb{tag}"),
    );
    // The TAPs persist by design: removed here even if the test fails.
    let _links = vqos_testkit::Links(vec![up.clone(), vm1.clone(), vm2.clone()]);
    let socket = dir.path().join("s.sock");
    let cfg = dir.path().join("vqosd.toml");
    let text = format!(
        "{}[uplink]\nname = \"{up}\"\n[[port]]\nname = \"{vm1}\"\npolicy = {{ weight = 1 }}\n",
        head(dir.path())
    );
    fs::write(&cfg, &text).unwrap();
    let d = common::Daemon::start(&cfg, &socket);
    let ifindex = |name: &str| fs::read_to_string(format!("/sys/class/net/{name}/ifindex")).ok();
    let first = ifindex(&vm1).expect("vm1's TAP");
    fs::write(
        &cfg,
        format!(
            "{}[[port]]\nname = \"{vm2}\"\npolicy = {{ max = \"100Mbit\" }}\n",
            text.replace("weight = 1", "weight = 4, burst = \"32KiB\"")
        ),
    )
    .unwrap();
    // SAFETY: kill on the PID of our own child.
    assert_eq!(unsafe { libc::kill(d.pid(), libc::SIGHUP) }, 0);
    let got = vqos_testkit::poll(std::time::Duration::from_secs(10), || {
        let p = d.get("/v1/policies");
        (p[&vm2]["max"] == "100Mbit").then_some(p)
    });
    let p = got.unwrap_or_else(|| panic!("SIGHUP applied nothing; vqosd: {}", d.log()));
    assert_eq!(
        (p[&vm1]["weight"].as_u64(), p[&vm1]["burst"].as_str()),
        (Some(4), Some("32KiB"))
    );
    assert!(ifindex(&vm2).is_some(), "vm2's TAP was not created");
    assert_eq!(
        ifindex(&vm1).as_deref(),
        Some(first.as_str()),
        "vm1's TAP was recreated"
    );
    let log = vqos_testkit::poll(std::time::Duration::from_secs(5), || {
        let log = d.log();
        log.contains("SIGHUP: config reloaded").then_some(log)
    })
    .unwrap_or_else(|| d.log());
    for line in [
        format!("reload: port {vm2} added"),
        format!("reload: policy of {vm1} set to"),
    ] {
        assert_eq!(log.matches(&line).count(), 1, "{line}: {log}");
    }
    assert!(
        log.contains("caller=\"signal SIGHUP\"") || log.contains("signal SIGHUP"),
        "{log}"
    );
    // An invalid file on SIGHUP: logged, nothing changes, the daemon keeps running.
    fs::write(&cfg, format!("engine = \"rr\"\n{text}")).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(d.pid(), libc::SIGHUP) }, 0);
    let log = vqos_testkit::poll(std::time::Duration::from_secs(10), || {
        let log = d.log();
        log.contains("SIGHUP: Reload refused").then_some(log)
    });
    assert!(log.is_some(), "no refusal logged: {}", d.log());
    assert_eq!(d.get("/v1/policies")[&vm2]["max"], "100Mbit");
    assert_eq!(d.get("/v1/health")["status"], "ok");
}

/// Under iperf3 load through two TAP ports, SIGHUP with a policy changed and a port added: no
/// stream stalls in any second, and the new weights are in force after.
#[test]
fn reload_under_traffic_keeps_the_streams_going() {
    let Some(_guard) = vqos_testkit::can_run("reload_under_traffic_keeps_the_streams_going") else {
        return;
    };
    let lab = common::lab(0, &[1, 1]);
    let new_tap = format!("{}x", lab.uplink.trim_end_matches('u'));
    // The added TAP is not in a namespace: removed even if the test fails.
    let _link = vqos_testkit::Links(vec![new_tap.clone()]);
    let servers: Vec<_> = (0..2).map(|i| lab.server(5201 + i as u16)).collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let clients: Vec<_> = (0..2).map(|i| lab.client(i, 5201 + i as u16, 9)).collect();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let text = fs::read_to_string(&lab.config).unwrap();
    let vm2 = format!("name = \"{}\"\npolicy = {{ weight = 1 }}", lab.tap(1));
    assert!(text.contains(&vm2), "{text}");
    let text = text.replace(
        &vm2,
        &format!("name = \"{}\"\npolicy = {{ weight = 3 }}", lab.tap(1)),
    );
    fs::write(
        &lab.config,
        format!("{text}[[port]]\nname = \"{new_tap}\"\n"),
    )
    .unwrap();
    // SAFETY: kill on the PID of our own child.
    assert_eq!(unsafe { libc::kill(lab.daemon.pid(), libc::SIGHUP) }, 0);
    let applied = vqos_testkit::poll(std::time::Duration::from_secs(5), || {
        let p = lab.daemon.get("/v1/policies");
        (p[lab.tap(1)]["weight"] == 3 && p[&new_tap].is_object()).then_some(())
    });
    assert!(
        applied.is_some(),
        "SIGHUP applied nothing: {}",
        lab.daemon.log()
    );
    assert!(
        Path::new("/sys/class/net").join(&new_tap).exists(),
        "the added TAP is missing"
    );
    let reports: Vec<common::Report> = servers
        .into_iter()
        .map(|s| common::Report::of(s, std::time::Duration::from_secs(20)))
        .collect();
    drop(clients);
    for (i, r) in reports.iter().enumerate() {
        let per_s = r.interval_bytes_from(0.0);
        assert!(per_s.len() >= 8, "vm{}: {per_s:?}", i + 1);
        assert!(
            per_s.iter().all(|&b| b > 5_000_000),
            "vm{} stalled: bytes per second {per_s:?}",
            i + 1
        );
    }
    let after: Vec<f64> = reports.iter().map(|r| r.mbit(5.0, 8.0)).collect();
    common::check(
        "after the reload, weights 1:3",
        &after,
        &common::weights(&[1, 3]),
        common::LOOSE_TOL,
        common::LOOSE_AGGREGATE,
    );
}
