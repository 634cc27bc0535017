//! "What would fit?": `recommend`'s sweep of PyTorch's settings and its trade-offs, and the
//! other runtimes; their state, [`WhatIf`] and [`Runtimes`].

use crate::engine::wire::{WhatIfData, WhatIfRow};
use crate::gui::state::Slot;
use crate::gui::views::config::capacity_phrase;
use crate::gui::{AllocsimApp, theme};
use allocsim_core::units::format_size;
use egui::{RichText, Ui};

/// What would have fit at the capacity: the compared configurations that serve every
/// request, the what-if (PyTorch's options and the other allocators, asked for as soon as
/// the main configuration runs out of memory), and each failing configuration's smallest
/// capacity. Returns a configuration the user chose to compare.
pub(crate) fn would_fit_ui(ui: &mut Ui, app: &mut AllocsimApp) -> Option<String> {
    let doc = app.doc.as_ref()?;
    ui.add_space(6.0);
    ui.label(
        RichText::new(format!(
            "Would have fit at {}",
            capacity_phrase(&app.config)
        ))
        .strong(),
    );
    let served = |s: &Slot| {
        s.replay
            .as_ref()
            .is_some_and(|r| r.data.summary.ooms.is_empty())
    };
    for s in doc.slots.iter().filter(|s| served(s)) {
        ui.colored_label(
            theme::OK_TEXT,
            format!(
                "{} fits (peak reserved {})",
                s.spec,
                format_size(
                    s.replay
                        .as_ref()
                        .map_or(0, |r| r.data.summary.peak_reserved_bytes)
                )
            ),
        );
    }
    let mut add = None;
    let mut ask = false;
    let mut cancel = false;
    let cap = app.config.capacity_bytes();
    let sweep_hint = "Sweep PyTorch's settings (PYTORCH_CUDA_ALLOC_CONF) under this cap: the best by driver time, then peak reserved; other allocators are on the Compare tab";
    match app.what_if.as_ref().filter(|w| w.capacity_bytes == cap) {
        None => {
            ask = ui
                .button("What would fit?")
                .on_hover_text(sweep_hint)
                .clicked();
        }
        Some(w) if w.running() => {
            crate::gui::io::mark_search("running");
            crate::gui::io::mark_repaint(ui.ctx());
            ui.horizontal(|ui| {
                let (stage, f) = w
                    .progress
                    .clone()
                    .unwrap_or_else(|| ("trying PyTorch's settings…".into(), 0.0));
                // Not animated: each replay's progress repaints it, and an animation would
                // repaint the window every frame, which a software rasterizer (the browser
                // without a GPU) pays a core for, taken from the sweep.
                ui.add(egui::ProgressBar::new(f).desired_width(200.0).text(stage));
                cancel = ui
                    .button("Cancel")
                    .on_hover_text("stop the sweep (Esc)")
                    .clicked();
            });
        }
        Some(w) => {
            crate::gui::io::mark_search(if w.cancelled {
                "cancelled"
            } else if w.error.is_some() {
                "failed"
            } else {
                "done"
            });
            if w.cancelled {
                ui.horizontal(|ui| {
                    ui.weak("the sweep was cancelled");
                    ask = ui
                        .button("What would fit?")
                        .on_hover_text(sweep_hint)
                        .clicked();
                });
            } else if let Some(e) = &w.error {
                ui.colored_label(theme::BAD_TEXT, e);
                ask = ui
                    .button("What would fit?")
                    .on_hover_text(sweep_hint)
                    .clicked();
            } else if let Some(a) = &w.answer {
                add = tradeoffs_ui(ui, a);
            }
        }
    }
    // The smallest capacity at which each failing configuration serves every request.
    for s in doc
        .slots
        .iter()
        .filter(|s| s.replay.is_some() && !served(s))
    {
        match &s.min_capacity {
            Some(Ok(b)) => {
                ui.label(format!(
                    "{}: every request served from {} (min capacity)",
                    s.spec,
                    format_size(*b)
                ));
            }
            Some(Err(e)) => {
                ui.weak(format!("{}: no capacity serves every request", s.spec))
                    .on_hover_text(e);
            }
            None => {}
        }
    }
    if ask {
        app.request_what_if();
    }
    if cancel {
        app.cancel_what_if();
    }
    add
}

/// A PyTorch setting as a user writes it: the `PYTORCH_CUDA_ALLOC_CONF` of a `pytorch@…`
/// spec, "defaults" for `pytorch` alone.
pub(crate) fn setting_of(spec: &str) -> &str {
    match spec.strip_prefix("pytorch@") {
        Some(conf) => conf,
        None if spec == "pytorch" => "defaults",
        None => spec,
    }
}

