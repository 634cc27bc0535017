//! The Ranks view: one snapshot per rank, a row each (peak reserved, allocated,
//! fragmentation, OOM, smallest capacity, the what-if), the outlier marked, unreadable
//! files listed and marked; clicking a row opens that rank as the trace. `allocsim ranks`
//! as a view.

use allocsim_core::units::format_size;
use egui::{RichText, Ui};

use crate::engine::multi;
use crate::gui::AllocsimApp;
use crate::gui::theme;

pub fn ranks_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    if app.multi.files.is_empty() {
        ui.label("Add one snapshot per rank: Add snapshots…, a path, or drop them here");
        return;
    }
    ui.horizontal(|ui| {
        ui.label("what-if on every rank");
        if app.multi.what_if_text.is_empty() {
            app.multi.what_if_text.clone_from(&app.multi.what_if);
        }
        let r = ui
            .add(egui::TextEdit::singleline(&mut app.multi.what_if_text).desired_width(260.0))
            .on_hover_text(
                "PYTORCH_CUDA_ALLOC_CONF tried on every rank (PyTorch's defaults plus it)",
            );
        if r.lost_focus() && !app.multi.what_if_text.trim().is_empty() {
            app.multi.what_if.clone_from(&app.multi.what_if_text);
        }
    });
    if app.multi.ranks_job.is_some() {
        // No spinner (a repaint every frame): the progress bar above moves as ranks come
        // back.
        ui.label(format!("replaying {} ranks…", app.multi.files.len()));
        return;
    }
    let Some(data) = &app.multi.ranks else {
        return;
    };
    let mut open = None;
    if let Some(e) = &data.error {
        ui.colored_label(theme::BAD_TEXT, e);
    }
    if let Some(r) = &data.report {
        ui.label(
            RichText::new(format!(
                "{}.",
                crate::gui::views::multi::drawable(&r.summary)
            ))
            .strong(),
        );
        ui.label(format!(
            "{}.",
            crate::gui::views::multi::drawable(&r.what_if.sentence)
        ));
        egui::Grid::new("ranks_table").striped(true).show(ui, |ui| {
            for h in [
                "rank",
                "file",
                "peak reserved",
                "peak allocated",
                "fragmentation",
                "out of memory",
                "min capacity",
                r.what_if.config.as_str(),
                "",
            ] {
                ui.label(RichText::new(h).strong());
            }
            ui.end_row();
            for row in &r.ranks {
                let outlier = multi::is_outlier(r, row);
                ui.label(row.rank.to_string());
                if ui
                    .link(RichText::new(&row.file).monospace())
                    .on_hover_text("open this rank")
                    .clicked()
                {
                    open = Some(row.file.clone());
                }
                let peak = RichText::new(format_size(row.peak_reserved_bytes));
                ui.label(if outlier {
                    peak.color(theme::BAD_TEXT).strong()
                } else {
                    peak
                });
                ui.label(format_size(row.peak_allocated_bytes));
                ui.label(format!("{:.1}%", row.fragmentation_at_peak * 100.0));
                match &row.oom {
                    None => ui.label("never"),
                    Some(o) if o.fatal => {
                        ui.colored_label(theme::BAD_TEXT, format!("at event {}", o.event_index))
                    }
                    Some(o) => ui.label(format!("at event {} (caught)", o.event_index)),
                };
                ui.label(
                    row.min_capacity_bytes
                        .map_or_else(|| "-".to_string(), format_size),
                );
                let w = multi::what_if_cell(row);
                ui.colored_label(
                    if row.what_if.served_all {
                        theme::OK_TEXT
                    } else {
                        theme::BAD_TEXT
                    },
                    w,
                );
                ui.label(if outlier { "<- outlier" } else { "" });
                ui.end_row();
            }
        });
        ui.label(format!(
            "median peak reserved: {}",
            format_size(r.median_peak_reserved_bytes)
        ));
    }
    for f in &data.failed {
        ui.colored_label(
            theme::BAD_TEXT,
            format!(
                "rank {} unreadable: {}",
                f.rank,
                crate::gui::views::multi::drawable(&f.error)
            ),
        );
    }
    if let Some(name) = open
        && let Some(f) = app.multi.files.iter().find(|f| f.name == name)
    {
        let f = f.clone();
        app.multi.view = None;
        app.open_bytes(
            f.name,
            f.bytes,
            allocsim_core::capacity::CapacityArg::AsRecorded,
            &[],
        );
    }
}
