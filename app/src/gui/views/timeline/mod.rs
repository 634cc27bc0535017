//! The timeline: reserved / allocated / largest free block and fragmentation of every
//! compared configuration over the events (or wall time), with OOM markers and the memory
//! cap; or every live allocation stacked as a band. Click or drag moves the cursor; the
//! wheel zooms, shift+wheel or a right-drag pans, a double-click shows everything.

mod axes;
pub mod recorded;
pub mod stack_lod;

pub use axes::format_seconds;

use egui::{Align2, Color32, FontId, Pos2, Rect, Sense, Shape, Stroke, pos2};

use crate::engine::wire::NO_ENTRY;
use crate::gui::envelope::Curve;
use crate::gui::render::{self, Transform};
use crate::gui::state::{Document, MIB};
use crate::gui::theme;
use allocsim_core::units::format_size;

/// What the timeline draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Metric lines per configuration.
    Metrics,
    /// Every live allocation stacked as a band.
    Bands,
}

/// The x axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Events,
    Time,
}

/// An extra curve over ops, drawn over the metric lines (the live CUDA replay's).
#[derive(Debug, Clone, PartialEq)]
pub struct Overlay {
    pub label: String,
    pub color: Color32,
    pub dashed: bool,
    /// (op, bytes), ops ascending.
    pub points: Vec<(u32, u64)>,
}

/// The timeline's view state.
#[derive(Debug, Clone)]
pub struct TimelineState {
    pub mode: Mode,
    pub axis: Axis,
    /// Visible x range (ops, or seconds); `None`: everything.
    pub view: Option<(f64, f64)>,
    pub show_allocated: bool,
    pub show_largest_free: bool,
    pub show_fragmentation: bool,
    /// Band pieces drawn last frame (level of detail), for the status line.
    pub bands_drawn: usize,
    /// Where the plot was drawn last frame (tests click into it).
    pub last_plot: Option<Rect>,
    /// Extra curves drawn in metric mode.
    pub overlays: Vec<Overlay>,
    /// The reference lines drawn last frame: (label, bytes) (tests read them).
    pub last_references: Vec<(String, u64)>,
    /// The lines of the last view (metric lines, or the reserved lines over the bands),
    /// tessellated once: scrubbing only moves the cursor, and re-tessellating thousands of
    /// anti-aliased line points every frame was most of a frame's CPU time
    /// (`benches/frame.rs`). Kept as an egui shape and, for the wgpu pipeline, as a mesh
    /// uploaded once (egui would upload and shade it anew every frame).
    cache: Option<(CacheKey, Shape, render::MeshSet)>,
    /// The folded band of the last stacked view (per pixel column, the highest stack:
    /// [`stack_lod`]) and the view and column count it was built for.
    folded: Option<((CacheKey, usize), render::QuadSet)>,
}

