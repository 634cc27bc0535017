//! The desktop app's live CUDA replay, headless: the very function the panel's thread
//! runs ([`run_live`]), on real GPU memory. Without a GPU (CI, the development machine)
//! each test prints `skipped: <reason>` and returns; on the GPU machine they run for real:
//! `cargo test -p allocsim-app --release --test live_cuda -- --nocapture`.

use std::sync::atomic::{AtomicBool, Ordering};

use allocsim_app::engine::examples::OOM_STORY;
use allocsim_app::gui::views::live::{LiveRequest, LiveSource, run_live};
use allocsim_native::{LiveState, LiveStatus, Message};

fn oom_story(balloon: bool) -> LiveRequest {
    LiveRequest {
        source: LiveSource::Snapshot {
            name: OOM_STORY.file.into(),
            bytes: OOM_STORY.bytes.into(),
        },
        trace_device: 0,
        spec: "pytorch".into(),
        capacity_bytes: OOM_STORY.cap_bytes(),
        balloon,
        ordinal: 0,
    }
}

/// Runs `req` to its end like the panel does; None (after `skipped: …`) without CUDA.
fn run(req: &LiveRequest, stop_after_samples: Option<usize>) -> Option<(Vec<Message>, LiveState)> {
    let stop = AtomicBool::new(false);
    let mut msgs = Vec::new();
    let mut samples = 0;
    run_live(req, &stop, &mut |m| {
        if matches!(m, Message::Sample(_)) {
            samples += 1;
            if stop_after_samples.is_some_and(|n| samples >= n) {
                stop.store(true, Ordering::Relaxed);
            }
        }
        msgs.push(m);
    });
    if let Some(Message::Unavailable { reason }) = msgs.first() {
        println!("skipped: {reason}");
        return None;
    }
    let mut state = LiveState::default();
    for m in &msgs {
        state.apply(m.clone());
    }
    Some((msgs, state))
}

#[test]
fn live_replay_of_the_oom_story_streams_the_gpu_curve_and_finishes() {
    let Some((msgs, state)) = run(&oom_story(false), None) else {
        return;
    };
    assert!(
        matches!(msgs.first(), Some(Message::Started { .. })),
        "{:?}",
        msgs.first()
    );
    assert!(msgs.last().is_some_and(Message::is_final));
    assert_eq!(state.status, LiveStatus::Finished, "{:?}", state.status);
    let device = state.device.as_ref().expect("the device");
    assert!(!device.name.is_empty() && device.total_bytes > 0);
    assert!(!state.samples.is_empty(), "the curve has points");
    assert!(
        state.samples.windows(2).all(|w| w[0].op <= w[1].op),
        "samples in op order"
    );
    assert!(
        state.samples.iter().any(|s| s.real_used_bytes > 0),
        "the GPU's usage moved"
    );
    let r = state.report.as_ref().expect("the report");
    assert!(!r.stopped);
    assert_eq!(r.ops_replayed, r.ops);
    let a = &r.reserved_agreement;
    assert!(a.events_compared > 0);
    assert_eq!(a.events_equal, a.events_compared, "{a:?}");
    assert_eq!(
        r.oom.real_event_index, r.oom.simulated_event_index,
        "the GPU and the simulation fail at the same request under the cap"
    );
    assert_eq!(r.leaked_bytes, 0, "everything given back");
    println!(
        "{}: {} samples, agreement {}/{}, OOM real {:?} sim {:?}, peak GPU {} sim {} bytes",
        device.name,
        state.samples.len(),
        a.events_equal,
        a.events_compared,
        r.oom.real_event_index,
        r.oom.simulated_event_index,
        r.peaks.real_used_bytes,
        r.peaks.simulated_reserved_bytes
    );
}

#[test]
fn live_replay_with_a_balloon_is_refused_by_the_driver() {
    let Some((_, state)) = run(&oom_story(true), None) else {
        return;
    };
    assert_eq!(state.status, LiveStatus::Finished, "{:?}", state.status);
    let r = state.report.as_ref().expect("the report");
    assert!(r.balloon_free_bytes.is_some(), "the balloon was inflated");
    assert!(
        r.first_refusal.real_event_index.is_some(),
        "the driver refused: {r:?}"
    );
    assert_eq!(
        r.first_refusal.real_event_index, r.first_refusal.simulated_event_index,
        "the driver refuses at the request where the simulation does"
    );
    assert_eq!(r.leaked_bytes, 0, "the balloon and the replay given back");
    println!(
        "balloon leaving {:?} bytes: first refusal real {:?} sim {:?}; OOM real {:?} sim {:?}",
        r.balloon_free_bytes,
        r.first_refusal.real_event_index,
        r.first_refusal.simulated_event_index,
        r.oom.real_event_index,
        r.oom.simulated_event_index
    );
}

#[test]
fn stopping_a_live_replay_gives_everything_back() {
    let req = LiveRequest {
        source: LiveSource::Workload("kvcache:tokens=500".into()),
        trace_device: 0,
        spec: "pytorch".into(),
        capacity_bytes: None,
        balloon: false,
        ordinal: 0,
    };
    let Some((msgs, state)) = run(&req, Some(5)) else {
        return;
    };
    assert!(
        matches!(msgs.last(), Some(Message::Done(_))),
        "{:?}",
        msgs.last()
    );
    assert_eq!(state.status, LiveStatus::Stopped, "{:?}", state.status);
    let r = state.report.as_ref().expect("the report");
    assert!(r.stopped);
    assert!(r.ops_replayed < r.ops, "{} of {}", r.ops_replayed, r.ops);
    assert_eq!(r.leaked_bytes, 0, "a stopped replay gives everything back");
    println!("stopped after {} of {} ops", r.ops_replayed, r.ops);
}

#[test]
fn the_balloon_replaces_the_cap() {
    let opts = oom_story(true).options().expect("options");
    assert_eq!(opts.capacity_bytes, None, "the driver refuses, not a cap");
    assert_eq!(opts.balloon_free_bytes, OOM_STORY.cap_bytes());
    let opts = oom_story(false).options().expect("options");
    assert_eq!(opts.capacity_bytes, OOM_STORY.cap_bytes());
    assert_eq!(opts.balloon_free_bytes, None);
    let mut no_cap = oom_story(true);
    no_cap.capacity_bytes = None;
    assert!(no_cap.options().is_err(), "a balloon needs a cap");
}

#[test]
fn a_bad_configuration_fails_with_a_message() {
    let mut req = oom_story(false);
    req.spec = "no-such-allocator".into();
    let Some((msgs, state)) = run(&req, None) else {
        return;
    };
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        matches!(&state.status, LiveStatus::Failed(m) if m.contains("no-such-allocator")),
        "{:?}",
        state.status
    );
}
