//! The `[cluster]` section of the config (docs/cluster.md).
//!
//! ```toml
//! [cluster]
//! host = "h1"                                 # this host's name in the key layout
//! endpoints = ["http://127.0.0.1:2379"]       # etcd client URLs
//! period = "500ms"                            # status, demands and shares every period
//! lease_ttl = "3s"                            # the status key dies this long after the host
//! timeout = "1s"                              # every etcd call
//! probe = "1Mbit"                             # least demand an idle tenant vif publishes
//! compact_every = "5m"                        # etcd compaction (by the lowest live host)
//! # user = "vqos"                             # etcd authentication, with
//! # password_file = "/etc/vqos/etcd-password" # the password's file (or VQOS_ETCD_PASSWORD)
//! # ca_file = "/etc/vqos/etcd-ca.pem"         # TLS (https:// endpoints), with optionally
//! # cert_file = "/etc/vqos/etcd-client.pem"   # a client certificate
//! # key_file = "/etc/vqos/etcd-client.key"    # and its key
//!
//! # [cluster.aggregators]                     # the shares from aggregator shards' leaders
//! # shards = 8                                # tenants hashed over this many shards
//! # listen = "10.0.0.5:7452"                  # where this host leads shards (omit: never)
//! # advertise = "https://10.0.0.5:7452"       # how hosts reach it (default: http(s)://listen)
//! # ca_file = "/etc/vqos/fleet-ca.pem"         # mutual TLS on the sessions: the fleet's CA,
//! # cert_file = "/etc/vqos/host.pem"          # this host's certificate (CN = host, serves
//! # key_file = "/etc/vqos/host.key"           # and connects) and its key
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use vqos_api::wire::Rate;
use vqos_cluster::rpc::tls::RpcTls;
use vqos_cluster::{keys, EtcdSettings};
use vqos_sched::units::parse_duration_ns;

/// The section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    host: String,
    endpoints: Vec<String>,
    period: Option<String>,
    lease_ttl: Option<String>,
    timeout: Option<String>,
    probe: Option<Rate>,
    compact_every: Option<String>,
    user: Option<String>,
    password_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    aggregators: Option<RawAggregators>,
}

/// `[cluster.aggregators]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAggregators {
    shards: Option<u32>,
    listen: Option<String>,
    advertise: Option<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

/// The aggregators' settings (docs/cluster.md, "The agent on the aggregators").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregatorsConfig {
    /// Tenants are hashed over this many shards (every host must say the same).
    pub shards: u32,
    /// Where this host serves the shards it leads; `None`: it never campaigns.
    pub listen: Option<std::net::SocketAddr>,
    /// How hosts reach it (the election key's value); `None`: `http://` (`https://` with
    /// `tls`) and the address it bound.
    pub advertise: Option<String>,
    /// Mutual TLS on the sessions, both as a host and as a leader (`None`: plain `http://`).
    pub tls: Option<RpcTls>,
}

