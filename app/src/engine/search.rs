//! The engine's searches, apart from the state they run on: "What would fit?"
//! (`recommend`'s sweep of PyTorch's settings), the other runtimes, an explanation at an
//! event, and the smallest capacity of a configuration.

use std::sync::atomic::AtomicBool;

use allocsim_core::explain::{self, ExplainOptions, Explanation};
use allocsim_core::models::{Layout, MODEL_NAMES, ModelSpec};
use allocsim_core::prefix;
use allocsim_core::trace::Trace;
use allocsim_core::whatif::{self, Recommendation, Swept, SweptReplay};

use super::parallel::{self, Cancellable};
use super::wire::{Response, WhatIfData, WhatIfRow};

/// An explanation's cache key: the configuration, the capacity and the event.
pub type ExplainKey = (String, Option<u64>, u64);

/// The answer to [`Request::WhatIf`]: `recommend`'s sweep of PyTorch's settings under
/// `capacity`, on every core natively, stopped between replays once `cancel` is set.
pub(super) fn what_if(
    trace: Option<&Trace>,
    device: usize,
    job: u64,
    capacity: Option<u64>,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(Response),
) -> Result<WhatIfData, String> {
    let trace = trace.ok_or("no trace is loaded")?;
    let local = parallel::local();
    let runner = Cancellable {
        inner: local.as_ref(),
        cancel,
    };
    let rec = whatif::recommend_with(trace, device, capacity, &runner, &mut |done, total| {
        emit(Response::Progress {
            job,
            stage: format!("what would fit: {done} of {total} settings replayed"),
            fraction: done as f32 / total.max(1) as f32,
        });
    })
    .map_err(|e| e.to_string())?;
    Ok(what_if_data(capacity, &rec))
}

/// "What would fit?"'s answer from `recommend`'s: the snapshot's own settings, then the
/// trade-off table (the best first), from replays run here or on the browser's search
/// workers.
pub fn what_if_data<R: Swept>(capacity: Option<u64>, rec: &Recommendation<R>) -> WhatIfData {
    let pytorch_spec = |r: &SweptReplay| {
        if r.config.is_empty() {
            "pytorch".to_string()
        } else {
            format!("pytorch@{}", r.config)
        }
    };
    let recorded = rec.default.swept();
    WhatIfData {
        capacity_bytes: capacity,
        recorded: Some(row(pytorch_spec(&recorded), &recorded, false)),
        tradeoffs: rec
            .tradeoffs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let r = r.swept();
                row(pytorch_spec(&r), &r, i == 0 && r.served_all())
            })
            .collect(),
        candidates_tried: rec.candidates_tried as u32,
        candidates_replayed: rec.candidates_replayed as u32,
        candidates_fitting: rec.candidates_fitting as u32,
    }
}

/// The answer to [`Request::SweepSizes`]: what a sweep of device `device` needs of it.
pub(super) fn sweep_sizes(trace: Option<&Trace>, device: usize, job: u64) -> Response {
    let sizes = trace
        .ok_or_else(|| "no trace is loaded".to_string())
        .and_then(|t| whatif::sweep_sizes(t, device).map_err(|e| e.to_string()));
    match sizes {
        Ok(sizes) => Response::SweepSizes { job, sizes },
        Err(message) => Response::Failed { job, message },
    }
}

/// The replays of a [`Request::SweepReplays`] (`indices` of the batch, through `specs`),
/// sharing their prefixes ([`prefix::replay_sharing`]), each emitted as the sweep keeps it
/// as it ends (in no set order).
pub(super) fn sweep_replays(
    trace: Option<&Trace>,
    device: usize,
    job: u64,
    (indices, specs): (&[u32], &[ModelSpec]),
    capacity: Option<u64>,
    emit: &mut dyn FnMut(Response),
) {
    let Some(trace) = trace else {
        emit(Response::Failed {
            job,
            message: "no trace is loaded".into(),
        });
        return;
    };
    let mut failed = false;
    let shared = prefix::replay_sharing(
        trace,
        device,
        specs,
        capacity,
        whatif::summary_options(),
        &mut |i, _, r| match r {
            Ok(r) if !failed => emit(Response::SweepReplayed {
                job,
                index: indices[i],
                result: SweptReplay::from(&r),
            }),
            Ok(_) => {}
            Err(e) => {
                if !failed {
                    emit(Response::Failed {
                        job,
                        message: e.to_string(),
                    });
                }
                failed = true;
            }
        },
    );
    if let Err(e) = shared
        && !failed
    {
        emit(Response::Failed {
            job,
            message: e.to_string(),
        });
    }
}

