//! The live CUDA replay (desktop builds with the `cuda` feature only; the web build never
//! compiles this module): the open trace replayed on a real GPU on a background thread,
//! the GPU's real usage streamed onto the timeline next to the simulated reserved bytes.
//!
//! The work is one blocking function, [`run_live`]: it rebuilds the trace from where it
//! came from, runs native-backend's [`Runner`] and relays its [`Message`]s. The panel
//! calls it on its thread ([`LiveRun::start`]); a headless test calls it directly on the
//! GPU machine (`app/tests/live_cuda.rs`). The panel only folds messages into a
//! [`LiveState`], so its UI is tested against a recorded stream
//! ([`LiveRun::from_messages`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use allocsim_core::models::ModelSpec;
use allocsim_core::session;
use allocsim_core::trace::Trace;
use allocsim_core::units::format_size;
use allocsim_core::workloads;
use allocsim_native::{
    CudaReplayOptions, DeviceInfo, LiveState, LiveStatus, Message, Mode, Unavailable,
};
use egui::{RichText, Ui};

use crate::gui::theme;
use crate::gui::views::timeline::Overlay;

/// Where the open trace came from: the live run rebuilds it on its own thread (the
/// engine's copy lives on the engine's thread).
#[derive(Debug, Clone)]
pub enum LiveSource {
    /// A snapshot file's bytes.
    Snapshot { name: String, bytes: Arc<[u8]> },
    /// A snapshot file, read again in pieces when a live run starts.
    File {
        name: String,
        path: std::path::PathBuf,
    },
    /// A synthetic workload (core's SPEC syntax).
    Workload(String),
}

/// What one live run replays, and how.
#[derive(Debug, Clone)]
pub struct LiveRequest {
    pub source: LiveSource,
    /// Which `device_traces[D]` of the trace.
    pub trace_device: usize,
    /// The model, `NAME` or `NAME@CONFIG` (the main configuration).
    pub spec: String,
    /// The memory cap of the configuration.
    pub capacity_bytes: Option<u64>,
    /// Fill the GPU so that only the cap stays free: the driver itself refuses.
    pub balloon: bool,
    /// The CUDA device ordinal.
    pub ordinal: u32,
}

impl LiveRequest {
    /// The replay options of this request.
    pub fn options(&self) -> Result<CudaReplayOptions, String> {
        let spec = ModelSpec::parse(&self.spec).map_err(|e| format!("{}: {e}", self.spec))?;
        // With the balloon the driver itself refuses at the cap: no cap on top of it (as
        // `cuda-replay --balloon`).
        let (capacity_bytes, balloon_free_bytes) = match (self.balloon, self.capacity_bytes) {
            (true, Some(c)) => (None, Some(c)),
            (true, None) => return Err("the balloon needs a memory cap".into()),
            (false, c) => (c, None),
        };
        Ok(CudaReplayOptions {
            mode: Mode::Model,
            spec,
            capacity_bytes,
            balloon_free_bytes,
            verify_data: false,
            trace_device: self.trace_device,
        })
    }
}

/// Rebuilds the trace the app shows from its source.
pub fn build_trace(source: &LiveSource) -> Result<Trace, String> {
    match source {
        LiveSource::Snapshot { name, bytes } => session::load(bytes, None)
            .map(|v| v.trace)
            .map_err(|e| format!("{name}: {e}")),
        LiveSource::File { name, path } => {
            let snap =
                crate::engine::open::decode_file(path, &mut |_| true).map_err(|e| match e {
                    crate::engine::open::OpenError::Failed(m) => m,
                    crate::engine::open::OpenError::Cancelled => format!("{name}: cancelled"),
                })?;
            allocsim_core::build::build(snap, None)
                .map(|v| v.trace)
                .map_err(|e| format!("{name}: {e}"))
        }
        LiveSource::Workload(spec) => workloads::generate(spec).map_err(|e| e.to_string()),
    }
}

