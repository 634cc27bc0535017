//! The Diff view: two runs on a common axis (their reserved and allocated curves, each
//! peak marked), the sentence, reserved/allocated/fragmentation side by side, what changed
//! at the peak by allocation site, and the settings that differ — `allocsim diff` as a
//! view. Model (core's `Diff`, reduced curves) → layout ([`points_from_curve`]) → paint.

use allocsim_core::diff::{Align, Diff, DiffRun, format_delta};
use allocsim_core::units::format_size;
use egui::{Color32, Pos2, Rect, RichText, Stroke, Ui};

use crate::engine::wire::CurveData;
use crate::gui::AllocsimApp;
use crate::gui::theme;

/// At most this many sites are listed (the largest growth first).
const SITES_SHOWN: usize = 25;

/// A's and B's colours.
const RUN_COLOURS: [Color32; 2] = [theme::SLOTS[0], theme::SLOTS[1]];

pub fn diff_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    let m = &mut app.multi;
    if m.files.len() < 2 {
        ui.label("Add two snapshots to compare (A: before, B: after): Add snapshots…, a path, or drop them here");
        for f in &m.files {
            ui.monospace(&f.name);
        }
        return;
    }
    ui.horizontal_wrapped(|ui| {
        for (label, slot) in [("A", &mut m.a), ("B", &mut m.b)] {
            egui::ComboBox::from_label(label)
                .selected_text(m.files[*slot].name.clone())
                .show_ui(ui, |ui| {
                    for (i, f) in m.files.iter().enumerate() {
                        ui.selectable_value(slot, i, &f.name);
                    }
                });
        }
        ui.separator();
        ui.label("axis");
        ui.selectable_value(&mut m.align, Align::Time, "Time");
        ui.selectable_value(&mut m.align, Align::Events, "Events");
        ui.selectable_value(&mut m.align, Align::Steps, "Steps")
            .on_hover_text("annotate/user_metadata markers, else the optimizer's calls");
        ui.separator();
        ui.label("B under");
        let r = ui
            .add(
                egui::TextEdit::singleline(&mut m.config_b_text)
                    .hint_text("its own settings")
                    .desired_width(220.0),
            )
            .on_hover_text("PYTORCH_CUDA_ALLOC_CONF for B (PyTorch's defaults plus it)");
        if r.lost_focus() {
            m.config_b.clone_from(&m.config_b_text);
        }
    });
    if m.diff_job.is_some() {
        ui.horizontal(|ui| {
            crate::gui::theme::busy(ui);
            ui.label("replaying both runs…");
        });
        return;
    }
    match &m.diff {
        None => {}
        Some(Err(e)) => {
            ui.colored_label(theme::BAD_TEXT, e);
        }
        Some(Ok(data)) => {
            let d = &data.diff;
            ui.label(RichText::new(crate::gui::views::multi::drawable(&d.summary)).strong());
            curves_ui(ui, d, &data.curves);
            egui::ScrollArea::vertical().show(ui, |ui| {
                side_by_side_ui(ui, d);
                ui.separator();
                sites_ui(ui, d);
                ui.separator();
                if d.settings_differ.is_empty() {
                    ui.label("Settings: the same");
                } else {
                    ui.label(RichText::new("Settings that differ").strong());
                    for s in &d.settings_differ {
                        ui.monospace(format!(
                            "{}: A {} -> B {}",
                            s.setting,
                            s.a.as_deref().unwrap_or("default"),
                            s.b.as_deref().unwrap_or("default")
                        ));
                    }
                }
            });
        }
    }
}

/// The x range both curves share, and the largest reserved value.
#[must_use]
pub fn extent(curves: &[CurveData; 2]) -> (f64, f64, u64) {
    let xs = curves.iter().flat_map(|c| c.x.iter().copied());
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), x| {
        (l.min(x), h.max(x))
    });
    let y = curves
        .iter()
        .flat_map(|c| c.reserved_bytes.iter().copied())
        .max()
        .unwrap_or(0);
    if lo.is_finite() && hi > lo {
        (lo, hi, y)
    } else {
        (0.0, 1.0, y)
    }
}

/// Screen points of `values` at positions `x` in `rect`, the axis spanning `x0..x1` and
/// bytes `0..y_max` (bottom to top).
#[must_use]
pub fn points_from_curve(
    x: &[f64],
    values: &[u64],
    rect: Rect,
    x0: f64,
    x1: f64,
    y_max: u64,
) -> Vec<Pos2> {
    let w = f64::from(rect.width());
    let h = f64::from(rect.height());
    let top = y_max.max(1) as f64;
    x.iter()
        .zip(values)
        .map(|(&xv, &v)| {
            let px = rect.left() + ((xv - x0) / (x1 - x0) * w) as f32;
            let py = rect.bottom() - (v as f64 / top * h) as f32;
            Pos2::new(px, py)
        })
        .collect()
}

