//! The allocsim app (eframe), one for the desktop and the browser: it opens on a built-in
//! real snapshot, replays it under the configurations the user compares, and shows the
//! timeline, the memory map at the cursor, what was live at the peak and why an OOM
//! happened. Slow work runs in the [`engine`] off the UI thread; the views draw plain data
//! ([`state`]) with egui and, for the big ones, our own wgpu pipeline ([`render`]).

pub mod chunked;
pub mod envelope;

mod commands;
mod frame;
pub mod io;
mod messages;
pub mod render;
#[cfg(target_arch = "wasm32")]
mod render_glow;
pub mod state;
pub mod theme;
pub mod views;
pub mod workers;

use crate::engine::examples::Example;
use crate::engine::wire::Request;
use crate::gui::render::QuadSet;
use crate::gui::state::Document;
use allocsim_core::capacity::CapacityArg;

pub use frame::Tab;
pub use views::config::ConfigState;
pub use views::oom::would_fit::{Runtimes, WhatIf};
pub use views::oom::{Explained, oom_at};
pub use views::search::{SearchState, parse_address};

/// Time a frame spends building band quads (see [`Document::build_bands`]): a quarter of
/// the time between frames, within these bounds, so that the stacked view of millions of
/// pieces fills in over frames instead of freezing one (a few ms at 60 frames a second;
/// more where frames are slow to draw anyway, as on a software rasterizer, so that it does
/// not take hundreds of them).
pub(crate) const BAND_BUDGET: (f32, f32) = (0.004, 0.05);

