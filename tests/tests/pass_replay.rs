//! The replay a build's first pass is (`build::build_replaying`, `session::build_replaying`:
//! the browser worker's open) against the replay of the built trace, on every trace of the
//! corpus, of `incoming/` and of the repository: wherever the build keeps it, it is that
//! replay — the totals, the timeline, every outcome, and every checkpoint's model and
//! device, against a replay of the built trace with its checkpoints spaced alike — and
//! the layouts rebuilt from it are those rebuilt from `session::replay_device`'s.

use allocsim_core::build;
use allocsim_core::models::{ModelSpec, ResolvedModel};
use allocsim_core::replay::{self, ReplayOptions, ReplayResult, ReplayRun};
use allocsim_core::session;
use allocsim_core::snapshot::{Action, decode_snapshot};
use allocsim_core::trace::Trace;

/// The busiest device of a decoded snapshot, as the app picks it before the build.
fn busiest(snap: &allocsim_core::snapshot::RawSnapshot) -> usize {
    (0..snap.device_traces.len())
        .max_by_key(|&i| (snap.device_traces[i].len(), std::cmp::Reverse(i)))
        .unwrap_or(0)
}

/// A replay of device `d` of `trace` through `spec` under `cap`, its checkpoints spaced as
/// for `expected` ops (as the pass's replay spaces them).
fn replay_spaced(
    trace: &Trace,
    d: usize,
    spec: &ModelSpec,
    cap: Option<u64>,
    opts: ReplayOptions,
    expected: usize,
) -> ReplayResult {
    let ResolvedModel::Pytorch(cfg) = spec.resolve(&trace.snapshot.settings).unwrap() else {
        unreachable!("a PyTorch spec")
    };
    let (mut model, device, preloaded) = session::pytorch_start(trace, d, &cfg, cap);
    let opts = ReplayOptions { preloaded, ..opts };
    let dt = &trace.devices[d];
    let mut run = ReplayRun::over(dt, &mut model, device, cap, opts).expecting(expected);
    for op in &dt.ops {
        run.push(op);
    }
    run.finish()
}

fn same_checkpoints(name: &str, got: &ReplayResult, want: &ReplayResult) {
    assert_eq!(got.checkpoints.len(), want.checkpoints.len(), "{name}");
    for (g, w) in got.checkpoints.iter().zip(&want.checkpoints) {
        let k = w.ops_done;
        assert_eq!(g.ops_done, k, "{name}");
        assert_eq!(
            g.model.stats(),
            w.model.stats(),
            "{name}: checkpoint at {k}"
        );
        assert_eq!(
            g.model.layout(),
            w.model.layout(),
            "{name}: checkpoint at {k}"
        );
        assert_eq!(
            format!("{:?}", g.device),
            format!("{:?}", w.device),
            "{name}: the device at checkpoint {k}"
        );
    }
}

