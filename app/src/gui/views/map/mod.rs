//! The memory map at the cursor: one row per segment (address order, grouped by pool and
//! stream), its blocks coloured by state, a byte scale on top. The wheel scrolls the rows,
//! ctrl+wheel (or a pinch) zooms the bytes, shift+wheel or a drag pans, a double-click
//! fits the largest segment. Hovering a block shows what it holds and where it came from.

pub mod tab;

use std::fmt::Write as _;

use egui::{Align2, Color32, FontId, Rect, Sense, Stroke, pos2};

use crate::engine::wire::{BlockView, NO_OP, TraceData, block_state};
use crate::gui::render::{self, Transform};
use crate::gui::state::{LayoutView, MIB, Row};
use crate::gui::theme;
use allocsim_core::units::format_size;

/// Fraction of a row's pitch a segment bar fills (the rest is the gap below it).
const BAR: f32 = theme::ROW_HEIGHT / (theme::ROW_HEIGHT + theme::ROW_GAP);

/// GPU layers of the blockers' quads (one per map).
const LAYER_BLOCKERS: u64 = 1 << 20;

/// Blockers outlined at most (a set is a few blocks of one segment).
const MAX_OUTLINED: usize = 512;

/// Zoom and scroll of the memory maps (shared by the compared maps, so they stay aligned).
#[derive(Debug, Clone, Default)]
pub struct MapState {
    /// Bytes per point; `None` fits the largest segment.
    pub bytes_per_point: Option<f64>,
    /// Byte offset at the left edge.
    pub pan_bytes: f64,
    /// Rows scrolled off the top (fractional).
    pub scroll_rows: f32,
    /// Scroll to this row on the next frame (search results).
    pub reveal_row: Option<u32>,
    /// Where the blocks of the last map drawn went (tests hover into it).
    pub last_content: Option<Rect>,
    /// Where each map's parts went when it was last drawn, by its layer.
    pub drawn: std::collections::BTreeMap<u64, MapGeometry>,
}

/// Where a map's parts went on screen (tests check that nothing is cut off and that no
/// label reaches into the bars).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MapGeometry {
    /// The whole map.
    pub outer: Rect,
    /// Where the segment bars go.
    pub content: Rect,
    /// The segment labels drawn, together ([`Rect::NOTHING`] where none was).
    pub labels: Rect,
    /// The byte scale's labels, together.
    pub ruler: Rect,
}

/// What the user did in a map this frame.
#[derive(Debug, Default, Clone, Copy)]
pub struct MapInput {
    /// The allocation of a clicked block.
    pub picked_alloc: Option<u32>,
    /// The block under the mouse.
    pub hovered_block: Option<usize>,
}

