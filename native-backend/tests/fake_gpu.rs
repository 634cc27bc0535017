//! The CUDA device, the replay driver and the runner on a host-memory fake GPU: runs
//! everywhere, no GPU needed (tests/cuda.rs runs the same paths on the real driver).

#![allow(clippy::many_single_char_names)] // short names (r, o, a, p, v) read best in these tests

mod common;

use std::sync::Arc;
use std::time::Duration;

use allocsim_core::device::Device;
use allocsim_core::models::{AllocatorKind, ModelSpec};
use allocsim_native::device::CudaDevice;
use allocsim_native::replay::{NoObserver, Observer, Sample};
use allocsim_native::{
    CudaReplayOptions, LiveState, LiveStatus, Message, Mode, NativeError, Runner, Unavailable,
    cuda_replay,
};
use common::{FakeGpu, MIB, growing_trace, small_training_trace};

fn opts(mode: Mode, spec: &str) -> CudaReplayOptions {
    CudaReplayOptions {
        mode,
        spec: ModelSpec::parse(spec).unwrap(),
        capacity_bytes: None,
        balloon_free_bytes: None,
        verify_data: true,
        trace_device: 0,
    }
}

fn expandable() -> ModelSpec {
    ModelSpec::with_config(AllocatorKind::Pytorch, "expandable_segments:True")
}

#[test]
fn plain_segments_are_allocated_freed_and_counted() {
    let gpu = FakeGpu::new(GIB);
    let state = Arc::clone(&gpu.state);
    let mut dev = CudaDevice::new(gpu, None);
    let a = dev.malloc(20 * MIB, 0).unwrap();
    let b = dev.malloc(3 * MIB, 0).unwrap();
    assert_ne!(a, b);
    assert_eq!(dev.held_bytes(), 24 * MIB, "3 MiB holds two 2 MiB pages");
    assert_eq!(state.lock().unwrap().used_bytes, 24 * MIB);
    dev.free(a, 20 * MIB);
    assert_eq!(dev.held_bytes(), 4 * MIB);
    assert_eq!(
        dev.latencies()
            .count(allocsim_native::latency::CallKind::Alloc),
        2
    );
    assert_eq!(
        dev.latencies()
            .count(allocsim_native::latency::CallKind::Free),
        1
    );
    drop(dev);
    assert!(
        state.lock().unwrap().is_empty(),
        "dropping the device gives everything back"
    );
}

const GIB: u64 = 1 << 30;

#[test]
fn expandable_pages_are_created_mapped_and_unmapped_one_by_one() {
    let gpu = FakeGpu::new(GIB);
    let state = Arc::clone(&gpu.state);
    let mut dev = CudaDevice::new(gpu, None);
    let base = dev.reserve(400 * MIB, 20 * MIB, 0).unwrap();
    dev.map(base, 60 * MIB, 0).unwrap();
    assert_eq!(
        state.lock().unwrap().mapped.len(),
        3,
        "one physical allocation per 20 MiB page"
    );
    assert_eq!(dev.held_bytes(), 60 * MIB);
    dev.unmap(base + 20 * MIB, 20 * MIB);
    assert_eq!(state.lock().unwrap().mapped.len(), 2);
    assert_eq!(state.lock().unwrap().used_bytes, 40 * MIB);
    // Not whole pages: a fault, never a panic.
    assert!(dev.map(base + MIB, 20 * MIB, 0).is_err());
    assert!(dev.fault().is_some());
    drop(dev);
    assert!(state.lock().unwrap().is_empty());
}

#[test]
fn a_refused_page_releases_the_pages_created_for_the_same_map() {
    let gpu = FakeGpu::new(50 * MIB);
    let state = Arc::clone(&gpu.state);
    let mut dev = CudaDevice::new(gpu, None);
    let base = dev.reserve(400 * MIB, 20 * MIB, 0).unwrap();
    assert!(
        dev.map(base, 60 * MIB, 0).is_err(),
        "the third page does not fit"
    );
    assert_eq!(dev.driver_refusals(), 1);
    assert!(dev.fault().is_none(), "a refusal is no fault");
    assert_eq!(
        state.lock().unwrap().used_bytes,
        0,
        "the two pages created were released"
    );
    dev.map(base, 40 * MIB, 0).unwrap();
    assert_eq!(dev.held_bytes(), 40 * MIB);
}

