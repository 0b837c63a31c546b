//! The config parser's unit tests.

use super::*;
use crate::wire::{Account, FileMode, PortKind};
use vqos_sched::controllers::pid_ecn::PidParams;

const FULL: &str = r#"
capacity = "940Mbit"
engine = "ancs"
cost = "cycles"
cycles_per_sec = 3000000000
busy_poll = true
tap_io = "uring"
state_file = "/tmp/x/state.json"

[api]
socket = "/tmp/x/vqosd.sock"
tcp = "127.0.0.1:7451"
token_env = "TOK"

[uplink]
name = "up0"
create = false

[[port]]
name = "vm1"
macs = ["02:00:00:00:00:01"]
policy = { weight = 3, min = "200Mbit", max = "500Mbit", priority = 1 }

[[port]]
name = "vm2"
create = false
"#;

fn env(k: &str) -> Option<String> {
    (k == "TOK").then(|| "0123456789abcdef\n".to_string())
}

fn err(text: &str) -> String {
    vqos_api::chain(&Config::parse(text, env).unwrap_err())
}

#[test]
fn an_af_packet_uplink_attaches_and_is_the_uplinks_only() {
    let c = Config::parse("[uplink]\nname = \"eth1\"\nkind = \"af-packet\"", env).unwrap();
    let up = c.uplink.unwrap();
    assert_eq!(
        (up.config.name.as_str(), up.config.kind, up.config.create),
        ("eth1", PortKind::AfPacket, false)
    );
    let tap = Config::parse("[uplink]\nname = \"up0\"", env).unwrap();
    assert_eq!(
        tap.uplink.map(|u| (u.config.kind, u.config.create)),
        Some((PortKind::Tap, true))
    );
    assert!(
        err("[uplink]\nname = \"eth1\"\nkind = \"af-packet\"\ncreate = false")
            .contains("Uplink 'eth1': create is for TAPs")
    );
    assert!(err("[uplink]\nname = \"eth1\"\nkind = \"vhost-user\"")
        .contains("Uplink 'eth1': kind must be \"tap\", \"af-packet\" or \"null\""));
    // A null uplink (benchmarks): nothing to create or attach.
    let null = Config::parse("[uplink]\nname = \"n0\"\nkind = \"null\"", env).unwrap();
    assert_eq!(null.uplink.map(|u| u.config.kind), Some(PortKind::Null));
    assert!(
        err("[uplink]\nname = \"n0\"\nkind = \"null\"\ncreate = true")
            .contains("Uplink 'n0': create is for TAPs")
    );
    // A sending null uplink (downloads): `to` names null vifs, `frame_len` only with it.
    let sends = Config::parse(
        "[uplink]\nname = \"n0\"\nkind = \"null\"\nto = [\"vm1\", \"vm2\"]\nframe_len = 1518",
        env,
    )
    .unwrap();
    assert_eq!(sends.uplink_to, ["vm1", "vm2"]);
    assert_eq!(sends.uplink.unwrap().config.frame_len, Some(1518));
    let defaults = Config::parse(
        "[uplink]\nname = \"n0\"\nkind = \"null\"\nto = [\"vm1\"]",
        env,
    );
    assert_eq!(defaults.unwrap().uplink.unwrap().config.frame_len, Some(64));
    for (bad, why) in [
        ("kind = \"null\"\nframe_len = 64", "frame_len without to"),
        (
            "kind = \"null\"\nto = [\"vm1\"]\nframe_len = 0",
            "frame_len 0 is for a null vif",
        ),
        (
            "kind = \"null\"\nto = [\"vm1\"]\nframe_len = 9000",
            "frame_len 9000 is outside",
        ),
        ("kind = \"null\"\nto = [\"a b\"]", "a b"),
        (
            "kind = \"tap\"\nto = [\"vm1\"]",
            "to and frame_len are for kind = \"null\"",
        ),
    ] {
        let e = err(&format!("[uplink]\nname = \"n0\"\n{bad}"));
        assert!(e.contains(why), "{bad}: {e}");
    }
    assert!(err("[[port]]\nname = \"vm1\"\nkind = \"af-packet\"")
        .contains("Port 'vm1': kind = \"af-packet\" is for the uplink only"));
    assert!(err("[uplink]\nname = \"eth1\"\nkind = \"nic\"").contains("unknown variant `nic`"));
}

