//! UI tests without a GPU: the whole app in a headless egui context (`egui_kittest`), the
//! engine run inline, the big views drawn as egui meshes.

use allocsim_core::capacity::CapacityArg;
use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::{Queryable, by};

use super::io::EngineHandle;
use super::{AllocsimApp, Startup, Tab};
use crate::engine::examples::{self, OOM_STORY};
use crate::engine::wire::{NO_OP, block_state};

pub(super) fn harness(startup: Startup) -> Harness<'static, AllocsimApp> {
    let mut app = AllocsimApp::with_engine(EngineHandle::inline(), false);
    app.start(startup);
    let mut h = window(app);
    settle(&mut h);
    h
}

/// `app` in a 1400 × 900 window.
fn window(app: AllocsimApp) -> Harness<'static, AllocsimApp> {
    Harness::builder()
        .with_size([1400.0, 900.0])
        .with_max_steps(400)
        .build_ui_state(|ui, app: &mut AllocsimApp| app.ui(ui), app)
}

/// Runs frames until the engine has answered everything (a paced engine answers one
/// message a frame: an OOM trace's replays, layouts, bands, bounds and sweep take ~210).
pub(super) fn settle(h: &mut Harness<'static, AllocsimApp>) {
    for _ in 0..400 {
        h.step();
        if !h.state().busy() {
            h.step();
            return;
        }
    }
    let a = h.state();
    panic!(
        "the app never settled: load {:?} queued {} doc {:?}",
        a.load_job,
        a.engine.has_queued(),
        a.doc.as_ref().map(|d| (
            d.bounds_job,
            d.bands_job,
            d.slots
                .iter()
                .map(|s| (
                    s.replay_job,
                    s.layout_job,
                    s.min_capacity_job,
                    s.error.clone()
                ))
                .collect::<Vec<_>>()
        ))
    );
}

/// Whether `text` is on screen: in a label, or as the value a combo box shows.
pub(super) fn has_text(h: &Harness<'static, AllocsimApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
        || h.query_all(by().predicate(|n| n.value().is_some_and(|v| v.contains(text))))
            .next()
            .is_some()
}

#[test]
fn opens_on_the_oom_story_with_the_oom_explained() {
    let h = harness(Startup::Example(&OOM_STORY));
    let app = h.state();
    let doc = app.document().expect("loaded");
    assert_eq!(
        doc.slots.len(),
        2,
        "the recorded settings and expandable segments"
    );
    let main = doc.slots[0].replay.as_ref().expect("replayed");
    let oom = main
        .data
        .summary
        .oom
        .as_ref()
        .expect("the default allocator fails");
    assert_eq!(
        app.cursor, oom.op_index,
        "the cursor starts on the failing request"
    );
    assert!(
        doc.slots[1]
            .replay
            .as_ref()
            .expect("replayed")
            .data
            .summary
            .oom
            .is_none()
    );
    let layout = doc.slots[0]
        .layout
        .as_ref()
        .expect("the layout at the cursor");
    assert_eq!(layout.data.op, app.cursor);
    assert_eq!(
        layout.quads.len(),
        layout.data.blocks.len(),
        "one quad per block"
    );
    assert!(has_text(&h, "OOM explained"));
    assert!(has_text(&h, "Tried to allocate 400.00 MiB"));
    assert!(has_text(&h, "1.12 GiB in 6 holes"));
    assert!(has_text(&h, "pytorch@expandable_segments:True fits"));
    assert!(app.errors.is_empty(), "{:?}", app.errors);
}

#[test]
fn a_block_alive_at_a_wrapped_traces_start_is_named_so_not_by_a_number() {
    let ex = examples::by_file("wrapped_history_pub.pickle.gz").expect("example");
    let mut h = harness(Startup::Example(ex));
    h.key_press(egui::Key::Home);
    settle(&mut h);
    assert_eq!(h.state().cursor, 0);
    let first = h
        .state()
        .document()
        .map(|d| d.trace.ops.event_index(0))
        .expect("doc");
    assert_eq!(
        first,
        crate::engine::wire::NO_ENTRY,
        "the trace starts mid-program"
    );
    assert!(
        has_text(&h, "the trace's start · op 0 of"),
        "the status line"
    );
    assert!(!has_text(&h, &first.to_string()), "no entry number shown");
}

