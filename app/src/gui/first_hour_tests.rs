//! UI tests of what a new user stumbled on in the first hour (issue 16): each stumble
//! driven through the whole app as in [`super::tests`].

use std::collections::BTreeSet;

use egui::accesskit::Role;
use egui_kittest::kittest::Queryable;
use egui_kittest::kittest::{NodeT, by};

use super::Startup;
use super::tests::{harness, has_text, settle};
use crate::engine::wire::block_state;
use crate::gui::views::map::MapGeometry;

/// The OOM story as a file (it records stack frames), from the repository's real traces.
const OOM_STORY_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/traces/oom_story.pickle.gz"
);

#[test]
fn searching_a_file_and_line_or_a_bare_line_finds_the_blocks_allocated_there() {
    let mut h = harness(Startup::File(OOM_STORY_FILE.into()));
    // The stacks with a frame at capture.py:281, and the allocations made there.
    let (at_281, allocs) = {
        let d = h.state().document().expect("loaded");
        let st = &d.trace.stacks;
        let at: BTreeSet<u32> = (0..st.len() as u32)
            .filter(|&s| {
                st.frames_of(s)
                    .any(|(_, f, l)| f.ends_with("capture.py") && l == 281)
            })
            .collect();
        // The tooltip shows the frame in this form.
        let s = *at.first().expect("a stack through capture.py:281");
        assert!(st.format(s).iter().any(|l| l.contains("capture.py:281)")));
        let ops = &d.trace.ops;
        let allocs: Vec<u32> = (0..ops.len())
            .filter(|&a| ops.is_alloc(a) && at.contains(&ops.stack[a]))
            .map(|a| a as u32)
            .collect();
        (at, allocs)
    };
    assert!(!allocs.is_empty());
    for text in ["capture.py:281", "281", "CAPTURE.PY:281"] {
        h.state_mut().search.text = String::new();
        h.state_mut().apply_search();
        let field = h.get_by_role_and_label(Role::TextInput, "Search");
        field.focus();
        field.type_text(text);
        settle(&mut h);
        let app = h.state();
        assert_eq!(app.search.addr, None, "{text} is not an address");
        assert_eq!(app.search.stacks.as_ref(), Some(&at_281), "{text}");
        assert!(has_text(&h, &format!("{} call sites match", at_281.len())));
        assert!(!app.bands_highlight.is_empty(), "{text}: bands highlighted");
    }
    // Right after the allocation, its block is the highlighted one in the map.
    let a = allocs[0];
    h.state_mut().set_cursor(a);
    settle(&mut h);
    let app = h.state();
    let l = app
        .document()
        .and_then(|d| d.slots[0].layout.as_ref())
        .expect("layout");
    assert_eq!(l.data.op, a);
    let there: Vec<usize> = (0..l.data.blocks.len())
        .filter(|&b| {
            let blk = &l.data.blocks[b];
            blk.state != block_state::FREE && allocs.contains(&blk.alloc)
        })
        .collect();
    assert!(
        there.iter().any(|&b| l.data.blocks[b].alloc == a),
        "its block is on the map"
    );
    assert_eq!(
        l.highlight.len(),
        there.len(),
        "exactly those blocks are lit"
    );
    assert!(has_text(&h, "of their allocations"));
    // Another line of the same file is not line 281; the whole file matches every stack.
    let field = h.get_by_role_and_label(Role::TextInput, "Search");
    field.focus();
    h.key_press(egui::Key::Backspace);
    settle(&mut h);
    assert_eq!(h.state().search.text, "CAPTURE.PY:28");
    assert!(
        h.state()
            .search
            .stacks
            .as_ref()
            .is_some_and(|s| s.is_disjoint(&at_281))
    );
}

/// A file dialog that cannot open, as on a machine without xdg-desktop-portal or zenity
/// (rfd logs why and answers "nothing chosen").
fn no_dialog(ctx: &egui::Context, inbox: &super::io::Inbox) {
    inbox.dialog_failed(
        ctx,
        "Failed to pick file with zenity: No such file or directory (os error 2)".into(),
    );
}

