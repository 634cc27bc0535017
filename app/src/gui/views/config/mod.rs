//! The configurations panel: the compared allocators and settings, the memory cap (as
//! recorded, given, unlimited) and each configuration's status; its state, [`ConfigState`].

use crate::gui::state::Slot;
use crate::gui::{AllocsimApp, theme};
use allocsim_core::capacity::{BoundKind, CapacityArg, CapacityChoice};
use allocsim_core::models::MODEL_NAMES;
use allocsim_core::units::format_size;
use egui::{RichText, Ui};

/// Memory caps offered next to free entry: common GPU sizes.
pub(crate) const CAPACITIES: &[(&str, u64)] = &[
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

pub(crate) fn config_ui(ui: &mut Ui, app: &mut AllocsimApp) {
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
pub(crate) fn capacity_ui(ui: &mut Ui, app: &mut AllocsimApp) -> Option<CapacityArg> {
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
pub(crate) fn capacity_phrase(config: &ConfigState) -> String {
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

pub(crate) fn slot_status(s: &Slot) -> String {
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

/// The configuration panel's state.
#[derive(Debug, Clone)]
pub struct ConfigState {
    /// The model of the main configuration.
    pub model: String,
    /// Its `PYTORCH_CUDA_ALLOC_CONF`-style config ("" = the snapshot's own settings).
    pub conf: String,
    /// The capacity asked for: as recorded (the default, as for `allocsim replay`), the
    /// whole GPU, or a size. Set it with [`AllocsimApp::set_capacity`].
    pub capacity_arg: CapacityArg,
    /// The capacity every configuration replays under: `capacity_arg` resolved on the
    /// device shown (the bytes, where they came from, and the line that says how they were
    /// inferred).
    pub capacity: CapacityChoice,
    /// The capacity text field.
    pub capacity_text: String,
    /// The memory cap the program is known to have set (a built-in example's recorded
    /// `set_per_process_memory_fraction`), offered beside the inferred one.
    pub program_cap_bytes: Option<u64>,
    /// The other compared configurations (`NAME` or `NAME@CONFIG`).
    pub compare: Vec<String>,
    /// The "add a configuration" text field.
    pub add_text: String,
}

impl Default for ConfigState {
    fn default() -> Self {
        ConfigState {
            model: "pytorch".into(),
            conf: String::new(),
            capacity_arg: CapacityArg::AsRecorded,
            capacity: CapacityChoice::given(None),
            capacity_text: String::new(),
            program_cap_bytes: None,
            compare: Vec::new(),
            add_text: String::new(),
        }
    }
}

impl ConfigState {
    /// The memory cap of every configuration (`None`: the whole GPU).
    #[must_use]
    pub fn capacity_bytes(&self) -> Option<u64> {
        self.capacity.bytes
    }

    /// Asks for `arg` on a trace whose capacity as recorded is `recorded` (None: no
    /// recording); the text field shows a size asked for, else nothing.
    pub fn set_capacity(&mut self, arg: CapacityArg, recorded: Option<&CapacityChoice>) {
        self.capacity_arg = arg;
        self.capacity_text = match arg {
            CapacityArg::Bytes(b) => allocsim_core::units::format_size(b),
            CapacityArg::AsRecorded | CapacityArg::Unlimited => String::new(),
        };
        self.resolve_capacity(recorded);
    }

    /// Resolves [`ConfigState::capacity_arg`] on the capacity as recorded of the device
    /// shown (None: no recording).
    pub fn resolve_capacity(&mut self, recorded: Option<&CapacityChoice>) {
        self.capacity = match self.capacity_arg {
            CapacityArg::AsRecorded => recorded
                .cloned()
                .unwrap_or_else(|| CapacityChoice::given(None)),
            CapacityArg::Unlimited => CapacityChoice::given(None),
            CapacityArg::Bytes(b) => CapacityChoice::given(Some(b)),
        };
    }

    /// The main configuration as a spec.
    #[must_use]
    pub fn main_spec(&self) -> String {
        let conf = self.conf.trim();
        if conf.is_empty() {
            self.model.clone()
        } else {
            format!("{}@{conf}", self.model)
        }
    }

    /// Every compared spec, the main one first.
    #[must_use]
    pub fn specs(&self) -> Vec<String> {
        let mut v = vec![self.main_spec()];
        v.extend(self.compare.iter().cloned());
        v
    }
}
