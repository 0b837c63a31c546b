//! Calibration: the [`FrameCost`] of a running switch, fitted to the cycles its batches took.
//!
//! A batch of `frames` frames and `bytes` bytes costs `Σ (a + b·len_i) = a·frames + b·bytes`
//! cycles under the model, plus what the batch costs whatever it holds (polling, the engine's
//! decision, the flush): `cycles ≈ c + a·frames + b·bytes`, fitted by least squares over the
//! batches sampled.
//!
//! ## Behavior
//! - Batches without frames are ignored. At least [`MIN_SAMPLES`] batches with frames are
//!   needed, and their mean frame sizes must spread over at least [`MIN_SPREAD_BYTES`]: with
//!   one frame size, `frames` and `bytes` are proportional and `a` cannot be told from `b`.
//! - One pass of outlier rejection: a batch whose residual is above [`OUTLIER_FACTOR`] times
//!   the median absolute residual (plus one cycle) is left out and the fit redone (a batch the
//!   kernel preempted took milliseconds that were not forwarding work), as long as enough
//!   batches with spread remain.
//! - The per-batch cost `c` is reported (`batch_cycles`) and spread over a full batch of
//!   [`MAX_BURST`] frames in the model's `base_cycles` (`a + c/32`): a vif that uses its
//!   purchase is busy, and a busy vif's batches are full. When every batch had the same number
//!   of frames, `c` cannot be told from `a`, and the fit is `cycles ≈ a·frames + b·bytes`.
//! - Negative coefficients are not a cost: when the three-term solution has one, the fit
//!   without `c` is taken; when that one has one, the best fit with that coefficient at 0 (the
//!   non-negative least-squares solution of two unknowns).
//!
//! ## Limitations
//! - The fit is over whatever traffic the samples saw: a calibration under one flow per vif
//!   does not see classifier misses, one during a burst of TSO frames sees mostly `b`.

use serde::Serialize;
use thiserror::Error;

use crate::cost::{CostError, FrameCost};
use crate::engine::MAX_BURST;

/// Fewest batches with frames a fit accepts.
pub const MIN_SAMPLES: usize = 32;

/// Smallest spread of per-batch mean frame sizes a fit accepts, bytes.
pub const MIN_SPREAD_BYTES: u64 = 64;

/// A batch whose residual exceeds this many median absolute residuals is an outlier.
pub const OUTLIER_FACTOR: f64 = 10.0;

/// One served batch as the switch measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Sample {
    /// Frames read in the batch.
    pub frames: u32,
    /// Bytes of those frames.
    pub bytes: u64,
    /// Cycles the batch took (the switch's cycle counter).
    pub cycles: u64,
}

/// A fitted model and how well it fits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fit {
    /// The model (per-batch cost included in `base_cycles`, spread over a full batch).
    pub model: FrameCost,
    /// Cycles a batch costs whatever it holds (the fit's `c`), before it is spread.
    pub batch_cycles: f64,
    /// Batches the fit used.
    pub samples: usize,
    /// Batches left out as outliers.
    pub outliers: usize,
    /// Smallest mean frame size of a batch used, bytes.
    pub min_frame_bytes: u64,
    /// Largest mean frame size of a batch used, bytes.
    pub max_frame_bytes: u64,
    /// Root mean square of the relative error `(measured − model) / measured` over the batches
    /// used (0.05 = the model is typically within 5 % of a batch's cycles).
    pub rms_relative_error: f64,
}