#[test]
fn a_server_role_vhost_user_port_takes_its_sockets_owner_group_and_mode() {
    let port = "[[port]]\nname = \"vm1\"\nkind = \"vhost-user\"\nsocket = \"/run/vqos/vm1.sock\"\n";
    let c = Config::parse(
        &format!("{port}socket_owner = 0\nsocket_group = \"root\"\nsocket_mode = \"0o600\""),
        env,
    )
    .unwrap();
    let p = &c.ports[0].0.config;
    assert_eq!(
        (&p.socket_owner, &p.socket_group, p.socket_mode),
        (
            &Some(Account::Id(0)),
            &Some(Account::Name("root".into())),
            Some(FileMode(0o600))
        )
    );
    for (extra, want) in [
        (
            "mode = \"client\"\nsocket_mode = \"0660\"",
            "Port 'vm1': socket_owner, socket_group and socket_mode are for the server role",
        ),
        (
            "socket_group = \"no-such-group-vq\"",
            "Port 'vm1': socket_group: no group 'no-such-group-vq' on this host",
        ),
        (
            "socket_mode = 0o660",
            "write the permission bits as an octal string",
        ),
        ("socket_mode = \"0999\"", "Invalid mode '0999'"),
    ] {
        let e = err(&format!("{port}{extra}"));
        assert!(e.contains(want), "{extra}: {e}");
    }
    assert!(err("[[port]]\nname = \"tap1\"\nsocket_owner = \"root\"")
        .contains("Port 'tap1': socket_owner, socket_group and socket_mode are for kind"));
}

#[test]
fn full_config_parses() {
    let c = Config::parse(FULL, env).unwrap();
    assert_eq!(c.capacity_bps, Some(940_000_000));
    assert_eq!(c.engine, EngineKind::Ancs);
    assert_eq!(c.cost, CostModel::Cycles);
    assert_eq!(c.cycles_per_sec, 3_000_000_000);
    assert!(c.busy_poll);
    assert_eq!(c.tap_io, TapIo::Uring);
    assert_eq!(c.tcp.as_ref().unwrap().token, "0123456789abcdef");
    assert_eq!(c.uplink.as_ref().unwrap().config.name, "up0");
    assert!(!c.uplink.as_ref().unwrap().config.create);
    assert_eq!(c.ports.len(), 2);
    let (p1, pol1) = &c.ports[0];
    assert!(p1.config.create);
    assert_eq!(p1.config.macs.len(), 1);
    assert_eq!(
        (pol1.weight, pol1.min_bps, pol1.max_bps, pol1.priority),
        (3, 200_000_000, Some(500_000_000), 1)
    );
    assert!(!c.ports[1].0.config.create);
    assert_eq!(c.ports[1].1, VifPolicy::default());
    assert_eq!(c.policy_set().len(), 2);
}

#[test]
fn defaults() {
    let c = Config::parse("", env).unwrap();
    assert_eq!(c.capacity_bps, None);
    assert_eq!(c.engine, EngineKind::Vqos);
    assert_eq!(c.socket_path, PathBuf::from(DEFAULT_SOCKET));
    assert_eq!(c.state_file, PathBuf::from(DEFAULT_STATE_FILE));
    assert!(c.tcp.is_none() && c.uplink.is_none() && c.ports.is_empty());
    assert_eq!((c.max_ports, c.expect_state), (DEFAULT_MAX_PORTS, false));
    let c = Config::parse("max_ports = 2\nexpect_state = true", env).unwrap();
    assert_eq!((c.max_ports, c.expect_state), (2, true));
}

#[test]
fn emulated_work_is_read_and_checked() {
    let c = Config::parse(
        "[emulate]\nframe_cycles = 20000\nbyte_cycles = 0.25\nbatch = 2",
        env,
    )
    .unwrap();
    assert_eq!(
        c.emulated_work,
        Some(EmulatedWork {
            per_frame_cycles: 20_000,
            per_byte_cycles: 0.25,
            batch_frames: 2,
        })
    );
    assert!(err("[emulate]\nbatch = 33").contains("batch must be 0..=32"));
    assert_eq!(Config::parse("", env).unwrap().emulated_work, None);
    assert!(err("[emulate]\nbyte_cycles = -1.0").contains("byte_cycles 0..=100"));
    assert!(err("[emulate]\nbyte_cycles = 101.0").contains("byte_cycles 0..=100"));
    assert!(err("[emulate]\nframe_cycles = 5000001").contains("frame_cycles"));
    assert!(err("[emulate]\nframe_cyles = 1").contains("unknown field `frame_cyles`"));
}