/// The live replay, blocking: builds the trace, runs it on CUDA device `req.ordinal` on
/// native-backend's runner thread and hands every message to `send`, the last one final
/// (`Done`, `Unavailable` or `Failed`). Setting `stop` stops the replay (a `Done` with
/// `stopped` follows). What the panel's thread runs; the GPU machine's headless test too.
pub fn run_live(req: &LiveRequest, stop: &AtomicBool, send: &mut dyn FnMut(Message)) {
    let opts = match req.options() {
        Ok(o) => o,
        Err(message) => return send(Message::Failed { message }),
    };
    // Ask for the device before decoding: without CUDA there is no point.
    if let Err(Unavailable { reason }) = allocsim_native::probe(req.ordinal) {
        return send(Message::Unavailable { reason });
    }
    let trace = match build_trace(&req.source) {
        Ok(t) => Arc::new(t),
        Err(message) => return send(Message::Failed { message }),
    };
    if stop.load(Ordering::Relaxed) {
        return send(Message::Failed {
            message: "stopped before the replay started".into(),
        });
    }
    let runner = match allocsim_native::spawn_live(req.ordinal, trace, opts) {
        Ok(r) => r,
        Err(e) => {
            return send(Message::Failed {
                message: format!("cannot start the replay thread: {e}"),
            });
        }
    };
    let mut stopping = false;
    loop {
        if !stopping && stop.load(Ordering::Relaxed) {
            runner.stop();
            stopping = true;
        }
        match runner.recv_timeout(Duration::from_millis(50)) {
            Some(m) => {
                let last = m.is_final();
                send(m);
                if last {
                    return;
                }
            }
            None if runner.is_finished() => {
                // The thread is gone: what it sent last, and a result in any case.
                let mut ended = false;
                for m in runner.drain() {
                    ended |= m.is_final();
                    send(m);
                }
                if !ended {
                    send(Message::Failed {
                        message: "the replay thread ended without a result".into(),
                    });
                }
                return;
            }
            None => {}
        }
    }
}

/// A live run seen from the UI thread: its messages, and the stop flag.
#[derive(Debug)]
pub struct LiveRun {
    rx: Receiver<Message>,
    stop: Arc<AtomicBool>,
}

impl LiveRun {
    /// Starts [`run_live`] on a new thread; `ctx` is repainted at every message.
    pub fn start(req: LiveRequest, ctx: &egui::Context) -> std::io::Result<LiveRun> {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let ctx = ctx.clone();
        std::thread::Builder::new()
            .name("allocsim-live".into())
            .spawn(move || {
                run_live(&req, &flag, &mut |m| {
                    let _ = tx.send(m);
                    ctx.request_repaint();
                });
            })?;
        Ok(LiveRun { rx, stop })
    }

    /// A run that replays recorded messages (tests): the messages already sent, and a
    /// sender for more.
    #[must_use]
    pub fn from_messages(messages: Vec<Message>) -> (LiveRun, Sender<Message>) {
        let (tx, rx) = mpsc::channel();
        for m in messages {
            let _ = tx.send(m);
        }
        let run = LiveRun {
            rx,
            stop: Arc::new(AtomicBool::new(false)),
        };
        (run, tx)
    }

    /// Asks the run to stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether a stop was asked for.
    #[must_use]
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The messages that arrived since last time, without waiting.
    #[must_use]
    pub fn drain(&self) -> Vec<Message> {
        self.rx.try_iter().collect()
    }
}

impl Drop for LiveRun {
    fn drop(&mut self) {
        // The thread frees the GPU memory as it stops; nobody needs to wait for it here.
        self.stop();
    }
}

/// Whether this machine can run a live replay.
#[derive(Debug, Default)]
pub enum Availability {
    /// Not asked yet (the panel asks when it is first shown).
    #[default]
    Unknown,
    /// Being asked on a background thread (opening a CUDA context takes a moment).
    Probing(Receiver<Result<DeviceInfo, Unavailable>>),
    Ready(DeviceInfo),
    /// No CUDA here: why.
    Unavailable(String),
}

