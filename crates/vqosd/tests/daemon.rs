//! The `vqosd` binary: help, startup errors, clean exit on SIGTERM/SIGINT, and the real switch
//! (TAP ports) behind the API.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use serde_json::{json, Value};
use vqosd::client::{Client, Endpoint};

const BIN: &str = env!("CARGO_BIN_EXE_vqosd");

/// A daemon we started; killed (by its own PID) if the test fails before it exits.
struct Proc {
    child: Child,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Proc {
    fn start(config: &Path, backend: &str) -> Proc {
        Proc::start_with(config, &["--backend", backend])
    }

    fn start_with(config: &Path, args: &[&str]) -> Proc {
        Proc::start_env(config, args, &[])
    }

    fn start_env(config: &Path, args: &[&str], env: &[(&str, &Path)]) -> Proc {
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(config)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Proc { child, stdout }
    }

    /// Waits for the "listening" line the daemon prints once it serves.
    fn wait_ready(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        if !line.contains("listening on") {
            let mut err = String::new();
            let _ = self.child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("vqosd did not start: stdout {line:?}, stderr {err:?}");
        }
        line
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill on the PID of our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    fn wait(&mut self) -> (ExitStatus, String) {
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status, err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write_config(dir: &Path, body: &str) -> (PathBuf, PathBuf) {
    let socket = dir.join("run/vqosd.sock");
    let text = format!(
        "state_file = \"{}\"\n[api]\nsocket = \"{}\"\n{body}",
        dir.join("state.json").display(),
        socket.display()
    );
    let path = dir.join("vqosd.toml");
    fs::write(&path, text).unwrap();
    (path, socket)
}

#[test]
fn help_explains_the_config() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for needle in [
        "--config",
        "--backend",
        "--check",
        "capacity",
        "[[port]]",
        "SIGTERM",
    ] {
        assert!(out.contains(needle), "--help lacks {needle}:\n{out}");
    }
}

#[test]
fn startup_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = run(&["--config", "/nonexistent/vqosd.toml"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("vqosd: Cannot read config /nonexistent/vqosd.toml"),
        "{err}"
    );

    let (cfg, _) = write_config(dir.path(), "capcity = \"1Gbit\"\n");
    // The unknown key is at top level after [api]: it is reported as an api key.
    let (code, _, err) = run(&["--config", cfg.to_str().unwrap(), "--check"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("vqosd: Invalid config: unknown field `capcity`"),
        "{err}"
    );

    let (cfg, _) = write_config(dir.path(), "tcp = \"0.0.0.0:7451\"\ntoken_env = \"X\"\n");
    let (code, _, err) = run(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("is not a loopback address"), "{err}");

    // The real switch needs an uplink.
    let (cfg, _) = write_config(dir.path(), "");
    let (code, _, err) = run(&["--config", cfg.to_str().unwrap(), "--backend", "switch"]);
    assert_eq!(code, 1);
    assert!(err.contains("no [uplink]"), "{err}");
}

/// `--check` (the unit's ExecStartPre) refuses what the start would, with the same message,
/// and touches nothing: it runs the start's own checks, dry.
#[test]
fn check_refuses_what_the_start_refuses_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let check = |cfg: &Path, extra: &[&str]| {
        let mut args = vec!["--config", cfg.to_str().unwrap(), "--check"];
        args.extend_from_slice(extra);
        run(&args)
    };
    let start_error = |cfg: &Path| {
        let mut p = Proc::start_with(cfg, &[]);
        let (status, err) = p.wait();
        assert_eq!(status.code(), Some(1), "{err}");
        err
    };
    // No [uplink]: the real switch cannot start; the mock needs none.
    let (cfg, _) = write_config(dir.path(), "");
    let (code, _, err) = check(&cfg, &[]);
    assert_eq!(code, 1);
    assert!(err.contains("no [uplink]"), "{err}");
    assert_eq!(err, start_error(&cfg));
    let (code, out, _) = check(&cfg, &["--backend", "mock"]);
    assert_eq!(code, 0);
    assert!(out.contains("is valid"), "{out}");

    // An AF_PACKET uplink on an interface that does not exist.
    let (cfg, _) = write_config(
        dir.path(),
        "[uplink]\nname = \"vqnone0\"\nkind = \"af-packet\"\n",
    );
    let (code, _, err) = check(&cfg, &[]);
    assert_eq!(code, 1);
    assert!(err.contains("interface 'vqnone0' does not exist"), "{err}");
    assert_eq!(err, start_error(&cfg));

    // A state file the start cannot restore (corrupt, no last-good copy).
    let (cfg, _) = write_config(dir.path(), "[[port]]\nname = \"vm1\"\n");
    let state = dir.path().join("state.json");
    fs::write(&state, "{ not json").unwrap();
    let (code, _, err) = check(&cfg, &["--backend", "mock"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("state.json"), "{err}");

    // A corrupt state file with a good copy: the start would set it aside and restore the
    // copy; --check says so and leaves both where they are.
    fs::remove_file(&state).unwrap();
    let mut p = Proc::start(&cfg, "mock");
    p.wait_ready();
    p.signal(libc::SIGTERM);
    assert!(p.wait().0.success());
    let copy = dir.path().join("state.json.last-good");
    fs::copy(&state, &copy).unwrap();
    fs::write(&state, "{ not json").unwrap();
    let (code, out, err) = check(&cfg, &["--backend", "mock"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("is valid: 1 port(s)"), "{out}");
    assert!(err.contains("restored the last-good copy"), "{err}");
    assert!(err.contains("it would be kept as"), "{err}");
    assert_eq!(fs::read_to_string(&state).unwrap(), "{ not json");
    assert!(copy.exists() && !dir.path().join("state.json.corrupt").exists());
}

#[test]
fn a_taken_tcp_port_stops_the_start_loudly_and_distinctly() {
    let dir = tempfile::tempdir().unwrap();
    // Another program (here: this test) holds the port.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = squatter.local_addr().unwrap();
    let token = dir.path().join("token");
    fs::write(&token, "a-token-of-enough-length").unwrap();
    fs::set_permissions(&token, fs::Permissions::from_mode(0o600)).unwrap();
    let body = format!("tcp = \"{addr}\"\ntoken_file = \"{}\"\n", token.display());
    let (cfg, socket) = write_config(dir.path(), &body);
    let (code, _, err) = run(&["--config", cfg.to_str().unwrap(), "--backend", "mock"]);
    assert_eq!(code, 3, "{err}");
    let me = fs::metadata("/proc/self").unwrap().uid();
    let want = format!("TCP port {addr} is taken by uid {me}: another program listens there");
    assert!(err.contains(&want), "{err}");
    assert!(
        !socket.exists(),
        "the unix socket outlived the failed start"
    );
}

#[test]
fn sigterm_and_sigint_leave_cleanly() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, socket) = write_config(
            dir.path(),
            "[[port]]\nname = \"vm1\"\npolicy = { weight = 2 }\n",
        );
        let mut p = Proc::start(&cfg, "mock");
        p.wait_ready();
        let c = Client::new(Endpoint::Unix(socket.clone()));
        let h: Value = c.call("GET", "/v1/health", None).unwrap();
        assert_eq!(h["ports"], 1);
        p.signal(sig);
        let (status, err) = p.wait();
        assert_eq!(status.code(), Some(0), "signal {sig}: {err}");
        assert!(!socket.exists(), "the socket outlived the daemon");
        assert!(dir.path().join("state.json").exists());
    }
}

/// A dead forwarding loop makes the daemon exit non-zero (status 2), so systemd restarts it;
/// until then `/v1/health` says why it is unhealthy.
#[test]
fn a_dead_forwarding_loop_makes_the_daemon_exit_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, socket) = write_config(dir.path(), "[[port]]\nname = \"vm1\"\n");
    let mut p = Proc::start_with(
        &cfg,
        &["--backend", "mock", "--mock-loop-dies-after-ms", "300"],
    );
    p.wait_ready();
    let (status, err) = p.wait();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("The forwarding loop has stopped; exiting so that the supervisor restarts"),
        "{err}"
    );
    assert!(!socket.exists(), "the socket outlived the daemon");
}