#[test]
fn arrow_keys_step_the_cursor_and_the_layout_follows() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    let start = h.state().cursor;
    let before = h
        .state()
        .document()
        .and_then(|d| d.slots[0].layout.as_ref())
        .map(|l| l.data.clone())
        .expect("layout");
    h.key_press(egui::Key::ArrowRight);
    settle(&mut h);
    assert_eq!(h.state().cursor, start + 1);
    let after = h
        .state()
        .document()
        .and_then(|d| d.slots[0].layout.as_ref())
        .map(|l| l.data.clone())
        .expect("layout");
    assert_eq!(after.op, start + 1);
    let ev = h
        .state()
        .document()
        .map(|d| d.trace.ops.event_index((start + 1) as usize))
        .expect("doc");
    assert!(
        has_text(&h, &format!("event {ev} · op {}", start + 1)),
        "the status line follows"
    );
    h.key_press(egui::Key::ArrowLeft);
    h.key_press(egui::Key::ArrowLeft);
    settle(&mut h);
    assert_eq!(h.state().cursor, start - 1);
    h.key_press(egui::Key::Home);
    settle(&mut h);
    assert_eq!(h.state().cursor, 0);
    h.key_press(egui::Key::End);
    settle(&mut h);
    let n = h
        .state()
        .document()
        .map(|d| d.trace.ops.len())
        .expect("doc") as u32;
    assert_eq!(h.state().cursor, n - 1);
    h.key_press(egui::Key::PageUp);
    settle(&mut h);
    assert!(h.state().cursor < n - 1);
    // The layout changed between the OOM and the end (the story frees its tensors).
    let end = h
        .state()
        .document()
        .and_then(|d| d.slots[0].layout.as_ref())
        .map(|l| l.data.clone())
        .expect("layout");
    assert_ne!(before.blocks, end.blocks);
}

#[test]
#[allow(clippy::many_single_char_names)]
fn hovering_a_block_shows_its_sizes_events_and_stack() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    let (content, seg_bytes, blocks) = {
        let app = h.state();
        let l = app
            .document()
            .and_then(|d| d.slots[0].layout.as_ref())
            .expect("layout");
        (
            app.map.last_content.expect("the map was drawn"),
            l.data.segments[0].size_bytes,
            l.data.blocks.clone(),
        )
    };
    assert!(!has_text(&h, "requested 180.00 MiB"));
    // The first allocated block: hover the middle of it (the map fits the segment).
    let (i, b) = blocks
        .iter()
        .enumerate()
        .find(|(_, b)| b.state == block_state::ALLOCATED)
        .expect("an allocated block");
    let seg_addr = blocks[0].addr;
    let mid = (b.addr - seg_addr) as f32 + b.size_bytes as f32 / 2.0;
    let x = content.left() + mid / seg_bytes as f32 * content.width();
    let y = content.top() + 18.0 + 9.0; // the header row, then the segment's row
    h.hover_at(egui::pos2(x, y));
    h.step();
    h.step();
    assert!(
        has_text(&h, "180.00 MiB · allocated"),
        "hovering block {i} shows its size and state"
    );
    assert!(has_text(&h, "requested 180.00 MiB"));
    assert!(has_text(&h, "allocated at event"));
    // Clicking selects the allocation; its stack panel appears.
    h.drag_at(egui::pos2(x, y));
    h.drop_at(egui::pos2(x, y));
    h.step();
    settle(&mut h);
    let sel = h.state().selected_alloc.expect("selected");
    assert_eq!(sel, b.alloc);
    assert_ne!(sel, NO_OP);
    assert!(has_text(&h, "Selected allocation"));
}

#[test]
fn searching_an_address_highlights_its_block_and_lists_its_allocations() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    let b = h
        .state()
        .document()
        .and_then(|d| d.slots[0].layout.as_ref())
        .and_then(|l| {
            l.data
                .blocks
                .iter()
                .find(|b| b.state == block_state::ALLOCATED)
                .copied()
        })
        .expect("block");
    assert!(
        h.state()
            .document()
            .and_then(|d| d.slots[0].layout.as_ref())
            .is_some_and(|l| l.highlight.is_empty())
    );
    let field = h.get_by_role_and_label(Role::TextInput, "Search");
    field.focus();
    field.type_text(&format!("{:#x}", b.addr + 100));
    settle(&mut h);
    let app = h.state();
    assert_eq!(app.search.addr, Some(b.addr + 100));
    assert!(
        !app.search.hits.is_empty(),
        "the allocations holding the address"
    );
    let l = app
        .document()
        .and_then(|d| d.slots[0].layout.as_ref())
        .expect("layout");
    assert_eq!(l.highlight.len(), 1, "exactly its block is highlighted");
    assert!(has_text(&h, "held"));
    assert!(has_text(&h, &format!("block {:#x}", b.addr)));
}

#[test]
fn searching_stack_text_highlights_the_allocations_of_matching_call_sites() {
    let ex = examples::by_file("mlp_train.pickle.gz").expect("built in");
    let mut h = harness(Startup::Example(ex));
    let (name, stacks) = {
        let d = h.state().document().expect("doc");
        let s = d
            .trace
            .ops
            .stack
            .iter()
            .copied()
            .find(|&s| s != 0)
            .expect("stacks recorded");
        let frame = d
            .trace
            .stacks
            .frames_of(s)
            .next()
            .expect("a frame")
            .0
            .to_string();
        (frame, d.trace.stacks.len())
    };
    assert!(stacks > 1);
    h.state_mut().search.text = name.clone();
    h.state_mut().apply_search();
    settle(&mut h);
    let app = h.state();
    let matched = app.search.stacks.as_ref().expect("stack search");
    assert!(!matched.is_empty(), "{name}");
    assert!(
        !app.bands_highlight.is_empty(),
        "the bands of those call sites are highlighted"
    );
    assert!(has_text(&h, "call sites match"));
}

