//! The OOM panel: PyTorch's sentence at the selected OOM and "OOM explained" (holes,
//! blockers, what would have fit); its state, [`Explained`].

pub mod would_fit;

use crate::engine::wire::OomData;
use crate::gui::state::Slot;
use crate::gui::views::oom::would_fit::would_fit_ui;
use crate::gui::{AllocsimApp, theme};
use allocsim_core::explain::{BlockerKind, Explanation};
use allocsim_core::units::format_size;
use egui::{RichText, Ui};
use std::collections::BTreeSet;

/// What happened at an OOM, in PyTorch's terms.
pub(crate) fn oom_status(o: &OomData) -> &'static str {
    if o.fatal {
        "the program would have died here"
    } else {
        "as recorded: the program caught it and went on"
    }
}

/// "OOM explained": the main configuration's OOM at the cursor — PyTorch's sentence, then
/// ours and the numbers behind it — the other configurations' OOMs in a line each, then
/// what would have fit at this capacity.
pub(crate) fn oom_ui(ui: &mut Ui, app: &mut AllocsimApp) {
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
            (_, Some(e)) => {
                let bounds = app.doc.as_ref().and_then(|d| d.bounds);
                go_event = explanation_ui(ui, e, bounds.as_ref()).or(go_event);
            }
            (Some(x), None) if matches!(x.answer, Some(Err(_))) => {
                if let Some(Err(m)) = &x.answer {
                    ui.colored_label(theme::BAD_TEXT, format!("cannot explain it: {m}"));
                }
            }
            _ => {
                ui.horizontal(|ui| {
                    crate::gui::theme::busy(ui);
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

/// The explanation's holes, blockers and bounds (`allocsim explain`), below PyTorch's
/// sentence. Returns an event the user clicked (the free that opened a hole, the
/// allocation of a blocker).
/// `bounds`: the trace's bounds where computed (the engine's explanation leaves them
/// out, [`allocsim_core::explain::ExplainOptions::without_bounds`]).
pub(crate) fn explanation_ui(
    ui: &mut Ui,
    e: &Explanation,
    bounds: Option<&allocsim_core::offline::BestPossible>,
) -> Option<u64> {
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
    match bounds {
        Some(b) => ui.label(format!(
            "The best any allocator could do: {} live at the peak (lower bound), {} with an offline placement that knows every lifetime",
            format_size(b.live_peak_bytes),
            format_size(b.offline_peak_bytes)
        )),
        None => ui.weak("The best any allocator could do: being computed"),
    };
    go
}

/// Holes listed in the panel (the largest; the line above counts them all).
pub(crate) const HOLES_SHOWN: usize = 8;

/// Allocation events listed per blocker site.
pub(crate) const EVENTS_SHOWN: usize = 16;

/// What `allocsim explain` says at the main configuration's OOM the panel shows.
#[derive(Debug)]
pub struct Explained {
    /// `(spec, capacity, event)` asked about.
    pub key: (String, Option<u64>, u64),
    pub job: u64,
    /// The op explained and the explanation, once answered (or why there is none).
    pub answer: Option<Result<(u32, Box<Explanation>), String>>,
    /// The alloc ops of the blockers (their events on the device's ops), for the map.
    pub blocker_allocs: BTreeSet<u32>,
}

impl Explained {
    /// The explanation, when it has arrived.
    #[must_use]
    pub fn explanation(&self) -> Option<(u32, &Explanation)> {
        match &self.answer {
            Some(Ok((op, e))) => Some((*op, e)),
            _ => None,
        }
    }
}

/// The OOM of `ooms` the panel explains at the cursor: the last at or before it, else the
/// first.
#[must_use]
pub fn oom_at(ooms: &[crate::engine::wire::OomData], cursor: u32) -> usize {
    ooms.iter().rposition(|o| o.op_index <= cursor).unwrap_or(0)
}