/// What the app shows first.
#[derive(Debug, Clone)]
pub enum Startup {
    /// A built-in example.
    Example(&'static Example),
    /// A file from disk (desktop).
    File(std::path::PathBuf),
    /// Bytes already in memory.
    Bytes { name: String, bytes: Vec<u8> },
    /// Several files from disk (desktop): two open the Diff view, more the Ranks view.
    Files(Vec<std::path::PathBuf>),
    /// Nothing (tests).
    Empty,
}

/// Timing of the first full frame after a load (shown in the status bar, logged for the
/// browser benchmark).
#[derive(Debug, Clone, Default)]
pub(crate) struct LoadTiming {
    started_ms: f64,
    name: String,
    done: bool,
    /// The first frame with the file's recorded timeline and end state was marked.
    recorded_done: bool,
    /// The first full frame (the main configuration's timeline and layout) was marked.
    main_done: bool,
}

impl LoadTiming {
    /// The milliseconds since the open the first time the flag `which` picks is raised
    /// (raising it), `None` after.
    fn first(&mut self, which: fn(&mut LoadTiming) -> &mut bool) -> Option<f64> {
        let started = self.started_ms;
        let done = which(self);
        (!std::mem::replace(done, true)).then(|| crate::gui::io::now_ms() - started)
    }
}

/// The call sites at a replay's peak (keyed by the replay's address): (stack, bytes, count).
type PeakSites = (usize, Vec<(u32, u64, u32)>);

/// What a snapshot is opened from.
#[derive(Debug)]
pub(crate) enum OpenSource {
    /// Its bytes (the built-in examples, a fetch, the browser, tests).
    Bytes(Vec<u8>),
    /// A file the engine reads in pieces (a path natively, a `File` in the browser).
    File(crate::gui::io::FileRef),
}

/// What an open sets once its trace has arrived (a file that fails to open changes
/// nothing: the configuration stays in step with the trace on screen).
#[derive(Debug)]
pub(crate) struct Opening {
    capacity: CapacityArg,
    program_cap_bytes: Option<u64>,
    compare: Vec<String>,
}

impl Opening {
    pub(crate) fn new(
        capacity: CapacityArg,
        program_cap_bytes: Option<u64>,
        compare: &[&str],
    ) -> Opening {
        Opening {
            capacity,
            program_cap_bytes,
            compare: if compare.is_empty() {
                vec!["pytorch@expandable_segments:True".into()]
            } else {
                compare.iter().map(|s| (*s).to_string()).collect()
            },
        }
    }
}

/// The path field File > Open offers where no file dialog opens.
#[derive(Debug, Clone, Default)]
pub struct PathPrompt {
    /// Why the file dialog could not open.
    pub reason: String,
    /// The path typed.
    pub text: String,
}

/// The app.
pub struct AllocsimApp {
    /// The Diff and Ranks views' snapshots and answers.
    pub multi: crate::gui::views::multi::MultiState,
    engine: crate::gui::io::EngineHandle,
    inbox: crate::gui::io::Inbox,
    next_job: u64,
    load_job: Option<u64>,
    /// The load in flight if it reads a file in pieces (so it can be cancelled).
    load_cancellable: Option<u64>,
    /// What the load in flight sets when its trace arrives.
    opening: Option<Opening>,
    /// What the engine is doing: (job, stage, fraction).
    progress: Option<(u64, String, f32)>,
    /// The CSV export in flight: its job and the file its pieces go to.
    csv_export: Option<(u64, crate::gui::io::SaveInPieces)>,
    doc: Option<Document>,
    /// What the file in flight records, shown until its trace arrives (then kept, per op,
    /// in the document until the replays arrive).
    recorded: Option<crate::gui::state::RecordedView>,
    pub config: ConfigState,
    /// The op after which the layout is shown.
    pub cursor: u32,
    /// Put the cursor on the OOM (or the peak) when the main replay arrives.
    cursor_pending: bool,
    /// The main configuration sent with the file being opened (its load job), whose
    /// replay and start layout the engine answers unasked where its `Loaded` says so
    /// ([`crate::engine::wire::MainReplay::answer`]); taken by the replays' requests.
    main_answer: Option<(u64, crate::engine::wire::MainReplay)>,
    /// How many other configurations of a newly opened trace wait for the main one's
    /// answer before their replays are sent (the browser, under a capacity:
    /// [`AllocsimApp::release_held_replays`]); 0: none.
    replays_held: usize,
    pub timeline: crate::gui::views::timeline::TimelineState,
    pub map: crate::gui::views::map::MapState,
    pub tab: Tab,
    pub search: SearchState,
    pub selected_alloc: Option<u32>,
    /// The what-if job and its answer.
    pub what_if: Option<WhatIf>,
    /// The other runtimes of the Compare tab.
    pub runtimes: Option<Runtimes>,
    /// The explanation of the main configuration's OOM at the cursor.
    pub explained: Option<Explained>,
    /// Live bytes per call site at the main configuration's peak.
    peak_sites: Option<PeakSites>,
    bands_highlight: QuadSet,
    /// The custom workload SPEC field of the menu.
    pub workload_text: String,
    /// Messages shown in the error banner.
    pub errors: Vec<String>,
    /// Opens the file dialog (tests put one that fails in its place).
    pub file_dialog: fn(&egui::Context, &crate::gui::io::Inbox),
    /// The path field shown instead of the file dialog, once that could not open.
    pub path_prompt: Option<PathPrompt>,
    /// Why the file dialog could not open, once it failed: File > Open then offers the
    /// path field at once.
    dialog_unavailable: Option<String>,
    /// A new trace arrived: the side panel goes back to its default width.
    side_panel_reset: bool,
    /// The side panel's width when last drawn.
    pub side_panel_width: f32,
    wgpu: bool,
    /// What draws the big views (shown in the status line).
    pub renderer: String,
    /// The capacity the next file opens under in place of the capacity as recorded (the
    /// page's `?capacity=SIZE`).
    pub(crate) open_capacity: Option<CapacityArg>,
    timing: LoadTiming,
    /// Last time to the frame with every configuration's layout, in milliseconds.
    pub last_load_ms: Option<f64>,
    /// Last time to the first full frame (the whole trace's timeline and the memory map
    /// at an event from the main configuration's replay), in milliseconds.
    pub last_full_ms: Option<f64>,
    /// Last time to the first frame with the recorded timeline, in milliseconds.
    pub last_recorded_ms: Option<f64>,
    /// The slots and key targets the layouts one key away were last asked for
    /// (`request_layouts`).
    nearby_for: Option<(usize, [u32; 6])>,
    marked_layout: Option<u32>,
    /// The cursor keys taken out of egui's input by [`AllocsimApp::take_cursor_keys`],
    /// handled by the next frame's [`AllocsimApp::keys`].
    cursor_keys: Vec<egui::Event>,
    /// The files dropped, taken out of egui's input by [`AllocsimApp::take_dropped_files`],
    /// opened by the frame's [`AllocsimApp::pump`].
    dropped: Vec<egui::DroppedFileHandle>,
    /// Whether the frame of a drop draws nothing, and a drop's frame left so.
    pub(crate) drops: UnpaintedDrops,
    /// The live CUDA replay panel (desktop builds with CUDA support only).
    #[cfg(feature = "cuda")]
    pub live: crate::gui::views::live::LivePanel,
}

impl std::fmt::Debug for AllocsimApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocsimApp")
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

impl AllocsimApp {
    /// The app inside eframe: the engine off the UI thread, our wgpu pipeline installed.
    #[must_use]
    pub fn new(cc: &eframe::CreationContext<'_>, startup: Startup) -> AllocsimApp {
        let (wgpu, renderer) = if let Some(rs) = cc.wgpu_render_state.as_ref() {
            render::install(rs);
            let info = rs.adapter.get_info();
            (true, format!("wgpu {:?}, {}", info.backend, info.name))
        } else {
            #[cfg(target_arch = "wasm32")]
            render::set_glow(cc.gl.is_some());
            let name = if render::glow() {
                "glow, cached meshes"
            } else {
                "egui meshes"
            };
            (false, name.to_string())
        };
        log::info!("allocsim: renderer {renderer}");
        cc.egui_ctx.set_theme(egui::Theme::Dark);
        // In the browser each frame is the whole window through a software rasterizer
        // (SwiftShader: 0.1–0.3 s of the cores a sweep's workers run on), and a 0.2 s
        // transition (a scroll bar shown as the What would fit? panel grows) asks for a
        // frame after frame until it ends: widgets change at once instead.
        #[cfg(target_arch = "wasm32")]
        cc.egui_ctx.all_styles_mut(|s| s.animation_time = 0.0);
        let mut app =
            AllocsimApp::with_engine(crate::gui::io::EngineHandle::spawn(&cc.egui_ctx), wgpu);
        app.renderer = renderer;
        app.open_capacity = crate::gui::io::capacity_url_parameter();
        if let (Startup::Example(_), Some(url)) = (&startup, crate::gui::io::trace_url_parameter())
        {
            app.timing = LoadTiming {
                started_ms: crate::gui::io::now_ms(),
                name: url.clone(),
                done: false,
                recorded_done: false,
                main_done: false,
            };
            crate::gui::io::fetch(&cc.egui_ctx, &app.inbox, &url);
        } else {
            app.start(startup);
        }
        app
    }

