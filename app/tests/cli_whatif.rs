//! `allocsim compare`, `min-capacity` and `recommend` as outside tests call them: the JSON
//! contract of DESIGN.md, `--workload` in place of FILE, one-line errors, stdout untouched
//! by the progress bar.

mod common;

use std::path::PathBuf;

use common::{assert_replay_object, bad_input, json_of, run};

/// `oom_story`, kept in the repository (`tests/traces`): the tests always run.
fn story() -> PathBuf {
    common::repo_traces().join("oom_story.pickle.gz")
}

#[test]
fn compare_on_oom_story_shows_which_models_fail_and_where() {
    let f = story();
    let v = json_of(&run(&[
        "compare",
        f.to_str().unwrap(),
        "--capacity",
        "2.2GiB",
        "--allocators",
        "pytorch;pytorch@expandable_segments:True;rmm-arena;vmm-stitch",
        "--json",
    ]));
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    results.iter().for_each(assert_replay_object);
    let cap = (2.2 * f64::from(1u32 << 30)) as u64;
    assert_eq!(results[0]["capacity_bytes"], cap);
    assert_eq!(results[0]["allocator"], "pytorch");
    assert_eq!(results[1]["config"], "expandable_segments:True");
    let oom = &results[0]["oom"];
    assert_eq!(oom["requested_bytes"], 400u64 << 20);
    let e = oom["explanation"].as_str().unwrap();
    assert!(e.starts_with("Tried to allocate 400.00 MiB; 2.00 GiB reserved by PyTorch, 1.12 GiB of it free in 6 holes, the largest 248.00 MiB"), "{e}");
    assert!(
        e.ends_with("would have fit: pytorch@expandable_segments:True, vmm-stitch"),
        "{e}"
    );
    assert!(results[1]["oom"].is_null() && results[3]["oom"].is_null());
    // The arena gets half the capacity and fails at the first (2 GiB) request.
    assert_eq!(results[2]["oom"]["requested_bytes"], 2u64 << 30);
}

#[test]
fn compare_defaults_to_every_model() {
    let v = json_of(&run(&["compare", "--workload", "oom-story", "--json"]));
    let names: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["allocator"].as_str().unwrap())
        .collect();
    for m in [
        "pytorch",
        "cuda-malloc",
        "bfc",
        "rmm-pool",
        "rmm-arena",
        "rmm-binning",
        "buddy",
        "tlsf",
        "vmm-stitch",
    ] {
        assert!(names.contains(&m), "{m} missing from {names:?}");
    }
    assert_eq!(
        names.len(),
        10,
        "every model plus pytorch@expandable_segments:True"
    );
}

#[test]
fn min_capacity_is_consistent_with_replay() {
    let f = story();
    let f = f.to_str().unwrap();
    let replay_at = |allocator: &str, cap: u64| {
        json_of(&run(&[
            "replay",
            f,
            "--allocator",
            allocator,
            "--capacity",
            &cap.to_string(),
            "--json",
        ]))
    };
    for allocator in [
        "pytorch",
        "pytorch@expandable_segments:True",
        "bfc",
        "buddy",
        "vmm-stitch",
    ] {
        let v = json_of(&run(&[
            "min-capacity",
            f,
            "--allocator",
            allocator,
            "--json",
        ]));
        assert_eq!(v["allocator"], allocator.split('@').next().unwrap());
        let c = v["min_capacity_bytes"].as_u64().unwrap();
        assert_eq!(c % (2 << 20), 0);
        // Every request served at C — the one the recording failed too — and not 2 MiB below.
        let at = replay_at(allocator, c);
        assert!(
            at["oom"].is_null(),
            "{allocator} serves all at {c}: {}",
            at["oom"]
        );
        let below = replay_at(allocator, c - (2 << 20));
        assert!(!below["oom"].is_null(), "{allocator} fails at {c} − 2 MiB");
    }
    // The default allocator needs the 2 GiB block plus the 400 MiB request: the replay at
    // the recorded capacity (just below that) and min-capacity agree.
    let v = json_of(&run(&["min-capacity", f, "--json"]));
    assert_eq!(v["min_capacity_bytes"], 2448u64 << 20);
}

