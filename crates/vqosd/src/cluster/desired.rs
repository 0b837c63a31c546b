//! The desired state read from etcd, and its application to the API.
//!
//! Every host's vif documents are read (not only this host's): they are the only source of a
//! tenant vif's membership, weight and own cap in the split ([`Desired::declared`]); the hosts'
//! statuses give only measurements. A document that cannot be read (it does not parse, or its
//! policy is not valid) is a problem and leaves its last valid version in force; fields this
//! version does not know are a problem too, but the rest of the document is used.

use std::collections::{BTreeMap, BTreeSet};

use vqos_cluster::model::field_list;
use vqos_cluster::{keys, Declarations, TenantDoc, TenantLimits, VifDoc};

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

/// A tenant key.
#[derive(Debug, Clone, Default)]
pub(super) struct TenantEntry {
    /// The limits of the last valid document (`None`: none yet).
    pub limits: Option<TenantLimits>,
    /// Why the key's current value is not used.
    pub error: Option<String>,
    /// The fields of the current value this version does not know (`` `a`, `b` ``).
    pub unknown: String,
}

/// The vif keys and the tenants, as last read or watched.
#[derive(Debug, Default)]
pub(super) struct Desired {
    /// This host's vif keys, by port name.
    pub vifs: BTreeMap<String, VifEntry>,
    /// Every host's tenant vifs, as their last valid documents declare them.
    pub declared: Declarations,
    /// By tenant name.
    pub tenants: BTreeMap<String, TenantEntry>,
    /// Problems found when applying (missing ports, refused policies, unreadable keys).
    pub problems: Vec<String>,
}

/// "unknown field `a` ignored" for a problem, or nothing.
fn unknown_problem(key: &str, list: &str) -> Option<String> {
    if list.is_empty() {
        return None;
    }
    let s = if list.contains(',') { "s" } else { "" };
    Some(format!(
        "{key}: unknown field{s} {list} ignored (a newer vqos's, or a typo)"
    ))
}

impl Desired {
    /// Keeps only the keys `read` holds (after a full read has put them): the keys deleted
    /// while the agent was away go, the last valid documents of the others stay.
    pub fn retain(&mut self, read: &BTreeSet<String>) {
        self.vifs.retain(|_, e| read.contains(&e.key));
        self.declared.retain(|h, vifs| {
            vifs.retain(|p, _| read.contains(&keys::vif(h, p)));
            !vifs.is_empty()
        });
        self.tenants.retain(|t, _| read.contains(&keys::tenant(t)));
    }

    /// A key was deleted; keys that are neither vifs nor tenants are ignored.
    pub fn delete(&mut self, host: &str, key: &str) {
        if let Some((h, port)) = keys::host_vif(key) {
            if h == host {
                self.vifs.remove(port);
            }
            if let Some(vifs) = self.declared.get_mut(h) {
                vifs.remove(port);
                if vifs.is_empty() {
                    self.declared.remove(h);
                }
            }
        } else if let Some(t) = keys::name_under(keys::TENANTS, key) {
            self.tenants.remove(t);
        }
    }

    /// A key was read or written; keys that are neither vifs nor tenants are ignored.
    pub fn put(&mut self, host: &str, key: &str, value: &[u8]) {
        if let Some((h, port)) = keys::host_vif(key) {
            let read = VifDoc::parse(value).and_then(|d| Ok((d.declared(port)?, d)));
            match read {
                Ok((decl, doc)) => {
                    if h == host {
                        if let Some(p) = unknown_problem(key, &field_list(&doc.unknown)) {
                            tracing::warn!("{p}");
                        }
                    }
                    let vifs = self.declared.entry(h.to_string()).or_default();
                    match decl {
                        Some(d) => vifs.insert(port.to_string(), d),
                        None => vifs.remove(port),
                    };
                    if vifs.is_empty() {
                        self.declared.remove(h);
                    }
                    if h == host {
                        self.vifs.insert(
                            port.to_string(),
                            VifEntry {
                                key: key.to_string(),
                                doc: Some(doc),
                                error: None,
                            },
                        );
                    }
                }
                Err(e) => {
                    // The last valid document stays: its policy, tenant, weight and cap.
                    tracing::warn!("{key}: {e}; its last valid version stays in force");
                    if h == host {
                        let entry = self.vifs.entry(port.to_string()).or_insert(VifEntry {
                            key: key.to_string(),
                            doc: None,
                            error: None,
                        });
                        entry.error = Some(e.to_string());
                    }
                }
            }
        } else if let Some(t) = keys::name_under(keys::TENANTS, key) {
            let entry = self.tenants.entry(t.to_string()).or_default();
            match TenantDoc::parse(value).and_then(|d| Ok((d.limits()?, d))) {
                Ok((limits, doc)) => {
                    entry.limits = Some(limits);
                    entry.error = None;
                    entry.unknown = field_list(&doc.unknown);
                    if let Some(p) = unknown_problem(key, &entry.unknown) {
                        tracing::warn!("{p}");
                    }
                }
                Err(e) => {
                    tracing::warn!("{key}: {e}; its last valid version stays in force");
                    entry.error = Some(e.to_string());
                }
            }
        }
    }

    /// The tenants' limits, of their last valid documents.
    pub fn tenant_limits(&self) -> BTreeMap<String, TenantLimits> {
        self.tenants
            .iter()
            .filter_map(|(t, e)| Some((t.clone(), e.limits?)))
            .collect()
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
                match self.tenants.get(t) {
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
        assert!(d.vifs.is_empty() && d.tenants.is_empty() && d.declared.is_empty());
    }

    fn acme_max(d: &Desired) -> Option<u64> {
        d.tenant_limits().get("acme").and_then(|l| l.max_bps)
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
        assert_eq!(d.declared["h1"]["vm1"].weight, 2);
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

    #[test]
    fn every_hosts_vif_documents_declare_the_tenant_members() {
        let mut d = Desired::default();
        d.put(
            "h1",
            "/vqos/v1/hosts/h2/vifs/vm7",
            br#"{"tenant": "acme", "weight": 3, "max": "50Mbit"}"#,
        );
        d.put("h1", "/vqos/v1/hosts/h2/vifs/vm8", br#"{"weight": 9}"#);
        d.put("h1", "/vqos/v1/hosts/h1/vifs/vm1", br#"{"tenant": "acme"}"#);
        let vm7 = &d.declared["h2"]["vm7"];
        assert_eq!(
            (vm7.tenant.as_str(), vm7.weight, vm7.max_bps),
            ("acme", 3, Some(50_000_000))
        );
        // No tenant: no member; another host's key is no vif of this host.
        assert!(!d.declared["h2"].contains_key("vm8"));
        assert_eq!(d.vifs.keys().collect::<Vec<_>>(), ["vm1"]);
        assert_eq!(d.declared["h1"]["vm1"].weight, 1);
        // The tenant removed from a document: no member any more.
        d.put("h1", "/vqos/v1/hosts/h2/vifs/vm7", br#"{"weight": 3}"#);
        assert!(!d.declared.contains_key("h2"));
        d.delete("h1", "/vqos/v1/hosts/h1/vifs/vm1");
        assert!(d.declared.is_empty() && d.vifs.is_empty());
    }
}