    /// The app with a given engine and no GPU pipeline (tests, benchmarks).
    #[must_use]
    pub fn with_engine(engine: crate::gui::io::EngineHandle, wgpu: bool) -> AllocsimApp {
        AllocsimApp {
            engine,
            inbox: crate::gui::io::Inbox::default(),
            next_job: 1,
            load_job: None,
            load_cancellable: None,
            opening: None,
            progress: None,
            csv_export: None,
            doc: None,
            recorded: None,
            config: ConfigState::default(),
            cursor: 0,
            cursor_pending: false,
            main_answer: None,
            replays_held: 0,
            timeline: crate::gui::views::timeline::TimelineState::default(),
            map: crate::gui::views::map::MapState::default(),
            tab: Tab::Map,
            search: SearchState::default(),
            selected_alloc: None,
            what_if: None,
            runtimes: None,
            explained: None,
            peak_sites: None,
            bands_highlight: QuadSet::default(),
            errors: Vec::new(),
            file_dialog: crate::gui::io::open_file_dialog,
            path_prompt: None,
            dialog_unavailable: None,
            side_panel_reset: false,
            side_panel_width: 0.0,
            workload_text: String::new(),
            wgpu,
            renderer: if wgpu {
                "wgpu".into()
            } else {
                "egui meshes".into()
            },
            open_capacity: None,
            timing: LoadTiming::default(),
            last_load_ms: None,
            last_full_ms: None,
            last_recorded_ms: None,
            marked_layout: None,
            cursor_keys: Vec::new(),
            dropped: Vec::new(),
            drops: UnpaintedDrops {
                unpainted: cfg!(target_arch = "wasm32"),
                pending: false,
            },
            nearby_for: None,
            multi: crate::gui::views::multi::MultiState::default(),
            #[cfg(feature = "cuda")]
            live: crate::gui::views::live::LivePanel::default(),
        }
    }

