use super::wire::{self, Request, Response, block_state};
use super::*;
use crate::engine::examples::{self, EXAMPLES, OOM_STORY};
use allocsim_core::explain::{self, ExplainOptions};
use allocsim_core::models::MODEL_NAMES;
use allocsim_core::trace::OpKind;
use allocsim_core::whatif;

fn run(engine: &mut Engine, req: Request) -> Vec<Response> {
    let mut out = Vec::new();
    engine.handle(req, &mut |r| out.push(r));
    out
}

fn last(mut v: Vec<Response>) -> Response {
    v.pop().expect("the engine answers every request")
}

/// The trace of `e` as the UI gets it, with its bands (asked for after it, as the UI does).
fn loaded(engine: &mut Engine, e: &examples::Example) -> Box<TraceData> {
    let mut trace = match last(run(
        engine,
        Request::Load {
            job: 1,
            name: e.file.into(),
            bytes: e.bytes.to_vec(),
        },
    )) {
        Response::Loaded { trace, .. } => trace,
        other => panic!("{}: {other:?}", e.file),
    };
    trace.bands = match last(run(engine, Request::Bands { job: 1 })) {
        Response::Bands { bands, .. } => bands,
        other => panic!("{}: {other:?}", e.file),
    };
    trace
}

fn replayed(engine: &mut Engine, slot: u32, spec: &str, cap: Option<u64>) -> Box<ReplayData> {
    match last(run(
        engine,
        Request::Replay {
            job: 2,
            slot,
            spec: spec.into(),
            capacity_bytes: cap,
        },
    )) {
        Response::Replayed { replay, .. } => replay,
        other => panic!("{spec}: {other:?}"),
    }
}

fn layout(engine: &mut Engine, slot: u32, op: u32) -> LayoutData {
    match last(run(engine, Request::Layout { job: 3, slot, op })) {
        Response::Layout { layout, .. } => *layout,
        other => panic!("{other:?}"),
    }
}

#[test]
fn oom_story_fails_by_default_and_fits_with_expandable_segments() {
    let mut e = Engine::new();
    let t = loaded(&mut e, &OOM_STORY);
    assert!(t.exact, "the PyTorch model replays the recording exactly");
    assert!(!t.ops.is_empty());
    let cap = OOM_STORY.cap_bytes();
    let r = replayed(&mut e, 0, "pytorch", cap);
    let oom = r
        .summary
        .oom
        .as_ref()
        .expect("the default allocator runs out of memory");
    assert_eq!(oom.requested_bytes, 400 << 20);
    assert!(
        oom.explanation.starts_with("Tried to allocate 400.00 MiB"),
        "{}",
        oom.explanation
    );
    assert!(oom.free_bytes > 1 << 30, "more than 1 GiB was free");
    assert_eq!(r.timeline.len(), r.summary.ops_done as usize);
    let x = replayed(&mut e, 1, "pytorch@expandable_segments:True", cap);
    assert!(
        x.summary.oom.is_none(),
        "expandable segments fit under the same cap"
    );
}

/// A layout asked for behind the replays, before the cursor is known, is the one at the
/// main replay's first OOM (else its peak), for every slot; with no main replay, at the
/// op the UI shows meanwhile.
#[test]
fn the_start_layout_is_at_the_main_replays_first_oom_or_peak() {
    let start_layout = |e: &mut Engine, slot: u32, otherwise: u32| match last(run(
        e,
        Request::StartLayout {
            job: 4,
            slot,
            otherwise,
        },
    )) {
        Response::Layout { layout, .. } => *layout,
        other => panic!("{other:?}"),
    };
    let mut engine = Engine::new();
    let trace = loaded(&mut engine, &OOM_STORY);
    let cap = OOM_STORY.cap_bytes();
    // Slot 1 first: no main replay yet.
    let expandable = replayed(&mut engine, 1, "pytorch@expandable_segments:True", cap);
    assert_eq!(start_layout(&mut engine, 1, 7), layout(&mut engine, 1, 7));
    let main = replayed(&mut engine, 0, "pytorch", cap);
    let oom = main
        .summary
        .ooms
        .first()
        .expect("the story runs out of memory");
    assert_eq!(main.start_op(), oom.op_index);
    for slot in [0, 1] {
        let got = start_layout(&mut engine, slot, 7);
        assert_eq!(got.op, oom.op_index);
        assert_eq!(got, layout(&mut engine, slot, oom.op_index), "slot {slot}");
    }
    // Without an OOM: the first op at which allocated bytes peak.
    let mut peaks = 0;
    for ex in EXAMPLES {
        let mut other = Engine::new();
        loaded(&mut other, ex);
        let replay = replayed(&mut other, 0, "pytorch", None);
        let allocated = &replay.timeline.allocated_bytes;
        let Some(peak) = allocated.iter().max() else {
            continue;
        };
        let first = allocated.iter().position(|v| v == peak).expect("the peak");
        if replay.summary.ooms.is_empty() {
            assert_eq!(replay.start_op() as usize, first, "{}", ex.file);
            peaks += usize::from(first > 0);
        }
    }
    assert!(peaks > 0, "an example peaks after its first op");
    assert!(!trace.ops.is_empty() && expandable.summary.ooms.is_empty());
}

/// Each block of a layout names the allocation the walk over every op before it finds:
/// the latest alloc served at the block's address that the program still holds (the
/// engine finds them through its `LiveIndex`, without that walk), at 200 ops spread over
/// every built-in example and its last op, under two configurations.
#[test]
fn layout_blocks_name_the_allocation_the_walk_over_every_op_finds() {
    let mut linked = 0;
    for ex in EXAMPLES {
        let mut engine = Engine::new();
        let trace = loaded(&mut engine, ex);
        for (slot, spec) in ["pytorch", "pytorch@expandable_segments:True"]
            .into_iter()
            .enumerate()
        {
            let replay = replayed(&mut engine, slot as u32, spec, ex.cap_bytes());
            let outcomes = engine.slots[slot]
                .as_ref()
                .expect("replayed")
                .result
                .outcomes
                .clone();
            let ops = replay.summary.ops_done as usize;
            let step = (ops / 200).max(1);
            for at in (0..ops).filter(|&at| at % step == 0 || at + 1 == ops) {
                // The walk: every alloc up to `at` still held, the latest one per address.
                let mut walk: std::collections::HashMap<u64, u32> =
                    std::collections::HashMap::new();
                for a in 0..=at {
                    if let Some(Outcome::Served(addr)) = outcomes.get(a)
                        && trace.ops.live_after(a, at)
                    {
                        walk.insert(addr, a as u32);
                    }
                }
                let l = layout(&mut engine, slot as u32, at as u32);
                for b in &l.blocks {
                    let want =
                        if matches!(b.state, block_state::ALLOCATED | block_state::PENDING_FREE) {
                            walk.get(&b.addr).copied().unwrap_or(wire::NO_OP)
                        } else {
                            wire::NO_OP
                        };
                    assert_eq!(
                        b.alloc, want,
                        "{} {spec}: block at {:#x} after op {at}",
                        ex.file, b.addr
                    );
                    linked += usize::from(want != wire::NO_OP);
                }
            }
        }
    }
    assert!(linked > 1000, "{linked} blocks linked");
}

