//! The desired state read from etcd, and its application to the API.
//!
//! Every host's vif documents are read (not only this host's): they are the only source of a
//! tenant vif's membership, weight and own cap in the split (`DesiredState::declared`, shared with the shards' leaders); the hosts'
//! statuses give only measurements. A document that cannot be read (it does not parse, or its
//! policy is not valid) is a problem and leaves its last valid version in force; fields this
//! version does not know are a problem too, but the rest of the document is used.

use std::collections::{BTreeMap, BTreeSet};

use vqos_cluster::desired::{unknown_problem, DesiredState};
use vqos_cluster::model::field_list;
use vqos_cluster::{keys, VifDoc};

use crate::api::Api;

/// One of this host's vif keys.
#[derive(Debug, Clone)]
pub(super) struct VifEntry {
    /// The key.
    pub key: String,
    /// The last document that was valid as a whole (`None`: none yet).
    pub doc: Option<VifDoc>,
    /// Why the key's current value is not used (it does not parse, or its policy is invalid).
    pub error: Option<String>,
}

/// The vif keys and the tenants, as last read or watched.
#[derive(Debug, Default)]
pub(super) struct Desired {
    /// This host's vif keys, by port name.
    pub vifs: BTreeMap<String, VifEntry>,
    /// Every host's tenant vifs and the tenants (shared with the shards' leaders).
    pub state: DesiredState,
    /// Problems found when applying (missing ports, refused policies, unreadable keys).
    pub problems: Vec<String>,
}

impl Desired {
    /// Keeps only the keys `read` holds (after a full read has put them): the keys deleted
    /// while the agent was away go, the last valid documents of the others stay.
    pub fn retain(&mut self, read: &BTreeSet<String>) {
        self.vifs.retain(|_, e| read.contains(&e.key));
        self.state.retain(read);
    }

    /// A key was deleted; keys that are neither vifs nor tenants are ignored.
    pub fn delete(&mut self, host: &str, key: &str) {
        if let Some((h, port)) = self.state.delete(key) {
            if h == host {
                self.vifs.remove(port);
            }
        }
    }

    /// A key was read or written; keys that are neither vifs nor tenants are ignored.
    pub fn put(&mut self, host: &str, key: &str, value: &[u8]) {
        let Some(put) = self.state.put(key, value) else {
            return;
        };
        if put.host != host {
            return;
        }
        let entry = self
            .vifs
            .entry(put.port.to_string())
            .or_insert_with(|| VifEntry {
                key: key.to_string(),
                doc: None,
                error: None,
            });
        match put.doc {
            Ok(doc) => {
                if let Some(p) = unknown_problem(key, &field_list(&doc.unknown)) {
                    tracing::warn!("{p}");
                }
                entry.doc = Some(doc);
                entry.error = None;
            }
            Err(e) => entry.error = Some(e),
        }
    }

    /// Sets every named vif's policy through the API (a no-op when unchanged), hands the vifs
    /// no longer named back to the local API, and records the problems.
    pub fn apply(&mut self, api: &Api) {
        let mut problems = Vec::new();
        for (port, e) in &self.vifs {
            if let Some(err) = &e.error {
                let kept = if e.doc.is_some() {
                    " (its last valid version stays in force)"
                } else {
                    ""
                };
                problems.push(format!("{}: {err}{kept}", e.key));
            }
            let Some(doc) = &e.doc else {
                continue;
            };
            if e.error.is_none() {
                problems.extend(unknown_problem(&e.key, &field_list(&doc.unknown)));
            }
            let policy = doc.policy(port).map_err(|err| err.to_string());
            match policy.map(|p| api.apply_managed_policy(port, &e.key, &p)) {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => problems.push(format!("{}: no port '{port}' here", e.key)),
                Ok(Err(msg)) | Err(msg) => problems.push(format!("{}: {msg}", e.key)),
            }
            if let Some(t) = &doc.tenant {
                let tkey = keys::tenant(t);
                match self.state.tenants.get(t) {
                    None => {
                        problems.push(format!("{}: tenant '{t}' has no policy at {tkey}", e.key))
                    }
                    Some(te) => {
                        if let Some(err) = &te.error {
                            let kept = if te.limits.is_some() {
                                " (its last valid version stays in force)"
                            } else {
                                ""
                            };
                            problems.push(format!("{tkey}: {err}{kept}"));
                        }
                        problems.extend(unknown_problem(&tkey, &te.unknown));
                    }
                }
            }
        }
        if let Err(e) = api.release_managed(&|n| self.managed(n)) {
            problems.push(format!("Cannot hand vifs back to the local API: {e}"));
        }
        problems.sort();
        problems.dedup();
        self.problems = problems;
    }

