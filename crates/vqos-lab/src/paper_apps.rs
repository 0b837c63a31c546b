//! C2QoS Fig. 6(f)-(g) across its files: the FTP servers' rates and the nginx servers'
//! response times under `tcm`, `c2qos` and `c2qos` with HBS, against the nginx servers alone
//! ("native"), with the paper's claims checked.
//!
//! ## Behavior
//! - Each vqosd run's `results.json` gives its FTP servers' phase-2 rate against phase 1 and
//!   against their reference (their max here: the `phases` rows), and its nginx servers' wrk
//!   latency (`apps`: the mean over the servers of each statistic). A server whose test had
//!   errors (wrk's socket errors or non-2xx answers) or no answer at all is left out and named
//!   under the table: its latency would not be a response time. Several runs of a file
//!   (`--runs`) give each statistic's mean over the runs that have it.
//! - The paper's response-time claims are read at the median: "doubled compared to native"
//!   under the policer, "50 % additional latency is reduced" under C2TB and "more than 80 %"
//!   with HBS. Each is held to half of the paper's effect (the rule of the C2QoS Fig. 6 files):
//!   `tcm`'s median at least 1.5 × native's; C2TB's added median (over native) at most 75 % of
//!   `tcm`'s; HBS's at most 60 %. A claim whose runs are missing is "not run".

use std::fmt::Write as _;

use crate::paper::PaperRun;
use crate::topo::Baseline;

/// The experiment this section belongs to.
pub const APPS_PAPER: &str = "c2qos-fig6fg";

/// What one run of a Fig. 6(f)-(g) file measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileApps {
    /// The FTP servers' phase-2 rate over their phase-1 rate (mean of the servers).
    pub ftp_kept: Option<f64>,
    /// The FTP servers' phase-2 rate over their reference allocation (mean of the servers).
    pub ftp_of_max: Option<f64>,
    /// The nginx servers left out: their test had errors or no answer.
    pub web_failed: Vec<String>,
    /// The nginx servers' requests a second (sum), and their latency statistics (mean over the
    /// servers): mean, p50, p90, p99, µs.
    pub web_rps: Option<f64>,
    /// Mean latency, µs.
    pub web_mean_us: Option<f64>,
    /// Median, µs.
    pub web_p50_us: Option<f64>,
    /// 90th percentile, µs.
    pub web_p90_us: Option<f64>,
    /// 99th percentile, µs.
    pub web_p99_us: Option<f64>,
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Reads a run's `results.json`.
pub fn file_apps(results: &serde_json::Value) -> FileApps {
    let apps = results["apps"].as_array().cloned().unwrap_or_default();
    let ftp: Vec<&str> = apps
        .iter()
        .filter(|a| a["kind"] == "ftp")
        .filter_map(|a| a["vm"].as_str())
        .collect();
    let phases = results["phases"].as_array().cloned().unwrap_or_default();
    let rate = |p: usize, vm: &str| phases.get(p)?["vifs"][vm]["mean_bps"].as_f64();
    let reference = |vm: &str| phases.get(1)?["vifs"][vm]["expected_bps"].as_f64();
    let kept: Vec<f64> = ftp
        .iter()
        .filter_map(|vm| Some(rate(1, vm)? / rate(0, vm).filter(|r| *r > 0.0)?))
        .collect();
    let of_max: Vec<f64> = ftp
        .iter()
        .filter_map(|vm| Some(rate(1, vm)? / reference(vm).filter(|m| *m > 0.0)?))
        .collect();
    let answered = |h: &serde_json::Value| {
        h["errors"].as_u64() == Some(0) && h["requests"].as_u64().is_some_and(|n| n > 0)
    };
    let (http, failed): (Vec<_>, Vec<_>) = apps
        .iter()
        .filter(|a| a["kind"] == "http")
        .partition(|a| answered(&a["http"]));
    let http: Vec<&serde_json::Value> = http.iter().map(|a| &a["http"]).collect();
    let stat = |f: &dyn Fn(&serde_json::Value) -> Option<f64>| {
        mean(&http.iter().filter_map(|h| f(h)).collect::<Vec<_>>())
    };
    let pct = |p: f64| {
        move |h: &serde_json::Value| {
            h["percentiles_us"]
                .as_array()?
                .iter()
                .find(|x| x[0].as_f64() == Some(p))?[1]
                .as_f64()
        }
    };
    FileApps {
        web_failed: failed
            .iter()
            .map(|a| a["vm"].as_str().unwrap_or("?").to_string())
            .collect(),
        ftp_kept: mean(&kept),
        ftp_of_max: mean(&of_max),
        web_rps: (!http.is_empty()).then(|| {
            http.iter()
                .filter_map(|h| h["requests_per_s"].as_f64())
                .sum()
        }),
        web_mean_us: stat(&|h| h["mean_us"].as_f64()),
        web_p50_us: stat(&pct(50.0)),
        web_p90_us: stat(&pct(90.0)),
        web_p99_us: stat(&pct(99.0)),
    }
}

