//! The control commands' unit tests.

use super::*;
use clap::Parser;
use serde_json::Value;
use std::sync::Arc;
use vqos_api::stats::PortStats;
use vqos_api::wire::{Account, FileMode, PortKind, VhostUserRole};
use vqosd::api::Api;
use vqosd::backend::MockBackend;
use vqosd::config::Config;
use vqosd::server::{Server, ServerConfig};

/// A daemon on the mock switch in a temp dir, and a client of it.
fn daemon(dir: &std::path::Path) -> (Server, Arc<MockBackend>, Client) {
    let text = format!(
        "capacity = \"1Gbit\"\nstate_file = \"{0}/state.json\"\n[api]\nsocket = \"{0}/s.sock\"\n\
         [uplink]\nname = \"up0\"\n[[port]]\nname = \"vm1\"\n\
         [[port]]\nname = \"vm2\"\npolicy = {{ weight = 2, max = \"500Mbit\" }}\n",
        dir.display()
    );
    let config = Config::parse(&text, |_| None).unwrap();
    let mock = Arc::new(MockBackend::new());
    let api = Arc::new(Api::start(&config, mock.clone()).unwrap());
    let server = Server::start(&ServerConfig::from_config(&config), api).unwrap();
    let client = Client::new(vqos_api::client::Endpoint::Unix(config.socket_path));
    (server, mock, client)
}

#[derive(Parser)]
struct T {
    #[command(subcommand)]
    c: TCmd,
}

#[derive(clap::Subcommand)]
enum TCmd {
    Port(PortArgs),
    Policy(PolicyArgs),
}

/// Parses and runs a `port`/`policy` command line, returning its output or its error.
fn run(c: &Client, line: &str) -> Result<String> {
    let t = T::try_parse_from(std::iter::once("vqos").chain(line.split_whitespace()))?;
    let mut out = Vec::new();
    match t.c {
        TCmd::Port(a) => port_to(c, a, &mut out)?,
        TCmd::Policy(a) => policy_to(c, a, &mut out)?,
    }
    Ok(String::from_utf8(out).unwrap())
}

