//! `vqos cluster` against a real etcd (vqos_testkit::Etcd; SKIP without the `etcd` binary),
//! with a vqosd agent on the mock switch in this process: a policy set with the CLI shows in
//! that host's `vqos policy get`, and `vqos cluster status` reads what the agent publishes.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use vqos_testkit::{etcd_missing, poll, Etcd};
use vqosd::api::Api;
use vqosd::backend::MockBackend;
use vqosd::config::Config;
use vqosd::server::{Server, ServerConfig};

/// Runs `vqos` with `VQOS_ETCD_ENDPOINTS` = `endpoints`: status, stdout as JSON (Null if not
/// JSON), stdout and stderr as text.
fn vqos(endpoints: Option<&str>, args: &[&str]) -> (i32, Value, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vqos"));
    cmd.args(args)
        .env_remove("VQOS_SOCKET")
        .env_remove("VQOS_ETCD_ENDPOINTS");
    if let Some(e) = endpoints {
        cmd.env("VQOS_ETCD_ENDPOINTS", e);
    }
    let out = cmd.output().expect("run vqos");
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// vqosd's API and server on the mock switch as host `h1` (port vm3), with its etcd agent.
fn agent(dir: &Path, url: &str) -> (Server, vqosd::cluster::Agent, String) {
    let text = format!(
        "capacity = \"1Gbit\"\nstate_file = \"{0}/state.json\"\n[api]\nsocket = \"{0}/s.sock\"\n\
         [[port]]\nname = \"vm3\"\n[cluster]\nhost = \"h1\"\nendpoints = [\"{url}\"]\n\
         period = \"100ms\"\nlease_ttl = \"2s\"\ntimeout = \"500ms\"\n",
        dir.display()
    );
    let config = Config::parse(&text, |_| None).unwrap();
    let api = Arc::new(Api::start(&config, Arc::new(MockBackend::new())).unwrap());
    let server = Server::start(&ServerConfig::from_config(&config), api.clone()).unwrap();
    let agent = vqosd::cluster::spawn(config.cluster.clone().unwrap(), api).unwrap();
    (
        server,
        agent,
        config.socket_path.to_str().unwrap().to_string(),
    )
}

#[test]
fn usage_and_unreachable_etcd_have_their_exit_statuses() {
    let (code, _, out) = vqos(None, &["cluster", "status"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("VQOS_ETCD_ENDPOINTS"), "{out}");
    let ep = Some("http://127.0.0.1:1");
    for (args, needle) in [
        (
            vec!["vif", "set", "h1vm3", "--weight", "2"],
            "not HOST/PORT",
        ),
        (vec!["vif", "set", "h1/vm3", "--max", "fast"], "--max"),
        (
            vec!["vif", "set", "h1/vm3", "--priority", "9"],
            "--priority 9",
        ),
        (
            vec!["tenant", "set", "a/b", "--max", "1Gbit"],
            "Invalid tenant name",
        ),
    ] {
        let mut all = vec!["cluster"];
        all.extend(args);
        let (code, _, out) = vqos(ep, &all);
        assert_eq!(code, 2, "{all:?}: {out}");
        assert!(out.contains(needle), "{all:?}: {out}");
    }
    let (code, _, out) = vqos(Some("127.0.0.1:2379"), &["cluster", "status"]);
    assert_eq!(code, 2, "{out}");
    // Nothing listens on port 1: unreachable, 3.
    let (code, _, out) = vqos(ep, &["cluster", "status", "--json"]);
    assert_eq!(code, 3, "{out}");
}

#[test]
fn a_policy_set_with_the_cli_reaches_the_hosts_api_and_status_reports_it() {
    if let Some(why) = etcd_missing() {
        println!(
            "SKIP a_policy_set_with_the_cli_reaches_the_hosts_api_and_status_reports_it: {why}"
        );
        return;
    }
    let etcd = Etcd::start(0);
    let url = etcd.url();
    let ep = Some(url.as_str());
    let dir = tempfile::tempdir().unwrap();
    let (_server, _agent, sock) = agent(dir.path(), &url);

    let (code, v, out) = vqos(
        ep,
        &[
            "cluster", "tenant", "set", "acme", "--max", "1Gbit", "--min", "200Mbit", "--json",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(v["key"], "/vqos/v1/tenants/acme");
    assert_eq!(v["value"]["max"], "1Gbit");
    // A tenant whose min would be above its max is refused before anything is written.
    let (code, _, out) = vqos(ep, &["cluster", "tenant", "set", "acme", "--min", "2Gbit"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("above its max"), "{out}");

    // --endpoints before or after the subcommand, instead of the environment.
    let set = [
        "cluster",
        "--endpoints",
        &url,
        "vif",
        "set",
        "h1/vm3",
        "--tenant",
        "acme",
        "--weight",
        "2",
        "--max",
        "300Mbit",
        "--json",
    ];
    let (code, v, out) = vqos(None, &set);
    assert_eq!(code, 0, "{out}");
    assert_eq!(v["value"]["tenant"], "acme");
    // The host's API has it within a second or two.
    let policy = poll(Duration::from_secs(5), || {
        let (_, p, _) = vqos(None, &["--socket", &sock, "policy", "get", "vm3", "--json"]);
        (p["weight"] == 2 && p["max_bps"] == 300_000_000).then_some(p)
    });
    assert!(policy.is_some(), "the policy never reached vm3");
    // Options left out keep their value.
    let (code, v, out) = vqos(
        None,
        &[
            "cluster",
            "vif",
            "set",
            "h1/vm3",
            "--max",
            "250Mbit",
            "--json",
            "--endpoints",
            &url,
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        (v["value"]["weight"].as_u64(), v["value"]["max"].as_str()),
        (Some(2), Some("250Mbit"))
    );

    // Status: the host's vif with its share (alone in the tenant: its own max, 250 Mbit/s).
    let status = poll(Duration::from_secs(10), || {
        let (code, v, _) = vqos(ep, &["cluster", "status", "--json"]);
        (code == 0 && v["hosts"]["h1"]["vifs"]["vm3"]["share_max_bps"] == 250_000_000).then_some(v)
    })
    .expect("status with vm3's share");
    assert_eq!(status["tenants"]["acme"]["vifs"][0], "h1/vm3");
    assert_eq!(status["tenants"]["acme"]["policy"]["min"], "200Mbit");
    let (code, _, table) = vqos(ep, &["cluster", "status"]);
    assert_eq!(code, 0, "{table}");
    assert!(
        table.contains("h1") && table.contains("vm3") && table.contains("acme"),
        "{table}"
    );

    // Issue 24, item 5: one tenant's view, and the hosts that say little. h8's status is old
    // (written at the epoch); h9 has no status but still holds a grant of acme.
    etcd.ctl(&[
        "put",
        "/vqos/v1/status/h8",
        r#"{"health":"ok","updated_unix_ms":0,"period_ms":100,"vifs":{"vm1":{"tenant":"other","weight":1,"min_bps":0,"max_bps":null,"rate_bps":0,"demand_bps":0}}}"#,
    ]);
    etcd.ctl(&[
        "put",
        "/vqos/v1/grants/acme/h9",
        r#"{"epoch":1,"max_bps":1}"#,
    ]);
    let (code, v, out) = vqos(ep, &["cluster", "status", "--tenant", "acme", "--json"]);
    assert_eq!(code, 0, "{out}");
    let tenants: Vec<&String> = v["tenants"].as_object().unwrap().keys().collect();
    assert_eq!(tenants, ["acme"], "{v}");
    assert!(v["hosts"].get("h8").is_none(), "h8 has no vif of acme: {v}");
    assert_eq!(v["dead"][0]["host"], "h9", "{v}");
    assert_eq!(v["dead"][0]["grants"][0], "acme", "{v}");
    let (_, v, _) = vqos(ep, &["cluster", "status", "--json"]);
    assert_eq!(v["stale"][0]["host"], "h8", "{v}");
    assert!(v["stale"][0]["age_ms"].as_u64() > Some(1_000_000), "{v}");
    let (code, _, table) = vqos(ep, &["cluster", "status"]);
    assert_eq!(code, 0, "{table}");
    assert!(table.contains("stale: h8 (its status is"), "{table}");
    assert!(
        table.contains("dead: h9 (no status; it still holds a grant of acme)"),
        "{table}"
    );
    let (code, _, out) = vqos(ep, &["cluster", "status", "--tenant", "nope"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("No tenant 'nope'"), "{out}");
    let (code, _, out) = vqos(ep, &["cluster", "status", "--tenant", "a/b"]);
    assert_eq!(code, 2, "{out}");
    etcd.ctl(&["del", "/vqos/v1/status/h8"]);
    etcd.ctl(&["del", "/vqos/v1/grants/acme/h9"]);

    // Deleting the key hands vm3 back to the local API.
    let (code, v, out) = vqos(ep, &["cluster", "vif", "del", "h1/vm3", "--json"]);
    assert_eq!(
        (code, v["deleted"].as_str()),
        (0, Some("/vqos/v1/hosts/h1/vifs/vm3")),
        "{out}"
    );
    let back = poll(Duration::from_secs(5), || {
        let (code, _, _) = vqos(
            None,
            &["--socket", &sock, "policy", "set", "vm3", "--weight", "1"],
        );
        (code == 0).then_some(())
    });
    assert!(back.is_some(), "vm3 stayed managed");
    let (code, _, out) = vqos(ep, &["cluster", "vif", "del", "h1/vm3"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("No key"), "{out}");
}

#[test]
fn simulate_needs_no_etcd_and_reports_convergence_and_traffic() {
    let args = [
        "cluster",
        "simulate",
        "--hosts",
        "20",
        "--vifs",
        "200",
        "--tenants",
        "5",
        "--periods",
        "10",
        "--cost-hosts",
        "2",
        "--json",
    ];
    let (code, v, out) = vqos(None, &args);
    assert_eq!(code, 0, "{out}");
    let r = &v["report"];
    assert_eq!(r["config"]["hosts"], 20);
    assert!(r["start_periods"].as_u64().is_some_and(|p| p <= 4), "{r}");
    assert!(r["shift_periods"].as_u64().is_some_and(|p| p <= 4), "{r}");
    assert_eq!(r["traffic"]["keys_written"], 20);
    assert_eq!(v["agent_cost"]["hosts_measured"], 2);
    // The same seed, the same report (the measured cost aside).
    let (_, again, _) = vqos(None, &args);
    assert_eq!(again["report"], v["report"]);
    // Asynchrony, a partition, a fixed seed: never above a tenant's max with the grants.
    let mut with_async = args.to_vec();
    with_async.extend(["--asynchrony", "--partitioned", "2", "--seed", "3"]);
    let (code, v, out) = vqos(None, &with_async);
    assert_eq!(code, 0, "{out}");
    assert_eq!(v["asynchrony"]["max_excess_bps"], 0, "{}", v["asynchrony"]);
    assert!(v["asynchrony"]["raises_committed"].as_u64() > Some(0));
    assert!(
        v["asynchrony_without_grants"]["max_excess_bps"].as_u64() > Some(0),
        "{}",
        v["asynchrony_without_grants"]
    );
    // The aggregators' design: hosts report to shard leaders through a lossy network, one
    // host is cut off, a leader crashes; never above a tenant's max either.
    let mut agg = args.to_vec();
    agg.extend([
        "--aggregators",
        "--shards",
        "2",
        "--loss",
        "5",
        "--seed",
        "3",
    ]);
    let (code, v, out) = vqos(None, &agg);
    assert_eq!(code, 0, "{out}");
    let a = &v["aggregators"];
    assert_eq!(a["max_excess_bps"], 0, "{a}");
    assert_eq!(a["config"]["shards"], 2, "{a}");
    assert!(a["messages_per_period"].as_f64() > Some(0.0), "{a}");
    assert!(a["failover_periods"].as_u64().is_some(), "{a}");
    let (code, _, out) = vqos(
        None,
        &["cluster", "simulate", "--aggregators", "--tick-ms", "7"],
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--tick-ms must divide"), "{out}");
    let (code, _, out) = vqos(None, &["cluster", "simulate", "--shift", "1.5"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("shift must be 0 to 1"), "{out}");
    let (code, _, out) = vqos(None, &["cluster", "simulate", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--hosts"), "{out}");
}

/// Issue 24, item 4: the CLI could not show a client certificate, so it could not reach an
/// etcd with mutual TLS. Without one it exits 3 and says what to give; with `--cert-file` and
/// `--key-file` of user `ops` (role: read and write under `/vqos/v1/`) it sets a tenant.
#[test]
fn the_cli_shows_a_client_certificate_to_an_etcd_that_asks_for_one() {
    let name = "the_cli_shows_a_client_certificate_to_an_etcd_that_asks_for_one";
    if let Some(why) = etcd_missing().or_else(vqos_testkit::openssl_missing) {
        println!("SKIP {name}: {why}");
        return;
    }
    let etcd = Etcd::start_mtls(1);
    for args in [
        &["role", "add", "ops"][..],
        &[
            "role",
            "grant-permission",
            "ops",
            "--prefix=true",
            "readwrite",
            "/vqos/v1/",
        ],
        &["user", "add", "ops", "--no-password"],
        &["user", "grant-role", "ops", "ops"],
    ] {
        etcd.ctl(args);
    }
    let (cert, key) = etcd.client_cert("ops");
    let ca = etcd.ca_file().unwrap();
    let (ca, cert, key) = (
        ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    let set = ["tenant", "set", "acme", "--max", "1Gbit"];
    let url = etcd.url();

    let mut args = vec!["cluster", "--ca-file", ca];
    args.extend(set);
    let (code, _, out) = vqos(Some(&url), &args);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("--cert-file and --key-file"), "{out}");

    let mut half = vec!["cluster", "--ca-file", ca, "--cert-file", cert];
    half.extend(set);
    let (code, _, out) = vqos(Some(&url), &half);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("cert_file and key_file go together"), "{out}");

    let mut args = vec![
        "cluster",
        "--ca-file",
        ca,
        "--cert-file",
        cert,
        "--key-file",
        key,
    ];
    args.extend(set);
    let (code, _, out) = vqos(Some(&url), &args);
    assert_eq!(code, 0, "{out}");
    let doc = etcd.ctl(&["get", "/vqos/v1/tenants/acme", "--print-value-only"]);
    assert!(doc.contains("1Gbit"), "{doc}");
}

/// `vqos cluster status --tenant T --shards N` on agents of the aggregators: the etcd view,
/// then what the tenant's shard leader knows (its term, each declared host's target and what
/// it counts), as a table and as JSON; `--shards` alone is a usage error.
#[test]
fn status_shows_what_the_tenants_shard_leader_knows() {
    if let Some(why) = etcd_missing() {
        println!("SKIP status_shows_what_the_tenants_shard_leader_knows: {why}");
        return;
    }
    let etcd = Etcd::start(2);
    let url = etcd.url();
    let ep = Some(url.as_str());
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "capacity = \"1Gbit\"\nstate_file = \"{0}/state.json\"\n[api]\nsocket = \"{0}/s.sock\"\n\
         [[port]]\nname = \"vm3\"\n[cluster]\nhost = \"h1\"\nendpoints = [\"{url}\"]\n\
         period = \"100ms\"\nlease_ttl = \"2s\"\ntimeout = \"500ms\"\n\
         [cluster.aggregators]\nshards = 2\nlisten = \"127.0.0.1:0\"\n",
        dir.path().display()
    );
    let config = Config::parse(&text, |_| None).unwrap();
    let api = Arc::new(Api::start(&config, Arc::new(MockBackend::new())).unwrap());
    let _agent = vqosd::cluster::spawn(config.cluster.clone().unwrap(), api).unwrap();
    let (code, _, out) = vqos(ep, &["cluster", "tenant", "set", "acme", "--max", "1Gbit"]);
    assert_eq!(code, 0, "{out}");
    let (code, _, out) = vqos(ep, &["cluster", "vif", "set", "h1/vm3", "--tenant", "acme"]);
    assert_eq!(code, 0, "{out}");
    let args = ["cluster", "status", "--tenant", "acme", "--shards", "2"];
    let json: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
    let v = poll(Duration::from_secs(20), || {
        let (code, v, _) = vqos(ep, &json);
        let counted = v["leader"]["hosts"][0]["counted_max_bps"].as_u64();
        (code == 0 && counted.is_some()).then_some(v)
    })
    .expect("the leader's view");
    let l = &v["leader"];
    assert_eq!(
        (l["term"].as_u64(), l["hosts"][0]["host"].as_str()),
        (Some(1), Some("h1"))
    );
    assert!(
        l["hosts"][0]["counted_max_bps"].as_u64().unwrap() <= 1_000_000_000,
        "{v}"
    );
    let (code, _, out) = vqos(ep, &args);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("leader of shard") && out.contains("COUNTED-MAX"),
        "{out}"
    );
    let (code, _, out) = vqos(ep, &["cluster", "status", "--shards", "2"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--tenant"), "{out}");
}