/// The answer to [`Request::Runtimes`]: every model but PyTorch's under `capacity`.
pub(super) fn runtimes(
    trace: Option<&Trace>,
    device: usize,
    job: u64,
    capacity: Option<u64>,
    emit: &mut dyn FnMut(Response),
) -> Result<Vec<WhatIfRow>, String> {
    let trace = trace.ok_or("no trace is loaded")?;
    let labels: Vec<&str> = MODEL_NAMES
        .iter()
        .copied()
        .filter(|m| *m != "pytorch")
        .collect();
    let specs: Vec<ModelSpec> = labels
        .iter()
        .map(|l| ModelSpec::parse(l))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let local = parallel::local();
    let results = whatif::compare_with(
        trace,
        device,
        &specs,
        capacity,
        local.as_ref(),
        &mut |done, total| {
            emit(Response::Progress {
                job,
                stage: format!("other runtimes: {done} of {total}"),
                fraction: done as f32 / total.max(1) as f32,
            });
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(labels
        .into_iter()
        .zip(&results)
        .map(|(spec, r)| row(spec.to_string(), &SweptReplay::from(r), false))
        .collect())
}

/// Explains the request at event `at_event` (an OOM's: that OOM) of device `device` under
/// `(spec, capacity, at_event)`: the op explained and the explanation, without its layout.
pub(super) fn explain_at(
    trace: Option<&Trace>,
    device: usize,
    (spec, capacity, at_event): &ExplainKey,
) -> Result<(u32, Explanation), String> {
    let trace = trace.ok_or("no trace is loaded")?;
    let parsed = ModelSpec::parse(spec).map_err(|e| e.to_string())?;
    // The app shows the trace's bounds from its own `Bounds` (asked once every
    // configuration and the sweep are done): the offline placement is not computed here
    // too, ahead of the layouts the engine's worker answers.
    let opts = ExplainOptions {
        at_event: Some(*at_event),
        what_if: false,
        without_bounds: true,
    };
    let mut e = explain::explain(
        trace,
        device,
        &parsed,
        *capacity,
        opts,
        &whatif::InOrder,
        &mut |_, _| {},
    )
    .map_err(|e| format!("explain {spec}: {e}"))?;
    e.layout = Layout::default();
    Ok((e.op_index as u32, e))
}

/// The answer to [`Request::MinCapacity`].
pub(super) fn min_capacity_response(
    trace: Option<&Trace>,
    device: usize,
    job: u64,
    slot: u32,
    spec: &str,
    emit: &mut dyn FnMut(Response),
) -> Response {
    match min_capacity_of(trace, device, job, spec, emit) {
        Ok(bytes) => Response::MinCapacity { job, slot, bytes },
        Err(message) => Response::Failed { job, message },
    }
}

/// The smallest capacity on which `spec` runs device `device` of `trace`, with progress.
fn min_capacity_of(
    trace: Option<&Trace>,
    device: usize,
    job: u64,
    spec: &str,
    emit: &mut dyn FnMut(Response),
) -> Result<u64, String> {
    let trace = trace.ok_or("no trace is loaded")?;
    let parsed = ModelSpec::parse(spec).map_err(|e| e.to_string())?;
    let m = whatif::min_capacity(trace, device, &parsed, &mut |done, total| {
        emit(Response::Progress {
            job,
            stage: format!("min capacity of {spec}"),
            fraction: done as f32 / total.max(1) as f32,
        });
    })
    .map_err(|e| e.to_string())?;
    Ok(m.min_capacity_bytes)
}

fn row(spec: String, r: &SweptReplay, recommended: bool) -> WhatIfRow {
    WhatIfRow {
        spec,
        recommended,
        fits: r.served_all(),
        peak_reserved_bytes: r.peak_reserved_bytes,
        oom_event: r.oom.map(|(event, _)| event),
        segment_ops: r.segment_ops,
        synchronizing_ops: r.synchronizing_ops,
        driver_time_us: r.driver_time_us,
        error: String::new(),
    }
}
