//! The API server itself: authentication, the socket's permissions, one daemon per socket, and
//! concurrent requests.

use super::*;

#[test]
fn tcp_needs_the_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(
        dir.path(),
        "tcp = \"127.0.0.1:0\"\ntoken_env = \"VQOSD_TEST_TOKEN\"",
    );
    let d = start_with(&text);
    let url = format!("http://{}", d.server.tcp_addr().unwrap());
    let before = d.snapshot();
    for token in [
        None,
        Some("wrong-token-0123456789".to_string()),
        Some(format!("{TOKEN}x")),
    ] {
        let c = Client::from_url(&url, token).unwrap();
        for (method, path, body) in [
            ("GET", "/v1/health", None),
            ("PUT", "/v1/policies/vm1", Some(json!({"weight": 9}))),
        ] {
            let r = c.request(method, path, body.as_ref()).unwrap();
            assert_eq!(r.status, 401, "{method} {path}");
            assert!(r
                .headers
                .contains(&("www-authenticate".into(), "Bearer".into())));
        }
    }
    // A scheme other than Bearer is refused too.
    let raw = format!("GET /v1/health HTTP/1.1\r\nAuthorization: Basic {TOKEN}\r\n\r\n");
    let c = Client::from_url(&url, None).unwrap();
    assert_eq!(c.raw(raw.as_bytes()).unwrap().status, 401);
    assert_eq!(d.snapshot(), before);

    let c = Client::from_url(&url, Some(TOKEN.to_string())).unwrap();
    let h: Value = c.call("GET", "/v1/health", None).unwrap();
    assert_eq!(h["status"], "ok");
    let p: Value = c
        .call("PUT", "/v1/policies/vm1", Some(&json!({"weight": 9})))
        .unwrap();
    assert_eq!(p["weight"], 9);
    // The unix socket needs no token.
    assert_eq!(d.get("/v1/policies/vm1")["weight"], 9);
}

#[test]
fn socket_is_private_to_root() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let meta = fs::metadata(&d.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!((meta.uid(), meta.gid()), (0, 0));
    }
    // No leftovers of the private bind directory.
    let names: Vec<_> = fs::read_dir(d.socket.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("vqosd.sock")]);
}

#[test]
fn a_second_daemon_is_refused_and_a_stale_socket_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(dir.path(), "");
    let config = Config::parse(&text, |_| None).unwrap();
    {
        let mut d = start(dir.path());
        let api = Arc::new(Api::start(&config, Arc::new(MockBackend::new())).unwrap());
        match Server::start(&ServerConfig::from_config(&config), api) {
            Err(ServerError::InUse(p)) => assert_eq!(p, d.socket),
            other => panic!("expected InUse, got {:?}", other.err()),
        }
        // The first one still answers.
        assert_eq!(d.get("/v1/health")["status"], "ok");
        d.server.shutdown();
        assert!(!d.socket.exists(), "shutdown leaves the socket behind");
        assert!(matches!(
            d.client.request("GET", "/v1/health", None),
            Err(ClientError::Connect { .. })
        ));
    }
    // A socket left by a daemon that died (nobody listening) is replaced.
    drop(UnixListener::bind(&config.socket_path).unwrap());
    assert!(config.socket_path.exists());
    let d = start(dir.path());
    assert_eq!(d.get("/v1/health")["status"], "ok");
    // A file that is not a socket is not removed.
    drop(d);
    fs::write(&config.socket_path, "precious").unwrap();
    let api = Arc::new(Api::start(&config, Arc::new(MockBackend::new())).unwrap());
    assert!(matches!(
        Server::start(&ServerConfig::from_config(&config), api),
        Err(ServerError::NotASocket(_))
    ));
    assert_eq!(fs::read_to_string(&config.socket_path).unwrap(), "precious");
}

