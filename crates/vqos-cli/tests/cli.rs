//! The offline commands as a user runs them: `vqos alloc` and `vqos sim`.

use std::process::{Command, Output};

fn vqos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vqos"))
        .args(args)
        .output()
        .expect("run vqos")
}

fn scenario(name: &str) -> String {
    format!("{}/../../scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn alloc_json_is_the_reference_allocation() {
    let out = vqos(&[
        "alloc",
        "--capacity",
        "940Mbit",
        "--vif",
        "vm1:weight=1",
        "--vif",
        "vm2:weight=2",
        "--vif",
        "vm3:weight=3",
        "--vif",
        "vm4:weight=4",
        "--vif",
        "vm5:weight=5,max=150Mbit,min=0,demand=unlimited",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["capacity_bps"], 940_000_000u64);
    let rates: Vec<(String, u64)> = v["vifs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["name"].as_str().unwrap().to_string(),
                x["rate_bps"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = [79.0, 158.0, 237.0, 316.0, 150.0];
    for ((name, r), (i, w)) in rates.iter().zip(want.iter().enumerate()) {
        assert_eq!(name, &format!("vm{}", i + 1));
        assert!((*r as f64 / 1e6 - w).abs() < 0.1, "{name}: {r}");
    }
}

/// `--direction in` allocates what the vifs receive, as the scheduled downlink does: the same
/// weight and min, `max_in` (else `max`) as the max, the min capped by it.
#[test]
fn alloc_direction_in_is_the_downlinks_reference_allocation() {
    let rates = |direction: &str| -> Vec<u64> {
        let out = vqos(&[
            "alloc",
            "--direction",
            direction,
            "--capacity",
            "400Mbit",
            "--vif",
            "vm1:weight=1,min=250Mbit,max_in=100Mbit",
            "--vif",
            "vm2:weight=3",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["vifs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["rate_bps"].as_u64().unwrap())
            .collect()
    };
    // Out: vm1's min; in: its max_in caps it (and its min), vm2 takes the rest.
    assert_eq!(rates("out"), vec![250_000_000, 150_000_000]);
    assert_eq!(rates("in"), vec![100_000_000, 300_000_000]);
    let bad = vqos(&[
        "alloc",
        "--direction",
        "up",
        "--capacity",
        "1Gbit",
        "--vif",
        "a",
    ]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn alloc_refuses_impossible_policies_naming_the_problem() {
    for (args, needle) in [
        (
            vec!["--vif", "vm1:weight=0"],
            "weight must be greater than 0",
        ),
        (
            vec!["--vif", "vm1:min=300Mbit,max=200Mbit"],
            "min 300Mbit is above max 200Mbit",
        ),
        (
            vec!["--vif", "a:min=600Mbit", "--vif", "b:min=600Mbit"],
            "Sum of minimums",
        ),
        (vec!["--vif", "a:speed=1"], "unknown key 'speed'"),
        (vec!["--vif", "a:max=fast"], "Invalid rate 'fast'"),
        (vec!["--vif", "a", "--vif", "a"], "Duplicate vif 'a'"),
    ] {
        let mut all = vec!["alloc", "--capacity", "1Gbit"];
        all.extend(args.iter().copied());
        let out = vqos(&all);
        // A usage error: the command line is all there is to blame (before: exit 1).
        assert_eq!(out.status.code(), Some(2), "{all:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{all:?}: {err}");
    }
}

#[test]
fn sim_json_has_the_documented_keys_and_check_sets_the_status() {
    let out = vqos(&["sim", &scenario("ancs-fig5"), "--json", "--check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["scenario"], "ancs-fig5");
    assert_eq!(v["mode"], "sim");
    let phases = v["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 3);
    for p in phases {
        for key in ["start_s", "end_s", "aggregate_bps", "unfairness"] {
            assert!(p[key].is_number(), "{key} in {p}");
        }
        let vm1 = &p["vifs"]["vm1"];
        assert!(vm1["mean_bps"].is_number() && vm1["expected_bps"].is_number());
    }
    // A scenario whose expectation fails: --check exits 5.
    let dir = std::env::temp_dir().join(format!("vqos-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("strict.toml");
    let text = std::fs::read_to_string(scenario("ancs-fig4"))
        .unwrap()
        .replace("unfairness_at_most = 0.03", "unfairness_at_least = 0.5");
    std::fs::write(&path, text).unwrap();
    let out = vqos(&["sim", path.to_str().unwrap(), "--check"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&out.stdout).contains("[FAIL]"));
}

#[test]
fn sim_reports_a_bad_scenario_with_file_and_line() {
    let dir = std::env::temp_dir().join(format!("vqos-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "name = \"x\"\nduration = \"1s\"\ncapacity = \"1Gbit\"\n[[vm]]\nname = \"a\"\nwieght = 2\n",
    )
    .unwrap();
    let out = vqos(&["sim", path.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("line 6") && err.contains("wieght"),
        "{err}"
    );
}

/// Before: above 2^53 bit/s the allocator's f64 level handed out more than the capacity
/// (+1793 bit/s here), and the text output's total could overflow.
#[test]
fn alloc_never_hands_out_more_than_a_huge_capacity() {
    let mut args = vec!["alloc", "--capacity", "18446744073709551615bit", "--json"];
    let vifs = [
        "a:weight=5",
        "b:weight=13",
        "c:weight=17",
        "d:weight=19",
        "e:weight=23",
    ];
    for v in &vifs {
        args.extend(["--vif", v]);
    }
    let out = vqos(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sum: u128 = v["vifs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| u128::from(x["rate_bps"].as_u64().unwrap()))
        .sum();
    assert!(sum <= u128::from(u64::MAX), "{sum}");
    args.retain(|a| *a != "--json");
    let out = vqos(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn lab_paper_all_sim_only_writes_a_summary_with_every_figure() {
    let out = std::env::temp_dir().join(format!("vqos-cli-paper-all-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let o = vqos(&[
        "lab",
        "paper",
        "all",
        "--sim-only",
        "--duration-scale",
        "0.1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        md.contains("commit `") && md.contains("duration scale 0.1"),
        "{md}"
    );
    // A section per experiment, a table row for every figure's file, a plot for each.
    for name in [
        "ancs-fig4",
        "ancs-fig5",
        "ancs-fig6",
        "ancs-fig8",
        "ancs-table1-2",
        "fairness-static",
        "fairness-fluctuating",
        "fairness-path",
        "c2qos-fig1",
        "c2qos-fig6",
        "c2qos-fig6fg",
        "pid-ecn-unequal",
        "pid-ecn-receiver-cpu",
        "pid-ecn-start-stop",
        "pid-ecn-mixed",
    ] {
        assert!(
            md.contains(&format!("| [{name}](#{name}) |")),
            "{name}: {md}"
        );
        assert!(md.contains(&format!("\n## {name}\n")), "{name}");
    }
    assert!(md.contains("| 1 | vm1 | 206 (PID-ECN Fig. 4) |"), "{md}");
    assert!(out.join("img/ancs-fig5.svg").is_file());
    // The fairness paper's enforcement: the controlled files once more under `policer`.
    assert!(
        md.contains("### fairness-static under engine `policer`"),
        "{md}"
    );
    assert!(out.join("img/fairness-fluctuating-policer.svg").is_file());
    let o = vqos(&["lab", "paper", "ancs-fig5", "--sim-only"]);
    assert_eq!(o.status.code(), Some(2), "--sim-only needs all");
    // Repeats are lab runs: none with --sim-only, at least one otherwise.
    let o = vqos(&["lab", "paper", "all", "--sim-only", "--runs", "3"]);
    assert_eq!(o.status.code(), Some(2), "--runs with --sim-only");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--runs repeats lab runs"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = vqos(&["lab", "paper", "ancs-fig5", "--runs", "0"]);
    assert_eq!(o.status.code(), Some(2), "--runs 0");
    // Publishing into a docs directory: the page and its plots, links under img/sim/.
    let docs = out.join("docs");
    let o = vqos(&[
        "lab",
        "publish",
        out.to_str().unwrap(),
        "--docs",
        docs.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["plots"].as_u64().unwrap() > 10, "{v}");
    let page = std::fs::read_to_string(docs.join("paper-sim.md")).unwrap();
    assert!(page.contains("](img/sim/ancs-fig5.svg)"), "{page}");
    assert!(docs.join("img/sim/fairness-static-policer.svg").is_file());
    let o = vqos(&["lab", "publish", docs.to_str().unwrap()]);
    assert_ne!(o.status.code(), Some(0), "no summary there");
    let o = vqos(&["lab", "paper", "ancs-fig5", "--docs", "docs"]);
    assert_eq!(o.status.code(), Some(2), "--docs needs all");
    std::fs::remove_dir_all(&out).unwrap();
}
