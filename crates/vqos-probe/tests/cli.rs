//! The `vqos-probe` binary: help, argument errors, and a JSON run against an in-process server.

use std::process::{Command, Output};

use vqos_probe::{spawn_server, Protocol, ServerConfig};

fn probe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vqos-probe"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_helps() {
    let o = probe(&["--help"]);
    assert!(o.status.success());
    let h = text(&o.stdout);
    for w in [
        "server",
        "client",
        "Examples",
        "--rate 1000/s",
        "nearest rank",
        "Exit status",
    ] {
        assert!(h.contains(w), "missing {w} in\n{h}");
    }
    let h = text(&probe(&["client", "--help"]).stdout);
    for w in [
        "--to",
        "--tcp",
        "--size",
        "--rate",
        "--interval",
        "--duration",
        "--timeout",
        "--json",
    ] {
        assert!(h.contains(w), "missing {w} in\n{h}");
    }
    assert!(text(&probe(&["server", "--help"]).stdout).contains("--bind"));
}

#[test]
fn bad_arguments_are_refused_clearly() {
    let cases: &[(&[&str], &str)] = &[
        (&["client"], "--to"),
        (&["client", "--to", "nowhere"], "--to"),
        (
            &["client", "--to", "127.0.0.1:9", "--size", "8"],
            "24..=65507",
        ),
        (
            &["client", "--to", "127.0.0.1:9", "--rate", "fast"],
            "not a number",
        ),
        (
            &["client", "--to", "127.0.0.1:9", "--rate", "0/s"],
            "positive",
        ),
        (
            &["client", "--to", "127.0.0.1:9", "--duration", "10"],
            "needs a unit",
        ),
        (
            &["client", "--to", "127.0.0.1:9", "--interval", "1 fortnight"],
            "Invalid duration '1 fortnight': expected a number followed by a unit (ns, us, ms, s, m, h)",
        ),
        (
            &[
                "client",
                "--to",
                "127.0.0.1:9",
                "--rate",
                "10",
                "--interval",
                "1ms",
            ],
            "cannot be used",
        ),
        (&["server"], "--bind"),
        (&["dance"], "unrecognized subcommand"),
    ];
    for (args, want) in cases {
        let o = probe(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = text(&o.stderr);
        assert!(e.contains(want), "{args:?}: want {want} in\n{e}");
    }
}

#[test]
fn run_errors_exit_1_without_backtrace() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let o = probe(&[
        "client",
        "--to",
        &port.to_string(),
        "--tcp",
        "--duration",
        "100ms",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(
        e.contains("cannot connect tcp") && e.contains("refused"),
        "{e}"
    );
    assert!(!e.contains("backtrace"), "{e}");
}

#[test]
fn json_run_over_udp_and_tcp() {
    for (protocol, flag) in [(Protocol::Udp, None), (Protocol::Tcp, Some("--tcp"))] {
        let srv =
            spawn_server(ServerConfig::new("127.0.0.1:0".parse().unwrap(), protocol)).unwrap();
        let to = srv.local_addr().to_string();
        let mut args = vec![
            "client",
            "--to",
            &to,
            "--rate",
            "1000/s",
            "--duration",
            "300ms",
        ];
        args.extend(flag);
        args.push("--json");
        let o = probe(&args);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(j["samples"], 300, "{j}");
        assert_eq!(j["lost"], 0, "{j}");
        let p50 = j["p50_us"].as_f64().unwrap();
        let p99 = j["p99_us"].as_f64().unwrap();
        assert!(p50 <= p99 && p99 <= j["max_us"].as_f64().unwrap(), "{j}");
        assert_eq!(j["protocol"], protocol.to_string());
        // The human-readable form names the percentiles.
        args.pop();
        let o = probe(&args);
        assert!(text(&o.stdout).contains("p99.9"), "{}", text(&o.stdout));
        srv.stop();
    }
}
