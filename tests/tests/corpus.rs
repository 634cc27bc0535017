//! The real PyTorch 2.11 snapshots of ../shared/traces and of the repository's own
//! tests/traces, replayed event by event.

use allocsim_core::capacity::CapacityArg;
use allocsim_core::models::ModelSpec;
use allocsim_core::replay::{Outcome, Outcomes, ReplayOptions};
use allocsim_core::session;
use allocsim_core::snapshot::RawSnapshot;
use allocsim_core::trace::{DeviceTrace, OpKind};
use allocsim_tests::{CorpusTrace, corpus, incoming, repo_traces, skip_without_corpus};

/// The traces of `incoming/` that validate exactly: each joins once it passes, and the
/// list only grows.
const EXACT_INCOMING: &[&str] = &[
    "compile_reduce_overhead",
    "devfull_oom",
    "gpt2_big_batch_oom",
];

/// Those of [`EXACT_INCOMING`] a replay on the simulated device also follows: not the ones
/// where the GPU itself ran out, whose capacity the snapshot does not record.
const REPLAYED_INCOMING: &[&str] = &["compile_reduce_overhead"];

/// The incoming traces of [`EXACT_INCOMING`]; each must be there.
fn exact_incoming() -> Vec<CorpusTrace> {
    named_incoming(EXACT_INCOMING)
}

/// The incoming traces of [`REPLAYED_INCOMING`].
fn replayed_incoming() -> Vec<CorpusTrace> {
    named_incoming(REPLAYED_INCOMING)
}

/// The incoming traces named; each must be there.
fn named_incoming(names: &[&str]) -> Vec<CorpusTrace> {
    let found = incoming();
    names
        .iter()
        .map(|name| {
            found
                .iter()
                .find(|t| t.name == *name)
                .unwrap_or_else(|| panic!("incoming trace {name} not found"))
                .clone()
        })
        .collect()
}

/// Every request the replay served got the address the recording gave it.
fn assert_served_as_recorded(name: &str, dt: &DeviceTrace, outcomes: &Outcomes) {
    for (k, op) in dt.ops.iter().enumerate() {
        if let (
            Some(Outcome::Served(addr)),
            OpKind::Alloc {
                recorded_oom: false,
                ..
            },
        ) = (outcomes.get(k), op.kind)
        {
            assert_eq!(addr, op.recorded_addr, "{name}: op {k}");
        }
    }
}

/// Validates `t` under `cap`: a line for each device that is not exact. Panics where the
/// trace does not load, a device compares nothing, or the peaks differ.
fn not_exact(t: &CorpusTrace, cap: Option<u64>) -> Vec<String> {
    let bytes = std::fs::read(&t.path).unwrap();
    let v = session::load(&bytes, cap).unwrap_or_else(|e| panic!("{}: {e}", t.name));
    assert!(!v.devices.is_empty(), "{}: no device with events", t.name);
    let mut failures = Vec::new();
    for d in &v.devices {
        assert!(d.events_compared > 0, "{}: nothing compared", t.name);
        if !d.exact {
            failures.push(format!(
                "{} (capacity {cap:?}) device {}: {:?} {:?}",
                t.name, d.device, d.first_divergence, d.end_state_difference
            ));
        }
        assert_eq!(
            d.peak_reserved_recorded, d.peak_reserved_simulated,
            "{}",
            t.name
        );
    }
    failures
}

/// The repository's own recordings, always there: each validates exactly under the cap it
/// ran with, and one with a cap also without it (the recorded device then reads the
/// refusals off the recording).
#[test]
fn validate_is_exact_on_every_repo_trace() {
    let traces = repo_traces();
    assert!(
        traces.len() >= 18,
        "expected the 18 traces of tests/traces, found {}",
        traces.len()
    );
    let mut failures = Vec::new();
    for t in &traces {
        for cap in std::iter::once(t.cap_bytes).chain(t.cap_bytes.map(|_| None)) {
            failures.extend(not_exact(t, cap));
        }
    }
    assert!(failures.is_empty(), "not exact:\n{}", failures.join("\n"));
}

