//! The live CUDA replay panel against recorded streams of the runner's messages (no GPU
//! needed): the curves get the points, stop works, the disabled reason is shown. The
//! replay path itself runs for real in `app/tests/live_cuda.rs` on the GPU machine.

use std::collections::BTreeMap;

use allocsim_native::replay::{Agreement, EventPair, Peaks, Sample};
use allocsim_native::{CudaReplayReport, DeviceInfo, LiveStatus, Message, Mode, Unavailable};
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};

use super::io::EngineHandle;
use super::{AllocsimApp, Startup};
use crate::engine::examples::OOM_STORY;
use crate::gui::views::live::{LivePanel, LiveRun};

const MIB: u64 = 1 << 20;

fn h100() -> DeviceInfo {
    DeviceInfo {
        ordinal: 0,
        name: "NVIDIA H100 80GB HBM3".into(),
        total_bytes: 85_045_231_616,
        free_bytes_at_start: 84_410_023_936,
    }
}

/// The app on the OOM story, its live panel open, CUDA as `availability` says.
fn harness(availability: Result<DeviceInfo, Unavailable>) -> Harness<'static, AllocsimApp> {
    let mut app = AllocsimApp::with_engine(EngineHandle::inline(), false);
    app.live = LivePanel::with_availability(availability);
    app.start(Startup::Example(&OOM_STORY));
    let mut h = Harness::builder()
        // Tall: the live section sits below the OOM panel in the side panel.
        .with_size([1400.0, 3000.0])
        .with_max_steps(400)
        .build_ui_state(|ui, app: &mut AllocsimApp| app.ui(ui), app);
    for _ in 0..200 {
        h.step();
        if !h.state().busy() {
            break;
        }
    }
    assert!(!h.state().busy(), "the app never settled");
    h.get_by_label("Live CUDA replay").click();
    h.step();
    h.step();
    h
}