/// The live replay panel's state.
#[derive(Debug, Default)]
pub struct LivePanel {
    pub availability: Availability,
    /// Where the open trace came from (set once it has loaded).
    pub source: Option<LiveSource>,
    /// Where the trace being opened comes from.
    pending_source: Option<LiveSource>,
    /// Fill the GPU so that only the cap stays free.
    pub balloon: bool,
    /// The current or last run, folded from its messages.
    pub state: LiveState,
    /// `NAME@CONFIG` and cap of the current or last run.
    pub run_label: String,
    run: Option<LiveRun>,
    /// Samples already turned into the timeline's curves.
    drawn_samples: usize,
}

impl LivePanel {
    /// A panel whose availability is already known (tests, a machine probed elsewhere).
    #[must_use]
    pub fn with_availability(availability: Result<DeviceInfo, Unavailable>) -> LivePanel {
        LivePanel {
            availability: match availability {
                Ok(d) => Availability::Ready(d),
                Err(u) => Availability::Unavailable(u.reason),
            },
            ..LivePanel::default()
        }
    }

    /// Starts asking whether CUDA is here, once.
    fn probe(&mut self, ctx: &egui::Context) {
        if matches!(self.availability, Availability::Unknown) {
            let (tx, rx) = mpsc::channel();
            let ctx = ctx.clone();
            let started = std::thread::Builder::new()
                .name("allocsim-cuda-probe".into())
                .spawn(move || {
                    let _ = tx.send(allocsim_native::probe(0));
                    ctx.request_repaint();
                });
            self.availability = match started {
                Ok(_) => Availability::Probing(rx),
                Err(e) => Availability::Unavailable(format!("cannot start a thread: {e}")),
            };
        }
        if let Availability::Probing(rx) = &self.availability {
            match rx.try_recv() {
                Ok(Ok(d)) => self.availability = Availability::Ready(d),
                Ok(Err(u)) => self.availability = Availability::Unavailable(u.reason),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.availability =
                        Availability::Unavailable("the CUDA probe ended without an answer".into());
                }
            }
        }
    }

    /// A trace is being opened from `source`.
    pub fn opening(&mut self, source: LiveSource) {
        self.pending_source = Some(source);
    }

    /// The trace being opened (or another device of the open one) is shown: a run of
    /// the previous one stops and its curves go.
    pub fn loaded(&mut self) {
        if let Some(s) = self.pending_source.take() {
            self.source = Some(s);
        }
        self.clear();
    }

    /// Stops the run, if any, and forgets it.
    pub fn clear(&mut self) {
        self.stop();
        self.run = None;
        self.state = LiveState::default();
        self.run_label.clear();
        self.drawn_samples = 0;
    }

    /// Follows a run (the panel's own, or a recorded one in tests).
    pub fn attach(&mut self, run: LiveRun, label: String) {
        self.state = LiveState::default();
        self.drawn_samples = 0;
        self.run_label = label;
        self.run = Some(run);
    }

    /// Whether a run is going on.
    #[must_use]
    pub fn running(&self) -> bool {
        self.run.is_some() && !self.state.is_over()
    }

    /// Asks the run to stop.
    pub fn stop(&mut self) {
        if let Some(r) = &self.run {
            r.stop();
        }
    }

    /// Whether the current run was asked to stop.
    #[must_use]
    pub fn stop_requested(&self) -> bool {
        self.run.as_ref().is_some_and(LiveRun::stop_requested)
    }

    /// Takes in the messages that arrived; returns whether the curves changed.
    pub fn pump(&mut self) -> bool {
        let Some(run) = &self.run else { return false };
        for m in run.drain() {
            if let Message::Unavailable { reason } = &m {
                self.availability = Availability::Unavailable(reason.clone());
            }
            self.state.apply(m);
        }
        if self.state.is_over() {
            // Keep the state, let the thread go.
            self.run = None;
        }
        let changed = self.state.samples.len() != self.drawn_samples;
        self.drawn_samples = self.state.samples.len();
        changed
    }

    /// The run's curves for the timeline: the GPU's real usage and the simulation beside it.
    #[must_use]
    pub fn overlays(&self) -> Vec<Overlay> {
        if self.state.samples.is_empty() {
            return Vec::new();
        }
        let real = self
            .state
            .samples
            .iter()
            .map(|s| (s.op as u32, s.real_used_bytes))
            .collect();
        let sim = self
            .state
            .samples
            .iter()
            .filter_map(|s| Some((s.op as u32, s.sim_reserved_bytes?)))
            .collect();
        vec![
            Overlay {
                label: "GPU used (live)".into(),
                color: theme::LIVE_REAL,
                dashed: false,
                points: real,
            },
            Overlay {
                label: "simulated (live)".into(),
                color: theme::LIVE_SIM,
                dashed: true,
                points: sim,
            },
        ]
    }
}