/// Draws the map of `layout` (its blocks' allocations are ops of `trace`); `layer` is the
/// GPU layer id of this map.
pub fn memory_map_ui(
    ui: &mut egui::Ui,
    st: &mut MapState,
    trace: &TraceData,
    layout: &LayoutView,
    wgpu: bool,
    layer: u64,
    selected_alloc: Option<u32>,
) -> MapInput {
    let mut input = MapInput::default();
    let (outer, response, painter) = crate::gui::views::plot_area(
        ui,
        Sense::click_and_drag(),
        wgpu,
        render::LAYER_FILLS + 16 + layer,
    );
    let label_w = theme::LABEL_WIDTH.min(outer.width() * 0.35);
    let ruler_h = 20.0;
    let content = Rect::from_min_max(
        pos2(outer.left() + label_w, outer.top() + ruler_h),
        pos2(outer.right() - 6.0, outer.bottom()),
    );
    if content.width() < 10.0 || content.height() < 10.0 {
        return input;
    }
    st.last_content = Some(content);
    let mut drawn = MapGeometry {
        outer,
        content,
        labels: Rect::NOTHING,
        ruler: Rect::NOTHING,
    };
    let pitch = theme::ROW_HEIGHT + theme::ROW_GAP;
    let rows = layout.rows.len() as f32;
    let max_scroll = (rows - content.height() / pitch + 1.0).max(0.0);
    if let Some(r) = st.reveal_row.take() {
        let r = r as f32;
        if r < st.scroll_rows || r > st.scroll_rows + content.height() / pitch - 1.0 {
            st.scroll_rows = (r - 2.0).max(0.0);
        }
    }
    st.scroll_rows = st.scroll_rows.clamp(0.0, max_scroll);
    let fit = (layout.max_segment_bytes.max(1) as f64) / f64::from(content.width());
    let bpp = st.bytes_per_point.unwrap_or(fit).max(1e-3);
    st.pan_bytes = st.pan_bytes.clamp(
        0.0,
        (layout.max_segment_bytes as f64 - bpp * f64::from(content.width()) * 0.5).max(0.0),
    );

    // Interaction first, so this frame draws the new view.
    if response.double_clicked() {
        st.bytes_per_point = None;
        st.pan_bytes = 0.0;
    }
    if response.dragged() {
        let d = response.drag_delta();
        st.pan_bytes -= f64::from(d.x) * bpp;
        st.scroll_rows -= d.y / pitch;
    }
    if let Some(h) = response.hover_pos() {
        let (scroll, zoom, shift) =
            ui.input(|i| (i.smooth_scroll_delta, i.zoom_delta(), i.modifiers.shift));
        if (zoom - 1.0).abs() > f32::EPSILON && content.contains(h) {
            let at = st.pan_bytes + f64::from(h.x - content.left()) * bpp;
            let nb = (bpp / f64::from(zoom)).clamp(1.0 / 64.0, fit * 4.0);
            st.bytes_per_point = Some(nb);
            st.pan_bytes = (at - f64::from(h.x - content.left()) * nb).max(0.0);
        } else if shift {
            st.pan_bytes -= f64::from(scroll.y + scroll.x) * bpp;
        } else {
            st.scroll_rows -= scroll.y / pitch;
            st.pan_bytes -= f64::from(scroll.x) * bpp;
        }
        st.scroll_rows = st.scroll_rows.clamp(0.0, max_scroll);
        st.pan_bytes = st.pan_bytes.max(0.0);
    }
    let bpp = st.bytes_per_point.unwrap_or(fit).max(1e-3);

    drawn.ruler = ruler(&painter, outer, content, ruler_h, st.pan_bytes, bpp);

    let first_row = st.scroll_rows.floor().max(0.0) as usize;
    let visible_rows = (content.height() / pitch).ceil() as usize + 1;
    let row_top = |r: usize| content.top() + (r as f32 - st.scroll_rows) * pitch;
    // Segment outlines, labels and group headers for the visible rows.
    let font = FontId::monospace(11.0);
    for r in first_row..(first_row + visible_rows).min(layout.rows.len()) {
        let y = row_top(r);
        match &layout.rows[r] {
            Row::Header { label } => {
                let band = Rect::from_min_max(
                    pos2(outer.left(), y),
                    pos2(outer.right(), y + theme::ROW_HEIGHT),
                );
                painter.rect_filled(band, 0.0, theme::GROUP_HEADER);
                painter.text(
                    pos2(outer.left() + 6.0, y + theme::ROW_HEIGHT / 2.0),
                    Align2::LEFT_CENTER,
                    label,
                    FontId::proportional(12.0),
                    Color32::WHITE,
                );
            }
            Row::Segment { index } => {
                let s = &layout.data.segments[*index];
                let x0 = content.left() + ((0.0 - st.pan_bytes) / bpp) as f32;
                let x1 = content.left() + ((s.size_bytes as f64 - st.pan_bytes) / bpp) as f32;
                let bar = Rect::from_min_max(
                    pos2(x0.max(content.left() - 2.0), y),
                    pos2(
                        x1.min(content.right() + 2.0).max(x0 + 1.0),
                        y + theme::ROW_HEIGHT,
                    ),
                );
                painter.rect_stroke(
                    bar,
                    0.0,
                    Stroke::new(1.0, theme::GRID),
                    egui::StrokeKind::Outside,
                );
                let kind = match (s.expandable, s.small) {
                    (true, _) => "exp",
                    (false, true) => "small",
                    (false, false) => "large",
                };
                // The longest form that fits beside the bars, never over them.
                let size = format_size(s.size_bytes);
                let column = Rect::from_min_max(
                    pos2(outer.left(), y),
                    pos2(content.left() - 4.0, y + theme::ROW_HEIGHT),
                );
                let label = [
                    format!("{:#x} {size} {kind}", s.addr),
                    format!("{size} {kind}"),
                    size,
                ]
                .into_iter()
                .map(|t| painter.layout_no_wrap(t, font.clone(), theme::AXIS_TEXT))
                .reduce(|fits, next| {
                    if fits.size().x <= column.width() - 6.0 {
                        fits
                    } else {
                        next
                    }
                });
                if let Some(g) = label {
                    let at = pos2(column.left() + 6.0, column.center().y - g.size().y / 2.0);
                    let r = Rect::from_min_size(at, g.size()).intersect(column);
                    drawn.labels = drawn.labels.union(r);
                    painter
                        .with_clip_rect(column)
                        .galley(at, g, theme::AXIS_TEXT);
                }
            }
        }
    }

    // Blocks: one instanced quad each (GPU), highlighted ones again on top.
    let ppp = ui.ctx().pixels_per_point();
    let t = Transform {
        min_px: [1.0, 0.0],
        gap_px: 1.0,
        ..Transform::new(
            [(st.pan_bytes / MIB) as f32, st.scroll_rows],
            [(MIB / bpp) as f32 * ppp, pitch * ppp],
            [content.width() * ppp, content.height() * ppp],
        )
    };
    let clip = ui.painter_at(content);
    render::paint_quads(
        &clip,
        content,
        wgpu,
        layer * 2 + 100,
        &layout.quads,
        0..layout.quads.len() as u32,
        t,
    );
    if !layout.highlight.is_empty() {
        let mut th = t;
        th.min_px = [2.0, 0.0];
        render::paint_quads(
            &clip,
            content,
            wgpu,
            layer * 2 + 101,
            &layout.highlight,
            0..layout.highlight.len() as u32,
            th,
        );
    }

    // The OOM explanation's blockers: tinted, and outlined so that a one-pixel block
    // still shows.
    if !layout.blockers.is_empty() {
        let mut tb = t;
        tb.min_px = [2.0, 0.0];
        render::paint_quads(
            &clip,
            content,
            wgpu,
            LAYER_BLOCKERS + layer,
            &layout.blockers,
            0..layout.blockers.len() as u32,
            tb,
        );
        for &bi in layout.blocker_blocks.iter().take(MAX_OUTLINED) {
            if let Some(b) = layout.data.blocks.get(bi)
                && let Some(r) = block_rect(layout, bi, b, content, st, bpp, &row_top)
            {
                clip.rect_stroke(
                    r,
                    0.0,
                    Stroke::new(1.5, theme::BLOCKER),
                    egui::StrokeKind::Outside,
                );
            }
        }
    }

    // Selected allocation: outline its block.
    if let Some(sel) = selected_alloc
        && let Some((bi, b)) = layout
            .data
            .blocks
            .iter()
            .enumerate()
            .find(|(_, b)| b.alloc == sel && b.state != block_state::FREE)
        && let Some(r) = block_rect(layout, bi, b, content, st, bpp, &row_top)
    {
        clip.rect_stroke(
            r.expand(1.5),
            0.0,
            Stroke::new(2.0, theme::HIGHLIGHT),
            egui::StrokeKind::Outside,
        );
    }

    // Hover.
    if let Some(h) = response.hover_pos()
        && content.contains(h)
    {
        let r = ((h.y - content.top()) / pitch + st.scroll_rows).floor();
        if r >= 0.0
            && let Some(Row::Segment { index }) = layout.rows.get(r as usize)
        {
            let off = st.pan_bytes + f64::from(h.x - content.left()) * bpp;
            let seg = &layout.data.segments[*index];
            // Sub-pixel blocks are widened to a pixel: search within half a point.
            let slack = (bpp * 0.5) as u64;
            let hit = if off >= 0.0 && (off as u64) < seg.size_bytes + slack {
                let o = (off as u64).min(seg.size_bytes.saturating_sub(1));
                layout
                    .block_at(*index, o)
                    .or_else(|| layout.block_at(*index, o.saturating_sub(slack)))
            } else {
                None
            };
            if let Some(bi) = hit {
                input.hovered_block = Some(bi);
                let b = layout.data.blocks[bi];
                if let Some(rr) = block_rect(layout, bi, &b, content, st, bpp, &row_top) {
                    clip.rect_stroke(
                        rr,
                        0.0,
                        Stroke::new(1.5, theme::HOVER_OUTLINE),
                        egui::StrokeKind::Outside,
                    );
                }
                egui::Tooltip::always_open(
                    ui.ctx().clone(),
                    ui.layer_id(),
                    response.id,
                    egui::PopupAnchor::Pointer,
                )
                .gap(14.0)
                .show(|ui| {
                    if layout.blocker_blocks.binary_search(&bi).is_ok() {
                        ui.colored_label(
                            theme::BLOCKER,
                            "a blocker of the OOM explained: without the blockers the request would fit",
                        );
                    }
                    block_details_ui(ui, trace, layout, *index, &b);
                });
                if response.clicked() && b.alloc != NO_OP {
                    input.picked_alloc = Some(b.alloc);
                }
            }
        }
    }
    if layout.data.segments.is_empty() {
        painter.text(
            content.center(),
            Align2::CENTER_CENTER,
            "no memory reserved at this event",
            FontId::proportional(14.0),
            theme::AXIS_TEXT,
        );
    }
    st.drawn.insert(layer, drawn);
    input
}

