//! The control commands' conventions as a user meets them: `--json` on every command, the
//! connection options before or after the subcommand, and one exit status per kind of failure
//! (docs/api.md, "CLI"). A daemon on the mock switch runs in this process; `vqos` is the binary.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use serde_json::Value;
use vqosd::api::Api;
use vqosd::backend::MockBackend;
use vqosd::config::Config;
use vqosd::server::{Server, ServerConfig};

fn vqos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vqos"))
        .args(args)
        .env_remove("VQOS_SOCKET")
        .output()
        .expect("run vqos")
}

fn daemon(dir: &Path) -> (Server, String) {
    let text = format!(
        "capacity = \"1Gbit\"\nstate_file = \"{0}/state.json\"\n[api]\nsocket = \"{0}/s.sock\"\n\
         [[port]]\nname = \"vm1\"\n",
        dir.display()
    );
    let config = Config::parse(&text, |_| None).unwrap();
    let api = Arc::new(Api::start(&config, Arc::new(MockBackend::new())).unwrap());
    let server = Server::start(&ServerConfig::from_config(&config), api).unwrap();
    (server, config.socket_path.to_str().unwrap().to_string())
}

/// Runs `vqos` and returns its status, stdout as JSON (Null if not JSON) and stderr.
fn json(args: &[&str]) -> (i32, Value, String) {
    let out = vqos(args);
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_control_command_speaks_json_with_the_socket_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, sock) = daemon(dir.path());
    let s = sock.as_str();
    let (code, v, err) = json(&["--socket", s, "port", "add", "vm2", "--attach", "--json"]);
    assert_eq!((code, v["name"].as_str()), (0, Some("vm2")), "{err}");
    let (code, v, err) = json(&["port", "list", "--json", "--socket", s]);
    assert_eq!((code, v.as_array().map(Vec::len)), (0, Some(2)), "{err}");
    let (code, v, err) = json(&[
        "policy", "--socket", s, "set", "vm2", "--max", "1Gbit", "--json",
    ]);
    assert_eq!(
        (code, v["max_bps"].as_u64()),
        (0, Some(1_000_000_000)),
        "{err}"
    );
    let (code, v, err) = json(&["policy", "get", "vm2", "--json", "--socket", s]);
    assert_eq!((code, v["max"].as_str()), (0, Some("1Gbit")), "{err}");
    let (code, v, err) = json(&["stats", "--json", "--socket", s]);
    assert_eq!((code, v["engine"].as_str()), (0, Some("vqos")), "{err}");
    let (code, v, err) = json(&["--socket", s, "port", "del", "vm2", "--json"]);
    assert_eq!((code, v["removed"].as_str()), (0, Some("vm2")), "{err}");
}

#[test]
fn exit_statuses_tell_usage_unreachable_refused_and_failed_check() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, sock) = daemon(dir.path());
    let s = sock.as_str();
    let missing = dir.path().join("none.sock");
    let m = missing.to_str().unwrap();
    for (args, want) in [
        // Usage: clap's errors and ours, before anything is sent.
        (vec!["port", "frobnicate"], 2),
        (vec!["--socket", s, "policy", "set", "vm1"], 2),
        (
            vec!["--socket", s, "policy", "set", "vm1", "--priority", "9"],
            2,
        ),
        (
            vec!["--socket", s, "policy", "set", "vm1", "--max", "5Mbyte"],
            2,
        ),
        (vec!["--socket", s, "port", "add", "a/b"], 2),
        (vec!["--url", "127.0.0.1:1", "port", "list"], 2),
        // Unreachable.
        (vec!["--socket", m, "port", "list"], 3),
        (vec!["stats", "--socket", m], 3),
        // Refused by the daemon.
        (
            vec!["--socket", s, "policy", "set", "nope", "--weight", "2"],
            4,
        ),
        (
            vec!["--socket", s, "policy", "set", "vm1", "--min", "2Gbit"],
            4,
        ),
        (vec!["--socket", s, "port", "del", "nope"], 4),
    ] {
        let out = vqos(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(want), "{args:?}: {err}");
    }
    // A refusal is told once: the daemon's message, not repeated.
    let out = vqos(&["--socket", s, "policy", "set", "vm1", "--min", "2Gbit"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim(),
        "vqos: Sum of minimums 2Gbit exceeds capacity 1Gbit"
    );
}

