//! The memory-map tab around the map: its header, legend and highlight rules.

use crate::engine::wire::NO_OP;
use crate::gui::state::{self};
use crate::gui::views::map::memory_map_ui;
use crate::gui::views::oom::Explained;
use crate::gui::views::search::SearchState;
use crate::gui::views::timeline::Mode;
use crate::gui::{AllocsimApp, theme};
use allocsim_core::units::format_size;
use egui::{RichText, Ui};

pub(crate) fn legend_ui(ui: &mut Ui, app: &AllocsimApp) {
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

pub(crate) fn map_header_ui(ui: &mut Ui, app: &AllocsimApp, i: usize) {
    let Some(doc) = &app.doc else { return };
    let Some(s) = doc.slots.get(i) else { return };
    ui.horizontal_wrapped(|ui| {
        let (rect, _) = ui.allocate_exact_size(egui::vec2(12.0, 12.0), egui::Sense::hover());
        ui.painter().rect_filled(rect, 2.0, theme::slot(i));
        ui.label(RichText::new(&s.spec).monospace().strong());
        if let Some(l) = &s.layout {
            layout_summary_ui(ui, l);
        } else if let Some(e) = &s.error {
            ui.colored_label(theme::BAD_TEXT, e);
        } else if i == 0
            && let Some(r) = &doc.recorded
        {
            recorded_summary_ui(ui, r);
        } else {
            crate::gui::theme::busy(ui);
        }
    });
}

/// What a layout holds: reserved bytes and segments, bytes by block state.
fn layout_summary_ui(ui: &mut Ui, l: &state::LayoutView) {
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
            let (rect, _) = ui.allocate_exact_size(egui::vec2(10.0, 10.0), egui::Sense::hover());
            ui.painter().rect_filled(rect, 1.0, theme::block(state));
            ui.label(format!("{name} {}", format_size(bytes)));
        }
    }
    if let Some(at) = l.data.clamped_to {
        ui.colored_label(theme::OOM, format!("replay stopped by the OOM at op {at}"));
    }
}

/// The header of the file's recorded end state, shown until the main configuration's
/// layout arrives.
pub(crate) fn recorded_summary_ui(ui: &mut Ui, r: &state::RecordedView) {
    ui.label(RichText::new("recorded end state").strong())
        .on_hover_text("the file's own segments after its last event; the replays follow");
    layout_summary_ui(ui, &r.layout);
    crate::gui::theme::busy(ui);
}

pub(crate) fn map_tab_ui(ui: &mut Ui, app: &mut AllocsimApp) {
    map_header_ui(ui, app, 0);
    let picked = {
        let Some(doc) = &app.doc else { return };
        let Some(l) = doc.slots.first().and_then(|s| s.layout.as_ref()) else {
            // Until the main configuration's layout arrives: the recorded end state.
            if let Some(r) = &doc.recorded {
                memory_map_ui(ui, &mut app.map, &r.no_ops, &r.layout, app.wgpu, 0, None);
            }
            return;
        };
        memory_map_ui(
            ui,
            &mut app.map,
            &doc.trace,
            l,
            app.wgpu,
            0,
            app.selected_alloc,
        )
        .picked_alloc
    };
    if let Some(a) = picked {
        app.selected_alloc = Some(a);
        app.refresh_highlight();
    }
}

/// Whether layout block `b` is highlighted: its call site matches, it holds the searched
/// address, or it is the selected allocation.
pub(crate) fn highlighter<'a>(
    trace: &'a crate::engine::wire::TraceData,
    search: &'a SearchState,
    selected: Option<u32>,
) -> impl Fn(&crate::engine::wire::LayoutData, usize) -> bool + 'a {
    move |layout, b| {
        let Some(blk) = layout.blocks.get(b) else {
            return false;
        };
        if let Some(a) = search.addr
            && blk.addr <= a
            && a < blk.addr + blk.size_bytes
        {
            return true;
        }
        if selected.is_some() && blk.alloc != NO_OP && Some(blk.alloc) == selected {
            return true;
        }
        search
            .stacks
            .as_ref()
            .is_some_and(|s| state::block_in_stacks(trace, layout, b, s))
    }
}

/// Whether layout block `b` is one of the explanation's blockers: a live block of a
/// blocker's allocation, or (at the op explained, for blocks alive before the trace
/// starts) at a blocker's address.
pub(crate) fn blocker_picker(
    explained: Option<&Explained>,
) -> impl Fn(&crate::engine::wire::LayoutData, usize) -> bool + '_ {
    let at = explained.and_then(Explained::explanation);
    move |layout, b| {
        let (Some(x), Some((op, e)), Some(blk)) = (explained, at, layout.blocks.get(b)) else {
            return false;
        };
        if blk.state == crate::engine::wire::block_state::FREE
            || blk.state == crate::engine::wire::block_state::UNMAPPED
        {
            return false;
        }
        (blk.alloc != NO_OP && x.blocker_allocs.contains(&blk.alloc))
            || (layout.op == op && e.blockers.iter().any(|g| g.addrs.contains(&blk.addr)))
    }
}
