//! Changes that must be all or nothing on the switch and on disk, and the state a restart
//! restores.

use super::*;

#[test]
fn a_switch_failure_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let before = d.snapshot();
    d.mock.fail_next_add("Cannot open /dev/net/tun");
    let (status, body) = d.send("POST", "/v1/ports", Some(json!({"name": "vm3"})));
    assert_eq!(status, 500);
    assert_eq!(body["error"], "Port 'vm3': Cannot open /dev/net/tun");
    assert_eq!(d.snapshot(), before);
}

#[test]
fn a_failed_state_write_undoes_the_change() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let before = d.snapshot();
    // Make the state directory unwritable for the temp file: a directory in its place.
    let tmp = vqosd::state::temp_path(&d.state_file);
    fs::create_dir(&tmp).unwrap();
    fs::write(tmp.join("x"), "x").unwrap();
    let (status, body) = d.send("PUT", "/v1/policies/vm1", Some(json!({"weight": 7})));
    assert_eq!(status, 500, "{body}");
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("Change not saved, nothing changed"));
    let (status, _) = d.send("POST", "/v1/ports", Some(json!({"name": "vm3"})));
    assert_eq!(status, 500);
    let (status, _) = d.send("DELETE", "/v1/ports/vm2", None);
    assert_eq!(status, 500);
    assert_eq!(d.snapshot(), before);
    let switch: Vec<_> = d
        .mock
        .ports()
        .into_iter()
        .map(|(p, pol)| (p.config.name, pol.weight))
        .collect();
    assert_eq!(switch, vec![("vm1".to_string(), 1), ("vm2".to_string(), 2)]);
    fs::remove_dir_all(&tmp).unwrap();
    let (status, _) = d.send("PUT", "/v1/policies/vm1", Some(json!({"weight": 7})));
    assert_eq!(status, 200);
}

#[test]
fn a_removal_that_cannot_be_saved_never_touches_the_switch() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let before = d.snapshot();
    let calls_before = d.mock.calls();
    let tmp = vqosd::state::temp_path(&d.state_file);
    fs::create_dir(&tmp).unwrap();
    fs::write(tmp.join("x"), "x").unwrap();
    // vm1 is first: taking it out and adding it back would reorder the switch's ports (and
    // re-create its TAP).
    let (status, body) = d.send("DELETE", "/v1/ports/vm1", None);
    assert_eq!(status, 500, "{body}");
    assert_eq!(d.mock.calls(), calls_before, "the switch was touched");
    let names = d.mock.port_names();
    assert_eq!(names, ["vm1", "vm2"]);
    assert_eq!(d.snapshot(), before);
    fs::remove_dir_all(&tmp).unwrap();
    let (status, _) = d.send("DELETE", "/v1/ports/vm1", None);
    assert_eq!(status, 200);
    assert_eq!(d.mock.ports().len(), 1);
}

#[test]
fn restart_restores_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    let (ports_before, policies_before) = {
        let d = start(dir.path());
        for (path, body) in [
            (
                "/v1/policies/vm1",
                json!({"weight": 4, "max": "300Mbit", "priority": 1}),
            ),
            (
                "/v1/policies/vm2",
                json!({"min": "200Mbit", "max": null, "weight": 6}),
            ),
        ] {
            let (status, answer) = d.send("PUT", path, Some(body));
            assert_eq!(status, 200, "{answer}");
        }
        let (status, answer) = d.send(
            "POST",
            "/v1/ports",
            Some(json!({"name": "vm3", "create": false, "macs": ["02:00:00:00:00:03"], "policy": {"weight": 2, "min": "50Mbit", "priority": 0}})),
        );
        assert_eq!(status, 201, "{answer}");
        (d.get("/v1/ports"), d.get("/v1/policies"))
        // Dropped here: listeners closed, the API and its mock switch gone.
    };
    let d = start(dir.path());
    assert_eq!(d.get("/v1/policies"), policies_before);
    assert_eq!(d.get("/v1/ports"), ports_before);
    // The new switch received every port with its restored policy.
    let switch: Vec<_> = d
        .mock
        .ports()
        .into_iter()
        .map(|(p, pol)| {
            (
                p.config.name,
                p.config.create,
                pol.weight,
                pol.min_bps,
                pol.max_bps,
                pol.priority,
            )
        })
        .collect();
    assert_eq!(
        switch,
        vec![
            ("vm1".to_string(), true, 4, 0, Some(300_000_000), 1),
            ("vm2".to_string(), false, 6, 200_000_000, None, 3),
            ("vm3".to_string(), false, 2, 50_000_000, None, 0),
        ]
    );
}

