//! `allocsim cuda-replay` as outside tests call it. Without a GPU (CI): exit 3 with one
//! line on stderr, nothing on stdout, and `skipped: <reason>`. On the GPU machine the same
//! tests check the JSON contract of DESIGN.md on a real trace (`ALLOCSIM_BIN` and
//! `ALLOCSIM_TRACES` point a carried test binary at a carried CLI and traces).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::run;

fn trace(name: &str) -> Option<PathBuf> {
    let dir = std::env::var("ALLOCSIM_TRACES").map_or_else(
        |_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces"),
        PathBuf::from,
    );
    let p = dir.join(name);
    if p.is_file() {
        Some(p)
    } else {
        println!("skipped: {} not found", p.display());
        None
    }
}

/// Exit 3 with one line and nothing on stdout: the machine has no CUDA. Returns true
/// (after printing `skipped: …`) in that case.
fn unavailable(out: &Output) -> bool {
    if out.status.code() != Some(3) {
        return false;
    }
    let err = common::one_line_error(out, 3);
    assert!(
        err.contains("CUDA") || err.contains("cuda"),
        "says what is missing: {err}"
    );
    println!("skipped: {}", err.trim_end());
    true
}

#[test]
fn cuda_replay_of_oom_story_under_its_cap_reports_the_design_json() {
    let Some(t) = trace("oom_story.pickle.gz") else {
        return;
    };
    let file = t.to_string_lossy().to_string();
    // 2.2 GiB, as round(fraction × total) for the recorded cap.
    let out = run(&[
        "cuda-replay",
        &file,
        "--capacity",
        "2362232013",
        "--verify-data",
        "--json",
    ]);
    if unavailable(&out) {
        return;
    }
    let v = common::json_of(&out);
    for key in [
        "schema",
        "device",
        "mode",
        "allocator",
        "config",
        "capacity_bytes",
        "balloon_free_bytes",
        "events",
        "segment_events",
        "reserved_agreement",
        "oom",
        "latency_us",
        "verify_data",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    for key in ["ordinal", "name", "total_bytes", "free_bytes_at_start"] {
        assert!(v["device"].get(key).is_some(), "device.{key}");
    }
    for key in ["alloc", "free", "map", "unmap"] {
        for stat in ["count", "p50", "p99", "max"] {
            assert!(
                v["latency_us"][key].get(stat).is_some(),
                "latency_us.{key}.{stat}"
            );
        }
    }
    let a = &v["reserved_agreement"];
    assert_eq!(a["events_equal"], a["events_compared"], "{v}");
    // The recorded OOM (the 400 MiB request) happens on the GPU and in the simulation.
    assert_eq!(v["oom"]["real_event_index"], 27);
    assert_eq!(v["oom"]["simulated_event_index"], 27);
    assert_eq!(v["verify_data"]["mismatches"], 0);
    assert_eq!(v["mode"], "model");
}

#[test]
fn cuda_replay_raw_mode_and_balloon_run_or_say_why() {
    let Some(t) = trace("oom_story.pickle.gz") else {
        return;
    };
    let file = t.to_string_lossy().to_string();
    let out = run(&["cuda-replay", &file, "--mode", "raw", "--json"]);
    if unavailable(&out) {
        return;
    }
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "raw");
    assert_eq!(v["allocator"], "cuda-malloc");
    let out = run(&["cuda-replay", &file, "--balloon", "2.2GiB", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["balloon_free_bytes"]
            .as_u64()
            .is_some_and(|b| b >= 2_362_232_012),
        "{v}"
    );
    assert_eq!(
        v["oom"]["real_event_index"],
        v["oom"]["simulated_event_index"]
    );
}

#[test]
fn cuda_replay_bad_input_is_exit_2_even_without_a_gpu() {
    let out = run(&["cuda-replay", "/nonexistent/snapshot.pickle", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    let out = run(&[
        "cuda-replay",
        "/nonexistent/snapshot.pickle",
        "--mode",
        "sideways",
    ]);
    assert_eq!(out.status.code(), Some(2));
}
