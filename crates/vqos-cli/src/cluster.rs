//! `vqos cluster`: the desired state in etcd and the hosts' status (docs/cluster.md).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::json;
use vqos_api::wire::MAX_PRIORITY;
use vqos_cluster::etcd::deadline;
use vqos_cluster::etcd_client::{Client, GetOptions};
use vqos_cluster::node::view::LeaderView;
use vqos_cluster::{keys, EtcdSettings, HostStatus, TenantDoc, VifDoc};
use vqos_sched::units::{format_rate, parse_rate};

use crate::exit::UsageError;
use crate::out::outln;

/// Deadline of each etcd call.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Arguments of `vqos cluster`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// etcd client URLs, comma-separated (default: $VQOS_ETCD_ENDPOINTS).
    #[arg(long, value_name = "URL[,URL]", global = true)]
    endpoints: Option<String>,
    /// etcd user (the password comes from $VQOS_ETCD_PASSWORD).
    #[arg(long, global = true)]
    user: Option<String>,
    /// CA certificate (PEM) of https:// endpoints.
    #[arg(long, value_name = "FILE", global = true)]
    ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for an etcd that asks for one (mutual TLS); with --key-file.
    #[arg(long, value_name = "FILE", global = true)]
    cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", global = true)]
    key_file: Option<PathBuf>,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// A tenant's limits across all hosts.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// A vif's policy on one host (HOST/PORT).
    Vif {
        #[command(subcommand)]
        command: VifCommand,
    },
    /// Per host and tenant: policy, share, measured rate; stale and dead hosts.
    #[command(
        after_help = "A host is stale when its status is older than 3 of its periods (by \
        the clocks of this machine and of the host), dead when its status is gone (its lease \
        expired) while it still holds a grant: the others count its grant's fallback for it."
    )]
    Status {
        /// Only this tenant's vifs, hosts and limits.
        #[arg(long)]
        tenant: Option<String>,
        /// The agents run on the aggregators with this many shards ([cluster.aggregators]
        /// shards): also show what the tenant's shard leader knows (needs --tenant). An
        /// https:// leader is asked over mutual TLS with --ca-file, --cert-file and --key-file
        /// (one CA for etcd and the fleet).
        #[arg(long, requires = "tenant", value_parser = clap::value_parser!(u32).range(1..=4096))]
        shards: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Simulate the tenant split at scale (no etcd): convergence, etcd traffic, agent cost.
    Simulate(crate::cluster_sim::SimulateArgs),
}

