//! The desired state read from etcd, and its application to the API.

use std::collections::BTreeMap;

use vqos_cluster::etcd_client::{EventType, KeyValue};
use vqos_cluster::{keys, TenantDoc, TenantLimits, VifDoc};

use crate::api::Api;

/// A vif key as read: its document, or why it does not parse.
#[derive(Debug, Clone)]
pub(super) struct VifEntry {
    /// The key.
    pub key: String,
    /// The document.
    pub doc: Result<VifDoc, String>,
}

/// The host's vif keys and the tenants, as last read or watched.
#[derive(Debug, Default)]
pub(super) struct Desired {
    /// By port name.
    pub vifs: BTreeMap<String, VifEntry>,
    /// By tenant name: the limits, or why the key does not parse.
    pub tenants: BTreeMap<String, Result<TenantLimits, String>>,
    /// Problems found when applying (missing ports, refused policies).
    pub problems: Vec<String>,
}

fn tenant(value: &[u8]) -> Result<TenantLimits, String> {
    TenantDoc::parse(value)
        .and_then(|d| d.limits())
        .map_err(|e| e.to_string())
}

impl Desired {
    /// Replaces everything with what a full read returned.
    pub fn replace(&mut self, host: &str, vifs: &[KeyValue], tenants: &[KeyValue]) {
        self.vifs.clear();
        self.tenants.clear();
        for kv in vifs {
            self.put(host, kv);
        }
        for kv in tenants {
            self.put(host, kv);
        }
    }

    /// Applies one watched event; unrelated keys are ignored.
    pub fn event(&mut self, host: &str, kind: EventType, kv: &KeyValue) {
        match kind {
            EventType::Put => self.put(host, kv),
            EventType::Delete => {
                let Ok(key) = kv.key_str() else { return };
                if let Some(port) = keys::name_under(&keys::host_vifs(host), key) {
                    self.vifs.remove(port);
                } else if let Some(t) = keys::name_under(keys::TENANTS, key) {
                    self.tenants.remove(t);
                }
            }
        }
    }

    fn put(&mut self, host: &str, kv: &KeyValue) {
        let Ok(key) = kv.key_str() else { return };
        if let Some(port) = keys::name_under(&keys::host_vifs(host), key) {
            let doc = VifDoc::parse(kv.value()).map_err(|e| e.to_string());
            self.vifs.insert(
                port.to_string(),
                VifEntry {
                    key: key.to_string(),
                    doc,
                },
            );
        } else if let Some(t) = keys::name_under(keys::TENANTS, key) {
            self.tenants.insert(t.to_string(), tenant(kv.value()));
        }
    }

    /// Sets every named vif's policy through the API (a no-op when unchanged), hands the vifs
    /// no longer named back to the local API, and records the problems.
    pub fn apply(&mut self, api: &Api) {
        let mut problems = Vec::new();
        for (port, e) in &self.vifs {
            let policy = match &e.doc {
                Ok(doc) => doc.policy(port).map_err(|err| err.to_string()),
                Err(err) => Err(err.clone()),
            };
            match policy.map(|p| api.apply_managed_policy(port, &e.key, &p)) {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => problems.push(format!("{}: no port '{port}' here", e.key)),
                Ok(Err(msg)) | Err(msg) => problems.push(format!("{}: {msg}", e.key)),
            }
            if let Ok(VifDoc {
                tenant: Some(t), ..
            }) = &e.doc
            {
                match self.tenants.get(t) {
                    None => problems.push(format!(
                        "{}: tenant '{t}' has no policy at {}",
                        e.key,
                        keys::tenant(t)
                    )),
                    Some(Err(msg)) => problems.push(format!("{}: {msg}", keys::tenant(t))),
                    Some(Ok(_)) => {}
                }
            }
        }
        if let Err(e) = api.release_managed(&|n| self.vifs.contains_key(n)) {
            problems.push(format!("Cannot hand vifs back to the local API: {e}"));
        }
        problems.dedup();
        self.problems = problems;
    }

    /// The tenant of a local port, if etcd names one.
    pub fn tenant_of(&self, port: &str) -> Option<&str> {
        self.vifs
            .get(port)
            .and_then(|e| e.doc.as_ref().ok())
            .and_then(|d| d.tenant.as_deref())
    }
}
