//! vqosd's config file parser on arbitrary text: a clear error or a config, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vqosd::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = Config::parse(text, |_| Some("fuzz-token-0123456789abcdef".into())) {
        // A config that parses yields a policy set that validates.
        config
            .policy_set()
            .validate()
            .expect("a parsed config's policy set is valid");
    }
});