#[test]
fn a_config_port_deleted_through_the_api_stays_deleted_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let names = |d: &Daemon| d.mock.port_names();
    {
        let d = start(dir.path());
        let (status, body) = d.send("DELETE", "/v1/ports/vm1", None);
        assert_eq!(status, 200, "{body}");
    }
    {
        let d = start(dir.path());
        assert_eq!(names(&d), ["vm2"]);
        assert_eq!(d.get("/v1/health")["ports"], 1);
        let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
        assert_eq!(saved["removed"], json!(["vm1"]));
        // Added again through the API: it is back, with the policy given, and stays.
        let (status, body) = d.send(
            "POST",
            "/v1/ports",
            Some(json!({"name": "vm1", "policy": {"weight": 7}})),
        );
        assert_eq!(status, 201, "{body}");
    }
    let d = start(dir.path());
    // A port of the config again: in the config's order.
    assert_eq!(names(&d), ["vm1", "vm2"]);
    assert_eq!(d.get("/v1/policies/vm1")["weight"], 7);
    let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
    assert!(saved.get("removed").is_none(), "{saved}");
}

#[test]
fn restored_state_that_breaks_the_config_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = start(dir.path());
        let (status, _) = d.send("PUT", "/v1/policies/vm1", Some(json!({"min": "500Mbit"})));
        assert_eq!(status, 200);
    }
    // The operator lowers the capacity below the saved minimums.
    let text =
        config_text(dir.path(), "").replace("capacity = \"1Gbit\"", "capacity = \"800Mbit\"");
    let config = Config::parse(&text, |_| None).unwrap();
    let mock = Arc::new(MockBackend::new());
    let err = vqos_api::chain(&Api::start(&config, mock.clone()).err().unwrap());
    assert!(err.contains("Restored policies from"), "{err}");
    assert!(
        err.contains("Sum of minimums 900Mbit exceeds capacity 800Mbit"),
        "{err}"
    );
    assert!(mock.ports().is_empty());
}

/// A server-role vhost-user socket's owner, group and mode, given through the API, are in the
/// listing and the state file, and a restart gives them back to the switch (which re-creates
/// the socket with them). Refused: in the client role, on a TAP, an unknown user, a mode in
/// decimal.
#[test]
fn a_vhost_user_sockets_owner_group_and_mode_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = json!({"name": "vm3", "kind": "vhost-user", "socket": "/run/vqos/vm3.sock",
        "socket_owner": "root", "socket_group": 0, "socket_mode": "660"});
    let listed = {
        let d = start(dir.path());
        let (status, answer) = d.send("POST", "/v1/ports", Some(port));
        assert_eq!(status, 201, "{answer}");
        assert_eq!(
            (
                &answer["socket_owner"],
                &answer["socket_group"],
                &answer["socket_mode"]
            ),
            (&json!("root"), &json!(0), &json!("0660"))
        );
        let saved: Value =
            serde_json::from_str(&fs::read_to_string(&d.state_file).unwrap()).unwrap();
        let vm3 = &saved["ports"][2];
        assert_eq!(
            (
                &vm3["socket_owner"],
                &vm3["socket_group"],
                &vm3["socket_mode"]
            ),
            (&json!("root"), &json!(0), &json!("0660")),
            "{saved}"
        );
        for (body, error) in [
            (
                json!({"name": "vm4", "kind": "vhost-user", "socket": "/s.sock", "mode": "client",
                    "socket_owner": "root"}),
                "Port 'vm4': socket_owner, socket_group and socket_mode are for the server role",
            ),
            (
                json!({"name": "vm4", "socket_mode": "0600"}),
                "are for kind = \"vhost-user\"",
            ),
            (
                json!({"name": "vm4", "kind": "vhost-user", "socket": "/s.sock",
                    "socket_owner": "no-such-user-vq"}),
                "Port 'vm4': socket_owner: no user 'no-such-user-vq' on this host",
            ),
            (
                json!({"name": "vm4", "kind": "vhost-user", "socket": "/s.sock",
                    "socket_mode": 660}),
                "write the permission bits as an octal string",
            ),
        ] {
            let (status, answer) = d.send("POST", "/v1/ports", Some(body.clone()));
            assert!(
                (400..500).contains(&status) && answer["error"].as_str().unwrap().contains(error),
                "{body}: {status} {answer}"
            );
        }
        d.get("/v1/ports")
    };
    let d = start(dir.path());
    assert_eq!(d.get("/v1/ports"), listed);
    let (p, _) = d.mock.ports().pop().unwrap();
    let c = &p.config;
    assert_eq!(
        serde_json::to_value((&c.socket_owner, &c.socket_group, c.socket_mode)).unwrap(),
        json!(["root", 0, "0660"])
    );
}