#[test]
fn the_cap_refuses_before_the_driver() {
    let mut dev = CudaDevice::new(FakeGpu::new(GIB), Some(50 * MIB));
    dev.malloc(40 * MIB, 0).unwrap();
    assert!(dev.malloc(20 * MIB, 0).is_err());
    assert_eq!((dev.cap_refusals(), dev.driver_refusals()), (1, 0));
    assert_eq!(dev.free_bytes(), 10 * MIB);
}

#[test]
fn the_balloon_leaves_the_asked_free_memory_and_goes_with_the_device() {
    let gpu = FakeGpu::new(10 * GIB + 6 * MIB);
    let state = Arc::clone(&gpu.state);
    let mut dev = CudaDevice::new(gpu, None);
    let left = dev.inflate_balloon(100 * MIB).unwrap();
    assert!((100 * MIB..102 * MIB).contains(&left), "left {left}");
    assert_eq!(dev.free_bytes(), left);
    // Like the real driver, the fake keeps one 2 MiB page of what it reports free.
    assert!(dev.malloc(98 * MIB, 0).is_ok());
    assert!(
        dev.malloc(2 * MIB, 0).is_err(),
        "the driver itself refuses now"
    );
    assert_eq!(dev.driver_refusals(), 1);
    drop(dev);
    assert!(state.lock().unwrap().is_empty());
}

#[test]
fn model_mode_agrees_at_every_segment_event_and_the_data_check_passes() {
    for spec in [ModelSpec::parse("pytorch").unwrap(), expandable()] {
        let gpu = FakeGpu::new(4 * GIB);
        let state = Arc::clone(&gpu.state);
        let trace = small_training_trace();
        let o = CudaReplayOptions {
            spec: spec.clone(),
            ..opts(Mode::Model, "pytorch")
        };
        let r = cuda_replay(gpu, &trace, &o, &mut NoObserver).unwrap();
        let a = &r.reserved_agreement;
        assert!(a.events_compared > 4, "{}: {a:?}", spec.label());
        assert_eq!(a.events_equal, a.events_compared, "{}: {a:?}", spec.label());
        // One comparison after every op that made segment events (some make several).
        assert!(r.segment_events >= a.events_compared);
        assert_eq!(r.oom.real_event_index, None);
        let v = r.verify_data.as_ref().unwrap();
        let frees = trace.devices[0]
            .ops
            .iter()
            .filter(|o| matches!(o.kind, allocsim_core::trace::OpKind::Free { .. }))
            .count() as u64;
        assert_eq!(
            v.blocks_checked, frees,
            "every block is checked at its free: {v:?}"
        );
        assert_eq!(v.mismatches, 0, "{v:?}");
        assert_eq!(r.leaked_bytes, 0);
        assert!(state.lock().unwrap().is_empty());
        // The model on the GPU and the simulation hold the same bytes all along.
        let p = r.prediction.as_ref().unwrap();
        assert_eq!(p.max_abs_error_bytes, 0, "{p:?}");
        assert_eq!(r.peaks.model_reserved_bytes, r.peaks.real_used_bytes);
        if spec.config.is_some() {
            assert!(
                r.latency_us["map"].count > 0 && r.latency_us["unmap"].count > 0,
                "{:?}",
                r.latency_us
            );
        } else {
            assert!(r.latency_us["alloc"].count > 0 && r.latency_us["free"].count > 0);
        }
        // The JSON has DESIGN.md's keys, schema first.
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.starts_with("{\"schema\":1,"), "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        for key in [
            "device",
            "mode",
            "allocator",
            "config",
            "capacity_bytes",
            "balloon_free_bytes",
            "events",
            "segment_events",
            "reserved_agreement",
            "oom",
            "latency_us",
            "verify_data",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["mode"], "model");
    }
}

#[test]
fn with_a_balloon_the_driver_refuses_where_the_simulation_does() {
    for spec in [ModelSpec::parse("pytorch").unwrap(), expandable()] {
        let trace = growing_trace(8);
        let o = CudaReplayOptions {
            balloon_free_bytes: Some(100 * MIB),
            spec: spec.clone(),
            ..opts(Mode::Model, "pytorch")
        };
        let r = cuda_replay(FakeGpu::new(8 * GIB), &trace, &o, &mut NoObserver).unwrap();
        assert!(r.balloon_free_bytes.is_some_and(|b| b >= 100 * MIB));
        // 98 MiB usable. Plain: 3 × 30 MiB segments fit, the 4th does not. Expandable:
        // 20 MiB pages, so the third block needs a fifth page (100 MiB), which does not fit.
        let expected = if spec.config.is_some() { 2 } else { 3 };
        assert_eq!(r.oom.real_event_index, Some(expected), "{}", spec.label());
        assert_eq!(
            r.oom.simulated_event_index,
            r.oom.real_event_index,
            "{}",
            spec.label()
        );
        assert_eq!(r.first_refusal.real_event_index, Some(expected));
        assert_eq!(r.first_refusal.simulated_event_index, Some(expected));
        assert_eq!(r.simulated_limit_bytes, 98 * MIB);
        assert_eq!(
            r.ops_replayed,
            expected as usize + 1,
            "the replay stops where the program would have died"
        );
        assert_eq!(r.leaked_bytes, 0);
    }
}