/// A plain replay of each repository trace (the capacity read from the recording, as
/// `allocsim replay` runs by default) follows the recording to its end, every request
/// served at its recorded address, and peaks at `memory_stats()`'s
/// `reserved_bytes.all.peak`.
#[test]
fn repo_traces_replay_as_recorded_with_the_stats_peak() {
    let spec = ModelSpec::parse("pytorch").unwrap();
    for t in repo_traces() {
        let v = session::load(&std::fs::read(&t.path).unwrap(), t.cap_bytes).unwrap();
        let capacity = session::capacity(&v.trace, 0, CapacityArg::AsRecorded).bytes;
        let opts = ReplayOptions {
            checkpoint_every: 0,
            keep_timeline: false,
            ..ReplayOptions::default()
        };
        let r = session::replay_device(&v.trace, 0, &spec, capacity, opts).unwrap();
        let dt = &v.trace.devices[0];
        assert_eq!(r.ops_done, dt.ops.len(), "{}: replayed to the end", t.name);
        assert_served_as_recorded(&t.name, dt, &r.outcomes);
        assert_eq!(
            r.peak_reserved_bytes, t.stats_peak_reserved,
            "{}: peak reserved",
            t.name
        );
        assert_eq!(r.oom.is_some(), t.oom_raised, "{}: OOM raised", t.name);
    }
}

#[test]
fn validate_is_exact_on_every_shared_trace() {
    if skip_without_corpus() {
        return;
    }
    let traces = corpus();
    assert!(
        traces.len() >= 24,
        "expected the 24 shared traces, found {}",
        traces.len()
    );
    let mut failures = Vec::new();
    for t in traces.iter().chain(&exact_incoming()) {
        failures.extend(not_exact(t, t.cap_bytes));
    }
    assert!(failures.is_empty(), "not exact:\n{}", failures.join("\n"));
}

#[test]
fn incoming_traces_not_yet_checked_are_reported() {
    if skip_without_corpus() {
        return;
    }
    for t in incoming() {
        if EXACT_INCOMING.contains(&t.name.as_str()) {
            continue;
        }
        let verdict = match std::fs::read(&t.path)
            .map_err(|e| e.to_string())
            .and_then(|b| session::load(&b, t.cap_bytes).map_err(|e| e.to_string()))
        {
            Ok(v) if v.exact() => "exact: add it to EXACT_INCOMING".to_string(),
            Ok(v) => format!(
                "not exact yet: {:?}",
                v.devices
                    .iter()
                    .find(|d| !d.exact)
                    .map(|d| &d.first_divergence)
            ),
            Err(e) => format!("does not load yet: {e}"),
        };
        println!("incoming {}: {verdict}", t.name);
    }
}

#[test]
fn replay_peak_reserved_equals_memory_stats() {
    if skip_without_corpus() {
        return;
    }
    for t in corpus().into_iter().chain(replayed_incoming()) {
        let bytes = std::fs::read(&t.path).unwrap();
        let v = session::load(&bytes, t.cap_bytes).unwrap();
        // The stats are device 0's; traces that start mid-program also count memory
        // reserved before the window, which the rebuilt start state holds.
        let spec = ModelSpec::parse("pytorch").unwrap();
        let opts = ReplayOptions {
            checkpoint_every: 0,
            keep_timeline: false,
            ..ReplayOptions::default()
        };
        let r = session::replay_device(&v.trace, 0, &spec, t.cap_bytes, opts).unwrap();
        assert_eq!(
            r.peak_reserved_bytes, t.stats_peak_reserved,
            "{}: peak reserved",
            t.name
        );
        assert_eq!(r.oom.is_some(), t.oom_raised, "{}: OOM raised", t.name);
    }
}

#[test]
fn invariants_hold_at_every_checked_event_and_replays_are_deterministic() {
    if skip_without_corpus() {
        return;
    }
    for t in corpus().into_iter().chain(replayed_incoming()) {
        let bytes = std::fs::read(&t.path).unwrap();
        let v = session::load(&bytes, t.cap_bytes).unwrap();
        let d = v.trace.busiest_device();
        let ops = v.trace.devices[d].ops.len();
        // Every event on the small traces; every 997th (a prime, so phases vary) on the big.
        let check_every = if ops < 20_000 { 1 } else { 997 };
        let spec = ModelSpec::parse("pytorch").unwrap();
        let replay_opts = ReplayOptions {
            checkpoint_every: 0,
            check_every,
            keep_timeline: true,
            ..ReplayOptions::default()
        };
        let a = session::replay_device(&v.trace, d, &spec, t.cap_bytes, replay_opts).unwrap();
        assert_eq!(a.invariant_error, None, "{}", t.name);
        let b = session::replay_device(&v.trace, d, &spec, t.cap_bytes, replay_opts).unwrap();
        assert_eq!(a.outcomes, b.outcomes, "{}: two replays differ", t.name);
        assert_eq!(a.timeline, b.timeline, "{}: two replays differ", t.name);
        // With its own settings the replay follows the recording: every served address is
        // the recorded one.
        assert_served_as_recorded(&t.name, &v.trace.devices[d], &a.outcomes);
    }
}

