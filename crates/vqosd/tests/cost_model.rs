//! The cost model through the API on the mock switch: `GET /v1/cost-model`, `POST
//! /v1/calibrate` (fit, refusals, apply), and the oversell check on policy changes.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use vqos_api::cost::{CalibrationView, CostModelView};
use vqos_sched::calibrate::Sample;
use vqosd::api::Api;
use vqosd::backend::MockBackend;
use vqosd::client::{Client, ClientError, Endpoint};
use vqosd::config::Config;
use vqosd::server::{Server, ServerConfig};
use vqosd::wire::StatsView;

/// The paper's core: 1.54 G cycles/s, purchases of 4 and 4 Gbit/s priced at 1518-byte frames
/// with 1300 + 0.25·bytes cycles per frame (72 % of the core).
fn config(dir: &Path) -> Config {
    let text = format!(
        r#"
capacity = "10Gbit"
engine = "c2qos"
cost = "cycles"
cycles_per_sec = 1540000000
state_file = "{dir}/state.json"

[api]
socket = "{dir}/vqosd.sock"

[cost_model]
base_cycles = 1300.0
cycles_per_byte = 0.25
price_frame_bytes = 1518

[[port]]
name = "vm1"
policy = {{ max = "4Gbit" }}

[[port]]
name = "vm2"
policy = {{ max = "4Gbit" }}
"#,
        dir = dir.display()
    );
    Config::parse(&text, |_| None).expect("config")
}

/// `n` batches of 1..=32 frames of 64..=1518 bytes (multiples of 4) costing exactly
/// `a + b_quarters/4 · len` cycles per frame.
fn samples(n: usize, a: u64, b_quarters: u64) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let frames = (i % 32) as u32 + 1;
            let len = 64 + ((i as u64 * 97) % 1455) / 4 * 4;
            let bytes = u64::from(frames) * len;
            Sample {
                frames,
                bytes,
                cycles: a * u64::from(frames) + b_quarters * bytes / 4,
            }
        })
        .collect()
}

fn refusal(r: Result<Value, ClientError>) -> (u16, String) {
    match r {
        Err(ClientError::Api { status, message }) => (status, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn calibrate_fits_the_sampled_batches_and_apply_reprices_the_purchases() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let mock = Arc::new(MockBackend::new());
    let api = Arc::new(Api::start(&config, mock.clone()).unwrap());
    let _server = Server::start(&ServerConfig::from_config(&config), api).unwrap();
    let c = Client::new(Endpoint::Unix(config.socket_path.clone()));

    let m: CostModelView = c.call("GET", "/v1/cost-model", None).unwrap();
    assert_eq!((m.cost.as_str(), m.source.as_str()), ("cycles", "config"));
    assert_eq!(
        (m.base_cycles, m.cycles_per_byte),
        (Some(1300.0), Some(0.25))
    );
    assert_eq!((m.price_frame_bytes, m.core_share), (1518, 1.0));
    assert_eq!(m.sold_per_sec, Some(2 * 553_194_993));
    assert_eq!(m.budget_per_sec, Some(1_540_000_000));
    assert_eq!(m.samples, 0);
    let stats: StatsView = c.call("GET", "/v1/stats", None).unwrap();
    assert_eq!(stats.cost_model.unwrap().sold_per_sec, m.sold_per_sec);

    // No traffic yet, then one frame size only: refused with the reason, nothing fitted.
    let (status, msg) = refusal(c.call("POST", "/v1/calibrate", None));
    assert_eq!(status, 409);
    assert!(msg.starts_with("Too few samples: 0 batches"), "{msg}");
    let one_size: Vec<Sample> = samples(100, 1000, 1)
        .into_iter()
        .map(|s| Sample {
            bytes: u64::from(s.frames) * 1514,
            ..s
        })
        .collect();
    mock.set_cost_samples(one_size);
    let (status, msg) = refusal(c.call("POST", "/v1/calibrate", None));
    assert_eq!(status, 409);
    assert!(msg.starts_with("No spread of frame sizes"), "{msg}");

    // A spread of sizes: the model is recovered exactly; without apply nothing changes.
    mock.set_cost_samples(samples(300, 1000, 1));
    let fit: CalibrationView = c.call("POST", "/v1/calibrate", None).unwrap();
    assert!((fit.base_cycles - 1000.0).abs() < 1e-6, "{fit:?}");
    assert!((fit.cycles_per_byte - 0.25).abs() < 1e-9, "{fit:?}");
    assert_eq!((fit.samples, fit.outliers, fit.applied), (300, 0, false));
    assert_eq!(fit.cycles_unit, "ns");
    assert_eq!(fit.cost_model.source, "config");
    assert_eq!(fit.cost_model.samples, 300);
    assert!(mock.last_policies().is_none(), "the switch was not touched");

    // Applied: the switch gets the purchases re-priced with the fitted model.
    let body = json!({"apply": true});
    let fit: CalibrationView = c.call("POST", "/v1/calibrate", Some(&body)).unwrap();
    assert!(fit.applied);
    assert_eq!(fit.cost_model.source, "calibrated");
    assert_eq!(fit.cost_model.base_cycles, Some(fit.base_cycles));
    let installed = mock.last_policies().unwrap();
    let model = installed.pricing.model.unwrap();
    assert!((model.base_cycles() - 1000.0).abs() < 1e-6);
    // 4 Gbit/s of 1518-byte frames at 1000 + 0.25·1518 cycles.
    assert_eq!(installed.cost_per_sec(4_000_000_000), 454_380_764);

    // A policy that oversells the core under the calibrated model: refused, nothing changes.
    let put = json!({"max": "10Gbit"});
    let (status, msg) = refusal(c.call("PUT", "/v1/policies/vm2", Some(&put)));
    assert_eq!(status, 422);
    assert_eq!(
        msg,
        "Purchases need 1.590G cycles/s, more than the 1.540G cycles/s the switch may sell \
         (c2qos)"
    );
}

#[test]
fn a_calibrated_model_that_oversells_is_not_applied_and_bad_requests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let mock = Arc::new(MockBackend::new());
    let api = Arc::new(Api::start(&config, mock.clone()).unwrap());
    let _server = Server::start(&ServerConfig::from_config(&config), api).unwrap();
    let c = Client::new(Endpoint::Unix(config.socket_path.clone()));
    // Frames three times as costly: the 8 Gbit/s of purchases would need 2.2 cores.
    mock.set_cost_samples(samples(100, 4000, 3));
    let (status, msg) = refusal(c.call("POST", "/v1/calibrate", Some(&json!({"apply": true}))));
    assert_eq!(status, 422);
    assert!(
        msg.starts_with("Calibrated model not applied: Purchases need 3.385G cycles/s"),
        "{msg}"
    );
    assert!(mock.last_policies().is_none());
    let m: CostModelView = c.call("GET", "/v1/cost-model", None).unwrap();
    assert_eq!((m.source.as_str(), m.base_cycles), ("config", Some(1300.0)));
    // Without apply the fit is still answered.
    let fit: CalibrationView = c.call("POST", "/v1/calibrate", None).unwrap();
    assert!((fit.base_cycles - 4000.0).abs() < 1e-6 && !fit.applied);
    let (status, msg) = refusal(c.call("POST", "/v1/calibrate", Some(&json!({"aply": true}))));
    assert_eq!(status, 400);
    assert!(msg.contains("unknown field `aply`"), "{msg}");
    let (status, _) = refusal(c.call("GET", "/v1/calibrate", None));
    assert_eq!(status, 405);
    let (status, _) = refusal(c.call("POST", "/v1/cost-model", None));
    assert_eq!(status, 405);
}