    /// Opens what `startup` names.
    pub fn start(&mut self, startup: Startup) {
        match startup {
            Startup::Files(paths) => {
                crate::gui::views::multi::start(self, paths.len());
                for p in paths {
                    match crate::gui::io::read_path(&p.to_string_lossy()) {
                        Ok(f) => self.multi.add(f),
                        Err(e) => self.multi.errors.push(e),
                    }
                }
            }
            Startup::Example(e) => self.open_example(e),
            #[cfg(not(target_arch = "wasm32"))]
            Startup::File(path) => match crate::gui::io::file_at(&path.to_string_lossy()) {
                Ok(f) => self.open(
                    f.name,
                    OpenSource::File(path),
                    Opening::new(CapacityArg::AsRecorded, None, &[]),
                ),
                Err(e) => self.errors.push(e),
            },
            #[cfg(target_arch = "wasm32")]
            Startup::File(path) => self.errors.push(format!(
                "cannot read {}: no files in the browser",
                path.display()
            )),
            Startup::Bytes { name, bytes } => {
                self.open_bytes(name, bytes, CapacityArg::AsRecorded, &[]);
            }
            Startup::Empty => {}
        }
    }

    pub(crate) fn job(&mut self) -> u64 {
        self.next_job += 1;
        self.next_job
    }

    /// Opens a built-in example at its capacity as recorded, with its comparison (the
    /// cap its program set is offered beside the inferred one).
    pub fn open_example(&mut self, e: &Example) {
        self.open(
            e.file.to_string(),
            OpenSource::Bytes(e.bytes.to_vec()),
            Opening::new(CapacityArg::AsRecorded, e.cap_bytes(), e.compare_with),
        );
    }

    /// Opens a snapshot: `capacity` (as recorded: `allocsim replay`'s default) and
    /// `compare` set the configurations replayed once it has loaded.
    pub fn open_bytes(
        &mut self,
        name: String,
        bytes: Vec<u8>,
        capacity: CapacityArg,
        compare: &[&str],
    ) {
        self.open(
            name,
            OpenSource::Bytes(bytes),
            Opening::new(capacity, None, compare),
        );
    }

    /// Opens the snapshot file at `path`, read in pieces by the engine (its bytes never
    /// all in memory), as [`AllocsimApp::open_bytes`] opens bytes.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_path(&mut self, path: std::path::PathBuf, capacity: CapacityArg, compare: &[&str]) {
        let name = crate::gui::io::file_name(&path);
        self.open(
            name,
            OpenSource::File(path),
            Opening::new(capacity, None, compare),
        );
    }

    pub(crate) fn open(&mut self, name: String, source: OpenSource, opening: Opening) {
        let job = self.job();
        self.load_job = Some(job);
        self.opening = Some(opening);
        self.progress = Some((job, format!("reading {name}"), 0.0));
        if !self.timing.name.is_empty() && !self.timing.done && self.timing.name.ends_with(&name) {
            // A fetch started the clock already.
        } else {
            self.timing = LoadTiming {
                started_ms: crate::gui::io::now_ms(),
                name: name.clone(),
                done: false,
                recorded_done: false,
                main_done: false,
            };
        }
        #[cfg(feature = "cuda")]
        self.live.opening(match &source {
            OpenSource::Bytes(bytes) => crate::gui::views::live::LiveSource::Snapshot {
                name: name.clone(),
                bytes: std::sync::Arc::from(bytes.as_slice()),
            },
            OpenSource::File(path) => crate::gui::views::live::LiveSource::File {
                name: name.clone(),
                path: path.clone(),
            },
        });
        self.load_cancellable = matches!(source, OpenSource::File(_)).then_some(job);
        match source {
            OpenSource::Bytes(bytes) => self.engine.send(Request::Load { job, name, bytes }),
            OpenSource::File(file) => {
                // What `Response::Loaded` sets for a new file.
                let main = crate::engine::wire::MainReplay {
                    spec: "pytorch".into(),
                    capacity_bytes: match self.opening.as_ref().map(|o| o.capacity) {
                        Some(CapacityArg::Bytes(b)) => Some(b),
                        _ => None,
                    },
                    as_recorded: self
                        .opening
                        .as_ref()
                        .is_none_or(|o| o.capacity == CapacityArg::AsRecorded),
                    answer: Some((self.job(), self.job())),
                };
                self.main_answer = Some((job, main.clone()));
                self.engine.open_file(job, name, file, main);
            }
        }
    }

    /// What the work in flight is doing, and how far it is (the status line's bar).
    #[must_use]
    pub fn progress(&self) -> Option<(&str, f32)> {
        self.progress
            .as_ref()
            .map(|(_, stage, f)| (stage.as_str(), *f))
    }