#[test]
fn a_bad_file_shows_an_error_and_the_app_keeps_working() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    h.state_mut().open_bytes(
        "broken.pickle".into(),
        b"\x80\x04garbage".to_vec(),
        CapacityArg::AsRecorded,
        &[],
    );
    settle(&mut h);
    assert_eq!(h.state().errors.len(), 1);
    assert!(
        h.state().errors[0].starts_with("broken.pickle: "),
        "{}",
        h.state().errors[0]
    );
    assert!(has_text(&h, "broken.pickle: "));
    // The story is still on screen and answers the keyboard.
    assert_eq!(
        h.state().document().map(|d| d.trace.name.as_str()),
        Some("oom_story.pickle.gz")
    );
    let c = h.state().cursor;
    assert_eq!(h.state().marked_layout(), Some(c));
    h.key_press(egui::Key::ArrowRight);
    settle(&mut h);
    assert_eq!(h.state().cursor, c + 1);
    // The browser's markers keep following the story: the layout shown is marked.
    assert_eq!(h.state().marked_layout(), Some(c + 1));
    // And the next good file is marked when its first full frame is on screen.
    h.state_mut().open_example(&OOM_STORY);
    assert!(!h.state().first_frame_marked());
    settle(&mut h);
    assert!(h.state().first_frame_marked());
    assert_eq!(h.state().marked_layout(), Some(h.state().cursor));
    // A bad config is an error too, not a panic.
    h.state_mut()
        .config
        .compare
        .push("pytorch@max_split_size_mb:lots".into());
    h.state_mut().resimulate();
    settle(&mut h);
    assert!(h.state().errors.len() >= 2);
}

#[test]
fn a_key_asks_for_its_layout_in_the_same_frame() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    // One pass per frame, so that a frame cannot hide a second look at the engine.
    h.ctx
        .options_mut(|o| o.max_passes = std::num::NonZeroUsize::MIN);
    let start = h.state().cursor;
    // No layout kept for the key (`nearby_tests` has those): it must be asked for.
    for s in &mut h.state_mut().doc.as_mut().expect("loaded").slots {
        s.nearby.clear();
    }
    // The key goes down (one frame: `key_press` would run a second one for its release).
    h.event(egui::Event::Key {
        key: egui::Key::ArrowRight,
        physical_key: None,
        pressed: true,
        repeat: false,
        modifiers: egui::Modifiers::NONE,
    });
    h.step();
    // One frame ran: the cursor moved and its layout was asked for then (an inline engine
    // answers when the next frame polls it), not a frame later.
    assert_eq!(h.state().cursor, start + 1);
    let asked = h
        .state()
        .document()
        .and_then(|d| d.slots[0].layout_job)
        .map(|(_, op)| op);
    assert_eq!(asked, Some(start + 1));
    h.step();
    let shown = h
        .state()
        .document()
        .and_then(|d| d.slots[0].layout.as_ref())
        .map(|l| l.data.op);
    assert_eq!(shown, Some(start + 1), "on screen the frame after the key");
}

#[test]
fn a_larger_cap_re_simulates_and_the_oom_goes_away() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    h.state_mut().set_capacity(CapacityArg::Bytes(8 << 30));
    settle(&mut h);
    let d = h.state().document().expect("doc");
    assert!(d.slots.iter().all(|s| {
        s.replay
            .as_ref()
            .is_some_and(|r| r.data.summary.oom.is_none())
    }));
    assert!(!has_text(&h, "OOM explained"));
}

#[test]
fn the_compare_tab_shows_the_summary_and_a_map_per_configuration() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    h.get_by_label("Compare").click();
    settle(&mut h);
    assert_eq!(h.state().tab, Tab::Compare);
    assert!(has_text(&h, "peak reserved"));
    assert!(has_text(&h, "OOM at event"));
    let json = h.state().compare_json().expect("json");
    let v: serde_json::Value = serde_json::from_str(&json).expect("valid json");
    assert_eq!(v["results"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["results"][0]["oom"]["requested_bytes"], 400 << 20);
    assert!(v["results"][1]["oom"].is_null());
    h.get_by_label("At the peak").click();
    settle(&mut h);
    assert!(has_text(&h, "call sites"));
}

#[test]
fn the_stacked_allocation_view_draws_bands_and_the_cursor_moves_by_click() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    h.get_by_label("Allocations").click();
    settle(&mut h);
    assert!(h.state().timeline.bands_drawn > 0);
    assert!(has_text(&h, "bands drawn"));
    // Clicking a quarter into the timeline moves the cursor a quarter into the trace.
    h.get_by_label("Metrics").click();
    h.step();
    let plot = h.state().timeline.last_plot.expect("drawn");
    let at = egui::pos2(plot.left() + plot.width() * 0.25, plot.center().y);
    h.drag_at(at);
    h.drop_at(at);
    settle(&mut h);
    let n = h
        .state()
        .document()
        .map(|d| d.trace.ops.len())
        .expect("doc") as f32;
    assert_eq!(h.state().cursor, (n * 0.25).floor() as u32);
}

