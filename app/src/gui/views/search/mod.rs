//! Search (an address, a size, a `file:line`) and the selected block; its state,
//! [`SearchState`], and the highlight it puts on the memory map.

use crate::engine::wire::{AddressHit, NO_OP, Request};
use crate::gui::render::QuadSet;
use crate::gui::state;
use crate::gui::views::map::tab::{blocker_picker, highlighter};
use crate::gui::{AllocsimApp, theme};
use allocsim_core::units::format_size;
use egui::Ui;
use std::collections::BTreeSet;

pub(crate) fn search_ui(ui: &mut Ui, app: &mut AllocsimApp) {
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
            crate::gui::theme::busy(ui);
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
                        let ev = doc.trace.ops.event_name(h.alloc as usize);
                        if ui
                            .link(format!(
                                "{ev}: {:#x}, {}",
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
                (n + 1, b + doc.trace.ops.size_bytes(a))
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

pub(crate) fn selection_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    let (Some(a), Some(doc)) = (app.selected_alloc, &app.doc) else {
        return;
    };
    let ops = &doc.trace.ops;
    if a as usize >= ops.len() {
        return;
    }
    let size = ops.size_bytes(a as usize);
    ui.heading("Selected allocation");
    ui.label(format!(
        "{} requested {}",
        format_size(size),
        ops.at_event(a as usize)
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

/// The search box's state and what it matched.
#[derive(Debug, Clone, Default)]
pub struct SearchState {
    pub text: String,
    /// Stacks whose frames contain the text.
    pub stacks: Option<BTreeSet<u32>>,
    /// The text as an address.
    pub addr: Option<u64>,
    /// Allocations (of the main configuration) holding the address.
    pub hits: Vec<AddressHit>,
    pub job: Option<u64>,
    /// A call site chosen in the peak table.
    pub site: Option<u32>,
}

/// Parses `0x7f12…` or a long hex string as an address.
#[must_use]
pub fn parse_address(text: &str) -> Option<u64> {
    let t = text.trim();
    let hex = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"));
    match hex {
        Some(h) if !h.is_empty() => u64::from_str_radix(h, 16).ok(),
        _ if t.len() >= 8
            && t.chars().all(|c| c.is_ascii_hexdigit())
            && t.chars().any(|c| c.is_ascii_digit()) =>
        {
            u64::from_str_radix(t, 16).ok()
        }
        _ => None,
    }
}

impl AllocsimApp {
    /// Recomputes what the search and the selection highlight.
    pub fn apply_search(&mut self) {
        let text = self.search.text.trim().to_string();
        self.search.addr = parse_address(&text);
        self.search.hits.clear();
        self.search.stacks = None;
        if let Some(doc) = &self.doc {
            if let Some(a) = self.search.addr {
                let job = self.job();
                self.search.job = Some(job);
                self.engine.send(Request::FindAddress {
                    job,
                    slot: 0,
                    addr: a,
                });
            } else if !text.is_empty() {
                self.search.stacks = Some(state::stacks_matching(&doc.trace, &text));
            }
        }
        if let Some(site) = self.search.site {
            self.search
                .stacks
                .get_or_insert_with(BTreeSet::new)
                .insert(site);
        }
        self.refresh_highlight();
    }

    /// Rebuilds the highlight quads of the bands and of every layout.
    pub fn refresh_highlight(&mut self) {
        let Some(doc) = &mut self.doc else { return };
        let trace = doc.trace.clone();
        let mut set: Option<BTreeSet<u32>> = self.search.stacks.clone();
        let sel = self.selected_alloc;
        self.bands_highlight = if set.is_some() || sel.is_some() {
            let stacks = set.get_or_insert_with(BTreeSet::new);
            let ops = &trace.ops;
            let pick = |p: &crate::engine::wire::BandPiece| {
                Some(p.alloc) == sel
                    || ops
                        .stack
                        .get(p.alloc as usize)
                        .is_some_and(|s| stacks.contains(s))
            };
            QuadSet::new(state::band_quads(
                &trace,
                doc.seconds(),
                &pick,
                Some(theme::HIGHLIGHT),
            ))
        } else {
            QuadSet::default()
        };
        let hl = highlighter(&trace, &self.search, sel);
        for s in &mut doc.slots {
            if let Some(l) = &mut s.layout {
                l.set_highlight(&hl);
            }
        }
        if let Some(l) = doc.slots.first_mut().and_then(|s| s.layout.as_mut()) {
            l.set_blockers(&blocker_picker(self.explained.as_ref()));
        }
    }
}