/// Before: a bad `--url` was tried (exit 3); `alloc`'s and `sim`'s own arguments exited 1.
#[test]
fn every_local_mistake_is_a_usage_error() {
    let scenario = format!(
        "{}/../../scenarios/ancs-fig5.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let csv = ["--csv", "/dev/null", "--csv-window", "soon"];
    for args in [
        vec!["--url", "http://127.0.0.1:notaport", "port", "list"],
        vec!["--url", "http://127.0.0.1:99999", "port", "list"],
        vec!["--url", "http://:7451", "port", "list"],
        // The URL before the token file.
        vec![
            "--url",
            "http://h:0",
            "--token-file",
            "/none",
            "port",
            "list",
        ],
        vec!["alloc", "--capacity", "fast", "--vif", "a"],
        vec!["alloc", "--capacity", "1Gbit", "--vif", "a:max=fast"],
        vec!["alloc", "--capacity", "1Gbit", "--vif", "a:weight=0"],
        vec!["alloc", "--capacity", "1Gbit", "--vif", "a", "--vif", "a"],
        vec!["sim", &scenario, "--engine", "wfq"],
        vec!["sim", &scenario, "--variant", "literal"],
        [vec!["sim", &scenario], csv.to_vec()].concat(),
    ] {
        let out = vqos(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    }
}

#[test]
fn completions_and_man_pages() {
    let help = String::from_utf8(vqos(&["--help"]).stdout).unwrap();
    assert!(
        help.contains("completions") && help.contains("Exit status"),
        "{help}"
    );
    let out = vqos(&["completions", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(
        script.contains("_vqos") && script.contains("policy"),
        "{script}"
    );
    assert_eq!(vqos(&["completions", "tcsh"]).status.code(), Some(2));
    let dir = tempfile::tempdir().unwrap();
    let out = vqos(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "vqos.1",
        "vqos-policy.1",
        "vqos-stats.1",
        "vqos-completions.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page}");
    }
}

#[test]
fn every_subcommand_accepts_json() {
    // Parsing only: each command line is refused for another reason (or prints its help), never
    // because of --json.
    for args in [
        vec!["alloc", "--json", "--help"],
        vec!["sim", "--json", "--help"],
        vec!["lab", "run", "--json", "--help"],
        vec!["lab", "paper", "--json", "--help"],
        vec!["lab", "publish", "--json", "--help"],
        vec!["port", "list", "--json", "--help"],
        vec!["port", "add", "--json", "--help"],
        vec!["port", "del", "--json", "--help"],
        vec!["policy", "get", "--json", "--help"],
        vec!["policy", "set", "--json", "--help"],
        vec!["stats", "--json", "--help"],
        vec!["reload", "--json", "--help"],
    ] {
        let out = vqos(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = vqos(&["lab", "paper", "no-such-paper", "--json"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn lab_run_engine_needs_the_vqos_baseline_and_a_known_name() {
    // Both are refused before the lab touches anything (no root, no iperf3 needed).
    let out = vqos(&[
        "lab",
        "run",
        "scenarios/fairness-static.toml",
        "--baseline",
        "htb",
        "--engine",
        "policer",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs --baseline vqos"), "{err}");
    let out = vqos(&[
        "lab",
        "run",
        "scenarios/fairness-static.toml",
        "--engine",
        "wfq",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wfq"), "{err}");
}

/// Before: `--weight 0`, `--min unlimited` and `--burst 0` were sent and refused by vqosd
/// (exit 4), and `--max 0` quietly blocked the vif.
#[test]
fn policies_that_cannot_be_right_are_refused_before_sending() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, sock) = daemon(dir.path());
    let s = sock.as_str();
    for (opts, needle) in [
        (vec!["--weight", "0"], "--weight must be greater than 0"),
        (vec!["--min", "unlimited"], "--min cannot be unlimited"),
        (vec!["--burst", "0"], "--burst 0B is out of range 1B..=1GiB"),
        (
            vec!["--burst", "2GiB"],
            "--burst 2GiB is out of range 1B..=1GiB",
        ),
        (
            vec!["--max", "0"],
            "--max 0 blocks everything the vif sends",
        ),
        (
            vec!["--max-in", "0bit"],
            "--max-in 0bit blocks everything the vif receives",
        ),
        (vec!["--block"], "--block confirms a --max or --max-in of 0"),
        (
            vec!["--min", "300Mbit", "--max", "200Mbit"],
            "--min 300Mbit is above --max 200Mbit",
        ),
    ] {
        for cmd in [
            vec!["--socket", s, "policy", "set", "vm1"],
            vec!["--socket", s, "port", "add", "vm9", "--attach"],
        ] {
            let args: Vec<&str> = cmd.iter().chain(&opts).copied().collect();
            let out = vqos(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }
    // The same in etcd, refused before connecting (before: blocked the vif on every host).
    for (opts, needle) in [
        (
            vec!["--max", "0"],
            "--max 0 blocks everything the vif sends",
        ),
        (vec!["--block"], "--block confirms"),
    ] {
        let mut args = vec!["cluster", "--endpoints", "http://127.0.0.1:1", "vif", "set"];
        args.push("h1/vm1");
        args.extend(opts);
        let out = vqos(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // Nothing reached the daemon.
    let (code, v, _) = json(&["--socket", s, "policy", "get", "vm1", "--json"]);
    assert_eq!(
        (code, v["weight"].as_u64(), v["max"].as_str()),
        (0, Some(1), Some("unlimited"))
    );
    let (_, v, _) = json(&["--socket", s, "port", "list", "--json"]);
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    // Spelt out, a zero maximum is set.
    let (code, v, err) = json(&[
        "--socket", s, "policy", "set", "vm1", "--max", "0", "--block", "--json",
    ]);
    assert_eq!((code, v["max_bps"].as_u64()), (0, Some(0)), "{err}");
    let (code, v, err) = json(&[
        "--socket",
        s,
        "policy",
        "set",
        "vm1",
        "--max",
        "unlimited",
        "--json",
    ]);
    assert_eq!((code, v["max"].as_str()), (0, Some("unlimited")), "{err}");
}

/// Runs `vqos` with a stdout whose reader is already gone: every write fails with EPIPE. (The
/// other end of a socket pair rather than of a pipe: same error, and no race with a reader
/// closing after the first write.)
fn with_closed_stdout(args: &[&str]) -> Output {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    drop(ours);
    Command::new(env!("CARGO_BIN_EXE_vqos"))
        .args(args)
        .env_remove("VQOS_SOCKET")
        .stdout(std::os::fd::OwnedFd::from(theirs))
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run vqos")
}

/// Before: `alloc` panicked (exit 101), `man` and `completions` said "Broken pipe" (exit 1).
#[test]
fn every_command_is_quiet_on_a_closed_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, sock) = daemon(dir.path());
    let s = sock.as_str();
    let scenario = format!(
        "{}/../../scenarios/ancs-fig5.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    for args in [
        vec!["alloc", "--capacity", "1Gbit", "--vif", "a:weight=1"],
        vec!["alloc", "--capacity", "1Gbit", "--vif", "a", "--json"],
        vec!["man"],
        vec!["completions", "bash"],
        vec!["sim", &scenario],
        vec!["--socket", s, "port", "list"],
        vec!["--socket", s, "policy", "get", "vm1", "--json"],
        vec!["--socket", s, "stats"],
        vec!["--socket", s, "stats", "--watch", "--interval", "0.05"],
        vec!["--socket", s, "policy", "set", "vm1", "--priority", "3"],
        vec!["--socket", s, "calibrate", "--current"],
        vec![
            "cluster",
            "simulate",
            "--hosts",
            "3",
            "--vifs",
            "9",
            "--tenants",
            "2",
            "--cost-hosts",
            "0",
        ],
    ] {
        let out = with_closed_stdout(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
        assert_eq!(err, "", "{args:?}");
    }
    // What fails before writing anything is still told, with its own status.
    let out = with_closed_stdout(&["alloc", "--capacity", "fast", "--vif", "a"]);
    assert_ne!(out.status.code(), Some(141));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Invalid rate 'fast'"));
}

/// Collects a child's output lines on a channel (stdout and stderr each read by a thread).
fn lines(r: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(r).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits up to 10 s for a line containing `needle`, returning every line read until then.
fn until(rx: &std::sync::mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut seen = String::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) => {
                seen.push_str(&l);
                seen.push('\n');
                if l.contains(needle) {
                    return seen;
                }
            }
            Err(_) => break,
        }
    }
    panic!("no line with {needle:?} in:\n{seen}");
}

/// Before: off a terminal `--watch` wrote clear-screen codes, and it exited (status 3) when the
/// daemon went away.
#[test]
fn stats_watch_writes_plain_snapshots_and_waits_for_a_restarted_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let (server, sock) = daemon(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_vqos"))
        .args(["--socket", &sock, "stats", "--watch", "--interval", "0.1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(child.stdout.take().unwrap());
    let err = lines(child.stderr.take().unwrap());
    let first = until(&out, "vm1");
    let second = until(&out, "vm1");
    assert!(first.starts_with("engine vqos"), "{first:?}");
    assert!(second.starts_with("\nengine vqos"), "{second:?}");
    drop(server);
    let said = until(&err, "retrying");
    assert!(said.contains("vqosd unreachable"), "{said}");
    assert_eq!(child.try_wait().unwrap(), None, "--watch gave up: {said}");
    while out.try_recv().is_ok() {}
    let (_server, _) = daemon(dir.path());
    until(&err, "vqosd is back");
    let after = until(&out, "vm1");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(after.contains("engine vqos"), "{after}");
    assert!(!format!("{first}{second}{after}").contains('\x1b'));
}