fn block_rect(
    layout: &LayoutView,
    bi: usize,
    b: &BlockView,
    content: Rect,
    st: &MapState,
    bpp: f64,
    row_top: &dyn Fn(usize) -> f32,
) -> Option<Rect> {
    let si = layout
        .data
        .segments
        .iter()
        .position(|s| (s.first as usize..(s.first + s.count) as usize).contains(&bi))?;
    let s = &layout.data.segments[si];
    let row = layout.segment_row[si] as usize;
    let y = row_top(row);
    let off = b.addr.saturating_sub(s.addr) as f64;
    let x0 = content.left() + ((off - st.pan_bytes) / bpp) as f32;
    let x1 = content.left() + ((off + b.size_bytes as f64 - st.pan_bytes) / bpp) as f32;
    let x1 = x1.max(x0 + 1.0);
    let r = Rect::from_min_max(pos2(x0, y), pos2(x1, y + theme::ROW_HEIGHT * BAR.max(0.8)));
    r.intersects(content).then_some(r)
}

/// The byte scale above the map: ticks at a power-of-two step, their labels kept inside
/// the map (`outer`). Returns where the labels went.
fn ruler(painter: &egui::Painter, outer: Rect, content: Rect, h: f32, pan: f64, bpp: f64) -> Rect {
    let mut drawn = Rect::NOTHING;
    let span = bpp * f64::from(content.width());
    let mut step = 512f64;
    while span / step > (f64::from(content.width()) / 90.0).max(1.0) {
        step *= 2.0;
    }
    let mut b = (pan / step).ceil() * step;
    let y = content.top() - h;
    while b <= pan + span {
        let x = content.left() + ((b - pan) / bpp) as f32;
        painter.line_segment(
            [pos2(x, y + h - 5.0), pos2(x, y + h)],
            Stroke::new(1.0, theme::AXIS_TEXT),
        );
        let galley = painter.layout_no_wrap(
            format_size(b as u64),
            FontId::proportional(10.0),
            theme::AXIS_TEXT,
        );
        let width = galley.size().x;
        let at = pos2(
            (x - width / 2.0)
                .min(outer.right() - width - 2.0)
                .max(outer.left()),
            y + 2.0,
        );
        drawn = drawn.union(Rect::from_min_size(at, galley.size()));
        painter.galley(at, galley, theme::AXIS_TEXT);
        b += step;
    }
    drawn
}

