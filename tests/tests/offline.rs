//! The best any allocator could do (`allocsim_core::offline`): on every shared trace, the
//! repository's real traces and the synthetic workloads, the offline placement never puts
//! two blocks alive together at the same address, and its peak lies between the live peak
//! and the peak reserved of a plain PyTorch replay (the snapshot's own settings, no cap).

use std::path::PathBuf;

use allocsim_core::models::ModelSpec;
use allocsim_core::replay::ReplayOptions;
use allocsim_core::trace::Trace;
use allocsim_core::{offline, session, workloads};
use allocsim_tests::{corpus, skip_without_corpus};

fn summary() -> ReplayOptions {
    ReplayOptions {
        checkpoint_every: 0,
        keep_timeline: false,
        ..ReplayOptions::default()
    }
}

/// Places every device of `trace`, checks the placement, and checks live ≤ offline ≤ the
/// PyTorch replay's peak; returns one line per device for the failure message.
fn check_trace(name: &str, trace: &Trace, failures: &mut Vec<String>) {
    let pytorch = ModelSpec::parse("pytorch").unwrap();
    for (d, dt) in trace.devices.iter().enumerate() {
        if dt.ops.is_empty() {
            continue;
        }
        let p = offline::place(dt);
        if let Err(e) = p.check() {
            failures.push(format!("{name} device {d}: {e}"));
            continue;
        }
        assert_eq!(p.lifetimes.len(), p.offsets_bytes.len());
        let r = session::replay_device(trace, d, &pytorch, None, summary()).unwrap();
        let line = format!(
            "{name} device {d}: live {} offline {} pytorch {}",
            p.live_peak_bytes, p.peak_bytes, r.peak_reserved_bytes
        );
        println!("{line}");
        if !(p.live_peak_bytes <= p.peak_bytes && p.peak_bytes <= r.peak_reserved_bytes) {
            failures.push(line);
        }
    }
}

fn repo_traces() -> Vec<(String, PathBuf)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(".pickle.gz")))
        .map(|p| {
            let name = p
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or("")
                .split('.')
                .next()
                .unwrap_or("")
                .to_string();
            (name, p)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn offline_placement_never_overlaps_and_lies_between_live_and_pytorch_on_real_traces() {
    let mut failures = Vec::new();
    let repo = repo_traces();
    assert!(repo.len() >= 7, "the repository's tests/traces: {repo:?}");
    for (name, path) in &repo {
        let v = session::load(&std::fs::read(path).unwrap(), None).unwrap();
        check_trace(name, &v.trace, &mut failures);
    }
    if skip_without_corpus() {
        assert!(failures.is_empty(), "{failures:#?}");
        return;
    }
    let shared = corpus();
    assert!(shared.len() >= 24, "the shared traces: {}", shared.len());
    for t in &shared {
        let v = session::load(&std::fs::read(&t.path).unwrap(), t.cap_bytes).unwrap();
        check_trace(&t.name, &v.trace, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn offline_placement_never_overlaps_and_lies_between_live_and_pytorch_on_workloads() {
    let mut failures = Vec::new();
    for spec in [
        "train:steps=50,batch=8..32,seq=128..2048,seed=1",
        "train:steps=20,batch=4..64,seq=64..4096,seed=7",
        "kvcache:tokens=2000",
        "churn:events=100000",
        "oom-story",
    ] {
        let trace = workloads::generate(spec).unwrap();
        check_trace(spec, &trace, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