#[test]
fn port_and_policy_commands_against_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mock, c) = daemon(dir.path());
    let list = run(&c, "port list").unwrap();
    assert!(list.lines().next().unwrap().starts_with("PORT"));
    assert!(list.contains("vm2") && list.contains("500Mbit"), "{list}");

    let out = run(
        &c,
        "port add vm3 --attach --weight 3 --max 200Mbit --mac 02:00:00:00:00:03",
    )
    .unwrap();
    assert_eq!(
        out,
        "Attached port vm3: weight 3, min 0bit, max 200Mbit, priority 7\n"
    );
    let (p, pol) = mock.ports().pop().unwrap();
    assert!(!p.config.create);
    assert_eq!(p.config.macs[0].to_string(), "02:00:00:00:00:03");
    assert_eq!(pol.max_bps, Some(200_000_000));

    let out = run(&c, "policy set vm1 --min 200Mbit --priority 1").unwrap();
    assert_eq!(
        out,
        "vm1: weight 1, min 200Mbit, max unlimited, priority 1\n"
    );
    let out = run(&c, "policy get vm1").unwrap();
    assert_eq!(
        out,
        "vm1: weight 1, min 200Mbit, max unlimited, priority 1\n"
    );
    let json: Value = serde_json::from_str(&run(&c, "policy get vm1 --json").unwrap()).unwrap();
    assert_eq!(json["min_bps"], 200_000_000);

    // The daemon's refusals come back as its message.
    let e = run(&c, "policy set vm1 --min 1100Mbit").unwrap_err();
    assert_eq!(
        e.to_string(),
        "Sum of minimums 1.1Gbit exceeds capacity 1Gbit"
    );
    let e = run(&c, "policy set nope --weight 2").unwrap_err();
    assert_eq!(e.to_string(), "Unknown vif 'nope'");
    // Before: sent, and refused by the daemon (exit 4).
    let e = run(&c, "policy set vm1 --weight 0").unwrap_err();
    assert_eq!(e.to_string(), "--weight must be greater than 0");
    assert_eq!(crate::exit::status(&e), crate::exit::USAGE);
    // Checked before anything is sent.
    let e = run(&c, "policy set vm1").unwrap_err();
    assert!(e.to_string().starts_with("Nothing to set"));
    let e = run(&c, "policy set vm1 --max 5Mbyte").unwrap_err();
    assert!(format!("{e:#}").contains("Invalid rate '5Mbyte'"), "{e:#}");
    // Burst and the two maxima: set, shown, and reset.
    let out = run(
        &c,
        "policy set vm1 --burst 64KiB --max-in 100Mbit --max-out 200Mbit",
    )
    .unwrap();
    assert_eq!(
        out,
        "vm1: weight 1, min 200Mbit, max 200Mbit, priority 1, max_in 100Mbit, burst 64KiB\n"
    );
    // The switch got them.
    let (_, pol) = mock
        .ports()
        .into_iter()
        .find(|(p, _)| p.config.name == "vm1")
        .unwrap();
    assert_eq!(
        (pol.burst_bytes, pol.max_in_bps, pol.max_bps),
        (Some(65_536), Some(100_000_000), Some(200_000_000))
    );
    let json: Value = serde_json::from_str(&run(&c, "policy get vm1 --json").unwrap()).unwrap();
    assert_eq!(
        (&json["burst_bytes"], &json["max_in_bps"], &json["max_bps"]),
        (&json!(65_536), &json!(100_000_000), &json!(200_000_000))
    );
    let out = run(&c, "policy set vm1 --max-in unlimited --burst default").unwrap();
    assert_eq!(
        out,
        "vm1: weight 1, min 200Mbit, max 200Mbit, priority 1, max_in unlimited\n"
    );
    let out = run(&c, "policy set vm1 --max-in max --max unlimited").unwrap();
    assert_eq!(
        out,
        "vm1: weight 1, min 200Mbit, max unlimited, priority 1\n"
    );
    let e = run(&c, "policy set vm1 --burst 0").unwrap_err();
    assert_eq!(e.to_string(), "--burst 0B is out of range 1B..=1GiB");
    assert_eq!(crate::exit::status(&e), crate::exit::USAGE);
    let e = run(&c, "policy set vm1 --burst 64Kbit").unwrap_err();
    assert!(format!("{e:#}").contains("Invalid size '64Kbit'"), "{e:#}");
    let e = run(&c, "policy set vm1 --max-in fast").unwrap_err();
    assert!(
        format!("{e:#}").contains("--max-in: Invalid rate 'fast'"),
        "{e:#}"
    );
    let e = run(&c, "policy set vm1 --priority 8").unwrap_err();
    assert!(e.to_string().contains("out of range"));
    let e = run(&c, "port add vm4 --mac zz").unwrap_err();
    assert!(e.to_string().contains("Invalid MAC address 'zz'"));

    // A vhost-user port: kind, socket and role reach the daemon, the listing shows them.
    let out = run(&c, "port add vm5 --vhost-user /run/vqos/vm5.sock --client").unwrap();
    assert!(out.starts_with("Added vhost-user port vm5"), "{out}");
    let (p, _) = mock.ports().pop().unwrap();
    assert_eq!(
        (p.config.kind, p.config.socket.as_deref(), p.config.mode),
        (
            PortKind::VhostUser,
            Some("/run/vqos/vm5.sock"),
            Some(VhostUserRole::Client)
        )
    );
    let list = run(&c, "port list").unwrap();
    assert!(
        list.contains("vm5") && list.contains("client /run/vqos/vm5.sock: state unknown"),
        "{list}"
    );
    let e = run(&c, "port add vm6 --client").unwrap_err();
    assert!(e.to_string().contains("--vhost-user"), "{e}");
    assert_eq!(run(&c, "port del vm5").unwrap(), "Removed port vm5\n");

    assert_eq!(run(&c, "port del vm3").unwrap(), "Removed port vm3\n");
    let e = run(&c, "port del vm3").unwrap_err();
    assert_eq!(e.to_string(), "Unknown vif 'vm3'");
}

