//! The allocsim app (eframe), one for the desktop and the browser: it opens on a built-in
//! real snapshot, replays it under the configurations the user compares, and shows the
//! timeline, the memory map at the cursor, what was live at the peak and why an OOM
//! happened. Slow work runs in the [`engine`] off the UI thread; the views draw plain data
//! ([`state`]) with egui and, for the big ones, our own wgpu pipeline ([`render`]).

pub mod engine;
pub mod envelope;
pub mod examples;
pub mod io;
#[cfg(feature = "cuda")]
pub mod live;
pub mod memory_map;
mod panels;
pub mod render;
pub mod state;
pub mod theme;
pub mod timeline;
pub mod views;

use std::collections::BTreeSet;
use std::sync::Arc;

use allocsim_core::capacity::{CapacityArg, CapacityChoice};
use allocsim_core::explain::Explanation;
use engine::wire::{AddressHit, NO_OP, Request, Response, WhatIfData, WhatIfRow};
use examples::Example;
use render::QuadSet;
use state::{Document, LayoutView, ReplayView, Slot};

pub use panels::Tab;

/// Time a frame spends building band quads (see [`Document::build_bands`]): a quarter of
/// the time between frames, within these bounds, so that the stacked view of millions of
/// pieces fills in over frames instead of freezing one (a few ms at 60 frames a second;
/// more where frames are slow to draw anyway, as on a software rasterizer, so that it does
/// not take hundreds of them).
const BAND_BUDGET: (f32, f32) = (0.004, 0.05);

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

/// The configuration panel's state.
#[derive(Debug, Clone)]
pub struct ConfigState {
    /// The model of the main configuration.
    pub model: String,
    /// Its `PYTORCH_CUDA_ALLOC_CONF`-style config ("" = the snapshot's own settings).
    pub conf: String,
    /// The capacity asked for: as recorded (the default, as for `allocsim replay`), the
    /// whole GPU, or a size. Set it with [`AllocsimApp::set_capacity`].
    pub capacity_arg: CapacityArg,
    /// The capacity every configuration replays under: `capacity_arg` resolved on the
    /// device shown (the bytes, where they came from, and the line that says how they were
    /// inferred).
    pub capacity: CapacityChoice,
    /// The capacity text field.
    pub capacity_text: String,
    /// The memory cap the program is known to have set (a built-in example's recorded
    /// `set_per_process_memory_fraction`), offered beside the inferred one.
    pub program_cap_bytes: Option<u64>,
    /// The other compared configurations (`NAME` or `NAME@CONFIG`).
    pub compare: Vec<String>,
    /// The "add a configuration" text field.
    pub add_text: String,
}

impl Default for ConfigState {
    fn default() -> Self {
        ConfigState {
            model: "pytorch".into(),
            conf: String::new(),
            capacity_arg: CapacityArg::AsRecorded,
            capacity: CapacityChoice::given(None),
            capacity_text: String::new(),
            program_cap_bytes: None,
            compare: Vec::new(),
            add_text: String::new(),
        }
    }
}

impl ConfigState {
    /// The memory cap of every configuration (`None`: the whole GPU).
    #[must_use]
    pub fn capacity_bytes(&self) -> Option<u64> {
        self.capacity.bytes
    }

    /// Asks for `arg` on a trace whose capacity as recorded is `recorded` (None: no
    /// recording); the text field shows a size asked for, else nothing.
    pub fn set_capacity(&mut self, arg: CapacityArg, recorded: Option<&CapacityChoice>) {
        self.capacity_arg = arg;
        self.capacity_text = match arg {
            CapacityArg::Bytes(b) => allocsim_core::units::format_size(b),
            CapacityArg::AsRecorded | CapacityArg::Unlimited => String::new(),
        };
        self.resolve_capacity(recorded);
    }

    /// Resolves [`ConfigState::capacity_arg`] on the capacity as recorded of the device
    /// shown (None: no recording).
    pub fn resolve_capacity(&mut self, recorded: Option<&CapacityChoice>) {
        self.capacity = match self.capacity_arg {
            CapacityArg::AsRecorded => recorded
                .cloned()
                .unwrap_or_else(|| CapacityChoice::given(None)),
            CapacityArg::Unlimited => CapacityChoice::given(None),
            CapacityArg::Bytes(b) => CapacityChoice::given(Some(b)),
        };
    }

    /// The main configuration as a spec.
    #[must_use]
    pub fn main_spec(&self) -> String {
        let conf = self.conf.trim();
        if conf.is_empty() {
            self.model.clone()
        } else {
            format!("{}@{conf}", self.model)
        }
    }

    /// Every compared spec, the main one first.
    #[must_use]
    pub fn specs(&self) -> Vec<String> {
        let mut v = vec![self.main_spec()];
        v.extend(self.compare.iter().cloned());
        v
    }
}

/// The search box's state and what it matched.
#[derive(Debug, Clone, Default)]
pub struct SearchState {
    pub text: String,
    /// Stacks whose frames contain the text.
    pub stacks: Option<BTreeSet<u32>>,
    /// The text as an address.
    pub addr: Option<u64>,
    /// Allocations (of the main configuration) holding the address.
    pub hits: Vec<AddressHit>,
    pub job: Option<u64>,
    /// A call site chosen in the peak table.
    pub site: Option<u32>,
}

