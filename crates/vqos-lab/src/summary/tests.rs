//! Tests of [`super`] on synthetic results.

use super::*;
use serde_json::json;

fn sc() -> Scenario {
    Scenario::parse(
        "name = \"t\"\ndescription = \"two VMs\"\nduration = \"20s\"\ncapacity = \"100Mbit\"\n\
         [[vm]]\nname = \"vm1\"\n[[vm]]\nname = \"vm2\"\nstart = \"10s\"\n\
         [[expect]]\nphase = 2\nunfairness_at_most = 0.1\n\
         [[paper]]\nfigure = \"Fig. 9\"\nphase = 2\nvm = \"vm2\"\nmbit = 8.63\n\
         [[paper]]\nfigure = \"Fig. 9\"\nphase = 2\nratio = true\nvalue = 1.5\n",
    )
    .unwrap()
}

fn phases(a: f64, b: f64) -> Value {
    json!([
        {"vifs": {"vm1": {"mean_bps": 100e6}}, "aggregate_bps": 100e6, "unfairness": 0.0},
        {"vifs": {"vm1": {"mean_bps": a}, "vm2": {"mean_bps": b}},
         "aggregate_bps": a + b, "unfairness": 0.25}
    ])
}

fn lab(baseline: &str) -> RunRecord {
    RunRecord {
        baseline: baseline.into(),
        result: Ok(json!({
            "mode": "lab", "engine": "ancs", "phases": phases(60e6, 40e6),
            "simulated": phases(50e6, 50e6),
            "checks": [{"pass": true}, {"pass": false}],
            "simulated_checks": [{"pass": true}, {"pass": true}],
            "cpu": {"vqosd_percent": 12.34, "softirq_percent": 1.0}
        })),
        plot: Some("img/t.svg".into()),
    }
}

fn header() -> Header {
    Header {
        date: "2026-11-24 07:00 UTC".into(),
        commit: "abc1234".into(),
        duration_scale: 0.5,
        total_s: 725.0,
        sim_only: false,
        command: "vqos lab paper all --out x".into(),
        repeats: 1,
        kept_runs: 0,
    }
}

fn one(runs: Vec<RunRecord>) -> String {
    one_of(sc(), runs)
}

fn one_of(scenario: Scenario, runs: Vec<RunRecord>) -> String {
    let e = ExperimentRecord {
        name: "exp".into(),
        secs: 61.0,
        files: vec![FileRecord {
            stem: "t".into(),
            engine: None,
            algorithms: vqos_sched::Variant::Vqos,
            scenario,
            runs,
        }],
        paper_text: None,
        sweep_md: None,
        after_md: None,
    };
    summary_md(&header(), &[e])
}

#[test]
fn the_header_says_when_what_and_how_long() {
    let md = one(vec![lab("vqos")]);
    assert!(md.contains("2026-11-24 07:00 UTC"), "{md}");
    assert!(md.contains("commit `abc1234`") && md.contains("duration scale 0.5"));
    assert!(md.contains("total run time 12 min 5 s"), "{md}");
    assert!(md.contains("| [exp](#exp) | 1 min 1 s |"), "{md}");
}

#[test]
fn cells_come_from_the_results_and_the_paper() {
    let md = one(vec![lab("vqos"), lab("htb")]);
    assert!(
        md.contains("| phase | | paper | simulator (`vqos`) | lab (`ancs`) | `htb` |"),
        "{md}"
    );
    assert!(
        md.contains("| 1 | vm1 |  | 100.0 | 100.0 | 100.0 |"),
        "{md}"
    );
    assert!(
        md.contains("| 2 | vm2 | 8.63 (Fig. 9) | 50.0 | 40.0 | 40.0 |"),
        "{md}"
    );
    assert!(md.contains("| 2 | unfairness |  | 25.0 % |"), "{md}");
    assert!(
        md.contains("| 2 | largest / smallest | 1.50 (Fig. 9) | 1.00 | 1.50 | 1.50 |"),
        "{md}"
    );
    // Phase 1 has one VM: no unfairness row (neither paper nor expectation speaks of it).
    assert!(!md.contains("| 1 | unfairness |"), "{md}");
    assert!(
        md.contains("| | expectations passed | | 2 / 2 | 1 / 2 | 1 / 2 |"),
        "{md}"
    );
    assert!(md.contains("| 12.3 + 1.0 | 1.0 |"), "{md}");
    assert!(md.contains("![t vqos](img/t.svg)"), "{md}");
}

