//! The timeline's axes and reference lines: byte lines, x labels, the best-possible
//! bounds.

use egui::{Align2, FontId, Rect, Shape, Stroke, pos2};

use super::XMap;
use crate::gui::state::Document;
use crate::gui::theme;
use allocsim_core::units::format_size;

/// The top of the plot for data peaking at `peak` bytes: 6 % above it (1 MiB for none).
pub(super) fn y_max(peak: f64) -> f64 {
    if peak <= 0.0 {
        crate::gui::state::MIB
    } else {
        peak * 1.06
    }
}

/// The byte lines and x labels of a plot: `x_label` names an x, `unit` the axis.
pub(super) fn grid(
    painter: &egui::Painter,
    plot: Rect,
    labels_y: f32,
    ymax: f64,
    xm: &XMap,
    x_label: &dyn Fn(f64) -> String,
    unit: &str,
) {
    let font = FontId::proportional(11.0);
    // Bytes: a power-of-two step giving 3–8 lines.
    let mut step = 1024f64;
    while ymax / step > 8.0 {
        step *= 2.0;
    }
    let mut v = 0.0;
    while v <= ymax {
        let y = plot.bottom() - (v / ymax * f64::from(plot.height())) as f32;
        painter.line_segment(
            [pos2(plot.left(), y), pos2(plot.right(), y)],
            Stroke::new(1.0, theme::GRID),
        );
        painter.text(
            pos2(plot.left() - 6.0, y),
            Align2::RIGHT_CENTER,
            format_size(v as u64),
            font.clone(),
            theme::AXIS_TEXT,
        );
        v += step;
    }
    // x: a 1-2-5 step giving about one label per 110 points.
    let span = (xm.hi - xm.lo).max(1e-9);
    let target = (f64::from(plot.width()) / 110.0).max(1.0);
    let raw = span / target;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut x = (xm.lo / step).ceil() * step;
    while x <= xm.hi {
        let sx = xm.to_screen(x);
        painter.line_segment(
            [pos2(sx, plot.top()), pos2(sx, plot.bottom())],
            Stroke::new(1.0, theme::GRID.gamma_multiply(0.6)),
        );
        painter.text(
            pos2(sx, labels_y),
            Align2::CENTER_TOP,
            x_label(x),
            font.clone(),
            theme::AXIS_TEXT,
        );
        x += step;
    }
    painter.text(
        pos2(plot.left() - 6.0, labels_y),
        Align2::RIGHT_TOP,
        unit,
        font,
        theme::AXIS_TEXT,
    );
}

/// Seconds as `1.234 s` or `12 ms`.
#[must_use]
pub fn format_seconds(s: f64) -> String {
    if s.abs() >= 1.0 {
        format!("{s:.3} s")
    } else if s.abs() >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

/// The best any allocator could do, as two dashed lines labelled at the left: the
/// live-bytes peak (no allocator needs less) and the offline placement's peak (what
/// knowing every lifetime in advance achieves). Returns what it drew.
pub(super) fn reference_lines(
    painter: &egui::Painter,
    plot: Rect,
    doc: &Document,
    to_y: &dyn Fn(f64) -> f32,
) -> Vec<(String, u64)> {
    let Some(b) = &doc.bounds else {
        return Vec::new();
    };
    let lines = [
        (
            format!("live bytes peak {}", format_size(b.live_peak_bytes)),
            b.live_peak_bytes,
            theme::LIVE_PEAK,
        ),
        (
            format!(
                "offline placement peak {}",
                format_size(b.offline_peak_bytes)
            ),
            b.offline_peak_bytes,
            theme::OFFLINE_PEAK,
        ),
    ];
    let mut drawn = Vec::new();
    for (k, (label, bytes, color)) in lines.into_iter().enumerate() {
        let y = to_y(bytes as f64);
        painter.extend(Shape::dashed_line(
            &[pos2(plot.left(), y), pos2(plot.right(), y)],
            Stroke::new(1.0, color),
            6.0,
            4.0,
        ));
        // Equal peaks: the second label goes under the line, not over the first.
        let (anchor, dy) = if k == 0 {
            (Align2::LEFT_BOTTOM, -2.0)
        } else {
            (Align2::LEFT_TOP, 2.0)
        };
        painter.text(
            pos2(plot.left() + 4.0, y + dy),
            anchor,
            &label,
            FontId::proportional(11.0),
            color,
        );
        drawn.push((label, bytes));
    }
    drawn
}
