//! Conservation in the stacked view at every level of detail. A level of detail draws the
//! largest band pieces only (a prefix of
//! [`Bands::pieces`](crate::engine::wire::Bands::pieces)); what it leaves out is never
//! lost: under the pieces, each pixel column is filled from 0 to the highest stack of
//! live requested bytes over the ops drawn in that column (the *folded* band, as
//! `memory_viz` folds its small allocations into a summary band). So the drawn stack of a
//! column is its peak at every zoom, and a left-out piece shows as the folded colour,
//! which the hover explains (how many allocations, how many bytes).

use crate::engine::wire::{BandPiece, OpsTable, TraceData};
use crate::gui::envelope::Envelope;
use crate::gui::render::Quad;

/// One pixel column of the plot: its x range (ops, or seconds on the time axis) and the
/// ops drawn in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Column {
    pub x0: f64,
    pub x1: f64,
    pub ops: (usize, usize),
}

/// The pieces a view draws: those of at least a third of a pixel in area (ops × bytes),
/// among the `built` first of `trace`'s. `ops_in_view` ops span `plot_w` points, `ymax`
/// bytes span `plot_h` points, at `ppp` pixels per point.
#[must_use]
pub fn drawn_prefix(
    trace: &TraceData,
    built: usize,
    ops_in_view: usize,
    plot_w: f32,
    plot_h: f32,
    ymax: f64,
    ppp: f32,
) -> usize {
    let ops_per_pt = ops_in_view.max(1) as f64 / f64::from(plot_w.max(1.0));
    let bytes_per_pt = ymax / f64::from(plot_h.max(1.0));
    let min_area = 0.33 / f64::from(ppp * ppp) * ops_per_pt * bytes_per_pt;
    trace
        .bands
        .pieces
        .partition_point(|p| crate::engine::bands::area(p, &trace.ops) >= min_area)
        .min(built)
}

/// The folded band of a view: per column, a quad from 0 to the highest stack over its
/// ops, y in MiB, x in the view's axis units less `origin` (both `rect` and `alt_x`):
/// relative to the view, f32 keeps a column apart at any zoom (absolute seconds in f32
/// step by 4 µs at a minute). Neighbouring columns of one height share a quad.
#[must_use]
pub fn folded_quads(
    top: &Envelope,
    columns: &[Column],
    origin: f64,
    color: egui::Color32,
) -> Vec<Quad> {
    let mut quads: Vec<Quad> = Vec::new();
    let mut last_x1 = f64::NAN;
    for c in columns {
        let Some((_, h)) = top.range(c.ops.0, c.ops.1) else {
            continue;
        };
        if h <= 0.0 {
            continue;
        }
        let (x0, x1) = ((c.x0 - origin) as f32, (c.x1 - origin) as f32);
        if let Some(last) = quads.last_mut()
            && last.rect[3].to_bits() == h.to_bits()
            && last_x1.to_bits() == c.x0.to_bits()
        {
            last.rect[2] = x1;
            last.alt_x[1] = x1;
        } else {
            let mut q = Quad::new(x0, 0.0, x1, h, color);
            q.alt_x = [x0, x1];
            quads.push(q);
        }
        last_x1 = c.x1;
    }
    quads
}

/// The highest point drawn in each column (MiB) by `folded` (x less `origin`) and the
/// first `drawn` band quads (`use_alt_x`: the bands' x is their `alt_x`, the time axis), the way a GPU
/// rasterizes them: a quad paints a column when it covers the column's centre (a piece
/// narrower than a column may cover none, which is why the folded band exists).
#[must_use]
pub fn drawn_tops(
    folded: &[Quad],
    origin: f64,
    bands: &[Quad],
    use_alt_x: bool,
    columns: &[Column],
) -> Vec<f32> {
    let mut tops = vec![0f32; columns.len()];
    let centres: Vec<f64> = columns.iter().map(|c| 0.5 * (c.x0 + c.x1)).collect();
    let mut paint = |x0: f64, x1: f64, y: f32| {
        let (x0, x1) = (x0.min(x1), x0.max(x1));
        let first = centres.partition_point(|&c| c < x0);
        for (top, _) in tops[first..]
            .iter_mut()
            .zip(&centres[first..])
            .take_while(|&(_, &c)| c < x1)
        {
            *top = top.max(y);
        }
    };
    for q in folded {
        paint(
            f64::from(q.rect[0]) + origin,
            f64::from(q.rect[2]) + origin,
            q.rect[3].max(q.rect[1]),
        );
    }
    for q in bands {
        let (a, b) = if use_alt_x {
            (q.alt_x[0], q.alt_x[1])
        } else {
            (q.rect[0], q.rect[2])
        };
        paint(f64::from(a), f64::from(b), q.rect[3].max(q.rect[1]));
    }
    tops
}

/// What the folded band holds at op `k`: the live allocations that no piece among
/// `drawn` covers there, as (count, requested bytes).
#[must_use]
pub fn folded_at(ops: &OpsTable, drawn: &[BandPiece], k: u32) -> (usize, u64) {
    let ku = k as usize;
    let (mut count, mut bytes) = (0usize, 0u64);
    for a in 0..=ku.min(ops.len().saturating_sub(1)) {
        let size = ops.size_bytes(a);
        if size > 0 && ops.live_after(a, ku) {
            count += 1;
            bytes += size;
        }
    }
    for p in drawn.iter().filter(|p| p.x0 <= k && k < p.x1) {
        count = count.saturating_sub(1);
        bytes = bytes.saturating_sub(p.height_bytes(ops));
    }
    (count, bytes)
}

/// The `n` pixel columns of the visible range of `st` over `doc`.
#[must_use]
pub fn columns(
    st: &super::TimelineState,
    doc: &crate::gui::state::Document,
    n: usize,
) -> Vec<Column> {
    let (lo, hi) = st.visible(doc);
    let w = (hi - lo) / n.max(1) as f64;
    (0..n)
        .map(|i| {
            let x0 = lo + w * i as f64;
            let x1 = if i + 1 == n { hi } else { x0 + w };
            Column {
                x0,
                x1,
                ops: st.ops_in(doc, x0, x1),
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "stack_lod_tests.rs"]
mod tests;
