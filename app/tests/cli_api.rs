//! `cli::api` (the Python package's API) against the binary: for each command that prints
//! JSON, the object `api::json` returns — for the file on disk and for its bytes in
//! memory — is the one `allocsim … --json` prints; errors are the binary's one line.

mod common;

use std::path::PathBuf;

use allocsim_app::cli::api;
use serde_json::Value;

fn trace(name: &str) -> PathBuf {
    common::repo_traces().join(name)
}

fn binary(args: &[&str]) -> (Option<i32>, String, String) {
    let out = common::run(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn each_command_s_object_is_the_binary_s() {
    let story = trace("oom_story.pickle.gz");
    let story = story.to_str().unwrap();
    let multi = trace("multistream_pub.pickle.gz");
    let multi = multi.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["validate", story],
        vec!["validate", story, "--capacity", "2.2GiB"],
        vec!["replay", story],
        vec!["replay", story, "--config", "expandable_segments:True"],
        vec!["compare", story, "--allocators", "pytorch;bfc"],
        vec!["min-capacity", story],
        vec!["recommend", story],
        vec!["explain", story],
        vec!["explain", multi, "--at", "40"],
    ];
    let memory = api::decode(std::fs::read(story).unwrap(), story).unwrap();
    for args in cases {
        let (code, stdout, stderr) = binary(&[&args[..1], &["--json"], &args[1..]].concat());
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        let printed: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(api::json(&args, None).unwrap(), printed, "{args:?}");
        // The same snapshot in memory, named as the file: the same object.
        if args[1] == story {
            assert_eq!(
                api::json(&args, Some(&memory)).unwrap(),
                printed,
                "{args:?}"
            );
        }
    }
}

#[test]
fn errors_are_the_binary_s_line() {
    let story = trace("oom_story.pickle.gz");
    let story = story.to_str().unwrap();
    for args in [
        vec!["replay", "/nonexistent.pickle"],
        vec!["replay", story, "--capacity", "1.2"],
        vec!["explain", story, "--allocator", "nosuch"],
        vec!["min-capacity", story, "--trace-device", "3"],
    ] {
        let (code, _, stderr) = binary(&args);
        let e = api::json(&args, None).unwrap_err();
        assert_eq!(Some(i32::from(e.code)), code, "{args:?}");
        assert_eq!(format!("allocsim: {}\n", e.message), stderr, "{args:?}");
    }
    let e = api::json(&["cuda-cost-table"], None).unwrap_err();
    assert_eq!(e.code, 2);
    assert!(
        e.message.contains("not one of the commands"),
        "{}",
        e.message
    );
    let e = api::decode(b"\x1f\x8b\x08\x00truncated".to_vec(), "<bytes>").unwrap_err();
    assert_eq!(e.code, 2);
    assert!(e.message.starts_with("<bytes>: "), "{}", e.message);
}