/// The TLS files, all three or none, each a file that exists.
fn rpc_tls(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<RpcTls>, String> {
    let (ca_file, cert_file, key_file) = match (ca, cert, key) {
        (None, None, None) => return Ok(None),
        (Some(a), Some(c), Some(k)) => (a, c, k),
        _ => {
            return Err(
                "cluster.aggregators: ca_file, cert_file and key_file go together \
                        (mutual TLS: the fleet's CA, this host's certificate and its key)"
                    .into(),
            )
        }
    };
    for (key, path) in [
        ("ca_file", &ca_file),
        ("cert_file", &cert_file),
        ("key_file", &key_file),
    ] {
        if !path.is_file() {
            return Err(format!(
                "cluster.aggregators.{key}: {} is not a file",
                path.display()
            ));
        }
    }
    Ok(Some(RpcTls {
        ca_file,
        cert_file,
        key_file,
    }))
}

impl RawAggregators {
    fn validate(self) -> Result<AggregatorsConfig, String> {
        let tls = rpc_tls(self.ca_file, self.cert_file, self.key_file)?;
        let shards = self.shards.unwrap_or(8);
        if !(1..=4096).contains(&shards) {
            return Err("cluster.aggregators.shards must be 1 to 4096".into());
        }
        let listen = match &self.listen {
            None => None,
            Some(l) => Some(l.parse::<std::net::SocketAddr>().map_err(|e| {
                format!("cluster.aggregators.listen: {l:?} is not an address and port ({e})")
            })?),
        };
        let advertise = match (&listen, self.advertise) {
            (None, Some(_)) => {
                return Err("cluster.aggregators.advertise needs listen".into());
            }
            (None, None) => None,
            (Some(_), Some(a)) if !(a.starts_with("http://") || a.starts_with("https://")) => {
                return Err(format!(
                    "cluster.aggregators.advertise: {a:?} must start with http:// or https://"
                ));
            }
            (Some(_), Some(a)) if a.starts_with("https://") != tls.is_some() => {
                return Err(format!(
                    "cluster.aggregators.advertise: {a:?} must be https:// with ca_file, \
                     cert_file and key_file, and http:// without them"
                ));
            }
            (Some(_), Some(a)) => Some(a),
            (Some(l), None) if l.ip().is_unspecified() => {
                return Err(format!(
                    "cluster.aggregators.advertise is needed when listen is {l} (how should \
                     the other hosts reach this one?)"
                ));
            }
            // Found once bound (a port of 0 is then the one the kernel gave).
            (Some(_), None) => None,
        };
        Ok(AggregatorsConfig {
            shards,
            listen,
            advertise,
            tls,
        })
    }
}

/// The agent's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This host's name in the key layout.
    pub host: String,
    /// How to reach etcd.
    pub etcd: EtcdSettings,
    /// The period of status, demands and shares.
    pub period: Duration,
    /// The status lease's time to live, whole seconds.
    pub lease_ttl_s: i64,
    /// Deadline of every etcd call.
    pub timeout: Duration,
    /// Least demand an idle tenant vif publishes, bit/s.
    pub probe_bps: u64,
    /// How often etcd is compacted, to the revision of the interval before (by the live host
    /// of the lowest name).
    pub compact_every: Duration,
    /// With `[cluster.aggregators]`: the shares come from the shards' leaders.
    pub aggregators: Option<AggregatorsConfig>,
}

fn duration(key: &str, text: &Option<String>, default: Duration) -> Result<Duration, String> {
    match text {
        None => Ok(default),
        Some(t) => match parse_duration_ns(t) {
            Ok(0) => Err(format!("cluster.{key} must be positive")),
            Ok(ns) => Ok(Duration::from_nanos(ns)),
            Err(e) => Err(format!("cluster.{key}: {e}")),
        },
    }
}