#[test]
fn the_metrics_listener_is_optional() {
    assert_eq!(Config::parse("", env).unwrap().metrics_listen, None);
    let c = Config::parse("[metrics]\nlisten = \"0.0.0.0:9469\"", env).unwrap();
    assert_eq!(c.metrics_listen, Some("0.0.0.0:9469".parse().unwrap()));
    assert!(err("[metrics]\nport = 9469").contains("unknown field `port`"));
    assert!(err("[metrics]\nlisten = \"nowhere\"").contains("line 2"));
}

#[test]
fn unknown_keys_are_named() {
    assert!(err("capcity = \"1Gbit\"").contains("unknown field `capcity`"));
    assert!(err("tap_io = \"mq\"").contains("expected `syscall` or `uring`"));
    assert!(err("[api]\nsockett = \"/x\"").contains("unknown field `sockett`"));
    assert!(err("[[port]]\nname = \"a\"\nweight = 2").contains("unknown field `weight`"));
    assert!(
        err("[[port]]\nname = \"a\"\npolicy = { wieght = 2 }").contains("unknown field `wieght`")
    );
    // The line of the key is named.
    for (text, line) in [
        ("capacity = \"1Gbit\"\n\ncapcity = 1", 3),
        ("[api]\nsocket = \"/x\"\nsockett = \"/x\"", 3),
        (
            "[[port]]\nname = \"a\"\n[[port]]\nname = \"b\"\nweight = 2",
            5,
        ),
        ("[[port]]\nname = \"a\"\npolicy = { wieght = 2 }", 3),
    ] {
        let e = err(text);
        assert!(
            e.contains(&format!("(line {line}, column ")),
            "{text:?}: {e}"
        );
    }
    // A policy error is told once, not repeated by its wrapper.
    let e = err("capacity = \"1Gbit\"\n[[port]]\nname = \"a\"\npolicy = { min = \"2Gbit\" }");
    assert_eq!(e.matches("exceeds capacity").count(), 1, "{e}");
}

#[test]
fn bad_values_are_named() {
    assert!(err("engine = \"wfq\"").contains("Unknown engine 'wfq'"));
    assert!(err("capacity = \"9Mbyte\"").contains("Invalid rate '9Mbyte'"));
    let e = err("[[port]]\nname = \"a\"\npolicy = { weight = 0 }");
    assert_eq!(e, "Invalid config: Vif 'a': weight must be greater than 0");
    let e = err("capacity = \"100Mbit\"\n[[port]]\nname = \"a\"\npolicy = { min = \"60Mbit\" }\n[[port]]\nname = \"b\"\npolicy = { min = \"60Mbit\" }");
    assert!(
        e.contains("Sum of minimums 120Mbit exceeds capacity 100Mbit"),
        "{e}"
    );
    assert!(err("[[port]]\nname = \"a\"\n[[port]]\nname = \"a\"").contains("Duplicate vif 'a'"));
    assert!(
        err("[[port]]\nname = \"a\"\nmacs = [\"02:00\"]").contains("Invalid MAC address '02:00'")
    );
    assert!(err("[[port]]\nname = \"a/b\"").contains("Invalid port name 'a/b'"));
    assert!(err("[uplink]\nname = \"a\"\n[[port]]\nname = \"a\"").contains("Duplicate vif 'a'"));
    assert!(err("max_ports = 0").contains("max_ports = 0 but the config has 0 port(s)"));
    assert!(
        err("max_ports = 1\n[[port]]\nname = \"a\"\n[[port]]\nname = \"b\"")
            .contains("max_ports = 1 but the config has 2 port(s)")
    );
}

#[test]
fn policy_keys_burst_max_in_max_out() {
    let c = Config::parse(
        "[[port]]\nname = \"a\"\npolicy = { max_out = \"200Mbit\", max_in = \"100Mbit\", \
         burst = \"64KiB\" }\n[[port]]\nname = \"b\"\npolicy = { max = \"1Mbit\", \
         max_in = \"unlimited\", burst = 1500 }",
        env,
    )
    .unwrap();
    let a = &c.ports[0].1;
    assert_eq!(
        (a.max_bps, a.max_in_bps, a.burst_bytes),
        (Some(200_000_000), Some(100_000_000), Some(65_536))
    );
    let b = &c.ports[1].1;
    assert_eq!(
        (b.max_bps, b.max_in_bps, b.burst_bytes),
        (
            Some(1_000_000),
            Some(vqos_sched::policy::UNLIMITED_IN_BPS),
            Some(1500)
        )
    );
    let port = |policy: &str| format!("[[port]]\nname = \"a\"\npolicy = {{ {policy} }}");
    assert_eq!(
        err(&port("burst = 0")),
        "Invalid config: Vif 'a': burst 0B is out of range 1B..=1GiB"
    );
    assert!(err(&port("burst = \"2GiB\"")).contains("burst 2GiB is out of range"));
    let e = err(&port("burst = \"64Kbit\""));
    assert!(
        e.contains("Invalid size '64Kbit'") && e.contains("line 3"),
        "{e}"
    );
    let e = err(&port("max_in = \"fast\""));
    assert!(e.contains("Invalid rate 'fast'"), "{e}");
    let e = err(&port("max = \"1Mbit\", max_out = \"2Mbit\""));
    assert!(e.contains("duplicate field `max`"), "{e}");
    let e = err(&port("burst = -1"));
    assert!(e.contains("must not be negative"), "{e}");
}