/// The controllers' thread runs beside the API and stops with the daemon.
#[test]
fn controllers_start_and_stop_with_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("vqosd.sock");
    let cfg = dir.path().join("vqosd.toml");
    fs::write(
        &cfg,
        format!(
            "capacity = \"1Gbit\"\nstate_file = \"{}\"\ncontrollers = [\"fairness\", \"pid-ecn\"]\n\
             [api]\nsocket = \"{}\"\n[pid_ecn]\nslot = \"20ms\"\n[[port]]\nname = \"vm1\"\n",
            dir.path().join("state.json").display(),
            socket.display()
        ),
    )
    .unwrap();
    let mut p = Proc::start(&cfg, "mock");
    let line = p.wait_ready();
    assert!(line.contains("controllers: fairness, pid-ecn"), "{line}");
    let c = Client::new(Endpoint::Unix(socket));
    let s: Value = c.call("GET", "/v1/stats", None).unwrap();
    let vm1 = &s["ports"][0];
    assert_eq!(vm1["name"], "vm1");
    assert_eq!(vm1["ecn_probability"], json!(0.0));
    assert_eq!(vm1["controller_limit_bps"], Value::Null);
    let t0 = std::time::Instant::now();
    p.signal(libc::SIGTERM);
    let (status, err) = p.wait();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
}