/// Timing of the first full frame after a load (shown in the status bar, logged for the
/// browser benchmark).
#[derive(Debug, Clone, Default)]
struct LoadTiming {
    started_ms: f64,
    name: String,
    done: bool,
}

/// The call sites at a replay's peak (keyed by the replay's address): (stack, bytes, count).
type PeakSites = (usize, Vec<(u32, u64, u32)>);

/// A what-if job ("What would fit?"): the capacity it asked about, its progress, and
/// `recommend`'s trade-off table once answered.
#[derive(Debug)]
pub struct WhatIf {
    pub job: u64,
    pub capacity_bytes: Option<u64>,
    /// The stage and fraction of the sweep, while it runs.
    pub progress: Option<(String, f32)>,
    pub answer: Option<WhatIfData>,
    /// Stopped by the user (its answer, if any comes, is dropped).
    pub cancelled: bool,
    pub error: Option<String>,
}

impl WhatIf {
    /// Whether the sweep still runs.
    #[must_use]
    pub fn running(&self) -> bool {
        self.answer.is_none() && !self.cancelled && self.error.is_none()
    }
}

/// The other runtimes under a capacity (the Compare tab), asked for once per capacity.
#[derive(Debug)]
pub struct Runtimes {
    pub job: u64,
    pub capacity_bytes: Option<u64>,
    pub rows: Option<Result<Vec<WhatIfRow>, String>>,
}

/// What `allocsim explain` says at the main configuration's OOM the panel shows.
#[derive(Debug)]
pub struct Explained {
    /// `(spec, capacity, event)` asked about.
    pub key: (String, Option<u64>, u64),
    pub job: u64,
    /// The op explained and the explanation, once answered (or why there is none).
    pub answer: Option<Result<(u32, Box<Explanation>), String>>,
    /// The alloc ops of the blockers (their events on the device's ops), for the map.
    pub blocker_allocs: BTreeSet<u32>,
}

impl Explained {
    /// The explanation, when it has arrived.
    #[must_use]
    pub fn explanation(&self) -> Option<(u32, &Explanation)> {
        match &self.answer {
            Some(Ok((op, e))) => Some((*op, e)),
            _ => None,
        }
    }
}

/// What an open sets once its trace has arrived (a file that fails to open changes
/// nothing: the configuration stays in step with the trace on screen).
#[derive(Debug)]
struct Opening {
    capacity: CapacityArg,
    program_cap_bytes: Option<u64>,
    compare: Vec<String>,
}

