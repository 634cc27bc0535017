//! The streamed build and replay (`build::build_streaming`, `session::replay_streamed`:
//! what `allocsim replay FILE` runs on two threads) against the build and the replay after
//! it, on every trace of the corpus and of the repository: what the build hands on is the
//! trace's start state and ops whenever it says so, and a replay of what it handed on is
//! the replay of the built trace.

use allocsim_core::build::{self, Streamed};
use allocsim_core::capacity::CapacityArg;
use allocsim_core::models::ModelSpec;
use allocsim_core::replay::{ReplayOptions, ReplayResult};
use allocsim_core::session;
use allocsim_core::snapshot::{RawEvent, RawSettings, RawSnapshot, decode_snapshot};
use allocsim_core::trace::{Op, OpsPiece, SnapshotInfo, StartSegment};
use allocsim_core::validate::Validation;

/// The build of `t` streaming its busiest device, as the CLI and the app run it.
struct StreamedBuild {
    device: usize,
    settings: RawSettings,
    segment_events: Vec<RawEvent>,
    /// `build::expected_ops` of the device's events, before the start state is known.
    expected_ops: usize,
    start: Option<Vec<StartSegment>>,
    pieces: Vec<OpsPiece>,
    built: Validation,
    exact: bool,
}

impl StreamedBuild {
    /// `spec` under the capacity as recorded, replayed after the build and beside it (its
    /// checkpoints spaced from the ops expected where `spaced`); none without a start
    /// state handed on.
    fn replays(
        &self,
        spec: &str,
        opts: ReplayOptions,
        spaced: bool,
    ) -> Option<(ReplayResult, ReplayResult)> {
        let start = self.start.as_ref()?;
        let (v, d) = (&self.built, self.device);
        let spec = ModelSpec::parse(spec).unwrap();
        let cap = session::capacity(&v.trace, d, CapacityArg::AsRecorded).bytes;
        let after = session::replay_device(&v.trace, d, &spec, cap, opts).unwrap();
        let blocks: usize = start.iter().map(|s| s.blocks.len()).sum();
        let beside = session::replay_streamed(
            &self.settings,
            &self.segment_events,
            &spec,
            cap,
            opts,
            start,
            spaced.then_some(self.expected_ops + blocks),
            &mut self.pieces.clone().into_iter(),
        )
        .unwrap();
        Some((after, beside))
    }
}

