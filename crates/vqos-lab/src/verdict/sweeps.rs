//! The verdicts of ANCS's sweeps (Fig. 8's CPU, Tables 1–2's latency), from the CSV files
//! `vqos lab paper ancs-fig8` / `ancs-table1-2` write ([`crate::paper`]). A sweep runs once, so
//! each claim has one run.
//!
//! The claims and their thresholds, from the paper (§4.4–4.5):
//! - Fig. 8: "the traffic controller demands nonnegligible computation resources" while ANCS
//!   "shows low CPU utilization": vqosd's CPU (with its softirq) at most HTB's at every number
//!   of VMs.
//! - Tables 1–2: the latency barely moves with the number of loading VMs (ping 0.24 → 0.34 ms
//!   from 1 to 5 VMs, 1.42×; Netperf 0.12 → 0.12 ms): vqos's p50 at 5 VMs at most 1.5× its
//!   p50 at 1 VM, for the UDP and the TCP probe.
//! - Tables 1–2: ANCS's latency is that of native Xen (the paper's largest ratio, 0.34 / 0.32
//!   ms, is 1.06): vqos's p50 at most 1.2× the bridge's at every number from 1 to 5. The paper
//!   gives means over 60 s; the sweep measures percentiles, so the p50 stands for them.

use std::collections::BTreeMap;

use super::{ClaimRow, RunVerdict};

/// `column name → value` rows of a CSV with a header line.
fn rows(csv: &str) -> Vec<BTreeMap<&str, &str>> {
    let mut lines = csv.lines();
    let Some(head) = lines.next() else {
        return Vec::new();
    };
    let names: Vec<&str> = head.split(',').collect();
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| names.iter().copied().zip(l.split(',')).collect())
        .collect()
}

fn num(r: &BTreeMap<&str, &str>, k: &str) -> Option<f64> {
    r.get(k).and_then(|v| v.parse().ok())
}

fn row(experiment: &str, stem: &str, id: &str, claim: &str, run: RunVerdict) -> ClaimRow {
    ClaimRow {
        experiment: experiment.into(),
        stem: stem.into(),
        id: id.into(),
        claim: claim.into(),
        cells: vec![("vqos".into(), vec![run])],
    }
}

/// A run's verdict from `(what, met)` findings: met when every one is, else the misses.
fn judge(found: Vec<(String, bool)>, empty: &str) -> RunVerdict {
    if found.is_empty() {
        return RunVerdict::NoResult(empty.into());
    }
    let missed: Vec<String> = (found.iter())
        .filter(|(_, ok)| !ok)
        .map(|(w, _)| w.clone())
        .collect();
    match missed.is_empty() {
        true => RunVerdict::Met(vec![found
            .iter()
            .map(|(w, _)| w.as_str())
            .collect::<Vec<_>>()
            .join(", ")]),
        false => RunVerdict::Missed(missed),
    }
}

/// ANCS Fig. 8's claim from `cpu.csv` (`None`: the sweep did not run).
pub fn fig8(csv: Option<&str>) -> ClaimRow {
    let claim = "§4.4, Fig. 8: the traffic controller needs non-negligible CPU, ANCS little: \
                 vqosd's CPU at most HTB's at every number of VMs (1..8, MTU frames)";
    let run = match csv {
        None => RunVerdict::NoResult("not run".into()),
        Some(csv) => {
            let rs = rows(csv);
            let cpu = |n: &str, b: &str| {
                (rs.iter())
                    .find(|r| r.get("vms") == Some(&n) && r.get("baseline") == Some(&b))
                    .and_then(|r| num(r, "switch_cpu_percent"))
            };
            let mut ns: Vec<&str> = rs.iter().filter_map(|r| r.get("vms").copied()).collect();
            ns.dedup();
            let found = (ns.iter())
                .filter_map(|n| Some((n, cpu(n, "vqos")?, cpu(n, "htb")?)))
                .map(|(n, v, h)| (format!("{n} VMs {v:.0} against {h:.0} %"), v <= h))
                .collect();
            judge(found, "no vqos and htb rows")
        }
    };
    row("ancs-fig8", "cpu.csv", "cpu", claim, run)
}