/// A server-role vhost-user port's socket owner, group and mode: given by name or number, they
/// reach the daemon, come back in the listing; refused locally (usage, exit 2) in the client
/// role, without --vhost-user, or with a mode that is not octal; an unknown user is the
/// daemon's refusal.
#[test]
fn port_add_gives_a_vhost_user_socket_its_owner_group_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mock, c) = daemon(dir.path());
    let out = run(
        &c,
        "port add vm7 --vhost-user /run/vqos/vm7.sock --socket-owner root --socket-group 107 \
         --socket-mode 0660",
    )
    .unwrap();
    assert!(out.starts_with("Added vhost-user port vm7"), "{out}");
    let (p, _) = mock.ports().pop().unwrap();
    assert_eq!(
        (
            &p.config.socket_owner,
            &p.config.socket_group,
            p.config.socket_mode
        ),
        (
            &Some(Account::Name("root".into())),
            &Some(Account::Id(107)),
            Some(FileMode(0o660))
        )
    );
    let list = run(&c, "port list").unwrap();
    assert!(
        list.contains("server /run/vqos/vm7.sock (owner root, group 107, mode 0660): "),
        "{list}"
    );
    let json: Value = serde_json::from_str(&run(&c, "port list --json").unwrap()).unwrap();
    let vm7 = json.as_array().unwrap().iter().find(|p| p["name"] == "vm7");
    let vm7 = vm7.unwrap();
    assert_eq!(
        (
            &vm7["socket_owner"],
            &vm7["socket_group"],
            &vm7["socket_mode"]
        ),
        (&json!("root"), &json!(107), &json!("0660"))
    );
    for (line, what) in [
        (
            "port add vm8 --vhost-user /s.sock --client --socket-owner root",
            "--client",
        ),
        ("port add vm8 --socket-mode 0660", "--vhost-user"),
        (
            "port add vm8 --vhost-user /s.sock --socket-mode 0668",
            "0668",
        ),
        (
            "port add vm8 --vhost-user /s.sock --socket-owner a:b",
            "a:b",
        ),
    ] {
        let e = run(&c, line).unwrap_err();
        assert!(format!("{e:#}").contains(what), "{line}: {e:#}");
        // clap's own errors exit 2 in the binary (Cli::parse), as UsageError does.
        let usage = e.is::<clap::Error>() || crate::exit::status(&e) == crate::exit::USAGE;
        assert!(usage, "{line}: {e:#}");
    }
    let e = run(
        &c,
        "port add vm8 --vhost-user /s.sock --socket-owner no-such-user-vq",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Port 'vm8': socket_owner: no user 'no-such-user-vq' on this host"
    );
}

/// Before: `port list` showed neither max_in nor burst.
#[test]
fn port_list_shows_every_policy_field() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, _mock, c) = daemon(dir.path());
    let set = "policy set vm1 --min 200Mbit --priority 1 --burst 64KiB --max-in 100Mbit \
               --max-out 200Mbit";
    run(&c, set).unwrap();
    let list = run(&c, "port list").unwrap();
    let header: Vec<&str> = list.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["PORT", "ID", "KIND", "WEIGHT", "MIN", "MAX", "MAX_IN", "BURST", "PRIO", "MACS"]
    );
    let row = |name: &str| -> Vec<String> {
        let line = list.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().take(9).map(String::from).collect()
    };
    assert_eq!(
        row("vm1"),
        ["vm1", "1", "tap", "1", "200Mbit", "200Mbit", "100Mbit", "64KiB", "1"]
    );
    assert_eq!(
        row("vm2"),
        ["vm2", "2", "tap", "2", "0bit", "500Mbit", "max", "default", "7"]
    );
}

#[test]
fn stats_table_shows_rate_share_policy_and_drops() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mock, c) = daemon(dir.path());
    let mut drops = vqos_api::stats::DropCounters::default();
    drops[vqos_api::stats::DropReason::Spoofed] = 7;
    mock.set_port_stats(PortStats {
        name: "vm2".into(),
        rate_bps: 250_000_000,
        counters: vqos_api::stats::PortCounters {
            drops,
            ..Default::default()
        },
        throttled: true,
        ..Default::default()
    });
    let s: StatsView = c.call("GET", "/v1/stats", None).unwrap();
    let mut out = Vec::new();
    write_stats(&mut out, &s).unwrap();
    let text = String::from_utf8(out).unwrap();
    let vm2 = text.lines().find(|l| l.starts_with("vm2")).unwrap();
    let cols: Vec<&str> = vm2.split_whitespace().collect();
    assert_eq!(
        cols,
        ["vm2", "250Mbit", "25.0%", "2", "0bit", "500Mbit", "7", "7", "yes"]
    );
    assert!(text.contains("drops: vm2 spoofed=7"), "{text}");
    assert!(text.starts_with("engine vqos, capacity 1Gbit, vifs sending 250Mbit"));
}

/// With several forwarding threads the table says which vifs each reads; a vif whose
/// queues are spread is under each (a snapshot from before `readers`: its `shard` alone).
#[test]
fn stats_table_says_which_thread_reads_each_vif() {
    let served = include_str!("../../../vqos-api/tests/data/stats-v1.json");
    let mut s: StatsView = serde_json::from_str(served).unwrap();
    let mut out = Vec::new();
    write_stats(&mut out, &s).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.ends_with("threads: loop0 reads vm2; loop1 reads vm1\n"),
        "{text}"
    );
    s.ports[1].stats.readers = vec![1, 0];
    s.ports[2].stats.readers = vec![0];
    let mut out = Vec::new();
    write_stats(&mut out, &s).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.ends_with("threads: loop0 reads vm1, vm2; loop1 reads vm1\n"),
        "{text}"
    );
    s.loops.truncate(1);
    let mut out = Vec::new();
    write_stats(&mut out, &s).unwrap();
    assert!(!String::from_utf8(out).unwrap().contains("threads:"));
}

