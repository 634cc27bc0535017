//! The `allocsim` command line as users and outside tests call it: exit codes, one-line
//! errors on hostile input, the JSON contract.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{repo_traces, run};

fn traces() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces");
    if p.is_dir() {
        Some(p)
    } else {
        println!("skipped: ../shared/traces not found");
        None
    }
}

fn tmp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allocsim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Exit code 2, nothing on stdout, exactly one line on stderr naming the file.
fn assert_bad_input(out: &Output, file: &Path, must_mention: &str) {
    let err = common::one_line_error(out, 2);
    assert!(
        err.contains(&file.display().to_string()),
        "names the file: {err}"
    );
    assert!(
        err.to_lowercase().contains(&must_mention.to_lowercase()),
        "mentions '{must_mention}': {err}"
    );
}

fn json_snapshot(events: &str) -> Vec<u8> {
    format!(r#"{{"segments": [], "device_traces": [[{events}]], "allocator_settings": {{"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1}}}}"#).into_bytes()
}

/// A trace that fails in its build after the ops of more than one piece went to the
/// replay beside it (`allocsim replay FILE` replays while the trace is built): the build's
/// one-line error with the event index, exit 2, and no hang.
#[test]
fn a_build_that_fails_after_its_first_pieces_fails_as_the_build_says() {
    let seg = r#"{"action": "segment_alloc", "addr": 1048576, "size": 2097152, "stream": 0}"#;
    let pair = r#"{"action": "alloc", "addr": 1048576, "size": 512, "stream": 0},
        {"action": "free_requested", "addr": 1048576, "size": 512, "stream": 0},
        {"action": "free_completed", "addr": 1048576, "size": 512, "stream": 0}"#;
    let pairs = 40_000; // 80,000 ops: more than one piece (65,536) before the failure
    let mut events = vec![seg.to_string()];
    events.extend(std::iter::repeat_n(pair.to_string(), pairs));
    events.push(
        r#"{"action": "segment_alloc", "addr": 8388608, "size": 2097152, "stream": 0}"#.into(),
    );
    let f = tmp_file("fails_late.json", &json_snapshot(&events.join(",")));
    let out = run(&["replay", f.to_str().unwrap()]);
    assert_bad_input(&out, &f, &format!("event {}", 1 + 3 * pairs));
    assert_bad_input(&out, &f, "outside any malloc");
}

#[test]
fn refused_pickle_opcodes_are_never_executed() {
    // GLOBAL os.system, then REDUCE: a classic pickle exploit.
    let evil = b"\x80\x02cos\nsystem\nq\x00X\x05\x00\x00\x00touchq\x01\x85q\x02Rq\x03.";
    let f = tmp_file("evil.pickle", evil);
    assert_bad_input(&run(&["validate", f.to_str().unwrap()]), &f, "GLOBAL");
    let stack_global = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93.";
    let f = tmp_file("evil4.pickle", stack_global);
    assert_bad_input(&run(&["replay", f.to_str().unwrap()]), &f, "STACK_GLOBAL");
}

#[test]
fn truncated_huge_and_deep_inputs_fail_cleanly() {
    let huge = [
        &b"\x80\x04\x8d"[..],
        &10_000_000_000u64.to_le_bytes(),
        b"abc",
    ]
    .concat();
    let f = tmp_file("huge.pickle", &huge);
    assert_bad_input(&run(&["validate", f.to_str().unwrap()]), &f, "byte");
    let mut deep = b"\x80\x02".to_vec();
    deep.extend(std::iter::repeat_n(b']', 2_000_000));
    deep.extend(std::iter::repeat_n(b'a', 1_999_999));
    deep.push(b'.');
    let f = tmp_file("deep.pickle", &deep);
    let t = std::time::Instant::now();
    let out = run(&["validate", f.to_str().unwrap()]);
    assert_bad_input(&out, &f, "byte");
    assert!(t.elapsed().as_secs() < 30, "deep nesting must not hang");
    {
        let gz = std::fs::read(repo_traces().join("mlp_train.pickle.gz")).unwrap();
        for cut in [10, 1000, gz.len() / 2] {
            let f = tmp_file(&format!("cut{cut}.pickle.gz"), &gz[..cut]);
            let out = run(&["validate", f.to_str().unwrap()]);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let f = tmp_file("garbage.bin", b"\x00\x01\x02 not a snapshot");
    assert_bad_input(&run(&["validate", f.to_str().unwrap()]), &f, "snapshot");
}

/// A pickle of many decoding windows (the CLI reads FILE in pieces), cut at two thirds:
/// one line with the file and the byte offset in the whole file, the offset the
/// whole-file decoder gives.
#[test]
fn a_truncated_big_pickle_names_the_file_and_the_offset_in_the_whole_file() {
    let Some(dir) = traces() else { return };
    let gz = std::fs::read(dir.join("kvcache_decode.pickle.gz")).unwrap();
    let plain = allocsim_core::snapshot::import::gunzip(&gz, u64::MAX).unwrap();
    assert!(
        plain.len() > 8 << 20,
        "several 4 MiB pieces and 1 MiB windows"
    );
    let cut = &plain[..plain.len() * 2 / 3];
    let want = allocsim_core::snapshot::decode_snapshot(cut).expect_err("truncated");
    let f = tmp_file("kvcache_cut.pickle", cut);
    let out = run(&["replay", f.to_str().unwrap()]);
    assert_bad_input(&out, &f, "truncated pickle");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        format!("allocsim: {}: {want}", f.display())
    );
}

#[test]
fn bad_traces_name_the_event() {
    let unknown =
        json_snapshot(r#"{"action": "free_requested", "addr": 4096, "size": 512, "stream": 0}"#);
    let f = tmp_file("unknown_free.json", &unknown);
    assert_bad_input(&run(&["replay", f.to_str().unwrap()]), &f, "event 0");
    let twice = json_snapshot(
        r#"{"action": "segment_alloc", "addr": 1048576, "size": 2097152, "stream": 0},
           {"action": "alloc", "addr": 1048576, "size": 512, "stream": 0},
           {"action": "free_requested", "addr": 1048576, "size": 512, "stream": 0},
           {"action": "free_completed", "addr": 1048576, "size": 512, "stream": 0},
           {"action": "free_requested", "addr": 1048576, "size": 512, "stream": 0}"#,
    );
    let f = tmp_file("double_free.json", &twice);
    assert_bad_input(&run(&["validate", f.to_str().unwrap()]), &f, "event 4");
    let negative = json_snapshot(r#"{"action": "alloc", "addr": 4096, "size": -5, "stream": 0}"#);
    let f = tmp_file("negative.json", &negative);
    assert_bad_input(&run(&["validate", f.to_str().unwrap()]), &f, "size");
    let missing = Path::new("/nonexistent/trace.pickle");
    assert_bad_input(
        &run(&["validate", missing.to_str().unwrap()]),
        missing,
        "cannot read",
    );
}

#[test]
fn usage_errors_exit_2() {
    let f = repo_traces().join("oom_story.pickle.gz");
    let out = run(&[
        "replay",
        f.to_str().unwrap(),
        "--config",
        "expandable_segments:true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("True/False"));
    // A typo in a key of --config is a usage error, while a snapshot's own config string
    // with a key this build does not know is kept and reported (core's config tests).
    let out = run(&[
        "replay",
        f.to_str().unwrap(),
        "--config",
        "throw_on_cudamaloc_oom:True",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unrecognized key 'throw_on_cudamaloc_oom'")
    );
    let out = run(&[
        "replay",
        f.to_str().unwrap(),
        "--config",
        "throw_on_cudamalloc_oom:True,pinned_free_catch_all:True",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["replay", f.to_str().unwrap(), "--capacity", "2.2XB"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["replay", f.to_str().unwrap(), "--allocator", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["replay", f.to_str().unwrap(), "--trace-device", "7"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    // A config given both in --allocator NAME@CONF and in --config: a usage error, one
    // line, before the file is read (every command that takes both).
    for cmd in ["replay", "min-capacity", "explain"] {
        let out = run(&[
            cmd,
            "no-such-file",
            "--allocator",
            "pytorch@max_split_size_mb:64",
            "--config",
            "expandable_segments:True",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert!(out.stdout.is_empty());
        assert_eq!(err.trim_end().lines().count(), 1, "{cmd}: {err}");
        assert!(err.contains("both give a config"), "{cmd}: {err}");
    }
    // Config errors are labelled as such; a question the trace cannot answer is not.
    let out = run(&["replay", f.to_str().unwrap(), "--allocator", "bfc@nope:1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        err.contains("bad allocator config: bfc: unknown config key 'nope'"),
        "{err}"
    );
    let out = run(&["explain", f.to_str().unwrap(), "--at", "999999999"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        err.contains("--at 999999999") && !err.contains("config"),
        "{err}"
    );
}

#[test]
fn validate_json_contract_and_exit_codes() {
    let f = repo_traces().join("oom_story.pickle.gz");
    let out = run(&[
        "validate",
        f.to_str().unwrap(),
        "--capacity",
        "2362232013",
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.trim_start().starts_with("{\n  \"schema\": 1"),
        "schema first: {text}"
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["exact"], true);
    assert_eq!(v["events_compared"], v["events_matched"]);
    assert!(v["first_divergence"].is_null());
    assert_eq!(v["peak_reserved_bytes"]["recorded"], 2_147_483_648u64);
    // A 2.11 recording: no host memory, annotations or unknown keys.
    let x = &v["snapshot"];
    assert_eq!(x["host_segments"]["count"], 0);
    assert_eq!(x["host_segments"]["total_bytes"], 0);
    assert_eq!(x["annotate_entries"], 0);
    assert_eq!(x["unknown_config_keys"], serde_json::json!([]));
    // gc_frees needs its cap: without it the recording's partial release cannot be
    // explained, and validate says so (exit 1) instead of passing.
    let Some(dir) = traces() else { return };
    let f = dir.join("gc_frees.pickle.gz");
    let out = run(&["validate", f.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exact"], false);
    let ctx = v["first_divergence"]["context"].as_str().unwrap();
    assert!(ctx.contains("unknown: the memory cap"), "{ctx}");
    let out = run(&["validate", f.to_str().unwrap(), "--capacity", "4GiB"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn replay_json_reports_the_oom_story() {
    let f = repo_traces().join("oom_story.pickle.gz");
    let out = run(&[
        "replay",
        f.to_str().unwrap(),
        "--capacity",
        "2362232013",
        "--json",
    ]);
    let v = common::json_of(&out);
    common::assert_replay_object(&v);
    assert_eq!(v["oom"]["requested_bytes"], 419_430_400u64);
    assert_eq!(v["oom"]["free_holes"], 6);
    let e = v["oom"]["explanation"].as_str().unwrap();
    assert!(e.starts_with("Tried to allocate 400.00 MiB; 2.00 GiB reserved by PyTorch, 1.12 GiB of it free in 6 holes, the largest 248.00 MiB"), "{e}");
    let out = run(&[
        "replay",
        f.to_str().unwrap(),
        "--capacity",
        "2362232013",
        "--config",
        "expandable_segments:True",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["oom"].is_null(), "expandable segments fit: {v}");
    let text = run(&["replay", f.to_str().unwrap(), "--capacity", "2.2GiB"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("OUT OF MEMORY"));
}

/// A device index PyTorch cannot record (it is an `int8_t`) is refused in one line, never
/// walked up to (2^32 − 2 devices) nor wrapped to none (2^32 − 1 made `validate` report
/// no device at all).
#[test]
fn impossible_device_indexes_are_refused() {
    let snapshot = |device: u64| {
        format!(
            r#"{{"segments": [{{"device": {device}, "address": 1048576, "total_size": 2097152, "stream": 0, "segment_type": "small", "allocated_size": 0, "active_size": 0, "requested_size": 0, "blocks": [{{"size": 2097152, "requested_size": 0, "state": "inactive"}}]}}], "device_traces": [[]]}}"#
        )
    };
    let ok = tmp_file("device0.json", snapshot(0).as_bytes());
    assert_eq!(
        run(&["validate", ok.to_str().unwrap()]).status.code(),
        Some(0)
    );
    for device in [128, (1u64 << 32) - 2, (1u64 << 32) - 1] {
        let f = tmp_file(&format!("device{device}.json"), snapshot(device).as_bytes());
        for cmd in ["validate", "replay"] {
            let out = run(&[cmd, f.to_str().unwrap()]);
            assert_bad_input(
                &out,
                &f,
                &format!("device {device} is not a CUDA device index"),
            );
        }
    }
}