#[test]
fn where_no_file_dialog_opens_file_open_offers_a_path_field_with_the_reason() {
    let mut h = harness(Startup::Empty);
    h.state_mut().file_dialog = no_dialog;
    h.get_by_label("File").click();
    h.step();
    h.step();
    h.get_by_label("Open snapshot…").click();
    settle(&mut h);
    assert!(has_text(
        &h,
        "the file dialog could not open: Failed to pick file with zenity"
    ));
    // A path that cannot be read says so, and the field stays.
    let field = h.get_by_role_and_label(Role::TextInput, "Open the snapshot at");
    field.focus();
    field.type_text("/no/such/snapshot.pickle");
    h.key_press(egui::Key::Enter);
    settle(&mut h);
    assert!(
        h.state()
            .errors
            .iter()
            .any(|e| e.starts_with("cannot read /no/such/snapshot.pickle")),
        "{:?}",
        h.state().errors
    );
    assert!(h.state().path_prompt.is_some());
    h.state_mut().errors.clear();
    // The typed path opens.
    h.state_mut()
        .path_prompt
        .as_mut()
        .expect("still offered")
        .text
        .clear();
    let field = h.get_by_role_and_label(Role::TextInput, "Open the snapshot at");
    field.focus();
    field.type_text(OOM_STORY_FILE);
    h.key_press(egui::Key::Enter);
    settle(&mut h);
    let app = h.state();
    assert!(app.errors.is_empty(), "{:?}", app.errors);
    let d = app.document().expect("the typed file opened");
    assert_eq!(d.trace.name, "oom_story.pickle.gz");
    assert!(d.slots[0].replay.is_some());
    assert!(
        app.path_prompt.is_none(),
        "the field goes once the file opened"
    );
    assert!(!has_text(&h, "the file dialog could not open"));
    // File > Open again goes straight to the field (the dialog is known not to open).
    h.state_mut().file_dialog = |_, _| panic!("the dialog is not tried again");
    h.get_by_label("File").click();
    h.step();
    h.step();
    h.get_by_label("Open snapshot…").click();
    settle(&mut h);
    assert!(h.state().path_prompt.is_some());
    assert!(has_text(&h, "the file dialog could not open"));
}

#[test]
fn hovering_the_status_lines_fragmentation_gives_its_formula_and_numbers() {
    let mut h = harness(Startup::File(OOM_STORY_FILE.into()));
    let (shown, reserved, allocated, largest) = {
        let app = h.state();
        let r = app
            .document()
            .and_then(|d| d.slots[0].replay.as_ref())
            .expect("replayed");
        let c = app.cursor as usize;
        (
            format!(
                "fragmentation {:.0}%",
                r.fragmentation().get(c).expect("sampled") * 100.0
            ),
            r.data.timeline.reserved_bytes.get(c).expect("sampled"),
            r.data.timeline.allocated_bytes.get(c).expect("sampled"),
            r.data.timeline.largest_free_bytes.get(c).expect("sampled"),
        )
    };
    let free = reserved - allocated;
    assert!(
        free > largest && largest > 0,
        "the OOM: free memory in pieces"
    );
    assert!(!has_text(&h, "1 − largest free block / free"));
    h.get_by_label(&shown).hover();
    // The tooltip shows once the pointer rested there half a second.
    for _ in 0..60 {
        h.step();
    }
    assert!(has_text(
        &h,
        "fragmentation = 1 − largest free block / free, over all free blocks (free: reserved − allocated); 0 when nothing is free"
    ));
    // The numbers at the cursor, and the same percentage as the status line.
    let pct = shown.trim_start_matches("fragmentation ");
    let here = format!(
        "here: 1 − {} / {} = {pct}",
        allocsim_core::units::format_size(largest),
        allocsim_core::units::format_size(free)
    );
    assert!(has_text(&h, &here), "{here}");
    // Nothing free: 0, as core/src/metrics.rs defines it.
    assert!(
        crate::gui::frame::fragmentation_hover(1 << 30, 1 << 30, 0)
            .ends_with("here: nothing is free, so 0%")
    );
}

