//! The daemon's health (`GET /v1/health`) and the exposition (`GET /metrics`), which reports
//! it too, so that an operator can alert on what the health endpoint says.

use vqos_sched::units::format_rate;

use super::{cluster, Api};
use crate::http::Response;
use crate::metrics;
use crate::wire::{HealthView, LoopView};

impl Api {
    pub(super) fn health(&self) -> Response {
        let h = self.health_view();
        Response::json(if h.status == "unhealthy" { 503 } else { 200 }, &h)
    }

    /// The body of `GET /v1/health`.
    fn health_view(&self) -> HealthView {
        let v = self.snapshot();
        let h = self.backend.loop_health();
        let problem = h.problem();
        let cluster = self.cluster_health();
        let (status, error) = match (problem, cluster::degraded(&cluster)) {
            (Some(p), _) => ("unhealthy", Some(p)),
            (None, Some(why)) => ("degraded", Some(why)),
            (None, None) => ("ok", None),
        };
        HealthView {
            status: status.to_string(),
            error,
            cluster,
            version: env!("CARGO_PKG_VERSION").to_string(),
            engine: self.engine.to_string(),
            capacity: format_rate(v.set.capacity_bps),
            ports: v.ports.len(),
            uptime_s: self.started.elapsed().as_secs(),
            forwarding: LoopView {
                running: h.running,
                stats_age_ms: h.stats_age_ns / 1_000_000,
                stale_after_ms: h.stale_after_ns() / 1_000_000,
            },
        }
    }

    /// The answer to `GET /metrics`: the switch, the health, the etcd agent.
    pub(super) fn metrics(&self) -> Response {
        Response::text(
            200,
            metrics::CONTENT_TYPE,
            metrics::render(&self.stats(), &self.health_view(), self.start_time_s())
                + &self.cluster_metrics(),
        )
    }

    /// When the daemon started, seconds since the Unix epoch (wall clock now minus the
    /// monotonic time since the start, so a clock step moves it as it moves the scrape).
    fn start_time_s(&self) -> f64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        now.saturating_sub(self.started.elapsed()).as_secs_f64()
    }
}
