use super::*;
use serde_json::json;

const SCENARIO: &str = r#"
name = "t"
duration = "20s"
capacity = "100Mbit"
[[vm]]
name = "vm1"
[[vm]]
name = "vm2"
[claims]
a = "Fig. 1: both VMs at their shares"
b = "Fig. 2: fair"
[[expect]]
claim = "a"
phase = 1
vm = "vm1"
near_reference_pct = 3
[[expect]]
phase = 1
aggregate_at_least = 0.9
[[expect]]
claim = "a"
phase = 1
vm = "vm2"
near_reference_pct = 3
[[expect]]
claim = "b"
phase = 1
unfairness_at_most = 0.1
"#;

fn sc() -> Scenario {
    Scenario::parse(SCENARIO).unwrap()
}

/// A run's results: each check passes unless its index is in `fail`.
fn result(fail: &[usize]) -> Value {
    let what = [
        "phase 1: vm1 within 3% of the reference",
        "phase 1: aggregate at least 90%",
        "phase 1: vm2 within 3% of the reference",
        "phase 1: unfairness at most 10%",
    ];
    let checks: Vec<Value> = (what.iter().enumerate())
        .map(|(i, w)| json!({"expectation": w, "measured": format!("m{i}"), "pass": !fail.contains(&i)}))
        .collect();
    json!({ "checks": checks })
}

#[test]
fn a_claim_is_met_when_every_check_naming_it_passed_and_ours_do_not_count() {
    let m = run_claims(&sc(), &[], &result(&[1])).unwrap();
    assert_eq!(m["a"], RunVerdict::Met(vec!["m0".into(), "m2".into()]));
    assert_eq!(m["b"], RunVerdict::Met(vec!["m3".into()]));
    assert_eq!(m.len(), 2, "the unclaimed check is ours: {m:?}");
    let m = run_claims(&sc(), &[], &result(&[2])).unwrap();
    assert_eq!(
        m["a"],
        RunVerdict::Missed(vec!["phase 1: vm2 within 3% of the reference: m2".into()])
    );
}

#[test]
fn a_run_whose_checks_do_not_line_up_with_the_file_is_refused() {
    let mut r = result(&[]);
    r["checks"].as_array_mut().unwrap().pop();
    let e = run_claims(&sc(), &[], &r).unwrap_err();
    assert_eq!(e, "3 checks in the run, 4 in the file");
    let mut r = result(&[]);
    r["checks"][1]["expectation"] = json!("phase 2: aggregate at least 90%");
    assert!(run_claims(&sc(), &[], &r)
        .unwrap_err()
        .contains("about phase 1"));
    // A probe's claim counts one more check after the expectations.
    let probes = [Some("b".to_string())];
    let e = run_claims(&sc(), &probes, &result(&[])).unwrap_err();
    assert_eq!(e, "4 checks in the run, 5 in the file");
}

#[test]
fn the_verdict_reads_every_run() {
    let met = RunVerdict::Met(vec![]);
    let missed = RunVerdict::Missed(vec![]);
    let none = RunVerdict::NoResult("not run".into());
    assert_eq!(
        verdict(&[met.clone(), met.clone(), met.clone()]),
        "**reproduced**"
    );
    assert_eq!(
        verdict(&[missed.clone(), missed.clone()]),
        "**not reproduced**"
    );
    assert_eq!(
        verdict(&[met.clone(), missed.clone(), met.clone()]),
        "in 2 of 3 runs"
    );
    assert_eq!(verdict(&[met.clone(), none.clone(), met]), "in 2 of 3 runs");
    assert_eq!(verdict(&[none.clone(), none]), "not run");
    assert_eq!(verdict(&[]), "not run");
}

