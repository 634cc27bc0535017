//! The app's panels: the menu and progress bar, the configuration, search and OOM panel
//! on the left, the timeline and the tabs (memory map, compare, at the peak) in the middle,
//! the status line at the bottom.

use crate::engine::examples::EXAMPLES;
use crate::gui::views::compare::compare_tab_ui;
use crate::gui::views::config::config_ui;
use crate::gui::views::map::tab::{legend_ui, map_tab_ui};
use crate::gui::views::oom::oom_ui;
use crate::gui::views::peak::peak_tab_ui;
use crate::gui::views::search::{search_ui, selection_ui};
use crate::gui::views::timeline::{Axis, Mode, format_seconds, timeline_ui};
use crate::gui::{AllocsimApp, theme};
use allocsim_core::units::format_size;
use egui::{Color32, RichText, Ui};

/// The tab under the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tab {
    /// The memory map of the main configuration.
    Map,
    /// Every configuration side by side, with the summary table.
    Compare,
    /// Live bytes at the peak by call site.
    Peak,
}

/// Synthetic workloads offered in the menu: (SPEC, cap, what it shows).
pub(crate) const WORKLOADS: &[(&str, Option<u64>, &str)] = &[
    (
        "oom-story",
        Some(2_362_232_013),
        "the OOM story, generated (2.2 GiB cap)",
    ),
    (
        "train:steps=30",
        None,
        "transformer training with varying batch and sequence length",
    ),
    (
        "train:steps=30,comm=1",
        None,
        "the same with gradient buckets on a second stream",
    ),
    (
        "kvcache:tokens=500",
        None,
        "greedy decode with a naively growing KV cache",
    ),
    (
        "kvcache:tokens=3000",
        None,
        "the same, over a million events",
    ),
    (
        "churn:events=200000",
        None,
        "random allocations and frees around 1000 live blocks",
    ),
];

/// A panel's usual frame without its fill: the window is cleared to the panel colour
/// ([`crate::gui::AllocsimApp`]'s `clear_color`), so filling every panel again only costs pixels
/// (dear ones on a software rasterizer: see [`super::render::fill_rect`]).
pub(crate) fn unfilled(ui: &Ui, central: bool) -> egui::Frame {
    let style = ui.style();
    let frame = if central {
        egui::Frame::central_panel(style)
    } else {
        egui::Frame::side_top_panel(style)
    };
    frame.fill(egui::Color32::TRANSPARENT)
}