#[test]
fn controllers_and_their_parameters() {
    let c = Config::parse("", env).unwrap();
    assert!(c.controllers.is_empty());
    let c = Config::parse(
        "capacity = \"940Mbit\"\ncontrollers = [\"fairness\", \"pid-ecn\"]\n[fairness]\nperiod = \"2s\"\nprobe = \"250ms\"\n[pid_ecn]\nkp = 0.01\nslot = \"100ms\"",
        env,
    )
    .unwrap();
    let f = c.controllers.fairness.unwrap();
    assert_eq!((f.period_ns, f.probe_ns), (2_000_000_000, 250_000_000));
    let p = c.controllers.pid_ecn.unwrap();
    assert_eq!(
        (p.kp, p.slot_ns, p.capacity_bps),
        (0.01, 100_000_000, 940_000_000)
    );
    assert_eq!(p.ki, PidParams::default().ki);
    // NC defaults to 1 Gbit/s with an unlimited uplink; an explicit one wins.
    let p = Config::parse("controllers = [\"pid-ecn\"]", env)
        .unwrap()
        .controllers
        .pid_ecn
        .unwrap();
    assert_eq!(p.capacity_bps, 1_000_000_000);
    let p = Config::parse(
        "capacity = \"10Gbit\"\ncontrollers = [\"pid-ecn\"]\n[pid_ecn]\ncapacity = \"940Mbit\"",
        env,
    )
    .unwrap()
    .controllers
    .pid_ecn
    .unwrap();
    assert_eq!(p.capacity_bps, 940_000_000);
    assert!(err("controllers = [\"pid\"]").contains("unknown controller 'pid'"));
    assert!(err("controllers = [\"fairness\", \"fairness\"]").contains("listed twice"));
    assert!(err("[fairness]\nperiod = \"5s\"").contains("does not list \"fairness\""));
    assert!(err("controllers = [\"pid-ecn\"]\n[pid_ecn]\nkp = -1.0").contains("kp"));
    assert!(err("controllers = [\"pid-ecn\"]\n[pid_ecn]\nkq = 1.0").contains("unknown field `kq`"));
    assert!(
        err("controllers = [\"fairness\"]\n[fairness]\nperiod = \"1s\"\nprobe = \"800ms\"")
            .contains("at least two probes")
    );
    assert!(
        err("controllers = [\"fairness\"]\n[fairness]\nperiod = \"5 parsecs\"")
            .contains("fairness.period")
    );
}

#[test]
fn tcp_must_be_loopback_and_have_a_token() {
    let e = err("[api]\ntcp = \"0.0.0.0:7451\"\ntoken_env = \"TOK\"");
    assert!(e.contains("0.0.0.0:7451 is not a loopback address"), "{e}");
    assert!(err("[api]\ntcp = \"10.1.2.3:1\"\ntoken_env = \"TOK\"").contains("not a loopback"));
    assert!(err("[api]\ntcp = \"127.0.0.1:1\"").contains("needs api.token_file"));
    assert!(err("[api]\ntcp = \"127.0.0.1:1\"\ntoken_env = \"NOPE\"").contains("NOPE"));
    assert!(Config::parse("[api]\ntcp = \"[::1]:1\"\ntoken_env = \"TOK\"", env).is_ok());
}

#[test]
fn token_file_must_be_private() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("token");
    fs::write(&f, "0123456789abcdef0123\n").unwrap();
    let text = format!(
        "[api]\ntcp = \"127.0.0.1:1\"\ntoken_file = \"{}\"",
        f.display()
    );
    fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
    assert!(err(&text).contains("readable by others"));
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    let c = Config::parse(&text, env).unwrap();
    assert_eq!(c.tcp.unwrap().token, "0123456789abcdef0123");
    fs::write(&f, "short").unwrap();
    assert!(err(&text).contains("at least 16 characters"));
}