#[test]
fn a_driver_that_keeps_more_memory_back_is_measured_and_the_simulation_agrees() {
    let gpu = FakeGpu::new(8 * GIB);
    // A driver keeping 16 MiB where the H200's keeps 2 MiB: the rule would say 98 MiB
    // usable behind the balloon, the probe finds the 84 MiB this driver hands out.
    gpu.lock().headroom_bytes = 16 * MIB;
    let o = CudaReplayOptions {
        balloon_free_bytes: Some(100 * MIB),
        ..opts(Mode::Model, "pytorch")
    };
    let r = cuda_replay(gpu.clone(), &growing_trace(8), &o, &mut NoObserver).unwrap();
    assert_eq!(r.simulated_limit_bytes, 84 * MIB);
    // Two 30 MiB segments fit in 84 MiB, the third does not: on the GPU and in the
    // simulation alike (with the rule's 98 MiB the simulation would have fit a third).
    assert_eq!(r.oom.real_event_index, Some(2));
    assert_eq!(r.oom.simulated_event_index, Some(2));
    let rf = r.driver_refusal.unwrap();
    assert_eq!(rf.requested_bytes, 30 * MIB);
    assert_eq!(rf.free_bytes, 40 * MIB, "refused with 40 MiB reported free");
    // Both refuse at the same request, so there is no disagreement to explain.
    assert!(
        !r.notes.iter().any(|n| n.contains("still free")),
        "{:?}",
        r.notes
    );
    assert_eq!(r.leaked_bytes, 0);
    assert!(gpu.lock().is_empty(), "the probe gave everything back");
}

#[test]
fn the_probe_finds_what_the_driver_hands_out_and_gives_it_back() {
    for headroom in [0, 2 * MIB, 4 * MIB, 16 * MIB] {
        let gpu = FakeGpu::new(8 * GIB);
        gpu.lock().headroom_bytes = headroom;
        let mut dev = CudaDevice::new(gpu.clone(), None);
        let left = dev.inflate_balloon(101 * MIB).unwrap();
        let usable = dev.probe_usable_bytes().unwrap();
        assert_eq!(
            usable,
            (left - headroom) / (2 * MIB) * (2 * MIB),
            "headroom {headroom}"
        );
        // Exactly that much can be taken in 2 MiB segments, and not one more.
        let mut got = 0;
        while dev.malloc(2 * MIB, 0).is_ok() {
            got += 2 * MIB;
        }
        assert_eq!(got, usable, "headroom {headroom}");
        drop(dev);
        assert!(gpu.lock().is_empty());
    }
}

#[test]
fn raw_mode_sends_every_request_to_the_driver_and_checks_the_prediction() {
    let trace = small_training_trace();
    let requests = trace.devices[0].requests() as u64;
    let r = cuda_replay(
        FakeGpu::new(4 * GIB),
        &trace,
        &opts(Mode::Raw, "pytorch"),
        &mut NoObserver,
    )
    .unwrap();
    assert_eq!(r.latency_us["alloc"].count, requests);
    assert_eq!(r.latency_us["free"].count, requests);
    assert_eq!(r.segment_events, 2 * requests);
    // The PyTorch model caches; raw mode does not: the prediction is reported, not equal.
    let p = r.prediction.as_ref().unwrap();
    assert_eq!(p.model, "pytorch");
    assert!(p.ops_compared >= 2 * requests);
    assert_eq!(r.verify_data.as_ref().unwrap().mismatches, 0);
}

#[test]
fn raw_mode_without_the_predicting_model_says_so() {
    let trace = small_training_trace();
    let o = CudaReplayOptions {
        spec: ModelSpec::with_config(AllocatorKind::Bfc, "no_such_key:1"),
        ..opts(Mode::Raw, "pytorch")
    };
    let r = cuda_replay(FakeGpu::new(4 * GIB), &trace, &o, &mut NoObserver).unwrap();
    assert!(r.prediction.is_none());
    assert!(
        r.notes.iter().any(|n| n.starts_with("no prediction")),
        "{:?}",
        r.notes
    );
    assert_eq!(r.reserved_agreement.events_compared, 0);
}