/// A predicted driver time: "850 µs", "12.4 ms", "1.52 s".
#[must_use]
pub fn format_driver_time(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// `recommend`'s trade-off table: the snapshot's own settings, then the best PyTorch
/// settings in rank order — peak reserved, headroom to the cap, segment operations,
/// synchronizing operations and their predicted driver time. Returns a setting the user
/// chose to compare.
pub(crate) fn tradeoffs_ui(ui: &mut Ui, a: &WhatIfData) -> Option<String> {
    let mut add = None;
    if a.candidates_fitting > 0 {
        ui.label(format!(
            "{} of {} PyTorch settings serve every request ({} replayed; the others act alike on this trace)",
            a.candidates_fitting, a.candidates_tried, a.candidates_replayed
        ));
    } else {
        ui.colored_label(
            theme::BAD_TEXT,
            format!(
                "none of the {} PyTorch settings swept serves every request here",
                a.candidates_tried
            ),
        );
    }
    // Two lines a setting (the panel is narrow): the setting, then its cost.
    let rows = a
        .recorded
        .iter()
        .map(|r| (r, true))
        .chain(a.tradeoffs.iter().map(|r| (r, false)));
    for (r, recorded) in rows {
        ui.horizontal_wrapped(|ui| {
            if r.recommended {
                ui.colored_label(theme::OK_TEXT, "best").on_hover_text(
                    "serves every request with the least predicted driver time, then the lowest peak (recommend)",
                );
            } else if r.fits {
                ui.colored_label(theme::OK_TEXT, "fits");
            } else {
                let oom = r
                    .oom_event
                    .map_or_else(|| "OOM".to_string(), |e| format!("OOM at event {e}"));
                ui.colored_label(theme::BAD_TEXT, oom);
            }
            let setting = if recorded {
                format!("as recorded ({})", setting_of(&r.spec))
            } else {
                setting_of(&r.spec).to_string()
            };
            if ui
                .link(RichText::new(setting).monospace())
                .on_hover_text(format!("compare {}", r.spec))
                .clicked()
            {
                add = Some(r.spec.clone());
            }
        });
        let headroom = match a.capacity_bytes {
            // Up to its OOM, a failing replay's peak says nothing of the headroom.
            _ if !r.fits => "none".into(),
            Some(c) if c >= r.peak_reserved_bytes => format_size(c - r.peak_reserved_bytes),
            Some(_) => "none".into(),
            None => "no cap".into(),
        };
        ui.weak(format!(
            "    peak {} · headroom {headroom} · {} segment ops ({} sync ops) · driver time {}",
            format_size(r.peak_reserved_bytes),
            r.segment_ops,
            r.synchronizing_ops,
            format_driver_time(r.driver_time_us)
        ))
        .on_hover_text(
            "segment ops: cudaMalloc and cudaFree calls; sync ops: those that synchronize the device (each cudaFree, each unmapping); driver time: their predicted time (core's cost table)",
        );
    }
    add
}

/// The other runtimes under the cap: allocators a PyTorch program cannot switch to by a
/// setting (asked for once the section is opened). Returns a runtime the user chose to
/// compare.
pub(crate) fn other_runtimes_ui(ui: &mut Ui, app: &mut AllocsimApp) -> Option<String> {
    let mut add = None;
    let r = egui::CollapsingHeader::new("Other runtimes")
        .id_salt("other_runtimes")
        .show(ui, |ui| {
            app.request_runtimes();
            ui.weak("allocators of other runtimes and libraries, under the same cap: not a PyTorch setting");
            match app.runtimes.as_ref().and_then(|r| r.rows.as_ref()) {
                None => {
                    crate::gui::theme::busy(ui);
                }
                Some(Err(e)) => {
                    ui.colored_label(theme::BAD_TEXT, e);
                }
                Some(Ok(rows)) => {
                    egui::Grid::new("runtimes")
                        .striped(true)
                        .num_columns(3)
                        .show(ui, |ui| {
                            for h in ["runtime", "peak reserved", "result"] {
                                ui.label(RichText::new(h).strong());
                            }
                            ui.end_row();
                            for r in rows {
                                if ui
                                    .link(RichText::new(&r.spec).monospace())
                                    .on_hover_text("compare it")
                                    .clicked()
                                {
                                    add = Some(r.spec.clone());
                                }
                                ui.label(format_size(r.peak_reserved_bytes));
                                if r.fits {
                                    ui.colored_label(theme::OK_TEXT, "fits");
                                } else {
                                    ui.colored_label(
                                        theme::BAD_TEXT,
                                        r.oom_event.map_or_else(
                                            || "OOM".to_string(),
                                            |e| format!("OOM at event {e}"),
                                        ),
                                    );
                                }
                                ui.end_row();
                            }
                        });
                }
            }
        });
    r.header_response
        .on_hover_text("Allocators a PyTorch program cannot switch to by PYTORCH_CUDA_ALLOC_CONF");
    add
}

/// A what-if job ("What would fit?"): the capacity it asked about, its progress, and
/// `recommend`'s trade-off table once answered.
#[derive(Debug)]
pub struct WhatIf {
    pub job: u64,
    pub capacity_bytes: Option<u64>,
    /// The stage and fraction of the sweep, while it runs.
    pub progress: Option<(String, f32)>,
    pub answer: Option<WhatIfData>,
    /// Stopped by the user (its answer, if any comes, is dropped).
    pub cancelled: bool,
    pub error: Option<String>,
}

impl WhatIf {
    /// Whether the sweep still runs.
    #[must_use]
    pub fn running(&self) -> bool {
        self.answer.is_none() && !self.cancelled && self.error.is_none()
    }
}

/// The other runtimes under a capacity (the Compare tab), asked for once per capacity.
#[derive(Debug)]
pub struct Runtimes {
    pub job: u64,
    pub capacity_bytes: Option<u64>,
    pub rows: Option<Result<Vec<WhatIfRow>, String>>,
}
