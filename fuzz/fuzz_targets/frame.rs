//! Frame validation, on-wire size, CE marking and the address guards' parsing on untrusted
//! bytes (a virtio-net header and an Ethernet frame, as a port reads them).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vqos_dataplane::frame::{
    ipv4_checksum, mark_ce, validate, wire_bytes, ETH_HDR_LEN, VNET_HDR_LEN,
};
use vqos_dataplane::guard;

fuzz_target!(|data: &[u8]| {
    // The guards read any bytes a port hands over, valid or not: never a panic, at most two
    // claims, and the services a vif has only ever turn a refusal into a pass.
    if data.len() >= VNET_HDR_LEN {
        let eth = &data[VNET_HDR_LEN..];
        let _ = guard::l2_refusal(eth, 0x01_80_c2_00_00_00, true);
        let _ = guard::announced(eth);
        let none = guard::Services::default();
        let all = guard::Services {
            router: true,
            dhcp_server: true,
        };
        let strict = guard::inspect(eth, 0x02_00_00_00_00_01, none);
        let lax = guard::inspect(eth, 0x02_00_00_00_00_01, all);
        if let Ok(c) = strict {
            assert!(c.len <= 2);
            assert_eq!(
                lax, strict,
                "a frame passing without rights passes the same with them"
            );
        }
    }
    let Ok(hdr) = validate(data) else {
        // Refused frames are never sized or marked by the switch; sizing one must still not
        // panic (the header may come from anywhere).
        if data.len() >= VNET_HDR_LEN {
            let _ = wire_bytes(data, &vqos_dataplane::frame::VnetHdr::parse(data));
        }
        return;
    };
    let eth_len = (data.len() - VNET_HDR_LEN) as u64;
    let wire = wire_bytes(data, &hdr);
    // At least the frame itself, and below 2^26 (the documented bound: fits a u32).
    assert!(wire >= eth_len, "wire {wire} < frame {eth_len}");
    assert!(wire < 1 << 26, "wire {wire}");

    let mut eth = data[VNET_HDR_LEN..].to_vec();
    let ipv4 = eth.len() >= ETH_HDR_LEN + 20 && eth[12..14] == [0x08, 0x00] && eth[14] >> 4 == 4;
    let sum_ok = ipv4 && ipv4_checksum(&eth[14..34]) == 0;
    let changed = mark_ce(&mut eth);
    assert_eq!(eth.len(), data.len() - VNET_HDR_LEN);
    if changed {
        // Marked once: marking again changes nothing.
        let again = eth.clone();
        assert!(!mark_ce(&mut eth));
        assert_eq!(eth, again);
        // A valid IPv4 header checksum stays valid (RFC 1624 update).
        if sum_ok {
            assert_eq!(ipv4_checksum(&eth[14..34]), 0, "checksum broken by marking");
        }
    } else {
        assert_eq!(eth, data[VNET_HDR_LEN..], "unchanged frame was modified");
    }
});
