//! The "At the peak" tab: live bytes at the peak by allocation site.

use crate::gui::AllocsimApp;
use crate::gui::state;
use allocsim_core::units::format_size;
use egui::{RichText, Ui};

pub(crate) fn peak_tab_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    let Some(doc) = &app.doc else { return };
    let Some(r) = doc.slots.first().and_then(|s| s.replay.as_ref()) else {
        crate::gui::theme::busy(ui);
        return;
    };
    let key = std::ptr::from_ref(r) as usize;
    if app.peak_sites.as_ref().is_none_or(|(k, _)| *k != key) {
        app.peak_sites = Some((key, state::sites_at(&doc.trace, r.peak_op)));
    }
    let peak_op = r.peak_op;
    let Some((_, sites)) = &app.peak_sites else {
        return;
    };
    let total: u64 = sites.iter().map(|s| s.1).sum();
    let mut go = false;
    let mut pick = None;
    ui.horizontal(|ui| {
        ui.label(format!(
            "At the peak ({}): {} live in {} allocations from {} call sites",
            doc.trace.ops.event_name(peak_op as usize),
            format_size(total),
            sites.iter().map(|s| s.2).sum::<u32>(),
            sites.len()
        ));
        if ui.button("Go to the peak").clicked() {
            go = true;
        }
    });
    egui::ScrollArea::vertical().id_salt("peak").show(ui, |ui| {
        egui::Grid::new("peak_sites")
            .striped(true)
            .num_columns(4)
            .show(ui, |ui| {
                for h in ["bytes", "share", "allocations", "call site"] {
                    ui.label(RichText::new(h).strong());
                }
                ui.end_row();
                for &(stack, bytes, count) in sites.iter().take(500) {
                    ui.label(format_size(bytes));
                    ui.label(format!(
                        "{:.1}%",
                        bytes as f64 / total.max(1) as f64 * 100.0
                    ));
                    ui.label(count.to_string());
                    let selected = app.search.site == Some(stack);
                    let label = state::site_label(&doc.trace, stack);
                    let r = ui.selectable_label(selected, RichText::new(label).monospace());
                    let frames = doc.trace.stacks.format(stack);
                    let r = if frames.is_empty() {
                        r
                    } else {
                        r.on_hover_text(frames.join("\n"))
                    };
                    if r.clicked() {
                        pick = Some(if selected { None } else { Some(stack) });
                    }
                    ui.end_row();
                }
            });
    });
    if go {
        app.set_cursor(peak_op);
        if let Some(doc) = &app.doc {
            app.timeline.reveal(doc, peak_op);
        }
    }
    if let Some(p) = pick {
        app.search.site = p;
        app.apply_search();
    }
}
