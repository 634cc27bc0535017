//! The capacity as recorded (issue: real OOMs as users bring them): on real snapshots of
//! runs that ran out of memory — the GPU itself full, or a memory fraction — a plain
//! `replay` finds the recorded OOMs at their events with PyTorch's own sentence, its peak
//! is `memory_stats()`'s, and `min-capacity`, `compare` and `recommend` agree with it.
//!
//! The traces are real recordings kept in the repository (`tests/traces/`, H100, PyTorch
//! 2.11; their `.stats.json` hold `memory_stats()` and the exception texts).

mod common;

use std::process::Output;

use allocsim_core::snapshot::Action;
use common::{json_of, run};
use serde_json::Value;

fn trace(name: &str) -> (String, Value) {
    let stats = std::fs::read(common::repo_traces().join(format!("{name}.stats.json")));
    (
        common::repo_trace(&format!("{name}.pickle.gz")),
        serde_json::from_slice(&stats.expect("stats")).expect("stats JSON"),
    )
}

/// The `oom` entries of the recording, read by the decoder alone (not by a replay).
fn recorded_oom_events(file: &str) -> Vec<u64> {
    let bytes = std::fs::read(file).expect("read");
    let snap = allocsim_core::snapshot::decode_snapshot(&bytes).expect("decodes");
    snap.device_traces[0]
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Oom)
        .map(|(i, _)| i as u64)
        .collect()
}

/// Real recordings that ran out of memory, none under a memory fraction except the last.
const OOM_TRACES: [&str; 5] = [
    "devfull_oom_msg",
    "devfull_oom_expand",
    "devfull_oom_empty_cache",
    "gpt2_big_batch_oom_msg",
    "graph_freed_oom",
];

#[test]
fn a_plain_replay_finds_the_recorded_ooms_with_the_capacity_as_recorded() {
    for name in OOM_TRACES {
        let (file, stats) = trace(name);
        let v = json_of(&run(&["replay", &file, "--json"]));
        assert_eq!(v["capacity_source"], "recorded", "{name}");
        let inferred = &v["capacity_inferred"];
        let cap = v["capacity_bytes"].as_u64().expect("a capacity");
        assert_eq!(cap + 1, inferred["high_bytes"].as_u64().unwrap(), "{name}");
        assert!(inferred["low_bytes"].as_u64().unwrap() <= cap, "{name}");
        assert!(
            v["capacity_note"]
                .as_str()
                .unwrap()
                .starts_with("capacity as recorded: "),
            "{name}: {}",
            v["capacity_note"]
        );
        // Every recorded OOM at its event, the program going on past each.
        let events: Vec<u64> = v["ooms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                assert_eq!(o["recorded"], true, "{name}: {o}");
                assert_eq!(o["fatal"], false, "{name}: {o}");
                o["event_index"].as_u64().unwrap()
            })
            .collect();
        assert_eq!(events, recorded_oom_events(&file), "{name}");
        assert_eq!(
            events.len() as u64,
            stats["memory_stats"]["num_ooms"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            v["peak_reserved_bytes"], stats["memory_stats"]["reserved_bytes.all.peak"],
            "{name}"
        );
    }
}

/// The parts of PyTorch's sentence a snapshot knows: the size tried and what PyTorch held.
fn known_parts(message: &str) -> (&str, &str) {
    let tried = message.find("Tried to allocate").expect("the size tried");
    let tried_end = message[tried..].find(". ").expect("end of sentence") + tried + 1;
    let held = message
        .find("Of the allocated memory")
        .expect("what PyTorch held");
    let held_end = message[held..]
        .find("unallocated.")
        .expect("end of sentence")
        + held
        + "unallocated.".len();
    (&message[..tried_end], &message[held..held_end])
}

#[test]
fn the_oom_messages_are_pytorchs_own_sentences() {
    for name in OOM_TRACES {
        let (file, stats) = trace(name);
        let v = json_of(&run(&["replay", &file, "--json"]));
        let real: Vec<&str> = stats["oom_messages"]
            .as_array()
            .expect("capture.py saved the exception texts")
            .iter()
            .map(|m| m.as_str().unwrap())
            .collect();
        let ooms = v["ooms"].as_array().unwrap();
        assert_eq!(ooms.len(), real.len(), "{name}");
        // The first OOM's full report; each of PyTorch's texts has our known parts.
        let ours = v["oom"]["pytorch_message"].as_str().expect("a message");
        let (tried, held) = known_parts(ours);
        assert!(
            tried.starts_with("CUDA out of memory. Tried to allocate "),
            "{ours}"
        );
        assert!(real[0].starts_with(tried), "{name}:\n{ours}\n{}", real[0]);
        assert!(real[0].contains(held), "{name}:\n{ours}\n{}", real[0]);
    }
}

