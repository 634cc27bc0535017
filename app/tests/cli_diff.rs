//! `allocsim diff` as outside tests call it, on the real recordings of
//! `tests/traces/diff/` (capture.py's `diff_train` at batch 256 and 1024, and at 256 under
//! `expandable_segments:True`): the JSON of the contract, the site that grew checked
//! against the sizes the script allocates, the peaks against the recording's own
//! `memory_stats`, one-line errors with exit 2.

mod common;

use common::{bad_input, json_of, run};
use serde_json::Value;

fn diff_trace(name: &str) -> String {
    common::repo_trace(&format!("diff/{name}.pickle.gz"))
}

/// `memory_stats()[key]` of a recording, from its `.stats.json`.
fn memory_stat(name: &str, key: &str) -> i64 {
    common::memory_stat(
        &common::repo_traces().join(format!("diff/{name}.stats.json")),
        key,
    )
}

fn i(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("an integer: {v}"))
}

#[test]
fn batch_1024_against_256_names_the_input_that_grew_by_the_scripts_sizes() {
    let (a, b) = ("diff_train_bs256", "diff_train_bs1024");
    let v = json_of(&run(&["diff", &diff_trace(a), &diff_trace(b), "--json"]));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys[..9],
        [
            "schema",
            "a",
            "b",
            "align",
            "peak_reserved_delta_bytes",
            "peak_allocated_delta_bytes",
            "free_at_peak_delta_bytes",
            "by_site",
            "settings_differ"
        ]
    );
    for side in ["a", "b"] {
        for k in [
            "file",
            "peak_reserved_bytes",
            "peak_allocated_bytes",
            "peak_event",
            "fragmentation_at_peak",
            "config",
        ] {
            assert!(v[side].get(k).is_some(), "{side} lacks {k}: {v}");
        }
    }
    // The replays' peaks are the recordings' own (memory_stats at the end of each run).
    for (side, name) in [("a", a), ("b", b)] {
        assert_eq!(
            i(&v[side]["peak_reserved_bytes"]),
            memory_stat(name, "reserved_bytes.all.peak")
        );
        assert_eq!(
            i(&v[side]["peak_allocated_bytes"]),
            memory_stat(name, "allocated_bytes.all.peak")
        );
    }
    assert_eq!(
        i(&v["peak_reserved_delta_bytes"]),
        memory_stat(b, "reserved_bytes.all.peak") - memory_stat(a, "reserved_bytes.all.peak")
    );
    // diff_train: x = torch.randn(batch, 4096) is batch × 4096 × 4 bytes, y =
    // torch.randint(0, 16, (batch,)) batch × 8; both live at the peak of each run.
    let sites = v["by_site"].as_array().unwrap();
    let top = &sites[0];
    assert!(
        top["site"].as_str().unwrap().starts_with("capture.py:")
            && top["site"].as_str().unwrap().ends_with(" diff_train"),
        "{top}"
    );
    assert_eq!(i(&top["a_bytes"]), 256 * 4096 * 4);
    assert_eq!(i(&top["b_bytes"]), 1024 * 4096 * 4);
    assert_eq!(i(&top["delta_bytes"]), (1024 - 256) * 4096 * 4);
    let second = &sites[1];
    assert_eq!(
        (i(&second["a_bytes"]), i(&second["b_bytes"])),
        (256 * 8, 1024 * 8)
    );
    // Nothing else changed at the peak: the parameters, gradients and Adam's state are
    // the same at both batch sizes.
    assert!(sites[2..].iter().all(|s| i(&s["delta_bytes"]) == 0), "{v}");
    // The change of peak reserved splits exactly into sites and reserved-but-free.
    let by_sites: i64 = sites.iter().map(|s| i(&s["delta_bytes"])).sum();
    assert_eq!(
        by_sites + i(&v["free_at_peak_delta_bytes"]),
        i(&v["peak_reserved_delta_bytes"])
    );
    for side in ["a", "b"] {
        let per_site: i64 = sites
            .iter()
            .map(|s| i(&s[format!("{side}_bytes").as_str()]))
            .sum();
        assert_eq!(per_site, i(&v[side]["allocated_at_peak_bytes"]));
    }
    assert_eq!(v["settings_differ"], serde_json::json!([]));
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.starts_with(
            "B peaks 152.00 MiB higher (1.36 GiB → 1.50 GiB reserved): +12.00 MiB at capture.py:"
        ),
        "{summary}"
    );
    assert!(summary.contains("more reserved-but-free"), "{summary}");
}

#[test]
fn expandable_segments_is_the_setting_that_differs_and_steps_come_from_the_optimizer() {
    let v = json_of(&run(&[
        "diff",
        &diff_trace("diff_train_bs256"),
        &diff_trace("diff_train_bs256_expand"),
        "--align",
        "steps",
        "--json",
    ]));
    assert_eq!(
        v["settings_differ"],
        serde_json::json!([{"setting": "expandable_segments", "a": null, "b": "True"}])
    );
    assert_eq!(v["b"]["config"], "expandable_segments:True");
    assert_eq!(v["align"], "steps");
    assert_eq!(v["a"]["steps"], "optimizer");
    // The same program: the same allocated peak, in the same step.
    assert_eq!(i(&v["peak_allocated_delta_bytes"]), 0);
    assert_eq!(
        i(&v["b"]["peak_reserved_bytes"]),
        memory_stat("diff_train_bs256_expand", "reserved_bytes.all.peak")
    );
    let (pa, pb) = (
        v["a"]["peak_at"].as_f64().unwrap(),
        v["b"]["peak_at"].as_f64().unwrap(),
    );
    // Step numbers are small whole numbers plus a fraction: compared as integers.
    assert_eq!(
        pa.floor() as i64,
        pb.floor() as i64,
        "peaks in one step: {pa} {pb}"
    );
    assert!(
        v["summary"]
            .as_str()
            .unwrap()
            .ends_with("settings differ: expandable_segments default → True"),
        "{}",
        v["summary"]
    );
}