/// Why no model could be fitted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CalibrateError {
    /// Not enough batches with frames.
    #[error(
        "Too few samples: {got} batches with frames, need at least {need} (send traffic \
         through the switch, then calibrate again)"
    )]
    TooFewSamples {
        /// Batches with frames.
        got: usize,
        /// [`MIN_SAMPLES`].
        need: usize,
    },
    /// Every batch had about the same mean frame size.
    #[error(
        "No spread of frame sizes: batches averaged {min_bytes} to {max_bytes} bytes per frame, \
         need a spread of at least {need} bytes (send small and large frames, e.g. iperf3 -u \
         -l 64 beside -l 1400)"
    )]
    NoSpread {
        /// Smallest mean frame size, bytes.
        min_bytes: u64,
        /// Largest mean frame size, bytes.
        max_bytes: u64,
        /// [`MIN_SPREAD_BYTES`].
        need: u64,
    },
    /// The cycles do not grow with frames or bytes (or the model is not valid).
    #[error("The samples do not determine a cost model")]
    Degenerate(#[source] Option<CostError>),
}

/// Fits `cycles ≈ a·frames + b·bytes` to `samples`; see the module docs.
pub fn fit(samples: &[Sample]) -> Result<Fit, CalibrateError> {
    let used: Vec<Sample> = samples.iter().copied().filter(|s| s.frames > 0).collect();
    let (first, k) = solve(&used)?;
    let resid: Vec<f64> = used.iter().map(|s| residual(&k, s).abs()).collect();
    let mut sorted = resid.clone();
    sorted.sort_by(f64::total_cmp);
    let limit = OUTLIER_FACTOR * sorted[sorted.len() / 2] + 1.0;
    let kept: Vec<Sample> = used
        .iter()
        .zip(&resid)
        .filter(|(_, r)| **r <= limit)
        .map(|(s, _)| *s)
        .collect();
    if kept.len() == used.len() {
        return Ok(first);
    }
    match solve(&kept) {
        Ok((f, _)) => Ok(Fit {
            outliers: used.len() - kept.len(),
            ..f
        }),
        // Without the outliers too little is left: the first fit stands.
        Err(_) => Ok(first),
    }
}

/// Fitted cycles per batch, per frame and per byte.
#[derive(Debug, Clone, Copy)]
struct Coef {
    batch: f64,
    frame: f64,
    byte: f64,
}

/// Measured minus modelled cycles of one batch.
fn residual(k: &Coef, s: &Sample) -> f64 {
    s.cycles as f64 - k.batch - k.frame * f64::from(s.frames) - k.byte * s.bytes as f64
}

/// The determinant of a symmetric 3×3 matrix.
fn det3(m: &[[f64; 3]; 3]) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

/// `cycles ≈ c + a·frames + b·bytes` by Cramer's rule on the normal equations, if the three
/// are identifiable and none is negative.
fn with_batch_term(used: &[Sample]) -> Option<Coef> {
    let mut m = [[0.0; 3]; 3];
    let mut r = [0.0; 3];
    for s in used {
        let x = [1.0, f64::from(s.frames), s.bytes as f64];
        for i in 0..3 {
            for j in 0..3 {
                m[i][j] += x[i] * x[j];
            }
            r[i] += x[i] * s.cycles as f64;
        }
    }
    let d = det3(&m);
    // Relative to the diagonal: near 0 when frames (or bytes) are (nearly) constant or
    // proportional, where the terms cannot be told apart.
    // A NaN determinant (sums overflowed to infinity) is refused too.
    if d.is_nan() || d <= 1e-9 * m[0][0] * m[1][1] * m[2][2] {
        return None;
    }
    let solve = |col: usize| {
        let mut mc = m;
        for (row, v) in mc.iter_mut().zip(r) {
            row[col] = v;
        }
        det3(&mc) / d
    };
    let k = Coef {
        batch: solve(0),
        frame: solve(1),
        byte: solve(2),
    };
    (k.batch >= 0.0 && k.frame >= 0.0 && k.byte >= 0.0).then_some(k)
}