#[test]
fn layout_at_any_op_matches_a_straight_replay() {
    if skip_without_corpus() {
        return;
    }
    let t = corpus()
        .into_iter()
        .find(|t| t.name == "resnet_bs_change")
        .expect("resnet_bs_change");
    let v = session::load(&std::fs::read(&t.path).unwrap(), None).unwrap();
    let spec = ModelSpec::parse("pytorch").unwrap();
    let dt = &v.trace.devices[0];
    let fast = session::replay_device(
        &v.trace,
        0,
        &spec,
        None,
        ReplayOptions {
            checkpoint_every: 512,
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    // Only the checkpoint at op 0: every layout is replayed from the start.
    let slow = session::replay_device(
        &v.trace,
        0,
        &spec,
        None,
        ReplayOptions {
            checkpoint_every: usize::MAX,
            ..ReplayOptions::default()
        },
    )
    .unwrap();
    assert_eq!(slow.checkpoints.len(), 1);
    for &k in &[0usize, 1, 511, 512, 513, 3000, dt.ops.len()] {
        let a = allocsim_core::replay::layout_at(dt, &fast, k).unwrap();
        let b = allocsim_core::replay::layout_at(dt, &slow, k).unwrap();
        assert_eq!(a, b, "layout after {k} ops");
        if k > 0 {
            assert!(!a.segments.is_empty());
        }
    }
}

/// The test run's last line says which real traces were checked, and warns out loud when
/// the shared corpus is missing (its tests then only print `skipped:`).
#[test]
fn the_test_summary_names_the_traces_checked_and_warns_without_the_shared_corpus() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/corpus-summary.sh");
    let run = |dir: &str| {
        let out = std::process::Command::new("bash")
            .args([script, dir])
            .output()
            .expect("bash");
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let repo = repo_traces().len();
    let missing = run("/nonexistent/shared/traces");
    assert!(
        missing.starts_with(&format!(
            "WARNING: /nonexistent/shared/traces is missing: only the repository's {repo} real traces were checked"
        )),
        "{missing}"
    );
    let here = tempdir_with_traces(3);
    let present = run(here.to_str().unwrap());
    assert!(
        present.starts_with(&format!(
            "real traces checked: {repo} of the repository and 3 of "
        )),
        "{present}"
    );
}

/// A folder with `n` (empty) trace files, for the summary to count.
fn tempdir_with_traces(n: usize) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("allocsim-summary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..n {
        std::fs::write(dir.join(format!("t{i}.pickle.gz")), b"").unwrap();
    }
    dir
}

/// `layout_at` (a checkpoint, then the ops after it through a resumed `OpStepper`) equals
/// the model stepped straight from the start, at ops on both sides of checkpoints and after
/// every free whose allocation lies before its window's checkpoint (the resumed stepper
/// looks those up in the replay's outcomes), on every repository trace as recorded: OOMs
/// the program caught, wrapped ring buffers (a preloaded start state), expandable
/// segments, CUDA-graph pools. Twice: a checkpoint every 64 ops, and a checkpoint after
/// every op under a budget of 16 checkpoints (spaced as on a gigabyte trace: the budget
/// decides the spacing, `replay::checkpoint_interval`).
#[test]
fn layout_at_equals_a_straight_replay_on_every_repo_trace() {
    use allocsim_core::replay::checkpoint_interval;
    let spec = ModelSpec::parse("pytorch").unwrap();
    let mut frees_across = 0;
    for (asked, budget) in [(64, 0), (1, 16)] {
        for t in repo_traces() {
            let v = session::load(&std::fs::read(&t.path).unwrap(), t.cap_bytes).unwrap();
            let capacity = session::capacity(&v.trace, 0, CapacityArg::AsRecorded).bytes;
            let dt = &v.trace.devices[0];
            let r = session::replay_device(
                &v.trace,
                0,
                &spec,
                capacity,
                ReplayOptions {
                    checkpoint_every: asked,
                    max_checkpoints: budget,
                    ..ReplayOptions::default()
                },
            )
            .unwrap();
            let every = checkpoint_interval(dt.ops.len(), asked, budget);
            let at: Vec<usize> = r.checkpoints.iter().map(|c| c.ops_done).collect();
            assert_eq!(
                at,
                (0..r.ops_done.max(1)).step_by(every).collect::<Vec<_>>(),
                "{}: checkpoints every {every} ops",
                t.name
            );
            if budget > 0 {
                assert!(r.checkpoints.len() <= budget && every > asked, "{}", t.name);
            }
            frees_across += layouts_equal_straight_replay(&t.name, &v.trace, &r, every, capacity);
        }
    }
    assert!(
        frees_across > 100,
        "{frees_across} frees across a checkpoint"
    );
}

/// Compares `layout_at` of replay `r` (checkpoints `every` ops) with the model stepped
/// straight from the start; returns how many frees reached across a checkpoint.
fn layouts_equal_straight_replay(
    name: &str,
    trace: &allocsim_core::trace::Trace,
    r: &allocsim_core::replay::ReplayResult,
    every: usize,
    capacity: Option<u64>,
) -> usize {
    use allocsim_core::replay::{OpStepper, layout_at};
    let spec = ModelSpec::parse("pytorch").unwrap();
    let dt = &trace.devices[0];
    let (mut model, mut dev, preloaded) = session::start_model(trace, 0, &spec, capacity).unwrap();
    let mut stepper = OpStepper::new(dt, preloaded);
    let mut out = Vec::new();
    let n = r.ops_done;
    let wanted: Vec<usize> = [
        0,
        1,
        every - 1,
        every,
        every + 1,
        2 * every + 2,
        n / 3,
        n / 2,
    ]
    .into_iter()
    .chain([n.saturating_sub(1), n])
    .filter(|&k| k <= n)
    .collect();
    // Op k - 1 frees (or completes the free of) an allocation made before the checkpoint
    // that `layout_at(k)` starts from.
    let frees_before_window = |k: usize| {
        !k.is_multiple_of(every)
            && match dt.ops[k - 1].kind {
                OpKind::Free { alloc, .. } | OpKind::CompleteFree { alloc } => {
                    (alloc as usize) < k / every * every
                }
                _ => false,
            }
    };
    let (mut compared, mut frees_across) = (0, 0);
    for k in 0..=n {
        let across = frees_before_window(k);
        frees_across += usize::from(across);
        if wanted.contains(&k) || across {
            let straight = model.layout();
            assert_eq!(
                layout_at(dt, r, k).unwrap(),
                straight,
                "{name}: layout after {k} ops (checkpoints every {every})"
            );
            compared += 1;
        }
        if k < n {
            out.clear();
            stepper.step(dt, k, &mut *model, &mut dev, &mut out);
        }
    }
    assert!(compared >= 3, "{name}: {compared} layouts compared");
    frees_across
}

/// Every shared and repository trace: the trace, its uncompressed size, its snapshot.
fn every_real_snapshot() -> impl Iterator<Item = (CorpusTrace, usize, RawSnapshot)> {
    use allocsim_core::snapshot::decode_snapshot;
    use allocsim_core::snapshot::import::{gunzip, is_gzip};
    corpus().into_iter().chain(repo_traces()).map(|t| {
        let bytes = std::fs::read(&t.path).unwrap();
        let plain = if is_gzip(&bytes) {
            gunzip(&bytes, u64::MAX).unwrap()
        } else {
            bytes
        };
        let snap = decode_snapshot(&plain).unwrap();
        (t, plain.len(), snap)
    })
}

/// The trace builder sizes the ops' vector from the entries before it builds them
/// (`build::expected_ops`, so the gigabyte snapshot's 9.67 M ops take 0.62 GB, not the
/// 1.07 GB of a vector grown by doubling, while the decoded entries are still held): on
/// every real trace the estimate holds them all and is at most 1 % and 64 ops above.
#[test]
fn the_ops_are_sized_from_the_entries_before_they_are_built() {
    use allocsim_core::build::expected_ops;
    for (t, _, snap) in every_real_snapshot() {
        let events = snap.device_traces.clone();
        let v = allocsim_core::build::build(snap, t.cap_bytes).unwrap();
        for dt in &v.trace.devices {
            let entries = events
                .get(dt.device as usize)
                .map_or(&[][..], Vec::as_slice);
            let want = expected_ops(entries, &dt.start);
            let ops = dt.ops.len();
            assert!(
                ops <= want && want <= ops + ops / 100 + 64,
                "{} device {}: {ops} ops, {want} expected",
                t.name,
                dt.device
            );
            assert_eq!(dt.ops.capacity(), ops, "{}", t.name);
        }
    }
}

/// Real pickles spend far more than [`pickle::BYTES_PER_ELEMENT`] bytes per snapshot
/// element (device, trace entry, segment, block), so the budget that bounds what shared
/// references can expand to never refuses one.
#[test]
fn pickles_stay_far_within_the_element_budget() {
    use allocsim_core::snapshot::pickle;
    for (t, plain_len, snap) in every_real_snapshot() {
        let elements = snap.device_traces.len()
            + snap.device_traces.iter().map(Vec::len).sum::<usize>()
            + snap.segments.len()
            + snap.segments.iter().map(|s| s.blocks.len()).sum::<usize>();
        let per_element = plain_len as u64 / elements.max(1) as u64;
        assert!(
            per_element >= 2 * pickle::BYTES_PER_ELEMENT,
            "{}: {per_element} bytes per element ({elements} elements)",
            t.name
        );
    }
}