#[test]
fn threads_and_cpus_are_checked_against_the_cpus_vqosd_may_use() {
    let allowed = super::threads::allowed_cpus().unwrap();
    let n = allowed.len();
    let c = Config::parse("", env).unwrap();
    assert_eq!((c.threads, c.cpus.clone()), (1, vec![]));
    // cpus alone gives the thread count; threads and cpus together must agree.
    let c = Config::parse(&format!("cpus = [{}]", allowed[0]), env).unwrap();
    assert_eq!((c.threads, c.cpus), (1, vec![allowed[0]]));
    let c = Config::parse(&format!("threads = {n}"), env).unwrap();
    assert_eq!(c.threads, n);
    assert_eq!(
        err("threads = 0"),
        "Invalid config: threads must be at least 1"
    );
    let e = err(&format!("threads = {}", n + 1));
    assert!(
        e.contains(&format!(
            "threads = {} but this host gives vqosd {n} CPU(s)",
            n + 1
        )),
        "{e}"
    );
    let e = err(&format!(
        "threads = 1\ncpus = [{}, {}]",
        allowed[0], allowed[0]
    ));
    assert!(e.contains("cpus lists 2 CPU(s) for threads = 1"), "{e}");
    let e = err("cpus = [4096]");
    assert!(
        e.contains("CPU 4096 does not exist or vqosd may not use it"),
        "{e}"
    );
    if n >= 2 {
        let e = err(&format!("cpus = [{0}, {0}]", allowed[0]));
        assert!(
            e.contains(&format!("CPU {} is listed twice", allowed[0])),
            "{e}"
        );
    }
    let e = err("threads = -1");
    assert!(e.contains("line 1, column 11"), "{e}");
    // A change of either needs a restart.
    let a = Config::parse("", env).unwrap();
    let b = Config::parse(&format!("cpus = [{}]", allowed[0]), env).unwrap();
    assert_eq!(a.restart_needed(&b), vec!["cpus"]);
}

#[test]
fn variant_paper_reaches_the_policy_set_and_the_fairness_adjuster_and_needs_a_restart() {
    let a = Config::parse("controllers = [\"fairness\"]", env).unwrap();
    assert_eq!(a.variant, Variant::Vqos);
    let b = Config::parse("variant = \"paper\"\ncontrollers = [\"fairness\"]", env).unwrap();
    assert_eq!(b.policy_set().variant, Variant::Paper);
    assert_eq!(
        b.controllers.fairness.as_ref().unwrap().variant,
        Variant::Paper
    );
    assert!(a.restart_needed(&b).contains(&"variant"));
    let e = err("variant = \"literal\"");
    assert!(e.contains("literal") && e.contains("paper"), "{e}");
}

#[test]
fn a_port_pinned_to_a_thread_must_name_one_the_switch_has() {
    let port = |thread: usize| {
        format!("[uplink]\nname = \"up0\"\n[[port]]\nname = \"vm1\"\nthread = {thread}\n")
    };
    let c = Config::parse(&port(0), env).unwrap();
    assert_eq!(c.ports[0].0.config.thread, Some(0));
    assert_eq!(
        err(&port(1)),
        "Invalid config: Port 'vm1': thread = 1, but the switch has 1 forwarding thread(s) (0..=0)"
    );
    // A multiqueue TAP, and queues out of range.
    let c = Config::parse(
        "[uplink]\nname = \"up0\"\n[[port]]\nname = \"vm1\"\nqueues = 4\n",
        env,
    )
    .unwrap();
    assert_eq!(c.ports[0].0.config.queues, Some(4));
    // The uplink's: a TAP's queues, read one per thread; refused elsewhere and out of range.
    let c = Config::parse("[uplink]\nname = \"up0\"\nqueues = 2\n", env).unwrap();
    assert_eq!(c.uplink.map(|u| u.config.queues), Some(Some(2)));
    let e = err("[uplink]\nname = \"up0\"\nqueues = 0\n");
    assert!(
        e.contains("Uplink 'up0': queues = 0 is outside 1..=16"),
        "{e}"
    );
    let e = err("[uplink]\nname = \"eth9\"\nkind = \"af-packet\"\nqueues = 2\n");
    assert!(e.contains("queues is for TAP uplinks"), "{e}");
    let e = err("[uplink]\nname = \"up0\"\n[[port]]\nname = \"vm1\"\nqueues = 17\n");
    assert!(
        e.contains("queues = 17 is outside 1..=16 (queues of the TAP"),
        "{e}"
    );
}