pub(crate) fn top_bar_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    egui::Panel::top("top_bar").frame(unfilled(ui, false)).show(ui, |ui| {
        egui::MenuBar::new().ui(ui, |ui| {
            ui.menu_button("File", |ui| {
                if ui.button("Open snapshot…").clicked() {
                    app.open_file(ui.ctx());
                    ui.close();
                }
                if ui.button("Diff two snapshots…").clicked() {
                    app.multi.view = Some(crate::gui::views::multi::MultiView::Diff);
                    crate::gui::io::open_files_dialog(ui.ctx(), &app.multi.inbox);
                    ui.close();
                }
                if ui.button("Ranks (one snapshot per rank)…").clicked() {
                    app.multi.view = Some(crate::gui::views::multi::MultiView::Ranks);
                    crate::gui::io::open_files_dialog(ui.ctx(), &app.multi.inbox);
                    ui.close();
                }
                                ui.menu_button("Examples", |ui| {
                    for e in EXAMPLES {
                        let r = ui.button(e.file).on_hover_text(e.about);
                        if r.clicked() {
                            app.open_example(e);
                            ui.close();
                        }
                    }
                });
                ui.menu_button("Synthetic workloads", |ui| {
                    for (spec, cap, about) in WORKLOADS {
                        if ui.button(*spec).on_hover_text(*about).clicked() {
                            app.open_workload(spec, *cap);
                            ui.close();
                        }
                    }
                    ui.separator();
                    ui.label("any SPEC (train, kvcache, oom-story, churn):");
                    let r = ui.add(egui::TextEdit::singleline(&mut app.workload_text).hint_text("churn:events=200000,live=500").desired_width(260.0));
                    if r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter)) && !app.workload_text.trim().is_empty() {
                        let spec = app.workload_text.trim().to_string();
                        app.open_workload(&spec, None);
                        ui.close();
                    }
                });
                ui.separator();
                let has = app.doc.as_ref().is_some_and(|d| d.slots.first().is_some_and(|s| s.replay.is_some()));
                if ui.add_enabled(has, egui::Button::new("Export timeline CSV…")).clicked() {
                    app.export_csv();
                    ui.close();
                }
                if ui.add_enabled(has, egui::Button::new("Export compare JSON…")).clicked() {
                    app.export_json();
                    ui.close();
                }
            });
            ui.menu_button("View", |ui| {
                ui.radio_value(&mut app.timeline.mode, Mode::Metrics, "Metric lines");
                ui.radio_value(&mut app.timeline.mode, Mode::Bands, "Every allocation stacked");
                ui.separator();
                ui.radio_value(&mut app.timeline.axis, Axis::Events, "Over events");
                let has_time = app.doc.as_ref().is_some_and(|d| !d.seconds().is_empty());
                ui.add_enabled_ui(has_time, |ui| ui.radio_value(&mut app.timeline.axis, Axis::Time, "Over wall time"));
                ui.separator();
                ui.checkbox(&mut app.timeline.show_allocated, "Allocated");
                ui.checkbox(&mut app.timeline.show_largest_free, "Largest free block");
                ui.checkbox(&mut app.timeline.show_fragmentation, "Fragmentation");
            });
            ui.menu_button("Help", |ui| {
                ui.label("Record a snapshot in your program:");
                ui.monospace("torch.cuda.memory._record_memory_history(max_entries=100000)");
                ui.monospace("torch.cuda.memory._dump_snapshot(\"snapshot.pickle\")");
                ui.label("then drop the file here or use File > Open snapshot…");
                ui.separator();
                ui.label("Left/Right step one event (shift: ten), PageUp/PageDown jump, Home/End");
                ui.label("Timeline: click or drag moves the cursor, wheel zooms, shift+wheel or right-drag pans, double-click shows all");
                ui.label("Memory map: wheel scrolls, ctrl+wheel zooms, drag pans, click selects an allocation");
            });
            ui.separator();
            if let Some(doc) = &app.doc {
                ui.label(RichText::new(&doc.trace.name).strong());
                if !doc.trace.recorded {
                    ui.weak("synthetic workload");
                } else if doc.trace.exact {
                    ui.colored_label(theme::OK_TEXT, "replays exactly").on_hover_text("The PyTorch model reproduces every recorded allocator event of this device");
                } else {
                    let r = ui.colored_label(theme::BAD_TEXT, "differs from the recording");
                    if !doc.trace.notes.is_empty() {
                        r.on_hover_text(doc.trace.notes.join("\n"));
                    }
                }
                if doc.trace.devices.len() > 1 {
                    let cur = doc.trace.device;
                    let mut pick = None;
                    egui::ComboBox::new("device", "").selected_text(format!("device {cur}")).show_ui(ui, |ui| {
                        for (d, (events, _)) in doc.trace.devices.iter().enumerate() {
                            if ui.selectable_label(d as u32 == cur, format!("device {d} ({events} events)")).clicked() {
                                pick = Some(d as u32);
                            }
                        }
                    });
                    if let Some(d) = pick
                        && d != cur
                    {
                        let job = app.job();
                        app.load_job = Some(job);
                        app.engine.send(super::Request::SelectDevice { job, device: d });
                    }
                }
            }
            if let Some((job, stage, f)) = &app.progress {
                let job = *job;
                // Not animated (a repaint every frame): each progress message repaints it.
                ui.add(egui::ProgressBar::new(*f).desired_width(220.0).text(stage.clone()));
                // Opening a file can take a while: it can be stopped. A link, not a button:
                // egui draws one more frame to style a button it had not drawn before,
                // which in the browser is the software rasterizer's CPU beside the decode.
                if app.load_job == Some(job) && app.load_cancellable == Some(job) && ui.link("Cancel").clicked() {
                    app.engine.send(super::Request::Cancel { job });
                }
            } else if app.busy() {
                crate::gui::theme::busy(ui);
            }
        });
        path_prompt_ui(ui, app);
        // Errors, newest last, each dismissable.
        let mut dismiss = None;
        for (i, e) in app.errors.iter().enumerate() {
            egui::Frame::new().fill(theme::ERROR_BG).inner_margin(4.0).show(ui, |ui| {
                ui.horizontal(|ui| {
                    if ui.small_button("×").clicked() {
                        dismiss = Some(i);
                    }
                    ui.colored_label(Color32::WHITE, e);
                });
            });
        }
        if let Some(i) = dismiss {
            app.errors.remove(i);
        }
    });
}

