//! UI tests of what a new user stumbled on in the first hour (issue 16): each stumble
//! driven through the whole app as in [`super::tests`].

use std::collections::BTreeSet;

use egui::accesskit::Role;
use egui_kittest::kittest::Queryable;

use super::Startup;
use super::engine::wire::block_state;
use super::tests::{harness, has_text, settle};

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
                r.fragmentation.get(c).expect("sampled") * 100.0
            ),
            r.data.reserved_bytes[c],
            r.data.allocated_bytes[c],
            r.data.largest_free_bytes[c],
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
        super::panels::fragmentation_hover(1 << 30, 1 << 30, 0)
            .ends_with("here: nothing is free, so 0%")
    );
}