fn curves_ui(ui: &mut Ui, d: &Diff, curves: &[CurveData; 2]) {
    let height = 200.0_f32.min(ui.available_height() * 0.45).max(120.0);
    let (rect, _) = ui.allocate_exact_size(
        egui::vec2(ui.available_width(), height),
        egui::Sense::hover(),
    );
    let painter = ui.painter_at(rect);
    painter.rect_filled(rect, 0.0, theme::PLOT_BG);
    let plot = rect.shrink2(egui::vec2(8.0, 16.0));
    let (x0, x1, y_max) = extent(curves);
    for (i, (c, run)) in curves.iter().zip([&d.a, &d.b]).enumerate() {
        let colour = RUN_COLOURS[i];
        let alloc = points_from_curve(&c.x, &c.allocated_bytes, plot, x0, x1, y_max);
        painter.add(egui::Shape::line(
            alloc,
            Stroke::new(1.0, colour.gamma_multiply(0.5)),
        ));
        let reserved = points_from_curve(&c.x, &c.reserved_bytes, plot, x0, x1, y_max);
        painter.add(egui::Shape::line(reserved, Stroke::new(1.5, colour)));
        let peak = points_from_curve(
            &[run.peak_at],
            &[run.peak_reserved_bytes],
            plot,
            x0,
            x1,
            y_max,
        )[0];
        painter.circle_filled(peak, 4.0, colour);
        // The peaks named in a legend at the top left (two labels at nearby peaks would
        // overlap).
        painter.text(
            rect.left_top() + egui::vec2(12.0, 4.0 + 14.0 * i as f32),
            egui::Align2::LEFT_TOP,
            format!(
                "{} peak {} at {:.2} {}",
                ["A", "B"][i],
                format_size(run.peak_reserved_bytes),
                run.peak_at,
                d.align.unit()
            ),
            egui::FontId::proportional(12.0),
            colour,
        );
    }
    let unit = match d.align {
        Align::Time => "seconds since the first event",
        Align::Events => "event",
        Align::Steps => "step",
    };
    painter.text(
        rect.left_bottom() + egui::vec2(8.0, -2.0),
        egui::Align2::LEFT_BOTTOM,
        format!(
            "{x0:.2} … {x1:.2} {unit}; reserved (bright) and allocated (dim), 0 … {}",
            format_size(y_max)
        ),
        egui::FontId::proportional(11.0),
        theme::AXIS_TEXT,
    );
}

fn side_by_side_ui(ui: &mut Ui, d: &Diff) {
    let free = |r: &DiffRun| {
        r.peak_reserved_bytes
            .saturating_sub(r.allocated_at_peak_bytes)
    };
    let config = |r: &DiffRun| {
        if r.config.is_empty() {
            "defaults".to_string()
        } else {
            r.config.clone()
        }
    };
    let oom = |r: &DiffRun| {
        r.oom_event
            .map_or_else(|| "never".to_string(), |e| format!("at event {e}"))
    };
    egui::Grid::new("diff_side_by_side")
        .striped(true)
        .show(ui, |ui| {
            for h in ["", "A", "B", "B - A"] {
                ui.label(RichText::new(h).strong());
            }
            ui.end_row();
            let rows: [(&str, String, String, String); 7] = [
                ("file", d.a.file.clone(), d.b.file.clone(), String::new()),
                ("config", config(&d.a), config(&d.b), String::new()),
                (
                    "peak reserved",
                    format_size(d.a.peak_reserved_bytes),
                    format_size(d.b.peak_reserved_bytes),
                    format_delta(d.peak_reserved_delta_bytes),
                ),
                (
                    "peak allocated",
                    format_size(d.a.peak_allocated_bytes),
                    format_size(d.b.peak_allocated_bytes),
                    format_delta(d.peak_allocated_delta_bytes),
                ),
                (
                    "reserved-but-free at peak",
                    format_size(free(&d.a)),
                    format_size(free(&d.b)),
                    format_delta(d.free_at_peak_delta_bytes),
                ),
                (
                    "fragmentation at peak",
                    format!("{:.1}%", d.a.fragmentation_at_peak * 100.0),
                    format!("{:.1}%", d.b.fragmentation_at_peak * 100.0),
                    String::new(),
                ),
                ("out of memory", oom(&d.a), oom(&d.b), String::new()),
            ];
            for (label, a, b, delta) in rows {
                ui.label(label);
                ui.label(a);
                ui.label(b);
                ui.label(delta);
                ui.end_row();
            }
        });
}

fn sites_ui(ui: &mut Ui, d: &Diff) {
    ui.label(
        RichText::new("Allocated at each run's peak, by allocation site (largest growth first)")
            .strong(),
    );
    egui::Grid::new("diff_sites").striped(true).show(ui, |ui| {
        for h in ["B - A", "A", "B", "site"] {
            ui.label(RichText::new(h).strong());
        }
        ui.end_row();
        for s in d.by_site.iter().take(SITES_SHOWN) {
            let colour = match s.delta_bytes.signum() {
                1 => theme::BAD_TEXT,
                -1 => theme::OK_TEXT,
                _ => theme::AXIS_TEXT,
            };
            ui.colored_label(colour, format_delta(s.delta_bytes));
            ui.label(format_size(s.a_bytes));
            ui.label(format_size(s.b_bytes));
            ui.monospace(&s.site);
            ui.end_row();
        }
    });
    if d.by_site.len() > SITES_SHOWN {
        ui.weak(format!(
            "… and {} more sites (allocsim diff --json lists them all)",
            d.by_site.len() - SITES_SHOWN
        ));
    }
}
