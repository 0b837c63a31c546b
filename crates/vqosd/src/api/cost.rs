//! The cost model: `GET /v1/cost-model`, `POST /v1/calibrate`, and the oversell check every
//! change passes.
//!
//! ## Behavior
//! - `GET /v1/cost-model` answers how purchases are priced in cycles (the model and where it
//!   comes from, the reference frame, the share of the core that may be sold, what the engine's
//!   guarantees need of it) and how many vif batches are sampled for calibration.
//! - `POST /v1/calibrate` fits `cycles(frame) = base_cycles + cycles_per_byte · bytes` to the
//!   sampled batches ([`vqos_sched::calibrate::fit`]). With `{"apply": true}` it installs the
//!   model in the running switch, re-pricing every purchase; a model under which the purchases
//!   oversell the core is refused (422) and nothing changes. The installed model lasts until
//!   vqosd restarts (a reload keeps it); to keep it, write it into `[cost_model]`.
//! - A fit refused for its samples (too few, one frame size) answers 409 with the reason.

use vqos_api::cost::{CalibrateRequest, CalibrationView, CostModelView};
use vqos_sched::calibrate;
use vqos_sched::{CostModel, PolicySet};

use super::{backend_fail, parse_json, Api, Fail, View};
use crate::http::Response;

impl Api {
    /// Refuses a set whose guarantees under this switch's engine oversell the core (422).
    pub(super) fn check_sold(&self, set: &PolicySet) -> Result<(), Fail> {
        set.check_sold(self.engine)
            .map_err(|e| (422, e.to_string()))
    }

    /// The pricing of `v` with `samples` sampled batches.
    pub(super) fn cost_model_view(&self, v: &View, samples: usize) -> CostModelView {
        let p = v.set.pricing;
        let source = match p.model {
            None => "capacity share",
            Some(m) if v.file.pricing.model == Some(m) => "config",
            Some(_) => "calibrated",
        };
        let sold = v.effective().sold(self.engine);
        CostModelView {
            cost: match v.set.cost {
                CostModel::Bytes => "bytes",
                CostModel::Cycles => "cycles",
            }
            .to_string(),
            source: source.to_string(),
            base_cycles: p.model.map(|m| m.base_cycles()),
            cycles_per_byte: p.model.map(|m| m.cycles_per_byte()),
            price_frame_bytes: p.frame_bytes,
            core_share: p.core_share,
            cycles_per_sec: v.set.cycles_per_sec,
            sold_per_sec: sold.map(|s| s.sold_per_sec),
            budget_per_sec: sold.map(|s| s.budget_per_sec),
            samples,
        }
    }

    /// `GET /v1/cost-model`.
    pub(super) fn get_cost_model(&self) -> Response {
        let samples = self.backend.cost_samples().len();
        Response::json(200, &self.cost_model_view(&self.snapshot(), samples))
    }

    /// `POST /v1/calibrate`.
    pub(super) fn calibrate(&self, body: &[u8]) -> Result<Response, Fail> {
        let req: CalibrateRequest = if body.iter().all(u8::is_ascii_whitespace) {
            CalibrateRequest::default()
        } else {
            parse_json(body)?
        };
        let samples = self.backend.cost_samples();
        let fit = calibrate::fit(&samples).map_err(|e| (409, e.to_string()))?;
        if req.apply {
            let mut v = self.lock();
            if v.set.cost != CostModel::Cycles {
                return Err((
                    409,
                    "The switch charges bytes (cost = \"bytes\"): a cycle cost model would price \
                     nothing; set cost = \"cycles\" in the config"
                        .to_string(),
                ));
            }
            let mut next = v.clone();
            next.set.pricing.model = Some(fit.model);
            next.set
                .validate()
                .map_err(|e| (422, e.to_string()))
                .and_then(|()| self.check_sold(&next.set))
                .map_err(|(s, e)| (s, format!("Calibrated model not applied: {e}")))?;
            if next.set != v.set {
                self.backend
                    .set_policies(&next.effective())
                    .map_err(backend_fail)?;
                self.commit(&mut v, next);
            }
            tracing::info!(
                "Cost model calibrated over {} batches and applied: {:.1} cycles per frame + \
                 {:.4} per byte",
                fit.samples,
                fit.model.base_cycles(),
                fit.model.cycles_per_byte()
            );
        }
        let cycles_unit = self
            .backend
            .stats()
            .loops
            .first()
            .map(|l| l.cycles_unit.clone())
            .unwrap_or_default();
        Ok(Response::json(
            200,
            &CalibrationView {
                base_cycles: fit.model.base_cycles(),
                cycles_per_byte: fit.model.cycles_per_byte(),
                batch_cycles: fit.batch_cycles,
                samples: fit.samples,
                outliers: fit.outliers,
                min_frame_bytes: fit.min_frame_bytes,
                max_frame_bytes: fit.max_frame_bytes,
                rms_relative_error: fit.rms_relative_error,
                cycles_unit,
                applied: req.apply,
                cost_model: self.cost_model_view(&self.snapshot(), samples.len()),
            },
        ))
    }
}