/// What the live panel asks the app to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveAction {
    Start,
    Stop,
    Clear,
}

/// The side panel's section: the panel, and what its buttons do to the app.
pub(crate) fn live_section_ui(ui: &mut Ui, app: &mut crate::gui::AllocsimApp) {
    let open = egui::CollapsingHeader::new("Live CUDA replay")
        .id_salt("live_cuda")
        .default_open(false)
        .show(ui, |ui| {
            let spec = app.config.main_spec();
            live_panel_ui(ui, &mut app.live, &spec, app.config.capacity_bytes())
        });
    match open.body_returned.flatten() {
        Some(LiveAction::Start) => {
            let Some(source) = app.live.source.clone() else {
                return;
            };
            let trace_device = app.doc.as_ref().map_or(0, |d| d.trace.device as usize);
            let req = LiveRequest {
                source,
                trace_device,
                spec: app.config.main_spec(),
                capacity_bytes: app.config.capacity_bytes(),
                balloon: app.live.balloon && app.config.capacity_bytes().is_some(),
                ordinal: 0,
            };
            let label = format!(
                "{}{}{}",
                req.spec,
                req.capacity_bytes
                    .map(|c| format!(" · cap {}", format_size(c)))
                    .unwrap_or_default(),
                if req.balloon { " · balloon" } else { "" }
            );
            match LiveRun::start(req, ui.ctx()) {
                Ok(run) => app.live.attach(run, label),
                Err(e) => app
                    .errors
                    .push(format!("cannot start the live replay: {e}")),
            }
            app.timeline.overlays.clear();
        }
        Some(LiveAction::Stop) => app.live.stop(),
        Some(LiveAction::Clear) => {
            app.live.clear();
            app.timeline.overlays.clear();
        }
        None => {}
    }
}