impl Default for TimelineState {
    fn default() -> Self {
        TimelineState {
            mode: Mode::Metrics,
            axis: Axis::Events,
            view: None,
            show_allocated: true,
            show_largest_free: true,
            show_fragmentation: true,
            bands_drawn: 0,
            last_plot: None,
            overlays: Vec::new(),
            last_references: Vec::new(),
            cache: None,
            folded: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct CacheKey {
    mode: Mode,
    rect: Rect,
    pixels_per_point: f32,
    view: (f64, f64),
    axis: Axis,
    ymax: f64,
    flags: (bool, bool, bool),
    replays: Vec<usize>,
}

/// What the user did in the timeline this frame.
#[derive(Debug, Default, Clone, Copy)]
pub struct TimelineInput {
    /// The cursor moved to this op.
    pub cursor: Option<u32>,
    /// The band under the mouse was clicked: its alloc op.
    pub picked_alloc: Option<u32>,
}

/// Maps x (ops or seconds) to screen points and back.
#[derive(Debug, Clone, Copy)]
pub struct XMap {
    pub rect: Rect,
    pub lo: f64,
    pub hi: f64,
}

impl XMap {
    #[must_use]
    pub fn to_screen(&self, x: f64) -> f32 {
        self.rect.left()
            + ((x - self.lo) / (self.hi - self.lo).max(1e-12) * f64::from(self.rect.width())) as f32
    }

    #[must_use]
    pub fn from_screen(&self, px: f32) -> f64 {
        self.lo
            + f64::from(px - self.rect.left()) / f64::from(self.rect.width().max(1.0))
                * (self.hi - self.lo)
    }
}

impl TimelineState {
    /// The full x range of `doc` on the current axis.
    #[must_use]
    pub fn full_range(&self, doc: &Document) -> (f64, f64) {
        let n = doc.trace.ops.len().max(1) as f64;
        match self.axis {
            Axis::Time if !doc.seconds().is_empty() => {
                let last = doc.seconds().last().unwrap_or(0.0);
                (0.0, last.max(1e-6) * 1.0001)
            }
            _ => (0.0, n),
        }
    }

    /// The visible range, clamped to the trace.
    #[must_use]
    pub fn visible(&self, doc: &Document) -> (f64, f64) {
        let full = self.full_range(doc);
        match self.view {
            Some((a, b)) if b > a => (a.max(full.0), b.min(full.1)),
            _ => full,
        }
    }

    /// x of op `op` on the current axis (its start).
    #[must_use]
    pub fn x_of_op(&self, doc: &Document, op: u32) -> f64 {
        match self.axis {
            Axis::Time if !doc.seconds().is_empty() => {
                doc.seconds().get(op as usize).unwrap_or(0.0)
            }
            _ => f64::from(op),
        }
    }

    /// The op drawn at x.
    #[must_use]
    pub fn op_at_x(&self, doc: &Document, x: f64) -> u32 {
        let n = doc.trace.ops.len();
        if n == 0 {
            return 0;
        }
        let k = match self.axis {
            Axis::Time if !doc.seconds().is_empty() => {
                doc.seconds().partition_point(|t| t <= x).saturating_sub(1)
            }
            _ => x.max(0.0).floor() as usize,
        };
        k.min(n - 1) as u32
    }

    /// Ops `lo..hi` drawn in the x range `a..b`.
    #[must_use]
    pub fn ops_in(&self, doc: &Document, a: f64, b: f64) -> (usize, usize) {
        let n = doc.trace.ops.len();
        match self.axis {
            Axis::Time if !doc.seconds().is_empty() => {
                let lo = doc.seconds().partition_point(|t| t <= a).saturating_sub(1);
                let hi = doc.seconds().partition_point(|t| t < b).max(lo + 1);
                (lo, hi.min(n))
            }
            _ => {
                let lo = a.max(0.0).floor() as usize;
                let hi = (b.ceil() as usize).max(lo + 1);
                (lo.min(n), hi.min(n))
            }
        }
    }

    /// Zooms by `factor` (< 1 zooms in) around x.
    pub fn zoom(&mut self, doc: &Document, around: f64, factor: f64) {
        let (a, b) = self.visible(doc);
        let full = self.full_range(doc);
        let min_width = match self.axis {
            Axis::Events => 8.0,
            Axis::Time => (full.1 - full.0) * 1e-7,
        };
        let w = ((b - a) * factor).clamp(min_width, full.1 - full.0);
        let t = ((around - a) / (b - a).max(1e-12)).clamp(0.0, 1.0);
        let mut na = around - t * w;
        na = na.clamp(full.0, (full.1 - w).max(full.0));
        self.view = Some((na, na + w));
    }

    /// Pans by `dx` in x units.
    pub fn pan(&mut self, doc: &Document, dx: f64) {
        let (a, b) = self.visible(doc);
        let full = self.full_range(doc);
        let w = b - a;
        let na = (a + dx).clamp(full.0, (full.1 - w).max(full.0));
        self.view = Some((na, na + w));
    }

    /// Makes op `op` visible (keeping the zoom).
    pub fn reveal(&mut self, doc: &Document, op: u32) {
        let x = self.x_of_op(doc, op);
        let (a, b) = self.visible(doc);
        if x < a || x > b {
            self.pan(doc, x - f64::midpoint(a, b));
        }
    }
}

/// The timeline, filling the space given.
pub fn timeline_ui(
    ui: &mut egui::Ui,
    st: &mut TimelineState,
    doc: &Document,
    cursor: u32,
    wgpu: bool,
    bands_highlight: &render::QuadSet,
) -> TimelineInput {
    let mut input = TimelineInput::default();
    let (outer, response, painter) =
        crate::gui::views::plot_area(ui, Sense::click_and_drag(), wgpu, render::LAYER_FILLS + 1);
    let frag_h = if st.show_fragmentation && st.mode == Mode::Metrics {
        (outer.height() * 0.18).clamp(28.0, 70.0)
    } else {
        0.0
    };
    let Some(plot) = plot_rect(st, outer, frag_h) else {
        return input;
    };
    let frag_rect = Rect::from_min_max(
        pos2(plot.left(), plot.bottom() + 12.0),
        pos2(plot.right(), outer.bottom() - 22.0),
    );
    let (lo, hi) = st.visible(doc);
    let xm = XMap { rect: plot, lo, hi };

    // y range: the largest reserved of any configuration and the memory cap.
    let mut ymax = 0f64;
    for s in &doc.slots {
        if let Some(r) = &s.replay {
            ymax = ymax.max(r.data.summary.peak_reserved_bytes as f64);
        }
        if let Some(c) = s.capacity_bytes {
            ymax = ymax.max(c as f64);
        }
    }
    if let Some(b) = &doc.bounds {
        ymax = ymax.max(b.live_peak_bytes.max(b.offline_peak_bytes) as f64);
    }
    if let Some(r) = &doc.recorded {
        ymax = ymax.max(r.peak_reserved_bytes as f64);
    }
    if st.mode == Mode::Bands {
        ymax = ymax.max(doc.trace.bands.peak_bytes as f64);
    } else {
        for o in &st.overlays {
            ymax = o.points.iter().fold(ymax, |m, p| m.max(p.1 as f64));
        }
    }
    let ymax = axes::y_max(ymax);
    let to_y = |bytes: f64| plot.bottom() - (bytes / ymax * f64::from(plot.height())) as f32;

    let timed = st.axis == Axis::Time && !doc.seconds().is_empty();
    axes::grid(
        &painter,
        plot,
        outer.bottom() - 19.0,
        ymax,
        &xm,
        &|x| x_label(doc, timed, x),
        if timed { "time" } else { "event" },
    );

    let key = CacheKey {
        mode: st.mode,
        rect: outer,
        pixels_per_point: ui.ctx().pixels_per_point(),
        view: (lo, hi),
        axis: st.axis,
        ymax,
        flags: (
            st.show_allocated,
            st.show_largest_free,
            st.show_fragmentation,
        ),
        replays: doc
            .slots
            .iter()
            .map(|s| {
                s.replay
                    .as_ref()
                    .map_or(0, |r| std::ptr::from_ref(r) as usize)
            })
            .collect(),
    };
    if st.cache.as_ref().is_none_or(|(k, ..)| *k != key) {
        let shapes = match st.mode {
            Mode::Metrics => metric_shapes(st, doc, &xm, ymax, frag_rect),
            Mode::Bands => reserved_shapes(st, doc, &xm, ymax),
        };
        let (shape, mesh) = tessellated(ui.ctx(), shapes);
        st.cache = Some((key.clone(), shape, mesh));
    }

    match st.mode {
        Mode::Metrics => {
            if let Some((_, shape, mesh)) = &st.cache {
                render::paint_mesh(&painter, outer, wgpu, LAYER_LINES, mesh, shape);
            }
            for o in &st.overlays {
                painter.extend(overlay_shapes(st, doc, &xm, o, &to_y));
            }
            if st.show_fragmentation && frag_rect.height() > 4.0 {
                painter.text(
                    pos2(frag_rect.left() - 40.0, frag_rect.center().y),
                    Align2::RIGHT_CENTER,
                    "frag.",
                    FontId::proportional(11.0),
                    theme::AXIS_TEXT,
                );
                painter.text(
                    pos2(frag_rect.left() - 6.0, frag_rect.top()),
                    Align2::RIGHT_TOP,
                    "100%",
                    FontId::proportional(11.0),
                    theme::AXIS_TEXT,
                );
                painter.text(
                    pos2(frag_rect.left() - 6.0, frag_rect.bottom()),
                    Align2::RIGHT_BOTTOM,
                    "0%",
                    FontId::proportional(11.0),
                    theme::AXIS_TEXT,
                );
            }
        }
        Mode::Bands => {
            let ppp = ui.ctx().pixels_per_point();
            let sx = f64::from(plot.width()) / (hi - lo).max(1e-12);
            let (olo, ohi) = st.ops_in(doc, lo, hi);
            // Pieces smaller than a third of a pixel are left to the folded band; quads are
            // built largest first over a few frames: draw those built so far.
            let drawn = stack_lod::drawn_prefix(
                &doc.trace,
                doc.bands.len(),
                ohi - olo,
                plot.width(),
                plot.height(),
                ymax,
                ppp,
            );
            st.bands_drawn = drawn;
            let columns_px = (plot.width() * ppp).ceil().max(1.0) as usize;
            let folded_key = (key.clone(), columns_px);
            if st.folded.as_ref().is_none_or(|(k, _)| *k != folded_key) {
                let columns = stack_lod::columns(st, doc, columns_px);
                let quads = stack_lod::folded_quads(doc.stack_top(), &columns, lo, theme::FOLDED);
                st.folded = Some((folded_key, render::QuadSet::new(quads)));
            }
            let t = Transform {
                origin: [lo as f32, (ymax / MIB) as f32],
                scale: [
                    (sx * f64::from(ppp)) as f32,
                    -(f64::from(plot.height()) / (ymax / MIB) * f64::from(ppp)) as f32,
                ],
                viewport: [plot.width() * ppp, plot.height() * ppp],
                min_px: [0.0, 0.0],
                gap_px: 0.0,
                use_alt_x: if st.axis == Axis::Time && !doc.seconds().is_empty() {
                    1.0
                } else {
                    0.0
                },
                linear_target: 0.0,
                pad: 0.0,
            };
            let clip = ui.painter_at(plot);
            if let Some((_, folded)) = &st.folded {
                // x relative to the view (`stack_lod::folded_quads`).
                let mut tf = t;
                tf.origin[0] = 0.0;
                tf.use_alt_x = 0.0;
                render::paint_quads_with(
                    &clip,
                    plot,
                    wgpu,
                    LAYER_BANDS_FOLDED,
                    folded,
                    0..folded.len() as u32,
                    tf,
                    true,
                );
            }
            // Cached: scrubbing only moves the cursor over the same bands.
            render::paint_quads_with(
                &clip,
                plot,
                wgpu,
                LAYER_BANDS,
                &doc.bands,
                0..drawn as u32,
                t,
                true,
            );
            if !bands_highlight.is_empty() {
                let mut th = t;
                th.min_px = [1.0, 1.0];
                render::paint_quads_with(
                    &clip,
                    plot,
                    wgpu,
                    LAYER_BANDS_HIGHLIGHT,
                    bands_highlight,
                    0..bands_highlight.len() as u32,
                    th,
                    true,
                );
            }
            // The reserved line of each configuration over the bands.
            if let Some((_, shape, mesh)) = &st.cache {
                render::paint_mesh(&clip, plot, wgpu, LAYER_LINES, mesh, shape);
            }
        }
    }

    st.last_references = axes::reference_lines(&painter, plot, doc, &to_y);

    // Memory caps and OOM markers.
    for (i, s) in doc.slots.iter().enumerate() {
        if let Some(c) = s.capacity_bytes {
            let y = to_y(c as f64);
            painter.line_segment(
                [pos2(plot.left(), y), pos2(plot.right(), y)],
                Stroke::new(1.0, theme::CAPACITY.gamma_multiply(0.7)),
            );
            if i == 0 {
                painter.text(
                    pos2(plot.right() - 4.0, y - 2.0),
                    Align2::RIGHT_BOTTOM,
                    format!("cap {}", format_size(c)),
                    FontId::proportional(11.0),
                    theme::CAPACITY,
                );
            }
        }
        let ooms = s
            .replay
            .as_ref()
            .map_or(&[][..], |r| &r.data.summary.ooms[..]);
        for oom in ooms {
            let x = xm.to_screen(st.x_of_op(doc, oom.op_index));
            if (plot.left()..=plot.right()).contains(&x) {
                painter.line_segment(
                    [pos2(x, plot.top()), pos2(x, plot.bottom())],
                    Stroke::new(1.5, theme::OOM),
                );
                let tri = vec![
                    pos2(x, plot.top() + 10.0 + 12.0 * i as f32),
                    pos2(x - 6.0, plot.top() + 12.0 * i as f32),
                    pos2(x + 6.0, plot.top() + 12.0 * i as f32),
                ];
                painter.add(Shape::convex_polygon(
                    tri,
                    theme::slot(i),
                    Stroke::new(1.0, theme::OOM),
                ));
                painter.text(
                    pos2(x + 8.0, plot.top() + 12.0 * i as f32),
                    Align2::LEFT_TOP,
                    "OOM",
                    FontId::proportional(11.0),
                    theme::OOM,
                );
            }
        }
    }

    // The cursor.
    let cx = xm.to_screen(st.x_of_op(doc, cursor));
    if (plot.left()..=plot.right()).contains(&cx) {
        painter.line_segment(
            [
                pos2(cx, plot.top()),
                pos2(cx, frag_rect.bottom().max(plot.bottom())),
            ],
            Stroke::new(1.5, theme::CURSOR),
        );
    }

    // Interaction.
    if let Some(p) = response.interact_pointer_pos()
        && (response.clicked_by(egui::PointerButton::Primary)
            || response.dragged_by(egui::PointerButton::Primary))
        && !response.double_clicked()
    {
        let px = p.x.clamp(plot.left(), plot.right());
        input.cursor = Some(st.op_at_x(doc, xm.from_screen(px)));
    }
    if response.double_clicked() {
        st.view = None;
    }
    if response.dragged_by(egui::PointerButton::Secondary)
        || response.dragged_by(egui::PointerButton::Middle)
    {
        let dx = response.drag_delta().x;
        st.pan(doc, -f64::from(dx) / f64::from(plot.width()) * (hi - lo));
    }
    if let Some(hover) = response.hover_pos() {
        let (scroll, zoom) = ui.input(|i| (i.smooth_scroll_delta, i.zoom_delta()));
        let around = xm.from_screen(hover.x.clamp(plot.left(), plot.right()));
        let shift = ui.input(|i| i.modifiers.shift);
        if (zoom - 1.0).abs() > f32::EPSILON {
            st.zoom(doc, around, 1.0 / f64::from(zoom));
        } else if shift && scroll.y != 0.0 {
            st.pan(
                doc,
                -f64::from(scroll.y) / f64::from(plot.width()) * (hi - lo),
            );
        } else if scroll.y != 0.0 {
            st.zoom(doc, around, (-f64::from(scroll.y) * 0.003).exp());
        }
        if scroll.x != 0.0 {
            st.pan(
                doc,
                -f64::from(scroll.x) / f64::from(plot.width()) * (hi - lo),
            );
        }
        if plot.contains(hover) || frag_rect.contains(hover) {
            let op = st.op_at_x(doc, xm.from_screen(hover.x));
            let picked = hover_tooltip(ui, st, doc, op, hover, plot, ymax, response.id);
            if response.clicked() && ui.input(|i| i.modifiers.alt) {
                input.picked_alloc = picked;
            }
            if st.mode == Mode::Bands && response.secondary_clicked() {
                input.picked_alloc = picked;
            }
        }
    }
    input
}

/// Layer ids of the timeline's GPU views.
const LAYER_BANDS: u64 = 1;
const LAYER_BANDS_HIGHLIGHT: u64 = 2;
const LAYER_LINES: u64 = 3;
const LAYER_BANDS_FOLDED: u64 = 4;

/// The reserved line of each configuration, drawn over the bands.
fn reserved_shapes(st: &TimelineState, doc: &Document, xm: &XMap, ymax: f64) -> Vec<Shape> {
    let plot = xm.rect;
    let to_y =
        |bytes: f32| plot.bottom() - (f64::from(bytes) / ymax * f64::from(plot.height())) as f32;
    doc.slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let r = s.replay.as_ref()?;
            let pts = envelope_points(st, doc, xm, &r.reserved(), &to_y);
            Some(Shape::line(pts, Stroke::new(1.5, theme::slot(i))))
        })
        .collect()
}

fn metric_shapes(
    st: &TimelineState,
    doc: &Document,
    xm: &XMap,
    ymax: f64,
    frag_rect: Rect,
) -> Vec<Shape> {
    let plot = xm.rect;
    let to_y =
        |bytes: f32| plot.bottom() - (f64::from(bytes) / ymax * f64::from(plot.height())) as f32;
    let mut shapes = Vec::new();
    // Until a replay arrives: what the file records.
    if let Some(r) = &doc.recorded
        && doc.slots.iter().all(|s| s.replay.is_none())
    {
        let ops_in = |a, b| st.ops_in(doc, a, b);
        shapes.extend(recorded::recorded_shapes(r, xm, &ops_in, &to_y));
    }
    for (i, s) in doc.slots.iter().enumerate() {
        let Some(r) = &s.replay else { continue };
        let c = theme::slot(i);
        if st.show_largest_free {
            shapes.push(Shape::line(
                envelope_points(st, doc, xm, &r.largest_free(), &to_y),
                Stroke::new(1.0, c.gamma_multiply(0.45)),
            ));
        }
        if st.show_allocated {
            shapes.push(Shape::line(
                envelope_points(st, doc, xm, &r.allocated(), &to_y),
                Stroke::new(1.0, c.gamma_multiply(0.8)),
            ));
        }
        shapes.push(Shape::line(
            envelope_points(st, doc, xm, &r.reserved(), &to_y),
            Stroke::new(2.0, c),
        ));
        if st.show_fragmentation && frag_rect.height() > 4.0 {
            let fy = |f: f32| frag_rect.bottom() - f.clamp(0.0, 1.0) * frag_rect.height();
            let fxm = XMap {
                rect: Rect::from_x_y_ranges(plot.x_range(), frag_rect.y_range()),
                ..*xm
            };
            shapes.push(Shape::line(
                envelope_points(st, doc, &fxm, &r.fragmentation(), &fy),
                Stroke::new(1.0, c),
            ));
        }
    }
    if st.show_fragmentation && frag_rect.height() > 4.0 {
        shapes.push(Shape::rect_stroke(
            frag_rect,
            0.0,
            Stroke::new(1.0, theme::GRID),
            egui::StrokeKind::Inside,
        ));
    }
    shapes
}

/// `shapes` (lines and outlines, no text or circles) as one mesh, tessellated as egui
/// would tessellate them at this scale: as an egui shape and as the GPU's mesh.
fn tessellated(ctx: &egui::Context, shapes: Vec<Shape>) -> (Shape, render::MeshSet) {
    let options = ctx.tessellation_options(|o| *o);
    // Lines need neither the font atlas nor the prepared discs.
    let mut tess =
        egui::epaint::Tessellator::new(ctx.pixels_per_point(), options, [1, 1], Vec::new());
    let mut mesh = egui::epaint::Mesh::default();
    for shape in shapes {
        tess.tessellate_shape(shape, &mut mesh);
    }
    let set = render::MeshSet::from_egui(&mesh);
    (Shape::mesh(mesh), set)
}

/// An overlay's polyline over the visible range (with one point either side, so the line
/// reaches the edges), as steps: a value holds until the next point.
fn overlay_shapes(
    st: &TimelineState,
    doc: &Document,
    xm: &XMap,
    o: &Overlay,
    to_y: &dyn Fn(f64) -> f32,
) -> Vec<Shape> {
    let first = o
        .points
        .partition_point(|p| st.x_of_op(doc, p.0) < xm.lo)
        .saturating_sub(1);
    let last = o
        .points
        .partition_point(|p| st.x_of_op(doc, p.0) <= xm.hi)
        .min(o.points.len().saturating_sub(1));
    let mut pts: Vec<Pos2> = Vec::new();
    let clamp = |x: f32| x.clamp(xm.rect.left(), xm.rect.right());
    for &(op, bytes) in o.points.get(first..=last).unwrap_or(&[]) {
        let x = clamp(xm.to_screen(st.x_of_op(doc, op)));
        let y = to_y(bytes as f64);
        if let Some(prev) = pts.last().copied() {
            pts.push(pos2(x, prev.y));
        }
        pts.push(pos2(x, y));
    }
    if pts.len() < 2 {
        return Vec::new();
    }
    let stroke = Stroke::new(1.5, o.color);
    if o.dashed {
        Shape::dashed_line(&pts, stroke, 6.0, 4.0)
    } else {
        vec![Shape::line(pts, stroke)]
    }
}

/// The envelope of `env` (one value per op) over the visible range, one min/max pair per
/// point column.
fn envelope_points(
    st: &TimelineState,
    doc: &Document,
    xm: &XMap,
    env: &Curve<'_>,
    to_y: &dyn Fn(f32) -> f32,
) -> Vec<Pos2> {
    envelope_points_in(xm, env, &|a, b| st.ops_in(doc, a, b), to_y)
}

/// The envelope of `env` over the visible range, one min/max pair per point column;
/// `samples_in(a, b)` is the range of samples drawn between x `a` and `b`.
#[allow(clippy::many_single_char_names)]
fn envelope_points_in(
    xm: &XMap,
    env: &Curve<'_>,
    samples_in: &dyn Fn(f64, f64) -> (usize, usize),
    to_y: &dyn Fn(f32) -> f32,
) -> Vec<Pos2> {
    let w = xm.rect.width().max(1.0) as usize;
    let mut pts = Vec::with_capacity(2 * w + 2);
    let n = env.len();
    if n == 0 {
        return pts;
    }
    for col in 0..w {
        let a = xm.lo + (xm.hi - xm.lo) * col as f64 / w as f64;
        let b = xm.lo + (xm.hi - xm.lo) * (col + 1) as f64 / w as f64;
        let (lo, hi) = samples_in(a, b);
        if lo >= n {
            break;
        }
        let Some((mn, mx)) = env.range(lo, hi) else {
            continue;
        };
        let x = xm.rect.left() + col as f32 + 0.5;
        if (mx - mn).abs() < f32::EPSILON {
            pts.push(pos2(x, to_y(mx)));
        } else {
            pts.push(pos2(x, to_y(mx)));
            pts.push(pos2(x, to_y(mn)));
        }
    }
    pts
}

/// The plot inside the timeline's area `outer`, `below` points kept under it (the
/// fragmentation strip); `None` when too small to draw. Kept for tests in `st`.
fn plot_rect(st: &mut TimelineState, outer: Rect, below: f32) -> Option<Rect> {
    let plot = Rect::from_min_max(
        pos2(outer.left() + 78.0, outer.top() + 8.0),
        pos2(outer.right() - 10.0, outer.bottom() - 22.0 - below),
    );
    if plot.width() < 20.0 || plot.height() < 20.0 {
        return None;
    }
    st.last_plot = Some(plot);
    Some(plot)
}

/// The label of x on the events axis (the op's trace entry) or the time axis.
fn x_label(doc: &Document, timed: bool, x: f64) -> String {
    if timed {
        return format_seconds(x);
    }
    let ops = &doc.trace.ops;
    if ops.is_empty() {
        return format!("{x}");
    }
    match ops.event_index((x as usize).min(ops.len() - 1)) {
        NO_ENTRY => "start".into(),
        e => format!("{e}"),
    }
}

/// Tooltip for the sample under the mouse; returns the band's alloc op in band mode.
#[allow(clippy::too_many_arguments)]
fn hover_tooltip(
    ui: &egui::Ui,
    st: &TimelineState,
    doc: &Document,
    op: u32,
    hover: Pos2,
    plot: Rect,
    ymax: f64,
    widget: egui::Id,
) -> Option<u32> {
    let mut picked = None;
    let mut lines: Vec<(String, Color32)> = Vec::new();
    let ev = doc.trace.ops.event_name(op as usize);
    lines.push((format!("{ev} (op {op})"), theme::AXIS_TEXT));
    if st.mode == Mode::Bands && plot.contains(hover) {
        let bytes = (f64::from(plot.bottom() - hover.y) / f64::from(plot.height()) * ymax) as u64;
        let x = op;
        let drawn = &doc.trace.bands.pieces[..st.bands_drawn.min(doc.trace.bands.pieces.len())];
        let hit = drawn.iter().find(|p| {
            p.x0 <= x
                && x < p.x1
                && p.y0_bytes() <= bytes
                && bytes < p.y0_bytes() + p.height_bytes(&doc.trace.ops)
        });
        let top = doc
            .stack_top()
            .get(op as usize)
            .map_or(0.0, |t| f64::from(t) * MIB);
        if hit.is_none() && (bytes as f64) < top {
            let (count, folded) = stack_lod::folded_at(&doc.trace.ops, drawn, op);
            lines.push((
                format!(
                    "folded: {count} allocations, {} requested, too small to draw apart at this zoom",
                    format_size(folded)
                ),
                Color32::WHITE,
            ));
            lines.push((
                format!("{} live in all", format_size(top as u64)),
                theme::AXIS_TEXT,
            ));
        }
        if let Some(p) = hit {
            picked = Some(p.alloc);
            let ops = &doc.trace.ops;
            let a = p.alloc as usize;
            lines.push((
                format!("{} requested", format_size(p.height_bytes(ops))),
                Color32::WHITE,
            ));
            lines.push((format!("allocated {}", ops.at_event(a)), theme::AXIS_TEXT));
            if let Some(&f) = ops.link.get(a)
                && f != crate::engine::wire::NO_OP
            {
                lines.push((
                    format!("freed {}", ops.at_event(f as usize)),
                    theme::AXIS_TEXT,
                ));
            }
            for f in doc
                .trace
                .stacks
                .format(ops.stack.get(a).copied().unwrap_or(0))
                .into_iter()
                .take(12)
            {
                lines.push((f, theme::AXIS_TEXT));
            }
        }
    } else {
        for (i, s) in doc.slots.iter().enumerate() {
            let Some(r) = &s.replay else { continue };
            let k = op as usize;
            if k >= r.len() {
                lines.push((format!("{}: stopped (OOM)", s.spec), theme::slot(i)));
                continue;
            }
            let Some(d) = r.stats_at(k) else { continue };
            lines.push((
                format!(
                    "{}: reserved {}, allocated {}, largest free {}, fragmentation {:.0}%",
                    s.spec,
                    format_size(d.reserved_bytes),
                    format_size(d.allocated_bytes),
                    format_size(d.largest_free_bytes),
                    r.fragmentation().get(k).unwrap_or(0.0) * 100.0
                ),
                theme::slot(i),
            ));
        }
    }
    egui::Tooltip::always_open(
        ui.ctx().clone(),
        ui.layer_id(),
        widget,
        egui::PopupAnchor::Pointer,
    )
    .gap(12.0)
    .show(|ui| {
        for (t, c) in lines {
            ui.colored_label(c, t);
        }
    });
    picked
}
