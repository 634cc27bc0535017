//! The layouts one key away (issue 17: a layout at another event painted in one frame):
//! asked for in the background once the cursor's layouts are on screen, a key shows the
//! kept one in the frame that moves the cursor, and every kept layout is the engine's own
//! answer for its op under the slot's current replay.

use allocsim_core::capacity::CapacityArg;
use egui_kittest::Harness;

use super::AllocsimApp;
use super::Startup;
use super::tests::{harness, settle};
use crate::engine::examples::OOM_STORY;
use crate::engine::wire::{LayoutData, Request, Response};

/// The engine's answer, asked for now in the foreground, for slot `slot` at op `op`.
fn engine_layout(h: &mut Harness<'static, AllocsimApp>, slot: usize, op: u32) -> LayoutData {
    let app = h.state_mut();
    let job = u64::MAX - u64::from(op);
    app.engine.send(Request::Layout {
        job,
        slot: slot as u32,
        op,
    });
    app.engine
        .poll()
        .into_iter()
        .find_map(|r| match r {
            Response::Layout { job: j, layout, .. } if j == job => Some(*layout),
            _ => None,
        })
        .expect("the engine answers a layout")
}

/// Every slot's kept layouts, compared with the engine's answers asked for now.
fn assert_kept_layouts_are_the_engines(h: &mut Harness<'static, AllocsimApp>) -> usize {
    let kept: Vec<(usize, LayoutData)> = h
        .state()
        .document()
        .expect("loaded")
        .slots
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.nearby.layouts.iter().map(move |l| (i, l.clone())))
        .collect();
    for (slot, l) in &kept {
        assert_eq!(
            *l,
            engine_layout(h, *slot, l.op),
            "slot {slot}'s kept layout at op {}",
            l.op
        );
    }
    kept.len()
}

/// Presses `key` and draws one frame: the slots' layouts must be at the new cursor in
/// that frame, with no layout asked for.
fn one_frame_key(h: &mut Harness<'static, AllocsimApp>, key: egui::Key) -> u32 {
    let before = h.state().cursor;
    h.key_press(key);
    h.step();
    let app = h.state();
    let cursor = app.cursor;
    assert_ne!(cursor, before, "{key:?} moved the cursor");
    for (i, s) in app.document().expect("loaded").slots.iter().enumerate() {
        assert_eq!(
            s.layout.as_ref().map(|l| l.data.op),
            Some(cursor),
            "{key:?}: slot {i} shows the layout at the cursor in the key's own frame"
        );
        assert!(s.layout_job.is_none(), "{key:?}: slot {i} asked for none");
    }
    assert_eq!(
        app.marked_layout(),
        Some(cursor),
        "{key:?}: the frame is marked as showing it"
    );
    cursor
}

#[test]
fn a_key_shows_the_layout_kept_for_it_in_its_own_frame() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    let n = h.state().document().expect("loaded").trace.ops.len() as u32;
    let start = h.state().cursor;
    assert!(start > 0 && start < n - 1, "the story opens mid-trace");
    // Settled: the six key targets of each slot are kept (the cursor's neighbours, a page
    // each way, the ends), each the engine's own answer.
    for s in &h.state().document().expect("loaded").slots {
        let mut ops: Vec<u32> = s.nearby.layouts.iter().map(|l| l.op).collect();
        ops.sort_unstable();
        for want in [0, start - 1, start + 1, n - 1] {
            assert!(ops.contains(&want), "op {want} kept: {ops:?}");
        }
    }
    assert!(assert_kept_layouts_are_the_engines(&mut h) >= 8);
    assert_eq!(one_frame_key(&mut h, egui::Key::ArrowRight), start + 1);
    settle(&mut h);
    assert_eq!(one_frame_key(&mut h, egui::Key::ArrowLeft), start);
    settle(&mut h);
    assert_eq!(one_frame_key(&mut h, egui::Key::End), n - 1);
    settle(&mut h);
    assert_eq!(one_frame_key(&mut h, egui::Key::Home), 0);
    settle(&mut h);
    let page = one_frame_key(&mut h, egui::Key::PageDown);
    assert!(page > 1, "a page is more than one op ({page})");
    settle(&mut h);
    // What is on screen is the engine's answer too.
    let shown = h.state().document().expect("loaded").slots[0]
        .layout
        .as_ref()
        .map(|l| l.data.clone())
        .expect("layout");
    assert_eq!(shown, engine_layout(&mut h, 0, page));
    assert!(assert_kept_layouts_are_the_engines(&mut h) >= 8);
    assert!(h.state().errors.is_empty(), "{:?}", h.state().errors);
}

#[test]
fn a_new_replay_drops_the_kept_layouts_and_keeps_new_ones() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    let old: Vec<LayoutData> = h.state().document().expect("loaded").slots[0]
        .nearby
        .layouts
        .clone();
    assert!(!old.is_empty());
    // The story fits without a cap: every layout after the old OOM changes.
    h.state_mut().set_capacity(CapacityArg::Unlimited);
    settle(&mut h);
    let app = h.state();
    let s = &app.document().expect("loaded").slots[0];
    let oom = s.replay.as_ref().map(|r| r.data.summary.oom.is_some());
    assert_eq!(oom, Some(false), "replayed, no OOM without a cap");
    let new = s.nearby.layouts.clone();
    assert!(!new.is_empty(), "kept again for the new replay");
    // Some op kept under both replays has another layout now: a stale one would show.
    assert!(
        new.iter()
            .any(|l| old.iter().any(|o| o.op == l.op && o != l)),
        "the cap changed a kept layout"
    );
    assert!(assert_kept_layouts_are_the_engines(&mut h) >= 8);
}

/// The cursor keys (pressed and released) are taken out of egui's raw input before its
/// pass, as eframe's raw input hook does, so that egui draws no frame after the key's
/// (`AllocsimApp::take_cursor_keys`); the key's frame moves the cursor as before. Not
/// where a widget has the keyboard focus: they stay egui's.
#[test]
fn cursor_keys_are_taken_before_egui_and_move_the_cursor_in_their_frame() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    let ctx = h.ctx.clone();
    let press = |h: &mut Harness<'static, AllocsimApp>, key: egui::Key| {
        let mut raw = std::mem::take(h.input_mut());
        for pressed in [true, false] {
            raw.events.push(egui::Event::Key {
                key,
                physical_key: None,
                pressed,
                repeat: false,
                modifiers: egui::Modifiers::NONE,
            });
        }
        h.state_mut().take_cursor_keys(&ctx, &mut raw);
        let left = raw.events.len();
        *h.input_mut() = raw;
        left
    };
    let start = h.state().cursor;
    assert_eq!(press(&mut h, egui::Key::ArrowRight), 0, "both events taken");
    h.step();
    assert_eq!(h.state().cursor, start + 1);
    settle(&mut h);
    assert_eq!(press(&mut h, egui::Key::Home), 0);
    h.step();
    assert_eq!(h.state().cursor, 0);
    settle(&mut h);
    // Another key is egui's.
    assert_eq!(press(&mut h, egui::Key::A), 2, "not a cursor key");
    h.step();
    assert_eq!(h.state().cursor, 0);
    // A focused widget keeps the keys (egui moves its focus with them).
    let id = egui::Id::unique("focused in the test");
    ctx.memory_mut(|m| m.request_focus(id));
    assert_eq!(press(&mut h, egui::Key::End), 2, "left to egui");
    *h.input_mut() = egui::RawInput::default();
    assert!(h.state().errors.is_empty(), "{:?}", h.state().errors);
}