#[test]
fn min_capacity_serves_every_request_and_two_mib_less_does_not() {
    for name in [
        "devfull_oom_msg",
        "gpt2_big_batch_oom_msg",
        "devfull_oom_expand",
    ] {
        let (file, _) = trace(name);
        let m = json_of(&run(&["min-capacity", &file, "--json"]));
        let c = m["min_capacity_bytes"].as_u64().unwrap();
        let at = json_of(&run(&[
            "replay",
            &file,
            "--capacity",
            &c.to_string(),
            "--json",
        ]));
        assert!(at["oom"].is_null(), "{name} at {c}: {}", at["oom"]);
        let below = c - (2 << 20);
        let below = json_of(&run(&[
            "replay",
            &file,
            "--capacity",
            &below.to_string(),
            "--json",
        ]));
        assert!(!below["oom"].is_null(), "{name} serves all 2 MiB below {c}");
        // The recording ran out of memory: its capacity is below what serves everything.
        let rec = json_of(&run(&["replay", &file, "--json"]));
        assert!(rec["capacity_bytes"].as_u64().unwrap() < c, "{name}");
    }
}

#[test]
fn none_forces_unlimited_and_the_recorded_ooms_are_served() {
    let (file, _) = trace("devfull_oom_msg");
    let v = json_of(&run(&["replay", &file, "--capacity", "none", "--json"]));
    assert_eq!(v["capacity_source"], "unlimited");
    assert!(v["capacity_bytes"].is_null() && v["capacity_inferred"].is_null());
    assert!(v["oom"].is_null() && v["ooms"].as_array().unwrap().is_empty());
    let text = String::from_utf8(run(&["replay", &file]).stdout).unwrap();
    assert!(text.contains("capacity as recorded: "), "{text}");
    assert!(
        text.contains("OUT OF MEMORY at event 32 (as recorded"),
        "{text}"
    );
    assert!(
        text.contains("CUDA out of memory. Tried to allocate 23.60 GiB."),
        "{text}"
    );
}

#[test]
fn compare_and_recommend_answer_at_the_recorded_capacity() {
    let (file, _) = trace("devfull_oom_msg");
    let replay = json_of(&run(&["replay", &file, "--json"]));
    let cap = &replay["capacity_bytes"];
    let v = json_of(&run(&[
        "compare",
        &file,
        "--allocators",
        "pytorch;pytorch@expandable_segments:True",
        "--json",
    ]));
    assert_eq!(&v["capacity_bytes"], cap);
    assert_eq!(v["capacity_source"], "recorded");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results[0]["oom"]["event_index"], 32);
    // Expandable segments unmap the freed holes: the request fits under the same capacity,
    // and the default's explanation says so.
    assert!(results[1]["oom"].is_null(), "{}", results[1]["oom"]);
    let e = results[0]["oom"]["explanation"].as_str().unwrap();
    assert!(
        e.ends_with("would have fit: pytorch@expandable_segments:True"),
        "{e}"
    );
    let r = json_of(&run(&["recommend", &file, "--json"]));
    assert_eq!(&r["capacity_bytes"], cap);
    assert_eq!(r["capacity_source"], "recorded");
    assert!(r["best"]["oom"].is_null(), "{}", r["best"]["oom"]);
    assert!(!r["default"]["oom"].is_null());
}

/// Exit 2 and exactly one line on stderr, `allocsim: …`, that contains `must_mention`.
fn one_line_usage_error(out: &Output, must_mention: &str) {
    common::bad_input(out, must_mention);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("allocsim: "), "{err}");
}

#[test]
fn sizes_need_a_unit_unless_they_are_whole_bytes_and_units_ignore_case() {
    let (file, _) = trace("devfull_oom_msg");
    // `1.2` is not one byte: refused with the unit it probably meant.
    one_line_usage_error(
        &run(&["replay", &file, "--capacity", "1.2"]),
        "did you mean 1.2GiB?",
    );
    one_line_usage_error(&run(&["replay", &file, "--capacity", "4096"]), "1 MiB");
    one_line_usage_error(
        &run(&["replay", &file, "--capacity", "-1"]),
        "bad size '-1'",
    );
    let lower = json_of(&run(&["replay", &file, "--capacity", "60gib", "--json"]));
    let upper = json_of(&run(&["replay", &file, "--capacity", "60GiB", "--json"]));
    assert_eq!(lower["capacity_bytes"], 60u64 << 30);
    assert_eq!(lower, upper);
    let bytes = json_of(&run(&[
        "replay",
        &file,
        "--capacity",
        "64424509440",
        "--json",
    ]));
    assert_eq!(bytes["capacity_bytes"], 60u64 << 30);
}

#[test]
fn usage_errors_are_one_line() {
    let (file, _) = trace("devfull_oom_msg");
    one_line_usage_error(&run(&["replay"]), "<FILE>");
    one_line_usage_error(&run(&["replay", &file, "--bogus"]), "'--bogus'");
    one_line_usage_error(&run(&["frobnicate"]), "'frobnicate'");
    // --help stays as it is.
    let help = run(&["replay", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).lines().count() > 5);
}