#[test]
fn the_data_check_catches_overlapping_blocks() {
    let gpu = FakeGpu::new(4 * GIB);
    gpu.lock().overlap_bug = true;
    let r = cuda_replay(
        gpu,
        &small_training_trace(),
        &opts(Mode::Raw, "pytorch"),
        &mut NoObserver,
    )
    .unwrap();
    let v = r.verify_data.unwrap();
    assert!(v.mismatches > 0, "{v:?}");
    assert!(v.first_mismatch.unwrap().contains("overlaps"));
}

#[test]
fn a_driver_failure_is_an_error_and_everything_is_given_back() {
    let gpu = FakeGpu::new(4 * GIB);
    let state = Arc::clone(&gpu.state);
    gpu.lock().fail_in_calls = Some(12);
    let e = cuda_replay(
        gpu,
        &small_training_trace(),
        &opts(Mode::Model, "pytorch"),
        &mut NoObserver,
    )
    .unwrap_err();
    assert!(matches!(e, NativeError::Driver { .. }), "{e}");
    assert!(
        state.lock().unwrap().is_empty(),
        "{:?}",
        state.lock().unwrap()
    );
}

#[test]
fn a_balloon_larger_than_the_free_memory_is_a_bad_option() {
    let o = CudaReplayOptions {
        balloon_free_bytes: Some(2 * GIB),
        ..opts(Mode::Model, "pytorch")
    };
    let e = cuda_replay(FakeGpu::new(GIB), &growing_trace(2), &o, &mut NoObserver).unwrap_err();
    assert!(matches!(e, NativeError::Config(_)), "{e}");
}

/// Panics in the middle of a replay.
struct PanicAfter(usize);

impl Observer for PanicAfter {
    fn sample(&mut self, s: &Sample) {
        assert!(s.op < self.0 as u64, "planned panic at op {}", s.op);
    }
}

#[test]
fn no_memory_stays_held_after_a_panic() {
    let gpu = FakeGpu::new(8 * GIB);
    let state = Arc::clone(&gpu.state);
    let trace = small_training_trace();
    let o = CudaReplayOptions {
        balloon_free_bytes: Some(GIB),
        ..opts(Mode::Model, "pytorch")
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cuda_replay(gpu, &trace, &o, &mut PanicAfter(6))
    }));
    assert!(r.is_err(), "the observer panicked");
    let s = state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(s.is_empty(), "{s:?}");
}

fn collect(runner: Runner) -> Vec<Message> {
    let mut msgs = Vec::new();
    while let Some(m) = runner.recv_timeout(Duration::from_secs(30)) {
        let last = m.is_final();
        msgs.push(m);
        if last {
            break;
        }
    }
    msgs.extend(runner.wait());
    msgs
}

#[test]
fn the_runner_streams_started_samples_and_done_in_order() {
    let trace = Arc::new(small_training_trace());
    let runner = Runner::spawn(
        || Ok(FakeGpu::new(4 * GIB)),
        trace,
        opts(Mode::Model, "pytorch"),
    )
    .unwrap();
    let msgs = collect(runner);
    assert!(
        matches!(msgs.first(), Some(Message::Started { .. })),
        "{msgs:?}"
    );
    assert!(
        matches!(msgs.last(), Some(Message::Done(r)) if !r.stopped),
        "{:?}",
        msgs.last()
    );
    assert_eq!(msgs.iter().filter(|m| m.is_final()).count(), 1);
    let ops: Vec<u64> = msgs
        .iter()
        .filter_map(|m| {
            if let Message::Sample(s) = m {
                Some(s.op)
            } else {
                None
            }
        })
        .collect();
    assert!(
        !ops.is_empty() && ops.windows(2).all(|w| w[0] < w[1]),
        "{ops:?}"
    );
    let mut live = LiveState::default();
    for m in msgs {
        live.apply(m);
    }
    assert_eq!(live.status, LiveStatus::Finished);
    assert!((live.fraction_done() - 1.0).abs() < f32::EPSILON);
    assert_eq!(
        live.device.as_ref().map(|d| d.name.as_str()),
        Some("Fake GPU")
    );
    assert!(live.samples.iter().all(|s| s.sim_reserved_bytes.is_some()));
}

