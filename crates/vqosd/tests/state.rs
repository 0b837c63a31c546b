//! The state file on a bad day: symlinks, corruption, hostile entries, crashes mid-save, a file
//! that went missing. Each case either restores the last good state with a loud warning or
//! stops the start with a clear error; none silently resets the policies made through the API.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use vqos_api::chain;
use vqosd::api::Api;
use vqosd::backend::MockBackend;
use vqosd::config::Config;
use vqosd::http::Request;
use vqosd::state::{self, last_good_path, temp_path, StateError};

fn config_text(dir: &Path, extra: &str) -> String {
    format!(
        "capacity = \"1Gbit\"\nstate_file = \"{dir}/state.json\"\n{extra}\n\
         [api]\nsocket = \"{dir}/vqosd.sock\"\n[uplink]\nname = \"up0\"\n\
         [[port]]\nname = \"vm1\"\n",
        dir = dir.display()
    )
}

fn config(dir: &Path, extra: &str) -> Config {
    Config::parse(&config_text(dir, extra), |_| None).unwrap()
}

fn start(dir: &Path) -> Result<Api, String> {
    Api::start(&config(dir, ""), Arc::new(MockBackend::new())).map_err(|e| chain(&e))
}

fn call(api: &Api, method: &str, path: &str, body: Value) -> u16 {
    api.handle(&Request {
        method: method.into(),
        path: path.into(),
        headers: Vec::new(),
        body: serde_json::to_vec(&body).unwrap(),
    })
    .status
}

/// A daemon that made vm2 through the API and set vm1's weight to 5, then stopped.
fn with_api_changes(dir: &Path) {
    let api = start(dir).unwrap();
    assert_eq!(call(&api, "POST", "/v1/ports", json!({"name": "vm2"})), 201);
    assert_eq!(
        call(&api, "PUT", "/v1/policies/vm1", json!({"weight": 5})),
        200
    );
}

fn has_api_changes(api: &Api) -> bool {
    let p = api.policies();
    p.vifs.len() == 2 && p.vifs[0].policy.weight == 5 && p.vifs[1].name == "vm2"
}

#[test]
fn a_symlinked_state_file_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    // Dangling: before, it read as "no state" (every API change lost) and was replaced by a
    // regular file.
    std::os::unix::fs::symlink(dir.path().join("gone/state.json"), &path).unwrap();
    let e = start(dir.path()).err().unwrap();
    assert!(e.contains("is a symlink"), "{e}");
    assert!(fs::symlink_metadata(&path).unwrap().is_symlink());
    // A live link is refused too: a save would replace the link with a regular file.
    fs::remove_file(&path).unwrap();
    with_api_changes(dir.path());
    let real = dir.path().join("real.json");
    fs::rename(&path, &real).unwrap();
    fs::remove_file(last_good_path(&path)).unwrap();
    std::os::unix::fs::symlink(&real, &path).unwrap();
    let e = start(dir.path()).err().unwrap();
    assert!(e.contains("set state_file to the real path"), "{e}");
    assert!(fs::symlink_metadata(&path).unwrap().is_symlink());
}

#[test]
fn a_corrupt_state_file_falls_back_to_the_last_good_copy() {
    let dir = tempfile::tempdir().unwrap();
    with_api_changes(dir.path());
    let path = dir.path().join("state.json");
    fs::write(&path, "{\"version\": 1, \"ports\": [").unwrap();
    let api = start(dir.path()).unwrap();
    assert!(has_api_changes(&api));
    let w = api.startup_warnings().join("\n");
    assert!(w.contains("restored the last-good copy"), "{w}");
    assert!(w.contains("state.json.corrupt"), "{w}");
    assert_eq!(
        fs::read_to_string(dir.path().join("state.json.corrupt")).unwrap(),
        "{\"version\": 1, \"ports\": ["
    );
    // The state file is whole again.
    assert!(state::load(&path, Some("up0")).unwrap().is_some());
    drop(api);
    // Without a copy the start stops, naming both problems.
    fs::write(&path, "garbage").unwrap();
    fs::remove_file(last_good_path(&path)).unwrap();
    let e = start(dir.path()).err().unwrap();
    assert!(e.contains("is unusable"), "{e}");
    assert!(e.contains("state.json.last-good does not exist"), "{e}");
}

#[test]
fn restored_entries_are_validated_like_the_api_does() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let port = |name: &str| json!({"name": name, "create": true, "policy": {"weight": 1, "min_bps": 0, "max_bps": null, "priority": 7}});
    let long = "a".repeat(200);
    let cases = [
        (vec![port("a\u{0}b")], "Invalid port name"),
        (vec![port("a/b")], "Invalid port name 'a/b'"),
        (vec![port("")], "Invalid port name ''"),
        (vec![port(&long)], "Invalid port name"),
        (vec![port("up0")], "port 'up0' is the uplink"),
        (vec![port("vm3"), port("vm3")], "port 'vm3' is listed twice"),
    ];
    for (ports, want) in cases {
        let text = json!({"version": 1, "ports": ports}).to_string();
        fs::write(&path, &text).unwrap();
        let e = state::load(&path, Some("up0")).unwrap_err();
        assert!(matches!(e, StateError::Invalid { .. }), "{e}");
        assert!(e.to_string().contains(want), "{e} lacks {want}");
        // The daemon refuses to start on it (there is no last-good copy here).
        let e = start(dir.path()).err().unwrap();
        assert!(e.contains(want), "{e}");
        let _ = fs::remove_file(dir.path().join("state.json.corrupt"));
    }
    let bad_weight = json!({"version": 1, "ports": [{"name": "vm3", "create": true, "policy": {"weight": 0, "min_bps": 0, "max_bps": null, "priority": 7}}]});
    fs::write(&path, bad_weight.to_string()).unwrap();
    let e = state::load(&path, None).unwrap_err().to_string();
    assert!(e.contains("weight must be greater than 0"), "{e}");
}