/// The mean of several runs of one file (`--runs`): each statistic over the runs that have
/// it; a server left out of any run is named. `None` for no runs.
pub fn mean_apps(runs: &[FileApps]) -> Option<FileApps> {
    if runs.is_empty() {
        return None;
    }
    let m = |f: fn(&FileApps) -> Option<f64>| mean(&runs.iter().filter_map(f).collect::<Vec<_>>());
    let mut failed: Vec<String> = Vec::new();
    for name in runs.iter().flat_map(|r| &r.web_failed) {
        if !failed.contains(name) {
            failed.push(name.clone());
        }
    }
    Some(FileApps {
        ftp_kept: m(|r| r.ftp_kept),
        ftp_of_max: m(|r| r.ftp_of_max),
        web_failed: failed,
        web_rps: m(|r| r.web_rps),
        web_mean_us: m(|r| r.web_mean_us),
        web_p50_us: m(|r| r.web_p50_us),
        web_p90_us: m(|r| r.web_p90_us),
        web_p99_us: m(|r| r.web_p99_us),
    })
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or("–".into(), f)
}

/// A claim's verdict: the paper's words, what was measured, met or not.
type Verdict = (&'static str, String, Option<bool>);

/// The paper's three response-time claims against the runs' medians (`None`: not run).
pub fn verdicts(
    native: Option<f64>,
    tcm: Option<f64>,
    c2qos: Option<f64>,
    hbs: Option<f64>,
) -> Vec<Verdict> {
    let added = |x: Option<f64>| Some(x? - native?);
    let share = |x: Option<f64>| {
        let t = added(tcm).filter(|t| *t > 0.0)?;
        Some(added(x)? / t)
    };
    let mut out: Vec<Verdict> = Vec::new();
    let ratio = tcm.zip(native).map(|(t, n)| t / n);
    out.push((
        "policer: response time doubled against native (median ≥ 1.5 × native's)",
        opt(ratio, |r| format!("{r:.2} × native")),
        ratio.map(|r| r >= 1.5),
    ));
    for (words, x, bound) in [
        (
            "C2TB: 50 % of the additional latency removed (added median ≤ 75 % of the policer's)",
            c2qos,
            0.75,
        ),
        (
            "C2TB + HBS: more than 80 % of it removed (added median ≤ 60 % of the policer's)",
            hbs,
            0.60,
        ),
    ] {
        let s = share(x);
        out.push((
            words,
            opt(s, |s| {
                format!("{:.0} % of the policer's added latency", s * 100.0)
            }),
            s.map(|s| s <= bound),
        ));
    }
    out
}

/// The section of the experiment's `summary.md`.
pub fn section_md(runs: &[PaperRun]) -> String {
    let by = |suffix: &str| {
        let each: Vec<FileApps> = runs
            .iter()
            .filter(|r| r.baseline == Baseline::Vqos && r.engine.is_none())
            .filter(|r| r.stem.ends_with(suffix))
            .filter_map(|r| r.result.as_ref().ok())
            .map(file_apps)
            .collect();
        mean_apps(&each)
    };
    let files = [
        ("native (nginx alone, `tcm`)", by("-native")),
        ("`tcm` (the policer)", by("-tcm")),
        ("`c2qos` (C2TB)", by("-c2qos")),
        ("`c2qos` + HBS", by("-c2qos-hbs")),
    ];
    let mut s = String::from(
        "\n## C2QoS Fig. 6(f)-(g): FTP and nginx servers\n\n| run | FTP phase 2 / phase 1 | FTP \
         phase 2 / reference | nginx requests/s | mean µs | p50 µs | p90 µs | p99 µs |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (name, f) in &files {
        let f = f.clone().unwrap_or_default();
        let pc = |v: Option<f64>| opt(v, |x| format!("{:.1} %", x * 100.0));
        let us = |v: Option<f64>| opt(v, |x| format!("{x:.0}"));
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            pc(f.ftp_kept),
            pc(f.ftp_of_max),
            us(f.web_rps),
            us(f.web_mean_us),
            us(f.web_p50_us),
            us(f.web_p90_us),
            us(f.web_p99_us)
        );
    }
    for (name, f) in &files {
        if let Some(f) = f.as_ref().filter(|f| !f.web_failed.is_empty()) {
            let _ = writeln!(
                s,
                "\n{name}: left out, errors or no answer: {}.",
                f.web_failed.join(", ")
            );
        }
    }
    let p50 = |i: usize| files[i].1.as_ref().and_then(|f| f.web_p50_us);
    s.push_str("\n| the paper (§VI-B, Fig. 6(g)) | measured | verdict |\n|---|---|---|\n");
    for (words, measured, ok) in verdicts(p50(0), p50(1), p50(2), p50(3)) {
        let v = match ok {
            Some(true) => "met",
            Some(false) => "not met",
            None => "not run",
        };
        let _ = writeln!(s, "| {words} | {measured} | {v} |");
    }
    s.push_str(
        "\nThe FTP claims (a drop of about 11 % under the policer, the purchase kept under C2TB) \
         are the files' own checks, in the rows above.\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results(ftp: [(f64, f64); 2], p50s: [f64; 2]) -> serde_json::Value {
        serde_json::json!({
            "phases": [
                {"vifs": {"ftp1": {"mean_bps": ftp[0].0, "expected_bps": 160e6},
                          "ftp2": {"mean_bps": ftp[1].0, "expected_bps": 160e6}}},
                {"vifs": {"ftp1": {"mean_bps": ftp[0].1, "expected_bps": 160e6},
                          "ftp2": {"mean_bps": ftp[1].1, "expected_bps": 160e6}}}
            ],
            "apps": [
                {"vm": "ftp1", "kind": "ftp"}, {"vm": "ftp2", "kind": "ftp"},
                {"vm": "web1", "kind": "http", "http": {"requests_per_s": 1000.0, "mean_us": 300.0,
                    "errors": 0, "requests": 10,
                    "percentiles_us": [[50.0, p50s[0]], [90.0, 500.0], [99.0, 900.0]]}},
                {"vm": "web2", "kind": "http", "http": {"requests_per_s": 3000.0, "mean_us": 500.0,
                    "errors": 0, "requests": 30,
                    "percentiles_us": [[50.0, p50s[1]], [90.0, 700.0], [99.0, 1100.0]]}},
                {"vm": "web3", "kind": "http", "error": "no wrk summary"},
                {"vm": "web4", "kind": "http", "http": {"requests_per_s": 9e5, "mean_us": 9.0,
                    "errors": 7, "requests": 900,
                    "percentiles_us": [[50.0, 1.0], [90.0, 1.0], [99.0, 1.0]]}}
            ]
        })
    }

    #[test]
    fn a_run_is_read_from_its_phases_and_apps() {
        let f = file_apps(&results([(160e6, 120e6), (160e6, 140e6)], [200.0, 400.0]));
        assert!((f.ftp_kept.unwrap() - 0.8125).abs() < 1e-9);
        assert!((f.ftp_of_max.unwrap() - 0.8125).abs() < 1e-9);
        assert_eq!(f.web_rps, Some(4000.0));
        assert_eq!(
            (f.web_mean_us, f.web_p50_us, f.web_p90_us, f.web_p99_us),
            (Some(400.0), Some(300.0), Some(600.0), Some(1000.0))
        );
        // web3 had no summary, web4 answered with errors (e.g. 403s): neither is averaged.
        assert_eq!(f.web_failed, ["web3", "web4"]);
        assert_eq!(file_apps(&serde_json::json!({})), FileApps::default());
    }

    #[test]
    fn repeated_runs_are_averaged_statistic_by_statistic() {
        let a = file_apps(&results([(160e6, 120e6), (160e6, 140e6)], [200.0, 400.0]));
        let mut b = file_apps(&results([(160e6, 160e6), (160e6, 160e6)], [100.0, 100.0]));
        b.web_failed = vec!["web4".into(), "web5".into()];
        b.web_p99_us = None;
        let m = mean_apps(&[a.clone(), b]).unwrap();
        // FTP kept: (0.8125 + 1.0) / 2; p50: (300 + 100) / 2; p99 from the one run that has it.
        assert!((m.ftp_kept.unwrap() - 0.90625).abs() < 1e-9, "{m:?}");
        assert_eq!(m.web_p50_us, Some(200.0));
        assert_eq!(m.web_p99_us, Some(1000.0));
        assert_eq!(m.web_failed, ["web3", "web4", "web5"]);
        // One run is itself; none is nothing.
        assert_eq!(mean_apps(std::slice::from_ref(&a)), Some(a));
        assert_eq!(mean_apps(&[]), None);
    }

    #[test]
    fn the_claims_are_held_to_half_the_papers_effect() {
        // native 100, tcm 200 (2×): C2TB at 150 removes 50 %, HBS at 110 removes 90 %.
        let v = verdicts(Some(100.0), Some(200.0), Some(150.0), Some(110.0));
        let ok: Vec<Option<bool>> = v.iter().map(|x| x.2).collect();
        assert_eq!(ok, [Some(true), Some(true), Some(true)]);
        assert_eq!(v[2].1, "10 % of the policer's added latency");
        // tcm 140 (1.4×) is not "doubled"; C2TB at 132 keeps 80 % of it; HBS at 130 75 %.
        let v = verdicts(Some(100.0), Some(140.0), Some(132.0), Some(130.0));
        let ok: Vec<Option<bool>> = v.iter().map(|x| x.2).collect();
        assert_eq!(ok, [Some(false), Some(false), Some(false)]);
        // A missing run, or a policer that added nothing, decides nothing.
        let v = verdicts(None, Some(200.0), Some(150.0), None);
        assert!(v.iter().all(|x| x.2.is_none()), "{v:?}");
        let v = verdicts(Some(100.0), Some(90.0), Some(95.0), Some(95.0));
        assert_eq!(v[0].2, Some(false));
        assert!(v[1].2.is_none() && v[2].2.is_none());
    }

    #[test]
    fn the_section_has_a_row_per_file_and_a_verdict_per_claim() {
        let run = |stem: &str, p50: f64| PaperRun {
            stem: stem.into(),
            baseline: crate::topo::Baseline::Vqos,
            engine: None,
            algorithms: vqos_sched::Variant::default(),
            repeat: 1,
            dir: "d".into(),
            result: Ok(results([(160e6, 160e6), (160e6, 160e6)], [p50, p50])),
            kept: false,
        };
        let mut htb = run("c2qos-fig6fg-tcm", 1.0);
        htb.baseline = crate::topo::Baseline::Htb;
        let md = section_md(&[
            htb,
            run("c2qos-fig6fg-native", 100.0),
            run("c2qos-fig6fg-tcm", 250.0),
            run("c2qos-fig6fg-c2qos", 175.0),
        ]);
        // vqosd's runs only: the htb run of the same file is not read.
        assert!(md.contains("| `tcm` (the policer) | 100.0 % | 100.0 % | 4000 | 400 | 250 |"));
        assert!(md.contains("| `c2qos` + HBS | – | – |"), "{md}");
        assert!(md.contains("| 2.50 × native | met |"), "{md}");
        assert!(
            md.contains("| 50 % of the policer's added latency | met |"),
            "{md}"
        );
        assert!(
            md.ends_with("rows above.\n") && md.contains("| – | not run |"),
            "{md}"
        );
    }
}