/// The real data plane with TAP devices (needs root and /dev/net/tun, as the daemon does).
#[test]
fn the_switch_backend_creates_taps_and_applies_policies() {
    let dir = tempfile::tempdir().unwrap();
    let tag = std::process::id() % 100_000;
    let (up, vm1, vm2) = (
        format!("vqu{tag}"),
        format!("vqa{tag}"),
        format!("vqb{tag}"),
    );
    // The TAPs persist by design: removed here even if the test fails.
    let _links = vqos_testkit::Links(vec![up.clone(), vm1.clone(), vm2.clone()]);
    let (cfg, socket) = write_config(
        dir.path(),
        &format!(
            "[uplink]\nname = \"{up}\"\n[[port]]\nname = \"{vm1}\"\npolicy = {{ weight = 1 }}\n"
        ),
    );
    let text = fs::read_to_string(&cfg).unwrap();
    fs::write(&cfg, format!("capacity = \"940Mbit\"\n{text}")).unwrap();
    let mut p = Proc::start(&cfg, "switch");
    let line = p.wait_ready();
    assert!(line.contains("capacity 940Mbit"), "{line}");
    let exists = |name: &str| Path::new("/sys/class/net").join(name).exists();
    assert!(exists(&up) && exists(&vm1));

    let c = Client::new(Endpoint::Unix(socket));
    let added: Value = c
        .call(
            "POST",
            "/v1/ports",
            Some(&json!({"name": vm2, "policy": {"weight": 5, "max": "150Mbit"}})),
        )
        .unwrap();
    assert_eq!(added["policy"]["weight"], 5);
    assert!(exists(&vm2));
    let set: Value = c
        .call(
            "PUT",
            &format!("/v1/policies/{vm1}"),
            Some(&json!({"min": "200Mbit"})),
        )
        .unwrap();
    assert_eq!(set["min"], "200Mbit");
    // The switch itself refuses what the API would (Σ min > capacity) and nothing changes.
    let r = c
        .request(
            "PUT",
            &format!("/v1/policies/{vm2}"),
            Some(&json!({"min": "800Mbit", "max": null})),
        )
        .unwrap();
    assert_eq!(r.status, 422);
    let stats: Value = c.call("GET", "/v1/stats", None).unwrap();
    let ports = stats["ports"].as_array().unwrap();
    let find = |n: &str| ports.iter().find(|p| p["name"] == n).cloned().unwrap();
    assert_eq!(find(&up)["role"], "uplink");
    assert_eq!(find(&vm1)["policy"]["min"], "200Mbit");
    assert_eq!(find(&vm2)["policy"]["max"], "150Mbit");
    assert_eq!(find(&vm2)["drops"]["spoofed"], 0);
    let metrics = c.text("/metrics").unwrap();
    assert!(metrics.contains(&format!("vqos_policy_weight{{port=\"{vm2}\"}} 5")));

    let _: Value = c.call("DELETE", &format!("/v1/ports/{vm2}"), None).unwrap();
    assert!(!exists(&vm2), "a removed created TAP must vanish");
    p.signal(libc::SIGTERM);
    let (status, err) = p.wait();
    assert_eq!(status.code(), Some(0), "{err}");
    // The TAPs vqosd made outlive it (a restart under running guests)...
    assert!(
        exists(&vm1) && exists(&up),
        "created TAPs did not outlive the daemon"
    );
    // ...and the next start re-attaches to them, with the policies it had.
    fs::write(
        &cfg,
        format!(
            "remove_taps_on_exit = true
{}",
            fs::read_to_string(&cfg).unwrap()
        ),
    )
    .unwrap();
    let mut p = Proc::start(&cfg, "switch");
    p.wait_ready();
    let c = Client::new(Endpoint::Unix(dir.path().join("run/vqosd.sock")));
    let policy: Value = c.call("GET", &format!("/v1/policies/{vm1}"), None).unwrap();
    assert_eq!(policy["min"], "200Mbit");
    // With remove_taps_on_exit they go when it stops.
    p.signal(libc::SIGTERM);
    let (status, err) = p.wait();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        !exists(&vm1) && !exists(&up),
        "remove_taps_on_exit left TAPs behind"
    );
}

