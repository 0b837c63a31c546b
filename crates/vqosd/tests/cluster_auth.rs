//! The agent against an etcd that authenticates its clients (docs/cluster.md, "Security"):
//! mutual TLS, authentication on, each host the etcd user its client certificate names, with
//! a role that reaches only vqos's keys. A real etcd (vqos_testkit::Etcd::start_mtls) and
//! vqosd daemons on the mock switch; skipped with a message without `etcd` or `openssl`.

mod common;

use std::path::{Path, PathBuf};

use common::cluster::{acme_on, put, skip, status, LIMIT};
use common::Daemon;
use serde_json::{json, Value};
use vqos_testkit::{poll, Etcd};

/// A mock-switch vqosd as `host` with port vm1, agent of `etcd` trusting its CA, compacting
/// every second, showing the client certificate `cert` (with its key) when given one.
fn daemon(dir: &Path, host: &str, etcd: &Etcd, cert: Option<&(PathBuf, PathBuf)>) -> Daemon {
    daemon_with(dir, host, etcd, cert, "")
}

/// [`daemon`] with `after` (more sections) at the end of its config.
fn daemon_with(
    dir: &Path,
    host: &str,
    etcd: &Etcd,
    cert: Option<&(PathBuf, PathBuf)>,
    after: &str,
) -> Daemon {
    let d = dir.join(host);
    std::fs::create_dir_all(&d).unwrap();
    let config = d.join("vqosd.toml");
    let socket = d.join("vqosd.sock");
    let ca = etcd.ca_file().expect("a TLS etcd");
    let identity = cert
        .map(|(c, k)| {
            format!(
                "cert_file = \"{}\"\nkey_file = \"{}\"\n",
                c.display(),
                k.display()
            )
        })
        .unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            "capacity = \"1Gbit\"\nstate_file = \"{d}/state.json\"\n[api]\nsocket = \"{s}\"\n\
             [[port]]\nname = \"vm1\"\n{section}ca_file = \"{ca}\"\n{identity}{after}",
            d = d.display(),
            s = socket.display(),
            ca = ca.display(),
            section = common::cluster::section(
                host,
                etcd,
                "period = \"100ms\"\nlease_ttl = \"2s\"\ntimeout = \"2s\"\n\
                 compact_every = \"1s\"\n"
            ),
        ),
    )
    .unwrap();
    Daemon::start_args(&config, &socket, &["--backend", "mock"])
}

fn wait<T>(what: &str, d: &Daemon, f: impl FnMut() -> Option<T>) -> T {
    poll(LIMIT, f).unwrap_or_else(|| panic!("{what}; vqosd log:\n{}", d.log()))
}

/// The cluster part of `d`'s health once it reports an error.
fn failed(what: &str, d: &Daemon) -> Value {
    wait(what, d, || {
        let h = d.get("/v1/health");
        h["cluster"]["error"]
            .is_string()
            .then(|| h["cluster"].clone())
    })
}

