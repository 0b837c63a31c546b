//! The scenario file as written: the serde shapes (strings for rates and times, unknown keys
//! refused) and the one-line TOML error that names the key and its line.

use serde::Deserialize;

use super::{ControllerParams, CycleCostModel, ScenarioError};

/// The file as written (strings for rates and times).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    pub(super) name: String,
    #[serde(default)]
    pub(super) description: String,
    pub(super) duration: String,
    pub(super) capacity: String,
    #[serde(default = "default_engine")]
    pub(super) engine: String,
    #[serde(default)]
    pub(super) settle: Option<String>,
    #[serde(default)]
    pub(super) cost: Option<String>,
    #[serde(default)]
    pub(super) cpu_hz: Option<u64>,
    #[serde(default)]
    pub(super) cpu_fair: Option<bool>,
    #[serde(default)]
    pub(super) variant: Option<String>,
    #[serde(default)]
    pub(super) threads: Option<usize>,
    #[serde(default)]
    pub(super) capacity_in: Option<String>,
    #[serde(default)]
    pub(super) downlink: Option<String>,
    #[serde(default)]
    pub(super) downlink_flows: Option<usize>,
    #[serde(default)]
    pub(super) cost_model: Option<CycleCostModel>,
    #[serde(default)]
    pub(super) topology: Option<RawTopology>,
    #[serde(default)]
    pub(super) vm: Vec<RawVm>,
    #[serde(default)]
    pub(super) event: Vec<RawEvent>,
    #[serde(default)]
    pub(super) expect: Vec<RawExpect>,
    #[serde(default)]
    pub(super) controller: Option<ControllerParams>,
    /// `[[probe]]` latency probes: run by `vqos lab` only, accepted and ignored here.
    #[serde(default, rename = "probe")]
    pub(super) _probe: Vec<toml::Table>,
    /// `[[app]]` applications in the VMs: run by `vqos lab` only (the simulator models such a
    /// VM by its `[[vm]]` traffic), accepted and ignored here.
    #[serde(default, rename = "app")]
    pub(super) _app: Vec<toml::Table>,
    /// `[[paper]]`: the paper's numbers, carried for the reports.
    #[serde(default)]
    pub(super) paper: Vec<super::paper::RawPaper>,
    /// `[claims]`: id = the paper's claim an `[[expect]]` (or a lab `[[probe]]`) checks.
    #[serde(default)]
    pub(super) claims: std::collections::BTreeMap<String, String>,
}

pub(super) fn default_engine() -> String {
    "vqos".to_string()
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTopology {
    #[serde(default)]
    pub(super) direction: Option<String>,
    #[serde(default)]
    pub(super) bottleneck: Option<String>,
    #[serde(default)]
    pub(super) bottleneck_queue: Option<u32>,
    #[serde(default)]
    pub(super) controllers: Vec<String>,
    #[serde(default)]
    pub(super) tso: Option<bool>,
}

/// Keys a vm and an event share.
#[derive(Debug, Deserialize, Default, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVmKeys {
    pub(super) weight: Option<u32>,
    pub(super) min: Option<String>,
    #[serde(alias = "max_out")]
    pub(super) max: Option<String>,
    pub(super) max_in: Option<String>,
    pub(super) burst: Option<String>,
    pub(super) priority: Option<u8>,
    pub(super) flows: Option<u32>,
    pub(super) traffic: Option<String>,
    pub(super) packet_size: Option<u32>,
    pub(super) rate: Option<String>,
    pub(super) rtt: Option<String>,
    pub(super) on: Option<String>,
    pub(super) off: Option<String>,
    pub(super) start: Option<String>,
    pub(super) stop: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVm {
    pub(super) name: String,
    /// Overrides `[topology].direction` for this VM.
    pub(super) direction: Option<String>,
    /// A CPU limit on the VM's TCP endpoint in the lab (`"25%"` of one core).
    pub(super) cpu: Option<String>,
    /// A CPU limit the lab calibrates before the run: the share of a core at which the VM
    /// alone gets this share of the tightest link (`"60%"`).
    pub(super) cpu_alone: Option<String>,
    #[serde(flatten)]
    pub(super) keys: RawVmKeys,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEvent {
    pub(super) at: String,
    pub(super) vm: Option<String>,
    pub(super) bottleneck: Option<String>,
    #[serde(flatten)]
    pub(super) keys: RawVmKeys,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExpect {
    #[serde(default)]
    pub(super) phase: usize,
    pub(super) whole_run: Option<bool>,
    pub(super) vm: Option<String>,
    pub(super) near_reference_pct: Option<f64>,
    pub(super) aggregate_at_least: Option<f64>,
    pub(super) keeps_at_least: Option<f64>,
    pub(super) of_phase: Option<usize>,
    pub(super) loses_at_least: Option<f64>,
    pub(super) max_at_least: Option<f64>,
    pub(super) unfairness_at_most: Option<f64>,
    pub(super) unfairness_at_least: Option<f64>,
    pub(super) ratio_at_most: Option<f64>,
    pub(super) ratio_at_least: Option<f64>,
    pub(super) vms: Option<Vec<String>>,
    pub(super) ordered: Option<bool>,
    pub(super) lab_only: Option<bool>,
    pub(super) claim: Option<String>,
}

/// Turns a toml error into one line naming the problem and the line number. For an unknown
/// key the line is the key's own (toml reports the enclosing table for flattened tables).
pub(super) fn toml_error(text: &str, e: &toml::de::Error) -> ScenarioError {
    let msg = e.message().to_string();
    let Some(span) = e.span() else {
        return ScenarioError::Toml(msg);
    };
    let start = span.start.min(text.len());
    let mut line = text[..start].matches('\n').count() + 1;
    if let Some(key) = msg
        .strip_prefix("unknown field `")
        .and_then(|r| r.split('`').next())
    {
        let found = text.lines().enumerate().skip(line - 1).find(|(_, l)| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        });
        if let Some((i, _)) = found {
            line = i + 1;
        }
    }
    ScenarioError::Toml(format!("line {line}: {msg}"))
}
