//! `POST /v1/ports/NAME/migrate` (`vqos port migrate`): the destination takes the source's
//! policy and addresses, the source shows the hand-over; refusals change nothing; a restart
//! before the hand-over completed gives the identity back to the source and migrates again,
//! after it the source owns nothing; deleting the destination cancels.

use super::*;
use vqosd::wire::HandoverView;

/// A daemon with the guest's port `vma` (its MAC, an 8 Mbit/s max) and a fresh `vmb`.
fn with_guest(dir: &Path) -> Daemon {
    let d = start(dir);
    for body in [
        json!({"name": "vma", "create": false, "macs": ["02:00:00:00:00:0a"],
               "ips": ["10.0.0.10"], "policy": {"max": "8Mbit", "weight": 3}}),
        json!({"name": "vmb", "create": false}),
    ] {
        let (status, answer) = d.send("POST", "/v1/ports", Some(body));
        assert_eq!(status, 201, "{answer}");
    }
    d
}

fn migrate(d: &Daemon, src: &str, body: Value) -> (u16, Value) {
    d.send("POST", &format!("/v1/ports/{src}/migrate"), Some(body))
}

fn port(d: &Daemon, name: &str) -> PortView {
    serde_json::from_value(d.get(&format!("/v1/ports/{name}"))).unwrap()
}

#[test]
fn the_destination_takes_the_identity_and_refusals_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = with_guest(dir.path());
    let before = d.snapshot();
    for (src, body, status, error) in [
        ("zz", json!({"to": "vmb"}), 404, "Unknown vif 'zz'"),
        ("vma", json!({"to": "zz"}), 404, "Unknown vif 'zz'"),
        ("up0", json!({"to": "vmb"}), 409, "Port 'up0' is the uplink"),
        ("vma", json!({"to": "up0"}), 409, "Port 'up0' is the uplink"),
        (
            "vma",
            json!({"to": "vma"}),
            422,
            "Cannot migrate 'vma' to 'vma': a port cannot be migrated to itself",
        ),
        (
            "vma",
            json!({"to": "vm2"}),
            409,
            "Cannot migrate 'vma' to 'vm2': 'vm2' has configured addresses of its own (the \
             destination takes the source's: add it without --mac/--ip)",
        ),
        ("vma", json!({"dst": "vmb"}), 400, ""),
    ] {
        let (got, answer) = migrate(&d, src, body.clone());
        assert_eq!(got, status, "{src} {body}: {answer}");
        if !error.is_empty() {
            assert_eq!(answer["error"], error, "{src} {body}");
        }
        assert_eq!(d.snapshot(), before, "{src} {body} changed something");
    }
    let r = d
        .client
        .request("GET", "/v1/ports/vma/migrate", None)
        .unwrap();
    assert_eq!(r.status, 405);
    assert!(!d
        .mock
        .calls()
        .iter()
        .any(|c| matches!(c, MockCall::MigratePort(..))));

    let (status, answer) = migrate(&d, "vma", json!({"to": "vmb"}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["from"], "vma");
    let b = port(&d, "vmb");
    let a = port(&d, "vma");
    assert_eq!(
        (b.port.macs.clone(), b.port.ips.clone()),
        (a.port.macs.clone(), a.port.ips.clone())
    );
    assert_eq!(b.port.policy, a.port.policy, "the source's policy");
    assert_eq!(b.port.policy.max_bps, Some(8_000_000));
    assert_eq!(
        a.state.handover,
        Some(HandoverView {
            to: "vmb".into(),
            complete: false
        })
    );
    assert_eq!(
        d.mock.ports()[3].1.max_bps,
        Some(8_000_000),
        "the switch's copy"
    );
    // Either side of a migration under way is refused another.
    let (status, answer) = migrate(&d, "vmb", json!({"to": "vm1"}));
    assert_eq!(
        (status, answer["error"].as_str().unwrap()),
        (
            409,
            "Cannot migrate 'vmb' to 'vm1': 'vmb' is already migrating"
        )
    );
}

#[test]
fn a_restart_mid_hand_over_keeps_the_identity_on_the_source_and_migrates_again() {
    let dir = tempfile::tempdir().unwrap();
    let ports_before = {
        let d = with_guest(dir.path());
        assert_eq!(migrate(&d, "vma", json!({"to": "vmb"})).0, 200);
        d.get("/v1/ports")
    };
    let d = start(dir.path());
    assert_eq!(d.get("/v1/ports"), ports_before);
    // The switch got the source whole, the destination bare, then the migration again.
    let switch = d.mock.ports();
    let (a, b) = (&switch[2].0, &switch[3].0);
    assert_eq!(
        (
            a.config.name.as_str(),
            a.config.macs.len(),
            a.config.ips.len()
        ),
        ("vma", 1, 1)
    );
    assert_eq!(
        (
            b.config.name.as_str(),
            b.config.macs.len(),
            b.config.ips.len()
        ),
        ("vmb", 0, 0)
    );
    let calls = d.mock.calls();
    let added = calls
        .iter()
        .position(|c| *c == MockCall::AddPort("vmb".into()));
    let migrated = calls
        .iter()
        .position(|c| *c == MockCall::MigratePort("vma".into(), "vmb".into()));
    assert!(added < migrated && migrated.is_some(), "{calls:?}");
}

