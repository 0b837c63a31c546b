//! Which switch carries the traffic, and what each can express of a scenario's policies.

use std::fmt;
use std::str::FromStr;

use crate::LabError;

/// Which switch carries the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Baseline {
    /// vqosd with the scenario's engine and policies.
    #[default]
    Vqos,
    /// A Linux bridge, no QoS.
    Bridge,
    /// A Linux bridge with an HTB class per VM.
    Htb,
    /// A Linux bridge with a tbf per VM at its max.
    Tbf,
    /// Open vSwitch's userspace datapath with an OpenFlow meter per VM at its max.
    Ovs,
}

impl Baseline {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::Vqos => "vqos",
            Baseline::Bridge => "bridge",
            Baseline::Htb => "htb",
            Baseline::Tbf => "tbf",
            Baseline::Ovs => "ovs",
        }
    }

    /// What this baseline can and cannot express of the scenario's policies.
    pub fn capabilities(self) -> &'static str {
        match self {
            Baseline::Vqos => {
                "vqosd with the scenario's engine: weights, minimums, maximums and priorities as \
                 the engine implements them, changed live through the control API."
            }
            Baseline::Bridge => {
                "Linux bridge, no QoS (native Xen's behaviour): no weights, no minimums, no \
                 maximums; the uplink is a tbf at the scenario's capacity, so TCP splits it by \
                 connection count and RTT."
            }
            Baseline::Htb => {
                "Linux HTB on the uplink's egress (the papers' \"traffic controller\"): weights \
                 only as the quantum (64 KiB × weight) that divides the excess; minimums as the \
                 class rate (a 1 Mbit floor otherwise); maximums as the ceil; no priority used. \
                 With TSO/GSO a 64 KiB super-packet is one dequeue, so a quantum under 64 KiB \
                 silently splits equally — hence quanta of at least 64 KiB. The shaping costs \
                 softirq CPU in the kernel."
            }
            Baseline::Tbf => {
                "One tbf per VM at its maximum (the Kubernetes bandwidth plugin): caps only; no \
                 weights, no minimums; VMs without a maximum share the capacity tbf like the \
                 bridge."
            }
            Baseline::Ovs => {
                "Open vSwitch, userspace datapath (datapath_type=netdev, veth ports read through \
                 packet sockets, userspace TSO), L2 learning (NORMAL): maximums only, as an \
                 OpenFlow 1.3 meter per VM (kbps, drop band, 300 ms burst) on the VM's packets \
                 (in_port for upload, dl_dst for download), changed live with mod-meter. A meter \
                 is a policer: it drops, it cannot queue, so TCP runs somewhat under the cap. No \
                 weights, no minimums, no priorities: meters cannot express them, and OVS's \
                 queues (QoS table, linux-htb) are not applied by the userspace datapath; \
                 ingress_policing_rate needs tc police, which this kernel lacks. The capacity is \
                 a tbf on the uplink's egress, as for the bridge. The 'vqosd' CPU figure is \
                 ovs-vswitchd's CPU."
            }
        }
    }
}

impl fmt::Display for Baseline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Baseline {
    type Err = LabError;
    fn from_str(s: &str) -> Result<Self, LabError> {
        Ok(match s {
            "vqos" => Baseline::Vqos,
            "bridge" => Baseline::Bridge,
            "htb" => Baseline::Htb,
            "tbf" => Baseline::Tbf,
            "ovs" => Baseline::Ovs,
            other => {
                return Err(LabError::Invalid(format!(
                    "Unknown baseline '{other}': expected vqos, bridge, htb, tbf or ovs (and, for \
                     `vqos lab paper c2qos-fig6` only, ovs-dpdk: the real load)"
                )))
            }
        })
    }
}