#[test]
fn readiness_is_sent_to_notify_socket_once_the_api_answers() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let (cfg, socket) = write_config(dir.path(), "[[port]]\nname = \"vm1\"\n");
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    // Only a bound on a hung daemon, never a timing assertion.
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut p = Proc::start_env(
        &cfg,
        &["--backend", "mock"],
        &[("NOTIFY_SOCKET", &notify_path)],
    );
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("no READY=1 from vqosd");
    assert_eq!(&buf[..n], b"READY=1");
    // Ready means serving: the API answers with the config's port at once.
    let client = Client::new(Endpoint::Unix(socket));
    let ports: Value = client.call("GET", "/v1/ports", None).unwrap();
    assert_eq!(ports[0]["name"], "vm1");
    p.signal(libc::SIGTERM);
    let n = notify.recv(&mut buf).expect("no STOPPING=1 from vqosd");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let (status, err) = p.wait();
    assert!(status.success(), "{err}");
}

#[test]
fn without_config_the_default_path_is_read() {
    let (code, _, err) = run(&["--check"]);
    // The test machine has no /etc/vqos/vqosd.toml (or has one that parses): either way the
    // default path is the one named.
    if code != 0 {
        assert!(err.contains("/etc/vqos/vqosd.toml"), "{err}");
    }
    let (_, out, _) = run(&["--help"]);
    assert!(out.contains("/etc/vqos/vqosd.toml"), "{out}");
}

#[test]
fn every_change_leaves_an_audit_line_with_its_caller() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, socket) = write_config(dir.path(), "[[port]]\nname = \"vm1\"\n");
    let mut p = Proc::start(&cfg, "mock");
    p.wait_ready();
    let client = Client::new(Endpoint::Unix(socket));
    let _: Value = client
        .call("PUT", "/v1/policies/vm1", Some(&json!({"weight": 3})))
        .unwrap();
    let r = client
        .request("PUT", "/v1/policies/vm1", Some(&json!({"weight": 0})))
        .unwrap();
    assert_eq!(r.status, 422);
    let _: Value = client.call("GET", "/v1/ports", None).unwrap();
    p.signal(libc::SIGTERM);
    let (status, err) = p.wait();
    assert!(status.success(), "{err}");
    // SAFETY: geteuid has no preconditions.
    let uid = format!("caller=\"uid={}\"", unsafe { libc::geteuid() });
    let audit: Vec<&str> = err.lines().filter(|l| l.contains("vqosd::audit")).collect();
    assert_eq!(audit.len(), 2, "{err}");
    assert!(
        audit
            .iter()
            .all(|l| l.contains(" INFO ") && l.contains(&uid)),
        "{err}"
    );
    assert!(audit[0].contains("PUT /v1/policies/vm1") && audit[0].contains("status=200"));
    assert!(audit[1].contains("refused: ") && audit[1].contains("weight must be greater than 0"));
    // A timestamp first, and no colours on a pipe.
    assert!(audit[0].as_bytes()[0].is_ascii_digit(), "{}", audit[0]);
    assert!(!err.contains('\u{1b}'), "{err}");
    assert!(err.contains("Port vm1 up (TAP created)"), "{err}");

    // Over TCP the caller is "token".
    let tcp_cfg = dir.path().join("tcp.toml");
    fs::write(
        &tcp_cfg,
        fs::read_to_string(&cfg).unwrap().replace(
            "[api]\n",
            "[api]\ntcp = \"127.0.0.1:0\"\ntoken_env = \"VQOSD_AUDIT_TOKEN\"\n",
        ),
    )
    .unwrap();
    let token = "audit-token-0123456789";
    let mut p = Proc::start_env(
        &tcp_cfg,
        &["--backend", "mock"],
        &[("VQOSD_AUDIT_TOKEN", Path::new(token))],
    );
    let line = p.wait_ready();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("tcp:"))
        .map(|w| w.trim_end_matches(';').to_string())
        .unwrap_or_else(|| panic!("no tcp address in {line:?}"));
    let tcp = Client::new(Endpoint::Tcp {
        addr,
        token: Some(token.to_string()),
    });
    let _: Value = tcp
        .call("PUT", "/v1/policies/vm1", Some(&json!({"weight": 2})))
        .unwrap();
    p.signal(libc::SIGTERM);
    let (status, err) = p.wait();
    assert!(status.success(), "{err}");
    let audit: Vec<&str> = err.lines().filter(|l| l.contains("vqosd::audit")).collect();
    assert_eq!(audit.len(), 1, "{err}");
    assert!(audit[0].contains("caller=\"token\""), "{err}");

    // --log-level warn silences info (the audit included).
    let mut p = Proc::start_with(&cfg, &["--backend", "mock", "--log-level", "warn"]);
    p.wait_ready();
    p.signal(libc::SIGTERM);
    let (status, err) = p.wait();
    assert!(status.success() && !err.contains(" INFO "), "{err}");
}