#[test]
fn the_compare_table_gets_each_configurations_min_capacity() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    h.state_mut().tab = Tab::Compare;
    settle(&mut h);
    let d = h.state().document().expect("doc");
    let caps: Vec<u64> = d
        .slots
        .iter()
        .map(|s| s.min_capacity.clone().expect("asked").expect("a capacity"))
        .collect();
    // On the 2 MiB grid; for the default allocator every request served (the recorded
    // OOM too, as `replay` at that capacity shows): the 2 GiB block plus 400 MiB.
    for c in &caps {
        assert_eq!(c % (2 << 20), 0, "{caps:?}");
    }
    assert_eq!(caps[0], 2448 << 20);
    assert!(has_text(&h, "min capacity"));
    assert!(has_text(&h, &allocsim_core::units::format_size(caps[0])));
}

#[test]
fn a_synthetic_workload_opens_from_the_menu_spec() {
    let mut h = harness(Startup::Empty);
    h.state_mut()
        .open_workload("oom-story", OOM_STORY.cap_bytes());
    settle(&mut h);
    let d = h.state().document().expect("generated");
    assert!(!d.trace.recorded);
    assert!(
        d.slots[0]
            .replay
            .as_ref()
            .and_then(|r| r.data.summary.oom.as_ref())
            .is_some(),
        "the generated story fails too"
    );
    assert!(has_text(&h, "synthetic workload"));
    h.state_mut().open_workload("nonsense:x=1", None);
    settle(&mut h);
    assert!(
        h.state().errors.iter().any(|e| e.contains("nonsense")),
        "{:?}",
        h.state().errors
    );
}

#[test]
#[allow(clippy::many_single_char_names)]
fn what_if_lists_pytorch_settings_only_with_their_cost() {
    let h = harness(Startup::Example(&OOM_STORY));
    let app = h.state();
    // Asked for without a click: the story runs out of memory.
    let w = app.what_if.as_ref().expect("asked for at the OOM");
    assert_eq!(w.capacity_bytes, app.config.capacity_bytes());
    let a = w.answer.as_ref().expect("answered");
    // recommend's answer, as the CLI computes it.
    let v = allocsim_core::session::load(OOM_STORY.bytes, None).expect("loads");
    let d = v.trace.busiest_device();
    let rec = allocsim_core::whatif::recommend(&v.trace, d, w.capacity_bytes, &mut |_, _| {})
        .expect("recommend");
    assert_eq!(a.candidates_tried as usize, rec.candidates_tried);
    let best = &a.tradeoffs[0];
    assert!(best.recommended);
    assert_eq!(best.peak_reserved_bytes, rec.best.peak_reserved_bytes);
    assert!(has_text(&h, &rec.best.config), "the best setting is listed");
    for col in ["peak", "headroom", "segment ops", "sync ops", "driver time"] {
        assert!(has_text(&h, col), "column {col}");
    }
    assert!(has_text(&h, "as recorded (defaults)"));
    assert!(has_text(
        &h,
        &crate::gui::views::oom::would_fit::format_driver_time(best.driver_time_us)
    ));
    // Only PyTorch settings: the other runtimes are on the Compare tab.
    assert!(
        a.tradeoffs
            .iter()
            .all(|r| r.spec == "pytorch" || r.spec.starts_with("pytorch@"))
    );
    for other in ["bfc", "rmm-pool", "buddy", "tlsf"] {
        assert!(!has_text(&h, other), "{other} is not a PyTorch setting");
    }
}

#[test]
fn a_what_if_can_be_cancelled_and_asked_again() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    h.state_mut().request_what_if();
    assert!(
        h.state()
            .what_if
            .as_ref()
            .is_some_and(super::WhatIf::running)
    );
    h.state_mut().cancel_what_if();
    settle(&mut h);
    let w = h.state().what_if.as_ref().expect("the what-if");
    assert!(w.cancelled && w.answer.is_none(), "its answer is dropped");
    assert!(has_text(&h, "the sweep was cancelled"));
    h.get_by_label("What would fit?").click_accesskit();
    settle(&mut h);
    let w = h.state().what_if.as_ref().expect("asked again");
    assert!(!w.cancelled && w.answer.is_some());
}

#[test]
fn escape_cancels_a_running_what_if() {
    // The engine on its thread, as in the app: the sweep runs while frames go on.
    let mut app = AllocsimApp::with_engine(EngineHandle::spawn(&egui::Context::default()), false);
    app.open_workload("kvcache:tokens=500", None);
    let mut h = window(app);
    for _ in 0..2000 {
        h.step();
        if h.state().doc.is_some() && !h.state().busy() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(h.state().doc.is_some(), "the workload opened");
    h.state_mut().request_what_if();
    h.key_press(egui::Key::Escape);
    h.step();
    let w = h.state().what_if.as_ref().expect("the what-if");
    assert!(w.cancelled && w.answer.is_none(), "Escape cancelled it");
}

#[test]
fn the_compare_tab_lists_the_other_runtimes_apart() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    h.get_by_label("Compare").click();
    settle(&mut h);
    assert!(h.state().runtimes.is_none(), "asked for once opened");
    h.get_by_label("Other runtimes").click_accesskit();
    settle(&mut h);
    let rows = h
        .state()
        .runtimes
        .as_ref()
        .and_then(|r| r.rows.clone())
        .expect("answered")
        .expect("replayed");
    assert_eq!(
        rows.iter().map(|r| r.spec.as_str()).collect::<Vec<_>>(),
        allocsim_core::models::MODEL_NAMES[1..]
    );
    assert!(has_text(&h, "not a PyTorch setting"));
    assert!(has_text(&h, "rmm-pool"));
}

