//! The desired state read from etcd, and its application to the API.

use std::collections::BTreeMap;

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
    /// Forgets everything (before the keys of a full read are put).
    pub fn clear(&mut self) {
        self.vifs.clear();
        self.tenants.clear();
    }

    /// A key was deleted; keys that are not this host's vifs or a tenant are ignored.
    pub fn delete(&mut self, host: &str, key: &str) {
        if let Some(port) = keys::name_under(&keys::host_vifs(host), key) {
            self.vifs.remove(port);
        } else if let Some(t) = keys::name_under(keys::TENANTS, key) {
            self.tenants.remove(t);
        }
    }

    /// A key was read or written; keys that are not this host's vifs or a tenant are ignored.
    pub fn put(&mut self, host: &str, key: &str, value: &[u8]) {
        if let Some(port) = keys::name_under(&keys::host_vifs(host), key) {
            let doc = VifDoc::parse(value).map_err(|e| e.to_string());
            self.vifs.insert(
                port.to_string(),
                VifEntry {
                    key: key.to_string(),
                    doc,
                },
            );
        } else if let Some(t) = keys::name_under(keys::TENANTS, key) {
            self.tenants.insert(t.to_string(), tenant(value));
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::MockBackend;
    use crate::config::Config;

    fn api(dir: &std::path::Path) -> Api {
        let text = format!(
            "capacity = \"1Gbit\"\nstate_file = \"{}/state.json\"\n\
             [[port]]\nname = \"vm1\"\n[[port]]\nname = \"vm2\"\n",
            dir.display()
        );
        let config = Config::parse(&text, |_| None).unwrap();
        Api::start(&config, Arc::new(MockBackend::new())).unwrap()
    }

    #[test]
    fn keys_become_policies_problems_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let api = api(dir.path());
        let mut d = Desired::default();
        d.put(
            "h1",
            "/vqos/v1/hosts/h1/vifs/vm1",
            br#"{"weight": 4, "tenant": "acme"}"#,
        );
        d.put("h1", "/vqos/v1/hosts/h1/vifs/vm2", br#"{"weight": "x"}"#);
        d.put("h1", "/vqos/v1/hosts/h1/vifs/vm9", b"{}");
        // Another host's key, a nested key and a status key are not ours.
        d.put("h1", "/vqos/v1/hosts/h2/vifs/vm2", br#"{"weight": 7}"#);
        d.put("h1", "/vqos/v1/hosts/h1/vifs/a/b", b"{}");
        d.put("h1", "/vqos/v1/status/h1", b"{}");
        d.apply(&api);
        let set = api.policies();
        assert_eq!(set.policy(set.id("vm1").unwrap()).weight, 4);
        assert_eq!(set.policy(set.id("vm2").unwrap()).weight, 1);
        // vm2's key never held a valid policy: the local API keeps it until one arrives.
        assert_eq!(api.managed().keys().collect::<Vec<_>>(), ["vm1"]);
        let p = d.problems.join("\n");
        assert!(p.contains("vifs/vm2: Invalid JSON"), "{p}");
        assert!(p.contains("vifs/vm9: no port 'vm9' here"), "{p}");
        assert!(p.contains("tenant 'acme' has no policy"), "{p}");
        assert_eq!(d.tenant_of("vm1"), Some("acme"));
        // The tenant arrives, broken then whole.
        d.put(
            "h1",
            "/vqos/v1/tenants/acme",
            br#"{"min": "2Gbit", "max": "1Gbit"}"#,
        );
        d.apply(&api);
        assert!(d.problems.join("\n").contains("above its max"));
        d.put("h1", "/vqos/v1/tenants/acme", br#"{"max": "1Gbit"}"#);
        d.apply(&api);
        assert!(!d.problems.join("\n").contains("acme"), "{:?}", d.problems);
        // Deleted keys hand the vifs back, with their last policy.
        d.delete("h1", "/vqos/v1/hosts/h1/vifs/vm1");
        d.delete("h1", "/vqos/v1/hosts/h1/vifs/vm2");
        d.apply(&api);
        assert!(api.managed().is_empty());
        let set = api.policies();
        assert_eq!(set.policy(set.id("vm1").unwrap()).weight, 4);
        d.clear();
        assert!(d.vifs.is_empty() && d.tenants.is_empty());
    }
}