    /// The loaded document.
    #[must_use]
    pub fn document(&self) -> Option<&Document> {
        self.doc.as_ref()
    }

    /// Whether work is in flight (a load, a replay or a layout).
    #[must_use]
    pub fn busy(&self) -> bool {
        self.load_job.is_some()
            || self.engine.has_queued()
            || self.multi.diff_job.is_some()
            || self.multi.ranks_job.is_some()
            || self.doc.as_ref().is_some_and(|d| {
                d.slots
                    .iter()
                    .any(|s| s.replay_job.is_some() || s.layout_job.is_some())
            })
            || self.search.job.is_some()
            || self
                .doc
                .as_ref()
                .is_some_and(|d| d.slots.iter().any(|s| s.min_capacity_job.is_some()))
            || self.what_if.as_ref().is_some_and(WhatIf::running)
            || self.runtimes.as_ref().is_some_and(|r| r.rows.is_none())
            || self.explained.as_ref().is_some_and(|x| x.answer.is_none())
            || self
                .doc
                .as_ref()
                .is_some_and(|d| d.bounds_job.is_some() || d.bands_job.is_some())
            || (self.timeline.mode == crate::gui::views::timeline::Mode::Bands
                && self.doc.as_ref().is_some_and(|d| !d.bands_complete()))
    }

    /// Sets the capacity every configuration replays under and replays them.
    pub fn set_capacity(&mut self, arg: CapacityArg) {
        let recorded = self
            .doc
            .as_ref()
            .and_then(|d| d.trace.recorded_capacity.clone());
        self.config.set_capacity(arg, recorded.as_ref());
        self.resimulate();
    }

    /// Moves the cursor to the event `event` of the device shown (the op of that event,
    /// else the last op before it), reveals it in the timeline, and selects the
    /// allocation made there, if any (an explanation's links).
    pub fn go_to_event(&mut self, event: u64) {
        let Some(doc) = &self.doc else { return };
        let Some(op) = state::op_of_event(&doc.trace, event) else {
            return;
        };
        let alloc = doc.trace.ops.is_alloc(op as usize);
        self.set_cursor(op);
        if alloc {
            self.selected_alloc = Some(op);
        }
        if let Some(doc) = &self.doc {
            self.timeline.reveal(doc, op);
        }
        self.refresh_highlight();
    }

    /// Moves the cursor (clamped to the trace).
    pub fn set_cursor(&mut self, op: u32) {
        let n = self.doc.as_ref().map_or(0, |d| d.trace.ops.len());
        self.cursor = op.min(n.saturating_sub(1) as u32);
    }

    /// Opens a synthetic workload (core's SPEC syntax) under `capacity`.
    pub fn open_workload(&mut self, spec: &str, capacity: Option<u64>) {
        let job = self.job();
        self.load_job = Some(job);
        self.opening = Some(Opening::new(
            capacity.map_or(CapacityArg::Unlimited, CapacityArg::Bytes),
            None,
            &[],
        ));
        self.progress = Some((job, format!("generating {spec}"), 0.0));
        self.timing = LoadTiming {
            started_ms: crate::gui::io::now_ms(),
            name: spec.to_string(),
            done: false,
            recorded_done: false,
            main_done: false,
        };
        #[cfg(feature = "cuda")]
        self.live
            .opening(crate::gui::views::live::LiveSource::Workload(
                spec.to_string(),
            ));
        self.engine.send(Request::Workload {
            job,
            spec: spec.to_string(),
        });
    }

    /// The whole UI (also what tests drive with a headless context).
    pub fn ui(&mut self, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        self.pump(&ctx);
        #[cfg(feature = "cuda")]
        if self.live.pump() {
            self.timeline.overlays = self.live.overlays();
        }
        self.keys(&ctx);
        // A key that moved the cursor to a layout kept for it shows it in this frame.
        self.show_nearby_layouts();
        self.build_bands(&ctx);
        frame::top_bar_ui(ui, self);
        frame::status_bar_ui(ui, self);
        frame::side_panel_ui(ui, self);
        frame::central_ui(ui, self);
        // A cursor moved by this frame's keys or clicks asks for its layout now, not one
        // frame later (a frame costs up to a second on a software rasterizer).
        self.request_layouts(&ctx);
        self.mark_frames();
        // A thread or worker engine wakes the UI with each answer; polling it with frames
        // meanwhile would only redraw an unchanged window (up to a second per frame on a
        // software rasterizer, competing with the engine for the CPU).
        if self.busy() && !self.engine.wakes_ui() {
            ctx.request_repaint_after(std::time::Duration::from_millis(16));
        }
    }

