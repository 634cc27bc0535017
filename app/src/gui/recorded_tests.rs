//! The first frames of a file (issue 17): what the file records is drawn before its trace
//! is built and before any replay answers, then replaced by the replays.

use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};

use super::io::{EngineHandle, Pace};
use super::tests::{has_text, settle};
use super::{AllocsimApp, Startup};
use crate::engine::examples::OOM_STORY;
use crate::engine::wire::block_state;

/// The app on an engine that answers one message per frame, started once the harness is
/// built (building it runs frames).
fn paced_harness(startup: Startup) -> Harness<'static, AllocsimApp> {
    let app = AllocsimApp::with_engine(EngineHandle::inline_paced(), false);
    let mut h = Harness::builder()
        .with_size([1400.0, 900.0])
        .with_max_steps(400)
        .build_ui_state(|ui, app: &mut AllocsimApp| app.ui(ui), app);
    h.state_mut().start(startup);
    h
}

/// The document of the file opened, its trace built and no replay answered yet, and the
/// recorded lines drawn over its ops meanwhile.
fn built_without_replays(
    app: &AllocsimApp,
) -> (&super::state::Document, &crate::gui::state::RecordedView) {
    let doc = app.document().expect("the trace arrived");
    assert!(
        doc.slots.iter().all(|s| s.replay.is_none()),
        "no replay yet"
    );
    let rd = app
        .recorded_in_document()
        .expect("the recorded lines over the ops");
    (doc, rd)
}

#[test]
fn the_recorded_timeline_and_end_state_are_drawn_before_the_replays_answer() {
    let mut h = paced_harness(Startup::Example(&OOM_STORY));
    // Frames until the decoded file's own timeline is on screen.
    for _ in 0..20 {
        if h.state().recorded_frame_marked() {
            break;
        }
        h.step();
    }
    let app = h.state();
    assert!(
        app.recorded_frame_marked(),
        "the recorded timeline was drawn"
    );
    assert!(app.document().is_none(), "drawn before the trace is built");
    assert!(!app.first_frame_marked());
    let r = app.recorded_shown().expect("the recorded view is shown");
    assert_eq!(r.name, OOM_STORY.file);
    assert!(r.len() > 10, "{} entries", r.len());
    // The end state the map shows: the file's one 2 GiB segment under the 2.2 GiB cap.
    assert_eq!(r.layout.data.segments.len(), 1);
    assert_eq!(r.layout.data.segments[0].size_bytes, 2 << 30);
    assert_eq!(r.peak_reserved_bytes, 2 << 30);
    assert_eq!(
        r.layout
            .data
            .blocks
            .iter()
            .map(|b| b.size_bytes)
            .sum::<u64>(),
        2 << 30,
        "the blocks tile the segment"
    );
    // The program freed its tensors before the snapshot: nothing live at the end.
    assert_eq!(r.requested.get(r.len() - 1), Some(0.0));
    assert!(
        r.layout
            .data
            .blocks
            .iter()
            .all(|b| b.state == block_state::FREE)
    );
    assert!(
        app.timeline.last_plot.is_some(),
        "the timeline was laid out"
    );
    assert!(
        app.map.last_content.is_some(),
        "the memory map was laid out"
    );
    assert!(has_text(&h, "recorded end state"));
    assert!(has_text(&h, "reserved 2.00 GiB in 1 segments"));
    let per_entry: Vec<_> = [&r.reserved, &r.requested]
        .map(|c| {
            (0..c.len())
                .filter_map(|i| c.bytes(i))
                .collect::<Vec<u64>>()
        })
        .into();

    // Once the trace is built, the same lines and map stay until the main replay's layout.
    for _ in 0..40 {
        if h.state().document().is_some() {
            break;
        }
        h.step();
    }
    let app = h.state();
    let (doc, rd) = built_without_replays(app);
    assert_eq!(rd.reserved.len(), doc.trace.ops.len());
    // Each op shows its trace entry's recorded values, exactly.
    for (k, e) in doc.trace.ops.event_indexes().enumerate() {
        for (per_op, entries) in [&rd.reserved, &rd.requested].into_iter().zip(&per_entry) {
            assert_eq!(per_op.bytes(k), entries.get(e as usize).copied(), "op {k}");
        }
    }
    assert_eq!(rd.layout.data.op as usize, doc.trace.ops.len() - 1);
    assert_eq!(
        app.cursor, rd.layout.data.op,
        "the cursor shows the end state"
    );
    h.step();
    assert!(has_text(&h, "recorded end state"));

    // The replays replace them: the cursor on the OOM, its layout from the replay.
    // One answer a frame: the what-if's progress alone is some hundred.
    let mut frames = 0;
    while h.state().busy() {
        frames += 1;
        assert!(frames < 2000, "the app never settled");
        h.step();
    }
    settle(&mut h);
    let app = h.state();
    assert!(app.first_frame_marked());
    assert!(app.recorded_in_document().is_none());
    let doc = app.document().expect("loaded");
    let oom = doc.slots[0]
        .replay
        .as_ref()
        .and_then(|r| r.data.summary.oom.as_ref())
        .expect("the default allocator fails under the cap");
    assert_eq!(app.cursor, oom.op_index);
    assert_eq!(
        doc.slots[0].layout.as_ref().map(|l| l.data.op),
        Some(oom.op_index)
    );
    assert!(!has_text(&h, "recorded end state"));
    assert!(app.errors.is_empty(), "{:?}", app.errors);
}

