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

/// The traces of `dir`'s folders `subs` that load, by file name, in name order (a file
/// the corpus keeps to be refused is left out: its own tests say why).
fn shared_traces(dir: &std::path::Path, subs: &[&str]) -> Vec<(String, Trace)> {
    let mut files: Vec<PathBuf> = subs
        .iter()
        .flat_map(|sub| std::fs::read_dir(dir.join(sub)).expect("traces").flatten())
        .map(|e| e.path())
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".pickle.gz") || n.ends_with(".json") && !n.ends_with(".stats.json")
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .filter_map(|path| {
            let name = path.file_name()?.to_string_lossy().to_string();
            let bytes = std::fs::read(&path).expect("read");
            let v = session::load(&bytes, None).ok()?;
            Some((name, v.trace))
        })
        .collect()
}

#[test]
fn every_swept_setting_replays_shared_exactly_as_from_the_start() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    let traces = shared_traces(&dir, &["", "incoming"]);
    assert!(traces.len() > 20, "the shared traces: {}", traces.len());
    for (name, trace) in traces {
        let (skipped, total) = same_both_ways(&name, &trace);
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

/// Where a setting is forked, against what the model decides: a limit M' that a
/// request's rounded size reaches is forked no later than the first op where the replay of
/// it and the defaults' replay, stepped side by side from the start, emit other events
/// (the first decision `should_split` or the oversize rules take otherwise shows there or
/// later), and it is forked at all (the replay of it is not skipped where it differs);
/// while a limit above every request and every segment the trace makes (no read of it
/// can decide otherwise) is never forked: its result is the defaults' replay under its
/// own name, forked at the end.
#[test]
fn a_split_limit_is_forked_where_a_read_of_it_first_decides_otherwise() {
    use allocsim_core::models::pytorch::{PyTorchConfig, PyTorchModel};
    use allocsim_core::trace::OpKind;
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    let mut checked = 0;
    for (spec, trace) in shared_traces(&dir, &[""]) {
        let dt = &trace.devices[0];
        let ops = dt.ops.len();
        let model = PyTorchModel::new(PyTorchConfig::parse("").expect("defaults"), None);
        let rounded: Vec<(usize, u64)> = dt
            .ops
            .iter()
            .enumerate()
            .filter_map(|(k, op)| match op.kind {
                OpKind::Alloc { size_bytes, .. } => Some((k, model.round_size(size_bytes))),
                _ => None,
            })
            .collect();
        let free = session::replay_device(
            &trace,
            0,
            &ModelSpec::parse("pytorch@").expect("spec"),
            None,
            whatif::summary_options(),
        )
        .expect("replays");
        let biggest = rounded.iter().map(|&(_, r)| r).max().expect("allocs");
        let reached_mb = biggest >> 20;
        // PyTorch takes no limit under 20 MiB.
        if reached_mb < 20 {
            continue;
        }
        checked += 1;
        let first_otherwise =
            first_op_deciding_otherwise(&trace, "", &format!("max_split_size_mb:{reached_mb}"));
        let above_mb = free.peak_reserved_bytes.max(biggest) / (1 << 20) + 1;
        let specs: Vec<ModelSpec> = [
            "pytorch@".to_string(),
            format!("pytorch@max_split_size_mb:{reached_mb}"),
            format!("pytorch@max_split_size_mb:{above_mb}"),
        ]
        .iter()
        .map(|s| ModelSpec::parse(s).expect("spec"))
        .collect();
        let mut at = vec![None; specs.len()];
        prefix::replay_sharing(
            &trace,
            0,
            &specs,
            None,
            whatif::summary_options(),
            &mut |i, a, r| {
                let want =
                    session::replay_device(&trace, 0, &specs[i], None, whatif::summary_options())
                        .expect("replays");
                assert_eq!(format!("{:?}", r.expect("replays")), format!("{want:?}"));
                at[i] = Some(a);
            },
        )
        .expect("shares");
        assert_eq!(at[0], Some(Some(0)), "{spec}: the root is replayed whole");
        let reached = at[1].flatten().expect("forked");
        if let Some(k) = first_otherwise {
            assert!(
                reached <= k,
                "{spec}: max_split_size_mb:{reached_mb} forked at op {reached}, after op \
                 {k} where its replay and the defaults' emit other events"
            );
        }
        assert_eq!(
            at[2],
            Some(Some(ops)),
            "{spec}: max_split_size_mb:{above_mb} decides nothing otherwise"
        );
    }
    assert!(
        checked >= 2,
        "traces with a request of 20 MiB or more: {checked}"
    );
}

/// The first op of device 0 of `trace` where the whole replays of settings `a` and `b`
/// (no capacity) emit other events; None where they never do.
fn first_op_deciding_otherwise(trace: &Trace, a: &str, b: &str) -> Option<usize> {
    use allocsim_core::models::pytorch::PyTorchConfig;
    use allocsim_core::replay::ReplayRun;
    let dt = &trace.devices[0];
    let start = |c: &str| {
        session::pytorch_start(trace, 0, &PyTorchConfig::parse(c).expect("setting"), None)
    };
    let (mut ma, da, pa) = start(a);
    let (mut mb, db, pb) = start(b);
    let opts = |preloaded| {
        let mut o = whatif::summary_options();
        o.preloaded |= preloaded;
        o
    };
    let mut ra = ReplayRun::new(
        &mut ma,
        da,
        None,
        opts(pa),
        dt.initial_ops,
        Some(dt.ops.len()),
    );
    let mut rb = ReplayRun::new(
        &mut mb,
        db,
        None,
        opts(pb),
        dt.initial_ops,
        Some(dt.ops.len()),
    );
    ra.set_pools(&dt.pools);
    rb.set_pools(&dt.pools);
    dt.ops.iter().position(|op| {
        ra.push(op);
        rb.push(op);
        ra.last_events() != rb.last_events()
    })
}