    /// Builds a slice of the band quads while the stacked view is shown and some are
    /// missing, and asks for the next frame to build the next slice (only for the wgpu
    /// pipeline, which uploads them; the other renderers make them from the pieces).
    pub(crate) fn build_bands(&mut self, ctx: &egui::Context) {
        if self.timeline.mode != crate::gui::views::timeline::Mode::Bands {
            return;
        }
        let dt = ctx.input(|i| i.unstable_dt);
        let budget =
            std::time::Duration::from_secs_f32((dt / 4.0).clamp(BAND_BUDGET.0, BAND_BUDGET.1));
        if let Some(doc) = &mut self.doc
            && !doc.build_bands(budget, self.wgpu)
        {
            ctx.request_repaint();
        }
    }

    /// Emits the first-full-frame and layout markers the browser test waits for.
    pub(crate) fn mark_frames(&mut self) {
        // Before the trace is built, or over its ops while the replays are on the way (a
        // fast machine builds the trace in the frame that brings the recorded timeline).
        let shown = self
            .recorded_shown()
            .or_else(|| self.recorded_in_document())
            .filter(|r| self.timing.name.ends_with(r.name.as_str()))
            .map(|r| format!("recorded:{}:{}", r.name, r.len()));
        if let Some(marker) = shown
            && let Some(ms) = self.timing.first(|t| &mut t.recorded_done)
        {
            self.last_recorded_ms = Some(ms);
            log::info!(
                "allocsim: first frame with the recorded timeline ({marker}) after {ms:.0} ms"
            );
            crate::gui::io::mark_frame(&marker);
        }
        let Some(doc) = &self.doc else { return };
        // A configuration is on screen with its layout at the cursor, or its error.
        let shown = |s: &state::Slot| {
            s.error.is_some()
                || (s.replay.is_some()
                    && s.layout.as_ref().is_some_and(|l| l.data.op == self.cursor))
        };
        // Of the file just opened (a file that failed to open leaves the document before
        // it on screen: its frames were marked already, and its layouts go on being
        // marked below), with no load in flight.
        let this_file =
            self.load_job.is_none() && self.timing.name.ends_with(doc.trace.name.as_str());
        // The first full frame: the main configuration (the others are replayed after it).
        if this_file
            && doc.slots.first().is_some_and(shown)
            && let Some(ms) = self.timing.first(|t| &mut t.main_done)
        {
            self.last_full_ms = Some(ms);
            log::info!(
                "allocsim: first full frame (main configuration) of {} after {ms:.0} ms",
                doc.trace.name
            );
            // The first full frame: the whole trace's timeline and the memory map
            // at an event, of the configuration the trace was recorded with.
            crate::gui::io::mark_frame(&format!("full:{}:{}", doc.trace.name, doc.trace.ops.len()));
        }
        // Settled: every configuration.
        let settled =
            self.load_job.is_none() && !doc.slots.is_empty() && doc.slots.iter().all(shown);
        if settled
            && this_file
            && let Some(ms) = self.timing.first(|t| &mut t.done)
        {
            self.last_load_ms = Some(ms);
            log::info!(
                "allocsim: every configuration of {} on screen after {ms:.0} ms",
                doc.trace.name
            );
            crate::gui::io::mark_frame(&format!(
                "ready:{}:{}",
                doc.trace.name,
                doc.trace.ops.len()
            ));
            // The first document on screen: the engine's code warmed for the next open.
            self.engine.warm_up();
        }
        let l0 = doc
            .slots
            .first()
            .and_then(|s| s.layout.as_ref())
            .map(|l| l.data.op);
        if settled && l0 != self.marked_layout {
            self.marked_layout = l0;
            if let Some(op) = l0 {
                crate::gui::io::mark_layout(op);
            }
        }
    }

    /// The op whose layout was last marked as on screen (what the browser's layout marker
    /// says).
    #[must_use]
    pub fn marked_layout(&self) -> Option<u32> {
        self.marked_layout
    }

    /// What the file in flight records, while it is shown in place of a document (its
    /// trace is being built).
    #[must_use]
    pub fn recorded_shown(&self) -> Option<&crate::gui::state::RecordedView> {
        self.recorded
            .as_ref()
            .filter(|r| self.load_job == Some(r.job))
    }

