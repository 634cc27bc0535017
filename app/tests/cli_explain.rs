//! `allocsim explain` and the two bounds of `compare` as outside tests call them: the JSON
//! of the CLI contract (docs/cli-explain.md), readable text with the sentence first,
//! one-line errors with exit 2.

mod common;

use common::{bad_input, json_of, run};

fn repo_trace(name: &str) -> String {
    common::repo_trace(&format!("{name}.pickle.gz"))
}

#[test]
fn explain_json_on_devfull_oom_has_the_contract_fields() {
    let v = json_of(&run(&["explain", &repo_trace("devfull_oom_msg"), "--json"]));
    for k in [
        "at_event",
        "pytorch_message",
        "holes",
        "blockers",
        "would_fit",
        "live_peak_bytes",
        "offline_peak_bytes",
        "capacity_bytes",
        "capacity_source",
    ] {
        assert!(v.get(k).is_some(), "explain lacks {k}: {v}");
    }
    assert_eq!(v["at_event"], 32);
    assert_eq!(v["capacity_source"], "recorded");
    let hole = &v["holes"][0];
    for k in ["bytes", "addr", "opened_at_event", "frames"] {
        assert!(hole.get(k).is_some(), "hole lacks {k}: {hole}");
    }
    let b = &v["blockers"][0];
    for k in [
        "site",
        "blocks",
        "bytes",
        "would_free_contiguous_bytes",
        "events",
    ] {
        assert!(b.get(k).is_some(), "blocker lacks {k}: {b}");
    }
    assert_eq!(b["site"], "capture.py:372 devfull_split_oom");
    let w = &v["would_fit"];
    assert!(w.get("best_config").is_some());
    // The smallest capacity that serves every request is above the one that failed.
    assert!(w["min_capacity_bytes"].as_u64().unwrap() >= v["capacity_bytes"].as_u64().unwrap());
    let (live, offline) = (
        v["live_peak_bytes"].as_u64().unwrap(),
        v["offline_peak_bytes"].as_u64().unwrap(),
    );
    assert!(live > 0 && live <= offline);
}

#[test]
fn explain_text_puts_pytorchs_sentence_first() {
    let out = run(&["explain", &repo_trace("devfull_oom_msg")]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("CUDA out of memory. Tried to allocate 23.60 GiB."),
        "{text}"
    );
    assert!(
        text.contains("allocated at capture.py:372 devfull_split_oom split"),
        "{text}"
    );
    assert!(text.contains("The best any allocator could do:"), "{text}");
}

#[test]
fn explain_bad_input_is_one_line_and_exit_2() {
    bad_input(
        &run(&["explain", "/nonexistent/trace.pickle"]),
        "/nonexistent/trace.pickle",
    );
    bad_input(
        &run(&["explain", &repo_trace("devfull_oom_msg"), "--at", "99999"]),
        "--at 99999",
    );
    bad_input(
        &run(&[
            "explain",
            &repo_trace("devfull_oom_msg"),
            "--allocator",
            "nope",
        ]),
        "nope",
    );
    assert_eq!(
        run(&["explain", &repo_trace("devfull_oom_msg"), "--at", "x"])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn compare_states_the_live_and_offline_bounds() {
    let args = [
        "compare",
        "--workload",
        "oom-story",
        "--allocators",
        "pytorch;bfc",
    ];
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let v = json_of(&run(&with_json));
    let live = v["live_peak_bytes"].as_u64().unwrap();
    let offline = v["offline_peak_bytes"].as_u64().unwrap();
    assert!(live <= offline);
    for r in v["results"].as_array().unwrap() {
        assert!(offline <= r["peak_reserved_bytes"].as_u64().unwrap() || r["oom"].is_object());
    }
    let text = String::from_utf8_lossy(&run(&args).stdout).to_string();
    assert!(text.contains("live bytes (lower bound)"), "{text}");
    assert!(text.contains("offline placement (best possible)"), "{text}");
}