/// A real H100 snapshot in the repository: the device filled, split into 3.93 GiB holes,
/// then a 23.60 GiB request no hole holds.
const DEVFULL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/traces/devfull_oom_msg.pickle.gz"
);

#[test]
fn the_oom_explained_names_the_blockers_highlights_them_and_goes_to_their_allocations() {
    let mut h = harness(Startup::File(DEVFULL.into()));
    // What `allocsim explain` says at the OOM.
    let v =
        allocsim_core::session::load(&std::fs::read(DEVFULL).expect("file"), None).expect("loads");
    let d = v.trace.busiest_device();
    let cap = allocsim_core::session::capacity(&v.trace, d, CapacityArg::AsRecorded).bytes;
    let want = allocsim_core::explain::explain(
        &v.trace,
        d,
        &allocsim_core::models::ModelSpec::parse("pytorch").expect("spec"),
        cap,
        allocsim_core::explain::ExplainOptions::default(),
        &allocsim_core::whatif::InOrder,
        &mut |_, _| {},
    )
    .expect("explain");
    assert!(!want.blockers.is_empty(), "explain names blockers here");
    let app = h.state();
    assert!(app.errors.is_empty(), "{:?}", app.errors);
    assert_eq!(app.cursor as usize, want.op_index, "the cursor on the OOM");
    // The panel: the holes with the free that opened each, the blockers by site.
    assert!(has_text(&h, &format!("{}.", want.sentence)));
    assert!(has_text(&h, "Holes of its pool and stream: 7 holes"));
    for hole in want.holes.iter().take(8) {
        let ev = hole
            .opened_at_event
            .expect("every hole here was opened by a free");
        assert!(has_text(&h, &format!("opened by the free at event {ev}")));
    }
    for b in &want.blockers {
        assert!(has_text(&h, &b.site), "{}", b.site);
        assert!(has_text(&h, &b.sentence), "{}", b.sentence);
    }
    assert!(has_text(
        &h,
        "with an offline placement that knows every lifetime"
    ));
    // The map highlights exactly the blockers' blocks.
    let mut want_addrs: Vec<u64> = want.blockers.iter().flat_map(|b| b.addrs.clone()).collect();
    want_addrs.sort_unstable();
    let doc = app.document().expect("doc");
    let l = doc.slots[0].layout.as_ref().expect("layout");
    assert_eq!(l.data.op, app.cursor);
    let mut lit: Vec<u64> = l
        .blocker_blocks
        .iter()
        .map(|&b| l.data.blocks[b].addr)
        .collect();
    lit.sort_unstable();
    assert_eq!(lit, want_addrs);
    assert_eq!(l.blockers.len(), want_addrs.len(), "one quad per blocker");
    // Clicking a blocker's allocation moves the cursor to the event that allocated it,
    // and selects that allocation; the map there outlines its block.
    let first = want.blockers[0].events[0];
    h.get_by_label(&format!("event {first}")).click_accesskit();
    settle(&mut h);
    let app = h.state();
    let doc = app.document().expect("doc");
    let op = app.cursor;
    assert_eq!(u64::from(doc.trace.ops.event_index(op as usize)), first);
    assert!(doc.trace.ops.is_alloc(op as usize));
    assert_eq!(app.selected_alloc, Some(op));
    let l = doc.slots[0].layout.as_ref().expect("layout");
    assert_eq!(l.data.op, op);
    let here: Vec<u64> = l
        .blocker_blocks
        .iter()
        .map(|&b| l.data.blocks[b].addr)
        .collect();
    assert!(
        l.blocker_blocks
            .iter()
            .any(|&b| l.data.blocks[b].alloc == op),
        "the blocker allocated here is highlighted: {here:x?}"
    );
    assert!(here.iter().all(|a| want_addrs.contains(a)), "{here:x?}");
    // The site's link goes to its first allocation too; a hole's link to its free.
    h.get_by_label(&want.blockers[0].site).click_accesskit();
    settle(&mut h);
    assert_eq!(h.state().cursor, op);
    let ev = want.holes[0].opened_at_event.expect("opened by a free");
    h.get_by_label(&format!("opened by the free at event {ev}"))
        .click_accesskit();
    settle(&mut h);
    let app = h.state();
    let doc = app.document().expect("doc");
    assert_eq!(
        u64::from(doc.trace.ops.event_index(app.cursor as usize)),
        ev
    );
}