    /// The document's recorded timeline and end state, while its replays are on the way.
    #[must_use]
    pub fn recorded_in_document(&self) -> Option<&crate::gui::state::RecordedView> {
        self.doc.as_ref().and_then(|d| d.recorded.as_ref())
    }

    /// Whether the first frame with the recorded timeline of the file opened last was
    /// marked.
    #[must_use]
    pub fn recorded_frame_marked(&self) -> bool {
        self.timing.recorded_done
    }

    /// Whether the frame with every configuration's layout of the file opened last was
    /// marked (the browser's `ready:` marker).
    #[must_use]
    pub fn first_frame_marked(&self) -> bool {
        self.timing.done
    }

    /// Whether the first full frame of the file opened last (the main configuration's
    /// timeline and layout) was drawn.
    #[must_use]
    pub fn full_frame_marked(&self) -> bool {
        self.timing.main_done
    }

    /// Whether the wgpu pipeline draws the big views.
    #[must_use]
    pub fn uses_wgpu(&self) -> bool {
        self.wgpu
    }
}

/// Whether the frame of a drop draws nothing (the browser's: there a frame is a software
/// rasterizer's composite of the whole window, 60-100 ms of one of the cores the engine's
/// worker decodes the file on), its files opened by eframe's `logic`
/// ([`AllocsimApp::open_unpainted`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UnpaintedDrops {
    pub(crate) unpainted: bool,
    /// A drop's frame was left unpainted: its `logic` opens the files.
    pub(crate) pending: bool,
}

impl eframe::App for AllocsimApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        AllocsimApp::ui(self, ui);
    }

    fn raw_input_hook(&mut self, ctx: &egui::Context, raw_input: &mut egui::RawInput) {
        self.take_cursor_keys(ctx, raw_input);
        self.take_dropped_files(raw_input);
    }

    fn logic(&mut self, ctx: &egui::Context, _frame: &mut eframe::Frame) {
        self.open_unpainted(ctx);
    }

    /// The panels' colour: the panels are drawn without a fill of their own.
    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        visuals.panel_fill.to_normalized_gamma_f32()
    }
}

/// Opens the desktop app on the built-in example, on one file, or on several (two: their
/// Diff; more: Ranks). Returns an error (e.g. "no display") instead of panicking; the CLI
/// maps it to exit code 3.
// In the browser the paths are only dropped.
#[cfg_attr(target_arch = "wasm32", allow(clippy::needless_pass_by_value))]
pub fn run_native(paths: Vec<std::path::PathBuf>) -> Result<(), String> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        crate::gui::io::DesktopLogger::new(std::env::var("RUST_LOG").ok().as_deref()).install();
        if std::env::var_os("DISPLAY").is_none()
            && std::env::var_os("WAYLAND_DISPLAY").is_none()
            && cfg!(target_os = "linux")
        {
            return Err("no display: set DISPLAY or WAYLAND_DISPLAY (or run under Xvfb)".into());
        }
        // Before any thread starts (the environment is written) and before the window
        // (whose libraries read it).
        #[cfg(target_os = "linux")]
        crate::gui::io::ensure_runtime_dir();
        let startup = match <[_; 1]>::try_from(paths) {
            Ok([one]) => Startup::File(one),
            Err(paths) if paths.is_empty() => Startup::Example(&crate::engine::examples::OOM_STORY),
            Err(paths) => Startup::Files(paths),
        };
        let options = eframe::NativeOptions {
            renderer: eframe::Renderer::Wgpu,
            viewport: egui::ViewportBuilder::default()
                .with_title("allocsim")
                .with_inner_size([1440.0, 900.0])
                .with_drag_and_drop(true),
            ..eframe::NativeOptions::default()
        };
        eframe::run_native(
            "allocsim",
            options,
            Box::new(move |cc| Ok(Box::new(AllocsimApp::new(cc, startup)))),
        )
        .map_err(|e| format!("cannot open the app window: {e}"))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = paths;
        Err("the desktop app is not available in the browser".into())
    }
}

#[cfg(test)]
mod recorded_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod first_hour_tests;
#[cfg(test)]
mod multi_tests;
#[cfg(test)]
mod nearby_tests;

#[cfg(all(test, feature = "cuda"))]
mod live_tests;
