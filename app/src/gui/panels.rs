//! The app's panels: the menu and progress bar, the configuration, search and OOM panel
//! on the left, the timeline and the tabs (memory map, compare, at the peak) in the middle,
//! the status line at the bottom.

use egui::{Color32, RichText, Ui};

use super::engine::wire::{NO_OP, OomData, WhatIfData};
use super::examples::EXAMPLES;
use super::memory_map::memory_map_ui;
use super::state::{self, Slot};
use super::timeline::{Axis, Mode, format_seconds, timeline_ui};
use super::{AllocsimApp, ConfigState, oom_at, theme};
use allocsim_core::capacity::{BoundKind, CapacityArg, CapacityChoice};
use allocsim_core::explain::{BlockerKind, Explanation};
use allocsim_core::models::MODEL_NAMES;
use allocsim_core::units::format_size;

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
const WORKLOADS: &[(&str, Option<u64>, &str)] = &[
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

/// Memory caps offered next to free entry: common GPU sizes.
const CAPACITIES: &[(&str, u64)] = &[
    ("8 GiB", 8 << 30),
    ("16 GiB (V100, T4)", 16 << 30),
    ("24 GiB (RTX 4090, A10)", 24 << 30),
    ("40 GiB (A100 40GB)", 40 << 30),
    ("48 GiB (L40S, A6000)", 48 << 30),
    ("80 GiB (A100, H100)", 80 << 30),
    ("94 GiB (H100 NVL)", 94 << 30),
    ("139.8 GiB (H200)", 150_109_880_320),
    ("192 GiB (B200)", 192 << 30),
];

/// A panel's usual frame without its fill: the window is cleared to the panel colour
/// ([`super::AllocsimApp`]'s `clear_color`), so filling every panel again only costs pixels
/// (dear ones on a software rasterizer: see [`super::render::fill_rect`]).
fn unfilled(ui: &Ui, central: bool) -> egui::Frame {
    let style = ui.style();
    let frame = if central {
        egui::Frame::central_panel(style)
    } else {
        egui::Frame::side_top_panel(style)
    };
    frame.fill(egui::Color32::TRANSPARENT)
}

pub(super) fn top_bar_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    egui::Panel::top("top_bar").frame(unfilled(ui, false)).show(ui, |ui| {
        egui::MenuBar::new().ui(ui, |ui| {
            ui.menu_button("File", |ui| {
                if ui.button("Open snapshot…").clicked() {
                    app.open_file(ui.ctx());
                    ui.close();
                }
                if ui.button("Diff two snapshots…").clicked() {
                    app.multi.view = Some(crate::gui::views::MultiView::Diff);
                    crate::gui::io::open_files_dialog(ui.ctx(), &app.multi.inbox);
                    ui.close();
                }
                if ui.button("Ranks (one snapshot per rank)…").clicked() {
                    app.multi.view = Some(crate::gui::views::MultiView::Ranks);
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
                let has_time = app.doc.as_ref().is_some_and(|d| !d.seconds.is_empty());
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
            if let Some((_, stage, f)) = &app.progress {
                ui.add(egui::ProgressBar::new(*f).desired_width(220.0).text(stage.clone()).animate(true));
            } else if app.busy() {
                ui.spinner();
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
fn path_prompt_ui(ui: &mut Ui, app: &mut AllocsimApp) {
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

pub(super) fn status_bar_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    egui::Panel::bottom("status").frame(unfilled(ui, false)).show(ui, |ui| {
        ui.horizontal(|ui| {
            let Some(doc) = &app.doc else {
                ui.label("drop a PyTorch memory snapshot (.pickle, .pickle.gz, .json) anywhere, or File > Open snapshot…");
                return;
            };
            let c = app.cursor as usize;
            let ops = &doc.trace.ops;
            ui.label(format!("event {} · op {} of {}", ops.event_index.get(c).copied().unwrap_or(0), c, ops.len()));
            if let Some(t) = doc.seconds.get(c) {
                ui.label(format!("· {}", format_seconds(*t)));
            }
            ui.separator();
            if let Some(s) = doc.slots.first()
                && let Some(r) = &s.replay
                && c < r.len()
            {
                let (reserved, allocated) = (r.data.reserved_bytes[c], r.data.allocated_bytes[c]);
                ui.label(format!(
                    "reserved {} · allocated {} ·",
                    format_size(reserved),
                    format_size(allocated),
                ));
                let largest = r.data.largest_free_bytes.get(c).copied().unwrap_or(0);
                ui.label(format!(
                    "fragmentation {:.0}%",
                    r.fragmentation.get(c).unwrap_or(0.0) * 100.0
                ))
                .on_hover_text(fragmentation_hover(reserved, allocated, largest));
            }
            ui.separator();
            ui.weak(format!("drawn with {}", app.renderer));
            if app.timeline.mode == Mode::Bands {
                ui.weak(format!("· {} of {} bands drawn", app.timeline.bands_drawn, doc.trace.bands.pieces.len()));
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
const SIDE_PANEL: &str = "side";

/// The side panel's width until the user drags its edge (and again for each new trace).
pub const SIDE_PANEL_WIDTH: f32 = 340.0;

/// The side panel's id (where egui keeps its width).
fn side_panel_id(ui: &Ui) -> egui::Id {
    ui.scope_id().with(SIDE_PANEL)
}

pub(super) fn side_panel_ui(ui: &mut Ui, app: &mut AllocsimApp) {
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
                super::live::live_section_ui(ui, app);
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

fn config_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    ui.heading("Configuration");
    let mut changed = false;
    ui.horizontal(|ui| {
        egui::ComboBox::new("model", "allocator")
            .selected_text(app.config.model.clone())
            .show_ui(ui, |ui| {
                for m in MODEL_NAMES {
                    changed |= ui
                        .selectable_value(&mut app.config.model, (*m).to_string(), *m)
                        .changed();
                }
            });
    });
    ui.label("PYTORCH_CUDA_ALLOC_CONF");
    let recorded = app
        .doc
        .as_ref()
        .map(|d| d.trace.recorded_conf.clone())
        .unwrap_or_default();
    let hint = if recorded.is_empty() {
        "as recorded (defaults)".to_string()
    } else {
        format!("as recorded ({recorded})")
    };
    let r = ui.add(
        egui::TextEdit::singleline(&mut app.config.conf)
            .hint_text(hint)
            .desired_width(f32::INFINITY),
    );
    if r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter)) {
        changed = true;
    }
    if let Some(arg) = capacity_ui(ui, app) {
        app.set_capacity(arg);
    }
    ui.add_space(4.0);
    ui.label(RichText::new("Compared").strong());
    let specs = app.config.specs();
    let mut remove = None;
    for (i, spec) in specs.iter().enumerate() {
        ui.horizontal_wrapped(|ui| {
            let (rect, _) = ui.allocate_exact_size(egui::vec2(12.0, 12.0), egui::Sense::hover());
            ui.painter().rect_filled(rect, 2.0, theme::slot(i));
            let status = app
                .doc
                .as_ref()
                .and_then(|d| d.slots.get(i))
                .map_or(String::new(), slot_status);
            ui.label(RichText::new(spec).monospace());
            ui.weak(status);
            if i > 0
                && ui
                    .small_button("×")
                    .on_hover_text("stop comparing")
                    .clicked()
            {
                remove = Some(i - 1);
            }
        });
    }
    if let Some(i) = remove {
        app.config.compare.remove(i);
        changed = true;
    }
    ui.horizontal(|ui| {
        let r = ui.add(
            egui::TextEdit::singleline(&mut app.config.add_text)
                .hint_text("pytorch@max_split_size_mb:128")
                .desired_width(200.0),
        );
        let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
        if (ui
            .button("Add")
            .on_hover_text("compare this configuration too")
            .clicked()
            || enter)
            && !app.config.add_text.trim().is_empty()
        {
            match allocsim_core::models::ModelSpec::parse(app.config.add_text.trim()) {
                Ok(s) => {
                    app.config.compare.push(s.label());
                    app.config.add_text.clear();
                    changed = true;
                }
                Err(e) => app.errors.push(e.to_string()),
            }
        }
    });
    if changed {
        app.resimulate();
    }
}

/// The capacity control: as recorded (with where it was inferred from), the cap the
/// program set where known, the whole GPU, common GPU sizes, or a typed size. Returns the
/// capacity chosen this frame.
fn capacity_ui(ui: &mut Ui, app: &mut AllocsimApp) -> Option<CapacityArg> {
    let mut chosen = None;
    let recorded = app
        .doc
        .as_ref()
        .and_then(|d| d.trace.recorded_capacity.clone());
    let config = &app.config;
    ui.horizontal(|ui| {
        egui::ComboBox::new("capacity", "memory cap")
            .selected_text(capacity_label(config))
            .show_ui(ui, |ui| {
                if let Some(b) = recorded.as_ref().and_then(|r| r.bytes) {
                    let r = ui.selectable_label(
                        config.capacity_arg == CapacityArg::AsRecorded,
                        format!("as recorded: {}", format_size(b)),
                    );
                    let r = match recorded.as_ref().and_then(|r| r.note.as_ref()) {
                        Some(note) => r.on_hover_text(note),
                        None => r,
                    };
                    if r.clicked() {
                        chosen = Some(CapacityArg::AsRecorded);
                    }
                }
                if let Some(b) = config.program_cap_bytes
                    && ui
                        .selectable_label(
                            config.capacity_arg == CapacityArg::Bytes(b),
                            format!("set by the program: {}", format_size(b)),
                        )
                        .on_hover_text(
                            "the cap the recorded program set (set_per_process_memory_fraction × total memory)",
                        )
                        .clicked()
                {
                    chosen = Some(CapacityArg::Bytes(b));
                }
                if ui
                    .selectable_label(config.capacity_bytes().is_none(), "whole GPU (no cap)")
                    .clicked()
                {
                    chosen = Some(CapacityArg::Unlimited);
                }
                for (label, bytes) in CAPACITIES {
                    if ui
                        .selectable_label(config.capacity_arg == CapacityArg::Bytes(*bytes), *label)
                        .clicked()
                    {
                        chosen = Some(CapacityArg::Bytes(*bytes));
                    }
                }
            });
    });
    // Where the capacity as recorded came from, or why none could be inferred.
    if config.capacity_arg == CapacityArg::AsRecorded
        && let Some(note) = &config.capacity.note
    {
        match inferred_from(&config.capacity) {
            Some(from) => ui.weak(from).on_hover_text(note),
            None => ui.weak(note),
        };
    }
    let r = ui
        .horizontal(|ui| {
            let label = ui.label("or type");
            ui.add(
                egui::TextEdit::singleline(&mut app.config.capacity_text)
                    .hint_text("2.2GiB, 24GB, none; empty: as recorded")
                    .desired_width(f32::INFINITY),
            )
            .labelled_by(label.id)
        })
        .inner;
    if r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter)) {
        let t = app.config.capacity_text.trim().to_string();
        if t.is_empty() {
            chosen = Some(CapacityArg::AsRecorded);
        } else {
            match CapacityArg::parse(&t) {
                Ok(CapacityArg::Bytes(0)) => app
                    .errors
                    .push("the memory cap must be more than 0 bytes".into()),
                Ok(arg) => chosen = Some(arg),
                Err(e) => app.errors.push(e),
            }
        }
    }
    chosen
}

/// The capacity as the control shows it: "as recorded: 78.50 GiB", "whole GPU", a size.
#[must_use]
pub fn capacity_label(config: &ConfigState) -> String {
    match (config.capacity_arg, config.capacity.bytes) {
        (_, None) => "whole GPU".to_string(),
        (CapacityArg::AsRecorded, Some(b)) => format!("as recorded: {}", format_size(b)),
        (_, Some(b)) => format_size(b),
    }
}

/// The capacity in a sentence: "78.50 GiB (as recorded)", "the whole GPU", a size.
fn capacity_phrase(config: &ConfigState) -> String {
    match (config.capacity_arg, config.capacity.bytes) {
        (_, None) => "the whole GPU".to_string(),
        (CapacityArg::AsRecorded, Some(b)) => format!("{} (as recorded)", format_size(b)),
        (_, Some(b)) => format_size(b),
    }
}

/// Where an inferred capacity came from, in a few words: "from the OOM report at event
/// 933" (the full line is the choice's note).
#[must_use]
pub fn inferred_from(c: &CapacityChoice) -> Option<String> {
    let iv = c.inferred?;
    let what = match iv.high_kind {
        BoundKind::OomDeviceFree | BoundKind::OomRequest => "the OOM report",
        k => k.describe(),
    };
    Some(format!("from {what} at event {}", iv.high_event))
}

fn slot_status(s: &Slot) -> String {
    if s.replay_job.is_some() {
        return "replaying…".into();
    }
    if s.error.is_some() {
        return "failed".into();
    }
    match &s.replay {
        Some(r) => match &r.data.summary.oom {
            Some(_) => format!(
                "OOM · peak {}",
                format_size(r.data.summary.peak_reserved_bytes)
            ),
            None => format!(
                "fits · peak {}",
                format_size(r.data.summary.peak_reserved_bytes)
            ),
        },
        None => String::new(),
    }
}

fn search_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    let heading = ui.heading("Search");
    let r = ui
        .add(
            egui::TextEdit::singleline(&mut app.search.text)
                .hint_text("0x7f3a… address, file.py:42 or stack text")
                .desired_width(f32::INFINITY),
        )
        .labelled_by(heading.id);
    if r.changed() {
        app.search.site = None;
        app.apply_search();
    }
    let Some(doc) = &app.doc else { return };
    let mut jump = None;
    if let Some(a) = app.search.addr {
        let here: Vec<String> = doc
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let l = s.layout.as_ref()?;
                let (si, bi) = l.find_address(a)?;
                let b = &l.data.blocks[bi];
                Some(format!(
                    "{}: in segment {:#x}, block {:#x} ({})",
                    i,
                    l.data.segments[si].addr,
                    b.addr,
                    format_size(b.size_bytes)
                ))
            })
            .collect();
        if here.is_empty() {
            ui.weak(format!("{a:#x} is not in reserved memory at this event"));
        }
        for h in here {
            ui.label(h);
        }
        if app.search.job.is_some() {
            ui.spinner();
        } else {
            ui.label(format!(
                "{} allocations held {a:#x} during the trace",
                app.search.hits.len()
            ));
            egui::ScrollArea::vertical()
                .id_salt("hits")
                .max_height(140.0)
                .show(ui, |ui| {
                    for h in app.search.hits.iter().take(200) {
                        let ev = doc
                            .trace
                            .ops
                            .event_index
                            .get(h.alloc as usize)
                            .copied()
                            .unwrap_or(0);
                        if ui
                            .link(format!(
                                "event {ev}: {:#x}, {}",
                                h.addr,
                                format_size(h.size_bytes)
                            ))
                            .clicked()
                        {
                            jump = Some(h.alloc);
                        }
                    }
                });
        }
    } else if let Some(stacks) = &app.search.stacks {
        let c = app.cursor;
        let (n, bytes) = (0..=c as usize)
            .filter(|&a| {
                doc.trace.ops.live_after(a, c as usize) && stacks.contains(&doc.trace.ops.stack[a])
            })
            .fold((0u32, 0u64), |(n, b), a| {
                (n + 1, b + doc.trace.ops.size_bytes[a])
            });
        ui.label(format!(
            "{} call sites match; {n} of their allocations ({}) are live here",
            stacks.len(),
            format_size(bytes)
        ));
    }
    if let Some(a) = jump {
        app.set_cursor(a);
        app.selected_alloc = Some(a);
        app.refresh_highlight();
        if let Some(doc) = &app.doc {
            app.timeline.reveal(doc, a);
        }
    }
}

fn selection_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    let (Some(a), Some(doc)) = (app.selected_alloc, &app.doc) else {
        return;
    };
    let ops = &doc.trace.ops;
    let Some(&size) = ops.size_bytes.get(a as usize) else {
        return;
    };
    ui.heading("Selected allocation");
    ui.label(format!(
        "{} requested at event {}",
        format_size(size),
        ops.event_index.get(a as usize).copied().unwrap_or(0)
    ));
    let mut go = None;
    ui.horizontal(|ui| {
        if ui.button("Go to alloc").clicked() {
            go = Some(a);
        }
        if let Some(&f) = ops.link.get(a as usize)
            && f != NO_OP
            && ui.button("Go to free").clicked()
        {
            go = Some(f);
        }
        if ui.button("Clear").clicked() {
            app.selected_alloc = None;
        }
    });
    for f in doc
        .trace
        .stacks
        .format(ops.stack.get(a as usize).copied().unwrap_or(0))
        .iter()
        .take(12)
    {
        ui.monospace(f);
    }
    if let Some(op) = go {
        app.set_cursor(op);
        if let Some(doc) = &app.doc {
            app.timeline.reveal(doc, op);
        }
    }
    if app.selected_alloc.is_none() {
        app.refresh_highlight();
    }
    ui.separator();
}

/// What happened at an OOM, in PyTorch's terms.
fn oom_status(o: &OomData) -> &'static str {
    if o.fatal {
        "the program would have died here"
    } else {
        "as recorded: the program caught it and went on"
    }
}

/// "OOM explained": the main configuration's OOM at the cursor — PyTorch's sentence, then
/// ours and the numbers behind it — the other configurations' OOMs in a line each, then
/// what would have fit at this capacity.
fn oom_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    let Some(doc) = &app.doc else { return };
    let ooms = |s: &Slot| -> Option<Vec<OomData>> {
        let o = &s.replay.as_ref()?.data.summary.ooms;
        (!o.is_empty()).then(|| o.clone())
    };
    let failing: Vec<(usize, Vec<OomData>, String)> = doc
        .slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Some((i, ooms(s)?, s.spec.clone())))
        .collect();
    if failing.is_empty() {
        return;
    }
    ui.heading(RichText::new("OOM explained").color(theme::OOM));
    let mut go = None;
    let mut go_event = None;
    for (i, ooms, spec) in &failing {
        let shown = oom_at(ooms, app.cursor);
        let o = &ooms[shown];
        ui.horizontal_wrapped(|ui| {
            let (rect, _) = ui.allocate_exact_size(egui::vec2(12.0, 12.0), egui::Sense::hover());
            ui.painter().rect_filled(rect, 2.0, theme::slot(*i));
            ui.label(RichText::new(spec).monospace());
            if *i > 0 {
                // Another compared configuration: a line, its explanation on hover.
                if ui
                    .link(format!("OOM at event {}", o.event_index))
                    .on_hover_text(&o.explanation)
                    .clicked()
                {
                    go = Some(o.op_index);
                }
                if ooms.len() > 1 {
                    ui.weak(format!("(and {} more)", ooms.len() - 1));
                }
            }
        });
        if *i > 0 {
            continue;
        }
        if ooms.len() > 1 {
            ui.horizontal_wrapped(|ui| {
                ui.label(format!("{} OOMs:", ooms.len()));
                for (k, x) in ooms.iter().enumerate().take(50) {
                    if ui
                        .selectable_label(k == shown, format!("event {}", x.event_index))
                        .clicked()
                    {
                        go = Some(x.op_index);
                    }
                }
                if ooms.len() > 50 {
                    ui.weak("…");
                }
            });
        }
        ui.label(RichText::new(format!("At event {}: {}", o.event_index, oom_status(o))).strong());
        if let Some(m) = &o.pytorch_message {
            ui.label(RichText::new(m).color(theme::BAD_TEXT));
        }
        let explained = app.explained.as_ref().and_then(|x| {
            let (op, e) = x.explanation()?;
            (op == o.op_index).then_some(e)
        });
        match explained {
            Some(e) => ui.label(format!("{}.", e.sentence)),
            None => ui.label(&o.explanation),
        };
        egui::Grid::new(("oom", *i)).num_columns(2).show(ui, |ui| {
            ui.label("requested");
            ui.label(format_size(o.requested_bytes));
            ui.end_row();
            ui.label("reserved");
            ui.label(format_size(o.reserved_bytes));
            ui.end_row();
            ui.label("free in the cache");
            ui.label(format!(
                "{} in {} holes",
                format_size(o.free_bytes),
                o.free_holes
            ));
            ui.end_row();
            ui.label("largest hole");
            ui.label(format_size(o.largest_free_bytes));
            ui.end_row();
        });
        if app.cursor != o.op_index && ui.link(format!("go to event {}", o.event_index)).clicked() {
            go = Some(o.op_index);
        }
        match (&app.explained, explained) {
            (_, Some(e)) => go_event = explanation_ui(ui, e).or(go_event),
            (Some(x), None) if matches!(x.answer, Some(Err(_))) => {
                if let Some(Err(m)) = &x.answer {
                    ui.colored_label(theme::BAD_TEXT, format!("cannot explain it: {m}"));
                }
            }
            _ => {
                ui.horizontal(|ui| {
                    ui.spinner();
                    ui.label("finding the holes and the blockers…");
                });
            }
        }
    }
    let add = would_fit_ui(ui, app);
    if let Some(ev) = go_event {
        app.go_to_event(ev);
    }
    if let Some(op) = go {
        app.set_cursor(op);
        if let Some(doc) = &app.doc {
            app.timeline.reveal(doc, op);
        }
    }
    if let Some(spec) = add
        && !app.config.specs().contains(&spec)
    {
        app.config.compare.push(spec);
        app.resimulate();
    }
}

/// What would have fit at the capacity: the compared configurations that serve every
/// request, the what-if (PyTorch's options and the other allocators, asked for as soon as
/// the main configuration runs out of memory), and each failing configuration's smallest
/// capacity. Returns a configuration the user chose to compare.
fn would_fit_ui(ui: &mut Ui, app: &mut AllocsimApp) -> Option<String> {
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
            ui.horizontal(|ui| {
                let (stage, f) = w
                    .progress
                    .clone()
                    .unwrap_or_else(|| ("trying PyTorch's settings…".into(), 0.0));
                ui.add(
                    egui::ProgressBar::new(f)
                        .desired_width(200.0)
                        .text(stage)
                        .animate(true),
                );
                cancel = ui
                    .button("Cancel")
                    .on_hover_text("stop the sweep")
                    .clicked();
            });
        }
        Some(w) => {
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
fn setting_of(spec: &str) -> &str {
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
fn tradeoffs_ui(ui: &mut Ui, a: &WhatIfData) -> Option<String> {
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

/// The explanation's holes, blockers and bounds (`allocsim explain`), below PyTorch's
/// sentence. Returns an event the user clicked (the free that opened a hole, the
/// allocation of a blocker).
fn explanation_ui(ui: &mut Ui, e: &Explanation) -> Option<u64> {
    let mut go = None;
    ui.add_space(4.0);
    ui.label(
        RichText::new(format!(
            "Holes of its pool and stream: {} holes, {} free, the largest {}",
            e.holes_count,
            format_size(e.holes_bytes),
            format_size(e.largest_hole_bytes)
        ))
        .strong(),
    );
    for h in e.holes.iter().take(HOLES_SHOWN) {
        ui.horizontal_wrapped(|ui| {
            ui.label(format!("{} at {:#x}", format_size(h.bytes), h.addr));
            match h.opened_at_event {
                Some(ev) => {
                    let mut tip = h
                        .freed_block_site
                        .as_ref()
                        .map(|s| format!("the freed block was allocated at {s}\n"))
                        .unwrap_or_default();
                    tip.push_str(&h.frames.join("\n"));
                    let r = ui.link(format!("opened by the free at event {ev}"));
                    let r = if tip.is_empty() {
                        r
                    } else {
                        r.on_hover_text(tip)
                    };
                    if r.clicked() {
                        go = Some(ev);
                    }
                }
                None => {
                    ui.weak("never freed into since its segment was created");
                }
            }
        });
    }
    if e.holes_count > HOLES_SHOWN {
        ui.weak(format!("… and {} more", e.holes_count - HOLES_SHOWN));
    }
    ui.add_space(4.0);
    match &e.blocker_set {
        Some(set) => {
            let word = if set.blocks == 1 { "block" } else { "blocks" };
            let line = match set.kind {
                BlockerKind::Window => format!(
                    "Blockers: {} live {word} ({}); removing them would leave a free run of {} in the {} segment at {:#x}",
                    set.blocks,
                    format_size(set.bytes),
                    format_size(set.would_free_contiguous_bytes),
                    format_size(set.segment_bytes),
                    set.segment_addr
                ),
                BlockerKind::Release => format!(
                    "Blockers: {} live {word} ({}) keep the {} segment at {:#x} from being released; without them {} could be had",
                    set.blocks,
                    format_size(set.bytes),
                    format_size(set.segment_bytes),
                    set.segment_addr,
                    format_size(set.would_free_contiguous_bytes)
                ),
            };
            ui.label(RichText::new(line).strong().color(theme::BLOCKER));
        }
        None if e.fits_without_blockers => {
            ui.label("No blockers: the request fits once the cached segments are released");
        }
        None => {
            ui.weak("No blockers: no set of live blocks in one segment would make room");
        }
    }
    for b in &e.blockers {
        ui.horizontal_wrapped(|ui| {
            let (rect, _) = ui.allocate_exact_size(egui::vec2(10.0, 10.0), egui::Sense::hover());
            ui.painter().rect_filled(rect, 1.0, theme::BLOCKER);
            let r = ui
                .link(RichText::new(&b.site).monospace().strong())
                .on_hover_text("go to the first allocation of this site among the blockers");
            if r.clicked() {
                go = b.events.first().copied().or(go);
            }
        });
        ui.label(&b.sentence);
        ui.horizontal_wrapped(|ui| {
            ui.weak("allocated at");
            for &ev in b.events.iter().take(EVENTS_SHOWN) {
                if ui
                    .link(format!("event {ev}"))
                    .on_hover_text("move the cursor to this allocation")
                    .clicked()
                {
                    go = Some(ev);
                }
            }
            if b.events.len() > EVENTS_SHOWN {
                ui.weak(format!("… {} more", b.events.len() - EVENTS_SHOWN));
            }
        });
    }
    ui.add_space(4.0);
    ui.label(format!(
        "The best any allocator could do: {} live at the peak (lower bound), {} with an offline placement that knows every lifetime",
        format_size(e.live_peak_bytes),
        format_size(e.offline_peak_bytes)
    ));
    go
}

/// Holes listed in the panel (the largest; the line above counts them all).
const HOLES_SHOWN: usize = 8;
/// Allocation events listed per blocker site.
const EVENTS_SHOWN: usize = 16;

/// The other runtimes under the cap: allocators a PyTorch program cannot switch to by a
/// setting (asked for once the section is opened). Returns a runtime the user chose to
/// compare.
fn other_runtimes_ui(ui: &mut Ui, app: &mut AllocsimApp) -> Option<String> {
    let mut add = None;
    let r = egui::CollapsingHeader::new("Other runtimes")
        .id_salt("other_runtimes")
        .show(ui, |ui| {
            app.request_runtimes();
            ui.weak("allocators of other runtimes and libraries, under the same cap: not a PyTorch setting");
            match app.runtimes.as_ref().and_then(|r| r.rows.as_ref()) {
                None => {
                    ui.spinner();
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

pub(super) fn central_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    egui::CentralPanel::default()
        .frame(unfilled(ui, true))
        .show(ui, |ui| {
            if app.multi.view.is_some() {
                crate::gui::views::central_ui(ui, app);
                return;
            }
            if app.doc.is_none() {
                ui.centered_and_justified(|ui| {
                    if app.load_job.is_some() {
                        ui.spinner();
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
                let has_time = app.doc.as_ref().is_some_and(|d| !d.seconds.is_empty());
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

fn legend_ui(ui: &mut Ui, app: &AllocsimApp) {
    ui.separator();
    match app.timeline.mode {
        Mode::Metrics => {
            ui.weak("thick: reserved · thin: allocated · faint: largest free block");
            for o in &app.timeline.overlays {
                ui.colored_label(o.color, &o.label);
            }
        }
        Mode::Bands => {
            ui.weak("every live allocation stacked, coloured by call site; lines: reserved");
        }
    }
}

fn map_header_ui(ui: &mut Ui, app: &AllocsimApp, i: usize) {
    let Some(doc) = &app.doc else { return };
    let Some(s) = doc.slots.get(i) else { return };
    ui.horizontal_wrapped(|ui| {
        let (rect, _) = ui.allocate_exact_size(egui::vec2(12.0, 12.0), egui::Sense::hover());
        ui.painter().rect_filled(rect, 2.0, theme::slot(i));
        ui.label(RichText::new(&s.spec).monospace().strong());
        if let Some(l) = &s.layout {
            let t = l.totals();
            ui.label(format!(
                "reserved {} in {} segments",
                format_size(l.reserved_bytes),
                l.data.segments.len()
            ));
            for (state, bytes, name) in [
                (0u8, t[0], "allocated"),
                (1, t[1], "cached free"),
                (2, t[2], "pending free"),
                (3, t[3], "unmapped"),
            ] {
                if bytes > 0 || state < 2 {
                    let (rect, _) =
                        ui.allocate_exact_size(egui::vec2(10.0, 10.0), egui::Sense::hover());
                    ui.painter().rect_filled(rect, 1.0, theme::block(state));
                    ui.label(format!("{name} {}", format_size(bytes)));
                }
            }
            if let Some(at) = l.data.clamped_to {
                ui.colored_label(theme::OOM, format!("replay stopped by the OOM at op {at}"));
            }
        } else if let Some(e) = &s.error {
            ui.colored_label(theme::BAD_TEXT, e);
        } else {
            ui.spinner();
        }
    });
}

fn map_tab_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    map_header_ui(ui, app, 0);
    let picked = {
        let Some(doc) = &app.doc else { return };
        let Some(l) = doc.slots.first().and_then(|s| s.layout.as_ref()) else {
            return;
        };
        memory_map_ui(ui, &mut app.map, doc, l, app.wgpu, 0, app.selected_alloc).picked_alloc
    };
    if let Some(a) = picked {
        app.selected_alloc = Some(a);
        app.refresh_highlight();
    }
}

fn compare_tab_ui(ui: &mut Ui, app: &mut AllocsimApp) {
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
fn summary_table_ui(ui: &mut Ui, doc: &state::Document) {
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
                        None => ui.spinner(),
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
fn compare_maps_ui(ui: &mut Ui, app: &mut AllocsimApp, full_width: f32) {
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
                            doc,
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

fn peak_tab_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    let Some(doc) = &app.doc else { return };
    let Some(r) = doc.slots.first().and_then(|s| s.replay.as_ref()) else {
        ui.spinner();
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
            "At the peak (event {}): {} live in {} allocations from {} call sites",
            doc.trace
                .ops
                .event_index
                .get(peak_op as usize)
                .copied()
                .unwrap_or(0),
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