impl Opening {
    fn new(capacity: CapacityArg, program_cap_bytes: Option<u64>, compare: &[&str]) -> Opening {
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
    pub multi: views::MultiState,
    engine: io::EngineHandle,
    inbox: io::Inbox,
    next_job: u64,
    load_job: Option<u64>,
    /// What the load in flight sets when its trace arrives.
    opening: Option<Opening>,
    /// What the engine is doing: (job, stage, fraction).
    progress: Option<(u64, String, f32)>,
    doc: Option<Document>,
    pub config: ConfigState,
    /// The op after which the layout is shown.
    pub cursor: u32,
    /// Put the cursor on the OOM (or the peak) when the main replay arrives.
    cursor_pending: bool,
    pub timeline: timeline::TimelineState,
    pub map: memory_map::MapState,
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
    pub file_dialog: fn(&egui::Context, &io::Inbox),
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
    timing: LoadTiming,
    /// Last first-frame time, in milliseconds.
    pub last_load_ms: Option<f64>,
    marked_layout: Option<u32>,
    /// The live CUDA replay panel (desktop builds with CUDA support only).
    #[cfg(feature = "cuda")]
    pub live: live::LivePanel,
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
            (false, "egui meshes".to_string())
        };
        log::info!("allocsim: renderer {renderer}");
        cc.egui_ctx.set_theme(egui::Theme::Dark);
        let mut app = AllocsimApp::with_engine(io::EngineHandle::spawn(&cc.egui_ctx), wgpu);
        app.renderer = renderer;
        if let (Startup::Example(_), Some(url)) = (&startup, io::trace_url_parameter()) {
            app.timing = LoadTiming {
                started_ms: io::now_ms(),
                name: url.clone(),
                done: false,
            };
            io::fetch(&cc.egui_ctx, &app.inbox, &url);
        } else {
            app.start(startup);
        }
        app
    }

    /// The app with a given engine and no GPU pipeline (tests, benchmarks).
    #[must_use]
    pub fn with_engine(engine: io::EngineHandle, wgpu: bool) -> AllocsimApp {
        AllocsimApp {
            engine,
            inbox: io::Inbox::default(),
            next_job: 1,
            load_job: None,
            opening: None,
            progress: None,
            doc: None,
            config: ConfigState::default(),
            cursor: 0,
            cursor_pending: false,
            timeline: timeline::TimelineState::default(),
            map: memory_map::MapState::default(),
            tab: Tab::Map,
            search: SearchState::default(),
            selected_alloc: None,
            what_if: None,
            runtimes: None,
            explained: None,
            peak_sites: None,
            bands_highlight: QuadSet::default(),
            errors: Vec::new(),
            file_dialog: io::open_file_dialog,
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
            timing: LoadTiming::default(),
            last_load_ms: None,
            marked_layout: None,
            multi: views::MultiState::default(),
            #[cfg(feature = "cuda")]
            live: live::LivePanel::default(),
        }
    }

    /// Opens what `startup` names.
    pub fn start(&mut self, startup: Startup) {
        match startup {
            Startup::Example(e) => self.open_example(e),
            Startup::File(path) => match std::fs::read(&path) {
                Ok(bytes) => self.open_bytes(
                    path.file_name().map_or_else(
                        || path.display().to_string(),
                        |f| f.to_string_lossy().into_owned(),
                    ),
                    bytes,
                    CapacityArg::AsRecorded,
                    &[],
                ),
                Err(e) => self
                    .errors
                    .push(format!("cannot read {}: {e}", path.display())),
            },
            Startup::Bytes { name, bytes } => {
                self.open_bytes(name, bytes, CapacityArg::AsRecorded, &[]);
            }
            Startup::Files(paths) => {
                views::start(self, paths.len());
                for p in paths {
                    match io::read_path(&p.to_string_lossy()) {
                        Ok(f) => self.multi.add(f),
                        Err(e) => self.multi.errors.push(e),
                    }
                }
            }
            Startup::Empty => {}
        }
    }

    fn job(&mut self) -> u64 {
        self.next_job += 1;
        self.next_job
    }

    /// Opens a built-in example at its capacity as recorded, with its comparison (the
    /// cap its program set is offered beside the inferred one).
    pub fn open_example(&mut self, e: &Example) {
        self.open(
            e.file.to_string(),
            e.bytes.to_vec(),
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
        self.open(name, bytes, Opening::new(capacity, None, compare));
    }

    fn open(&mut self, name: String, bytes: Vec<u8>, opening: Opening) {
        let job = self.job();
        self.load_job = Some(job);
        self.opening = Some(opening);
        self.progress = Some((job, format!("reading {name}"), 0.0));
        if !self.timing.name.is_empty() && !self.timing.done && self.timing.name.ends_with(&name) {
            // A fetch started the clock already.
        } else {
            self.timing = LoadTiming {
                started_ms: io::now_ms(),
                name: name.clone(),
                done: false,
            };
        }
        #[cfg(feature = "cuda")]
        self.live.opening(live::LiveSource::Snapshot {
            name: name.clone(),
            bytes: Arc::from(bytes.as_slice()),
        });
        self.engine.send(Request::Load { job, name, bytes });
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
            || self.doc.as_ref().is_some_and(|d| d.bounds_job.is_some())
            || (self.timeline.mode == timeline::Mode::Bands
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

    /// Replays the compared configurations that changed (after a config or capacity
    /// change); a slot whose spec and capacity stay keeps its replay.
    pub fn resimulate(&mut self) {
        let specs = self.config.specs();
        let cap = self.config.capacity_bytes();
        let Some(doc) = &mut self.doc else { return };
        let mut old: Vec<Option<Slot>> = std::mem::take(&mut doc.slots)
            .into_iter()
            .map(Some)
            .collect();
        for (i, spec) in specs.iter().enumerate() {
            let kept = old.get_mut(i).and_then(|o| {
                o.take_if(|s| s.spec == *spec && s.capacity_bytes == cap && s.replay.is_some())
            });
            doc.slots.push(match kept {
                Some(mut s) => {
                    s.layout_job = None;
                    s
                }
                None => Slot::new(spec.clone(), cap),
            });
        }
        for i in specs.len()..old.len() {
            self.engine.send(Request::DropSlot { slot: i as u32 });
        }
        self.request_replays();
    }

    /// Sends a replay for every slot without one.
    fn request_replays(&mut self) {
        let n = self.doc.as_ref().map_or(0, |d| d.slots.len());
        for i in 0..n {
            let needs = self
                .doc
                .as_ref()
                .is_some_and(|d| d.slots[i].replay.is_none() && d.slots[i].replay_job.is_none());
            if needs {
                let job = self.job();
                if let Some(doc) = &mut self.doc {
                    let s = &mut doc.slots[i];
                    s.replay_job = Some(job);
                    s.error = None;
                    let req = Request::Replay {
                        job,
                        slot: i as u32,
                        spec: s.spec.clone(),
                        capacity_bytes: s.capacity_bytes,
                    };
                    self.engine.send(req);
                }
            }
        }
        self.peak_sites = None;
    }

    /// With the main configuration out of memory, asks what would have fit at the capacity
    /// (the what-if) and the smallest capacity of each configuration, once per capacity:
    /// an OOM trace opens with its explanation complete, without a click.
    fn explain_main_oom(&mut self) {
        let main_oom = self.doc.as_ref().is_some_and(|d| {
            d.slots.first().is_some_and(|s| {
                s.replay
                    .as_ref()
                    .is_some_and(|r| !r.data.summary.ooms.is_empty())
            })
        });
        if !main_oom {
            return;
        }
        let cap = self.config.capacity_bytes();
        if self
            .what_if
            .as_ref()
            .is_none_or(|w| w.capacity_bytes != cap)
        {
            self.request_what_if();
        }
        self.request_min_capacities();
        self.request_explanation();
    }

    /// Asks the engine to explain the main configuration's OOM the panel shows (the last
    /// at or before the cursor, else the first), once per configuration, capacity and OOM.
    fn request_explanation(&mut self) {
        let Some(s) = self.doc.as_ref().and_then(|d| d.slots.first()) else {
            return;
        };
        let Some(r) = &s.replay else { return };
        let ooms = &r.data.summary.ooms;
        if ooms.is_empty() {
            return;
        }
        let o = &ooms[oom_at(ooms, self.cursor)];
        let key = (s.spec.clone(), s.capacity_bytes, o.event_index);
        if self.explained.as_ref().is_some_and(|x| x.key == key) {
            return;
        }
        let job = self.job();
        self.engine.send(Request::Explain {
            job,
            spec: key.0.clone(),
            capacity_bytes: key.1,
            at_event: key.2,
        });
        self.explained = Some(Explained {
            key,
            job,
            answer: None,
            blocker_allocs: BTreeSet::new(),
        });
        self.refresh_highlight();
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

    /// File > Open: the file dialog, or the path field where the dialog could not open.
    pub fn open_file(&mut self, ctx: &egui::Context) {
        match &self.dialog_unavailable {
            Some(reason) => {
                let reason = reason.clone();
                self.path_prompt.get_or_insert_with(|| PathPrompt {
                    reason,
                    text: String::new(),
                });
            }
            None => (self.file_dialog)(ctx, &self.inbox),
        }
    }

    /// Opens the path typed in the path field; the field stays while the path cannot be
    /// read.
    pub fn open_typed_path(&mut self, ctx: &egui::Context) {
        let Some(p) = &self.path_prompt else { return };
        if p.text.trim().is_empty() {
            return;
        }
        match io::read_path(&p.text) {
            Ok(f) => {
                self.path_prompt = None;
                self.inbox.push(ctx, Ok(f));
            }
            Err(e) => self.errors.push(e),
        }
    }

    /// Moves the cursor (clamped to the trace).
    pub fn set_cursor(&mut self, op: u32) {
        let n = self.doc.as_ref().map_or(0, |d| d.trace.ops.len());
        self.cursor = op.min(n.saturating_sub(1) as u32);
    }

    /// Handles what the engine and the I/O sent since last frame.
    pub fn pump(&mut self, ctx: &egui::Context) {
        for item in self.inbox.take() {
            match item {
                Ok(f) => {
                    let ex = examples::by_file(&f.name);
                    let cap = ex.and_then(Example::cap_bytes);
                    let cmp: &[&str] = ex.map_or(&[], |e| e.compare_with);
                    let opening = Opening::new(CapacityArg::AsRecorded, cap, cmp);
                    self.open(f.name, f.bytes, opening);
                }
                Err(e) => self.errors.push(e),
            }
        }
        for reason in self.inbox.take_dialog_failures() {
            log::info!("the file dialog could not open ({reason}); offering a path field");
            self.path_prompt = Some(PathPrompt {
                reason: reason.clone(),
                text: String::new(),
            });
            self.dialog_unavailable = Some(reason);
        }
        let dropped = ctx.input(|i| i.raw.dropped_files.clone());
        // Several files at once start a Diff (two) or Ranks (more); one file dropped on
        // either view is one more snapshot of it.
        if dropped.len() >= 2 {
            views::start(self, dropped.len());
        }
        for f in dropped {
            let inbox = if self.multi.view.is_some() {
                &self.multi.inbox
            } else {
                &self.inbox
            };
            io::read_dropped(ctx, inbox, f);
        }
        views::pump(self);
        for r in self.engine.poll() {
            self.on_response(r);
        }
        self.explain_main_oom();
        self.request_layouts();
    }

    fn on_response(&mut self, r: Response) {
        let job = r.job();
        if let Some((pj, ..)) = &self.progress
            && *pj == job
            && !matches!(r, Response::Progress { .. })
        {
            self.progress = None;
        }
        let Some(r) = views::on_response(self, r) else {
            return;
        };
        match r {
            Response::Progress {
                job,
                stage,
                fraction,
            } => {
                if let Some(w) = &mut self.what_if
                    && w.job == job
                {
                    if w.cancelled {
                        return;
                    }
                    w.progress = Some((stage.clone(), fraction));
                }
                self.progress = Some((job, stage, fraction));
            }
            Response::Loaded { job, trace } => {
                if self.load_job != Some(job) {
                    return;
                }
                self.load_job = None;
                #[cfg(feature = "cuda")]
                self.live.loaded();
                self.timeline.overlays.clear();
                // A new file sets the configuration; another device of the same file keeps
                // it, its capacity as recorded being that device's.
                if let Some(o) = self.opening.take() {
                    self.side_panel_reset = true;
                    self.config.model = "pytorch".into();
                    self.config.conf.clear();
                    self.config.compare = o.compare;
                    self.config.program_cap_bytes = o.program_cap_bytes;
                    self.config
                        .set_capacity(o.capacity, trace.recorded_capacity.as_ref());
                } else {
                    self.config
                        .resolve_capacity(trace.recorded_capacity.as_ref());
                }
                self.what_if = None;
                self.runtimes = None;
                self.explained = None;
                // The band quads are built once the stacked view is shown, a slice per
                // frame (`build_bands`).
                self.doc = Some(Document::new(Arc::new(*trace)));
                self.cursor = 0;
                self.cursor_pending = true;
                // The new document's first layout is marked even at the op marked last.
                self.marked_layout = None;
                self.timeline.view = None;
                if self.timeline.axis == timeline::Axis::Time
                    && self.doc.as_ref().is_some_and(|d| d.seconds.is_empty())
                {
                    self.timeline.axis = timeline::Axis::Events;
                }
                self.map = memory_map::MapState::default();
                self.search = SearchState {
                    text: self.search.text.clone(),
                    ..SearchState::default()
                };
                self.selected_alloc = None;
                self.bands_highlight = QuadSet::default();
                self.resimulate();
                self.apply_search();
                let job = self.job();
                if let Some(doc) = &mut self.doc {
                    doc.bounds_job = Some(job);
                }
                self.engine.send(Request::Bounds { job });
            }
            Response::Replayed { job, slot, replay } => {
                let Some(doc) = &mut self.doc else { return };
                let Some(s) = doc.slots.get_mut(slot as usize) else {
                    return;
                };
                if s.replay_job != Some(job) {
                    return;
                }
                s.replay_job = None;
                s.replay = Some(ReplayView::new(*replay));
                s.layout = None;
                if slot == 0 && self.cursor_pending {
                    // On the first OOM (recorded or not), else at the peak.
                    self.cursor_pending = false;
                    let r = s.replay.as_ref();
                    self.cursor = r
                        .and_then(|r| r.data.summary.ooms.first().map(|o| o.op_index))
                        .or(r.map(|r| r.peak_op))
                        .unwrap_or(0);
                }
                if slot == 0 {
                    self.peak_sites = None;
                }
            }
            Response::Layout { job, slot, layout } => {
                let Some(doc) = &mut self.doc else { return };
                let trace = doc.trace.clone();
                let Some(s) = doc.slots.get_mut(slot as usize) else {
                    return;
                };
                if s.layout_job.map(|(j, _)| j) != Some(job) {
                    return;
                }
                s.layout_job = None;
                let hl = highlighter(&trace, &self.search, self.selected_alloc);
                let data = *layout;
                let mut view = LayoutView::new(data, &hl);
                if slot == 0 {
                    view.set_blockers(&blocker_picker(self.explained.as_ref()));
                }
                s.layout = Some(view);
            }
            Response::AddressHits { job, hits, .. } => {
                if self.search.job == Some(job) {
                    self.search.job = None;
                    self.search.hits = hits;
                }
            }
            Response::MinCapacity { job, slot, bytes } => {
                if let Some(s) = self
                    .doc
                    .as_mut()
                    .and_then(|d| d.slots.get_mut(slot as usize))
                    && s.min_capacity_job == Some(job)
                {
                    s.min_capacity_job = None;
                    s.min_capacity = Some(Ok(bytes));
                }
            }
            Response::WhatIf { job, answer } => {
                if let Some(w) = &mut self.what_if
                    && w.job == job
                    && !w.cancelled
                {
                    w.progress = None;
                    w.answer = Some(*answer);
                }
            }
            Response::Runtimes { job, rows } => {
                if let Some(r) = &mut self.runtimes
                    && r.job == job
                {
                    r.rows = Some(Ok(rows));
                }
            }
            Response::Explained {
                job,
                op_index,
                explanation,
            } => {
                let Some(x) = &mut self.explained else { return };
                if x.job != job {
                    return;
                }
                if let Some(doc) = &self.doc {
                    x.blocker_allocs = explanation
                        .blockers
                        .iter()
                        .flat_map(|b| &b.events)
                        .filter_map(|&e| state::op_of_event(&doc.trace, e))
                        .filter(|&op| doc.trace.ops.is_alloc(op as usize))
                        .collect();
                }
                x.answer = Some(Ok((op_index, explanation)));
                self.refresh_highlight();
            }
            Response::Bounds { job, bounds } => {
                if let Some(doc) = &mut self.doc
                    && doc.bounds_job == Some(job)
                {
                    doc.bounds_job = None;
                    doc.bounds = Some(bounds);
                }
            }
            // Taken by the Diff and Ranks views above.
            Response::Diffed { .. } | Response::Ranked { .. } => {}
            Response::Failed { job, message } => {
                if self.load_job == Some(job) {
                    self.load_job = None;
                    self.opening = None;
                    self.errors.push(message);
                    return;
                }
                if self.search.job == Some(job) {
                    self.search.job = None;
                }
                if let Some(w) = &mut self.what_if
                    && w.job == job
                {
                    w.progress = None;
                    if !w.cancelled {
                        w.error = Some(message);
                    }
                    return;
                }
                if let Some(r) = &mut self.runtimes
                    && r.job == job
                {
                    r.rows = Some(Err(message));
                    return;
                }
                if let Some(x) = &mut self.explained
                    && x.job == job
                {
                    x.answer = Some(Err(message));
                    return;
                }
                if let Some(doc) = &mut self.doc
                    && doc.bounds_job == Some(job)
                {
                    doc.bounds_job = None;
                    return;
                }
                if let Some(doc) = &mut self.doc {
                    for s in &mut doc.slots {
                        if s.replay_job == Some(job) {
                            s.replay_job = None;
                            s.error = Some(message.clone());
                            self.errors.push(message.clone());
                        }
                        if s.min_capacity_job == Some(job) {
                            s.min_capacity_job = None;
                            s.min_capacity = Some(Err(message.clone()));
                        }
                        if s.layout_job.map(|(j, _)| j) == Some(job) {
                            s.layout_job = None;
                            s.error = Some(message.clone());
                        }
                    }
                }
            }
        }
    }

    /// Asks for the layout at the cursor of every slot whose layout is stale (one request
    /// in flight per slot: while scrubbing, the newest cursor wins).
    fn request_layouts(&mut self) {
        let cursor = self.cursor;
        let mut reqs = Vec::new();
        if let Some(doc) = &self.doc {
            for (i, s) in doc.slots.iter().enumerate() {
                if s.replay.is_some()
                    && s.layout_job.is_none()
                    && s.error.is_none()
                    && s.layout.as_ref().is_none_or(|l| l.data.op != cursor)
                {
                    reqs.push(i);
                }
            }
        }
        for i in reqs {
            let job = self.job();
            if let Some(doc) = &mut self.doc {
                doc.slots[i].layout_job = Some((job, cursor));
            }
            self.engine.send(Request::Layout {
                job,
                slot: i as u32,
                op: cursor,
            });
        }
    }

    /// Recomputes what the search and the selection highlight.
    pub fn apply_search(&mut self) {
        let text = self.search.text.trim().to_string();
        self.search.addr = parse_address(&text);
        self.search.hits.clear();
        self.search.stacks = None;
        if let Some(doc) = &self.doc {
            if let Some(a) = self.search.addr {
                let job = self.job();
                self.search.job = Some(job);
                self.engine.send(Request::FindAddress {
                    job,
                    slot: 0,
                    addr: a,
                });
            } else if !text.is_empty() {
                self.search.stacks = Some(state::stacks_matching(&doc.trace, &text));
            }
        }
        if let Some(site) = self.search.site {
            self.search
                .stacks
                .get_or_insert_with(BTreeSet::new)
                .insert(site);
        }
        self.refresh_highlight();
    }

    /// Rebuilds the highlight quads of the bands and of every layout.
    pub fn refresh_highlight(&mut self) {
        let Some(doc) = &mut self.doc else { return };
        let trace = doc.trace.clone();
        let mut set: Option<BTreeSet<u32>> = self.search.stacks.clone();
        let sel = self.selected_alloc;
        self.bands_highlight = if set.is_some() || sel.is_some() {
            let stacks = set.get_or_insert_with(BTreeSet::new);
            let ops = &trace.ops;
            let pick = |p: &engine::wire::BandPiece| {
                Some(p.alloc) == sel
                    || ops
                        .stack
                        .get(p.alloc as usize)
                        .is_some_and(|s| stacks.contains(s))
            };
            QuadSet::new(state::band_quads(
                &trace,
                &doc.seconds,
                &pick,
                Some(theme::HIGHLIGHT),
            ))
        } else {
            QuadSet::default()
        };
        let hl = highlighter(&trace, &self.search, sel);
        for s in &mut doc.slots {
            if let Some(l) = &mut s.layout {
                l.set_highlight(&hl);
            }
        }
        if let Some(l) = doc.slots.first_mut().and_then(|s| s.layout.as_mut()) {
            l.set_blockers(&blocker_picker(self.explained.as_ref()));
        }
    }

    /// Asks for the min capacity of every replayed slot that lacks one (the compare table).
    pub fn request_min_capacities(&mut self) {
        let n = self.doc.as_ref().map_or(0, |d| d.slots.len());
        for i in 0..n {
            let spec = match self.doc.as_ref().map(|d| &d.slots[i]) {
                Some(s)
                    if s.replay.is_some()
                        && s.min_capacity.is_none()
                        && s.min_capacity_job.is_none() =>
                {
                    s.spec.clone()
                }
                _ => continue,
            };
            let job = self.job();
            if let Some(doc) = &mut self.doc {
                doc.slots[i].min_capacity_job = Some(job);
            }
            self.engine.send(Request::MinCapacity {
                job,
                slot: i as u32,
                spec,
            });
        }
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
            started_ms: io::now_ms(),
            name: spec.to_string(),
            done: false,
        };
        #[cfg(feature = "cuda")]
        self.live
            .opening(live::LiveSource::Workload(spec.to_string()));
        self.engine.send(Request::Workload {
            job,
            spec: spec.to_string(),
        });
    }

    /// Asks which configurations would fit under the current capacity.
    pub fn request_what_if(&mut self) {
        let job = self.job();
        let capacity_bytes = self.config.capacity_bytes();
        self.what_if = Some(WhatIf {
            job,
            capacity_bytes,
            progress: None,
            answer: None,
            cancelled: false,
            error: None,
        });
        self.engine.send(Request::WhatIf {
            job,
            capacity_bytes,
        });
    }

    /// Stops the what-if sweep in flight (natively the engine skips the replays not yet
    /// started; the browser's worker finishes it, and its answer is dropped).
    pub fn cancel_what_if(&mut self) {
        if let Some(w) = &mut self.what_if
            && w.running()
        {
            w.cancelled = true;
            w.progress = None;
            if self.progress.as_ref().is_some_and(|p| p.0 == w.job) {
                self.progress = None;
            }
            self.engine.send(Request::Cancel { job: w.job });
        }
    }

    /// Asks for the other runtimes under the current capacity (the Compare tab), once per
    /// capacity.
    pub fn request_runtimes(&mut self) {
        let capacity_bytes = self.config.capacity_bytes();
        if self.doc.is_none()
            || self
                .runtimes
                .as_ref()
                .is_some_and(|r| r.capacity_bytes == capacity_bytes)
        {
            return;
        }
        let job = self.job();
        self.runtimes = Some(Runtimes {
            job,
            capacity_bytes,
            rows: None,
        });
        self.engine.send(Request::Runtimes {
            job,
            capacity_bytes,
        });
    }

    /// Handles the keyboard: arrows step one event, PageUp/PageDown jump, Home/End.
    fn keys(&mut self, ctx: &egui::Context) {
        if ctx.egui_wants_keyboard_input() {
            return;
        }
        let Some(doc) = &self.doc else { return };
        let n = doc.trace.ops.len() as i64;
        if n == 0 {
            return;
        }
        let (lo, hi) = self.timeline.visible(doc);
        let (a, b) = (
            self.timeline.op_at_x(doc, lo),
            self.timeline.op_at_x(doc, hi),
        );
        let page = (i64::from(b.saturating_sub(a)) / 10).max(1);
        let mut c = i64::from(self.cursor);
        ctx.input(|i| {
            for e in &i.events {
                if let egui::Event::Key {
                    key,
                    pressed: true,
                    modifiers,
                    ..
                } = e
                {
                    let step = if modifiers.shift { 10 } else { 1 };
                    match key {
                        egui::Key::ArrowRight => c += step,
                        egui::Key::ArrowLeft => c -= step,
                        egui::Key::PageDown => c += page,
                        egui::Key::PageUp => c -= page,
                        egui::Key::Home => c = 0,
                        egui::Key::End => c = n - 1,
                        _ => {}
                    }
                }
            }
        });
        let c = c.clamp(0, n - 1) as u32;
        if c != self.cursor {
            self.cursor = c;
            self.timeline.reveal(doc, c);
        }
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
        self.build_bands(&ctx);
        panels::top_bar_ui(ui, self);
        panels::status_bar_ui(ui, self);
        panels::side_panel_ui(ui, self);
        panels::central_ui(ui, self);
        // A cursor moved by this frame's keys or clicks asks for its layout now, not one
        // frame later (a frame costs up to a second on a software rasterizer).
        self.request_layouts();
        self.mark_frames();
        // A thread or worker engine wakes the UI with each answer; polling it with frames
        // meanwhile would only redraw an unchanged window (up to a second per frame on a
        // software rasterizer, competing with the engine for the CPU).
        if self.busy() && !self.engine.wakes_ui() {
            ctx.request_repaint_after(std::time::Duration::from_millis(16));
        }
    }

    /// Builds a slice of the band quads while the stacked view is shown and some are
    /// missing, and asks for the next frame to build the next slice.
    fn build_bands(&mut self, ctx: &egui::Context) {
        if self.timeline.mode != timeline::Mode::Bands {
            return;
        }
        let dt = ctx.input(|i| i.unstable_dt);
        let budget =
            std::time::Duration::from_secs_f32((dt / 4.0).clamp(BAND_BUDGET.0, BAND_BUDGET.1));
        if let Some(doc) = &mut self.doc
            && !doc.build_bands(budget)
        {
            ctx.request_repaint();
        }
    }

    /// Emits the first-full-frame and layout markers the browser test waits for.
    fn mark_frames(&mut self) {
        let Some(doc) = &self.doc else { return };
        // Settled: no load in flight, and every configuration's layout at the cursor (or
        // its error) is on screen.
        let settled = self.load_job.is_none()
            && !doc.slots.is_empty()
            && doc.slots.iter().all(|s| {
                s.error.is_some()
                    || (s.replay.is_some()
                        && s.layout.as_ref().is_some_and(|l| l.data.op == self.cursor))
            });
        // Complete: settled on the file just opened. A file that failed to open leaves
        // the document before it on screen: its first frame was marked already, and its
        // layouts go on being marked below.
        let complete = settled && self.timing.name.ends_with(doc.trace.name.as_str());
        if complete && !self.timing.done {
            self.timing.done = true;
            let ms = io::now_ms() - self.timing.started_ms;
            self.last_load_ms = Some(ms);
            log::info!(
                "allocsim: first full frame of {} after {ms:.0} ms",
                doc.trace.name
            );
            io::mark_frame(&format!("ready:{}:{}", doc.trace.name, doc.trace.ops.len()));
        }
        let l0 = doc
            .slots
            .first()
            .and_then(|s| s.layout.as_ref())
            .map(|l| l.data.op);
        if settled && l0 != self.marked_layout {
            self.marked_layout = l0;
            if let Some(op) = l0 {
                io::mark_layout(op);
            }
        }
    }

    /// The op whose layout was last marked as on screen (what the browser's layout marker
    /// says).
    #[must_use]
    pub fn marked_layout(&self) -> Option<u32> {
        self.marked_layout
    }

    /// Whether the first full frame of the file opened last was marked.
    #[must_use]
    pub fn first_frame_marked(&self) -> bool {
        self.timing.done
    }

    /// Whether the wgpu pipeline draws the big views.
    #[must_use]
    pub fn uses_wgpu(&self) -> bool {
        self.wgpu
    }

    fn export_csv(&self) {
        let Some(doc) = &self.doc else { return };
        let Some(s) = doc.slots.first() else { return };
        let Some(r) = &s.replay else { return };
        let mut tl = state::timeline_of(&r.data);
        tl.time_us = doc.trace.ops.time_us[..tl.len().min(doc.trace.ops.len())].to_vec();
        tl.time_us.resize(tl.len(), 0);
        let name = format!(
            "{}_{}_timeline.csv",
            stem(&doc.trace.name),
            sanitize(&s.spec)
        );
        io::save_file(&name, tl.to_csv().into_bytes());
    }

    /// The compare summary as JSON (the fields of `allocsim compare --json`).
    #[must_use]
    pub fn compare_json(&self) -> Option<String> {
        let doc = self.doc.as_ref()?;
        let results: Vec<serde_json::Value> = doc
            .slots
            .iter()
            .filter_map(|s| {
                let r = s.replay.as_ref()?;
                let mut v = serde_json::to_value(&r.data.summary).ok()?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("spec".into(), serde_json::Value::String(s.spec.clone()));
                    o.insert(
                        "events".into(),
                        serde_json::Value::from(
                            doc.trace
                                .devices
                                .get(doc.trace.device as usize)
                                .map_or(0, |d| d.0),
                        ),
                    );
                }
                Some(v)
            })
            .collect();
        let c = &self.config.capacity;
        let v = serde_json::json!({
            "schema": 1,
            "file": doc.trace.name,
            "device": doc.trace.device,
            "capacity_bytes": c.bytes,
            "capacity_source": c.source,
            "capacity_inferred": c.inferred,
            "capacity_note": c.note,
            "results": results,
        });
        serde_json::to_string_pretty(&v).ok()
    }

    fn export_json(&self) {
        if let (Some(doc), Some(json)) = (&self.doc, self.compare_json()) {
            io::save_file(
                &format!("{}_compare.json", stem(&doc.trace.name)),
                json.into_bytes(),
            );
        }
    }
}

impl eframe::App for AllocsimApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        AllocsimApp::ui(self, ui);
    }

    /// The panels' colour: the panels are drawn without a fill of their own.
    fn clear_color(&self, visuals: &egui::Visuals) -> [f32; 4] {
        visuals.panel_fill.to_normalized_gamma_f32()
    }
}