#[test]
fn the_replay_a_build_keeps_of_its_pass_is_the_replay_of_the_built_trace() {
    let traces: Vec<_> = allocsim_tests::corpus()
        .into_iter()
        .chain(allocsim_tests::incoming())
        .chain(allocsim_tests::repo_traces())
        .collect();
    let spec = ModelSpec::parse("pytorch").unwrap();
    let other = ModelSpec::parse("pytorch@expandable_segments:True").unwrap();
    // The app's options (only the drawn columns), and the defaults with the invariants
    // checked every 7th op.
    let drawn = ReplayOptions {
        keep_requested: false,
        ..ReplayOptions::default()
    };
    let checked = ReplayOptions {
        check_every: 7,
        ..ReplayOptions::default()
    };
    let (mut kept, mut exact, mut wrapped) = (0, 0, 0);
    for t in &traces {
        let Ok(snap) = decode_snapshot(&std::fs::read(&t.path).unwrap()) else {
            continue;
        };
        let d = busiest(&snap);
        let events = snap.device_traces.get(d).cloned().unwrap_or_default();
        let cap = t.cap_bytes;
        // Another configuration than the build's is never the pass's replay.
        let (_, none) =
            session::build_replaying(snap.clone(), cap, d as u32, &other, drawn).unwrap();
        assert!(none.is_none(), "{}: expandable segments kept", t.name);
        for (i, opts) in [drawn, checked].into_iter().enumerate() {
            let Ok((v, replayed)) =
                session::build_replaying(snap.clone(), cap, d as u32, &spec, opts)
            else {
                continue;
            };
            let report_exact = v.devices.iter().all(|r| r.exact);
            // The trace keeps the segment events the replay's device was made from.
            if let Some(dt) = v.trace.devices.get(d) {
                assert_eq!(
                    dt.segment_events,
                    build::segment_events(&events),
                    "{}",
                    t.name
                );
            }
            if i == 0 && v.trace.devices.get(d).is_some_and(|dt| !dt.ops.is_empty()) {
                exact += usize::from(report_exact);
            }
            let name = format!("{} (options {i})", t.name);
            let dt = &v.trace.devices[d];
            // A pass is its replay where it steps every op as the replay does: no
            // inferred op, no recorded OOM, no segment released (only an inferred
            // `empty_cache()`, a pool release or a malloc under a cap releases one), no
            // expandable segment mapped.
            let steps_alike = report_exact
                && dt.inferred.iter().all(|x| x.kind == "start_state")
                && !events.iter().any(|e| {
                    matches!(
                        e.action,
                        Action::Oom
                            | Action::SegmentFree
                            | Action::SegmentMap
                            | Action::SegmentUnmap
                    )
                });
            assert_eq!(replayed.is_some(), steps_alike, "{name}: kept?");
            let Some(got) = replayed else {
                continue;
            };
            assert!(
                dt.inferred.iter().all(|x| x.kind == "start_state"),
                "{name}: kept with {:?}",
                dt.inferred
            );
            let expected = build::expected_ops(&events, &dt.start);
            let want = replay_spaced(&v.trace, d, &spec, cap, opts, expected);
            assert_eq!(
                allocsim_tests::replay_summary(&got),
                allocsim_tests::replay_summary(&want),
                "{name}"
            );
            assert_eq!(got.ops_done, dt.ops.len(), "{name}");
            assert!(got.timeline == want.timeline, "{name}: timeline");
            assert!(got.outcomes == want.outcomes, "{name}: outcomes");
            assert_eq!(got.invariant_error, want.invariant_error, "{name}");
            assert_eq!(got.preloaded, want.preloaded, "{name}");
            same_checkpoints(&name, &got, &want);
            // The layouts rebuilt from it are those of the replay the app made before.
            let before = session::replay_device(&v.trace, d, &spec, cap, opts).unwrap();
            let n = dt.ops.len();
            for k in [0, 1, n / 3, n / 2, n.saturating_sub(1), n] {
                assert_eq!(
                    replay::layout_at(dt, &got, k),
                    replay::layout_at(dt, &before, k),
                    "{name}: the layout after {k} ops"
                );
            }
            if i == 0 {
                kept += 1;
                wrapped += usize::from(!dt.start.is_empty());
            }
        }
    }
    if exact == 0 {
        println!("skipped: no trace to compare (../shared/traces is absent)");
        return;
    }
    println!(
        "{kept} of {exact} exact traces kept their pass's replay, {wrapped} with a start state"
    );
    assert!(
        kept * 3 >= exact,
        "{kept} of {exact} exact traces kept their pass's replay"
    );
}

/// Where the pass is not the replay, the build keeps none: a recording whose malloc ran
/// out of memory (the build's device refuses where the recording did; a replay's runs
/// under a capacity) and one with an inferred `empty_cache()` or pool release, each
/// found in the corpus by what the build infers.
#[test]
fn a_pass_that_takes_an_op_another_way_keeps_no_replay() {
    let spec = ModelSpec::parse("pytorch").unwrap();
    let mut refused = 0;
    for t in allocsim_tests::corpus()
        .into_iter()
        .chain(allocsim_tests::repo_traces())
    {
        let Ok(snap) = decode_snapshot(&std::fs::read(&t.path).unwrap()) else {
            continue;
        };
        let d = busiest(&snap);
        let oom = snap
            .device_traces
            .get(d)
            .is_some_and(|e| e.iter().any(|e| e.action == Action::Oom));
        let Ok((v, replayed)) =
            session::build_replaying(snap, t.cap_bytes, d as u32, &spec, ReplayOptions::default())
        else {
            continue;
        };
        let inferred = v.trace.devices.get(d).is_some_and(|dt| {
            dt.inferred.iter().any(|x| {
                matches!(
                    x.kind,
                    "empty_cache" | "pool_released" | "checkpoint_restore"
                )
            })
        });
        if oom || inferred {
            assert!(replayed.is_none(), "{}: kept", t.name);
            refused += 1;
        }
    }
    if refused == 0 {
        println!("skipped: no such trace (../shared/traces is absent)");
    }
}