/// The path field offered where no file dialog opens, with the reason.
pub(crate) fn path_prompt_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    let Some(p) = &mut app.path_prompt else {
        return;
    };
    let mut open = false;
    let mut close = false;
    ui.horizontal_wrapped(|ui| {
        if ui.small_button("×").on_hover_text("close").clicked() {
            close = true;
        }
        let label = ui.label("Open the snapshot at");
        let r = ui
            .add(
                egui::TextEdit::singleline(&mut p.text)
                    .hint_text("/path/to/snapshot.pickle")
                    .desired_width(420.0),
            )
            .labelled_by(label.id);
        open = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
        open |= ui.button("Open").clicked();
        ui.weak(format!("(the file dialog could not open: {})", p.reason));
    });
    if close {
        app.path_prompt = None;
    } else if open {
        app.open_typed_path(ui.ctx());
    }
}

pub(crate) fn status_bar_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    egui::Panel::bottom("status").frame(unfilled(ui, false)).show(ui, |ui| {
        ui.horizontal(|ui| {
            let Some(doc) = &app.doc else {
                ui.label("drop a PyTorch memory snapshot (.pickle, .pickle.gz, .json) anywhere, or File > Open snapshot…");
                return;
            };
            let c = app.cursor as usize;
            let ops = &doc.trace.ops;
            ui.label(format!("{} · op {} of {}", ops.event_name(c), c, ops.len()));
            if let Some(t) = doc.seconds().get(c) {
                ui.label(format!("· {}", format_seconds(t)));
            }
            ui.separator();
            if let Some(s) = doc.slots.first()
                && let Some(r) = &s.replay
                && let Some(st) = r.stats_at(c)
            {
                let (reserved, allocated) = (st.reserved_bytes, st.allocated_bytes);
                ui.label(format!(
                    "reserved {} · allocated {} ·",
                    format_size(reserved),
                    format_size(allocated),
                ));
                let largest = st.largest_free_bytes;
                ui.label(format!(
                    "fragmentation {:.0}%",
                    r.fragmentation().get(c).unwrap_or(0.0) * 100.0
                ))
                .on_hover_text(fragmentation_hover(reserved, allocated, largest));
            }
            ui.separator();
            ui.weak(format!("drawn with {}", app.renderer));
            if app.timeline.mode == Mode::Bands {
                ui.weak(format!("· {} of {} bands drawn, the rest folded (grey)", app.timeline.bands_drawn, doc.trace.bands.pieces.len()));
            }
            if let Some(ms) = app.last_load_ms {
                ui.weak(format!("· opened in {ms:.0} ms"));
            }
        });
    });
}

/// What the status line's fragmentation means, with the numbers at the cursor: the
/// formula of `allocsim_core::metrics::fragmentation`.
#[must_use]
pub fn fragmentation_hover(
    reserved_bytes: u64,
    allocated_bytes: u64,
    largest_free_bytes: u64,
) -> String {
    let free = reserved_bytes.saturating_sub(allocated_bytes);
    let definition = "fragmentation = 1 − largest free block / free, over all free blocks \
(free: reserved − allocated); 0 when nothing is free";
    if free == 0 {
        return format!("{definition}\nhere: nothing is free, so 0%");
    }
    let largest = largest_free_bytes.min(free);
    format!(
        "{definition}\nhere: 1 − {} / {} = {:.0}%",
        format_size(largest),
        format_size(free),
        (1.0 - largest as f64 / free as f64) * 100.0
    )
}

/// The side panel's id salt.
pub(crate) const SIDE_PANEL: &str = "side";

/// The side panel's width until the user drags its edge (and again for each new trace).
pub const SIDE_PANEL_WIDTH: f32 = 340.0;

/// The side panel's id (where egui keeps its width).
pub(crate) fn side_panel_id(ui: &Ui) -> egui::Id {
    ui.scope_id().with(SIDE_PANEL)
}

pub(crate) fn side_panel_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    if std::mem::take(&mut app.side_panel_reset) {
        // A new trace: the width the user dragged to goes with the trace before it.
        let id = side_panel_id(ui);
        ui.ctx()
            .data_mut(|d| d.remove::<egui::containers::panel::PanelState>(id));
    }
    let shown = egui::Panel::left(SIDE_PANEL)
        .resizable(true)
        .default_size(SIDE_PANEL_WIDTH)
        .frame(unfilled(ui, false))
        .show(ui, |ui| {
        // Content wider than the panel (a long configuration, a table) is clipped, not
        // allowed to widen the panel: egui keeps a panel as wide as its content once was,
        // for good.
        let rect = ui.available_rect_before_wrap();
        ui.advance_cursor_after_rect(rect);
        let mut ui = ui.new_child(egui::UiBuilder::new().max_rect(rect).layout(*ui.layout()));
        ui.shrink_clip_rect(rect);
        let ui = &mut ui;
        egui::ScrollArea::vertical().show(ui, |ui| {
            config_ui(ui, app);
            ui.separator();
            search_ui(ui, app);
            ui.separator();
            selection_ui(ui, app);
            oom_ui(ui, app);
            #[cfg(feature = "cuda")]
            {
                ui.separator();
                super::views::live::live_section_ui(ui, app);
            }
            if let Some(doc) = &app.doc
                && !doc.trace.notes.is_empty()
            {
                ui.separator();
                ui.collapsing("About this trace", |ui| {
                    if doc.trace.starts_mid_program {
                        ui.label("The ring buffer wrapped: the trace starts mid-program; the blocks alive then were rebuilt from the end state.");
                    }
                    for n in &doc.trace.notes {
                        ui.label(n);
                    }
                });
            }
        });
    });
    app.side_panel_width = shown.response.rect.width();
}

