//! The engine's work on several snapshots at once, independent of the loaded trace: the
//! diff of two runs and a set of ranks (core's `diff` and `ranks`), decoded and replayed in
//! parallel ([`crate::engine::parallel::map_local`]: every core natively, in order in the web
//! worker). What crosses to the UI: core's own report types, and each diff run's curve
//! reduced to at most [`CURVE_POINTS`] points.

use allocsim_core::capacity::CapacityArg;
use allocsim_core::diff::{self, Align, DiffRun};
use allocsim_core::models::ModelSpec;
use allocsim_core::ranks::{self, RankFailure, RankOptions, RankRow, RanksReport};
use allocsim_core::session;
use allocsim_core::units::format_size;

use super::wire::{CURVE_POINTS, CurveData, DiffData, NamedBytes, RanksData, Request, Response};
use crate::engine::parallel;

/// A rank's what-if cell, as the CLI and the Ranks view show it: `fits, 1.50 GiB` or
/// `OOM, …` (the peak reserved under the setting tried).
#[must_use]
pub fn what_if_cell(row: &RankRow) -> String {
    let fits = if row.what_if.served_all {
        "fits"
    } else {
        "OOM"
    };
    format!("{fits}, {}", format_size(row.what_if.peak_reserved_bytes))
}

/// Whether `row` is `report`'s outlier.
#[must_use]
pub fn is_outlier(report: &RanksReport, row: &RankRow) -> bool {
    report
        .outlier
        .as_ref()
        .is_some_and(|o| o.rank == row.rank && o.file == row.file)
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