/// The id of each port `GET /v1/ports` lists, by name.
fn ids(d: &Daemon) -> Vec<(String, u64)> {
    let ports = d.get("/v1/ports");
    (ports.as_array().unwrap().iter())
        .map(|p| {
            let id = p["id"].as_u64().unwrap_or_else(|| panic!("no id: {p}"));
            (p["name"].as_str().unwrap().to_string(), id)
        })
        .collect()
}

fn named(list: &[(&str, u64)]) -> Vec<(String, u64)> {
    list.iter().map(|(n, i)| (n.to_string(), *i)).collect()
}

#[test]
fn port_ids_are_stable_across_restarts_and_never_given_twice() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = start(dir.path());
        assert_eq!(ids(&d), named(&[("vm1", 1), ("vm2", 2)]));
        let (status, body) = d.send("POST", "/v1/ports", Some(json!({"name": "vm3"})));
        assert_eq!((status, &body["id"]), (201, &json!(3)), "{body}");
        // Made again under the same name: another port, another id.
        assert_eq!(d.send("DELETE", "/v1/ports/vm3", None).0, 200);
        let (status, body) = d.send("POST", "/v1/ports", Some(json!({"name": "vm3"})));
        assert_eq!((status, &body["id"]), (201, &json!(4)), "{body}");
        // The stats name each vif's id, and none for the uplink.
        let stats = d.get("/v1/stats");
        let stat_ids: Vec<(String, Value)> = (stats["ports"].as_array().unwrap().iter())
            .map(|p| (p["name"].as_str().unwrap().to_string(), p["id"].clone()))
            .collect();
        assert!(stat_ids.contains(&("vm3".into(), json!(4))), "{stat_ids:?}");
        assert!(
            !stat_ids.iter().any(|(_, id)| *id == json!(3)),
            "{stat_ids:?}"
        );
        // The highest id given is deleted before the restart: it is not given again after.
        assert_eq!(d.send("DELETE", "/v1/ports/vm3", None).0, 200);
    }
    let d = start(dir.path());
    assert_eq!(ids(&d), named(&[("vm1", 1), ("vm2", 2)]));
    let (status, body) = d.send("POST", "/v1/ports", Some(json!({"name": "vm3"})));
    assert_eq!((status, &body["id"]), (201, &json!(5)), "{body}");
}

#[test]
fn a_state_file_older_than_ids_gets_ids_above_none_and_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = start(dir.path());
        let (status, _) = d.send("POST", "/v1/ports", Some(json!({"name": "vm3"})));
        assert_eq!(status, 201);
    }
    // What an older build wrote: no ids, no next id.
    let path = dir.path().join("state/state.json");
    let mut saved: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    for p in saved["ports"].as_array_mut().unwrap() {
        p.as_object_mut()
            .unwrap()
            .remove("id")
            .expect("an id saved");
    }
    saved
        .as_object_mut()
        .unwrap()
        .remove("next_id")
        .expect("next_id saved");
    fs::write(&path, serde_json::to_vec(&saved).unwrap()).unwrap();
    let given = {
        let d = start(dir.path());
        let given = ids(&d);
        assert_eq!(given, named(&[("vm1", 1), ("vm2", 2), ("vm3", 3)]));
        given
    };
    let d = start(dir.path());
    assert_eq!(ids(&d), given);
}
