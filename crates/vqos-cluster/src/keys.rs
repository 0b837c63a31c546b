//! The key layout in etcd (docs/cluster.md).
//!
//! | key | value |
//! |---|---|
//! | `/vqos/v1/hosts/<host>/vifs/<port>` | [`VifDoc`](crate::VifDoc): the desired policy of a port of a host |
//! | `/vqos/v1/tenants/<tenant>` | [`TenantDoc`](crate::TenantDoc): a tenant's min and max, cluster-wide |
//! | `/vqos/v1/status/<host>` | [`HostStatus`](crate::HostStatus): written by the host's agent under its lease |
//! | `/vqos/v1/grants/<tenant>/<host>` | [`Grant`](crate::Grant): what the host enforces of the tenant (no lease) |
//! | `/vqos/v1/raises/<tenant>` | the host that last raised its grant of the tenant; its `version` counts the raises |

/// The root of every key.
pub const ROOT: &str = "/vqos/v1/";

/// The prefix of every host's desired vif policies.
pub const HOSTS: &str = "/vqos/v1/hosts/";

/// The prefix of the tenants' policies.
pub const TENANTS: &str = "/vqos/v1/tenants/";

/// The prefix of the hosts' status.
pub const STATUS: &str = "/vqos/v1/status/";

/// The prefix of the hosts' grants.
pub const GRANTS: &str = "/vqos/v1/grants/";

/// The prefix of the aggregator shards' elections and terms ([`crate::election`]).
pub const AGGREGATORS: &str = "/vqos/v1/aggregators/";

/// The prefix of the tenants' raise counts.
pub const RAISES: &str = "/vqos/v1/raises/";

/// The key whose `version` counts `tenant`'s raises (a raise compares it).
pub fn raises(tenant: &str) -> String {
    format!("{RAISES}{tenant}")
}

/// The prefix of `tenant`'s grants.
pub fn tenant_grants(tenant: &str) -> String {
    format!("{GRANTS}{tenant}/")
}

/// The key of `host`'s grant of `tenant`.
pub fn grant(tenant: &str, host: &str) -> String {
    format!("{}{host}", tenant_grants(tenant))
}

/// The (tenant, host) of a grant key (`None` for any other key).
pub fn tenant_host(key: &str) -> Option<(&str, &str)> {
    let (t, h) = key.strip_prefix(GRANTS)?.split_once('/')?;
    let ok = |s: &str| !s.is_empty() && !s.contains('/');
    (ok(t) && ok(h)).then_some((t, h))
}

/// The prefix of `host`'s desired vif policies.
pub fn host_vifs(host: &str) -> String {
    format!("{HOSTS}{host}/vifs/")
}

/// The key of `port`'s policy on `host`.
pub fn vif(host: &str, port: &str) -> String {
    format!("{}{port}", host_vifs(host))
}

/// The key of `tenant`'s policy.
pub fn tenant(tenant: &str) -> String {
    format!("{TENANTS}{tenant}")
}

/// The key of `host`'s status.
pub fn status(host: &str) -> String {
    format!("{STATUS}{host}")
}

/// The last segment of `key` under `prefix` (`None` if the key is not directly under it).
pub fn name_under<'a>(prefix: &str, key: &'a str) -> Option<&'a str> {
    key.strip_prefix(prefix)
        .filter(|rest| !rest.is_empty() && !rest.contains('/'))
}

/// The (host, port) of a vif key `/vqos/v1/hosts/<host>/vifs/<port>` (`None` for any other key).
pub fn host_vif(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix(HOSTS)?;
    let (host, rest) = rest.split_once('/')?;
    let port = rest.strip_prefix("vifs/")?;
    let ok = |s: &str| !s.is_empty() && !s.contains('/');
    (ok(host) && ok(port)).then_some((host, port))
}

/// Checks a host, tenant or port name used in a key: 1 to 64 characters of `[A-Za-z0-9._-]`.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "Invalid {what} name '{name}': use 1 to 64 of A-Z a-z 0-9 . _ -"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_layout() {
        assert_eq!(vif("h1", "vm3"), "/vqos/v1/hosts/h1/vifs/vm3");
        assert_eq!(tenant("acme"), "/vqos/v1/tenants/acme");
        assert_eq!(status("h1"), "/vqos/v1/status/h1");
        assert_eq!(name_under(&host_vifs("h1"), &vif("h1", "vm3")), Some("vm3"));
        assert_eq!(name_under(TENANTS, "/vqos/v1/tenants/a/b"), None);
        assert_eq!(name_under(TENANTS, TENANTS), None);
        assert_eq!(host_vif(&vif("h1", "vm3")), Some(("h1", "vm3")));
        assert_eq!(grant("acme", "h1"), "/vqos/v1/grants/acme/h1");
        assert_eq!(tenant_host(&grant("acme", "h1")), Some(("acme", "h1")));
        assert_eq!(tenant_host("/vqos/v1/grants/acme/"), None);
        for other in [
            "/vqos/v1/hosts/h1/vifs/",
            "/vqos/v1/hosts/h1/vifs/a/b",
            "/vqos/v1/status/h1",
        ] {
            assert_eq!(host_vif(other), None, "{other}");
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("host", "h1.rack-2_a").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name("host", bad)
                .unwrap_err()
                .contains("Invalid host name"));
        }
    }
}