/// Issue 24, item 4: mutual TLS and etcd authentication were configurable but never tested.
/// etcd asks every client for a certificate of its CA, and authentication is on. Host h1 is
/// etcd user `h1` by its certificate's CN, with role `vqos-host`: read under `/vqos/v1/`,
/// write only the agents' keys (status, grants, raises: the recipe of docs/cluster.md). Its
/// agent applies its policy, publishes its status and its grant, and compacts etcd under
/// that role, which keeps it off the operator's keys. An agent with no certificate is
/// refused at the handshake, and one whose user has no role gets "permission denied". Neither
/// writes a status, and each says why in its health.
#[test]
fn an_agent_with_a_client_certificate_works_under_a_role_limited_to_vqos_keys() {
    let name = "an_agent_with_a_client_certificate_works_under_a_role_limited_to_vqos_keys";
    if skip(name) {
        return;
    }
    if let Some(why) = vqos_testkit::openssl_missing() {
        println!("SKIP {name}: {why}");
        return;
    }
    let etcd = Etcd::start_mtls(6);
    for args in [
        &["role", "add", "vqos-host"][..],
        &[
            "role",
            "grant-permission",
            "vqos-host",
            "--prefix=true",
            "read",
            "/vqos/v1/",
        ],
        &[
            "role",
            "grant-permission",
            "vqos-host",
            "--prefix=true",
            "readwrite",
            "/vqos/v1/status/",
        ],
        &[
            "role",
            "grant-permission",
            "vqos-host",
            "--prefix=true",
            "readwrite",
            "/vqos/v1/grants/",
        ],
        &[
            "role",
            "grant-permission",
            "vqos-host",
            "--prefix=true",
            "readwrite",
            "/vqos/v1/raises/",
        ],
        &["user", "add", "h1", "--no-password"],
        &["user", "grant-role", "h1", "vqos-host"],
        &["user", "add", "h3", "--no-password"],
    ] {
        etcd.ctl(args);
    }
    put(&etcd, "/vqos/v1/tenants/acme", json!({"max": "100Mbit"}));
    put(
        &etcd,
        "/vqos/v1/hosts/h1/vifs/vm1",
        json!({"weight": 7, "tenant": "acme"}),
    );
    put(&etcd, "/vqos/v1/hosts/h3/vifs/vm1", json!({"weight": 9}));
    let dir = tempfile::tempdir().unwrap();

    let h1_cert = etcd.client_cert("h1");
    let h1 = daemon(dir.path(), "h1", &etcd, Some(&h1_cert));
    wait("h1's policy, connected", &h1, || {
        (h1.get("/v1/policies/vm1")["weight"] == 7
            && h1.get("/v1/health")["cluster"]["state"] == "connected")
            .then_some(())
    });
    wait("h1's status", &h1, || {
        status(&etcd, "h1").filter(|s| s["vifs"]["vm1"]["weight"] == 7)
    });
    wait("h1's grant of acme", &h1, || {
        let g = etcd.ctl(&["get", "/vqos/v1/grants/acme/h1", "--print-value-only"]);
        (!g.trim().is_empty()).then_some(())
    });
    // The role keeps h1 off the operator's keys: it cannot lift acme's cap.
    let lift = etcd.ctl_as(
        &h1_cert,
        &["put", "/vqos/v1/tenants/acme", r#"{"max":"10Gbit"}"#],
    );
    assert!(
        lift.as_ref()
            .is_err_and(|e| e.contains("permission denied")),
        "{lift:?}"
    );
    // Compaction is allowed to a role that is not root.
    wait("h1 compacted", &h1, || {
        h1.log()
            .contains("Cluster agent compacted etcd to revision")
            .then_some(())
    });
    assert!(
        !h1.log().contains("compaction to"),
        "a compaction failed:\n{}",
        h1.log()
    );

    // No certificate: etcd ends the handshake.
    let h2 = daemon(dir.path(), "h2", &etcd, None);
    let c2 = failed("h2's failure in health", &h2);
    println!("no client certificate: {}", c2["error"]);
    assert_eq!(c2["state"], "connecting", "{c2}");
    let e2 = c2["error"].as_str().unwrap_or_default();
    assert!(e2.contains("needs cert_file and key_file"), "{c2}");
    assert_eq!(c2["syncs"], 0, "{c2}");

    // A certificate of the CA for a user without a role: authenticated, refused every read.
    let h3_cert = etcd.client_cert("h3");
    let h3 = daemon(dir.path(), "h3", &etcd, Some(&h3_cert));
    let c3 = failed("h3's failure in health", &h3);
    println!("a user without a role: {}", c3["error"]);
    assert!(
        c3["error"]
            .as_str()
            .is_some_and(|e| e.contains("permission denied")
                && e.contains("needs to read /vqos/v1/ and write")),
        "{c3}"
    );
    assert_eq!(c3["syncs"], 0, "{c3}");
    assert_ne!(h3.get("/v1/policies/vm1")["weight"], 9);

    assert!(status(&etcd, "h2").is_none());
    assert!(status(&etcd, "h3").is_none());
}

/// Runs `etcdctl` as root for each of `commands` (words split on spaces).
fn ctl_all(etcd: &Etcd, commands: &[&str]) {
    for c in commands {
        etcd.ctl(&c.split(' ').collect::<Vec<_>>());
    }
}

/// Issue 24, item 4: a role per host that can write only its own keys. On the aggregators a
/// host writes one key of its own, its status; a candidate also stands for election under
/// `/vqos/v1/aggregators/`. So each host gets a role of its own (docs/cluster.md, "A role per
/// host"): read `/vqos/v1/`, write its status key, and for a candidate the election prefix.
/// Under those roles h1 leads, h2 is granted its share by it, both write their statuses, and
/// the two shares stay within acme's max; h2 cannot write h1's status, stand for election or
/// lift acme's cap. A candidate whose role lacks the election prefix never leads and says why,
/// until its role is given the prefix: then it stands behind h1 and the problem goes.
#[test]
fn on_the_aggregators_each_host_writes_only_its_own_keys() {
    let name = "on_the_aggregators_each_host_writes_only_its_own_keys";
    if skip(name) {
        return;
    }
    if let Some(why) = vqos_testkit::openssl_missing() {
        println!("SKIP {name}: {why}");
        return;
    }
    let etcd = Etcd::start_mtls(7);
    ctl_all(
        &etcd,
        &[
            "role add vqos-h1",
            "role grant-permission vqos-h1 --prefix=true read /vqos/v1/",
            "role grant-permission vqos-h1 readwrite /vqos/v1/status/h1",
            "role grant-permission vqos-h1 --prefix=true readwrite /vqos/v1/aggregators/",
            "role add vqos-h2",
            "role grant-permission vqos-h2 --prefix=true read /vqos/v1/",
            "role grant-permission vqos-h2 readwrite /vqos/v1/status/h2",
            "role add vqos-h3",
            "role grant-permission vqos-h3 --prefix=true read /vqos/v1/",
            "role grant-permission vqos-h3 readwrite /vqos/v1/status/h3",
            "user add h1 --no-password",
            "user grant-role h1 vqos-h1",
            "user add h2 --no-password",
            "user grant-role h2 vqos-h2",
            "user add h3 --no-password",
            "user grant-role h3 vqos-h3",
        ],
    );
    acme_on(&etcd, &["h1", "h2"]);
    let dir = tempfile::tempdir().unwrap();
    let candidate = "[cluster.aggregators]\nshards = 1\nlisten = \"127.0.0.1:0\"\n";
    let host_only = "[cluster.aggregators]\nshards = 1\n";
    let (h1_cert, h2_cert) = (etcd.client_cert("h1"), etcd.client_cert("h2"));
    let h1 = daemon_with(dir.path(), "h1", &etcd, Some(&h1_cert), candidate);
    let h2 = daemon_with(dir.path(), "h2", &etcd, Some(&h2_cert), host_only);
    let max = |d: &Daemon| d.get("/v1/policies/vm1")["enforced"]["max_bps"].as_u64();
    let both = wait("both shares, from h1's aggregator", &h2, || {
        Some(max(&h1)? + max(&h2)?)
    });
    assert!(both <= 100_000_000, "{both} held under a max of 100 Mbit/s");
    for (h, d) in [("h1", &h1), ("h2", &h2)] {
        wait(&format!("{h}'s status"), d, || status(&etcd, h));
    }
    // h2's role: its own status only.
    for (what, args) in [
        ("h1's status", &["put", "/vqos/v1/status/h1", "{}"][..]),
        (
            "an election key",
            &["put", "/vqos/v1/aggregators/0/x", "y"][..],
        ),
        (
            "acme's cap",
            &["put", "/vqos/v1/tenants/acme", r#"{"max":"10Gbit"}"#][..],
        ),
    ] {
        let r = etcd.ctl_as(&h2_cert, args);
        assert!(
            r.as_ref().is_err_and(|e| e.contains("permission denied")),
            "h2 wrote {what}: {r:?}"
        );
    }

    // A candidate whose role does not reach the election prefix: it never leads, and says
    // what its user needs.
    let h3 = daemon_with(
        dir.path(),
        "h3",
        &etcd,
        Some(&etcd.client_cert("h3")),
        candidate,
    );
    let problem = wait("h3's election problem in health", &h3, || {
        let h = h3.get("/v1/health");
        let text = h.to_string();
        text.contains("permission denied").then_some(text)
    });
    println!("a candidate without the election prefix: {problem}");
    assert!(problem.contains("/vqos/v1/aggregators/"), "{problem}");
    // Given the prefix, h3 stands, waits behind h1, and the problem is gone from its health.
    etcd.ctl(&[
        "role",
        "grant-permission",
        "vqos-h3",
        "--prefix=true",
        "readwrite",
        "/vqos/v1/aggregators/",
    ]);
    wait("h3's problem gone once it may stand", &h3, || {
        let h = h3.get("/v1/health");
        // (An empty list is left out of the JSON.)
        let none = h["cluster"]["problems"]
            .as_array()
            .is_none_or(Vec::is_empty);
        (none && h["cluster"]["state"] == "connected").then_some(())
    });
    assert!(
        max(&h1).is_some() && max(&h2).is_some(),
        "h1 still leads: {}",
        h1.log()
    );
}