#[test]
#[allow(clippy::many_single_char_names)]
fn the_layout_at_the_oom_shows_the_holes_and_links_blocks_to_their_allocations() {
    let mut e = Engine::new();
    let t = loaded(&mut e, &OOM_STORY);
    let r = replayed(&mut e, 0, "pytorch", OOM_STORY.cap_bytes());
    let at = r.summary.oom.as_ref().expect("oom").op_index;
    let l = layout(&mut e, 0, at);
    assert_eq!(l.op, at);
    assert_eq!(l.segments.len(), 1, "one 2 GiB segment");
    assert_eq!(l.segments[0].size_bytes, 2 << 30);
    let blocks = &l.blocks;
    let free: Vec<_> = blocks
        .iter()
        .filter(|b| b.state == block_state::FREE)
        .collect();
    let live: Vec<_> = blocks
        .iter()
        .filter(|b| b.state == block_state::ALLOCATED)
        .collect();
    assert_eq!(free.len(), 6, "six holes");
    assert_eq!(free.iter().map(|b| b.size_bytes).max(), Some(248 << 20));
    // Blocks tile the segment.
    let s = &l.segments[0];
    let mut at_addr = s.addr;
    for b in &blocks[s.first as usize..(s.first + s.count) as usize] {
        assert_eq!(b.addr, at_addr);
        at_addr += b.size_bytes;
    }
    assert_eq!(at_addr, s.addr + s.size_bytes);
    // Every allocated block names the alloc op of the allocation in it.
    for b in live {
        assert_ne!(b.alloc, wire::NO_OP);
        assert!(t.ops.live_after(b.alloc as usize, at as usize));
        assert_eq!(t.ops.size_bytes(b.alloc as usize), b.requested_bytes);
    }
    // And the address search finds the allocations that held a block's address.
    let probe = blocks
        .iter()
        .find(|b| b.state == block_state::ALLOCATED)
        .expect("live")
        .addr
        + 4096;
    match last(run(
        &mut e,
        Request::FindAddress {
            job: 4,
            slot: 0,
            addr: probe,
        },
    )) {
        Response::AddressHits { hits, .. } => {
            assert!(!hits.is_empty());
            assert!(
                hits.iter()
                    .all(|h| h.addr <= probe && probe < h.addr + h.size_bytes)
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_layout_past_the_oom_is_the_layout_where_the_replay_stopped() {
    // gc_threshold_s2 ends in a real OOM the program did not survive.
    let ex = examples::by_file("gc_threshold_s2.pickle.gz").expect("built in");
    let mut e = Engine::new();
    let t = loaded(&mut e, ex);
    let r = replayed(&mut e, 0, "pytorch", ex.cap_bytes());
    if (r.summary.ops_done as usize) < t.ops.len() {
        let l = layout(&mut e, 0, t.ops.len() as u32 - 1);
        assert_eq!(l.clamped_to, Some(r.summary.ops_done - 1));
    }
}

#[test]
fn bands_peak_is_the_peak_of_live_requested_bytes() {
    for ex in EXAMPLES.iter().filter(|e| e.bytes.len() < 200_000) {
        let mut e = Engine::new();
        let t = loaded(&mut e, ex);
        let r = replayed(&mut e, 0, "pytorch", None);
        assert!(r.summary.oom.is_none(), "{}: no cap, no OOM", ex.file);
        // The model counts a deferred free's bytes until it completes, as the bands do.
        assert_eq!(
            t.bands.peak_bytes, r.summary.peak_requested_bytes,
            "{}",
            ex.file
        );
        // Pieces never overlap at any op: the stack heights add up to the live bytes.
        let probe = (t.ops.len() / 2) as u32;
        let covered: u64 = t
            .bands
            .pieces
            .iter()
            .filter(|p| p.x0 <= probe && probe < p.x1)
            .map(|p| p.height_bytes(&t.ops))
            .sum();
        let live: u64 = (0..t.ops.len())
            .filter(|&a| t.ops.live_after(a, probe as usize))
            .map(|a| t.ops.size_bytes(a))
            .sum();
        assert_eq!(covered, live, "{}", ex.file);
    }
}

#[test]
fn a_bad_file_fails_with_a_message_and_the_engine_keeps_working() {
    let mut e = Engine::new();
    for bytes in [
        b"not a pickle at all".to_vec(),
        vec![0x80, 0x04, 0x95],
        vec![0x1f, 0x8b, 0x08, 0, 1, 2],
        Vec::new(),
    ] {
        match last(run(
            &mut e,
            Request::Load {
                job: 9,
                name: "bad.pickle".into(),
                bytes,
            },
        )) {
            Response::Failed { job, message } => {
                assert_eq!(job, 9);
                assert!(message.starts_with("bad.pickle: "), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    match last(run(
        &mut e,
        Request::Layout {
            job: 10,
            slot: 0,
            op: 0,
        },
    )) {
        Response::Failed { message, .. } => assert!(message.contains("no trace")),
        other => panic!("{other:?}"),
    }
    let _ = loaded(&mut e, &OOM_STORY);
    match last(run(
        &mut e,
        Request::Replay {
            job: 11,
            slot: 0,
            spec: "nonsense@x:1".into(),
            capacity_bytes: None,
        },
    )) {
        Response::Failed { message, .. } => assert!(message.contains("nonsense"), "{message}"),
        other => panic!("{other:?}"),
    }
    match last(run(
        &mut e,
        Request::Replay {
            job: 12,
            slot: 0,
            spec: "pytorch@max_split_size_mb:banana".into(),
            capacity_bytes: None,
        },
    )) {
        Response::Failed { .. } => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn what_if_sweeps_pytorch_settings_only_with_their_cost() {
    let mut e = Engine::new();
    let _ = loaded(&mut e, &OOM_STORY);
    let cap = OOM_STORY.cap_bytes();
    match last(run(
        &mut e,
        Request::WhatIf {
            job: 5,
            capacity_bytes: cap,
        },
    )) {
        Response::WhatIf { answer, .. } => {
            let rec = {
                let v = allocsim_core::session::load(OOM_STORY.bytes, None).expect("loads");
                let d = v.trace.busiest_device();
                whatif::recommend(&v.trace, d, cap, &mut |_, _| {}).expect("recommend")
            };
            assert_eq!(answer.candidates_tried as usize, rec.candidates_tried);
            assert_eq!(answer.tradeoffs.len(), rec.tradeoffs.len());
            for (row, r) in answer.tradeoffs.iter().zip(&rec.tradeoffs) {
                assert!(row.spec == "pytorch" || row.spec.starts_with("pytorch@"));
                assert_eq!(row.peak_reserved_bytes, r.peak_reserved_bytes);
                assert_eq!(row.segment_ops, r.segment_ops);
                assert_eq!(row.synchronizing_ops, r.driver.synchronizing);
                assert!((row.driver_time_us - r.driver.driver_time_us).abs() < 1e-9);
            }
            assert!(answer.tradeoffs[0].recommended && answer.tradeoffs[0].fits);
            let recorded = answer.recorded.as_ref().expect("the recorded settings");
            assert!(!recorded.fits, "the story runs out of memory as recorded");
        }
        other => panic!("{other:?}"),
    }
    match last(run(
        &mut e,
        Request::Runtimes {
            job: 6,
            capacity_bytes: cap,
        },
    )) {
        Response::Runtimes { rows, .. } => {
            assert_eq!(rows.len(), MODEL_NAMES.len() - 1);
            assert!(rows.iter().all(|r| !r.spec.starts_with("pytorch")));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_cancelled_what_if_stops_and_says_so() {
    let mut e = Engine::new();
    let _ = loaded(&mut e, &OOM_STORY);
    let work = e
        .detached(Request::WhatIf {
            job: 9,
            capacity_bytes: OOM_STORY.cap_bytes(),
        })
        .expect("a what-if runs beside the engine");
    // The cancel reaches the engine while the sweep waits to run (or runs).
    assert!(run(&mut e, Request::Cancel { job: 9 }).is_empty());
    let mut out = Vec::new();
    work(&mut |r| out.push(r));
    match last(out) {
        Response::Failed { job: 9, message } => {
            assert!(
                message.contains(crate::engine::parallel::CANCELLED),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A new what-if is not cancelled.
    assert!(matches!(
        last(run(
            &mut e,
            Request::WhatIf {
                job: 10,
                capacity_bytes: OOM_STORY.cap_bytes(),
            }
        )),
        Response::WhatIf { job: 10, .. }
    ));
}

/// A real snapshot in the repository: a full H100 split into holes, then a 23.60 GiB
/// request that no hole holds.
const DEVFULL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/traces/devfull_oom_msg.pickle.gz"
);

#[test]
#[allow(clippy::many_single_char_names)]
fn explain_answers_what_core_explains_and_crosses_to_the_worker() {
    let bytes = std::fs::read(DEVFULL).expect("tests/traces/devfull_oom_msg.pickle.gz");
    let mut e = Engine::new();
    let t = match last(run(
        &mut e,
        Request::Load {
            job: 1,
            name: "devfull_oom_msg.pickle.gz".into(),
            bytes: bytes.clone(),
        },
    )) {
        Response::Loaded { trace, .. } => trace,
        other => panic!("{other:?}"),
    };
    let cap = t.recorded_capacity.as_ref().and_then(|c| c.bytes);
    let r = replayed(&mut e, 0, "pytorch", cap);
    let oom = r.summary.oom.as_ref().expect("an OOM");
    let ask = Request::Explain {
        job: 3,
        spec: "pytorch".into(),
        capacity_bytes: cap,
        at_event: oom.event_index,
    };
    let (op_index, got) = match last(run(&mut e, ask.clone())) {
        Response::Explained {
            op_index,
            explanation,
            ..
        } => (op_index, explanation),
        other => panic!("{other:?}"),
    };
    // What `allocsim explain` says at that OOM.
    let v = allocsim_core::session::load(&bytes, None).expect("loads");
    let d = v.trace.busiest_device();
    let want = explain::explain(
        &v.trace,
        d,
        &ModelSpec::parse("pytorch").expect("spec"),
        cap,
        ExplainOptions::default(),
        &whatif::InOrder,
        &mut |_, _| {},
    )
    .expect("explain");
    assert_eq!(op_index, oom.op_index);
    assert_eq!(want.op_index, oom.op_index as usize);
    assert_eq!(got.blockers, want.blockers);
    assert_eq!(got.holes, want.holes);
    assert_eq!(got.blocker_set, want.blocker_set);
    assert_eq!(got.pytorch_message, want.pytorch_message);
    assert!(!got.blockers.is_empty());
    // The bounds come apart (`Bounds`), as `explain` states them; the explanation leaves
    // them out.
    assert_eq!((got.live_peak_bytes, got.offline_peak_bytes), (0, 0));
    match last(run(&mut e, Request::Bounds { job: 4 })) {
        Response::Bounds { bounds, .. } => assert_eq!(
            (bounds.live_peak_bytes, bounds.offline_peak_bytes),
            (want.live_peak_bytes, want.offline_peak_bytes)
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        got.layout.segments.is_empty(),
        "the layout stays in the engine"
    );
    // Asked again: the same answer, from the cache.
    match last(run(&mut e, ask)) {
        Response::Explained { explanation, .. } => assert_eq!(explanation, got),
        other => panic!("{other:?}"),
    }
    // Through the worker's bytes.
    let resp = Response::Explained {
        job: 3,
        op_index,
        explanation: got.clone(),
    };
    let mut crossed = got.clone();
    crossed.op_index = 0; // not in the message: `Response::Explained::op_index` carries it
    match wire::decode::<Response>(&wire::encode(&resp).expect("encode")).expect("decode") {
        Response::Explained { explanation, .. } => assert_eq!(explanation, crossed),
        other => panic!("{other:?}"),
    }
    // The bounds, once per trace.
    match last(run(&mut e, Request::Bounds { job: 4 })) {
        Response::Bounds { bounds, .. } => assert_eq!(bounds, want.best_possible()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn messages_survive_the_trip_to_the_worker() {
    let mut e = Engine::new();
    let t = loaded(&mut e, &OOM_STORY);
    let resp = Response::Loaded {
        job: 7,
        trace: t.clone(),
        main_answered: true,
    };
    let back: Response = wire::decode(&wire::encode(&resp).expect("encode")).expect("decode");
    match back {
        Response::Loaded {
            job,
            trace,
            main_answered,
        } => {
            assert_eq!(job, 7);
            assert!(main_answered);
            assert!(trace.ops.sizes().eq(t.ops.sizes()));
            assert_eq!(trace.bands.pieces, t.bands.pieces);
            assert_eq!(trace.stacks.strings, t.stacks.strings);
        }
        other => panic!("{other:?}"),
    }
    let req = Request::Replay {
        job: 1,
        slot: 2,
        spec: "pytorch".into(),
        capacity_bytes: Some(5),
    };
    let back: Request = wire::decode(&wire::encode(&req).expect("encode")).expect("decode");
    assert!(matches!(
        back,
        Request::Replay {
            slot: 2,
            capacity_bytes: Some(5),
            ..
        }
    ));
    assert!(wire::decode::<Request>(&[0xff, 0xff, 0xff]).is_err());
}

/// Pinned host memory a newer snapshot lists is named in the trace's notes ("About this
/// trace"), apart from device memory: the device's reserved bytes do not include it.
#[test]
fn host_memory_of_a_newer_snapshot_is_listed_apart_from_device_memory() {
    let json = r#"{"segments": [{"device": 0, "address": 1048576, "total_size": 2097152, "stream": 0, "segment_type": "small", "allocated_size": 0, "active_size": 0, "requested_size": 0, "blocks": [{"size": 2097152, "requested_size": 0, "state": "inactive"}]}], "device_traces": [[]], "host_segments": [{"address": 30064771072, "total_size": 1048576, "allocated_size": 4096, "blocks": []}]}"#;
    let mut engine = Engine::default();
    let trace = match last(run(
        &mut engine,
        Request::Load {
            job: 1,
            name: "host.json".into(),
            bytes: json.as_bytes().to_vec(),
        },
    )) {
        Response::Loaded { trace, .. } => trace,
        other => panic!("{other:?}"),
    };
    let note = trace
        .notes
        .iter()
        .find(|n| n.starts_with("pinned host memory"))
        .unwrap_or_else(|| panic!("{:?}", trace.notes));
    assert!(
        note.contains("1 segments, 1024.00 KiB reserved, 4.00 KiB allocated"),
        "{note}"
    );
    let r = replayed(&mut engine, 0, "pytorch", None);
    assert_eq!(
        r.summary.peak_reserved_bytes,
        2 << 20,
        "host memory is not device memory"
    );
}

/// What the file records reaches the UI before its trace, and it is what the trace and the
/// PyTorch model's replay say: at every alloc op the live requested bytes of the ops (for
/// a trace that starts empty) and the replay's reserved bytes (for an exact recording),
/// and the end state is the replay's layout after the last op.
#[test]
fn the_recorded_timeline_comes_first_and_agrees_with_the_trace_and_the_replay() {
    let mut checked_end_states = 0;
    for ex in EXAMPLES {
        let mut e = Engine::new();
        let out = run(
            &mut e,
            Request::Load {
                job: 1,
                name: ex.file.into(),
                bytes: ex.bytes.to_vec(),
            },
        );
        let rec_at = out
            .iter()
            .position(|r| matches!(r, Response::Recorded { .. }))
            .unwrap_or_else(|| panic!("{}: no recorded timeline", ex.file));
        let loaded_at = out
            .iter()
            .position(|r| matches!(r, Response::Loaded { .. }))
            .unwrap_or_else(|| panic!("{}: not loaded", ex.file));
        assert!(
            rec_at < loaded_at,
            "{}: the recorded timeline comes first",
            ex.file
        );
        let (Response::Recorded { recorded, .. }, Response::Loaded { trace, .. }) =
            (&out[rec_at], &out[loaded_at])
        else {
            unreachable!()
        };
        assert_eq!(recorded.name, ex.file);
        assert_eq!(
            recorded.device, trace.device,
            "{}: the device shown",
            ex.file
        );
        let events = trace.devices[trace.device as usize].0 as usize;
        assert_eq!(recorded.reserved_bytes.len(), events, "{}", ex.file);
        assert_eq!(recorded.requested_bytes.len(), events, "{}", ex.file);
        let ops = &trace.ops;
        let live = bands::live_bytes_per_op(ops);
        let mut by_links = Vec::new();
        bands::each_live_bytes_by_links(ops, |b| by_links.push(b));
        assert_eq!(by_links, live, "{}: the live bytes from the links", ex.file);
        assert_eq!(
            Some(bands::peak_by_links(ops)),
            live.iter().max().copied(),
            "{}: the peak from the links",
            ex.file
        );
        let replay = replayed(&mut e, 0, "pytorch", ex.cap_bytes());
        let mut compared = 0;
        for (k, &live_bytes) in live.iter().enumerate() {
            if ops.kind[k] != wire::op_kind::ALLOC {
                continue;
            }
            let ev = ops.event_index(k) as usize;
            if ev >= events {
                continue;
            }
            if !trace.starts_mid_program {
                assert_eq!(
                    recorded.requested_bytes.get(ev),
                    Some(live_bytes),
                    "{}: live requested bytes at op {k} (event {ev})",
                    ex.file
                );
            }
            if trace.exact && k < replay.timeline.len() {
                assert_eq!(
                    recorded.reserved_bytes.get(ev),
                    replay.timeline.reserved_bytes.get(k),
                    "{}: reserved bytes at op {k} (event {ev})",
                    ex.file
                );
                compared += 1;
            }
        }
        assert!(
            compared > 0 || !trace.exact,
            "{}: nothing compared",
            ex.file
        );
        if trace.exact && replay.summary.ops_done as usize == ops.len() && !ops.is_empty() {
            let l = layout(&mut e, 0, ops.len() as u32 - 1);
            let segs = |l: &LayoutData| {
                let mut v: Vec<_> = l.segments.iter().map(|s| (s.addr, s.size_bytes)).collect();
                v.sort_unstable();
                v
            };
            let blocks = |l: &LayoutData| {
                let mut v: Vec<_> = l
                    .blocks
                    .iter()
                    .filter(|b| b.state != block_state::UNMAPPED)
                    .map(|b| (b.addr, b.size_bytes, b.requested_bytes, b.state))
                    .collect();
                v.sort_unstable();
                v
            };
            // An expandable segment is one range of address space in the model, and its
            // mapped pieces in the file: the blocks agree, the segments only without it.
            if !l.segments.iter().any(|s| s.expandable) {
                assert_eq!(
                    segs(&recorded.end_state),
                    segs(&l),
                    "{}: end-state segments",
                    ex.file
                );
            }
            assert_eq!(
                blocks(&recorded.end_state),
                blocks(&l),
                "{}: end-state blocks",
                ex.file
            );
            checked_end_states += 1;
        }
    }
    assert!(
        checked_end_states >= 3,
        "{checked_end_states} end states checked"
    );
}
/// A file in a private temporary directory, removed with it.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> TempFile {
        let dir = std::env::temp_dir().join(format!(
            "allocsim-engine-open-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// What the app sends with a new file: PyTorch, as recorded.
fn main_pytorch() -> wire::MainReplay {
    wire::MainReplay {
        spec: "pytorch".into(),
        capacity_bytes: None,
        as_recorded: true,
        answer: None,
    }
}

fn open_file(engine: &mut Engine, job: u64, path: &std::path::Path) -> Vec<Response> {
    run(
        engine,
        Request::Open {
            job,
            name: path.file_name().unwrap().to_string_lossy().into_owned(),
            path: path.to_string_lossy().into_owned(),
            main: Box::new(main_pytorch()),
        },
    )
}

fn gunzipped(e: &examples::Example) -> Vec<u8> {
    allocsim_core::snapshot::import::gunzip(e.bytes, u64::MAX).expect("gunzip")
}

#[test]
fn a_file_opened_in_pieces_loads_as_its_bytes_do_with_progress() {
    for e in EXAMPLES {
        let plain = gunzipped(e);
        // As the engine answers an open: the bands come after, asked for apart.
        let mut want = loaded(&mut Engine::new(), e);
        want.bands = Arc::default();
        let want = serde_json::to_string(&want).expect("json");
        for (name, bytes) in [
            (e.file.to_string(), e.bytes.to_vec()),
            ("plain.pickle".into(), plain),
        ] {
            let file = TempFile::new(&name, &bytes);
            let mut engine = Engine::new();
            let out = open_file(&mut engine, 7, &file.0);
            // The recorded timeline, made while the trace is built, goes out once and
            // before the trace.
            let recorded: Vec<usize> = (0..out.len())
                .filter(|&k| matches!(out[k], Response::Recorded { .. }))
                .collect();
            assert_eq!(recorded.len(), 1, "{name}");
            assert!(
                out[recorded[0] + 1..]
                    .iter()
                    .any(|r| matches!(r, Response::Loaded { .. })),
                "{name}"
            );
            let fractions: Vec<f32> = out
                .iter()
                .filter_map(|r| match r {
                    Response::Progress { fraction, .. } => Some(*fraction),
                    _ => None,
                })
                .collect();
            // At least the decode's end (half of the open) and the build's progress (a
            // small plain pickle is read in one piece, in a single pass).
            assert!(fractions.len() >= 2, "{name}: progress {fractions:?}");
            assert!(fractions.contains(&0.5), "{name}: progress {fractions:?}");
            assert!(fractions.windows(2).all(|w| w[0] <= w[1]), "{fractions:?}");
            match last(out) {
                Response::Loaded {
                    job: 7, mut trace, ..
                } => {
                    trace.name = e.file.into();
                    assert_eq!(serde_json::to_string(&trace).expect("json"), want, "{name}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_truncated_file_fails_with_the_file_and_the_byte_offset_of_the_whole_file() {
    let plain = gunzipped(&OOM_STORY);
    let cut = &plain[..plain.len() * 2 / 3];
    let want = allocsim_core::snapshot::decode_snapshot(cut).expect_err("truncated");
    let file = TempFile::new("cut.pickle", cut);
    match last(open_file(&mut Engine::new(), 3, &file.0)) {
        Response::Failed { job: 3, message } => {
            assert_eq!(message, format!("{}: {want}", file.0.display()));
            assert!(message.contains("byte "), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let missing = file.0.with_file_name("missing.pickle");
    match last(open_file(&mut Engine::new(), 4, &missing)) {
        Response::Failed { message, .. } => {
            assert!(
                message.starts_with(&format!("{}: cannot read:", missing.display())),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_open_is_cancelled_from_outside_the_busy_engine() {
    let plain = gunzipped(&examples::EXAMPLES[EXAMPLES.len() - 1]);
    // Pieces of 4 MiB: a file of several makes several progress reports to cancel at.
    let mut big = plain.clone();
    while big.len() < 3 * super::open::PIECE_BYTES {
        big.extend_from_slice(&plain);
    }
    let file = TempFile::new("big.pickle", &big);
    let mut e = Engine::new();
    let cancels = e.cancels();
    let mut out = Vec::new();
    e.handle(
        Request::Open {
            job: 5,
            name: "big.pickle".into(),
            path: file.0.to_string_lossy().into_owned(),
            main: Box::new(main_pytorch()),
        },
        &mut |r| {
            // The host's Cancel arrives while the engine reads (it does not queue behind).
            if matches!(r, Response::Progress { .. }) {
                cancels.cancel(5);
            }
            out.push(r);
        },
    );
    let progress = out
        .iter()
        .filter(|r| matches!(r, Response::Progress { .. }))
        .count();
    match last(out) {
        Response::Failed { job: 5, message } => {
            assert_eq!(message, "opening big.pickle: cancelled");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        progress <= 2,
        "stopped at the first piece: {progress} reports"
    );
}

#[test]
fn a_snapshot_too_big_for_wasm_is_refused_before_it_is_read() {
    // The 1.12 GB generated snapshot opens (2.8 GB of the 4 GiB, measured in the browser).
    assert_eq!(
        super::open::too_big_for_wasm("big.pickle", 1_124_391_974),
        None
    );
    // 1.9 GB needs about 4.8 GB: past wasm's 4 GiB.
    let m = super::open::too_big_for_wasm("huge.pickle", 1_900_000_000).expect("refused");
    assert!(
        m.starts_with("huge.pickle: 1.9 GB of snapshot needs about 4.8 GB"),
        "{m}"
    );
    assert!(m.contains("4 GiB") && !m.contains('\n'), "{m}");
    // kvcache_decode (14.6 MB) opens.
    assert_eq!(super::open::too_big_for_wasm("kv.pickle", 14_628_240), None);
}

#[test]
fn the_ui_shares_the_engines_tables_and_takes_the_replays_timeline_without_a_copy() {
    let mut e = Engine::new();
    let t = loaded(&mut e, &OOM_STORY);
    // The ops table the UI gets is the engine's own (one allocation, two handles).
    assert!(Arc::ptr_eq(&t.ops, &e.ops), "the ops table is shared");
    assert_eq!(Arc::strong_count(&e.ops), 2);
    // The bands are the engine's stacking of that very table, and the job that stacked
    // them built the live index the first layout needs.
    assert_eq!(t.bands.pieces, bands::build(&e.ops).pieces);
    assert!(
        e.live.get().is_some(),
        "the live index is built with the bands"
    );
    let r = replayed(&mut e, 0, "pytorch", OOM_STORY.cap_bytes());
    assert_eq!(r.timeline.len(), r.summary.ops_done as usize);
    assert!(!r.timeline.is_empty());
    // The engine kept no timeline: the UI's columns are the only ones.
    let kept = &e.slots[0].as_ref().expect("slot 0").result.timeline;
    assert_eq!(kept.len(), 0, "the timeline moved to the UI");
    // Layouts still come from the replay's checkpoints and outcomes.
    let l = layout(&mut e, 0, r.summary.ops_done - 1);
    assert_eq!(
        l.segments.iter().map(|s| s.size_bytes).sum::<u64>(),
        r.timeline
            .reserved_bytes
            .get(r.timeline.len() - 1)
            .expect("a sample")
    );
    // Natively the bands are stacked beside the engine (a detached job), so the main
    // replay does not wait for them.
    assert!(e.detached(Request::Bands { job: 9 }).is_ok());
}

#[test]
fn the_main_replay_beside_an_open_answers_as_the_replay_after_the_build() {
    let mut used = 0;
    for e in EXAMPLES {
        let file = TempFile::new(&format!("beside-{}.pickle", e.file), &gunzipped(e));
        let mut opened = Engine::new();
        let trace = match last(open_file(&mut opened, 7, &file.0)) {
            Response::Loaded { trace, .. } => trace,
            other => panic!("{}: {other:?}", e.file),
        };
        // What the UI asks for first: PyTorch under the capacity as recorded.
        let cap = trace.recorded_capacity.as_ref().and_then(|c| c.bytes);
        let beside = opened
            .beside
            .as_ref()
            .is_some_and(|b| b.capacity_bytes == cap);
        used += usize::from(beside);
        let mut after = Engine::new();
        loaded(&mut after, e);
        let want = replayed(&mut after, 0, "pytorch", cap);
        let got = replayed(&mut opened, 0, "pytorch", cap);
        assert!(opened.beside.is_none(), "taken once");
        assert_eq!(
            serde_json::to_string(&got).expect("json"),
            serde_json::to_string(&want).expect("json"),
            "{}",
            e.file
        );
        let n = trace.ops.len() as u32;
        for op in [0, n / 3, n / 2, n.saturating_sub(1)] {
            assert_eq!(
                serde_json::to_string(&layout(&mut opened, 0, op)).expect("json"),
                serde_json::to_string(&layout(&mut after, 0, op)).expect("json"),
                "{} op {op}",
                e.file
            );
        }
    }
    assert!(used >= 2, "{used} examples replayed beside the build");
}

#[test]
fn a_replay_beside_an_open_is_not_taken_for_another_configuration() {
    // The first example replayed beside its open (one without a recorded refusal).
    let (e, mut opened, trace) = EXAMPLES
        .iter()
        .find_map(|e| {
            let file = TempFile::new(&format!("other-{}.pickle", e.file), &gunzipped(e));
            let mut opened = Engine::new();
            match last(open_file(&mut opened, 7, &file.0)) {
                Response::Loaded { trace, .. } if opened.beside.is_some() => {
                    Some((e, opened, trace))
                }
                _ => None,
            }
        })
        .expect("an example replayed beside its open");
    let cap = Some(
        trace
            .recorded_capacity
            .as_ref()
            .and_then(|c| c.bytes)
            .unwrap_or(64 << 30)
            / 2,
    );
    let mut after = Engine::new();
    loaded(&mut after, e);
    for (spec, cap) in [("pytorch", cap), ("pytorch@expandable_segments:True", None)] {
        let got = replayed(&mut opened, 0, spec, cap);
        let want = replayed(&mut after, 0, spec, cap);
        assert_eq!(got.summary.config, want.summary.config, "{spec}");
        assert_eq!(
            serde_json::to_string(&got).expect("json"),
            serde_json::to_string(&want).expect("json"),
            "{spec} {cap:?}"
        );
    }
}

/// Example `e` opened by an engine that replays nothing ahead, and by one given `main`
/// (`Engine::open_decoded_replaying`, the browser's worker), with the latter's answers.
fn opened_ahead(e: &examples::Example, main: &wire::MainReplay) -> (Engine, Engine, Vec<Response>) {
    opened_ahead_from(e, main, LoadedAheadOps::default())
}

/// [`opened_ahead`], the trace sent before its main replay from `loaded_ahead` ops.
fn opened_ahead_from(
    e: &examples::Example,
    main: &wire::MainReplay,
    loaded_ahead: LoadedAheadOps,
) -> (Engine, Engine, Vec<Response>) {
    let snap = || allocsim_core::snapshot::import::decode_snapshot(e.bytes).expect("decodes");
    let mut asked = Engine::new();
    asked.open_decoded(1, e.file.into(), Ok(snap()), &mut |_| {});
    let mut ahead = Engine::new();
    ahead.loaded_ahead = loaded_ahead;
    let mut answers = Vec::new();
    ahead.open_decoded_replaying(1, e.file.into(), Ok(snap()), Some(main), &mut |r| {
        answers.push(r);
    });
    (asked, ahead, answers)
}

/// The browser's worker replays the main configuration as soon as the trace is built
/// (`Engine::open_decoded_replaying`; kept from the build's own pass where that pass is the
/// replay, `open::build_keeping_replay`): the UI's first `Replay` of it is answered from
/// that replay, as one replayed when asked is, and only once; another capacity is replayed
/// when asked; a recording with a refusal, as recorded, is not replayed ahead.
#[test]
fn a_main_replay_done_ahead_answers_as_one_replayed_when_asked() {
    let main = main_pytorch();
    let mut replayed_ahead = 0;
    let mut from_the_pass = 0;
    let spec = allocsim_core::models::ModelSpec::parse(&main.spec).expect("parses");
    for e in EXAMPLES {
        let snap = || allocsim_core::snapshot::import::decode_snapshot(e.bytes).expect("decodes");
        let (_, kept) = open::build_keeping_replay(snap(), &main, &spec).expect("builds");
        from_the_pass += usize::from(kept.is_some());
        let (mut asked, mut ahead, answers) = opened_ahead(e, &main);
        assert!(
            matches!(answers.last(), Some(Response::Loaded { .. })),
            "{}: the trace is the last answer (the replay ahead, unasked, is not posted)",
            e.file
        );
        let expected = open::replayed_ahead(&snap(), &main).is_some();
        assert_eq!(ahead.beside.is_some(), expected, "{}", e.file);
        replayed_ahead += usize::from(expected);
        let encode = |r: &ReplayData| wire::encode(r).expect("encodes");
        let want = replayed(&mut asked, 0, "pytorch", None);
        assert_eq!(
            encode(&replayed(&mut ahead, 0, "pytorch", None)),
            encode(&want),
            "{}",
            e.file
        );
        assert!(ahead.beside.is_none(), "{}: taken once", e.file);
        // Again, and under another capacity: replayed when asked, as the other engine does.
        assert_eq!(
            encode(&replayed(&mut ahead, 1, "pytorch", None)),
            encode(&want)
        );
        let cap = Some(1 << 30);
        assert_eq!(
            encode(&replayed(&mut ahead, 2, "pytorch", cap)),
            encode(&replayed(&mut asked, 2, "pytorch", cap)),
            "{}",
            e.file
        );
    }
    assert!(replayed_ahead > 0, "no example was replayed ahead");
    assert!(
        from_the_pass > 0,
        "no example kept its build's pass as the replay"
    );
}

/// Given the UI's jobs (`MainReplay::answer`), the worker answers the main replay done
/// ahead and its start layout unasked, right behind the trace, which says so: the replay
/// as one asked for, the layout at its first OOM or peak as `StartLayout` puts it, with no
/// progress frame between the build and them; the engine then holds that replay as if
/// asked (a layout of slot 0 answers). Without a replay ahead, nothing is answered unasked.
#[test]
fn the_main_replay_done_ahead_and_its_layout_are_answered_unasked_behind_the_trace() {
    let main = wire::MainReplay {
        answer: Some((5, 6)),
        ..main_pytorch()
    };
    let mut answered = 0;
    for e in EXAMPLES {
        let snap = || allocsim_core::snapshot::import::decode_snapshot(e.bytes).expect("decodes");
        let (mut asked, mut ahead, out) = opened_ahead(e, &main);
        let expected = open::replayed_ahead(&snap(), &main).is_some();
        let at = out
            .iter()
            .position(|r| matches!(r, Response::Loaded { .. }))
            .expect("loaded");
        let Response::Loaded { main_answered, .. } = &out[at] else {
            unreachable!()
        };
        assert_eq!(*main_answered, expected, "{}", e.file);
        let progress = |r: &Response| matches!(r, Response::Progress { stage, .. } if stage.contains("ops table"));
        assert_eq!(out[..at].iter().any(progress), !expected, "{}", e.file);
        if !expected {
            assert_eq!(at + 1, out.len(), "{}: nothing unasked", e.file);
            continue;
        }
        answered += 1;
        let rest: Vec<&Response> = out[at + 1..]
            .iter()
            .filter(|r| !matches!(r, Response::Progress { .. }))
            .collect();
        main_answers_as_asked(&rest, &mut asked, e.file);
        assert!(ahead.beside.is_none(), "{}: taken by the answer", e.file);
        assert_eq!(layout(&mut ahead, 0, 0).op, 0, "{}", e.file);
    }
    assert!(answered > 0, "no example was answered unasked");
}

/// `answers` are the main replay (job 5) and its start layout (job 6) answered unasked,
/// equal to `asked`'s answers of them.
fn main_answers_as_asked(answers: &[&Response], asked: &mut Engine, file: &str) {
    let want = replayed(asked, 0, "pytorch", None);
    let [
        Response::Replayed {
            job: 5,
            slot: 0,
            replay,
        },
        Response::Layout {
            job: 6,
            slot: 0,
            layout: got,
        },
    ] = answers
    else {
        panic!("{file}: {answers:?}");
    };
    let encode = |r: &ReplayData| wire::encode(r).expect("encodes");
    assert_eq!(encode(replay), encode(&want), "{file}");
    assert_eq!(got.op, want.start_op(), "{file}");
    let want_layout = layout(asked, 0, want.start_op());
    assert_eq!(
        wire::encode(got.as_ref()).expect("encodes"),
        wire::encode(&want_layout).expect("encodes"),
        "{file}"
    );
}

/// A trace of at least `LoadedAheadOps` ops (every example, here, from 0) goes to the UI
/// before its main replay is made, saying that the replay and its layout follow unasked;
/// they follow, as they do behind a trace sent after its replay — also where no replay is
/// made ahead (a refusal as recorded): then replayed as asked.
#[test]
fn a_big_trace_goes_before_its_main_replay_and_the_same_answers_follow() {
    let main = wire::MainReplay {
        answer: Some((5, 6)),
        ..main_pytorch()
    };
    for e in EXAMPLES {
        let (mut asked, mut ahead, out) = opened_ahead_from(e, &main, LoadedAheadOps(0));
        let rest: Vec<&Response> = out
            .iter()
            .filter(|r| !matches!(r, Response::Progress { .. } | Response::Recorded { .. }))
            .collect();
        let Some((
            Response::Loaded {
                main_answered: true,
                ..
            },
            answers,
        )) = rest.split_first()
        else {
            panic!("{}: {rest:?}", e.file);
        };
        main_answers_as_asked(answers, &mut asked, e.file);
        assert_eq!(layout(&mut ahead, 0, 0).op, 0, "{}", e.file);
    }
}

/// An engine whose UI took the ops table as its contents (the browser's worker: each
/// answer posted, then dropped) keeps only the columns it reads itself, and answers as an
/// engine whose UI shares the table: the same replays, layouts and bands.
#[test]
fn an_engine_whose_ui_took_its_ops_table_keeps_its_own_columns_and_answers_alike() {
    for ex in EXAMPLES {
        let mut shared = Engine::new();
        let t = loaded(&mut shared, ex);
        let mut posted = Engine::new();
        let load = Request::Load {
            job: 1,
            name: ex.file.into(),
            bytes: ex.bytes.to_vec(),
        };
        posted.handle(load, &mut drop);
        assert!(!t.ops.is_empty(), "{}", ex.file);
        assert_eq!(
            shared.ops.stack.len(),
            t.ops.len(),
            "{}: kept whole",
            ex.file
        );
        let (kept, whole) = (&posted.ops, &shared.ops);
        assert!(!kept.has_shown_columns() && kept.has_no_times() && whole.has_shown_columns());
        assert_eq!(
            (&kept.kind, &kept.link),
            (&whole.kind, &whole.link),
            "{}",
            ex.file
        );
        assert!(kept.sizes().eq(whole.sizes()), "{}", ex.file);
        assert!(kept.ends().eq(whole.ends()), "{}", ex.file);
        let bands = match last(run(&mut posted, Request::Bands { job: 1 })) {
            Response::Bands { bands, .. } => bands,
            other => panic!("{}: {other:?}", ex.file),
        };
        assert_eq!(
            (&bands.pieces, bands.peak_bytes, bands.epsilon_bytes),
            (&t.bands.pieces, t.bands.peak_bytes, t.bands.epsilon_bytes),
            "{}: bands",
            ex.file
        );
        let n = t.ops.len() as u32;
        for (slot, spec) in ["pytorch", "pytorch@expandable_segments:True"]
            .into_iter()
            .enumerate()
        {
            let slot = slot as u32;
            let a = replayed(&mut shared, slot, spec, ex.cap_bytes());
            let b = replayed(&mut posted, slot, spec, ex.cap_bytes());
            assert_eq!(a.summary, b.summary, "{}: {spec}", ex.file);
            for op in [0, n / 3, n / 2, n - 1] {
                assert_eq!(
                    layout(&mut shared, slot, op),
                    layout(&mut posted, slot, op),
                    "{}: {spec} at op {op}",
                    ex.file
                );
            }
        }
    }
}

#[test]
fn the_ops_table_states_each_op_and_links_each_allocation_to_its_free() {
    for e in EXAMPLES {
        let mut engine = Engine::new();
        loaded(&mut engine, e);
        let trace = engine.trace.as_ref().expect("loaded");
        let ops = &trace.devices[engine.device].ops;
        // The table the engine made (its two halves on two threads) against the ops.
        let t = &engine.ops;
        assert_eq!(t.len(), ops.len(), "{}", e.file);
        let mut frees = 0;
        for (k, op) in ops.iter().enumerate() {
            let at = |what: &str| format!("{}: op {k} {what}", e.file);
            assert_eq!(t.stack[k], op.stack.0, "{}", at("stack"));
            assert_eq!(t.event_index(k), op.event_index, "{}", at("entry"));
            assert_eq!(t.time_us(k), Some(op.time_us), "{}", at("time"));
            match op.kind {
                OpKind::Alloc {
                    size_bytes,
                    recorded_oom,
                    ..
                } => {
                    let kind = if recorded_oom {
                        wire::op_kind::ALLOC_RECORDED_OOM
                    } else {
                        wire::op_kind::ALLOC
                    };
                    assert_eq!(
                        (t.kind[k], t.size_bytes(k)),
                        (kind, size_bytes),
                        "{}",
                        at("alloc")
                    );
                }
                OpKind::Free { alloc, deferred } => {
                    frees += 1;
                    let a = alloc as usize;
                    assert_eq!(
                        (t.kind[k], t.link[k], t.link[a]),
                        (wire::op_kind::FREE, alloc, k as u32),
                        "{}",
                        at("free")
                    );
                    if !deferred {
                        assert_eq!(t.end(a), k as u32, "{}", at("free's end"));
                    }
                }
                OpKind::CompleteFree { alloc } => {
                    assert_eq!(
                        (t.kind[k], t.link[k], t.end(alloc as usize)),
                        (wire::op_kind::COMPLETE_FREE, alloc, k as u32),
                        "{}",
                        at("completion")
                    );
                }
                OpKind::EmptyCache | OpKind::ReleasePool { .. } => {
                    assert_eq!(t.size_bytes(k), 0, "{}", at("no size"));
                }
            }
        }
        assert!(frees > 0, "{}: frees to link", e.file);
    }
}

/// The CSV export is core's CSV of a replay with every column (here read as the replay
/// makes it, no timeline kept), in pieces of `CSV_PIECE_ROWS` rows, the last one `done`:
/// on a trace of several pieces, on a wrapped one (its start state loaded) and under a
/// capacity that stops the replay at an OOM (rows up to it). The app's own replays keep
/// only the columns it draws, their samples those of the full replay.
#[test]
fn the_csv_export_is_cores_csv_of_the_full_replay_in_pieces() {
    for (file, spec, cap) in [
        (
            "kvcache_decode.pickle.gz",
            "pytorch@garbage_collection_threshold:0.5",
            None,
        ),
        ("wrapped_history_pub.pickle.gz", "pytorch", None),
        ("kvcache_decode.pickle.gz", "pytorch", Some(300u64 << 20)),
        ("kvcache_decode.pickle.gz", "bfc", None),
    ] {
        let ex = examples::by_file(file).expect("built in");
        let mut e = Engine::new();
        loaded(&mut e, ex);
        let drawn = replayed(&mut e, 0, spec, cap);
        let t = &drawn.timeline;
        assert!(!t.is_empty() && !t.keeps_every_column(), "{file} {spec}");
        assert!(t.requested_bytes.is_empty() && t.free_holes.is_empty());

        let v = allocsim_core::session::load(ex.bytes, None).expect("loads");
        let device = v.trace.busiest_device();
        let full = allocsim_core::session::replay_device(
            &v.trace,
            device,
            &ModelSpec::parse(spec).expect("spec"),
            cap,
            ReplayOptions::default(),
        )
        .expect("replays");
        assert!(full.timeline.keeps_every_column());
        assert_eq!(full.timeline.len(), t.len());
        for (a, b) in [
            (&full.timeline.reserved_bytes, &t.reserved_bytes),
            (&full.timeline.allocated_bytes, &t.allocated_bytes),
            (&full.timeline.largest_free_bytes, &t.largest_free_bytes),
        ] {
            assert_eq!(a.to_vec(), b.to_vec());
        }
        let times: Vec<i64> = v.trace.devices[device]
            .ops
            .iter()
            .map(|o| o.time_us)
            .collect();
        let want = full.timeline.to_csv(&times);
        let rows = want.lines().count() - 1;
        if cap.is_some() {
            assert!(
                full.oom.is_some() && rows < times.len(),
                "{file}: stopped at the OOM"
            );
        } else {
            assert_eq!(rows, times.len(), "{file}: a row per op");
        }
        if file.starts_with("kvcache") && cap.is_none() {
            assert!(
                rows > CSV_PIECE_ROWS,
                "{file}: {rows} rows, more than one piece"
            );
        }

        let mut pieces = Vec::new();
        for r in run(
            &mut e,
            Request::ExportCsv {
                job: 9,
                spec: spec.into(),
                capacity_bytes: cap,
            },
        ) {
            match r {
                Response::CsvPiece { job, bytes, done } => {
                    assert_eq!(job, 9);
                    pieces.push((String::from_utf8(bytes).expect("UTF-8"), done));
                }
                Response::Progress { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            pieces.len(),
            rows / CSV_PIECE_ROWS + 1,
            "{file}: {rows} rows"
        );
        let dones: Vec<bool> = pieces.iter().map(|p| p.1).collect();
        assert!(dones.last() == Some(&true) && dones.iter().filter(|&&d| d).count() == 1);
        assert!(pieces[0].0.starts_with("op,time_us,reserved_bytes,"));
        let got: String = pieces.iter().map(|p| p.0.as_str()).collect();
        assert!(
            got == want,
            "{file} {spec} {cap:?}: the export is core's CSV"
        );
    }
    let mut e = Engine::new();
    loaded(&mut e, &OOM_STORY);
    // A spec that does not parse fails the job, and the engine goes on.
    assert!(matches!(
        last(run(
            &mut e,
            Request::ExportCsv {
                job: 10,
                spec: "nonsense".into(),
                capacity_bytes: None,
            }
        )),
        Response::Failed { job: 10, .. }
    ));
}
