//! The agent against an etcd that authenticates its clients (docs/cluster.md, "Security"):
//! mutual TLS, authentication on, each host the etcd user its client certificate names, with
//! a role that reaches only vqos's keys. A real etcd (vqos_testkit::Etcd::start_mtls) and
//! vqosd daemons on the mock switch; skipped with a message without `etcd` or `openssl`.

mod common;

use std::path::{Path, PathBuf};

use common::cluster::{put, skip, status, LIMIT};
use common::Daemon;
use serde_json::{json, Value};
use vqos_testkit::{poll, Etcd};

/// A mock-switch vqosd as `host` with port vm1, agent of `etcd` trusting its CA, compacting
/// every second, showing the client certificate `cert` (with its key) when given one.
fn daemon(dir: &Path, host: &str, etcd: &Etcd, cert: Option<&(PathBuf, PathBuf)>) -> Daemon {
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
             [[port]]\nname = \"vm1\"\n{section}ca_file = \"{ca}\"\n{identity}",
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