/// ANCS Tables 1–2's two claims from `latency.csv` (`None`: the sweep did not run).
pub fn tables(csv: Option<&str>) -> Vec<ClaimRow> {
    let flat = "§4.5, Tables 1–2: latency barely grows with the loading VMs (ping 0.24 → 0.34 ms \
                from 1 to 5 VMs, Netperf 0.12 → 0.12 ms): vqos's p50 at 5 VMs at most 1.5× \
                at 1 VM, UDP and TCP";
    let native = "§4.5, Tables 1–2: ANCS's latency is native Xen's (largest ratio 0.34 / 0.32 \
                  ms = 1.06): vqos's p50 at most 1.2× the bridge's at 1..5 VMs, UDP and TCP";
    let Some(csv) = csv else {
        let none = || RunVerdict::NoResult("not run".into());
        return vec![
            row("ancs-table1-2", "latency.csv", "flat", flat, none()),
            row("ancs-table1-2", "latency.csv", "native", native, none()),
        ];
    };
    let rs = rows(csv);
    let p50 = |n: u32, b: &str, proto: &str| {
        let n = n.to_string();
        (rs.iter())
            .find(|r| {
                r.get("vms") == Some(&n.as_str())
                    && r.get("baseline") == Some(&b)
                    && r.get("protocol") == Some(&proto)
            })
            .and_then(|r| num(r, "p50_us"))
    };
    let mut grows = Vec::new();
    let mut near = Vec::new();
    for proto in ["udp", "tcp"] {
        if let (Some(a), Some(b)) = (p50(1, "vqos", proto), p50(5, "vqos", proto)) {
            let r = b / a.max(1.0);
            grows.push((format!("{proto} {a:.0} → {b:.0} µs, {r:.2}×"), r <= 1.5));
        }
        for n in 1..=5 {
            if let (Some(v), Some(x)) = (p50(n, "vqos", proto), p50(n, "bridge", proto)) {
                let r = v / x.max(1.0);
                near.push((
                    format!("{proto} {n} VMs {v:.0} against {x:.0} µs, {r:.2}×"),
                    r <= 1.2,
                ));
            }
        }
    }
    vec![
        row(
            "ancs-table1-2",
            "latency.csv",
            "flat",
            flat,
            judge(grows, "no vqos rows at 1 and 5 VMs"),
        ),
        row(
            "ancs-table1-2",
            "latency.csv",
            "native",
            native,
            judge(near, "no vqos and bridge rows"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: &str =
        "vms,baseline,switch_cpu_percent,vqosd_percent,softirq_percent,aggregate_mbps\n\
                       1,bridge,87.00,0.00,87.00,935.4\n1,htb,88.27,0.00,88.27,938.9\n\
                       1,vqos,69.50,69.38,0.12,941.0\n2,htb,140.98,0.00,140.98,940.1\n\
                       2,vqos,75.42,74.68,0.74,941.1\n";

    #[test]
    fn fig8_is_met_when_vqosd_is_at_most_htb_at_every_size() {
        let r = fig8(Some(CPU));
        assert_eq!(
            r.cells[0].1,
            vec![RunVerdict::Met(vec![
                "1 VMs 70 against 88 %, 2 VMs 75 against 141 %".into()
            ])]
        );
        let r = fig8(Some(&CPU.replace("2,vqos,75.42", "2,vqos,150.0")));
        assert_eq!(
            r.cells[0].1,
            vec![RunVerdict::Missed(vec!["2 VMs 150 against 141 %".into()])]
        );
        assert!(matches!(&fig8(None).cells[0].1[0], RunVerdict::NoResult(w) if w == "not run"));
        let head = CPU.lines().next().unwrap();
        assert!(matches!(
            &fig8(Some(head)).cells[0].1[0],
            RunVerdict::NoResult(_)
        ));
    }

    #[test]
    fn the_latency_tables_check_growth_and_the_bridge() {
        let mut csv = String::from(
            "vms,baseline,protocol,samples,lost,p50_us,p99_us,p999_us,aggregate_mbps\n",
        );
        for n in 1..=5 {
            for (b, udp, tcp) in [("vqos", 100 + 10 * n, 90), ("bridge", 100, 100)] {
                csv.push_str(&format!(
                    "{n},{b},udp,10,0,{udp},1,1,1\n{n},{b},tcp,10,0,{tcp},1,1,1\n"
                ));
            }
        }
        let t = tables(Some(&csv));
        // UDP 110 → 150 µs (1.36×), TCP flat: the growth claim is met.
        assert!(
            matches!(&t[0].cells[0].1[0], RunVerdict::Met(m) if m[0].contains("udp 110 → 150 µs, 1.36×"))
        );
        // UDP at 3, 4 and 5 VMs (130, 140, 150 against 100 µs) is above 1.2× the bridge's.
        let RunVerdict::Missed(m) = &t[1].cells[0].1[0] else {
            panic!("{:?}", t[1]);
        };
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(m[0].starts_with("udp 3 VMs 130 against 100 µs"), "{m:?}");
        assert!(tables(None)
            .iter()
            .all(|r| matches!(r.cells[0].1[0], RunVerdict::NoResult(_))));
    }
}
