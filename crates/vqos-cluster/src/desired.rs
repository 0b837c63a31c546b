//! etcd's desired state as every reader of it keeps it: every host's tenant vifs (their
//! declarations: the only source of a vif's tenant, weight and own cap in the split) and the
//! tenants' limits. The vqosd agent keeps one beside its own vifs' policies; a shard's leader
//! (`crate::node`) keeps one to plan with.
//!
//! A document that cannot be read (not JSON, a field of the wrong type, a rate that does not
//! parse, min above max) leaves its last valid version in force; fields this version does not
//! know are ignored and listed, and the rest of the document is used (docs/cluster.md, "Key
//! layout").

use std::collections::{BTreeMap, BTreeSet};

use crate::model::field_list;
use crate::{keys, Declarations, Declared, TenantDoc, TenantLimits, VifDoc};

/// A tenant key.
#[derive(Debug, Clone, Default)]
pub struct TenantEntry {
    /// The limits of the last valid document (`None`: none yet).
    pub limits: Option<TenantLimits>,
    /// Why the key's current value is not used.
    pub error: Option<String>,
    /// The fields of the current value this version does not know (`` `a`, `b` ``).
    pub unknown: String,
}

/// What a put of a vif key read, for a reader that keeps more of its own host's vifs.
#[derive(Debug)]
pub struct VifPut<'k> {
    /// The host the key names.
    pub host: &'k str,
    /// The port.
    pub port: &'k str,
    /// The document, or why it cannot be used (its last valid version stays).
    pub doc: Result<VifDoc, String>,
}

/// Every host's tenant vifs and the tenants, as last read or watched.
#[derive(Debug, Default, Clone)]
pub struct DesiredState {
    /// Every host's tenant vifs, as their last valid documents declare them (changed only
    /// through [`DesiredState::put`], `delete` and `retain`, which keep `members` with it).
    declared: Declarations,
    /// By tenant name.
    pub tenants: BTreeMap<String, TenantEntry>,
    /// tenant → host → how many of its vifs the host declares in it: a host's fallback
    /// divides by the count of hosts ([`DesiredState::hosts_in`]) every period, and counting
    /// them from `declared` cost every host a pass over every vif of the fleet per tenant.
    members: BTreeMap<String, BTreeMap<String, u32>>,
}

/// "unknown field `a` ignored" for a problem, or nothing.
pub fn unknown_problem(key: &str, list: &str) -> Option<String> {
    if list.is_empty() {
        return None;
    }
    let s = if list.contains(',') { "s" } else { "" };
    Some(format!(
        "{key}: unknown field{s} {list} ignored (a newer vqos's, or a typo)"
    ))
}

impl DesiredState {
    /// Every host's tenant vifs, as their last valid documents declare them.
    pub fn declared(&self) -> &Declarations {
        &self.declared
    }

    /// How many hosts declare vifs in `tenant`.
    pub fn hosts_in(&self, tenant: &str) -> usize {
        self.members.get(tenant).map_or(0, BTreeMap::len)
    }

    /// Counts `host`'s vif in `tenant` in or out.
    fn count(&mut self, tenant: &str, host: &str, add: bool) {
        let hosts = self.members.entry(tenant.to_string()).or_default();
        let n = hosts.entry(host.to_string()).or_insert(0);
        match add {
            true => *n += 1,
            false => *n = n.saturating_sub(1),
        }
        if *n == 0 {
            hosts.remove(host);
        }
        if hosts.is_empty() {
            self.members.remove(tenant);
        }
    }

    /// Sets (or removes) `host`'s `port`, keeping `members` with it.
    fn set_vif(&mut self, host: &str, port: &str, declared: Option<Declared>) {
        let vifs = self.declared.entry(host.to_string()).or_default();
        let new_tenant = declared.as_ref().map(|d| d.tenant.clone());
        let old = match declared {
            Some(d) => vifs.insert(port.to_string(), d),
            None => vifs.remove(port),
        };
        if vifs.is_empty() {
            self.declared.remove(host);
        }
        if let Some(o) = old {
            self.count(&o.tenant, host, false);
        }
        if let Some(t) = new_tenant {
            self.count(&t, host, true);
        }
    }