#[test]
fn the_timeline_draws_the_live_peak_and_the_offline_placement() {
    let h = harness(Startup::File(DEVFULL.into()));
    let v =
        allocsim_core::session::load(&std::fs::read(DEVFULL).expect("file"), None).expect("loads");
    let d = v.trace.busiest_device();
    let b = allocsim_core::offline::best_possible(&v.trace.devices[d]);
    let app = h.state();
    assert_eq!(app.document().and_then(|d| d.bounds), Some(b));
    let size = allocsim_core::units::format_size;
    assert_eq!(
        app.timeline.last_references,
        vec![
            (
                format!("live bytes peak {}", size(b.live_peak_bytes)),
                b.live_peak_bytes
            ),
            (
                format!("offline placement peak {}", size(b.offline_peak_bytes)),
                b.offline_peak_bytes
            ),
        ]
    );
}

#[test]
fn every_built_in_example_opens_without_errors() {
    for ex in examples::EXAMPLES
        .iter()
        .filter(|e| e.bytes.len() < 200_000)
    {
        let h = harness(Startup::Example(ex));
        let app = h.state();
        assert!(app.errors.is_empty(), "{}: {:?}", ex.file, app.errors);
        let d = app.document().expect("loaded");
        assert!(
            d.slots
                .iter()
                .all(|s| s.replay.is_some() && s.layout.is_some()),
            "{}",
            ex.file
        );
    }
}

#[test]
fn addresses_parse_as_hex() {
    assert_eq!(
        super::parse_address("0x7f3a00000000"),
        Some(0x7f3a_0000_0000)
    );
    assert_eq!(
        super::parse_address(" 7f3a00001000 "),
        Some(0x7f3a_0000_1000)
    );
    assert_eq!(super::parse_address("forward"), None);
    assert_eq!(
        super::parse_address("deadbeef"),
        None,
        "words made of hex letters stay text"
    );
    assert_eq!(super::parse_address("0x"), None);
    assert_eq!(super::parse_address("0xzz"), None);
}

#[test]
fn band_quads_are_built_a_slice_per_call_and_published_as_they_double() {
    use super::state::{Document, band_quads};
    use crate::engine::wire::{BandPiece, TraceData};
    // Each piece's height is its allocation's size.
    let allocs = vec![('a', 1 << 20); 300_000];
    let mut trace = TraceData {
        ops: std::sync::Arc::new(crate::engine::wire::OpsTable::from_script(&allocs)),
        ..TraceData::default()
    };
    std::sync::Arc::make_mut(&mut trace.bands).pieces = (0..300_000u32)
        .map(|i| BandPiece::new(i, i + 3, u64::from(i) << 10, i))
        .collect();
    let trace = std::sync::Arc::new(trace);
    let mut doc = Document::new(trace.clone());
    assert!(doc.bands.is_empty() && !doc.bands_complete());
    // No time to spare: one slice per call.
    let mut published = Vec::new();
    let mut calls = 0;
    while !doc.build_bands(std::time::Duration::ZERO, true) {
        calls += 1;
        if published.last() != Some(&doc.bands.len()) {
            published.push(doc.bands.len());
        }
    }
    assert_eq!(calls, 300_000 / 16_384, "one slice per call");
    // Doubling previews of the largest pieces, none past 2^18 (copying more would cost a
    // frame), then all of them.
    assert_eq!(published, [16_384, 32_768, 65_536, 131_072, 262_144]);
    assert!(doc.bands_complete());
    assert_eq!(
        doc.bands.held_capacity(),
        Some(300_000),
        "in exactly their room"
    );
    let all = band_quads(&doc.trace, doc.seconds(), &|_| true, None);
    assert_eq!(doc.bands.held(), Some(all.as_slice()));
    // Built: nothing more to do.
    let generation = doc.bands.generation;
    assert!(doc.build_bands(std::time::Duration::from_secs(1), true));
    assert_eq!(doc.bands.generation, generation);

    // For a renderer that draws them from the pieces: every quad at once, none held, the
    // same quads.
    let mut made = Document::new(trace);
    assert!(made.build_bands(std::time::Duration::ZERO, false));
    assert!(made.bands_complete() && made.bands.held().is_none());
    assert_eq!(made.bands.to_vec(0..300_000), all);
    assert_eq!(made.bands.to_vec(299_990..400_000), all[299_990..]);
    let generation = made.bands.generation;
    assert!(made.build_bands(std::time::Duration::ZERO, false));
    assert_eq!(made.bands.generation, generation, "published once");
}

#[test]
fn the_stacked_view_builds_its_bands_only_once_shown() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    let n = h.state().document().map(|d| d.trace.bands.pieces.len());
    assert!(n.is_some_and(|n| n > 0));
    assert!(h.state().document().is_some_and(|d| d.bands.is_empty()));
    h.get_by_label("Allocations").click();
    settle(&mut h);
    let doc = h.state().document().expect("doc");
    assert_eq!(Some(doc.bands.len()), n);
}