/// The panel: availability, the device, start/stop, progress and the run's result.
pub fn live_panel_ui(
    ui: &mut Ui,
    p: &mut LivePanel,
    spec: &str,
    cap: Option<u64>,
) -> Option<LiveAction> {
    p.probe(ui.ctx());
    let mut action = None;
    let device = match &p.availability {
        Availability::Unknown | Availability::Probing(_) => {
            ui.horizontal(|ui| {
                crate::gui::theme::busy(ui);
                ui.weak("looking for a CUDA device");
            });
            None
        }
        Availability::Unavailable(reason) => {
            ui.colored_label(theme::BAD_TEXT, format!("CUDA unavailable: {reason}"));
            None
        }
        Availability::Ready(d) => Some(d.clone()),
    };
    let shown = p.state.device.clone().or(device.clone());
    if let Some(d) = &shown {
        ui.label(format!(
            "GPU {}: {} · {} total · {} free",
            d.ordinal,
            d.name,
            format_size(d.total_bytes),
            format_size(d.free_bytes_at_start)
        ));
    }
    let available = device.is_some();
    let has_trace = p.source.is_some();
    let running = p.running();
    ui.add_enabled_ui(available && !running, |ui| {
        ui.add_enabled(
            cap.is_some(),
            egui::Checkbox::new(&mut p.balloon, "balloon: leave only the cap free"),
        )
        .on_hover_text("Fill the GPU first so that the driver itself refuses at the cap")
        .on_disabled_hover_text("Set a memory cap first");
    });
    ui.horizontal(|ui| {
        let why = if !available {
            "CUDA is unavailable here"
        } else if !has_trace {
            "Open a trace first"
        } else {
            ""
        };
        let start = ui
            .add_enabled(
                available && has_trace && !running,
                egui::Button::new("Replay on the GPU"),
            )
            .on_hover_text(format!(
                "Replay {spec}{} on real memory, next to the simulation",
                cap.map(|c| format!(" under {}", format_size(c)))
                    .unwrap_or_default()
            ));
        if !why.is_empty() {
            start.on_disabled_hover_text(why);
        } else if start.clicked() {
            action = Some(LiveAction::Start);
        }
        if ui
            .add_enabled(running && !p.stop_requested(), egui::Button::new("Stop"))
            .clicked()
        {
            action = Some(LiveAction::Stop);
        }
        if !running && !p.state.samples.is_empty() && ui.button("Clear").clicked() {
            action = Some(LiveAction::Clear);
        }
    });
    if p.run.is_none() && p.state == LiveState::default() {
        return action;
    }
    ui.label(RichText::new(&p.run_label).monospace());
    let status = match &p.state.status {
        LiveStatus::Starting | LiveStatus::Running if p.stop_requested() => "stopping…".to_string(),
        LiveStatus::Starting => "opening the GPU and building the trace…".to_string(),
        LiveStatus::Running => "running".to_string(),
        LiveStatus::Finished => "finished".to_string(),
        LiveStatus::Stopped => format!("stopped at op {}", p.state.ops_done),
        LiveStatus::Unavailable(r) => format!("CUDA unavailable: {r}"),
        LiveStatus::Failed(m) => format!("failed: {m}"),
    };
    ui.add(
        egui::ProgressBar::new(p.state.fraction_done())
            .text(format!(
                "{status} · op {} of {}",
                p.state.ops_done, p.state.ops_total
            ))
            .animate(running),
    );
    if let Some(s) = p.state.samples.last() {
        let free = shown
            .as_ref()
            .map(|d| d.free_bytes_at_start.saturating_sub(s.real_used_bytes));
        ui.label(format!(
            "GPU used {} · simulated {}{}",
            format_size(s.real_used_bytes),
            s.sim_reserved_bytes.map_or_else(|| "–".into(), format_size),
            free.map(|f| format!(" · free {}", format_size(f)))
                .unwrap_or_default()
        ));
    }
    if let Some(r) = &p.state.report {
        let a = &r.reserved_agreement;
        let ok = a.events_equal == a.events_compared;
        ui.colored_label(
            if ok { theme::OK_TEXT } else { theme::BAD_TEXT },
            format!(
                "reserved agreement: {} of {} segment events",
                a.events_equal, a.events_compared
            ),
        );
        ui.label(format!(
            "peak: GPU {} · simulated {}",
            format_size(r.peaks.real_used_bytes),
            format_size(r.peaks.simulated_reserved_bytes)
        ));
        let ev = |e: Option<u64>| e.map_or_else(|| "none".to_string(), |e| format!("event {e}"));
        if r.oom.real_event_index.is_some() || r.oom.simulated_event_index.is_some() {
            ui.label(format!(
                "OOM: GPU {} · simulated {}",
                ev(r.oom.real_event_index),
                ev(r.oom.simulated_event_index)
            ));
        }
        if r.leaked_bytes != 0 {
            ui.colored_label(
                theme::BAD_TEXT,
                format!("{} bytes not given back", r.leaked_bytes),
            );
        }
    }
    action
}