    /// Keeps only the keys `read` holds (after a full read has put them): the keys deleted
    /// while the reader was away go, the last valid documents of the others stay.
    pub fn retain(&mut self, read: &BTreeSet<String>) {
        self.declared.retain(|h, vifs| {
            vifs.retain(|p, _| read.contains(&keys::vif(h, p)));
            !vifs.is_empty()
        });
        // A full read is rare: counted again from what stays.
        self.members.clear();
        let all: Vec<(String, String)> = (self.declared.iter())
            .flat_map(|(h, vifs)| vifs.values().map(|d| (d.tenant.clone(), h.clone())))
            .collect();
        all.iter().for_each(|(t, h)| self.count(t, h, true));
        self.tenants.retain(|t, _| read.contains(&keys::tenant(t)));
    }

    /// A key was deleted; keys that are neither vifs nor tenants are ignored. Returns the
    /// host and port of a vif key.
    pub fn delete<'k>(&mut self, key: &'k str) -> Option<(&'k str, &'k str)> {
        if let Some((h, port)) = keys::host_vif(key) {
            self.set_vif(h, port, None);
            return Some((h, port));
        }
        if let Some(t) = keys::name_under(keys::TENANTS, key) {
            self.tenants.remove(t);
        }
        None
    }

    /// A key was read or written; keys that are neither vifs nor tenants are ignored. Returns
    /// what a vif key held.
    pub fn put<'k>(&mut self, key: &'k str, value: &[u8]) -> Option<VifPut<'k>> {
        if let Some((h, port)) = keys::host_vif(key) {
            let read = VifDoc::parse(value).and_then(|d| Ok((d.declared(port)?, d)));
            let doc = match read {
                Ok((decl, doc)) => {
                    self.set_vif(h, port, decl);
                    Ok(doc)
                }
                Err(e) => {
                    // The last valid document stays: its tenant, weight and cap.
                    tracing::warn!("{key}: {e}; its last valid version stays in force");
                    Err(e.to_string())
                }
            };
            return Some(VifPut { host: h, port, doc });
        }
        if let Some(t) = keys::name_under(keys::TENANTS, key) {
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
        None
    }

    /// The tenants' limits, of their last valid documents.
    pub fn tenant_limits(&self) -> BTreeMap<String, TenantLimits> {
        self.tenants
            .iter()
            .filter_map(|(t, e)| Some((t.clone(), e.limits?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hosts_vif_documents_declare_the_tenant_members() {
        let mut d = DesiredState::default();
        d.put(
            "/vqos/v1/hosts/h2/vifs/vm7",
            br#"{"tenant": "acme", "weight": 3, "max": "50Mbit"}"#,
        );
        d.put("/vqos/v1/hosts/h2/vifs/vm8", br#"{"weight": 9}"#);
        let put = d.put("/vqos/v1/hosts/h1/vifs/vm1", br#"{"tenant": "acme"}"#);
        let put = put.unwrap();
        assert_eq!((put.host, put.port), ("h1", "vm1"));
        assert_eq!(put.doc.unwrap().tenant.as_deref(), Some("acme"));
        let vm7 = &d.declared["h2"]["vm7"];
        assert_eq!(
            (vm7.tenant.as_str(), vm7.weight, vm7.max_bps),
            ("acme", 3, Some(50_000_000))
        );
        // No tenant: no member.
        assert!(!d.declared["h2"].contains_key("vm8"));
        assert_eq!(d.declared["h1"]["vm1"].weight, 1);
        // An unreadable document keeps the last valid one.
        let bad = d.put("/vqos/v1/hosts/h2/vifs/vm7", b"{not json").unwrap();
        assert!(bad.doc.unwrap_err().contains("Invalid JSON"));
        assert_eq!(d.declared["h2"]["vm7"].weight, 3);
        // The tenant removed from a document: no member any more.
        d.put("/vqos/v1/hosts/h2/vifs/vm7", br#"{"weight": 3}"#);
        assert!(!d.declared.contains_key("h2"));
        assert_eq!(d.delete("/vqos/v1/hosts/h1/vifs/vm1"), Some(("h1", "vm1")));
        assert!(d.declared.is_empty());
        // Other keys are nobody's vifs.
        assert!(d.put("/vqos/v1/status/h1", b"{}").is_none());
        assert!(d.put("/vqos/v1/hosts/h1/vifs/a/b", b"{}").is_none());
    }

    /// The hosts of `tenant`, counted the long way from `declared`.
    fn counted(d: &DesiredState, tenant: &str) -> usize {
        let hosts = d.declared().values();
        hosts
            .filter(|v| v.values().any(|x| x.tenant == tenant))
            .count()
    }

    #[test]
    fn the_count_of_a_tenants_hosts_follows_every_put_delete_and_full_read() {
        let mut d = DesiredState::default();
        let vif = |h: &str, p: &str| format!("/vqos/v1/hosts/{h}/vifs/{p}");
        let doc = |t: &str| format!(r#"{{"tenant": "{t}"}}"#).into_bytes();
        let check = |d: &DesiredState, step: &str| {
            for t in ["acme", "beta", "none"] {
                assert_eq!(d.hosts_in(t), counted(d, t), "{step}: {t}");
            }
        };
        let steps: Vec<(&str, Option<&str>)> = vec![
            ("h1/vm1", Some("acme")),
            ("h1/vm2", Some("acme")), // a second vif of the same host: still one host
            ("h2/vm1", Some("acme")),
            ("h2/vm1", Some("beta")), // moves to another tenant
            ("h1/vm1", None),         // one of h1's two acme vifs goes: h1 stays
            ("h3/vm9", Some("beta")),
            ("h1/vm2", None),         // h1's last: it leaves acme
            ("h2/vm1", Some("beta")), // the same document again
        ];
        for (at, tenant) in steps {
            let (h, p) = at.split_once('/').unwrap();
            match tenant {
                Some(t) => drop(d.put(&vif(h, p), &doc(t))),
                None => drop(d.delete(&vif(h, p))),
            }
            check(&d, at);
        }
        assert_eq!((d.hosts_in("acme"), d.hosts_in("beta")), (0, 2));
        // A bad document keeps the last valid one, and its count.
        d.put(&vif("h3", "vm9"), b"{not json");
        check(&d, "bad document");
        // A vif without a tenant is no member; a full read keeps only what it read.
        d.put(&vif("h4", "vm1"), br#"{"weight": 2}"#);
        d.put(&vif("h5", "vm1"), &doc("acme"));
        check(&d, "no tenant");
        d.retain(&BTreeSet::from([vif("h5", "vm1")]));
        check(&d, "full read");
        assert_eq!((d.hosts_in("acme"), d.hosts_in("beta")), (1, 0));
    }

    #[test]
    fn a_tenant_keeps_its_last_valid_limits_and_a_full_read_drops_what_went() {
        let mut d = DesiredState::default();
        let key = "/vqos/v1/tenants/acme";
        d.put(key, br#"{"max":"100Mbit","added_by_a_newer_cli":true}"#);
        let max = |d: &DesiredState| d.tenant_limits().get("acme").and_then(|l| l.max_bps);
        assert_eq!(max(&d), Some(100_000_000));
        assert_eq!(d.tenants["acme"].unknown, "`added_by_a_newer_cli`");
        d.put(key, br#"{"max": "fast"}"#);
        assert_eq!(max(&d), Some(100_000_000));
        assert!(d.tenants["acme"].error.is_some());
        d.retain(&BTreeSet::from([key.to_string()]));
        assert_eq!(max(&d), Some(100_000_000));
        d.retain(&BTreeSet::new());
        assert_eq!(max(&d), None);
    }
}