#[test]
fn recommend_finds_a_config_that_fits_oom_story() {
    let f = story();
    let v = json_of(&run(&[
        "recommend",
        f.to_str().unwrap(),
        "--capacity",
        "2.2GiB",
        "--json",
    ]));
    assert_eq!(v["candidates_tried"], 168);
    assert_eq!(v["capacity_bytes"], (2.2 * f64::from(1u32 << 30)) as u64);
    assert_replay_object(&v["default"]);
    assert_replay_object(&v["best"]);
    assert!(!v["default"]["oom"].is_null());
    assert!(v["best"]["oom"].is_null(), "{}", v["best"]);
    let e = v["default"]["oom"]["explanation"].as_str().unwrap();
    assert!(
        e.contains(&format!(
            "would have fit: pytorch@{}",
            v["best"]["config"].as_str().unwrap()
        )),
        "{e}"
    );
}

#[test]
fn text_output_and_progress_leave_stdout_to_the_result() {
    let out = run(&[
        "compare",
        "--workload",
        "oom-story",
        "--capacity",
        "2.2GiB",
        "--allocators",
        "pytorch;vmm-stitch",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("peak reserved"), "{text}");
    assert!(text.contains("Tried to allocate 400.00 MiB"), "{text}");
    // Not a terminal: the bar draws nothing.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&[
        "recommend",
        "--workload",
        "oom-story",
        "--capacity",
        "2.2GiB",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("PYTORCH_CUDA_ALLOC_CONF="));
}

#[test]
fn replay_takes_a_workload_in_place_of_file() {
    let v = json_of(&run(&[
        "replay",
        "--workload",
        "oom-story",
        "--capacity",
        "2.2GiB",
        "--json",
    ]));
    assert_eq!(v["events"], 20);
    assert_eq!(v["oom"]["requested_bytes"], 400u64 << 20);
    let v = json_of(&run(&[
        "replay",
        "--workload",
        "kvcache:tokens=50,layers=2",
        "--allocator",
        "tlsf",
        "--json",
    ]));
    assert_eq!(v["allocator"], "tlsf");
    assert!(v["oom"].is_null());
}

#[test]
fn bad_what_if_input_is_one_line_and_exit_2() {
    bad_input(
        &run(&["compare", "--workload", "nope", "--json"]),
        "unknown kind 'nope'",
    );
    bad_input(
        &run(&[
            "compare",
            "--workload",
            "oom-story",
            "--allocators",
            "pytorch;jemalloc",
        ]),
        "unknown allocator 'jemalloc'",
    );
    bad_input(
        &run(&[
            "compare",
            "--workload",
            "oom-story",
            "--allocators",
            "bfc@allow_growth:maybe",
        ]),
        "allow_growth",
    );
    bad_input(
        &run(&["min-capacity", "--workload", "train:steps=0"]),
        "steps must be within",
    );
    bad_input(
        &run(&[
            "min-capacity",
            "--workload",
            "oom-story",
            "--allocator",
            "tlsf",
            "--config",
            "sli:9",
        ]),
        "sli",
    );
    // Argument errors are clap's (exit 2, the reason on stderr).
    let bad_size = run(&[
        "recommend",
        "--workload",
        "oom-story",
        "--capacity",
        "2.2XB",
    ]);
    assert_eq!(bad_size.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad_size.stderr).contains("unknown unit"));
    bad_input(
        &run(&["compare", "/nonexistent/trace.pickle"]),
        "/nonexistent/trace.pickle",
    );
    let both = run(&["compare", "x.pickle", "--workload", "oom-story"]);
    assert_eq!(both.status.code(), Some(2));
    let neither = run(&["recommend", "--capacity", "1GiB"]);
    assert_eq!(neither.status.code(), Some(2));
}
