//! `capacity_in` and the `[downlink]` table: the scheduled downlink (docs/design.md, "The
//! scheduled downlink").
//!
//! ```toml
//! capacity_in = "400Mbit"     # what the vifs receive, together; default: capacity
//! [downlink]
//! schedule = true             # false: frames to a vif pass only its inbound max (a bucket)
//! queue_frames = 1024         # per vif
//! queue_bytes = "4MiB"        # per vif, buffer memory
//! flows = 64                  # flow queues per vif (FQ-CoDel); 1: one FIFO per vif
//! memory = "256MiB"           # per forwarding thread, all its queues
//! aqm_target = "1ms"          # CoDel: acceptable standing delay
//! aqm_interval = "10ms"       # CoDel: how long above target before signalling
//! ```

use serde::Deserialize;
use vqos_sched::policy::UNLIMITED_IN_BPS;
use vqos_sched::units::{parse_bytes, parse_duration_ns};
use vqos_sched::{AqmParams, DownlinkConfig};

use super::ConfigError;
use crate::wire::Rate;

/// `[downlink]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDownlink {
    schedule: Option<bool>,
    queue_frames: Option<usize>,
    queue_bytes: Option<String>,
    memory: Option<String>,
    flows: Option<usize>,
    aqm_target: Option<String>,
    aqm_interval: Option<String>,
}

/// `capacity_in` as the policy set holds it: `None` (the same as `capacity`), a rate, or
/// [`UNLIMITED_IN_BPS`] for "unlimited".
pub(super) fn capacity_in(raw: Option<Rate>) -> Result<Option<u64>, ConfigError> {
    match raw {
        None => Ok(None),
        Some(Rate(None)) => Ok(Some(UNLIMITED_IN_BPS)),
        Some(Rate(Some(0))) => Err(bad("capacity_in must be a positive rate or \"unlimited\"")),
        Some(Rate(Some(r))) => Ok(Some(r)),
    }
}

/// The table validated: `None` when `schedule = false`.
pub(super) fn downlink(raw: Option<RawDownlink>) -> Result<Option<DownlinkConfig>, ConfigError> {
    let raw = raw.unwrap_or_default();
    let d = DownlinkConfig::default();
    let size = |key: &str, v: &Option<String>, default: u64| match v {
        None => Ok(default),
        Some(t) => parse_bytes(t).map_err(|e| bad(&format!("downlink.{key}: {e}"))),
    };
    let time = |key: &str, v: &Option<String>, default: u64| match v {
        None => Ok(default),
        Some(t) => parse_duration_ns(t).map_err(|e| bad(&format!("downlink.{key}: {e}"))),
    };
    let config = DownlinkConfig {
        queue_frames: raw.queue_frames.unwrap_or(d.queue_frames),
        queue_bytes: size("queue_bytes", &raw.queue_bytes, d.queue_bytes)?,
        memory_bytes: size("memory", &raw.memory, d.memory_bytes)?,
        aqm: AqmParams {
            target_ns: time("aqm_target", &raw.aqm_target, d.aqm.target_ns)?,
            interval_ns: time("aqm_interval", &raw.aqm_interval, d.aqm.interval_ns)?,
        },
        flows: raw.flows.unwrap_or(d.flows),
        // Drawn at random by each downlink: a fixed seed is for tests, not a daemon setting.
        flow_seed: None,
    };
    config.validate().map_err(|e| bad(&e))?;
    Ok(raw.schedule.unwrap_or(true).then_some(config))
}

fn bad(message: &str) -> ConfigError {
    ConfigError::Downlink(message.to_string())
}

