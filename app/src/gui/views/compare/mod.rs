//! The Compare tab: the summary table and every configuration's memory map side by side.

use crate::gui::state;
use crate::gui::views::config::capacity_phrase;
use crate::gui::views::map::memory_map_ui;
use crate::gui::views::map::tab::map_header_ui;
use crate::gui::views::oom::would_fit::other_runtimes_ui;
use crate::gui::{AllocsimApp, theme};
use allocsim_core::units::format_size;
use egui::{RichText, Ui};

pub(crate) fn compare_tab_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    app.request_min_capacities();
    let Some(doc) = &app.doc else { return };
    // The maps share the tab's width as it is before anything is laid out (content too
    // wide for it would widen it, and push the last map out of the window).
    let full_width = ui.available_width();
    // The capacity every row ran under, as `allocsim compare` states it.
    ui.horizontal_wrapped(|ui| {
        ui.label(format!("capacity {}", capacity_phrase(&app.config)));
        if let Some(n) = &app.config.capacity.note {
            ui.weak(n);
        }
    });
    // A table wider than the tab (long configurations) scrolls instead.
    egui::ScrollArea::horizontal()
        .id_salt("summary_scroll")
        .show(ui, |ui| summary_table_ui(ui, doc));
    compare_maps_ui(ui, app, full_width);
}

/// The compare table: each configuration's peaks, fragmentation, segment operations,
/// smallest capacity and result.
pub(crate) fn summary_table_ui(ui: &mut Ui, doc: &state::Document) {
    egui::Grid::new("summary")
        .striped(true)
        .num_columns(8)
        .show(ui, |ui| {
            for h in [
                "configuration",
                "peak reserved",
                "peak allocated",
                "fragmentation at peak",
                "max fragmentation",
                "segment ops",
                "min capacity",
                "result",
            ] {
                ui.label(RichText::new(h).strong());
            }
            ui.end_row();
            for (i, s) in doc.slots.iter().enumerate() {
                ui.colored_label(theme::slot(i), RichText::new(&s.spec).monospace());
                if let Some(r) = &s.replay {
                    let m = &r.data.summary;
                    ui.label(format_size(m.peak_reserved_bytes));
                    ui.label(format_size(m.peak_allocated_bytes));
                    ui.label(format!("{:.1}%", m.fragmentation_at_peak * 100.0));
                    ui.label(format!("{:.1}%", m.max_fragmentation * 100.0));
                    ui.label(m.segment_ops.to_string());
                    match &s.min_capacity {
                        Some(Ok(b)) => ui.label(format_size(*b)),
                        Some(Err(e)) => ui.colored_label(theme::BAD_TEXT, "none").on_hover_text(e),
                        None => crate::gui::theme::busy(ui),
                    };
                    match &m.oom {
                        Some(o) if o.fatal => ui
                            .colored_label(
                                theme::BAD_TEXT,
                                format!("OOM at event {}", o.event_index),
                            )
                            .on_hover_text(&o.explanation),
                        Some(o) => ui
                            .colored_label(
                                theme::BAD_TEXT,
                                format!("OOM at event {} (caught)", o.event_index),
                            )
                            .on_hover_text(format!(
                                "as recorded: the program caught it and went on\n\n{}",
                                o.explanation
                            )),
                        None => ui.colored_label(theme::OK_TEXT, "fits"),
                    };
                } else {
                    ui.label(s.error.clone().unwrap_or_else(|| "replaying…".into()));
                    for _ in 0..6 {
                        ui.label("");
                    }
                }
                ui.end_row();
            }
        });
}

/// The memory map of each configuration at the cursor, side by side in `full_width`,
/// after the other runtimes (other allocators than PyTorch's, apart).
pub(crate) fn compare_maps_ui(ui: &mut Ui, app: &mut AllocsimApp, full_width: f32) {
    if let Some(spec) = other_runtimes_ui(ui, app)
        && !app.config.specs().contains(&spec)
    {
        app.config.compare.push(spec);
        app.resimulate();
    }
    let Some(doc) = &app.doc else { return };
    ui.separator();
    let n = doc.slots.len().max(1);
    let mut picked = None;
    let gap = ui.spacing().item_spacing.x;
    let width = (full_width - gap * (n - 1) as f32) / n as f32;
    let height = ui.available_height();
    ui.horizontal_top(|ui| {
        for i in 0..n {
            ui.allocate_ui(egui::vec2(width, height), |ui| {
                ui.vertical(|ui| {
                    map_header_ui(ui, app, i);
                    if let Some(doc) = &app.doc
                        && let Some(l) = doc.slots.get(i).and_then(|s| s.layout.as_ref())
                    {
                        let r = memory_map_ui(
                            ui,
                            &mut app.map,
                            &doc.trace,
                            l,
                            app.wgpu,
                            i as u64 + 1,
                            app.selected_alloc,
                        );
                        picked = picked.or(r.picked_alloc);
                    }
                });
            });
        }
    });
    if let Some(a) = picked {
        app.selected_alloc = Some(a);
        app.refresh_highlight();
    }
}