#[test]
fn the_recorded_timeline_is_marked_when_it_arrives_with_the_trace() {
    // A fast machine builds the trace between two frames: the recorded timeline and the
    // trace arrive in one frame, and it is drawn over the ops while the replays run (the
    // browser test's marker, once missed on a fast CI machine).
    let mut h = paced_harness(Startup::Example(&OOM_STORY));
    h.state_mut().engine.set_pace(Pace::Hold);
    for _ in 0..5 {
        h.step();
    }
    assert!(h.state().document().is_none() && !h.state().recorded_frame_marked());
    h.state_mut().engine.set_pace(Pace::All);
    h.step();
    let app = h.state();
    built_without_replays(app);
    assert!(
        app.recorded_frame_marked(),
        "the recorded timeline was marked"
    );
    assert!(!app.first_frame_marked());
}

#[test]
fn the_first_full_frame_waits_for_the_main_replay_alone_and_the_tables_are_shared() {
    let mut h = paced_harness(Startup::Example(&OOM_STORY));
    let mut frames = 0;
    while !h.state().full_frame_marked() {
        frames += 1;
        assert!(frames < 400, "no full frame");
        h.step();
    }
    let app = h.state();
    let doc = app.document().expect("loaded");
    assert_eq!(doc.slots.len(), 2, "OOM_STORY compares two configurations");
    let main = &doc.slots[0];
    assert!(main.replay.is_some());
    assert_eq!(main.layout.as_ref().map(|l| l.data.op), Some(app.cursor));
    // The other configuration is replayed after this frame, not before it: the engine
    // answers one message a frame, so a replay asked for with the main one would have
    // answered before the main layout.
    assert!(doc.slots[1].replay.is_none(), "the second replay waits");
    assert!(doc.bounds.is_none(), "the bounds wait too");
    // The main configuration ran out of memory: its explanation's sweep waits for every
    // configuration's replay.
    assert!(
        main.replay
            .as_ref()
            .is_some_and(|r| !r.data.summary.ooms.is_empty())
    );
    assert!(app.what_if.is_none(), "the sweep waits for the replays");
    assert!(!app.first_frame_marked());
    // The bands are stacked once every configuration is on screen (natively too: on a
    // thread of their own beside the engine).
    assert!(!app.engine.runs_beside());
    assert!(
        doc.trace.bands.pieces.is_empty(),
        "no bands before the full frame"
    );
    let mut frames = 0;
    while !h.state().first_frame_marked() {
        frames += 1;
        assert!(frames < 2000, "the second configuration never arrived");
        h.step();
    }
    settle(&mut h);
    let app = h.state();
    let doc = app.document().expect("loaded");
    assert!(
        doc.slots
            .iter()
            .all(|s| s.replay.is_some() && s.layout.is_some())
    );
    assert!(doc.bounds.is_some());
    assert!(app.what_if.is_some(), "the sweep started after the replays");
    assert!(doc.bands_job.is_none() && !doc.trace.bands.pieces.is_empty());
    let (full, all) = (app.last_full_ms, app.last_load_ms);
    assert!(
        full.is_some_and(|f| all.is_some_and(|a| f <= a)),
        "{full:?} {all:?}"
    );
}