fn build_streamed(t: &allocsim_tests::CorpusTrace) -> Option<StreamedBuild> {
    let snap = decode_snapshot(&std::fs::read(&t.path).unwrap()).ok()?;
    let d = (0..snap.device_traces.len())
        .max_by_key(|&i| (snap.device_traces[i].len(), std::cmp::Reverse(i)))
        .unwrap_or(0);
    let events = snap.device_traces.get(d).map_or(&[][..], Vec::as_slice);
    let settings = snap.settings.clone();
    let segment_events = build::segment_events(events);
    let expected_ops = build::expected_ops(events, &[]);
    let mut start: Option<Vec<StartSegment>> = None;
    let mut pieces: Vec<OpsPiece> = Vec::new();
    let mut sink = |x: Streamed<'_>| match x {
        Streamed::Start(s) => start = Some(s.to_vec()),
        Streamed::Ops(ops, pools) => pieces.push(OpsPiece {
            ops: ops.to_vec(),
            pools: pools.to_vec(),
        }),
    };
    let (built, exact) = build::build_streaming(
        snap,
        t.cap_bytes,
        Some((d as u32, &mut sink as &mut dyn FnMut(Streamed<'_>))),
    )
    .ok()?;
    Some(StreamedBuild {
        device: d,
        settings,
        segment_events,
        expected_ops,
        start,
        pieces,
        built,
        exact,
    })
}

#[test]
fn a_replay_beside_the_build_is_the_replay_after_it() {
    let traces: Vec<_> = allocsim_tests::corpus()
        .into_iter()
        .chain(allocsim_tests::repo_traces())
        .collect();
    let opts = ReplayOptions {
        checkpoint_every: 0,
        keep_timeline: false,
        ..ReplayOptions::default()
    };
    let (mut exact, mut compared) = (0, 0);
    for t in &traces {
        let Some(b) = build_streamed(t) else {
            continue;
        };
        let is_exact = b.exact;
        let dt = &b.built.trace.devices[b.device];
        let streamed: Vec<Op> = b
            .pieces
            .iter()
            .flat_map(|p| p.ops.iter().copied())
            .collect();
        if is_exact {
            exact += 1;
            assert_eq!(b.start.as_deref(), Some(&dt.start[..]), "{}", t.name);
            assert!(streamed == dt.ops, "{}: the streamed ops differ", t.name);
            // Each piece names the pools its ops use, as the trace does.
            let pools = b.pieces.last().map_or(&[][..], |p| &p.pools[..]);
            assert_eq!(
                pools,
                &dt.pools[..],
                "{}: the streamed pools differ",
                t.name
            );
        }
        for spec in ["pytorch", "pytorch@expandable_segments:True", "bfc"] {
            let Some((after, beside)) = b.replays(spec, opts, false) else {
                continue;
            };
            if is_exact {
                assert_eq!(
                    allocsim_tests::replay_summary(&beside),
                    allocsim_tests::replay_summary(&after),
                    "{} {spec:?}",
                    t.name
                );
                compared += 1;
            }
        }
    }
    assert!(
        exact * 10 >= traces.len() * 9,
        "{exact} of {} traces streamed exactly",
        traces.len()
    );
    assert!(compared > 0);
}

/// A trace built with its ops kept slim (`OpsMemory::Slim`, the browser's) is the trace
/// built with them whole (natively), on every trace of the corpus and of the repository,
/// incoming included; and its ops take the memory of the entries they were made from
/// (the build's floor is the entries and the slim ops, not the entries and the ops),
/// wherever they are fewer than the entries.
#[test]
fn ops_kept_slim_build_the_trace_they_build_whole_over_its_entries() {
    let (mut compared, mut over) = (0, 0);
    for t in allocsim_tests::corpus()
        .into_iter()
        .chain(allocsim_tests::incoming())
        .chain(allocsim_tests::repo_traces())
    {
        let Ok(snap) = decode_snapshot(&std::fs::read(&t.path).unwrap()) else {
            continue;
        };
        let build = |snap: RawSnapshot, memory| {
            let entries: Vec<(usize, usize)> = snap
                .device_traces
                .iter()
                .map(|e| (e.as_ptr() as usize, e.len()))
                .collect();
            let built = build::build_devices_in(&snap, t.cap_bytes, None, memory).ok()?;
            let read = SnapshotInfo::read(&snap);
            Some((built.validation(snap, read).0, entries))
        };
        let Some((whole, _)) = build(snap.clone(), build::OpsMemory::Whole) else {
            continue;
        };
        let (slim, entries) = build(snap, build::OpsMemory::Slim).unwrap();
        assert_eq!(whole.trace.devices.len(), slim.trace.devices.len());
        for (d, (w, s)) in whole
            .trace
            .devices
            .iter()
            .zip(&slim.trace.devices)
            .enumerate()
        {
            let name = format!("{} device {d}", t.name);
            assert!(w.ops == s.ops, "{name}: the ops differ");
            assert_eq!(w.pools, s.pools, "{name}");
            assert_eq!(w.start, s.start, "{name}");
            assert_eq!(w.inferred, s.inferred, "{name}");
            assert_eq!(w.capacity, s.capacity, "{name}");
            assert_eq!(
                (w.events, w.initial_ops),
                (s.events, s.initial_ops),
                "{name}"
            );
            assert_eq!(w.segment_events, s.segment_events, "{name}");
            let Some(&(memory, n)) = entries.get(d) else {
                continue;
            };
            if !s.ops.is_empty() && s.ops.len() <= n {
                assert_eq!(
                    s.ops.as_ptr() as usize,
                    memory,
                    "{name}: ops not over the entries"
                );
                assert_eq!(s.ops.capacity(), s.ops.len(), "{name}");
                over += 1;
            }
        }
        assert_eq!(
            format!("{:?}", whole.devices),
            format!("{:?}", slim.devices),
            "{}: the reports differ",
            t.name
        );
        compared += 1;
    }
    assert!(
        compared >= 20 && over >= 20,
        "{compared} traces, {over} over their entries"
    );
}

/// The replay beside the build as the app keeps it (`engine/open.rs`): with its timeline
/// and checkpoints spaced from the ops expected rather than built. Everything but where
/// the checkpoints lie is the replay after the build, and so are the layouts rebuilt from
/// them.
#[test]
fn a_replay_beside_the_build_with_checkpoints_rebuilds_the_same_layouts() {
    // Few checkpoints, spaced from the op count: the expected and the built spacings differ.
    let opts = ReplayOptions {
        checkpoint_every: 1,
        max_checkpoints: 8,
        ..ReplayOptions::default()
    };
    let (mut compared, mut spaced_apart) = (0, 0);
    for t in allocsim_tests::corpus()
        .into_iter()
        .chain(allocsim_tests::repo_traces())
    {
        let Some(b) = build_streamed(&t).filter(|b| b.exact) else {
            continue;
        };
        let Some((after, beside)) = b.replays("pytorch", opts, true) else {
            continue;
        };
        let dt = &b.built.trace.devices[b.device];
        assert_eq!(
            allocsim_tests::replay_summary(&beside),
            allocsim_tests::replay_summary(&after),
            "{}",
            t.name
        );
        assert!(beside.timeline == after.timeline, "{}: timeline", t.name);
        let n = after.ops_done;
        assert!(
            (0..n).all(|k| beside.outcomes.get(k) == after.outcomes.get(k)),
            "{}: outcomes",
            t.name
        );
        if n == 0 {
            continue;
        }
        assert!(!beside.checkpoints.is_empty(), "{}", t.name);
        let at =
            |r: &ReplayResult| -> Vec<usize> { r.checkpoints.iter().map(|c| c.ops_done).collect() };
        spaced_apart += usize::from(at(&beside) != at(&after));
        for k in [1, n / 3, n / 2, n - 1, n] {
            let want = allocsim_core::replay::layout_at(dt, &after, k);
            let got = allocsim_core::replay::layout_at(dt, &beside, k);
            assert_eq!(
                format!("{got:?}"),
                format!("{want:?}"),
                "{} after {k} ops",
                t.name
            );
        }
        compared += 1;
    }
    assert!(compared >= 10, "{compared} traces compared");
    assert!(spaced_apart > 0, "no trace had its checkpoints elsewhere");
}