#[test]
fn connection_options() {
    let conn = ConnArgs {
        url: Some("http://127.0.0.1:7451/".into()),
        ..Default::default()
    };
    assert_eq!(
        conn.client().unwrap().endpoint().to_string(),
        "http://127.0.0.1:7451"
    );
    let bad = ConnArgs {
        url: Some("127.0.0.1:7451".into()),
        ..Default::default()
    };
    assert!(bad
        .client()
        .unwrap_err()
        .to_string()
        .starts_with("Invalid URL"));
    let sock = ConnArgs {
        socket: Some("/tmp/x.sock".into()),
        ..Default::default()
    };
    assert_eq!(sock.client().unwrap().endpoint().to_string(), "/tmp/x.sock");
    // An unreachable daemon is a clear error.
    let dir = tempfile::tempdir().unwrap();
    let missing = Client::new(vqos_api::client::Endpoint::Unix(
        dir.path().join("none.sock"),
    ));
    let e = run(&missing, "port list").unwrap_err();
    assert!(e.to_string().starts_with("Cannot connect to"), "{e}");
}

#[test]
fn status_shows_health_ports_with_their_guests_and_rates_and_fails_when_unhealthy() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mock, c) = daemon(dir.path());
    let mut out = Vec::new();
    status::status_to(&c, status::StatusArgs { json: false }, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with("vqosd ") && first.contains(": ok;"),
        "{text}"
    );
    assert!(text.contains("forwarding loop: running"), "{text}");
    for needle in ["PORT", "MAX_IN", "vm2", "500Mbit"] {
        assert!(text.contains(needle), "{needle} missing: {text}");
    }
    // --json: the three answers it is made of.
    let mut out = Vec::new();
    let args = status::StatusArgs { json: true };
    status::status_to(&c, args, &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["health"]["status"], "ok");
    assert_eq!(v["ports"].as_array().unwrap().len(), 2);
    assert!(v["stats"]["ports"].is_array());
    // A dead loop: shown, and an error (exit 1) naming why.
    vqosd::backend::Backend::stop(&*mock);
    let mut out = Vec::new();
    let err = status::status_to(&c, status::StatusArgs { json: false }, &mut out).unwrap_err();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains(": unhealthy") && text.contains("forwarding loop: stopped"),
        "{text}"
    );
    assert!(err.to_string().starts_with("vqosd is unhealthy: "), "{err}");
}

#[test]
fn port_migrate_hands_the_identity_over_and_refuses_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mock, c) = daemon(dir.path());
    run(
        &c,
        "port add vma --attach --max 8Mbit --mac 02:00:00:00:00:0a",
    )
    .unwrap();
    run(&c, "port add vmb --attach").unwrap();
    let out = run(&c, "port migrate vma vmb").unwrap();
    assert_eq!(
        out,
        "Migrating vma to vmb: weight 1, min 0bit, max 8Mbit, priority 7 (it takes the \
         addresses at its first frame; delete vma once the migration completed)\n"
    );
    assert!(mock
        .calls()
        .contains(&vqosd::backend::MockCall::MigratePort(
            "vma".into(),
            "vmb".into()
        )));
    let list = run(&c, "port list").unwrap();
    let vma = list.lines().find(|l| l.starts_with("vma ")).unwrap();
    assert!(
        vma.ends_with("02:00:00:00:00:0a; migrating to vmb"),
        "{list}"
    );
    let json = run(&c, "port list --json").unwrap();
    let ports: Vec<PortView> = serde_json::from_str(&json).unwrap();
    let (a, b) = (&ports[2], &ports[3]);
    assert_eq!(
        b.port.macs, a.port.macs,
        "the destination has the guest's MAC"
    );
    assert_eq!(
        a.state
            .handover
            .as_ref()
            .map(|h| (h.to.as_str(), h.complete)),
        Some(("vmb", false))
    );
    run(&c, "port add vmc --attach --mac 02:00:00:00:00:0c").unwrap();
    for (line, want) in [
        (
            "port migrate vma vma",
            "a port cannot be migrated to itself",
        ),
        ("port migrate zz vmb", "Unknown"),
        ("port migrate vma up0", "Port 'up0' is the uplink"),
        ("port migrate vm2 vmc", "'vmc' has configured addresses"),
        ("port migrate vmb vm1", "'vmb' is already migrating"),
    ] {
        let e = format!("{:#}", run(&c, line).unwrap_err());
        assert!(e.contains(want), "{line}: {e}");
    }
    // Refused before the switch was asked: one migration reached it.
    let migrations = mock
        .calls()
        .into_iter()
        .filter(|c| matches!(c, vqosd::backend::MockCall::MigratePort(..)))
        .count();
    assert_eq!(migrations, 1);
}