#[test]
fn every_replay_and_its_layout_are_asked_for_with_the_main_one() {
    let mut h = paced_harness(Startup::Example(&OOM_STORY));
    let mut frames = 0;
    while h.state().document().is_none() {
        frames += 1;
        assert!(frames < 100, "the trace never arrived");
        h.step();
    }
    built_without_replays(h.state());
    // The engine runs what was asked so far and holds its answers, then hands them all to
    // one frame: every configuration is then on screen with its layout, no request having
    // waited for an answer (in the browser each round trip costs a frame).
    h.state_mut().engine.set_pace(Pace::Hold);
    h.step();
    h.state_mut().engine.set_pace(Pace::All);
    h.step();
    let app = h.state();
    let doc = app.document().expect("loaded");
    assert_eq!(doc.slots.len(), 2);
    let main = doc.slots[0].replay.as_ref().expect("the main replay");
    let oom = main
        .data
        .summary
        .ooms
        .first()
        .expect("the story runs out of memory");
    assert_eq!(app.cursor, oom.op_index, "the cursor on the first OOM");
    for (i, s) in doc.slots.iter().enumerate() {
        assert!(s.replay.is_some(), "slot {i} replayed");
        assert_eq!(
            s.layout.as_ref().map(|l| l.data.op),
            Some(app.cursor),
            "slot {i}'s layout at the cursor, asked for with its replay"
        );
    }
    assert!(app.first_frame_marked(), "the ready frame is this one");
}