#[test]
fn concurrent_changes_are_serialised() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path());
    let threads: Vec<_> = (1..=8u32)
        .map(|w| {
            let c = d.client.clone();
            std::thread::spawn(move || {
                let body = json!({"weight": w});
                let r = c.request("PUT", "/v1/policies/vm1", Some(&body)).unwrap();
                assert_eq!(r.status, 200);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Whatever the order, the view, the switch and the disk agree.
    let w = d.get("/v1/policies/vm1")["weight"].as_u64().unwrap();
    assert_eq!(u64::from(d.mock.ports()[0].1.weight), w);
    let saved: Value = serde_json::from_slice(&fs::read(&d.state_file).unwrap()).unwrap();
    assert_eq!(saved["ports"][0]["policy"]["weight"].as_u64(), Some(w));
    assert!(d.mock.calls().contains(&MockCall::SetPolicies(2)));
}

/// The mock switch, stuck installing policies until the test lets it go (a switch loop that
/// takes long to pick a snapshot up): it says when a change has reached it, then waits.
struct GatedSwitch {
    mock: MockBackend,
    entered: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl vqosd::backend::Backend for GatedSwitch {
    fn add_port(
        &self,
        port: &vqosd::backend::Port,
        policy: &vqos_sched::VifPolicy,
    ) -> Result<vqosd::backend::PortOpened, vqosd::backend::BackendError> {
        self.mock.add_port(port, policy)
    }
    fn remove_port(&self, name: &str) -> Result<(), vqosd::backend::BackendError> {
        self.mock.remove_port(name)
    }
    fn migrate_port(&self, src: &str, dst: &str) -> Result<(), vqosd::backend::BackendError> {
        self.mock.migrate_port(src, dst)
    }
    fn set_policies(
        &self,
        policies: &vqos_sched::PolicySet,
    ) -> Result<(), vqosd::backend::BackendError> {
        let _ = self.entered.lock().unwrap().send(());
        let _ = self.release.lock().unwrap().recv();
        self.mock.set_policies(policies)
    }
    fn set_ecn_probabilities(
        &self,
        probabilities: &[(String, f64)],
    ) -> Result<(), vqosd::backend::BackendError> {
        self.mock.set_ecn_probabilities(probabilities)
    }
    fn stats(&self) -> vqosd::backend::SwitchStats {
        self.mock.stats()
    }
    fn loop_health(&self) -> LoopHealth {
        self.mock.loop_health()
    }
    fn stop(&self) {
        self.mock.stop()
    }
}

/// Reads answer while a change is stuck in the switch: the reads run while the change is
/// held at the switch, so if they waited for it they would never finish (no timing: the
/// 60 s only turns that deadlock into a failure).
#[test]
fn reads_do_not_wait_for_a_change_in_progress() {
    use std::sync::mpsc;
    use std::time::Duration;
    use vqosd::http::Request;
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(&config_text(dir.path(), ""), |_| None).unwrap();
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let gated = Arc::new(GatedSwitch {
        mock: MockBackend::new(),
        entered: std::sync::Mutex::new(entered_tx),
        release: std::sync::Mutex::new(release_rx),
    });
    let api = Arc::new(Api::start(&config, gated).unwrap());
    let req = |method: &str, path: &str, body: &str| Request {
        method: method.into(),
        path: path.into(),
        headers: Vec::new(),
        body: body.as_bytes().to_vec(),
    };
    let changer = {
        let api = api.clone();
        let put = req("PUT", "/v1/policies/vm1", r#"{"weight": 6}"#);
        std::thread::spawn(move || api.handle(&put).status)
    };
    // The change holds the changers' lock and is stuck in the switch.
    entered.recv().unwrap();
    let (done_tx, done) = mpsc::channel();
    {
        let api = api.clone();
        std::thread::spawn(move || {
            for path in [
                "/v1/stats",
                "/metrics",
                "/v1/health",
                "/v1/ports",
                "/v1/policies/vm1",
            ] {
                let r = api.handle(&req("GET", path, ""));
                let _ = done_tx.send((path, r.status, r.body));
            }
        });
    }
    for _ in 0..5 {
        let (path, status, body) = done
            .recv_timeout(Duration::from_secs(60))
            .expect("a read waited for the change in progress");
        assert_eq!(status, 200, "{path}");
        // The change is not committed yet: the reader sees the state before it.
        if path == "/v1/policies/vm1" {
            let p: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(p["weight"], 1);
        }
    }
    release.send(()).unwrap();
    assert_eq!(changer.join().unwrap(), 200);
    let r = api.handle(&req("GET", "/v1/stats", ""));
    let stats: StatsView = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(stats.ports[0].policy.as_ref().unwrap().weight, 6);
}
