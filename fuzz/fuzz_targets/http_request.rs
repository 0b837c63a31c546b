//! vqosd's HTTP/1.1 request and response parsers on arbitrary bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vqosd::http::{read_request, read_response};

/// The daemon's body limit is larger; a small one exercises the "too large" path too.
const MAX_BODY_BYTES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = read_request(&mut &data[..], MAX_BODY_BYTES) {
        assert!(req.body.len() <= MAX_BODY_BYTES);
        assert!(req
            .headers
            .iter()
            .all(|(k, _)| k.to_ascii_lowercase() == *k));
    }
    if let Ok(resp) = read_response(&mut &data[..], MAX_BODY_BYTES) {
        assert!(resp.body.len() <= MAX_BODY_BYTES);
    }
});
