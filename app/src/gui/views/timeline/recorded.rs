//! What the file records, drawn as soon as it is decoded (issue 17): its reserved and live
//! requested bytes over its trace entries, while the trace is built and replayed. Once the
//! trace is built the same lines are drawn over the ops ([`recorded_shapes`] from the
//! metric lines) until a replay arrives.

use egui::{Align2, FontId, Sense, Shape, Stroke, pos2};

use super::{CacheKey, LAYER_LINES, Mode, TimelineState, XMap, axes, envelope_points_in};
use crate::gui::render;
use crate::gui::state::RecordedView;
use crate::gui::theme;

/// The recorded reserved (thick) and live requested (thin) bytes of `r`;
/// `samples_in(a, b)` is the range of `r`'s samples drawn between x `a` and `b`.
pub(super) fn recorded_shapes(
    r: &RecordedView,
    xm: &XMap,
    samples_in: &dyn Fn(f64, f64) -> (usize, usize),
    to_y: &dyn Fn(f32) -> f32,
) -> Vec<Shape> {
    vec![
        Shape::line(
            envelope_points_in(xm, &r.requested.curve(), samples_in, to_y),
            Stroke::new(1.0, theme::RECORDED.gamma_multiply(0.7)),
        ),
        Shape::line(
            envelope_points_in(xm, &r.reserved.curve(), samples_in, to_y),
            Stroke::new(2.0, theme::RECORDED),
        ),
    ]
}

/// The timeline of a file whose trace is being built: its recorded lines over its trace
/// entries, the cursor on the last (the end state the memory map shows).
pub fn recorded_timeline_ui(
    ui: &mut egui::Ui,
    st: &mut TimelineState,
    r: &RecordedView,
    wgpu: bool,
) {
    let (outer, _, painter) =
        crate::gui::views::plot_area(ui, Sense::hover(), wgpu, render::LAYER_FILLS + 1);
    let Some(plot) = super::plot_rect(st, outer, 0.0) else {
        return;
    };
    let n = r.len();
    let xm = XMap {
        rect: plot,
        lo: 0.0,
        hi: n.max(1) as f64,
    };
    let ymax = axes::y_max(r.peak_reserved_bytes as f64);
    axes::grid(
        &painter,
        plot,
        outer.bottom() - 19.0,
        ymax,
        &xm,
        &|x| format!("{}", x.max(0.0) as u64),
        "event",
    );
    let key = CacheKey {
        mode: Mode::Metrics,
        rect: outer,
        pixels_per_point: ui.ctx().pixels_per_point(),
        view: (xm.lo, xm.hi),
        axis: st.axis,
        ymax,
        flags: (true, false, false),
        // Keyed by the recorded data: a document's lines are keyed by its replays.
        replays: vec![usize::MAX, std::ptr::from_ref(r) as usize],
    };
    if st.cache.as_ref().is_none_or(|(k, ..)| *k != key) {
        let to_y = |bytes: f32| {
            plot.bottom() - (f64::from(bytes) / ymax * f64::from(plot.height())) as f32
        };
        let entries_in = |a: f64, b: f64| {
            let lo = a.max(0.0).floor() as usize;
            let hi = (b.ceil() as usize).max(lo + 1);
            (lo.min(n), hi.min(n))
        };
        let shapes = recorded_shapes(r, &xm, &entries_in, &to_y);
        let (shape, mesh) = super::tessellated(ui.ctx(), shapes);
        st.cache = Some((key, shape, mesh));
    }
    if let Some((_, shape, mesh)) = &st.cache {
        render::paint_mesh(&painter, outer, wgpu, LAYER_LINES, mesh, shape);
    }
    // The cursor: the end state, after the last entry.
    let cx = xm.to_screen(n.saturating_sub(1) as f64);
    painter.line_segment(
        [pos2(cx, plot.top()), pos2(cx, plot.bottom())],
        Stroke::new(1.5, theme::CURSOR),
    );
    painter.text(
        pos2(plot.left() + 6.0, plot.top() + 4.0),
        Align2::LEFT_TOP,
        format!(
            "recorded in the file: reserved (thick), live requested (thin) over {n} events; replaying…"
        ),
        FontId::proportional(11.0),
        theme::AXIS_TEXT,
    );
}