#[test]
fn a_save_killed_midway_leaves_nothing_behind_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    with_api_changes(dir.path());
    let path = dir.path().join("state.json");
    // What kill -9 during a save leaves: this build's one temp file, and older builds' per-PID
    // files.
    fs::write(temp_path(&path), "half").unwrap();
    fs::write(dir.path().join(".state.json.tmp.4242"), "half").unwrap();
    let api = start(dir.path()).unwrap();
    assert!(has_api_changes(&api));
    let mut names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["state.json", "state.json.last-good"]);
}

#[test]
fn a_missing_state_file_is_restored_from_its_copy_or_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    with_api_changes(dir.path());
    let path = dir.path().join("state.json");
    fs::remove_file(&path).unwrap();
    let api = start(dir.path()).unwrap();
    assert!(has_api_changes(&api));
    assert!(api.startup_warnings()[0].contains("is missing; restored its last-good copy"));
    drop(api);
    // Both gone: a first start, silent unless the config says a state file must exist.
    fs::remove_file(&path).unwrap();
    fs::remove_file(last_good_path(&path)).unwrap();
    assert!(start(dir.path()).unwrap().startup_warnings().is_empty());
    fs::remove_file(&path).unwrap();
    fs::remove_file(last_good_path(&path)).unwrap();
    let api = Api::start(
        &config(dir.path(), "expect_state = true"),
        Arc::new(MockBackend::new()),
    )
    .unwrap();
    let w = api.startup_warnings().join("\n");
    assert!(
        w.contains("is missing though the config says it must exist"),
        "{w}"
    );
}

#[test]
fn the_port_count_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let api = Api::start(
        &config(dir.path(), "max_ports = 2"),
        Arc::new(MockBackend::new()),
    )
    .unwrap();
    assert_eq!(call(&api, "POST", "/v1/ports", json!({"name": "vm2"})), 201);
    let r = api.handle(&Request {
        method: "POST".into(),
        path: "/v1/ports".into(),
        headers: Vec::new(),
        body: br#"{"name": "vm3"}"#.to_vec(),
    });
    assert_eq!(r.status, 409);
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"], "Port limit reached: 2 ports (max_ports = 2)");
    assert_eq!(api.policies().len(), 2);
    drop(api);
    // A lower limit than the saved ports stops the start clearly.
    let e = Api::start(
        &config(dir.path(), "max_ports = 1"),
        Arc::new(MockBackend::new()),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("2 ports (config and"), "{e}");
    assert!(e.contains("exceed max_ports = 1"), "{e}");
}

/// A state file as the builds before the one port model wrote it (tests/data/state-v1.json:
/// a TAP with addresses and locks, a vhost-user port with its socket's owner, group and mode
/// and a hand-over, a port of an older build without `kind` nor `port_security`) still loads,
/// and is written back in the same form.
#[test]
fn a_state_file_of_the_previous_format_loads_and_is_written_back_alike() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let text = include_str!("data/state-v1.json");
    fs::write(&path, text).unwrap();
    let saved = state::load(&path, Some("up0")).unwrap().expect("a state");
    let [vm1, vm2, vm0] = &saved.ports[..] else {
        panic!("{saved:?}")
    };
    assert_eq!((vm1.port.create, vm1.port.ips.len()), (false, 2));
    assert_eq!(
        vm1.state.locked.ips,
        ["fe80::5".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(vm1.port.policy.burst_bytes, Some(65_536));
    assert_eq!(vm2.port.socket.as_deref(), Some("/run/vqos/vm2.sock"));
    assert_eq!(vm2.port.queues, Some(2));
    assert_eq!(
        serde_json::to_value((&vm2.port.socket_owner, &vm2.port.socket_group)).unwrap(),
        json!(["libvirt-qemu", 107])
    );
    assert_eq!(
        vm2.state.handover.as_ref().map(|h| h.to.as_str()),
        Some("vm3")
    );
    assert!(vm0.port.create && vm0.port.port_security, "{vm0:?}");
    assert_eq!(saved.removed, ["vm9"]);
    // Written back: the same keys and values (the old port gains its defaults).
    state::save(&path, &saved).unwrap();
    let old: Value = serde_json::from_str(text).unwrap();
    let new: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(new["ports"][0], old["ports"][0]);
    assert_eq!(new["ports"][1], old["ports"][1]);
    let mut vm0 = old["ports"][2].clone();
    vm0["kind"] = json!("tap");
    vm0["port_security"] = json!(true);
    assert_eq!(new["ports"][2], vm0);
    assert_eq!(new["removed"], old["removed"]);
    // A key this build does not know is refused, as before.
    let unknown = text.replacen("\"create\": false", "\"create\": false, \"colour\": 1", 1);
    fs::write(&path, unknown).unwrap();
    let e = state::load(&path, Some("up0")).unwrap_err().to_string();
    assert!(e.contains("unknown field `colour`"), "{e}");
}