impl RawCluster {
    /// Checks the section.
    pub fn validate(self) -> Result<ClusterConfig, String> {
        keys::check_name("host", &self.host).map_err(|e| format!("cluster.host: {e}"))?;
        let etcd = EtcdSettings {
            endpoints: self.endpoints,
            user: self.user,
            password_file: self.password_file,
            ca_file: self.ca_file,
            cert_file: self.cert_file,
            key_file: self.key_file,
        };
        etcd.validate().map_err(|e| format!("cluster: {e}"))?;
        let period = duration("period", &self.period, Duration::from_millis(500))?;
        if period < Duration::from_millis(10) {
            return Err("cluster.period must be at least 10ms".into());
        }
        let ttl = duration("lease_ttl", &self.lease_ttl, Duration::from_secs(3))?;
        if ttl.subsec_nanos() != 0 || ttl < Duration::from_secs(2) {
            return Err("cluster.lease_ttl must be whole seconds, at least 2s".into());
        }
        if ttl < period * 2 {
            return Err("cluster.lease_ttl must be at least two periods".into());
        }
        Ok(ClusterConfig {
            host: self.host,
            etcd,
            period,
            lease_ttl_s: ttl.as_secs() as i64,
            timeout: duration("timeout", &self.timeout, Duration::from_secs(1))?,
            probe_bps: self.probe.and_then(|r| r.0).unwrap_or(1_000_000),
            compact_every: duration(
                "compact_every",
                &self.compact_every,
                vqos_cluster::etcd::COMPACT_EVERY,
            )?,
            aggregators: self.aggregators.map(RawAggregators::validate).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(section: &str) -> Result<Config, String> {
        Config::parse(&format!("[cluster]\n{section}"), |_| None).map_err(|e| {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(c) = src {
                s.push_str(&format!(": {c}"));
                src = c.source();
            }
            s
        })
    }

    #[test]
    fn the_cluster_section_has_defaults() {
        let c = parse("host = \"h1\"\nendpoints = [\"http://127.0.0.1:2379\"]")
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.host, "h1");
        assert_eq!(c.period.as_millis(), 500);
        assert_eq!(c.lease_ttl_s, 3);
        assert_eq!(c.timeout.as_millis(), 1000);
        assert_eq!(c.probe_bps, 1_000_000);
        assert_eq!(c.compact_every.as_secs(), 300);
        assert_eq!(c.etcd.endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(c.aggregators, None);
        assert!(Config::parse("", |_| None).unwrap().cluster.is_none());
        let agg = |text: &str| {
            let base = "host = \"h1\"\nendpoints = [\"http://127.0.0.1:2379\"]";
            parse(&format!("{base}\n[cluster.aggregators]\n{text}"))
                .map(|c| c.cluster.unwrap().aggregators.unwrap())
        };
        let a = agg("").unwrap();
        assert_eq!(
            (a.shards, a.listen, a.advertise, a.tls),
            (8, None, None, None)
        );
        let files = "ca_file = \"/etc/hostname\"\ncert_file = \"/etc/hostname\"\nkey_file = \"/etc/hostname\"";
        let a = agg(&format!(
            "listen = \"127.0.0.1:1\"\nadvertise = \"https://a:1\"\n{files}"
        ))
        .unwrap();
        assert_eq!(
            a.tls.unwrap().cert_file,
            std::path::Path::new("/etc/hostname")
        );
        let a = agg("shards = 2\nlisten = \"127.0.0.1:7452\"").unwrap();
        assert_eq!(a.listen, Some("127.0.0.1:7452".parse().unwrap()));
        assert_eq!(a.advertise, None);
        for (text, want) in [
            ("shards = 0", "1 to 4096"),
            ("listen = \"here\"", "not an address"),
            ("listen = \"0.0.0.0:7452\"", "advertise is needed"),
            ("advertise = \"http://a:1\"", "needs listen"),
            ("listen = \"127.0.0.1:1\"\nadvertise = \"a:1\"", "http://"),
            ("shard = 2", "unknown field"),
            ("ca_file = \"/etc/hostname\"", "go together"),
            (
                "ca_file = \"/etc/hostname\"\ncert_file = \"/etc/hostname\"\nkey_file = \"/nonexistent/k\"",
                "key_file: /nonexistent/k is not a file",
            ),
            (
                "listen = \"127.0.0.1:1\"\nadvertise = \"https://a:1\"",
                "must be https:// with ca_file",
            ),
            (
                "listen = \"127.0.0.1:1\"\nadvertise = \"http://a:1\"\nca_file = \"/etc/hostname\"\ncert_file = \"/etc/hostname\"\nkey_file = \"/etc/hostname\"",
                "must be https:// with ca_file",
            ),
        ] {
            let e = agg(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn bad_cluster_sections_are_named() {
        let ep = "endpoints = [\"http://127.0.0.1:2379\"]";
        for (text, want) in [
            (format!("host = \"a/b\"\n{ep}"), "cluster.host"),
            ("host = \"h1\"\nendpoints = []".to_string(), "no endpoints"),
            (
                format!("host = \"h1\"\n{ep}\nperiod = \"0s\""),
                "cluster.period",
            ),
            (
                format!("host = \"h1\"\n{ep}\nlease_ttl = \"1500ms\""),
                "whole seconds",
            ),
            (
                format!("host = \"h1\"\n{ep}\nperiod = \"2s\""),
                "two periods",
            ),
            (
                format!("host = \"h1\"\n{ep}\nuser_name = \"x\""),
                "unknown field",
            ),
            (ep.to_string(), "missing field `host`"),
            (
                "host = \"h1\"\nendpoints = [\"https://a:1\"]".to_string(),
                "needs ca_file",
            ),
        ] {
            let e = parse(&text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