#[derive(Subcommand, Debug)]
enum TenantCommand {
    /// Set a tenant's limits; options left out keep their value.
    #[command(after_help = "Example: vqos cluster tenant set acme --max 1Gbit --min 200Mbit")]
    Set {
        /// The tenant.
        tenant: String,
        /// Floor of the tenant's aggregate where it has demand (0 = none).
        #[arg(long, value_name = "RATE")]
        min: Option<String>,
        /// Cap of the tenant's aggregate over all hosts, or "unlimited".
        #[arg(long, value_name = "RATE")]
        max: Option<String>,
        /// Print the stored document as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a tenant's policy (its vifs keep their own policies only).
    Del {
        /// The tenant.
        tenant: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum VifCommand {
    /// Set a vif's policy; options left out keep their value.
    #[command(
        after_help = "Example: vqos cluster vif set h1/vm3 --tenant acme --weight 2 --max 300Mbit"
    )]
    Set {
        /// HOST/PORT.
        vif: String,
        /// The vif's tenant ("" = none).
        #[arg(long)]
        tenant: Option<String>,
        /// Proportional share (> 0).
        #[arg(long)]
        weight: Option<u32>,
        /// Guaranteed minimum (0 = none).
        #[arg(long, value_name = "RATE")]
        min: Option<String>,
        /// Hard maximum, or "unlimited".
        #[arg(long, value_name = "RATE")]
        max: Option<String>,
        /// Latency priority, 0 (most urgent) to 7.
        #[arg(long, value_name = "P")]
        priority: Option<u8>,
        /// Inbound maximum (what the vif receives), or "unlimited" (default: the same as --max).
        #[arg(long, value_name = "RATE")]
        max_in: Option<String>,
        /// Bytes the vif may send above its max after idling, e.g. 256KiB.
        #[arg(long, value_name = "SIZE")]
        burst: Option<String>,
        /// Confirms a --max or --max-in of 0: the vif's traffic that way is blocked.
        #[arg(long)]
        block: bool,
        /// Print the stored document as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a vif's key: the host's local API manages its policy again.
    Del {
        /// HOST/PORT.
        vif: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

fn rate_arg(flag: &str, text: &Option<String>) -> Result<()> {
    if let Some(t) = text {
        parse_rate(t).map_err(|e| usage(format!("--{flag}: {e}")))?;
    }
    Ok(())
}

fn name(what: &str, n: &str) -> Result<()> {
    keys::check_name(what, n).map_err(usage)
}

/// `HOST/PORT` split and checked.
fn host_port(text: &str) -> Result<(&str, &str)> {
    let (h, p) = text
        .split_once('/')
        .ok_or_else(|| usage(format!("'{text}' is not HOST/PORT")))?;
    name("host", h)?;
    name("port", p)?;
    Ok((h, p))
}

impl ClusterArgs {
    fn settings(&self) -> Result<EtcdSettings> {
        let list = match &self.endpoints {
            Some(l) => l.clone(),
            None => std::env::var("VQOS_ETCD_ENDPOINTS").map_err(|_| {
                usage("No etcd endpoints: give --endpoints URL[,URL] or set VQOS_ETCD_ENDPOINTS")
            })?,
        };
        // Checked once, whole: a list of https:// URLs is valid only with the CA given.
        let s = EtcdSettings {
            endpoints: EtcdSettings::endpoints(&list),
            user: self.user.clone(),
            password_file: None,
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        };
        s.validate().map_err(|e| usage(e.to_string()))?;
        Ok(s)
    }
}

/// Runs `vqos cluster ...`.
pub fn run(args: ClusterArgs) -> Result<()> {
    if let ClusterCommand::Simulate(a) = &args.command {
        // A simulation: no etcd.
        return crate::cluster_sim::run(a);
    }
    // Usage errors first, before any connection.
    match &args.command {
        ClusterCommand::Tenant {
            command: TenantCommand::Set {
                tenant, min, max, ..
            },
        } => {
            name("tenant", tenant)?;
            rate_arg("min", min)?;
            rate_arg("max", max)?;
        }
        ClusterCommand::Tenant {
            command: TenantCommand::Del { tenant, .. },
        } => name("tenant", tenant)?,
        ClusterCommand::Vif {
            command:
                VifCommand::Set {
                    vif,
                    tenant,
                    min,
                    max,
                    priority,
                    max_in,
                    block,
                    ..
                },
        } => {
            host_port(vif)?;
            if let Some(t) = tenant.as_deref().filter(|t| !t.is_empty()) {
                name("tenant", t)?;
            }
            rate_arg("min", min)?;
            rate_arg("max", max)?;
            crate::ctl::check_block(max.as_deref(), max_in.as_deref(), *block)?;
            if priority.is_some_and(|p| p > MAX_PRIORITY) {
                return Err(usage(format!(
                    "--priority {} is out of range 0..={MAX_PRIORITY}",
                    priority.unwrap_or(0)
                )));
            }
        }
        ClusterCommand::Vif {
            command: VifCommand::Del { vif, .. },
        } => {
            host_port(vif)?;
        }
        ClusterCommand::Status {
            tenant: Some(t), ..
        } => name("tenant", t)?,
        ClusterCommand::Status { .. } | ClusterCommand::Simulate(_) => {}
    }
    let settings = args.settings()?;
    let hint_of = settings.clone();
    // The leaders are asked over mutual TLS with the same files as etcd (one fleet CA).
    let tls = match (&settings.ca_file, &settings.cert_file, &settings.key_file) {
        (Some(ca), Some(cert), Some(key)) => Some(vqos_cluster::rpc::tls::RpcTls {
            ca_file: ca.clone(),
            cert_file: cert.clone(),
            key_file: key.clone(),
        }),
        _ => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("Cannot start the runtime")?;
    let result = runtime.block_on(async move {
        let mut c = settings.connect(TIMEOUT).await?;
        match args.command {
            ClusterCommand::Tenant { command } => tenant(&mut c, command).await,
            ClusterCommand::Vif { command } => vif(&mut c, command).await,
            ClusterCommand::Status {
                tenant,
                shards,
                json,
            } => {
                let leader = match (&tenant, shards) {
                    (Some(t), Some(n)) => Some(
                        vqos_cluster::node::view::leader_view(&mut c, n, t, tls.as_ref(), TIMEOUT)
                            .await
                            .map_err(anyhow::Error::msg),
                    ),
                    _ => None,
                };
                status(&mut c, tenant.as_deref(), json, leader).await
            }
            ClusterCommand::Simulate(a) => crate::cluster_sim::run(&a),
        }
    });
    // What to check, ahead of what etcd said (the exit status still comes from the latter).
    result.map_err(|e| {
        let hint = e
            .downcast_ref::<vqos_cluster::EtcdError>()
            .and_then(|x| hint_of.hint(x));
        match hint {
            Some(h) => e.context(format!("Cannot use etcd: {h}")),
            None => e,
        }
    })
}

async fn get_one(c: &mut Client, key: &str) -> Result<Option<Vec<u8>>> {
    let r = deadline("get", TIMEOUT, c.get(key, None)).await?;
    Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
}

async fn put(c: &mut Client, key: &str, doc: &impl Serialize, json_out: bool) -> Result<()> {
    let body = serde_json::to_string(doc)?;
    deadline("put", TIMEOUT, c.put(key, body.clone(), None)).await?;
    if json_out {
        outln!("{}", json!({ "key": key, "value": doc }))?;
    } else {
        outln!("{key} = {body}")?;
    }
    Ok(())
}

async fn del(c: &mut Client, key: &str, json_out: bool) -> Result<()> {
    let r = deadline("delete", TIMEOUT, c.delete(key, None)).await?;
    if r.deleted() == 0 {
        return Err(anyhow::anyhow!("No key {key}"));
    }
    if json_out {
        outln!("{}", json!({ "deleted": key }))?;
    } else {
        outln!("Deleted {key}")?;
    }
    Ok(())
}

async fn tenant(c: &mut Client, command: TenantCommand) -> Result<()> {
    match command {
        TenantCommand::Set {
            tenant,
            min,
            max,
            json,
        } => {
            let key = keys::tenant(&tenant);
            let mut doc = match get_one(c, &key).await? {
                Some(v) => TenantDoc::parse(&v).unwrap_or_default(),
                None => TenantDoc::default(),
            };
            doc.min = min.or(doc.min);
            doc.max = max.or(doc.max);
            doc.limits().map_err(|e| usage(e.to_string()))?;
            put(c, &key, &doc, json).await
        }
        TenantCommand::Del { tenant, json } => del(c, &keys::tenant(&tenant), json).await,
    }
}

async fn vif(c: &mut Client, command: VifCommand) -> Result<()> {
    match command {
        VifCommand::Set {
            vif,
            tenant,
            weight,
            min,
            max,
            priority,
            max_in,
            burst,
            json,
            block: _,
        } => {
            let (h, p) = host_port(&vif)?;
            let key = keys::vif(h, p);
            let mut doc = match get_one(c, &key).await? {
                Some(v) => VifDoc::parse(&v).unwrap_or_default(),
                None => VifDoc::default(),
            };
            doc.weight = weight.or(doc.weight);
            doc.min = min.or(doc.min);
            doc.max = max.or(doc.max);
            doc.priority = priority.or(doc.priority);
            doc.max_in = max_in.or(doc.max_in);
            doc.burst = burst.or(doc.burst);
            if let Some(t) = tenant {
                doc.tenant = (!t.is_empty()).then_some(t);
            }
            doc.policy(p).map_err(|e| usage(e.to_string()))?;
            put(c, &key, &doc, json).await
        }
        VifCommand::Del { vif, json } => {
            let (h, p) = host_port(&vif)?;
            del(c, &keys::vif(h, p), json).await
        }
    }
}

/// One tenant in `vqos cluster status`.
#[derive(Debug, Serialize)]
struct TenantView {
    /// Its policy as stored (absent: no key).
    policy: Option<TenantDoc>,
    /// Σ share max over its live vifs, bit/s.
    share_max_bps: u64,
    /// Σ measured rate, bit/s.
    rate_bps: u64,
    /// Its live vifs, `HOST/PORT`.
    vifs: Vec<String>,
}

/// Hosts whose status is more than this many of their periods old are stale.
const STALE_PERIODS: u64 = 3;

/// A host whose status says little: stale (old) or dead (gone, a grant left).
#[derive(Debug, Serialize)]
struct HostNote {
    /// The host.
    host: String,
    /// Age of its status, ms (stale hosts).
    #[serde(skip_serializing_if = "Option::is_none")]
    age_ms: Option<u64>,
    /// The tenants it holds a grant of (dead hosts).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    grants: Vec<String>,
}

async fn status(
    c: &mut Client,
    only: Option<&str>,
    json_out: bool,
    leader: Option<Result<LeaderView>>,
) -> Result<()> {
    let prefix = || Some(GetOptions::new().with_prefix());
    let st = deadline("get", TIMEOUT, c.get(keys::STATUS, prefix())).await?;
    let mut hosts: BTreeMap<String, HostStatus> = BTreeMap::new();
    for kv in st.kvs() {
        let (Ok(k), Ok(s)) = (kv.key_str(), serde_json::from_slice(kv.value())) else {
            continue;
        };
        if let Some(h) = keys::name_under(keys::STATUS, k) {
            hosts.insert(h.to_string(), s);
        }
    }
    let tk = deadline("get", TIMEOUT, c.get(keys::TENANTS, prefix())).await?;
    let mut tenants: BTreeMap<String, TenantView> = BTreeMap::new();
    for kv in tk.kvs() {
        let Ok(k) = kv.key_str() else { continue };
        if let Some(t) = keys::name_under(keys::TENANTS, k) {
            tenants.insert(
                t.to_string(),
                TenantView {
                    policy: TenantDoc::parse(kv.value()).ok(),
                    share_max_bps: 0,
                    rate_bps: 0,
                    vifs: Vec::new(),
                },
            );
        }
    }
    let gk = deadline(
        "get",
        TIMEOUT,
        c.get(keys::GRANTS, prefix().map(|o| o.with_keys_only())),
    );
    let mut dead: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for kv in gk.await?.kvs() {
        let Some((t, h)) = kv.key_str().ok().and_then(keys::tenant_host) else {
            continue;
        };
        if !hosts.contains_key(h) && only.is_none_or(|o| o == t) {
            dead.entry(h.to_string()).or_default().push(t.to_string());
        }
    }
    if let Some(t) = only {
        tenants.retain(|name, _| name == t);
        for s in hosts.values_mut() {
            s.vifs.retain(|_, v| v.tenant.as_deref() == Some(t));
        }
        hosts.retain(|_, s| !s.vifs.is_empty());
    }
    for (h, s) in &hosts {
        for (p, v) in &s.vifs {
            let Some(t) = &v.tenant else { continue };
            let tv = tenants.entry(t.clone()).or_insert_with(|| TenantView {
                policy: None,
                share_max_bps: 0,
                rate_bps: 0,
                vifs: Vec::new(),
            });
            tv.share_max_bps += v.share_max_bps.unwrap_or(0);
            tv.rate_bps += v.rate_bps;
            tv.vifs.push(format!("{h}/{p}"));
        }
    }
    if let Some(t) = only.filter(|_| tenants.is_empty() && dead.is_empty()) {
        anyhow::bail!("No tenant '{t}': no policy in etcd and no vif of it on a live host");
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let stale: Vec<HostNote> = (hosts.iter())
        .map(|(h, s)| (h, now_ms.saturating_sub(s.updated_unix_ms), s.period_ms))
        .filter(|&(_, age, period)| age > STALE_PERIODS * period.max(1))
        .map(|(h, age, _)| HostNote {
            host: h.clone(),
            age_ms: Some(age),
            grants: Vec::new(),
        })
        .collect();
    let dead: Vec<HostNote> = (dead.into_iter())
        .map(|(host, grants)| HostNote {
            host,
            age_ms: None,
            grants,
        })
        .collect();
    let leader = leader.transpose()?;
    if json_out {
        let mut v = json!({ "hosts": hosts, "tenants": tenants, "stale": stale, "dead": dead });
        if let Some(l) = &leader {
            v["leader"] = crate::cluster_view::to_json(l);
        }
        outln!("{v}")?;
        return Ok(());
    }
    print_status(&hosts, &tenants)?;
    if let Some(l) = &leader {
        crate::cluster_view::print(l)?;
    }
    for n in &stale {
        let age = n.age_ms.unwrap_or(0) as f64 / 1000.0;
        outln!("stale: {} (its status is {age:.1} s old)", n.host)?;
    }
    for n in &dead {
        let held = n.grants.join(", ");
        outln!(
            "dead: {} (no status; it still holds a grant of {held})",
            n.host
        )?;
    }
    Ok(())
}

fn print_status(
    hosts: &BTreeMap<String, HostStatus>,
    tenants: &BTreeMap<String, TenantView>,
) -> Result<()> {
    let r = |b: Option<u64>| format_rate(b);
    outln!(
        "{:<10} {:<12} {:<10} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "HOST",
        "VIF",
        "TENANT",
        "WEIGHT",
        "MAX",
        "SHARE-MAX",
        "SHARE-MIN",
        "RATE",
        "DEMAND"
    )?;
    for (h, s) in hosts {
        if s.vifs.is_empty() {
            outln!("{h:<10} (no vifs from etcd)  health {}", s.health)?;
        }
        for (p, v) in &s.vifs {
            outln!(
                "{:<10} {:<12} {:<10} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10}",
                h,
                p,
                v.tenant.as_deref().unwrap_or("-"),
                v.weight,
                r(v.max_bps),
                v.share_max_bps.map_or("-".into(), |b| r(Some(b))),
                v.share_min_bps.map_or("-".into(), |b| r(Some(b))),
                r(Some(v.rate_bps)),
                v.demand_bps.map_or("greedy".into(), |b| r(Some(b))),
            )?;
        }
        for e in &s.errors {
            outln!("{h:<10} problem: {e}")?;
        }
    }
    outln!()?;
    outln!(
        "{:<10} {:>10} {:>10} {:>10} {:>10}  VIFS",
        "TENANT",
        "MIN",
        "MAX",
        "SHARES",
        "RATE"
    )?;
    for (t, v) in tenants {
        let limits = v.policy.as_ref().and_then(|p| p.limits().ok());
        outln!(
            "{:<10} {:>10} {:>10} {:>10} {:>10}  {}",
            t,
            limits.map_or("-".into(), |l| r(Some(l.min_bps))),
            limits.map_or("(no policy)".into(), |l| r(l.max_bps)),
            r(Some(v.share_max_bps)),
            r(Some(v.rate_bps)),
            v.vifs.join(" ")
        )?;
    }
    Ok(())
}