impl super::Config {
    /// What the config allows but an operator likely did not mean, said at start and by
    /// `--check`: a TAP uplink with fewer queues than forwarding threads under the scheduled
    /// downlink (what the VMs receive is then read by fewer threads than it could be).
    pub fn notices(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let (Some(u), true, Some(_)) = (&self.uplink, self.threads > 1, &self.downlink) {
            let queues = usize::from(u.config.queues.unwrap_or(super::DEFAULT_UPLINK_TAP_QUEUES));
            if u.config.kind == crate::wire::PortKind::Tap && queues < self.threads {
                out.push(format!(
                    "Uplink '{}' is a TAP of {queues} queue(s) on {} forwarding threads: what \
                     the VMs receive is read by {queues} thread(s) only; set [uplink] queues = {}",
                    u.config.name, self.threads, self.threads
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, |_| None).map_err(|e| vqos_api::chain(&e))
    }

    #[test]
    fn the_downlink_is_scheduled_by_default_and_its_table_is_read() {
        let c = parse("").unwrap();
        assert_eq!(c.downlink, Some(vqos_sched::DownlinkConfig::default()));
        assert_eq!(c.capacity_in_bps, None);
        let c = parse(
            "capacity = \"1Gbit\"\ncapacity_in = \"400Mbit\"\n[downlink]\nqueue_frames = 64\n\
             queue_bytes = \"1MiB\"\nmemory = \"64MiB\"\naqm_target = \"2ms\"\naqm_interval = \"20ms\"\n\
             flows = 1",
        )
        .unwrap();
        let d = c.downlink.unwrap();
        assert_eq!(
            (d.queue_frames, d.queue_bytes, d.memory_bytes),
            (64, 1 << 20, 64 << 20)
        );
        assert_eq!(
            (d.aqm.target_ns, d.aqm.interval_ns),
            (2_000_000, 20_000_000)
        );
        assert_eq!(
            (d.flows, vqos_sched::DownlinkConfig::default().flows),
            (1, 64)
        );
        assert_eq!(c.capacity_in_bps, Some(400_000_000));
        assert_eq!(c.policy_set().downlink_capacity_bps(), Some(400_000_000));
        let c = parse("capacity = \"1Gbit\"\ncapacity_in = \"unlimited\"").unwrap();
        assert_eq!(c.policy_set().downlink_capacity_bps(), None);
        assert_eq!(
            parse("[downlink]\nschedule = false").unwrap().downlink,
            None
        );
    }

    #[test]
    fn a_tap_uplink_with_fewer_queues_than_threads_is_noticed() {
        let notices = |text: &str| parse(text).unwrap().notices();
        let n = notices("threads = 2\n[uplink]\nname = \"up0\"\nqueues = 1\n");
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(n[0].contains("set [uplink] queues = 2"), "{n:?}");
        // The default queues (4) are enough for 2 threads.
        for quiet in [
            "threads = 2\n[uplink]\nname = \"up0\"\n",
            "threads = 2\n[uplink]\nname = \"up0\"\nqueues = 2\n",
            "[uplink]\nname = \"up0\"\n",
            "threads = 2\n[downlink]\nschedule = false\n[uplink]\nname = \"up0\"\n",
            "threads = 2\n[uplink]\nname = \"eth0\"\nkind = \"af-packet\"\n",
        ] {
            assert!(notices(quiet).is_empty(), "{quiet}");
        }
    }

    #[test]
    fn bad_downlink_settings_are_clear_errors() {
        for (text, says) in [
            (
                "capacity_in = \"0bit\"",
                "capacity_in must be a positive rate",
            ),
            (
                "[downlink]\nqueue_frames = 0",
                "queue_frames must be at least 1",
            ),
            (
                "[downlink]\nqueue_bytes = \"1KiB\"",
                "queue_bytes must be at least",
            ),
            (
                "[downlink]\nmemory = \"1MiB\"",
                "memory must be at least queue_bytes",
            ),
            ("[downlink]\naqm_target = \"soon\"", "downlink.aqm_target"),
            (
                "[downlink]\nflows = 0",
                "downlink flows must be in 1..=1024",
            ),
            (
                "[downlink]\nflows = 4096",
                "downlink flows must be in 1..=1024",
            ),
            (
                "[downlink]\naqm_target = \"20ms\"",
                "shorter than its target",
            ),
            ("[downlink]\nqueue = 3", "unknown field"),
            (
                "capacity_in = \"100Mbit\"\n[[port]]\nname = \"a\"\npolicy = { min = \"200Mbit\" }",
                "exceeds the downlink capacity",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