#[test]
fn a_completed_hand_over_survives_a_restart_and_deleting_the_destination_cancels() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = with_guest(dir.path());
        assert_eq!(migrate(&d, "vma", json!({"to": "vmb"})).0, 200);
        // The switch says the destination carried its first frame.
        d.mock.set_port_stats(PortStats {
            name: "vma".into(),
            handover: Some(HandoverView {
                to: "vmb".into(),
                complete: true,
            }),
            ..Default::default()
        });
        assert!(d.api.sync_locks().unwrap() >= 1);
        assert!(port(&d, "vma").state.handover.unwrap().complete);
    }
    let d = start(dir.path());
    let switch = d.mock.ports();
    let (a, b) = (&switch[2].0, &switch[3].0);
    assert!(
        a.state.handover.as_ref().unwrap().complete,
        "added owning nothing"
    );
    assert_eq!(b.config.macs.len(), 1, "the destination whole");
    assert!(!d
        .mock
        .calls()
        .iter()
        .any(|c| matches!(c, MockCall::MigratePort(..))));
    drop(d);

    // Another run: a migration cancelled by deleting its destination.
    let dir = tempfile::tempdir().unwrap();
    let d = with_guest(dir.path());
    assert_eq!(migrate(&d, "vma", json!({"to": "vmb"})).0, 200);
    assert_eq!(d.send("DELETE", "/v1/ports/vmb", None).0, 200);
    assert_eq!(port(&d, "vma").state.handover, None);
    assert_eq!(
        migrate(&d, "vma", json!({"to": "vm1"})).0,
        200,
        "free again"
    );
}

/// vqosd on the real switch (a null uplink, vhost-user ports without guests) restarted on a
/// state file where `vma` (the guest's MAC configured, its IP locked first come unless
/// `complete`) migrates to `vmb` (a copy of both): the ports' stats once both are up.
#[cfg(feature = "switch")]
fn restarted_on_the_real_switch(complete: bool) -> Vec<PortStats> {
    use vqosd::backend::Backend;
    use vqosd::switch::SwitchBackend;
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f);
    let locked = json!({"macs": [], "ips": ["10.0.0.10"]});
    let port = |name: &str, locked: Value| {
        json!({"name": name, "kind": "vhost-user", "create": true,
               "socket": p(&format!("{name}.sock")), "macs": ["02:00:00:00:00:0a"],
               "locked": locked,
               "policy": {"weight": 3, "min_bps": 0, "max_bps": 8_000_000, "priority": 7}})
    };
    // Once complete, the source's lists were emptied (and synced).
    let mut vma = port("vma", if complete { json!({}) } else { locked.clone() });
    vma["handover"] = json!({"to": "vmb", "complete": complete});
    let state = json!({"version": 1, "ports": [vma, port("vmb", locked)]});
    fs::write(p("state.json"), state.to_string()).unwrap();
    let text = format!(
        "capacity = \"1Gbit\"\nstate_file = \"{}\"\n[uplink]\nname = \"mgu\"\nkind = \"null\"\n",
        p("state.json").display()
    );
    let config = Config::parse(&text, |_| None).unwrap();
    let backend = Arc::new(SwitchBackend::start(&config).unwrap());
    let api = Api::start(&config, backend.clone()).unwrap();
    // The loop publishes its stats within its interval: wait for vmb's locks (bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let stats = loop {
        let s = api.backend().stats();
        let up = (s.ports.iter()).any(|q| q.name == "vmb" && !q.locked.is_empty());
        if up || std::time::Instant::now() > deadline {
            break s.ports;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    backend.stop();
    stats
}

/// A restart before the hand-over completed: vqosd adds `vmb` without the guest's addresses
/// (else its configured MAC would be refused as `vma`'s) and migrates again: the lock is
/// `vma`'s, `vmb` co-owns it (its copy of the lists), the hand-over pending.
#[cfg(feature = "switch")]
#[test]
fn with_the_real_switch_a_restart_mid_hand_over_keeps_the_locks_on_the_source() {
    let stats = restarted_on_the_real_switch(false);
    let get = |n: &str| stats.iter().find(|q| q.name == n).unwrap().clone();
    let (a, b) = (get("vma"), get("vmb"));
    let ip: std::net::IpAddr = "10.0.0.10".parse().unwrap();
    assert_eq!(a.locked.ips, vec![ip]);
    assert_eq!(b.locked, a.locked, "the destination's copy of the lists");
    assert_eq!(
        a.handover,
        Some(HandoverView {
            to: "vmb".into(),
            complete: false
        })
    );
}

/// A restart after the hand-over completed: `vmb` comes up with the guest's addresses, `vma`
/// owning nothing (with its configured MAC it would be refused, or refuse `vmb`).
#[cfg(feature = "switch")]
#[test]
fn with_the_real_switch_a_completed_hand_over_stays_completed() {
    let stats = restarted_on_the_real_switch(true);
    let get = |n: &str| stats.iter().find(|q| q.name == n).unwrap().clone();
    let (a, b) = (get("vma"), get("vmb"));
    let ip: std::net::IpAddr = "10.0.0.10".parse().unwrap();
    assert_eq!(b.locked.ips, vec![ip]);
    assert!(a.locked.is_empty() && a.handover.is_none(), "{a:?}");
}
