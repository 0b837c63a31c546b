//! vqosd's control API on arbitrary requests: a sequence of (route, name, body) against a
//! fresh daemon state on the mock switch each run. Every answer is an HTTP status with a JSON
//! or text body, never a panic; the policy set stays valid after any sequence.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use vqosd::api::Api;
use vqosd::backend::MockBackend;
use vqosd::config::Config;
use vqosd::http::Request;

/// The routes of the API (and a few it does not have).
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/ports"),
    ("PUT", "/v1/policies/{}"),
    ("GET", "/v1/policies/{}"),
    ("DELETE", "/v1/ports/{}"),
    ("GET", "/v1/ports/{}"),
    ("GET", "/v1/ports"),
    ("GET", "/v1/policies"),
    ("GET", "/v1/stats"),
    ("GET", "/v1/health"),
    ("GET", "/metrics"),
    ("PATCH", "/v1/policies/{}"),
    ("GET", "/{}"),
];

#[derive(Arbitrary, Debug)]
struct Call {
    route: u8,
    name: String,
    body: Vec<u8>,
}

/// A private directory for the state file, made once per process.
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temp dir").keep())
}

fuzz_target!(|calls: Vec<Call>| {
    let dir = dir();
    let state = dir.join("state.json");
    let _ = std::fs::remove_file(&state);
    let text = format!(
        "capacity = \"1Gbit\"\nstate_file = \"{}\"\n[api]\nsocket = \"{}/vqosd.sock\"\n\
         [[port]]\nname = \"vm1\"\n[[port]]\nname = \"vm2\"\n\
         policy = {{ weight = 2, min = \"100Mbit\", max = \"500Mbit\" }}\n",
        state.display(),
        dir.display()
    );
    let config = Config::parse(&text, |_| None).expect("fuzz config");
    let api = Api::start(&config, Arc::new(MockBackend::new())).expect("api");
    for c in calls.iter().take(16) {
        let (method, path) = ROUTES[usize::from(c.route) % ROUTES.len()];
        let req = Request {
            method: method.to_string(),
            path: path.replace("{}", &c.name),
            headers: vec![("content-type".into(), "application/json".into())],
            body: c.body.clone(),
        };
        let resp = api.handle(&req);
        assert!(
            (200..600).contains(&resp.status),
            "{req:?}: {}",
            resp.status
        );
        api.policies()
            .validate()
            .expect("the API keeps the policy set valid");
    }
});