/// A file dropped on the window, as the integration hands it over.
#[derive(Debug)]
struct Dropped(std::path::PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &std::path::Path {
        &self.0
    }

    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

/// Drops `tests/traces/NAME` on the window and draws the frame that gets it.
fn drop_test_trace(h: &mut Harness<'static, AllocsimApp>, name: &str) {
    h.input_mut()
        .dropped_files
        .append(&mut dropping(name).dropped_files);
    h.step();
}

/// A frame's raw input with `tests/traces/NAME` dropped on the window.
fn dropping(name: &str) -> egui::RawInput {
    let path = format!("{}/../tests/traces/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut raw = egui::RawInput::default();
    raw.dropped_files
        .push(std::sync::Arc::new(Dropped(path.into())));
    raw
}

/// A dropped file whose handle arrives at once (a path natively, a `File` in the browser)
/// is opened by the frame that gets the drop, not the next one (in the browser a frame
/// costs 50-300 ms of a software rasterizer): on an engine that answers as it is polled,
/// that one frame brings the file's trace.
#[test]
fn a_dropped_file_is_opened_in_the_frame_of_the_drop() {
    let mut h = super::tests::harness(Startup::Example(&OOM_STORY));
    drop_test_trace(&mut h, "devfull_oom_msg.pickle.gz");
    let doc = h.state().document().expect("a document");
    assert_eq!(doc.trace.name, "devfull_oom_msg.pickle.gz");
}

/// A bare egui context, run as eframe's runner runs it: a frame whenever egui's repaint
/// callback asked for one.
struct Frames {
    ctx: egui::Context,
    asked: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Frames {
    fn new() -> Frames {
        let ctx = egui::Context::default();
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = asked.clone();
        ctx.set_request_repaint_callback(move |_| {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let frames = Frames { ctx, asked };
        frames.drawn(egui::RawInput::default(), |_| {});
        frames
    }

    /// The frames drawn from one over `raw` until egui asks for no more, each drawing
    /// `widget`.
    fn drawn(&self, raw: egui::RawInput, mut widget: impl FnMut(&mut egui::Ui)) -> usize {
        let mut raw = Some(raw);
        let mut frames = 0;
        while raw.is_some() || self.asked.swap(false, std::sync::atomic::Ordering::SeqCst) {
            frames += 1;
            assert!(frames < 20, "egui never settled");
            let mut out = self.ctx.run_ui(raw.take().unwrap_or_default(), &mut widget);
            out.textures_delta.clear();
        }
        frames
    }
}

/// Files dropped are taken out of egui's raw input before its pass, as eframe's raw input
/// hook does (`AllocsimApp::take_dropped_files`), with the files hovered: egui asks for a
/// repaint at once after a pass whose input holds either, two more frames, which in the
/// browser are the software rasterizer's beside the engine's decode of that very file. The
/// frame of the drop opens the file as before.
#[test]
fn dropped_files_are_taken_before_egui_and_opened_in_their_frame() {
    let with_drop = || {
        let mut raw = dropping("devfull_oom_msg.pickle.gz");
        raw.hovered_files.push(egui::HoveredFile::default());
        raw
    };
    // What taking them saves: egui's own next frame.
    let egui = Frames::new();
    let window = |ui: &mut egui::Ui| {
        ui.label("a window");
    };
    assert_eq!(egui.drawn(egui::RawInput::default(), window), 1);
    // egui asks at once, and a repaint asked at once is two frames.
    assert_eq!(
        egui.drawn(with_drop(), window),
        3,
        "two frames more after a drop"
    );
    let mut h = super::tests::harness(Startup::Example(&OOM_STORY));
    let mut raw = with_drop();
    h.state_mut().take_dropped_files(&mut raw);
    assert!(raw.dropped_files.is_empty() && raw.hovered_files.is_empty());
    let taken = raw.clone();
    assert_eq!(
        egui.drawn(taken, window),
        1,
        "nothing left to ask a frame for"
    );
    *h.input_mut() = raw;
    h.step();
    let doc = h.state().document().expect("a document");
    assert_eq!(doc.trace.name, "devfull_oom_msg.pickle.gz");
}

/// In the browser the frame of a drop draws nothing (`AllocsimApp::drops`): the
/// raw input hook marks the window occluded, over which eframe runs no ui pass and paints
/// nothing, only the app's `logic`, which opens the file (the next frame, asked by the
/// engine's answer, shows it). Natively the frame of the drop draws as before.
#[test]
fn in_the_browser_the_frame_of_a_drop_opens_the_file_and_draws_nothing() {
    let with_drop = || dropping("devfull_oom_msg.pickle.gz");
    let visible = |raw: &egui::RawInput| {
        raw.viewports
            .get(&egui::ViewportId::ROOT)
            .and_then(egui::ViewportInfo::visible)
            != Some(false)
    };
    let mut h = super::tests::harness(Startup::Example(&OOM_STORY));
    assert!(
        !h.state().drops.unpainted,
        "natively the drop's frame draws"
    );
    let mut raw = with_drop();
    h.state_mut().take_dropped_files(&mut raw);
    assert!(visible(&raw));
    h.state_mut().dropped.clear();
    // As the browser's app: the drop's frame is eframe's `logic` alone.
    h.state_mut().drops.unpainted = true;
    let mut raw = with_drop();
    raw.events.push(egui::Event::PointerGone);
    h.state_mut().take_dropped_files(&mut raw);
    assert!(!visible(&raw), "the drop's frame is not drawn");
    assert_eq!(raw.events.len(), 1, "its input is kept for the next frame");
    let shown = |h: &Harness<'static, AllocsimApp>| {
        h.state()
            .document()
            .map(|d| d.trace.name.clone())
            .unwrap_or_default()
    };
    assert_eq!(shown(&h), OOM_STORY.file);
    let ctx = h.ctx.clone();
    h.state_mut().open_unpainted(&ctx);
    // The inline engine answers as it is asked: the open is done.
    assert_eq!(shown(&h), "devfull_oom_msg.pickle.gz", "opened by `logic`");
    // Once: a frame with nothing dropped is drawn, and its `logic` opens nothing.
    let mut raw = egui::RawInput::default();
    h.state_mut().take_dropped_files(&mut raw);
    assert!(visible(&raw));
    assert!(!h.state().drops.pending);
    h.step();
    assert_eq!(shown(&h), "devfull_oom_msg.pickle.gz");
}

/// A file dropped with its handle at hand (a path natively, a `File` in the browser) goes
/// into the inbox for the frame at hand to open, with no repaint asked: egui's
/// `request_repaint` draws two more frames of the whole window. What arrives later
/// (a file dialog's choice) still asks for one.
#[test]
fn a_dropped_file_at_hand_asks_for_no_other_frame() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let ctx = egui::Context::default();
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    ctx.set_request_repaint_callback(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    });
    let inbox = super::io::Inbox::default();
    let path = format!(
        "{}/../tests/traces/devfull_oom_msg.pickle.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    for by_path in [true, false] {
        super::io::read_dropped(
            &ctx,
            &inbox,
            std::sync::Arc::new(Dropped(path.clone().into())),
            by_path,
        );
        let opened = inbox.take();
        assert_eq!(opened.len(), 1);
        assert!(opened[0].is_ok(), "read at once ({by_path})");
    }
    assert_eq!(asked.load(Ordering::SeqCst), 0);
    inbox.push(&ctx, Err("a later answer".into()));
    assert!(asked.load(Ordering::SeqCst) > 0);
}

/// While a file opens, the status bar offers Cancel as a link, which egui draws styled in
/// the frame it first appears in: a button it had not drawn before asks for a repaint to
/// style it (two more frames after every drop).
#[test]
fn an_open_offers_cancel_as_a_link_that_asks_for_no_other_frame() {
    let appearing =
        |widget: fn(&mut egui::Ui)| Frames::new().drawn(egui::RawInput::default(), widget);
    assert_eq!(
        appearing(|ui| {
            let _ = ui.small_button("Cancel");
        }),
        3
    );
    assert_eq!(
        appearing(|ui| {
            let _ = ui.link("Cancel");
        }),
        1
    );
    let mut h = super::tests::harness(Startup::Example(&OOM_STORY));
    let job = 1 << 40;
    {
        let app = h.state_mut();
        app.progress = Some((job, "reading big.pickle".into(), 0.1));
        app.load_job = Some(job);
        app.load_cancellable = Some(job);
    }
    h.step();
    let cancel = h.get_by_label("Cancel");
    assert_eq!(cancel.accesskit_node().role(), egui::accesskit::Role::Link);
}

/// The recorded timeline is made per op only for a frame that draws it: where the main
/// configuration's replay and layout come with the trace (the browser's worker sends them
/// together below a million ops), the layout replaces the recorded end state before any
/// frame draws it, and the conversion (12 ms of the page's first full frame on
/// `big_gpt_long_stacks_s9`) is not made. Where they come later, it is made once.
#[test]
fn the_recorded_timeline_goes_per_op_only_when_a_frame_draws_it() {
    use super::state::PER_OP_MADE;
    let made = || PER_OP_MADE.with(|n| n.replace(0));
    let mut h = super::tests::harness(Startup::Example(&OOM_STORY));
    let _ = made();
    drop_test_trace(&mut h, "mlp_train.pickle.gz");
    let app = h.state();
    assert!(
        app.document()
            .is_some_and(|d| d.slots.first().is_some_and(|s| s.layout.is_some())),
        "one frame brought the trace, the main replay and its layout"
    );
    assert!(app.recorded_in_document().is_none());
    assert!(app.document().is_some_and(|d| d.recorded_entries.is_none()));
    assert_eq!(made(), 0);
    let mut h = paced_harness(Startup::Example(&OOM_STORY));
    let _ = made();
    for _ in 0..40 {
        if h.state().document().is_some() {
            break;
        }
        h.step();
    }
    let (_, rd) = built_without_replays(h.state());
    assert!(!rd.is_empty());
    assert_eq!(made(), 1);
    settle(&mut h);
    assert_eq!(made(), 0, "made once");
}

/// While another file opens, the document shown asks for no bands nor bounds (the engine
/// would answer them for the file being opened, and in the browser ahead of its replays);
/// once nothing is opening it asks for them.
#[test]
fn no_bands_nor_bounds_are_asked_for_while_another_file_opens() {
    let mut h = paced_harness(Startup::Example(&OOM_STORY));
    let mut frames = 0;
    // The bands and bounds wait for every configuration to be on screen.
    while !h
        .state()
        .document()
        .is_some_and(|d| d.main_settled() && d.all_settled())
    {
        frames += 1;
        assert!(frames < 200, "the configurations never settled");
        assert!(
            !h.state()
                .document()
                .is_some_and(|d| d.bands_asked || d.bounds_asked),
            "asked before every configuration is on screen"
        );
        h.step();
    }
    let app = h.state_mut();
    let unasked = |app: &mut AllocsimApp| {
        let doc = app.doc.as_mut().expect("a document");
        (doc.bands_asked, doc.bounds_asked) = (false, false);
    };
    let asked = |app: &AllocsimApp| {
        app.document()
            .map(|d| (d.bands_asked, d.bounds_asked))
            .expect("a document")
    };
    unasked(app);
    app.load_job = Some(u64::MAX);
    app.after_main_frame();
    assert_eq!(asked(app), (false, false), "asked while a file opens");
    app.load_job = None;
    app.after_main_frame();
    assert_eq!(asked(app), (true, true), "asked once nothing opens");
}

/// A file whose main configuration the engine replays beside its build (no refusal
/// recorded) comes with that replay and its layout answered unasked, right behind the
/// trace (`MainReplay::answer`): the frame that takes the trace is the first full frame,
/// the cursor and the layout at the replay's peak (in the browser the round trip and the
/// frame between them cost 100-200 ms of the open), and the main slot's answer is the one
/// a request would get (a later move lays out the same replay).
#[test]
fn the_frame_that_takes_an_opened_trace_shows_its_main_replay_and_layout() {
    let mut h = super::tests::harness(Startup::Example(&OOM_STORY));
    drop_test_trace(&mut h, "mlp_train.pickle.gz");
    let app = h.state();
    let doc = app.document().expect("a document");
    assert_eq!(doc.trace.name, "mlp_train.pickle.gz");
    let main = doc.slots[0]
        .replay
        .as_ref()
        .expect("the main replay, unasked");
    assert!(
        main.data.summary.ooms.is_empty(),
        "no OOM: the cursor at the peak"
    );
    assert_eq!(app.cursor, main.data.start_op());
    assert_eq!(
        doc.slots[0].layout.as_ref().map(|l| l.data.op),
        Some(app.cursor),
        "its layout at the cursor"
    );
    assert!(app.full_frame_marked(), "the first full frame is this one");
    // The engine holds that replay for the keys' layouts.
    h.key_press(egui::Key::Home);
    settle(&mut h);
    let doc = h.state().document().expect("a document");
    assert_eq!(doc.slots[0].layout.as_ref().map(|l| l.data.op), Some(0));
    assert!(doc.slots[0].error.is_none());
}
