//! The example configuration shipped in `examples/vqosd.toml` stays valid.

use std::process::Command;

#[test]
fn shipped_example_config_passes_check() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/vqosd.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_vqosd"))
        .args(["--config", path, "--check"])
        .output()
        .expect("run vqosd");
    assert!(
        out.status.success(),
        "vqosd --check failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_refuses_an_impossible_policy() {
    let dir = std::env::temp_dir().join(format!("vqosd-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/vqosd.toml"
    ))
    .unwrap()
    .replace("min = \"100Mbit\"", "min = \"2Gbit\"");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vqosd"))
        .args(["--config", path.to_str().unwrap(), "--check"])
        .output()
        .expect("run vqosd");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("vqos-vm2") || err.contains("minimum"), "{err}");
}

#[test]
fn the_examples_cluster_section_is_valid_when_uncommented() {
    let dir = std::env::temp_dir().join(format!("vqosd-example-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cluster.toml");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/vqosd.toml"
    ))
    .unwrap();
    let (head, tail) = text.split_once("# [cluster]").expect("a [cluster] example");
    let section: String = tail
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&path, format!("{head}[cluster]{section}\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vqosd"))
        .arg("--config")
        .arg(&path)
        .arg("--check")
        .output()
        .expect("run vqosd");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "vqosd --check failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
