//! The man pages scripts/install.sh installs: vqosd(8) from `vqosd --man`, and
//! packaging/vqosd.toml.5, whose example must be a config the daemon accepts.

use std::process::Command;

use vqosd::config::Config;

const TOML_PAGE: &str = include_str!("../../../packaging/vqosd.toml.5");

#[test]
fn vqosd_man_is_a_section_8_page_with_the_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_vqosd"))
        .arg("--man")
        .output()
        .expect("run vqosd --man");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(
        page.lines().any(|l| l.starts_with(".TH vqosd 8 ")),
        "{page}"
    );
    // ASCII only: groff without preconv warns on anything else.
    assert!(page.is_ascii(), "{page}");
    for needle in [
        ".SH SYNOPSIS",
        ".SH OPTIONS",
        "\\-\\-config",
        "\\-\\-check",
        ".SH EXAMPLE",
        ".SH EXIT STATUS",
        ".SH FILES",
        "vqosd.toml\\fR(5)",
    ] {
        assert!(page.contains(needle), "vqosd.8 lacks {needle}:\n{page}");
    }
    // Hidden options (tests and packaging) stay out of it.
    assert!(!page.contains("mock\\-loop"), "{page}");
    assert!(!page.contains("\\-\\-man"), "{page}");
}

#[test]
fn vqosd_toml_page_example_is_a_valid_config() {
    let start = TOML_PAGE.find("\n.EX\n").expect("an .EX block") + 5;
    let end = start + TOML_PAGE[start..].find("\n.EE\n").expect("its .EE");
    // The roff escapes used in the block: \- is a hyphen.
    let example = TOML_PAGE[start..end].replace("\\-", "-");
    assert!(
        !example.contains('\\'),
        "an unexpected roff escape: {example}"
    );
    let config = Config::parse(&example, |_| None)
        .unwrap_or_else(|e| panic!("the example of vqosd.toml(5) is refused: {e}\n{example}"));
    assert_eq!(
        config.uplink.as_ref().map(|u| u.config.name.as_str()),
        Some("vqos-up")
    );
}

#[test]
fn vqosd_toml_page_names_every_table() {
    for table in [
        "[api]",
        "[metrics]",
        "[uplink]",
        "[[port]]",
        "[cost_model]",
        "[emulate]",
        "[fairness]",
        "[pid_ecn]",
        "[cluster]",
    ] {
        assert!(
            TOML_PAGE.contains(&format!("\\fB{table}\\fR")),
            "no {table}"
        );
    }
}

#[test]
fn vqosd_toml_page_names_every_top_level_key_the_parser_knows() {
    // The parser's refusal of an unknown key lists the keys it knows: a key added to the
    // config without a word in vqosd.toml(5) fails here.
    let err = Config::parse("no_such_key = 1\n", |_| None)
        .expect_err("an unknown key is refused")
        .to_string();
    let known = err
        .split("expected one of ")
        .nth(1)
        .unwrap_or_else(|| panic!("no list of keys in: {err}"));
    let keys: Vec<&str> = known.split('`').skip(1).step_by(2).collect();
    assert!(keys.len() > 10, "{err}");
    for key in keys {
        let named = [
            format!("\\fB{key}\\fR"),
            format!("\\fB[{key}]\\fR"),
            format!("\\fB[[{key}]]\\fR"),
        ];
        assert!(
            named.iter().any(|n| TOML_PAGE.contains(n.as_str())),
            "vqosd.toml(5) does not describe the key {key}"
        );
    }
}
