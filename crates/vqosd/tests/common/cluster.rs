//! Shared by the cluster tests: etcd keys through `etcdctl`, the agent's config section, and
//! the rates of vifs on several hosts over one common window.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vqos_testkit::{etcd_missing, Etcd};

use super::{counter, Daemon};

/// How long a cluster test waits for the agents to show a change.
pub const LIMIT: Duration = Duration::from_secs(15);

/// True, after printing why, when there is no etcd to test against.
pub fn skip(test: &str) -> bool {
    match etcd_missing() {
        Some(why) => {
            println!("SKIP {test}: {why}");
            true
        }
        None => false,
    }
}

/// A mock-switch vqosd as `host` with port vm1, in `dir/<host>/`: an agent of `etcd` with
/// `cluster` more `[cluster]` lines, and `after` (more sections) at the end of its config.
pub fn mock_daemon(
    dir: &std::path::Path,
    host: &str,
    etcd: &Etcd,
    cluster: &str,
    after: &str,
) -> Daemon {
    let d = dir.join(host);
    std::fs::create_dir_all(&d).unwrap();
    let config = d.join("vqosd.toml");
    let socket = d.join("vqosd.sock");
    std::fs::write(
        &config,
        format!(
            "capacity = \"1Gbit\"\nstate_file = \"{d}/state.json\"\n[api]\nsocket = \"{s}\"\n\
             [[port]]\nname = \"vm1\"\n{section}{after}",
            d = d.display(),
            s = socket.display(),
            section = section(host, etcd, cluster),
        ),
    )
    .unwrap();
    Daemon::start_args(&config, &socket, &["--backend", "mock"])
}

/// Writes `value` (JSON) at `key`.
pub fn put(etcd: &Etcd, key: &str, value: Value) {
    etcd.ctl(&["put", key, &value.to_string()]);
}

/// Tenant acme with a max of 100 Mbit/s, and vm1 of each of `hosts` in it.
pub fn acme_on(etcd: &Etcd, hosts: &[&str]) {
    put(etcd, "/vqos/v1/tenants/acme", json!({"max": "100Mbit"}));
    for h in hosts {
        let key = format!("/vqos/v1/hosts/{h}/vifs/vm1");
        put(etcd, &key, json!({"tenant": "acme"}));
    }
}

/// The status key of `host`, if there is one.
pub fn status(etcd: &Etcd, host: &str) -> Option<Value> {
    let out = etcd.ctl(&[
        "get",
        &format!("/vqos/v1/status/{host}"),
        "--print-value-only",
    ]);
    serde_json::from_str(out.trim()).ok()
}

/// Every host's status key, by host, read at one revision.
pub fn statuses(etcd: &Etcd) -> BTreeMap<String, Value> {
    let out = etcd.ctl(&["get", "--prefix", "/vqos/v1/status/"]);
    let lines: Vec<&str> = out.lines().collect();
    lines
        .chunks(2)
        .filter_map(|kv| {
            let host = kv.first()?.strip_prefix("/vqos/v1/status/")?;
            Some((host.to_string(), serde_json::from_str(kv.get(1)?).ok()?))
        })
        .collect()
}

/// A `[cluster]` section for `host` on `etcd`, with `more` lines (e.g. `period = "250ms"`).
pub fn section(host: &str, etcd: &Etcd, more: &str) -> String {
    format!(
        "[cluster]\nhost = \"{host}\"\nendpoints = [\"{}\"]\n{more}",
        etcd.url()
    )
}

/// The rates (Mbit/s, L2 as the switch counts them) at which the vifs `(daemon, port)` sent
/// into their switches over about `secs`: what each switch admitted, since a vif the engine
/// refuses is not read (its frames wait in its TAP). Every daemon's `/v1/stats` is read at the
/// start and at the end (a few ms apart; the stats are published every 25 ms).
pub fn rx_mbit(vifs: &[(&Daemon, &str)], secs: f64) -> Vec<f64> {
    let read = || -> Vec<u64> {
        vifs.iter()
            .map(|(d, port)| counter(&d.get("/v1/stats"), port, "rx_bytes"))
            .collect()
    };
    let a = read();
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let b = read();
    let dt = t.elapsed().as_secs_f64();
    a.iter()
        .zip(b)
        .map(|(a, b)| (b - a) as f64 * 8.0 / dt / 1e6)
        .collect()
}
