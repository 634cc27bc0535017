//! The engine's work on several snapshots at once, independent of the loaded trace: the
//! diff of two runs and a set of ranks (core's `diff` and `ranks`), decoded and replayed in
//! parallel ([`crate::parallel::map_local`]: every core natively, in order in the web
//! worker). What crosses to the UI: core's own report types, and each diff run's curve
//! reduced to at most [`CURVE_POINTS`] points.

use allocsim_core::capacity::CapacityArg;
use allocsim_core::diff::{self, Align, Diff, DiffRun};
use allocsim_core::models::ModelSpec;
use allocsim_core::ranks::{self, RankFailure, RankOptions, RankRow, RanksReport};
use allocsim_core::session;
use serde::{Deserialize, Serialize};

use super::wire::{NamedBytes, Request, Response};
use crate::parallel;

/// At most this many points of a run's curve cross to the UI.
pub const CURVE_POINTS: usize = 2048;

/// A run's curve on the common axis, reduced: each point the maximum of its bucket of ops
/// (a peak is never lost), at the bucket's first position.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CurveData {
    pub x: Vec<f64>,
    pub reserved_bytes: Vec<u64>,
    pub allocated_bytes: Vec<u64>,
}

/// The answer to [`Request::Diff`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DiffData {
    pub diff: Diff,
    /// A's and B's curves.
    pub curves: [CurveData; 2],
}

/// The answer to [`Request::Ranks`]: the ranks that could be read, together, and those
/// that could not (the app shows the others and marks these).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RanksData {
    pub report: Option<RanksReport>,
    pub failed: Vec<RankFailure>,
    /// Why the readable ranks do not make one set (different devices), if so.
    pub error: Option<String>,
}

/// Runs a [`Request::Diff`] or [`Request::Ranks`]; any other request is ignored.
pub fn handle(req: Request, emit: &mut dyn FnMut(Response)) {
    match req {
        Request::Diff {
            job,
            files,
            align,
            config_b,
        } => {
            let [a, b] = *files;
            emit(Response::Progress {
                job,
                stage: format!("diff of {} and {}", a.name, b.name),
                fraction: 0.1,
            });
            emit(match diff_of(&a, &b, align, config_b) {
                Ok(data) => Response::Diffed {
                    job,
                    data: Box::new(data),
                },
                Err(message) => Response::Failed { job, message },
            });
        }
        Request::Ranks {
            job,
            files,
            what_if,
        } => {
            emit(Response::Progress {
                job,
                stage: format!("replaying {} ranks", files.len()),
                fraction: 0.1,
            });
            let data = ranks_of(&files, what_if);
            emit(Response::Ranked {
                job,
                data: Box::new(data),
            });
        }
        _ => {}
    }
}

/// Decodes and measures both runs, in parallel.
pub fn diff_of(
    before: &NamedBytes,
    after: &NamedBytes,
    align: Align,
    config_b: Option<String>,
) -> Result<DiffData, String> {
    let sides = [(before, None), (after, config_b)];
    let runs = parallel::map_local(2, &|i| -> Result<DiffRun, String> {
        let (file, config) = &sides[i];
        let loaded = session::load(&file.bytes, None).map_err(|e| format!("{}: {e}", file.name))?;
        let device = loaded.trace.busiest_device();
        let capacity = session::capacity(&loaded.trace, device, CapacityArg::AsRecorded);
        let spec = ModelSpec {
            kind: allocsim_core::models::AllocatorKind::Pytorch,
            config: config.clone(),
        };
        diff::run(
            &file.name,
            &loaded.trace,
            device,
            &spec,
            capacity.bytes,
            align,
        )
        .map_err(|e| format!("{}: {e}", file.name))
    });
    let mut it = runs.into_iter();
    let (Some(ra), Some(rb)) = (it.next(), it.next()) else {
        return Err("a run did not come back".into());
    };
    let (ra, rb) = (ra?, rb?);
    let curves = [reduce(&ra.curve), reduce(&rb.curve)];
    Ok(DiffData {
        diff: diff::diff(ra, rb, align),
        curves,
    })
}

/// Every rank in parallel; the unreadable ones apart.
#[must_use]
pub fn ranks_of(files: &[NamedBytes], what_if: String) -> RanksData {
    let names: Vec<String> = files.iter().map(|f| f.name.clone()).collect();
    let rank_of = ranks::assign_ranks(&names);
    let opts = RankOptions {
        what_if,
        ..RankOptions::default()
    };
    let results = parallel::map_local(files.len(), &|i| {
        ranks::rank(&files[i].name, rank_of[i], &files[i].bytes, &opts)
    });
    let mut rows: Vec<RankRow> = Vec::new();
    let mut failed = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(row) => rows.push(row),
            Err(e) => failed.push(RankFailure {
                file: files[i].name.clone(),
                rank: rank_of[i],
                error: e.to_string(),
            }),
        }
    }
    if rows.is_empty() {
        return RanksData {
            report: None,
            failed,
            error: None,
        };
    }
    match ranks::summarize(rows, &opts) {
        Ok(report) => RanksData {
            report: Some(report),
            failed,
            error: None,
        },
        Err(e) => RanksData {
            report: None,
            failed,
            error: Some(e.to_string()),
        },
    }
}

/// A curve reduced to at most [`CURVE_POINTS`] points.
#[must_use]
pub fn reduce(c: &diff::Curve) -> CurveData {
    let n = c.x.len();
    let per = n.div_ceil(CURVE_POINTS).max(1);
    let mut out = CurveData::default();
    for start in (0..n).step_by(per) {
        let end = (start + per).min(n);
        out.x.push(c.x[start]);
        out.reserved_bytes.push(
            c.reserved_bytes[start..end]
                .iter()
                .copied()
                .max()
                .unwrap_or(0),
        );
        out.allocated_bytes.push(
            c.allocated_bytes[start..end]
                .iter()
                .copied()
                .max()
                .unwrap_or(0),
        );
    }
    out
}