/// `cycles ≈ a·frames + b·bytes`, a negative coefficient set to 0 and the other refitted.
fn without_batch_term(used: &[Sample]) -> Result<Coef, CalibrateError> {
    let (mut sff, mut sfb, mut sbb, mut sfc, mut sbc) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for s in used {
        let (f, b, c) = (f64::from(s.frames), s.bytes as f64, s.cycles as f64);
        sff += f * f;
        sfb += f * b;
        sbb += b * b;
        sfc += f * c;
        sbc += b * c;
    }
    let det = sff * sbb - sfb * sfb;
    // The spread check makes frames and bytes independent; a tiny determinant relative to its
    // terms would still mean they are nearly proportional.
    if det <= 1e-12 * sff * sbb {
        return Err(CalibrateError::Degenerate(None));
    }
    let mut a = (sfc * sbb - sbc * sfb) / det;
    let mut b = (sbc * sff - sfc * sfb) / det;
    if a < 0.0 {
        (a, b) = (0.0, sbc / sbb);
    } else if b < 0.0 {
        (a, b) = (sfc / sff, 0.0);
    }
    Ok(Coef {
        batch: 0.0,
        frame: a.max(0.0),
        byte: b.max(0.0),
    })
}

/// The least-squares fit over `used` (all with frames), checked for count and spread.
fn solve(used: &[Sample]) -> Result<(Fit, Coef), CalibrateError> {
    if used.len() < MIN_SAMPLES {
        return Err(CalibrateError::TooFewSamples {
            got: used.len(),
            need: MIN_SAMPLES,
        });
    }
    let mean = |s: &Sample| s.bytes / u64::from(s.frames);
    let min_bytes = used.iter().map(mean).min().unwrap_or(0);
    let max_bytes = used.iter().map(mean).max().unwrap_or(0);
    if max_bytes - min_bytes < MIN_SPREAD_BYTES {
        return Err(CalibrateError::NoSpread {
            min_bytes,
            max_bytes,
            need: MIN_SPREAD_BYTES,
        });
    }
    let k = match with_batch_term(used) {
        Some(k) => k,
        None => without_batch_term(used)?,
    };
    let model = FrameCost::new(k.frame + k.batch / f64::from(MAX_BURST), k.byte)
        .map_err(|e| CalibrateError::Degenerate(Some(e)))?;
    let sq: f64 = used
        .iter()
        .map(|s| {
            let r = residual(&k, s) / (s.cycles as f64).max(1.0);
            r * r
        })
        .sum();
    let fit = Fit {
        model,
        batch_cycles: k.batch,
        samples: used.len(),
        outliers: 0,
        min_frame_bytes: min_bytes,
        max_frame_bytes: max_bytes,
        rms_relative_error: (sq / used.len() as f64).sqrt(),
    };
    Ok((fit, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` batches of 1..=32 frames whose sizes run through 64..=1518 bytes (multiples of 4),
    /// costing exactly `a + b·len` cycles per frame (`b·len` integral for `b` in quarters).
    fn exact(n: usize, a: u64, b_quarters: u64) -> Vec<Sample> {
        (0..n)
            .map(|i| {
                let frames = (i % 32) as u32 + 1;
                let len = 64 + ((i as u64 * 97) % 1455) / 4 * 4;
                let bytes = u64::from(frames) * len;
                let cycles = a * u64::from(frames) + b_quarters * bytes / 4;
                Sample {
                    frames,
                    bytes,
                    cycles,
                }
            })
            .collect()
    }

    #[test]
    fn recovers_a_and_b_exactly() {
        let f = fit(&exact(200, 1300, 1)).unwrap();
        assert!((f.model.base_cycles() - 1300.0).abs() < 1e-6, "{f:?}");
        assert!((f.model.cycles_per_byte() - 0.25).abs() < 1e-9, "{f:?}");
        assert_eq!((f.samples, f.outliers), (200, 0));
        assert!(f.batch_cycles.abs() < 1e-3, "{f:?}");
        assert!(f.rms_relative_error < 1e-9);
        assert!(
            f.min_frame_bytes <= 70 && f.max_frame_bytes >= 1400,
            "{f:?}"
        );
    }

    #[test]
    fn a_per_batch_cost_is_recovered_and_spread_over_a_full_batch() {
        let samples: Vec<Sample> = exact(200, 1300, 1)
            .into_iter()
            .map(|s| Sample {
                cycles: s.cycles + 6_400,
                ..s
            })
            .collect();
        let f = fit(&samples).unwrap();
        assert!((f.batch_cycles - 6_400.0).abs() < 1e-3, "{f:?}");
        assert!((f.model.base_cycles() - 1_500.0).abs() < 1e-3, "{f:?}");
        assert!((f.model.cycles_per_byte() - 0.25).abs() < 1e-6, "{f:?}");
        assert!(f.rms_relative_error < 1e-6);
        // Full batches only: the batch term cannot be told from the frame term.
        let full: Vec<Sample> = samples
            .iter()
            .map(|s| Sample {
                frames: 32,
                bytes: s.bytes / u64::from(s.frames) * 32,
                cycles: 6_400 + 1300 * 32 + s.bytes / u64::from(s.frames) * 8,
            })
            .collect();
        let f = fit(&full).unwrap();
        assert_eq!(f.batch_cycles, 0.0);
        assert!((f.model.base_cycles() - 1_500.0).abs() < 1e-3, "{f:?}");
    }

    #[test]
    fn a_preempted_batch_is_left_out() {
        let mut samples = exact(100, 2000, 4);
        samples[17].cycles += 50_000_000;
        let f = fit(&samples).unwrap();
        assert_eq!(f.outliers, 1);
        assert!((f.model.base_cycles() - 2000.0).abs() < 1.0, "{f:?}");
        assert!((f.model.cycles_per_byte() - 1.0).abs() < 1e-3, "{f:?}");
    }

    #[test]
    fn too_few_samples_or_no_spread_is_refused_with_a_reason() {
        let few = exact(MIN_SAMPLES - 1, 1000, 4);
        assert_eq!(
            fit(&few).unwrap_err(),
            CalibrateError::TooFewSamples {
                got: MIN_SAMPLES - 1,
                need: MIN_SAMPLES
            }
        );
        // Empty batches do not count.
        let mut padded = few.clone();
        padded.extend([Sample::default(); 10]);
        assert!(matches!(
            fit(&padded),
            Err(CalibrateError::TooFewSamples { got, .. }) if got == MIN_SAMPLES - 1
        ));
        let same: Vec<Sample> = (1..=100u32)
            .map(|i| Sample {
                frames: i % 32 + 1,
                bytes: u64::from(i % 32 + 1) * 1514,
                cycles: u64::from(i % 32 + 1) * 2_500,
            })
            .collect();
        let e = fit(&same).unwrap_err();
        assert_eq!(
            e,
            CalibrateError::NoSpread {
                min_bytes: 1514,
                max_bytes: 1514,
                need: MIN_SPREAD_BYTES
            }
        );
        assert!(e.to_string().starts_with("No spread of frame sizes"));
    }

    #[test]
    fn negative_coefficients_are_clamped_to_the_best_non_negative_fit() {
        // Cycles that fall with size: b would be negative; the best fit with b = 0 remains.
        let samples: Vec<Sample> = (0..64u32)
            .map(|i| {
                let frames = i % 8 + 1;
                let len: u64 = if i % 2 == 0 { 64 } else { 1500 };
                let per = if len == 64 { 2_000 } else { 1_000 };
                Sample {
                    frames,
                    bytes: u64::from(frames) * len,
                    cycles: u64::from(frames) * per,
                }
            })
            .collect();
        let f = fit(&samples).unwrap();
        assert_eq!(f.model.cycles_per_byte(), 0.0);
        assert!(f.model.base_cycles() > 1_000.0 && f.model.base_cycles() < 2_000.0);
        // Cycles that never change: nothing to fit.
        let flat: Vec<Sample> = (0..64u32)
            .map(|i| Sample {
                frames: 1,
                bytes: if i % 2 == 0 { 64 } else { 1500 },
                cycles: 0,
            })
            .collect();
        assert!(matches!(fit(&flat), Err(CalibrateError::Degenerate(_))));
    }
}
