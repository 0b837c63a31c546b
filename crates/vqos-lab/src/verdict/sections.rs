//! The verdicts of the experiments whose sections judge their own claims: C2QoS Fig. 6's real
//! load ([`crate::real_load::checks`], one run) and Fig. 6(f)-(g)'s applications
//! ([`crate::paper_apps::verdicts`], per lab run from the four files' runs of the same
//! number). The same functions make those sections, so the table and the section agree.

use std::path::Path;

use serde_json::Value;

use super::{ClaimRow, RunVerdict};
use crate::paper_apps::{file_apps, verdicts};
use crate::real_load::{checks, latest, REAL_LOAD_DIR};

fn claim_row(experiment: &str, stem: &str, claim: &str, runs: Vec<RunVerdict>) -> ClaimRow {
    ClaimRow {
        experiment: experiment.into(),
        stem: stem.into(),
        id: claim.into(),
        claim: claim.into(),
        cells: vec![("vqos".into(), runs)],
    }
}

/// The real load's claims, from the script's last output under `exp_dir`.
pub fn real_load(exp_dir: &Path) -> Vec<ClaimRow> {
    let stem = format!("{REAL_LOAD_DIR}/");
    let Some(run) = latest(&exp_dir.join(REAL_LOAD_DIR)) else {
        let none = vec![RunVerdict::NoResult("not run".into())];
        return vec![claim_row(
            "c2qos-fig6",
            &stem,
            "the real load's claims (§VI-A)",
            none,
        )];
    };
    checks(&run)
        .into_iter()
        .map(|c| {
            let v = match c.pass {
                true => RunVerdict::Met(vec![c.measured]),
                false => RunVerdict::Missed(vec![c.measured]),
            };
            claim_row(
                "c2qos-fig6",
                &stem,
                &format!("§VI-A: {}", c.expectation),
                vec![v],
            )
        })
        .collect()
}

/// Fig. 6(f)-(g)'s response-time claims: `runs[i]` holds, for lab run `i + 1`, the results of
/// the native, `tcm`, `c2qos` and `c2qos-hbs` files (or why there is none).
pub fn apps(runs: &[[Result<Value, String>; 4]]) -> Vec<ClaimRow> {
    let mut rows: Vec<ClaimRow> = Vec::new();
    for files in runs {
        let p50 = |i: usize| files[i].as_ref().ok().and_then(|r| file_apps(r).web_p50_us);
        for (k, (words, measured, ok)) in verdicts(p50(0), p50(1), p50(2), p50(3))
            .into_iter()
            .enumerate()
        {
            let v = match ok {
                Some(true) => RunVerdict::Met(vec![measured]),
                Some(false) => RunVerdict::Missed(vec![measured]),
                None => RunVerdict::NoResult("not run".into()),
            };
            if rows.len() <= k {
                let claim = format!("§VI-B, Fig. 6(g): {words}");
                rows.push(claim_row(
                    "c2qos-fig6fg",
                    "nginx under wrk",
                    &claim,
                    Vec::new(),
                ));
            }
            rows[k].cells[0].1.push(v);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_lab_run_of_the_four_files_judges_the_response_time_claims() {
        let web = |p50: f64| {
            let http =
                serde_json::json!({"errors": 0, "requests": 100, "percentiles_us": [[50.0, p50]]});
            serde_json::json!({"apps": [{"vm": "web1", "kind": "http", "http": http}]})
        };
        let ok = |p| -> Result<Value, String> { Ok(web(p)) };
        let runs = [
            [ok(100.0), ok(200.0), ok(150.0), ok(110.0)],
            [ok(100.0), ok(120.0), ok(115.0), ok(119.0)],
        ];
        let rows = apps(&runs);
        assert_eq!(rows.len(), 3);
        // Run 1: doubled, C2TB removes half, HBS 90 %; run 2: 1.2× only, C2TB 75 %, HBS 95 %.
        assert!(
            matches!(rows[0].cells[0].1[0], RunVerdict::Met(_)),
            "{:?}",
            rows[0]
        );
        assert!(
            matches!(rows[0].cells[0].1[1], RunVerdict::Missed(_)),
            "{:?}",
            rows[0]
        );
        assert!(
            matches!(rows[1].cells[0].1[0], RunVerdict::Met(_)),
            "{:?}",
            rows[1]
        );
        assert!(
            matches!(rows[2].cells[0].1[1], RunVerdict::Missed(_)),
            "{:?}",
            rows[2]
        );
        let missing: [Result<Value, String>; 4] = std::array::from_fn(|_| Err("not run".into()));
        let rows = apps(&[missing]);
        assert!(rows
            .iter()
            .all(|r| matches!(r.cells[0].1[0], RunVerdict::NoResult(_))));
    }

    #[test]
    fn a_real_load_that_did_not_run_is_one_row_without_a_result() {
        let rows = real_load(Path::new("/nonexistent-vqos-dir"));
        assert_eq!(rows.len(), 1);
        assert!(matches!(rows[0].cells[0].1[0], RunVerdict::NoResult(_)));
    }
}