#[test]
fn a_failed_run_is_shown_as_failed() {
    let mut bad = lab("htb");
    bad.result = Err("Missing tool: iperf3".into());
    bad.plot = None;
    let md = one(vec![lab("vqos"), bad]);
    assert!(
        md.contains("| 2 | vm2 | 8.63 (Fig. 9) | 50.0 | 40.0 | failed |"),
        "{md}"
    );
    assert!(
        md.contains("The `htb` run failed: Missing tool: iperf3"),
        "{md}"
    );
}

#[test]
fn simulator_only_fills_the_simulator_column() {
    let sim = RunRecord {
        baseline: "sim".into(),
        result: Ok(
            json!({"mode": "sim", "engine": "ancs", "phases": phases(50e6, 50e6),
            "simulated": phases(50e6, 50e6), "checks": [{"pass": true}]}),
        ),
        plot: Some("img/t.svg".into()),
    };
    let md = one(vec![sim]);
    assert!(
        md.contains("| phase | | paper | simulator (`vqos`) |\n"),
        "{md}"
    );
    assert!(md.contains("| 2 | vm1 |  | 50.0 |"), "{md}");
    assert!(md.contains("| | expectations passed | | 1 / 1 |"), "{md}");
}

fn with_latency(baseline: &str) -> RunRecord {
    let mut r = lab(baseline);
    let lat = json!([{
        "vm": "vm1", "protocol": "udp", "size": 64, "rate_per_s": 1000.0,
        "phases": [
            {"phase": 1, "samples": 900, "lost": 0, "p50_us": 211.6, "p99_us": 1340.2},
            {"phase": 2, "samples": 0, "lost": 7, "p50_us": null, "p99_us": null}
        ]
    }]);
    r.result.as_mut().unwrap()["latency"] = lat;
    r
}

#[test]
fn latency_cells_show_p50_p99_and_losses() {
    let lat = json!([{"vm": "vm1", "protocol": "tcp", "phases": [
        {"phase": 1, "lost": 0, "p50_us": 99.5, "p99_us": 1000.4},
        {"phase": 2, "lost": 3, "p50_us": 120.0, "p99_us": 2500.0},
        {"phase": 3, "lost": 12, "p50_us": null, "p99_us": null}
    ]}]);
    let l = lat.as_array();
    assert_eq!(latency_cell(l, "vm1", "tcp", 1), "100 / 1000");
    assert_eq!(latency_cell(l, "vm1", "tcp", 2), "120 / 2500 (3 lost)");
    assert_eq!(latency_cell(l, "vm1", "tcp", 3), "no samples (12 lost)");
    assert_eq!(latency_cell(l, "vm1", "tcp", 4), "–");
    assert_eq!(latency_cell(l, "vm1", "udp", 1), "–");
    assert_eq!(latency_cell(l, "vm2", "tcp", 1), "–");
    assert_eq!(latency_cell(None, "vm1", "tcp", 1), "–");
}

#[test]
fn probe_rows_come_per_phase_with_the_simulator_empty() {
    let md = one(vec![with_latency("vqos"), lab("htb")]);
    assert!(
        md.contains("| 1 | vm1 udp probe RTT p50 / p99, µs |  | – | 212 / 1340 | – |"),
        "{md}"
    );
    assert!(
        md.contains("| 2 | vm1 udp probe RTT p50 / p99, µs |  | – | no samples (7 lost) | – |"),
        "{md}"
    );
    assert!(md.contains("the simulator does not model latency"), "{md}");
    // Without probes: no probe rows, no note.
    let md = one(vec![lab("vqos")]);
    assert!(
        !md.contains("probe RTT") && !md.contains("model latency"),
        "{md}"
    );
}

#[test]
fn an_engine_variant_is_a_table_headed_with_its_engine() {
    let mut scen = sc();
    scen.engine = vqos_sched::EngineKind::Policer;
    let mut run = lab("vqos");
    run.result.as_mut().unwrap()["engine"] = json!("policer");
    let e = ExperimentRecord {
        name: "exp".into(),
        secs: 1.0,
        files: vec![
            FileRecord {
                stem: "t".into(),
                engine: None,
                algorithms: vqos_sched::Variant::Vqos,
                scenario: sc(),
                runs: vec![lab("vqos")],
            },
            FileRecord {
                stem: "t".into(),
                engine: Some("policer".into()),
                algorithms: vqos_sched::Variant::Vqos,
                scenario: scen,
                runs: vec![run],
            },
        ],
        paper_text: None,
        sweep_md: None,
        after_md: Some("### On a real load\n\nrows\n".into()),
    };
    let md = summary_md(&header(), &[e]);
    assert!(md.contains("### t\n"), "{md}");
    assert!(md.contains("### t under engine `policer`\n"), "{md}");
    // The real-load section follows the files' tables.
    let real = md
        .find("### On a real load\n\nrows\n")
        .expect("the real-load section");
    assert!(
        real > md.find("### t under engine `policer`").unwrap(),
        "{md}"
    );
    assert!(
        md.contains("| phase | | paper | simulator (`policer`) | lab (`policer`) |"),
        "{md}"
    );
    // The paper's numbers are the file's, in both tables.
    assert_eq!(md.matches("| 2 | vm2 | 8.63 (Fig. 9) |").count(), 2, "{md}");
}

