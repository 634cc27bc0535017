//! A trace sent as `trace::binary`'s bytes (the browser's search workers get it so)
//! replays exactly as the trace it was encoded from, on the real traces: every device,
//! the default settings and the sweep's kinds of setting, with and without a capacity
//! that makes the replay run out; and `recommend`'s whole sweep answers the same.

use std::path::PathBuf;

use allocsim_core::models::ModelSpec;
use allocsim_core::replay::ReplayOptions;
use allocsim_core::trace::{Trace, binary};
use allocsim_core::{session, whatif, workloads};

fn traces_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/traces"));
    dir.is_dir().then_some(dir)
}

/// The replays of `trace` and of its encoded copy are the same, field by field.
fn same_replays(name: &str, trace: &Trace) {
    let bytes = binary::encode(trace);
    let copy = binary::decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(binary::encode(&copy), bytes, "{name}: encoded again");
    let specs = [
        "pytorch",
        "pytorch@expandable_segments:True",
        "pytorch@max_split_size_mb:64,garbage_collection_threshold:0.6",
        "pytorch@roundup_power2_divisions:4",
        "bfc",
    ];
    for device in 0..trace.devices.len() {
        assert_eq!(
            whatif::sweep_sizes(trace, device).expect("sizes"),
            whatif::sweep_sizes(&copy, device).expect("sizes"),
            "{name}: the sweep's sizes"
        );
        for spec in specs {
            let spec = ModelSpec::parse(spec).expect("spec");
            let free = session::replay_device(trace, device, &spec, None, ReplayOptions::default())
                .expect("replays");
            let tight = Some(free.peak_reserved_bytes * 9 / 10);
            for capacity in [None, tight] {
                let run = |t: &Trace| {
                    let r = session::replay_device(
                        t,
                        device,
                        &spec,
                        capacity,
                        ReplayOptions::default(),
                    )
                    .expect("replays");
                    format!("{r:?}")
                };
                assert!(
                    run(trace) == run(&copy),
                    "{name}: device {device}, {spec:?} under {capacity:?} replays differently"
                );
            }
        }
    }
}

#[test]
fn an_encoded_trace_replays_exactly_as_the_trace() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    for name in [
        "oom_story",
        "cuda_graph_train",
        "mempool_use",
        "multistream_pub",
        "two_gpu_pipeline",
        "wrapped_history_pub",
        "oom_fragmented_expand",
        "gc_threshold_s2",
        "kvcache_decode",
    ] {
        let bytes = std::fs::read(dir.join(format!("{name}.pickle.gz"))).expect("read");
        let v = session::load(&bytes, None).expect("loads");
        same_replays(name, &v.trace);
    }
    let t = workloads::generate("kvcache:tokens=40").expect("workload");
    same_replays("kvcache:tokens=40", &t);
}

#[test]
fn recommend_on_an_encoded_trace_answers_as_on_the_trace() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    for name in ["oom_story", "wrapped_history_pub"] {
        let bytes = std::fs::read(dir.join(format!("{name}.pickle.gz"))).expect("read");
        let trace = session::load(&bytes, None).expect("loads").trace;
        let copy = binary::decode(&binary::encode(&trace)).expect("decodes");
        let device = trace.busiest_device();
        let free = session::replay_device(
            &trace,
            device,
            &ModelSpec::parse("pytorch").expect("spec"),
            None,
            whatif::summary_options(),
        )
        .expect("replays");
        let capacity = Some(free.peak_reserved_bytes * 19 / 20);
        let rec = |t: &Trace| {
            let r = whatif::recommend(t, device, capacity, &mut |_, _| {}).expect("recommends");
            let rows: Vec<whatif::SweptReplay> = std::iter::once(&r.default)
                .chain(&r.tradeoffs)
                .map(whatif::SweptReplay::from)
                .collect();
            (rows, r.candidates_replayed, r.candidates_fitting)
        };
        assert_eq!(rec(&trace), rec(&copy), "{name}");
    }
}