/// Whether layout block `b` is highlighted: its call site matches, it holds the searched
/// address, or it is the selected allocation.
fn highlighter<'a>(
    trace: &'a engine::wire::TraceData,
    search: &'a SearchState,
    selected: Option<u32>,
) -> impl Fn(&engine::wire::LayoutData, usize) -> bool + 'a {
    move |layout, b| {
        let Some(blk) = layout.blocks.get(b) else {
            return false;
        };
        if let Some(a) = search.addr
            && blk.addr <= a
            && a < blk.addr + blk.size_bytes
        {
            return true;
        }
        if selected.is_some() && blk.alloc != NO_OP && Some(blk.alloc) == selected {
            return true;
        }
        search
            .stacks
            .as_ref()
            .is_some_and(|s| state::block_in_stacks(trace, layout, b, s))
    }
}

/// Whether layout block `b` is one of the explanation's blockers: a live block of a
/// blocker's allocation, or (at the op explained, for blocks alive before the trace
/// starts) at a blocker's address.
fn blocker_picker(
    explained: Option<&Explained>,
) -> impl Fn(&engine::wire::LayoutData, usize) -> bool + '_ {
    let at = explained.and_then(Explained::explanation);
    move |layout, b| {
        let (Some(x), Some((op, e)), Some(blk)) = (explained, at, layout.blocks.get(b)) else {
            return false;
        };
        if blk.state == engine::wire::block_state::FREE
            || blk.state == engine::wire::block_state::UNMAPPED
        {
            return false;
        }
        (blk.alloc != NO_OP && x.blocker_allocs.contains(&blk.alloc))
            || (layout.op == op && e.blockers.iter().any(|g| g.addrs.contains(&blk.addr)))
    }
}