/// A real H100 snapshot in the repository: GPT-2 training on the full GPU, three OOMs the
/// program caught (batch 64, 32, 16), then batch 8 fits.
const GPT2_OOM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/traces/gpt2_big_batch_oom_msg.pickle.gz"
);

fn gpt2_bytes() -> Vec<u8> {
    std::fs::read(GPT2_OOM).expect("tests/traces/gpt2_big_batch_oom_msg.pickle.gz")
}

#[test]
fn an_oom_trace_opens_on_its_first_oom_at_the_capacity_as_recorded() {
    let h = harness(Startup::File(GPT2_OOM.into()));
    let app = h.state();
    assert!(app.errors.is_empty(), "{:?}", app.errors);
    // The capacity the CLI infers by default (`allocsim replay`).
    let v = allocsim_core::session::load(&gpt2_bytes(), None).expect("loads");
    let d = v.trace.busiest_device();
    let cli = allocsim_core::session::capacity(&v.trace, d, CapacityArg::AsRecorded);
    assert_eq!(cli.bytes, Some(84_288_929_792), "{cli:?}");
    assert_eq!(app.config.capacity_arg, CapacityArg::AsRecorded);
    assert_eq!(app.config.capacity, cli);
    let doc = app.document().expect("loaded");
    assert!(doc.slots.iter().all(|s| s.capacity_bytes == cli.bytes));
    // The cursor on the first OOM, event 933.
    let main = doc.slots[0].replay.as_ref().expect("replayed");
    let first = &main.data.summary.ooms[0];
    assert_eq!(first.event_index, 933);
    assert!(first.recorded && !first.fatal);
    assert_eq!(main.data.summary.ooms.len(), 3);
    assert_eq!(app.cursor, first.op_index);
    assert_eq!(doc.trace.ops.event_index(app.cursor as usize), 933);
    // The capacity control says where the capacity came from.
    assert!(
        h.query(by().role(Role::ComboBox).value("as recorded: 78.50 GiB"))
            .is_some(),
        "the memory cap shows the capacity as recorded"
    );
    assert!(has_text(&h, "from the OOM report at event 933"));
    // OOM explained: PyTorch's sentence, as its exception said it, then ours.
    assert!(has_text(&h, "OOM explained"));
    assert!(has_text(
        &h,
        "At event 933: as recorded: the program caught it and went on"
    ));
    assert!(has_text(
        &h,
        "CUDA out of memory. Tried to allocate 1024.00 MiB. Of the allocated memory 77.60 GiB is allocated by PyTorch, and 10.16 MiB is reserved by PyTorch but unallocated."
    ));
    assert!(has_text(&h, "10.16 MiB in 2 holes"));
    // What would have fit, computed at that capacity without a click: nothing PyTorch
    // offers (the batch needs more than the GPU), and the capacity that would have.
    assert!(has_text(&h, "Would have fit at 78.50 GiB (as recorded)"));
    assert!(has_text(
        &h,
        "PyTorch settings swept serves every request here"
    ));
    let needed = allocsim_core::whatif::min_capacity(
        &v.trace,
        d,
        &allocsim_core::models::ModelSpec::parse("pytorch").expect("spec"),
        &mut |_, _| {},
    )
    .expect("min capacity");
    assert_eq!(
        doc.slots[0].min_capacity,
        Some(Ok(needed.min_capacity_bytes))
    );
    assert!(has_text(
        &h,
        &format!(
            "pytorch: every request served from {} (min capacity)",
            allocsim_core::units::format_size(needed.min_capacity_bytes)
        )
    ));
}

#[test]
fn the_compare_table_uses_the_capacity_and_min_capacity_of_the_cli() {
    let mut h = harness(Startup::File(GPT2_OOM.into()));
    h.state_mut().tab = Tab::Compare;
    settle(&mut h);
    let v = allocsim_core::session::load(&gpt2_bytes(), None).expect("loads");
    let d = v.trace.busiest_device();
    let app = h.state();
    let doc = app.document().expect("doc");
    for s in &doc.slots {
        let spec = allocsim_core::models::ModelSpec::parse(&s.spec).expect("spec");
        let m = allocsim_core::whatif::min_capacity(&v.trace, d, &spec, &mut |_, _| {})
            .expect("min capacity");
        assert_eq!(s.min_capacity, Some(Ok(m.min_capacity_bytes)), "{}", s.spec);
        assert!(has_text(
            &h,
            &allocsim_core::units::format_size(m.min_capacity_bytes)
        ));
    }
    // The same capacity as `allocsim compare`, said the same way.
    let cli = allocsim_core::session::capacity(&v.trace, d, CapacityArg::AsRecorded);
    assert!(has_text(&h, "capacity as recorded: 78.50 GiB"));
    let json: serde_json::Value =
        serde_json::from_str(&app.compare_json().expect("json")).expect("valid");
    assert_eq!(json["capacity_bytes"], cli.bytes.expect("inferred"));
    assert_eq!(json["capacity_source"], "recorded");
    assert_eq!(json["capacity_inferred"]["high_event"], 933);
    assert_eq!(
        json["results"][0]["oom"]["pytorch_message"]
            .as_str()
            .map(|m| m.starts_with("CUDA out of memory. Tried to allocate 1024.00 MiB.")),
        Some(true)
    );
}