/// Everything known about a block: state, sizes, stream and pool, the events that made
/// and freed its allocation, and its stack.
pub fn block_details_ui(
    ui: &mut egui::Ui,
    trace: &TraceData,
    layout: &LayoutView,
    seg: usize,
    b: &BlockView,
) {
    let s = &layout.data.segments[seg];
    let state = match b.state {
        block_state::ALLOCATED => "allocated",
        block_state::PENDING_FREE => "pending free (waiting for another stream)",
        block_state::UNMAPPED => "unmapped (address space without memory)",
        _ => "cached free",
    };
    ui.colored_label(
        theme::block(b.state).gamma_multiply(1.4),
        format!("{} · {state}", format_size(b.size_bytes)),
    );
    if b.state == block_state::ALLOCATED || b.state == block_state::PENDING_FREE {
        ui.label(format!(
            "requested {} (rounding {})",
            format_size(b.requested_bytes),
            format_size(b.size_bytes.saturating_sub(b.requested_bytes))
        ));
    }
    ui.label(format!(
        "address {:#x} (+{} in segment {:#x})",
        b.addr,
        format_size(b.addr - s.addr),
        s.addr
    ));
    let pool = if s.pool == (0, 0) {
        "default pool".to_string()
    } else {
        format!("private pool ({}, {})", s.pool.0, s.pool.1)
    };
    ui.label(format!(
        "stream {:#x} · {pool} · {} segment",
        s.stream,
        if s.small { "small" } else { "large" }
    ));
    let ops = &trace.ops;
    if b.alloc != NO_OP {
        let a = b.alloc as usize;
        let ev = |k: u32| ops.at_event(k as usize);
        let mut life = format!("allocated {}", ev(b.alloc));
        match ops.link.get(a) {
            Some(&f) if f != NO_OP => {
                let _ = write!(life, ", freed {}", ev(f));
                let done = ops.end(a);
                if done != f && done != NO_OP {
                    let _ = write!(life, ", free completed {}", ev(done));
                }
            }
            _ => life.push_str(", never freed in the trace"),
        }
        ui.label(life);
        let frames = trace.stacks.format(ops.stack.get(a).copied().unwrap_or(0));
        if frames.is_empty() {
            ui.weak("no stack frames recorded");
        } else {
            for f in frames.iter().take(16) {
                ui.monospace(f);
            }
            if frames.len() > 16 {
                ui.weak(format!("… {} more frames", frames.len() - 16));
            }
        }
    } else if b.state == block_state::ALLOCATED && ops.is_empty() {
        ui.weak("as the file's end state records it (the trace is being built)");
    } else if b.state == block_state::ALLOCATED {
        ui.weak("alive before the trace starts");
    }
}