#[test]
fn the_runner_stops_when_asked() {
    let mut t = common::TraceBuilder::default();
    for _ in 0..20_000 {
        let a = t.alloc(4096);
        t.free(a);
    }
    let runner = Runner::spawn(
        || Ok(FakeGpu::new(GIB)),
        Arc::new(t.build()),
        opts(Mode::Model, "pytorch"),
    )
    .unwrap();
    runner.stop();
    let msgs = collect(runner);
    let Some(Message::Done(r)) = msgs.last() else {
        panic!("{:?}", msgs.last())
    };
    assert!(r.stopped);
    assert!(r.ops_replayed < r.ops, "{} of {}", r.ops_replayed, r.ops);
    let mut live = LiveState::default();
    for m in msgs {
        live.apply(m);
    }
    assert_eq!(live.status, LiveStatus::Stopped);
}

#[test]
fn the_runner_reports_unavailable_and_panics() {
    let trace = Arc::new(small_training_trace());
    let none = Runner::spawn(
        || {
            Err::<FakeGpu, _>(Unavailable {
                reason: "no CUDA-capable GPU is present".into(),
            })
        },
        Arc::clone(&trace),
        opts(Mode::Model, "pytorch"),
    )
    .unwrap();
    assert_eq!(
        collect(none),
        vec![Message::Unavailable {
            reason: "no CUDA-capable GPU is present".into()
        }]
    );

    let gpu = FakeGpu::new(4 * GIB);
    let state = Arc::clone(&gpu.state);
    gpu.lock().panic_in_calls = Some(20);
    let msgs =
        collect(Runner::spawn(move || Ok(gpu), trace, opts(Mode::Model, "pytorch")).unwrap());
    assert!(
        matches!(msgs.last(), Some(Message::Failed { message }) if message.contains("panicked")),
        "{:?}",
        msgs.last()
    );
    assert!(
        state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    );
}

#[test]
fn a_recorded_message_stream_round_trips_through_json() {
    let runner = Runner::spawn(
        || Ok(FakeGpu::new(4 * GIB)),
        Arc::new(small_training_trace()),
        opts(Mode::Model, "pytorch"),
    )
    .unwrap();
    let msgs = collect(runner);
    let lines: Vec<String> = msgs
        .iter()
        .map(|m| serde_json::to_string(m).unwrap())
        .collect();
    let back: Vec<Message> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The report's timeline is not serialised; everything else comes back.
    let strip = |m: &Message| match m {
        Message::Done(r) => Message::Done(Box::new(allocsim_native::CudaReplayReport {
            timeline: Vec::new(),
            ..(**r).clone()
        })),
        other => other.clone(),
    };
    assert_eq!(msgs.iter().map(strip).collect::<Vec<_>>(), back);
}

#[test]
fn without_cuda_the_probe_says_why_instead_of_panicking() {
    // With the `cuda` feature on a machine without a GPU this is the driver's answer; on
    // the GPU machine it opens the device. Either way: no panic, and a reason.
    match allocsim_native::probe(0) {
        Ok(info) => assert!(info.total_bytes > 0),
        Err(u) => assert!(!u.reason.is_empty()),
    }
    match allocsim_native::probe(999) {
        Ok(_) => panic!("there is no device 999"),
        Err(u) => assert!(!u.reason.is_empty()),
    }
}

#[test]
fn the_cost_table_is_measured_for_every_size_that_fits_and_everything_is_given_back() {
    let mut gpu = FakeGpu::new(1 << 30);
    let m = allocsim_native::cost::measure(
        &mut gpu,
        &[2 * MIB, 20 * MIB, 4 << 30],
        &[2 * MIB, 20 * MIB],
        5,
    )
    .unwrap();
    // 4 GiB does not fit in this 1 GiB GPU: left out, not an error.
    let sizes: Vec<u64> = m.malloc_us.iter().map(|s| s.bytes).collect();
    assert_eq!(sizes, [2 * MIB, 20 * MIB]);
    assert_eq!(m.free_us.len(), 2);
    let pages: Vec<u64> = m.map_page_us.iter().map(|s| s.bytes).collect();
    assert_eq!(pages, [2 * MIB, 20 * MIB]);
    for s in m
        .malloc_us
        .iter()
        .chain(&m.map_page_us)
        .chain(&m.unmap_page_us)
    {
        assert!(s.min_us <= s.us && s.us <= s.max_us, "{s:?}");
    }
    assert_eq!(m.repetitions, 5);
    assert!(gpu.lock().is_empty(), "everything measured was given back");
    assert!(m.as_rust().contains(&format!("({}, ", 20 * MIB)));
}
