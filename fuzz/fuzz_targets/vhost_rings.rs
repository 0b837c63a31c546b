//! A hostile guest's rings: descriptor tables, avail rings and buffers of arbitrary bytes,
//! over guest memory of one region or two (adjacent or with a hole), through a vhost-user
//! port's data path: no panic, every chain taken is a frame or a counted misbehaviour.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vqos_dataplane::vhost_user::fuzzing::run_rings;

fuzz_target!(|data: &[u8]| {
    run_rings(data);
});