    /// Whether etcd manages port `n`: its key has held a valid policy.
    fn managed(&self, n: &str) -> bool {
        self.vifs.get(n).is_some_and(|e| e.doc.is_some())
    }

    /// The tenant of a local port, if etcd names one (in its last valid document).
    pub fn tenant_of(&self, port: &str) -> Option<&str> {
        self.vifs
            .get(port)
            .and_then(|e| e.doc.as_ref())
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
        d.retain(&BTreeSet::new());
        assert!(d.vifs.is_empty() && d.state.tenants.is_empty() && d.state.declared().is_empty());
    }

    fn acme_max(d: &Desired) -> Option<u64> {
        d.state.tenant_limits().get("acme").and_then(|l| l.max_bps)
    }

    #[test]
    fn a_newer_field_is_tolerated_and_an_unreadable_document_keeps_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let api = api(dir.path());
        let mut d = Desired::default();
        let (tkey, vkey) = ("/vqos/v1/tenants/acme", "/vqos/v1/hosts/h1/vifs/vm1");
        d.put("h1", vkey, br#"{"tenant": "acme", "weight": 2}"#);
        // Issue 24: a newer CLI's field made the whole tenant document unreadable, and the
        // tenant's vifs lost their cap.
        d.put(
            "h1",
            tkey,
            br#"{"max":"100Mbit","added_by_a_newer_cli":true}"#,
        );
        d.apply(&api);
        assert_eq!(acme_max(&d), Some(100_000_000));
        let p = d.problems.join("\n");
        assert!(
            p.contains("tenants/acme: unknown field `added_by_a_newer_cli` ignored"),
            "{p}"
        );
        // A document that cannot be read keeps the last good one, and says so.
        d.put("h1", tkey, br#"{"max": "fast"}"#);
        d.put("h1", vkey, b"{not json");
        d.apply(&api);
        assert_eq!(acme_max(&d), Some(100_000_000));
        assert_eq!(d.tenant_of("vm1"), Some("acme"));
        assert_eq!(d.state.declared()["h1"]["vm1"].weight, 2);
        assert_eq!(api.managed().keys().collect::<Vec<_>>(), ["vm1"]);
        let p = d.problems.join("\n");
        assert!(
            p.contains("tenants/acme: Invalid max") && p.contains("last valid version"),
            "{p}"
        );
        assert!(p.contains("vifs/vm1: Invalid JSON"), "{p}");
        // A good one again replaces it, and the problems go.
        d.put("h1", tkey, br#"{"max": "200Mbit"}"#);
        d.put("h1", vkey, br#"{"tenant": "acme"}"#);
        d.apply(&api);
        assert_eq!(acme_max(&d), Some(200_000_000));
        assert!(d.problems.is_empty(), "{:?}", d.problems);
        // A full read that finds the keys still there keeps them; one without them drops them.
        d.retain(&BTreeSet::from([tkey.to_string(), vkey.to_string()]));
        assert_eq!(acme_max(&d), Some(200_000_000));
        d.retain(&BTreeSet::from([vkey.to_string()]));
        assert_eq!(acme_max(&d), None);
    }

    /// The declarations themselves are `vqos_cluster::desired`'s (tested there); the agent
    /// keeps the policies of its own host's vifs only.
    #[test]
    fn only_this_hosts_vif_keys_become_its_vifs() {
        let mut d = Desired::default();
        d.put("h1", "/vqos/v1/hosts/h2/vifs/vm7", br#"{"tenant": "acme"}"#);
        d.put("h1", "/vqos/v1/hosts/h1/vifs/vm1", br#"{"tenant": "acme"}"#);
        assert_eq!(d.vifs.keys().collect::<Vec<_>>(), ["vm1"]);
        assert_eq!(d.state.declared().len(), 2);
        d.delete("h1", "/vqos/v1/hosts/h2/vifs/vm7");
        assert_eq!(d.vifs.keys().collect::<Vec<_>>(), ["vm1"]);
        d.delete("h1", "/vqos/v1/hosts/h1/vifs/vm1");
        assert!(d.state.declared().is_empty() && d.vifs.is_empty());
    }
}