/// The OOM of `ooms` the panel explains at the cursor: the last at or before it, else the
/// first.
#[must_use]
pub fn oom_at(ooms: &[engine::wire::OomData], cursor: u32) -> usize {
    ooms.iter().rposition(|o| o.op_index <= cursor).unwrap_or(0)
}

/// Parses `0x7f12…` or a long hex string as an address.
#[must_use]
pub fn parse_address(text: &str) -> Option<u64> {
    let t = text.trim();
    let hex = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"));
    match hex {
        Some(h) if !h.is_empty() => u64::from_str_radix(h, 16).ok(),
        _ if t.len() >= 8
            && t.chars().all(|c| c.is_ascii_hexdigit())
            && t.chars().any(|c| c.is_ascii_digit()) =>
        {
            u64::from_str_radix(t, 16).ok()
        }
        _ => None,
    }
}

fn stem(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    base.split('.').next().unwrap_or(base).to_string()
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Opens the desktop app on the built-in example, on one file, or on several (two: their
/// Diff; more: Ranks). Returns an error (e.g. "no display") instead of panicking; the CLI
/// maps it to exit code 3.
// In the browser the paths are only dropped.
#[cfg_attr(target_arch = "wasm32", allow(clippy::needless_pass_by_value))]
pub fn run_native(paths: Vec<std::path::PathBuf>) -> Result<(), String> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        io::DesktopLogger::new(std::env::var("RUST_LOG").ok().as_deref()).install();
        if std::env::var_os("DISPLAY").is_none()
            && std::env::var_os("WAYLAND_DISPLAY").is_none()
            && cfg!(target_os = "linux")
        {
            return Err("no display: set DISPLAY or WAYLAND_DISPLAY (or run under Xvfb)".into());
        }
        // Before any thread starts (the environment is written) and before the window
        // (whose libraries read it).
        #[cfg(target_os = "linux")]
        io::ensure_runtime_dir();
        let startup = match <[_; 1]>::try_from(paths) {
            Ok([one]) => Startup::File(one),
            Err(paths) if paths.is_empty() => Startup::Example(&examples::OOM_STORY),
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
mod tests;

#[cfg(test)]
mod first_hour_tests;

#[cfg(all(test, feature = "cuda"))]
mod live_tests;
