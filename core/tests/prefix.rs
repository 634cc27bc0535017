//! `prefix::replay_sharing` answers exactly as a replay of each setting from the start:
//! every candidate of `recommend`'s sweep (and a few that are not plain PyTorch
//! settings) replayed both ways on every shared trace, the incoming ones and synthetic
//! workloads — every device, with no capacity, at the recorded capacity where the
//! recording ran out, and at 95 % and 80 % of the defaults' peak (where the thresholds
//! collect and the split limits release) — and the whole `ReplayResult`s compared.

use std::path::PathBuf;

use allocsim_core::capacity::CapacityArg;
use allocsim_core::models::ModelSpec;
use allocsim_core::replay::ReplayResult;
use allocsim_core::trace::Trace;
use allocsim_core::{prefix, session, whatif, workloads};

fn traces_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/traces"));
    dir.is_dir().then_some(dir)
}

fn specs() -> Vec<ModelSpec> {
    let mut specs: Vec<ModelSpec> = whatif::recommend_candidates()
        .iter()
        .filter_map(|c| ModelSpec::parse(&format!("pytorch@{c}")).ok())
        .collect();
    // Not forked: the snapshot's own settings, a key the fork does not know, another
    // model; and the same setting twice.
    for s in [
        "pytorch",
        "pytorch@max_split_size_mb:64,max_non_split_rounding_mb:64",
        "bfc",
        "pytorch@max_split_size_mb:64,garbage_collection_threshold:0.6",
    ] {
        specs.push(ModelSpec::parse(s).expect("spec"));
    }
    specs
}

/// Per trace: the ops the shared replays skipped, and the ops a replay from the start
/// would have replayed.
fn same_both_ways(name: &str, trace: &Trace) -> (u64, u64) {
    let specs = specs();
    let mut skipped = 0u64;
    let mut total = 0u64;
    for device in 0..trace.devices.len() {
        let ops = trace.devices[device].ops.len() as u64;
        let defaults = ModelSpec::parse("pytorch@").expect("spec");
        let free =
            session::replay_device(trace, device, &defaults, None, whatif::summary_options())
                .expect("replays");
        let mut capacities = vec![
            None,
            Some(free.peak_reserved_bytes * 19 / 20),
            Some(free.peak_reserved_bytes * 4 / 5),
        ];
        let recorded = session::capacity(trace, device, CapacityArg::AsRecorded).bytes;
        if recorded.is_some() {
            capacities.push(recorded);
        }
        for capacity in capacities {
            let mut shared: Vec<Option<(Option<usize>, ReplayResult)>> =
                specs.iter().map(|_| None).collect();
            prefix::replay_sharing(
                trace,
                device,
                &specs,
                capacity,
                whatif::summary_options(),
                &mut |i, at, r| {
                    assert!(shared[i].is_none(), "{name}: spec {i} answered twice");
                    shared[i] = Some((at, r.expect("replays")));
                },
            )
            .expect("shares");
            for (spec, got) in specs.iter().zip(shared) {
                let (at, got) = got.unwrap_or_else(|| panic!("{name}: {spec:?} not answered"));
                let want = session::replay_device(
                    trace,
                    device,
                    spec,
                    capacity,
                    whatif::summary_options(),
                )
                .expect("replays");
                assert!(
                    format!("{got:?}") == format!("{want:?}"),
                    "{name}: device {device}, {spec:?} at {capacity:?}, forked at {at:?}: \
                     differs from its replay from the start\n shared: {got:?}\n whole: {want:?}"
                );
                total += ops;
                skipped += at.map_or(0, |a| a as u64);
            }
        }
    }
    (skipped, total)
}

#[test]
fn every_swept_setting_replays_shared_exactly_as_from_the_start() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    let mut files: Vec<PathBuf> = ["", "incoming"]
        .iter()
        .flat_map(|sub| std::fs::read_dir(dir.join(sub)).expect("traces").flatten())
        .map(|e| e.path())
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".pickle.gz") || n.ends_with(".json") && !n.ends_with(".stats.json")
        })
        .collect();
    files.sort();
    assert!(files.len() > 20, "the shared traces: {}", files.len());
    for path in files {
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        let bytes = std::fs::read(&path).expect("read");
        let Ok(v) = session::load(&bytes, None) else {
            // A file the corpus keeps to be refused (its own tests say why).
            continue;
        };
        let (skipped, total) = same_both_ways(&name, &v.trace);
        println!("{name}: {skipped} of {total} ops shared");
    }
    for spec in ["kvcache:tokens=40", "kvcache:tokens=200"] {
        let t = workloads::generate(spec).expect("workload");
        let (skipped, total) = same_both_ways(spec, &t);
        println!("{spec}: {skipped} of {total} ops shared");
    }
}

/// Not a check: where each candidate of the sweep forks on `ALLOCSIM_PREFIX_FILE` at
/// `ALLOCSIM_PREFIX_CAPACITY` bytes (`cargo test --release -p allocsim-core --test prefix
/// -- --ignored --nocapture fork_points`), and the share of the sweep's ops it skips.
#[test]
#[ignore = "a measurement: needs ALLOCSIM_PREFIX_FILE"]
fn fork_points() {
    let Ok(path) = std::env::var("ALLOCSIM_PREFIX_FILE") else {
        return;
    };
    let capacity = std::env::var("ALLOCSIM_PREFIX_CAPACITY")
        .ok()
        .and_then(|c| c.parse().ok());
    let bytes = std::fs::read(&path).expect("read");
    let trace = session::load(&bytes, None).expect("loads").trace;
    let device = trace.busiest_device();
    let ops = trace.devices[device].ops.len();
    let specs: Vec<ModelSpec> = whatif::recommend_candidates()
        .iter()
        .filter_map(|c| ModelSpec::parse(&format!("pytorch@{c}")).ok())
        .collect();
    let mut at = vec![None; specs.len()];
    let t0 = std::time::Instant::now();
    prefix::replay_sharing(
        &trace,
        device,
        &specs,
        capacity,
        whatif::summary_options(),
        &mut |i, a, _| at[i] = Some(a),
    )
    .expect("shares");
    let took = t0.elapsed();
    let mut skipped = 0;
    for (spec, a) in specs.iter().zip(&at) {
        let a = a.flatten();
        skipped += a.unwrap_or(0);
        println!(
            "{:>9} {:>5.1}% {spec}",
            a.map_or("whole".to_string(), |a| a.to_string()),
            a.unwrap_or(0) as f64 * 100.0 / ops as f64
        );
    }
    println!(
        "{} candidates, {ops} ops each: {:.1}% of the ops skipped; shared replays took {took:?}",
        specs.len(),
        skipped as f64 * 100.0 / (ops * specs.len()) as f64
    );
}