#[test]
fn an_oom_free_trace_opens_on_the_whole_gpu() {
    let ex = examples::by_file("mlp_train.pickle.gz").expect("built in");
    let h = harness(Startup::Example(ex));
    let app = h.state();
    assert_eq!(app.config.capacity_arg, CapacityArg::AsRecorded);
    assert_eq!(app.config.capacity_bytes(), None);
    assert_eq!(
        app.config.capacity.source,
        allocsim_core::capacity::CapacitySource::Unlimited
    );
    let doc = app.document().expect("doc");
    assert!(doc.slots.iter().all(|s| {
        s.capacity_bytes.is_none()
            && s.replay
                .as_ref()
                .is_some_and(|r| r.data.summary.ooms.is_empty())
    }));
    assert!(has_text(&h, "whole GPU"));
    assert!(!has_text(&h, "as recorded:"));
    assert!(!has_text(&h, "OOM explained"));
    // Nothing was asked that only an OOM needs.
    assert!(doc.slots.iter().all(|s| s.min_capacity.is_none()));
}

#[test]
fn the_capacity_can_still_be_chosen_and_as_recorded_chosen_back() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    let inferred = h.state().config.capacity_bytes().expect("inferred");
    h.state_mut().set_capacity(CapacityArg::Unlimited);
    settle(&mut h);
    assert!(has_text(&h, "whole GPU"));
    let d = h.state().document().expect("doc");
    assert!(d.slots.iter().all(|s| s.capacity_bytes.is_none()));
    // Unlimited, the story's recorded OOM is served: nothing to explain.
    assert!(!has_text(&h, "OOM explained"));
    h.state_mut().set_capacity(CapacityArg::AsRecorded);
    settle(&mut h);
    assert_eq!(h.state().config.capacity_bytes(), Some(inferred));
    assert!(has_text(&h, "OOM explained"));
    // Typed: a size or `none`.
    let field = h.get_by_role_and_label(Role::TextInput, "or type");
    field.focus();
    field.type_text("none");
    h.key_press(egui::Key::Enter);
    settle(&mut h);
    assert_eq!(h.state().config.capacity_arg, CapacityArg::Unlimited);
}

#[test]
fn the_built_in_examples_open_as_recorded_and_their_programs_caps_lie_in_the_inferred_interval() {
    // oom_story: the program set a 2.2 GiB cap; the recording shows it was granted 2 GiB
    // and refused 2 GiB + the 400 MiB segment, so every capacity in [2.00, 2.39) GiB
    // explains it and the app, as `allocsim replay`, uses the most generous one.
    let h = harness(Startup::Example(&OOM_STORY));
    let c = &h.state().config;
    assert_eq!(c.capacity_arg, CapacityArg::AsRecorded);
    assert_eq!(c.capacity_bytes(), Some((2448 << 20) - 1));
    assert_eq!(c.program_cap_bytes, OOM_STORY.cap_bytes());
    assert!(has_text(&h, "as recorded: 2.39 GiB"));
    assert!(has_text(&h, "from the OOM report at event 27"));
    for ex in examples::EXAMPLES
        .iter()
        .filter(|e| e.bytes.len() < 200_000)
    {
        let v = allocsim_core::session::load(ex.bytes, None).expect("loads");
        let d = v.trace.busiest_device();
        let rec = allocsim_core::session::capacity(&v.trace, d, CapacityArg::AsRecorded);
        if let (Some(cap), Some(iv)) = (ex.cap_bytes(), rec.inferred) {
            assert!(
                iv.low_bytes <= cap && cap < iv.high_bytes,
                "{}: {cap} outside {iv:?}",
                ex.file
            );
        }
    }
}

#[test]
fn a_bad_file_leaves_the_capacity_in_step_with_the_trace_on_screen() {
    let mut h = harness(Startup::Example(&OOM_STORY));
    h.state_mut().set_capacity(CapacityArg::Bytes(8 << 30));
    settle(&mut h);
    assert!(has_text(&h, "8.00 GiB"));
    h.state_mut().open_bytes(
        "broken.pickle".into(),
        b"\x80\x04garbage".to_vec(),
        CapacityArg::AsRecorded,
        &[],
    );
    settle(&mut h);
    assert_eq!(h.state().errors.len(), 1);
    // The story and its 8 GiB cap stay: the control, the replays and the OOM panel agree.
    let app = h.state();
    assert_eq!(app.config.capacity_arg, CapacityArg::Bytes(8 << 30));
    assert_eq!(app.config.capacity_bytes(), Some(8 << 30));
    let d = app.document().expect("doc");
    assert_eq!(d.trace.name, "oom_story.pickle.gz");
    assert!(d.slots.iter().all(|s| s.capacity_bytes == Some(8 << 30)));
    assert!(has_text(&h, "8.00 GiB"));
    assert!(!has_text(&h, "whole GPU"));
    assert!(!has_text(&h, "OOM explained"));
}
