//! What the node tests share: their runtimes, and the desired state they declare in etcd.

use std::time::Duration;

use tokio::runtime::Runtime;
use vqos_cluster::etcd::kv_client;
use vqos_cluster::etcd_client::Client;
use vqos_cluster::node::Timing;
use vqos_cluster::{keys, EtcdSettings};

/// The nodes' and hosts' timing: 200 ms periods, 2 s leases and call deadlines.
pub fn timing() -> Timing {
    Timing {
        period: Duration::from_millis(200),
        timeout: Duration::from_secs(2),
        election_ttl: Duration::from_secs(2),
        grant_lease: Duration::from_secs(2),
        drift: Duration::from_millis(100),
    }
}

/// A runtime of `workers` threads (a node's own, or the one a test's hosts run on).
pub fn runtime(workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// Connects to etcd on `rt` and declares each of `tenants` with a max of 1 Gbit/s and each
/// `(host, vif, tenant)` of `vifs`; returns the connection.
pub fn declare(
    rt: &Runtime,
    settings: &EtcdSettings,
    tenants: &[String],
    vifs: &[(String, String, String)],
) -> Client {
    let c = rt
        .block_on(settings.connect(Duration::from_secs(5)))
        .unwrap();
    rt.block_on(async {
        let mut kv = kv_client(&c);
        for t in tenants {
            kv.put(keys::tenant(t), r#"{"max": "1Gbit"}"#, None)
                .await
                .unwrap();
        }
        for (host, vif, tenant) in vifs {
            let doc = format!(r#"{{"tenant": "{tenant}"}}"#);
            kv.put(keys::vif(host, vif), doc, None).await.unwrap();
        }
    });
    c
}