#[test]
fn latency_cells_read_what_the_lab_writes() {
    // The lab's `latency` key is the serialized ProbeResult list: read it as written.
    let phase =
        |phase: usize, p50: Option<f64>, p99: Option<f64>, lost: u64| crate::probe::PhaseLatency {
            phase,
            from_s: 0.0,
            to_s: 1.0,
            samples: 10,
            lost,
            p50_us: p50,
            p99_us: p99,
            p999_us: None,
            mean_us: None,
            max_us: None,
            error: None,
        };
    let r = crate::probe::ProbeResult {
        vm: "vm1".into(),
        protocol: vqos_probe::Protocol::Udp,
        size: 64,
        rate_per_s: 1000.0,
        phases: vec![
            phase(1, Some(150.4), Some(820.0), 0),
            phase(2, Some(160.0), Some(9100.6), 2),
        ],
    };
    let v = serde_json::to_value(vec![r]).unwrap();
    let l = v.as_array();
    assert_eq!(latency_cell(l, "vm1", "udp", 1), "150 / 820");
    assert_eq!(latency_cell(l, "vm1", "udp", 2), "160 / 9101 (2 lost)");
}

#[test]
fn an_algorithm_variant_is_a_table_headed_with_the_papers_algorithms() {
    let mut scen = sc();
    scen.variant = vqos_sched::Variant::Paper;
    let file = |algorithms, scenario| FileRecord {
        stem: "t".into(),
        engine: None,
        algorithms,
        scenario,
        runs: vec![lab("vqos")],
    };
    let e = ExperimentRecord {
        name: "exp".into(),
        secs: 1.0,
        files: vec![
            file(vqos_sched::Variant::Vqos, sc()),
            file(vqos_sched::Variant::Paper, scen),
        ],
        paper_text: None,
        sweep_md: None,
        after_md: None,
    };
    let md = summary_md(&header(), &[e]);
    assert!(md.contains("### t\n"), "{md}");
    assert!(
        md.contains("### t with the papers' algorithms as written\n"),
        "{md}"
    );
    assert!(md.contains("variant = \"paper\""), "{md}");
}

/// A lab run whose phase 2 gave `a` and `b`, with `pass` of its two checks passed.
fn lab_run(a: f64, b: f64, pass: usize) -> RunRecord {
    let mut r = lab("vqos");
    let v = r.result.as_mut().unwrap();
    v["phases"] = phases(a, b);
    v["checks"] = json!([{"pass": pass >= 1}, {"pass": pass >= 2}]);
    r
}

#[test]
fn repeated_runs_are_one_column_of_means_and_ranges() {
    let mut bad = lab("vqos");
    bad.result = Err("Missing tool: iperf3".into());
    let md = one(vec![
        lab_run(60e6, 40e6, 2),
        bad,
        lab_run(70e6, 30e6, 1),
        lab("htb"),
    ]);
    // One column per switch, however many runs.
    assert!(
        md.contains("| phase | | paper | simulator (`vqos`) | lab (`ancs`) | `htb` |\n"),
        "{md}"
    );
    // vm1: mean of 60 and 70 with its range; the failed run counts in no rate.
    assert!(
        md.contains("| 2 | vm1 |  | 50.0 | 65.0 [60.0–70.0] | 60.0 |"),
        "{md}"
    );
    assert!(
        md.contains("| 2 | largest / smallest | 1.50 (Fig. 9) | 1.00 | 1.92 [1.50–2.33] | 1.50 |"),
        "{md}"
    );
    // Each run's checks and CPU, in run order, the failed one named.
    assert!(
        md.contains("| | expectations passed | | 2 / 2 | 2 / 2 · failed · 1 / 2 | 1 / 2 |"),
        "{md}"
    );
    assert!(
        md.contains("| 12.3 + 1.0 · failed · 12.3 + 1.0 | 1.0 |"),
        "{md}"
    );
    assert!(
        md.contains("A `vqos` run failed: Missing tool: iperf3"),
        "{md}"
    );
}

