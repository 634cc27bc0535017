//! What the CLI tests share: running the built `allocsim`, the repository's traces, and
//! the contract's checks of an answer (one JSON object, `"schema": 1` first) and of a
//! refusal (exit 2, one line on stderr). Each test crate uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The `allocsim` binary: cargo's build of it, or `ALLOCSIM_BIN` (a binary carried to the
/// GPU machine).
pub fn allocsim() -> Command {
    let bin = std::env::var("ALLOCSIM_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_allocsim").to_string());
    Command::new(bin)
}

/// Runs `allocsim ARGS` to the end.
pub fn run(args: &[&str]) -> Output {
    allocsim().args(args).output().expect("run allocsim")
}

/// The real snapshots kept in the repository (`tests/traces`): always there.
pub fn repo_traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/traces")
}

/// `tests/traces/<name>` as a command-line argument.
pub fn repo_trace(name: &str) -> String {
    repo_traces()
        .join(name)
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

/// `memory_stats()[key]` of a recording, from the `.stats.json` at `path`.
pub fn memory_stat(path: &Path, key: &str) -> i64 {
    let v: Value = serde_json::from_slice(&std::fs::read(path).expect("stats")).expect("json");
    v["memory_stats"][key].as_i64().expect(key)
}

/// Exit 0, stdout exactly one JSON object whose first key is `"schema": 1`.
pub fn json_of(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.trim_start().starts_with("{\n  \"schema\": 1,"),
        "schema first: {stdout}"
    );
    serde_json::from_str(&stdout).expect("one JSON object on stdout")
}

/// Exit `code`, nothing on stdout, exactly one line on stderr: that line.
pub fn one_line_error(out: &Output, code: i32) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(
        out.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err.trim_end().to_string()
}

/// Exit 2, nothing on stdout, exactly one line on stderr that contains `must_mention`.
pub fn bad_input(out: &Output, must_mention: &str) {
    let err = one_line_error(out, 2);
    assert!(err.contains(must_mention), "mentions {must_mention}: {err}");
}

/// An integer of a JSON answer.
pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("an integer: {v}"))
}

/// A fresh folder of this test process under the system's temporary folder.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("allocsim-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The keys every replay object has (DESIGN.md; also each of `compare`'s `results`).
pub const REPLAY_KEYS: [&str; 15] = [
    "schema",
    "allocator",
    "config",
    "capacity_bytes",
    "events",
    "requests",
    "peak_reserved_bytes",
    "peak_allocated_bytes",
    "peak_requested_bytes",
    "final_reserved_bytes",
    "internal_waste_bytes_at_peak",
    "fragmentation_at_peak",
    "max_fragmentation",
    "segment_ops",
    "oom",
];

/// `v` has every key of a replay object.
pub fn assert_replay_object(v: &Value) {
    for k in REPLAY_KEYS {
        assert!(v.get(k).is_some(), "replay object lacks {k}: {v}");
    }
}
