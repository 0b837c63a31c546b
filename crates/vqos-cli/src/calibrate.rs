//! `vqos calibrate`: fit the running switch's cost model `cycles(frame) = base_cycles +
//! cycles_per_byte · bytes` to the batches it measured, print it, optionally install it.

use std::io::Write;

use anyhow::Result;
use clap::Args;
use serde_json::json;
use vqos_api::client::Client;
use vqos_api::cost::{CalibrationView, CostModelView};

use crate::ctl::ConnArgs;

/// Arguments of `vqos calibrate`.
#[derive(Args, Debug)]
#[command(
    after_help = "Send traffic of several frame sizes through the switch first (e.g. iperf3 -u \
                  -l 64 beside -l 1400): with too few batches, or one frame size, the fit is \
                  refused (exit 4). --apply installs the model until vqosd restarts (a reload \
                  keeps it) and is refused if the purchases would then oversell the core; to \
                  keep it, copy the printed [cost_model] lines into vqosd's config.\n\n\
                  Examples:\n  vqos calibrate\n  vqos calibrate --apply\n  vqos calibrate \
                  --current --json"
)]
pub struct CalibrateArgs {
    /// Install the fitted model in the running switch (re-prices every purchase).
    #[arg(long, conflicts_with = "current")]
    apply: bool,
    /// Print the model in force instead of fitting one.
    #[arg(long)]
    current: bool,
    /// Print the daemon's JSON answer.
    #[arg(long)]
    json: bool,
}

/// Runs `vqos calibrate`.
pub fn run(conn: &ConnArgs, args: CalibrateArgs) -> Result<()> {
    calibrate_to(&conn.client()?, &args, &mut crate::out::stdout())
}

fn calibrate_to(c: &Client, args: &CalibrateArgs, out: &mut impl Write) -> Result<()> {
    if args.current {
        let m: CostModelView = c.call("GET", "/v1/cost-model", None)?;
        if args.json {
            writeln!(out, "{}", serde_json::to_string_pretty(&m)?)?;
        } else {
            writeln!(out, "{}", m.describe())?;
            writeln!(out, "{} batches sampled for calibration", m.samples)?;
        }
        return Ok(());
    }
    let body = json!({ "apply": args.apply });
    let f: CalibrationView = c.call("POST", "/v1/calibrate", Some(&body))?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&f)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "Fitted over {} batches ({} outliers left out), frames of {}..{} bytes, rms error {:.1} %:",
        f.samples,
        f.outliers,
        f.min_frame_bytes,
        f.max_frame_bytes,
        100.0 * f.rms_relative_error
    )?;
    writeln!(
        out,
        "  cycles(frame) = {:.1} + {:.4} x bytes  ({} cycles; {:.0} per batch, spread over 32 \
         frames, included)",
        f.base_cycles, f.cycles_per_byte, f.cycles_unit, f.batch_cycles
    )?;
    if f.applied {
        writeln!(
            out,
            "Applied until vqosd restarts. To keep it, in vqosd's config:"
        )?;
    } else {
        writeln!(out, "Not applied (--apply installs it). In vqosd's config:")?;
    }
    writeln!(
        out,
        "  [cost_model]\n  base_cycles = {:.1}\n  cycles_per_byte = {:.4}",
        f.base_cycles, f.cycles_per_byte
    )?;
    writeln!(out, "{}", f.cost_model.describe())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::sync::Arc;
    use vqos_sched::calibrate::Sample;
    use vqosd::api::Api;
    use vqosd::backend::MockBackend;
    use vqosd::config::Config;
    use vqosd::server::{Server, ServerConfig};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CalibrateArgs,
    }

    #[test]
    fn flags_parse_and_conflict() {
        let a = Cli::try_parse_from(["calibrate", "--apply", "--json"])
            .unwrap()
            .args;
        assert!(a.apply && a.json && !a.current);
        let e = Cli::try_parse_from(["calibrate", "--apply", "--current"])
            .err()
            .unwrap();
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn prints_the_fit_and_the_pricing_and_refusals_exit_4() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "capacity = \"10Gbit\"\nengine = \"c2qos\"\ncost = \"cycles\"\n\
             cycles_per_sec = 1540000000\nstate_file = \"{0}/state.json\"\n[api]\n\
             socket = \"{0}/s.sock\"\n[cost_model]\nbase_cycles = 1300.0\n\
             cycles_per_byte = 0.25\nprice_frame_bytes = 1518\n[[port]]\nname = \"vm1\"\n\
             policy = {{ max = \"4Gbit\" }}\n",
            dir.path().display()
        );
        let config = Config::parse(&text, |_| None).unwrap();
        let mock = Arc::new(MockBackend::new());
        let api = Arc::new(Api::start(&config, mock.clone()).unwrap());
        let _server = Server::start(&ServerConfig::from_config(&config), api).unwrap();
        let c = Client::new(vqos_api::client::Endpoint::Unix(config.socket_path));
        let run = |apply, current, json| {
            let mut out = Vec::new();
            let args = CalibrateArgs {
                apply,
                current,
                json,
            };
            calibrate_to(&c, &args, &mut out).map(|_| String::from_utf8(out).unwrap())
        };
        assert_eq!(
            run(false, true, false).unwrap(),
            "pricing (cycles): config model, 1300.0 + 0.2500 x bytes cycles per frame, priced \
             at 1518-byte frames; purchases need 0.553G of 1.540G cycles/s (36 %)\n0 batches sampled for \
             calibration\n"
        );
        let e = run(false, false, false).unwrap_err();
        assert_eq!(crate::exit::status(&e), crate::exit::REFUSED);
        assert!(e.to_string().starts_with("Too few samples"), "{e}");
        let samples: Vec<Sample> = (0..64u64)
            .map(|i| {
                let frames = (i % 32) as u32 + 1;
                let bytes = u64::from(frames) * if i % 2 == 0 { 64 } else { 1500 };
                Sample {
                    frames,
                    bytes,
                    cycles: 2000 * u64::from(frames) + bytes / 2,
                }
            })
            .collect();
        mock.set_cost_samples(samples);
        let text = run(true, false, false).unwrap();
        assert_eq!(
            text,
            "Fitted over 64 batches (0 outliers left out), frames of 64..1500 bytes, rms error \
             0.0 %:\n  cycles(frame) = 2000.0 + 0.5000 x bytes  (ns cycles; 0 per batch, spread over 32 \
             frames, included)\nApplied until \
             vqosd restarts. To keep it, in vqosd's config:\n  [cost_model]\n  base_cycles = \
             2000.0\n  cycles_per_byte = 0.5000\npricing (cycles): calibrated model, 2000.0 + \
             0.5000 x bytes cycles per frame, priced at 1518-byte frames; purchases need 0.909G of \
             1.540G cycles/s (59 %)\n"
        );
        let json: serde_json::Value =
            serde_json::from_str(&run(false, true, true).unwrap()).unwrap();
        assert_eq!(json["source"], "calibrated");
        assert_eq!(json["samples"], 64);
    }
}