#[test]
fn the_header_says_how_many_runs_a_cell_is() {
    let e = |repeats| {
        let mut h = header();
        h.repeats = repeats;
        summary_md(&h, &[])
    };
    assert!(e(3).contains("Each lab cell is 3 runs"), "{}", e(3));
    assert!(!e(1).contains("Each lab cell is"), "{}", e(1));
}

#[test]
fn what_the_simulator_does_not_model_is_said_beside_its_table() {
    assert!(!one(vec![lab("vqos")]).contains("*Simulator:"));
    let limited = Scenario::parse(
        "name = \"t\"\nduration = \"20s\"\ncapacity = \"100Mbit\"\n\
         [[vm]]\nname = \"vm1\"\ncpu = \"4%\"\n[[vm]]\nname = \"vm2\"\nstart = \"10s\"\n\
         [[expect]]\nphase = 2\nunfairness_at_most = 0.1\n",
    )
    .unwrap();
    let md = one_of(limited, vec![lab("vqos")]);
    assert!(
        md.contains("*Simulator: vm 'vm1': the simulator does not model a VM's CPU"),
        "{md}"
    );
}

#[test]
fn a_whole_run_figure_of_the_paper_sits_beside_whole_run_means() {
    // The paper's 64 % is over its whole run: it goes in a "whole run" row group, beside the
    // simulator's and the lab's whole-run unfairness, not beside phase 1's.
    let scenario = Scenario::parse(
        "name = \"t\"\nduration = \"20s\"\ncapacity = \"100Mbit\"\n\
         [[vm]]\nname = \"vm1\"\n[[vm]]\nname = \"vm2\"\nstart = \"10s\"\n\
         [[paper]]\nfigure = \"§I\"\nwhole_run = true\nunfairness = true\nvalue = 0.64\n\
         note = \"over 600 s\"\n",
    )
    .unwrap();
    let whole = |u: f64| {
        json!({"vifs": {"vm1": {"mean_bps": 70e6}, "vm2": {"mean_bps": 30e6}},
               "aggregate_bps": 100e6, "unfairness": u})
    };
    let run = RunRecord {
        baseline: "vqos".into(),
        result: Ok(json!({
            "mode": "lab", "engine": "vqos", "phases": phases(60e6, 40e6),
            "whole_run": whole(0.62), "simulated": phases(50e6, 50e6),
            "simulated_whole_run": whole(0.5), "checks": [], "simulated_checks": []
        })),
        plot: None,
    };
    let md = one_of(scenario.clone(), vec![run.clone()]);
    assert!(
        md.contains("| whole run | unfairness | 64 % (over 600 s; §I) | 50.0 % | 62.0 % |"),
        "{md}"
    );
    assert!(md.contains("| whole run | vm1 |  | 70.0 | 70.0 |"), "{md}");
    assert!(md.contains("| whole run | vm2 |  | 30.0 | 30.0 |"), "{md}");
    assert!(!md.contains("| 1 | unfairness |"), "{md}");

    // Results written before the whole run was kept: the rows are there, their cells "–".
    let mut old = run;
    if let Ok(v) = &mut old.result {
        let o = v.as_object_mut().unwrap();
        o.remove("whole_run");
        o.remove("simulated_whole_run");
    }
    let md = one_of(scenario, vec![old]);
    assert!(
        md.contains("| whole run | unfairness | 64 % (over 600 s; §I) | – | – |"),
        "{md}"
    );

    // A file whose numbers are all per phase has no whole-run rows.
    assert!(!one(vec![lab("vqos")]).contains("| whole run |"));
}

#[test]
fn an_ordered_ratio_row_is_the_first_vm_over_the_second() {
    // vm1 60, vm2 40 in phase 2: largest / smallest 1.50, vm2 / vm1 0.67.
    let ordered = Scenario::parse(
        "name = \"t\"\nduration = \"20s\"\ncapacity = \"100Mbit\"\n\
         [[vm]]\nname = \"vm1\"\n[[vm]]\nname = \"vm2\"\nstart = \"10s\"\n\
         [[expect]]\nphase = 2\nratio_at_least = 1.2\nvms = [\"vm2\", \"vm1\"]\nordered = true\n",
    )
    .unwrap();
    let md = one_of(ordered, vec![lab("vqos")]);
    assert!(md.contains("| 2 | vm2 / vm1 |  | 1.00 | 0.67 |"), "{md}");
    assert!(!md.contains("largest / smallest"), "{md}");
}