/// The app in a 1440 × 900 window, as the desktop app opens.
fn harness_1440(startup: Startup) -> egui_kittest::Harness<'static, super::AllocsimApp> {
    let mut app = super::AllocsimApp::with_engine(super::io::EngineHandle::inline(), false);
    app.start(startup);
    let mut h = egui_kittest::Harness::builder()
        .with_size([1440.0, 900.0])
        .with_max_steps(400)
        .build_ui_state(|ui, app: &mut super::AllocsimApp| app.ui(ui), app);
    settle(&mut h);
    h
}

#[test]
fn at_1440_px_the_compare_tab_fits_the_window_and_no_label_overlaps_the_bars() {
    let mut h = harness_1440(Startup::File(OOM_STORY_FILE.into()));
    h.get_by_label("Compare").click();
    settle(&mut h);
    let window = egui::Rect::from_min_size(egui::Pos2::ZERO, egui::vec2(1440.0, 900.0));
    let side = h.state().side_panel_width;
    assert!(
        (side - crate::gui::frame::SIDE_PANEL_WIDTH).abs() < 1.0,
        "the side panel keeps its width with What would fit? listed: {side}"
    );
    // Nothing reaches past the window's right edge; the tab's widgets lie wholly inside.
    for n in h.query_all(by().predicate(|n| n.bounding_box().is_some())) {
        let r = n.rect();
        let what = format!("{:?} {:?}", n.accesskit_node().role(), n.value());
        assert!(
            r.max.x <= window.max.x + 0.5,
            "{what} cut off at the right: {r:?}"
        );
        if r.min.x > side {
            assert!(
                window.expand(0.5).contains_rect(r),
                "{what} outside the window: {r:?}"
            );
        }
    }
    // The table's last column shows.
    let result = h
        .query_all_by_label_contains("OOM at event 27")
        .map(|n| n.rect())
        .find(|r| r.min.x > side)
        .expect("the table's result column");
    assert!(window.contains_rect(result), "{result:?}");
    // Both maps inside the window, side by side; their labels and scale inside them, the
    // segment labels left of the bars.
    let app = h.state();
    let maps: Vec<MapGeometry> = (1..=2)
        .map(|layer| *app.map.drawn.get(&layer).expect("drawn"))
        .collect();
    assert!(maps[0].outer.max.x <= maps[1].outer.min.x);
    for m in &maps {
        assert!(window.contains_rect(m.outer), "{m:?}");
        assert!(m.labels.is_positive(), "segment labels drawn: {m:?}");
        assert!(
            m.outer.contains_rect(m.labels) && m.outer.contains_rect(m.ruler),
            "{m:?}"
        );
        assert!(
            m.labels.max.x <= m.content.min.x,
            "a label over the bars: {m:?}"
        );
    }
}

#[test]
fn a_widened_side_panel_is_back_to_its_default_width_for_the_next_trace() {
    let mut h = harness_1440(Startup::File(OOM_STORY_FILE.into()));
    let default = crate::gui::frame::SIDE_PANEL_WIDTH;
    assert!((h.state().side_panel_width - default).abs() < 1.0);
    // The user drags the panel's edge 200 points to the right.
    let edge = h.get_by_role(Role::Splitter).rect().center();
    h.hover_at(edge);
    h.step();
    h.drag_at(edge);
    h.step();
    for x in [20.0, 100.0, 200.0] {
        h.hover_at(edge + egui::vec2(x, 0.0));
        h.step();
    }
    h.drop_at(edge + egui::vec2(200.0, 0.0));
    settle(&mut h);
    let widened = h.state().side_panel_width;
    assert!(widened > default + 150.0, "dragged to {widened}");
    // The next trace opens with the panel at its default width.
    h.state_mut().start(Startup::File(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/traces/mlp_train.pickle.gz"
        )
        .into(),
    ));
    settle(&mut h);
    assert_eq!(
        h.state().document().map(|d| d.trace.name.as_str()),
        Some("mlp_train.pickle.gz")
    );
    let w = h.state().side_panel_width;
    assert!((w - default).abs() < 1.0, "{w}");
}