fn has_text(h: &Harness<'static, AllocsimApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

/// A recorded run over the open trace: `Started`, then a sample every `every` ops with
/// the GPU's usage at whole 2 MiB pages above the simulated reserved bytes of the main
/// configuration, as the runner sends them; progress along the way. Not the final message.
fn recorded_stream(app: &AllocsimApp, every: usize) -> (Vec<Message>, Vec<Sample>) {
    let doc = app.document().expect("loaded");
    let reserved = &doc.slots[0]
        .replay
        .as_ref()
        .expect("replayed")
        .data
        .timeline
        .reserved_bytes;
    let ops_total = reserved.len();
    let mut msgs = vec![Message::Started {
        device: h100(),
        balloon_free_bytes: None,
        ops_total,
    }];
    let mut samples = Vec::new();
    for op in (0..ops_total).step_by(every) {
        let sim = reserved.get(op).expect("a sample");
        let s = Sample {
            op: op as u64,
            event_index: u64::from(doc.trace.ops.event_index(op)),
            real_used_bytes: sim.div_ceil(2 * MIB) * 2 * MIB + 2 * MIB,
            model_reserved_bytes: sim,
            sim_reserved_bytes: Some(sim),
            segment_event: true,
        };
        samples.push(s);
        msgs.push(Message::Sample(s));
        msgs.push(Message::Progress {
            ops_done: op + 1,
            ops_total,
        });
    }
    (msgs, samples)
}

fn report(samples: &[Sample], ops: usize, stopped: bool) -> CudaReplayReport {
    let peak_real = samples.iter().map(|s| s.real_used_bytes).max().unwrap_or(0);
    let peak_sim = samples
        .iter()
        .filter_map(|s| s.sim_reserved_bytes)
        .max()
        .unwrap_or(0);
    let compared = samples.len() as u64;
    CudaReplayReport {
        schema: 1,
        device: h100(),
        mode: Mode::Model,
        allocator: "pytorch".into(),
        config: String::new(),
        capacity_bytes: None,
        balloon_free_bytes: None,
        events: ops,
        segment_events: compared,
        reserved_agreement: Agreement {
            events_compared: compared,
            events_equal: compared,
            max_abs_diff_bytes: 0,
            first_difference: None,
        },
        oom: EventPair::default(),
        latency_us: BTreeMap::new(),
        verify_data: None,
        first_refusal: EventPair::default(),
        driver_refusal: None,
        prediction: None,
        peaks: Peaks {
            real_used_bytes: peak_real,
            model_reserved_bytes: peak_sim,
            simulated_reserved_bytes: peak_sim,
        },
        simulated_limit_bytes: 84_408_000_000,
        ops,
        ops_replayed: samples.last().map_or(0, |s| s.op as usize + 1),
        stopped,
        free_bytes_at_end: h100().free_bytes_at_start,
        leaked_bytes: 0,
        notes: Vec::new(),
        timeline: samples.to_vec(),
    }
}

#[test]
fn without_cuda_the_panel_is_disabled_with_the_reason() {
    let mut h = harness(Err(Unavailable {
        reason: "no driver (libcuda.so.1 not found)".into(),
    }));
    assert!(has_text(
        &h,
        "CUDA unavailable: no driver (libcuda.so.1 not found)"
    ));
    let button = h.get_by_label("Replay on the GPU");
    assert!(
        button.accesskit_node().is_disabled(),
        "nothing to start without CUDA"
    );
    button.click();
    h.step();
    h.step();
    assert!(!h.state().live.running());
    assert!(h.state().timeline.overlays.is_empty());
}

#[test]
fn a_recorded_run_draws_its_curves_and_stops_when_asked() {
    let mut h = harness(Ok(h100()));
    assert!(has_text(&h, "NVIDIA H100 80GB HBM3"));
    assert!(has_text(&h, "79.20 GiB total"));
    assert!(
        !h.get_by_label("Replay on the GPU")
            .accesskit_node()
            .is_disabled()
    );
    assert!(
        h.get_by_label("Stop").accesskit_node().is_disabled(),
        "nothing runs yet"
    );

    let (msgs, samples) = recorded_stream(h.state(), 5);
    let half = msgs.len() / 2;
    let (run, more) = LiveRun::from_messages(msgs[..half].to_vec());
    h.state_mut().live.attach(run, "pytorch".into());
    h.step();
    h.step();
    let shown: Vec<Sample> = h.state().live.state.samples.clone();
    assert_eq!(
        shown.len(),
        msgs[..half]
            .iter()
            .filter(|m| matches!(m, Message::Sample(_)))
            .count()
    );
    assert!(has_text(&h, "running"));
    // The timeline got the GPU's curve and the simulated one, point for point.
    let overlays = h.state().timeline.overlays.clone();
    assert_eq!(overlays.len(), 2);
    let real: Vec<(u32, u64)> = shown
        .iter()
        .map(|s| (s.op as u32, s.real_used_bytes))
        .collect();
    assert_eq!(overlays[0].points, real);
    assert_eq!(overlays[1].points.len(), shown.len());
    assert!(has_text(&h, "GPU used (live)"), "the legend names it");
    assert!(
        h.get_by_label("Replay on the GPU")
            .accesskit_node()
            .is_disabled(),
        "one run at a time"
    );

    // Stop: the flag reaches the run, the panel says so until the runner answers.
    h.get_by_label("Stop").click();
    h.step();
    h.step();
    assert!(h.state().live.stop_requested());
    assert!(has_text(&h, "stopping…"));
    assert!(h.get_by_label("Stop").accesskit_node().is_disabled());
    let done_at = shown.last().expect("samples").op as usize + 1;
    more.send(Message::Done(Box::new(report(&shown, samples.len(), true))))
        .expect("the panel listens");
    h.step();
    h.step();
    assert_eq!(h.state().live.state.status, LiveStatus::Stopped);
    assert!(has_text(&h, &format!("stopped at op {done_at}")));
    assert!(!h.state().live.running());
    assert!(
        !h.get_by_label("Replay on the GPU")
            .accesskit_node()
            .is_disabled(),
        "can run again"
    );
    assert_eq!(
        h.state().timeline.overlays[0].points,
        real,
        "the curves stay"
    );

    h.get_by_label("Clear").click();
    h.step();
    assert!(h.state().timeline.overlays.is_empty());
    assert!(h.state().live.state.samples.is_empty());
}

#[test]
fn a_finished_run_shows_the_agreement_and_the_peaks() {
    let mut h = harness(Ok(h100()));
    let (mut msgs, samples) = recorded_stream(h.state(), 3);
    let ops = h.state().document().expect("doc").trace.ops.len();
    let r = report(&samples, ops, false);
    let (peak_real, n) = (r.peaks.real_used_bytes, samples.len());
    msgs.push(Message::Done(Box::new(r)));
    let (run, _more) = LiveRun::from_messages(msgs);
    h.state_mut().live.attach(run, "pytorch".into());
    h.step();
    h.step();
    assert_eq!(h.state().live.state.status, LiveStatus::Finished);
    assert!(has_text(&h, "finished"));
    assert!(has_text(
        &h,
        &format!("reserved agreement: {n} of {n} segment events")
    ));
    assert!(has_text(
        &h,
        &format!("peak: GPU {}", allocsim_core::units::format_size(peak_real))
    ));
    assert_eq!(h.state().timeline.overlays[0].points.len(), n);
    // The y axis makes room for the GPU's curve.
    let top = h.state().timeline.overlays[0]
        .points
        .iter()
        .map(|p| p.1)
        .max();
    assert_eq!(top, Some(peak_real));
}

#[test]
fn the_start_button_runs_the_replay_thread() {
    // The panel believes a GPU is there; the thread asks the driver for real: here (no
    // GPU) it answers unavailable and the panel turns disabled with the reason, on the GPU
    // machine the replay runs to the end.
    let mut h = harness(Ok(h100()));
    h.get_by_label("Replay on the GPU").click();
    for _ in 0..600 {
        h.step();
        if h.state().live.state.status != LiveStatus::Starting && !h.state().live.running() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    match h.state().live.state.status.clone() {
        LiveStatus::Unavailable(reason) => {
            h.step();
            assert!(has_text(&h, &format!("CUDA unavailable: {reason}")));
            assert!(
                h.get_by_label("Replay on the GPU")
                    .accesskit_node()
                    .is_disabled()
            );
        }
        LiveStatus::Finished => {
            assert!(h.state().live.state.report.is_some());
            assert!(!h.state().timeline.overlays.is_empty());
        }
        other => panic!("the live run ended as {other:?}"),
    }
}
