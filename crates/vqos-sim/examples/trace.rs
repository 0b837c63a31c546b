//! Prints a scenario's per-second rates and controller trace (a debugging aid).
fn main() {
    let path = std::env::args().nth(1).expect("usage: trace FILE.toml");
    let text = std::fs::read_to_string(&path).expect("read");
    let sc = vqos_sim::Scenario::parse(&text).expect("parse");
    let out = vqos_sim::simulate(&sc, 1).expect("run");
    let per_s = (1_000_000_000 / vqos_sim::BIN_NS) as usize;
    let secs = out.bins[0].len() / per_s;
    for s in 0..secs {
        let rates: Vec<String> = out
            .bins
            .iter()
            .map(|b| {
                format!(
                    "{:7.1}",
                    b[s * per_s..(s + 1) * per_s].iter().sum::<u64>() as f64 * 8.0 / 1e6
                )
            })
            .collect();
        let ctrl = out
            .control_trace
            .get(s * per_s)
            .map(|c| format!("{c:?}"))
            .unwrap_or_default();
        println!("{s:4}s {}  ctrl {ctrl}", rates.join(" "));
    }
}