#[test]
fn rows_come_per_claim_with_a_column_per_variant_and_vqos_first() {
    let runs = vec![
        (
            "paper-literal".to_string(),
            vec![Ok(result(&[3])), Err("not run".to_string())],
        ),
        ("vqos".to_string(), vec![Ok(result(&[])), Ok(result(&[0]))]),
    ];
    let rows = file_rows("fairness-static", "t", &sc(), &[], &runs);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].id, "a");
    let md = tables_md(&rows, &BTreeMap::from([("fairness-static".to_string(), 1)]));
    let table = &md[md.find("#### The fairness paper").unwrap()..];
    let head = table.lines().nth(2).unwrap();
    assert_eq!(
        head,
        "| experiment (file) | the paper's claim | vqos: runs met | paper-literal: runs met | verdict |"
    );
    let row_a = table.lines().find(|l| l.contains("both VMs")).unwrap();
    assert!(
        row_a.contains("| 1 / 2: all 2 met · missed phase 1: vm1"),
        "{row_a}"
    );
    assert!(row_a.ends_with("| in 1 of 2 runs |"), "{row_a}");
    let row_b = table.lines().find(|l| l.contains("Fig. 2: fair")).unwrap();
    assert!(row_b.contains("| 2 / 2: m3 · m3 |"), "{row_b}");
    assert!(
        row_b.contains("0 / 2: missed phase 1: unfairness at most 10%: m3 · no result (not run)"),
        "{row_b}"
    );
    assert!(row_b.ends_with("| **reproduced** |"), "{row_b}");
    assert!(table.contains(
        "Checks of ours, not claims of the paper (not counted above): fairness-static 1."
    ));
    // A paper without rows has no table.
    assert!(!md.contains("#### ANCS"), "{md}");
}

#[test]
fn c2tb_keeping_its_vm_counts_only_where_the_policer_lost_it_in_the_same_run() {
    let row = |stem: &str, id: &str, runs: Vec<RunVerdict>| ClaimRow {
        experiment: "c2qos-fig6".into(),
        stem: stem.into(),
        id: id.into(),
        claim: id.into(),
        cells: vec![("vqos".into(), runs)],
    };
    let met = || RunVerdict::Met(vec!["kept".into()]);
    let missed = || RunVerdict::Missed(vec!["kept too".into()]);
    let mut rows = vec![
        row("c2qos-fig6-lab-tcm", "loses", vec![met(), missed(), met()]),
        row(
            "c2qos-fig6-lab-c2qos",
            "keeps",
            vec![met(), met(), missed()],
        ),
    ];
    hold_against_baselines(&mut rows);
    let runs = &rows[1].cells[0].1;
    assert_eq!(runs[0], met());
    assert!(
        matches!(&runs[1], RunVerdict::NotShown(w) if w.contains("run 2")),
        "{runs:?}"
    );
    assert_eq!(runs[2], missed());
    assert_eq!(verdict(runs), "in 1 of 3 runs");
    // The baseline's own row is left as it was.
    assert_eq!(rows[0].cells[0].1[1], missed());
}

#[test]
fn a_run_directory_becomes_tables_over_the_repositorys_scenario_files() {
    let dir = std::env::temp_dir().join(format!("vqos-verdicts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let info = json!({"commit": "abc1234", "duration_scale": 1.0, "repeats": 3, "started": "2026-12-07 12:50 UTC"});
    std::fs::write(dir.join("run-info.json"), info.to_string()).unwrap();
    // ANCS Fig. 4's five checks (phases 1, 5, 5, 5, 5), all passed in runs 1 and 3; run 2
    // has one check fewer than the file.
    let checks = |n: usize| -> Value {
        let phases = [1, 5, 5, 5, 5];
        let c: Vec<Value> = (0..n)
            .map(|i| json!({"expectation": format!("phase {}: x", phases[i]), "measured": format!("v{i}"), "pass": true}))
            .collect();
        json!({ "checks": c })
    };
    for (k, n) in [(1, 5), (2, 4), (3, 5)] {
        let run = dir.join("ancs-fig4").join(format!("ancs-fig4-run{k}"));
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("results.json"), checks(n).to_string()).unwrap();
    }
    let md = verdicts_md(&dir, &crate::paper::scenarios_dir()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(md.starts_with("Generated by `vqos lab publish` from the run of 2026-12-07 12:50 UTC (commit `abc1234`, 3 lab runs per cell)"), "{md}");
    let alone = md
        .lines()
        .find(|l| l.contains("VM1 alone takes the whole link"))
        .unwrap();
    assert!(
        alone.contains("| 2 / 3: v0 · no result (4 checks in the run, 5 in the file) · v0 |"),
        "{alone}"
    );
    assert!(alone.ends_with("| in 2 of 3 runs |"), "{alone}");
    // Every paper has its table, and the runs that are not there read "not run".
    for paper in [
        "#### ANCS",
        "#### The fairness paper",
        "#### C2QoS",
        "#### PID-ECN",
    ] {
        assert!(md.contains(paper), "{paper}");
    }
    let fair = md
        .lines()
        .find(|l| l.contains("`fairness-static`"))
        .unwrap();
    assert!(
        fair.ends_with("| no result (not run) | not run |"),
        "{fair}"
    );
}