#[test]
fn a_setting_given_for_b_is_diffed_against_a_own() {
    let f = diff_trace("diff_train_bs256");
    let v = json_of(&run(&[
        "diff",
        &f,
        &f,
        "--config-b",
        "expandable_segments:True",
        "--align",
        "events",
        "--json",
    ]));
    assert_eq!(v["b"]["config"], "expandable_segments:True");
    assert_eq!(i(&v["peak_allocated_delta_bytes"]), 0);
    assert!(
        v["by_site"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| i(&s["delta_bytes"]) == 0)
    );
    // On the event axis a peak sits at its own event.
    // Event indices are whole numbers, exact in an f64.
    assert_eq!(
        v["a"]["peak_at"].as_f64().unwrap() as u64,
        v["a"]["peak_event"].as_u64().unwrap()
    );
    assert_eq!(
        v["a"]["peak_at"].as_f64().unwrap().fract().to_bits(),
        0f64.to_bits()
    );
}

#[test]
fn text_starts_with_the_sentence_and_lists_the_sites() {
    let out = run(&[
        "diff",
        &diff_trace("diff_train_bs256"),
        &diff_trace("diff_train_bs1024"),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap();
    assert!(first.starts_with("B peaks 152.00 MiB higher"), "{text}");
    assert!(
        text.contains("+12.00 MiB      4.00 MiB → 16.00 MiB"),
        "{text}"
    );
    assert!(text.contains("Settings: the same"), "{text}");
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let good = diff_trace("diff_train_bs256");
    let dir = std::env::temp_dir().join(format!("allocsim-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("broken.pickle");
    std::fs::write(&bad, b"\x80\x04\x95garbage").unwrap();
    let bad = bad.to_str().unwrap();
    bad_input(&run(&["diff", &good, bad]), "broken.pickle");
    bad_input(
        &run(&["diff", &good, "/nonexistent/b.pickle"]),
        "/nonexistent/b.pickle",
    );
    bad_input(&run(&["diff", &good, &good, "--align", "weeks"]), "weeks");
    bad_input(
        &run(&[
            "diff",
            &good,
            &good,
            "--config-b",
            "expandable_segments:Maybe",
        ]),
        "expandable_segments",
    );
    // oom_story has no optimizer and no markers: no steps.
    let story = common::repo_trace("oom_story.pickle.gz");
    bad_input(
        &run(&["diff", &story, &story, "--align", "steps"]),
        "no steps to align on",
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A snapshot with a `train_step` marker before each of three steps, one 512·k-byte
/// allocation per step (as PyTorch ≥ 2.8 writes `user_defined` entries).
fn marked_snapshot() -> Value {
    let addr: u64 = 0x7f00_0000_0000;
    let mut ev = Vec::new();
    let mut t = 2;
    let mut push = |v: Value| {
        ev.push(v);
    };
    for step in 0..3u64 {
        let size = 512 * (step + 1);
        let e = |action: &str, a: u64, s: u64, t: u64| serde_json::json!({"action": action, "addr": a, "size": s, "stream": 0, "time_us": t, "frames": []});
        let mut marker = e("user_defined", 0, 0, t);
        marker["user_metadata"] = "train_step".into();
        push(marker);
        t += 1;
        if step == 0 {
            push(e("segment_alloc", addr, 2 << 20, t));
            t += 1;
        }
        for action in ["alloc", "free_requested", "free_completed"] {
            push(e(action, addr, size, t));
            t += 1;
        }
    }
    serde_json::json!({
        "segments": [{"device": 0, "address": addr, "total_size": 2 << 20, "allocated_size": 0,
            "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "small",
            "segment_pool_id": [0, 0], "is_expandable": false, "frames": [],
            "blocks": [{"address": addr, "size": 2 << 20, "requested_size": 0, "state": "inactive", "frames": []}]}],
        "device_traces": [ev],
    })
}

#[test]
fn steps_come_from_repeated_markers_where_the_snapshot_has_them() {
    let dir = std::env::temp_dir().join(format!("allocsim-diff-markers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("marked.json");
    std::fs::write(&f, marked_snapshot().to_string()).unwrap();
    let f = f.to_str().unwrap();
    let v = json_of(&run(&["diff", f, f, "--align", "steps", "--json"]));
    assert_eq!(
        v["a"]["steps"],
        serde_json::json!({"markers": {"text": "train_step"}})
    );
    // Markers at events 0, 5 and 9; the peak (the segment's first allocation) at event 2:
    // 2/5 of the way through step 0.
    assert_eq!(i(&v["a"]["peak_event"]), 2);
    assert_eq!(
        (v["a"]["peak_at"].as_f64().unwrap() * 10.0).round() as i64,
        4
    );
    std::fs::remove_dir_all(&dir).ok();
}