#[test]
fn each_port_up_line_says_what_was_opened() {
    let dir = tempfile::tempdir().unwrap();
    let sock = |n: &str| dir.path().join(n).display().to_string();
    let (cfg, socket) = write_config(
        dir.path(),
        &format!(
            "[[port]]\nname = \"vm1\"\n\
             [[port]]\nname = \"vm2\"\ncreate = false\n\
             [[port]]\nname = \"vh1\"\nkind = \"vhost-user\"\nsocket = \"{}\"\n\
             [[port]]\nname = \"vh2\"\nkind = \"vhost-user\"\nsocket = \"{}\"\nmode = \"client\"\n",
            sock("vh1.sock"),
            sock("vh2.sock")
        ),
    );
    let mut p = Proc::start(&cfg, "mock");
    p.wait_ready();
    // One added through the API is logged the same way.
    let client = Client::new(Endpoint::Unix(socket));
    let _: Value = client
        .call(
            "POST",
            "/v1/ports",
            Some(&json!({"name": "vh3", "kind": "vhost-user", "socket": sock("vh3.sock")})),
        )
        .unwrap();
    p.signal(libc::SIGTERM);
    let (status, err) = p.wait();
    assert!(status.success(), "{err}");
    for line in [
        "Port vm1 up (TAP created)".to_string(),
        "Port vm2 up (attached to an existing TAP)".to_string(),
        format!("Port vh1 up (vhost-user server on {})", sock("vh1.sock")),
        format!("Port vh2 up (vhost-user client of {})", sock("vh2.sock")),
        format!("Port vh3 up (vhost-user server on {})", sock("vh3.sock")),
    ] {
        assert!(err.contains(&line), "no {line:?} in:\n{err}");
    }
    assert!(!err.contains("Port vh1 up (TAP"), "{err}");
}

/// `/v1/health` explains an unreachable etcd in words, not in Rust debug text.
#[test]
fn health_errors_are_sentences() {
    let dir = tempfile::tempdir().unwrap();
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let (cfg, socket) = write_config(
        dir.path(),
        "[cluster]\nhost = \"h1\"\nendpoints = [\"http://127.0.0.1:1\"]\ntimeout = \"1s\"\n",
    );
    let mut p = Proc::start(&cfg, "mock");
    p.wait_ready();
    let client = Client::new(Endpoint::Unix(socket));
    let mut health = Value::Null;
    for _ in 0..100 {
        health = client.call("GET", "/v1/health", None).unwrap();
        if health["cluster"]["error"].is_string() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(health["status"], "degraded", "{health}");
    for error in [&health["error"], &health["cluster"]["error"]] {
        let text = error
            .as_str()
            .unwrap_or_else(|| panic!("no error in {health}"));
        assert!(text.contains("Connection refused"), "{text}");
        for debug in ["Some(", "{", "Os ", "kind:", "::", "\\\""] {
            assert!(!text.contains(debug), "{debug:?} in {text:?}");
        }
    }
    p.signal(libc::SIGTERM);
    assert!(p.wait().0.success());
}
