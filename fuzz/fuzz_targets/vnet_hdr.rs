//! The virtio-net header: decoding any 12 bytes and writing them back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vqos_dataplane::frame::{VnetHdr, VNET_HDR_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() < VNET_HDR_LEN {
        return;
    }
    let hdr = VnetHdr::parse(data);
    let mut out = [0xffu8; VNET_HDR_LEN];
    hdr.write(&mut out);
    // Every field round-trips; `num_buffers` is written as 0.
    assert_eq!(out[..10], data[..10]);
    assert_eq!(out[10..], [0, 0]);
    assert_eq!(VnetHdr::parse(&out), hdr);
});