/// A file whose trace is being built: what it records (timeline and end state), drawn as
/// soon as it is decoded.
fn recorded_preview_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    let Some(r) = &app.recorded else { return };
    ui.horizontal_wrapped(|ui| {
        ui.label(RichText::new(&r.name).strong());
        ui.weak("as recorded; building the trace and replaying");
        crate::gui::theme::busy(ui);
    });
    let h = (ui.available_height() * 0.42).max(140.0);
    ui.allocate_ui(egui::vec2(ui.available_width(), h), |ui| {
        crate::gui::views::timeline::recorded::recorded_timeline_ui(
            ui,
            &mut app.timeline,
            r,
            app.wgpu,
        );
    });
    ui.horizontal_wrapped(|ui| {
        crate::gui::views::map::tab::recorded_summary_ui(ui, r);
    });
    crate::gui::views::map::memory_map_ui(
        ui,
        &mut app.map,
        &r.no_ops,
        &r.layout,
        app.wgpu,
        0,
        None,
    );
}

pub(crate) fn central_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    egui::CentralPanel::default()
        .frame(unfilled(ui, true))
        .show(ui, |ui| {
            if app.multi.view.is_some() {
                crate::gui::views::multi::central_ui(ui, app);
                return;
            }
            if app
                .recorded
                .as_ref()
                .is_some_and(|r| app.load_job == Some(r.job))
            {
                recorded_preview_ui(ui, app);
                return;
            }
            if app.doc.is_none() {
                ui.centered_and_justified(|ui| {
                    if app.load_job.is_some() {
                        crate::gui::theme::busy(ui);
                    } else {
                        ui.heading(
                            "Drop a PyTorch memory snapshot here, or open one from the File menu",
                        );
                    }
                });
                return;
            }
            // Wrapped: the legend grows with the live replay's curves, and must not widen
            // the panel past the window.
            ui.horizontal_wrapped(|ui| {
                ui.selectable_value(&mut app.timeline.mode, Mode::Metrics, "Metrics");
                ui.selectable_value(&mut app.timeline.mode, Mode::Bands, "Allocations");
                ui.separator();
                let has_time = app.doc.as_ref().is_some_and(|d| !d.seconds().is_empty());
                ui.selectable_value(&mut app.timeline.axis, Axis::Events, "Events");
                ui.add_enabled_ui(has_time, |ui| {
                    ui.selectable_value(&mut app.timeline.axis, Axis::Time, "Time")
                });
                ui.separator();
                if ui.button("Show all").clicked() {
                    app.timeline.view = None;
                }
                legend_ui(ui, app);
            });
            let h = (ui.available_height() * 0.42).max(140.0);
            let mut tl_input = None;
            ui.allocate_ui(egui::vec2(ui.available_width(), h), |ui| {
                if let Some(doc) = &app.doc {
                    tl_input = Some(timeline_ui(
                        ui,
                        &mut app.timeline,
                        doc,
                        app.cursor,
                        app.wgpu,
                        &app.bands_highlight,
                    ));
                }
            });
            if let Some(inp) = tl_input {
                if let Some(c) = inp.cursor {
                    app.set_cursor(c);
                }
                if let Some(a) = inp.picked_alloc {
                    app.selected_alloc = Some(a);
                    app.refresh_highlight();
                }
            }
            ui.horizontal(|ui| {
                ui.selectable_value(&mut app.tab, Tab::Map, "Memory map");
                ui.selectable_value(&mut app.tab, Tab::Compare, "Compare");
                ui.selectable_value(&mut app.tab, Tab::Peak, "At the peak");
            });
            match app.tab {
                Tab::Map => map_tab_ui(ui, app),
                Tab::Compare => compare_tab_ui(ui, app),
                Tab::Peak => peak_tab_ui(ui, app),
            }
        });
}
