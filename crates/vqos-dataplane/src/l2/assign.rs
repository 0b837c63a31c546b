//! A new port's assigned addresses ([`Addresses::pin_assigned`]): its configured ones and the
//! locks a previous run persisted, pinned before the port forwards.

use crate::config::{IpAddrs, IpPolicy, MacPolicy, PortSecurity};
use crate::frame::{format_mac, MacKey};
use crate::guard::{key_ip, IpKey};

use super::{AddrKey, Addresses, Learnt, Pinned};

impl Addresses {
    /// Pins a new port's assigned addresses to `slot`: its configured ones, and the locks a
    /// previous run persisted ([`PortSecurity::restored`], where the port learns), taking them
    /// from ports that only learnt them or locked them first-come in this run. A configured
    /// address held by another assignment refuses the port: "MAC" or "IP", the address (as
    /// text) and the slot that owns it (`None`: the table is full); addresses pinned before it
    /// stay pinned until the caller purges the slot. A restored lock that cannot be had is
    /// skipped (the address was assigned elsewhere since).
    pub fn pin_assigned(
        &mut self,
        security: &PortSecurity,
        slot: u16,
        now_ns: u64,
    ) -> Result<Pinned, (&'static str, String, Option<u16>)> {
        let mut done = Pinned::default();
        let fixed_ips: &[IpKey] = match &security.ips {
            Some(IpPolicy {
                addrs: IpAddrs::Fixed(list),
                ..
            }) => list,
            _ => &[],
        };
        let fixed_macs: &[MacKey] = match &security.macs {
            MacPolicy::Fixed(list) => list,
            _ => &[],
        };
        let learns_ips = matches!(
            &security.ips,
            Some(IpPolicy {
                addrs: IpAddrs::Learn { .. },
                ..
            })
        );
        let restored_macs = match security.macs {
            MacPolicy::Learn { .. } => &security.restored.macs[..],
            _ => &[],
        };
        let restored_ips = if learns_ips {
            &security.restored.ips[..]
        } else {
            &[]
        };
        for (&mac, configured) in fixed_macs
            .iter()
            .map(|m| (m, true))
            .chain(restored_macs.iter().map(|m| (m, false)))
        {
            match self.macs.pin(mac, slot, true, now_ns) {
                Learnt::Yes => {}
                Learnt::Taken(from) => {
                    self.locks.unlock(from, AddrKey::Mac(mac));
                    done.taken.push((AddrKey::Mac(mac), from));
                }
                refused if configured => {
                    return Err(("MAC", format_mac(mac), owner_of(refused)));
                }
                _ => continue,
            }
            if !configured {
                done.locked.push(AddrKey::Mac(mac));
            }
        }
        for (&ip, configured) in fixed_ips
            .iter()
            .map(|k| (k, true))
            .chain(restored_ips.iter().map(|k| (k, false)))
        {
            match self.ips.pin(ip, slot, true, now_ns) {
                Learnt::Yes => {}
                Learnt::Taken(from) => {
                    self.locks.unlock(from, AddrKey::Ip(ip));
                    done.taken.push((AddrKey::Ip(ip), from));
                }
                refused if configured => {
                    return Err(("IP", key_ip(ip).to_string(), owner_of(refused)));
                }
                _ => continue,
            }
            if !configured {
                done.locked.push(AddrKey::Ip(ip));
            }
        }
        Ok(done)
    }
}

/// The owner a refused pin names (`None`: the table was full).
fn owner_of(refused: Learnt) -> Option<u16> {
    match refused {
        Learnt::Owned(o) => Some(o),
        _ => None,
    }
}
