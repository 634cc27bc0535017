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

/// An object as the binary's printed text parses back (`serde_json` parses a float to
/// within an ulp, not always to the one printed: compare both sides parsed).
fn reparsed(v: Result<Value, allocsim_app::cli::Failure>) -> Value {
    serde_json::from_str(&serde_json::to_string(&v.unwrap()).unwrap()).unwrap()
}

/// `diff` and `ranks` through `api::json_many`: the binary's object for the files, and the
/// same object when some of them are given in memory (named as the files).
#[test]
fn diff_and_ranks_objects_are_the_binary_s_with_snapshots_in_memory() {
    let a = trace("diff/diff_train_bs256.pickle.gz");
    let b = trace("diff/diff_train_bs1024.pickle.gz");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let ranks: Vec<String> = (0..4)
        .map(|r| {
            trace(&format!("ranks/ddp4_rank{r}.pickle.gz"))
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mem = |p: &str| api::decode(std::fs::read(p).unwrap(), p).unwrap();
    let (ma, mb, m2) = (mem(a), mem(b), mem(&ranks[2]));
    let diff_args = ["diff", "--align", "steps", a, b];
    let mut ranks_args = vec!["ranks", "--no-min-capacity"];
    ranks_args.extend(ranks.iter().map(String::as_str));
    for (args, memories) in [
        (&diff_args[..], vec![Some(&ma), Some(&mb)]),
        (&diff_args[..], vec![None, Some(&mb)]),
        (&ranks_args[..], vec![None, None, Some(&m2), None]),
    ] {
        let (code, stdout, stderr) = binary(&[&args[..1], &["--json"], &args[1..]].concat());
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        let printed: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(reparsed(api::json_many(args, &[])), printed, "{args:?}");
        // A memory entry per FILE argument, in order.
        assert_eq!(
            reparsed(api::json_many(args, &memories)),
            printed,
            "{args:?}"
        );
    }
    // One snapshot in memory given as both runs is one snapshot under two settings.
    let same = ["diff", "--config-b", "expandable_segments:True", a, a];
    let (_, stdout, _) = binary(&[&same[..1], &["--json"], &same[1..]].concat());
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        reparsed(api::json_many(&same, &[Some(&ma), Some(&ma)])),
        printed
    );
    // A corrupt rank among files is named, as the binary names it.
    let dir = std::env::temp_dir().join(format!("allocsim-api-ranks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("job_rank1.pickle.gz");
    std::fs::write(&bad, b"\x1f\x8b\x08\x00broken").unwrap();
    let args = ["ranks", ranks[0].as_str(), bad.to_str().unwrap()];
    let (code, _, stderr) = binary(&args);
    let e = api::json_many(&args, &[Some(&mem(&ranks[0])), None]).unwrap_err();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(Some(i32::from(e.code)), code);
    assert_eq!(format!("allocsim: {}\n", e.message), stderr);
    assert!(
        e.message.starts_with(bad.to_str().unwrap()),
        "{}",
        e.message
    );
}
