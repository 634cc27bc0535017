//! The engine: everything slow the app does — decoding a snapshot, replaying it under
//! each compared configuration, rebuilding the layout at the cursor — behind a message
//! interface, so it runs off the UI thread: on a thread natively, in a Web Worker in the
//! browser (the GUI's `io` module). It holds the trace and the replays (with their
//! checkpoints); the UI holds the plain data the engine sends ([`wire`]).

pub mod bands;
pub mod examples;
pub mod live;
pub mod multi;
pub mod open;
pub mod ops;
pub mod parallel;
pub mod recorded;
pub mod search;
pub mod wire;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use allocsim_core::capacity::CapacityArg;
use allocsim_core::explain::Explanation;
use allocsim_core::models::{LayoutBlockState, ModelSpec};
use allocsim_core::offline::{self, BestPossible};
use allocsim_core::replay::{self, OomReport, Outcome, ReplayOptions, ReplayResult};
use allocsim_core::trace::{DeviceTrace, Trace};
use allocsim_core::validate::DeviceReport;
use allocsim_core::{session, workloads};

use wire::{
    AddressHit, BlockView, LayoutData, MainReplay, NO_OP, OomData, OpsTable, ReplayData,
    ReplaySummary, Request, Response, SegmentView, StackTable, TraceData, block_state,
};

/// The cancel flags of an engine's jobs in flight ([`Engine::cancels`]).
#[derive(Debug, Clone)]
pub struct Cancels(Arc<Mutex<BTreeMap<u64, Arc<AtomicBool>>>>);

impl Cancels {
    /// Stops job `job` if it is in flight and cancellable.
    pub fn cancel(&self, job: u64) {
        if let Ok(c) = self.0.lock()
            && let Some(flag) = c.get(&job)
        {
            flag.store(true, Ordering::Relaxed);
        }
    }
}

/// A replay kept for layouts and searches.
struct Slot {
    result: ReplayResult,
    /// [`ReplayData::start_op`] of this replay.
    start_op: u32,
}

/// The engine's state: the loaded trace and one replay per compare slot.
#[derive(Default)]
pub struct Engine {
    /// Shared with work that runs beside the engine ([`Engine::detached`]).
    trace: Option<Arc<Trace>>,
    reports: Vec<DeviceReport>,
    name: String,
    device: usize,
    /// Ops table of the device shown (kept for layouts: alloc ↔ end links); the UI's
    /// [`TraceData::ops`] is this very table, shared.
    ops: Arc<OpsTable>,
    /// Which allocations of `ops` are held after an op: built with the bands
    /// ([`Request::Bands`]), or by the first layout that needs it first (which then
    /// waits for the one being built).
    live: Arc<OnceLock<live::LiveIndex>>,
    slots: Vec<Option<Slot>>,
    /// The main configuration's replay done beside the build of the file just opened,
    /// for the UI's first replay request if it asks for that one (natively).
    beside: Option<open::Beside>,
    /// Answers kept for the trace and device shown (shared with detached work).
    cache: Arc<Mutex<Cache>>,
    /// The cancel flag of each cancellable job in flight.
    cancels: Arc<Mutex<BTreeMap<u64, Arc<AtomicBool>>>>,
    /// From how many ops a newly opened device is sent before its main replay
    /// ([`Engine::install_answering`]).
    loaded_ahead: LoadedAheadOps,
}

/// Ops from which a newly opened device's trace goes to the UI before its main replay
/// is made (where the UI is to be answered unasked), so that the UI takes it — decodes
/// the message, makes its document — while the replay runs (in the browser, the page's
/// thread beside the engine's worker: on the 1.12 GB snapshot's 9.7 M ops the first full
/// frame came 4.4–4.6 s after the recorded timeline's, 4.95–5.0 s when sent together);
/// below it, with its replay and the layout, for one frame of the UI to take them all
/// (a frame of the page costs 50–200 ms of a software rasterizer, more than a small
/// trace's replay).
#[derive(Debug, Clone, Copy)]
struct LoadedAheadOps(usize);

impl Default for LoadedAheadOps {
    fn default() -> Self {
        LoadedAheadOps(1 << 20)
    }
}

/// What the engine computed once for the trace and device shown.
#[derive(Debug, Default)]
struct Cache {
    /// Bumped when the trace or the device changes: work started before does not store.
    generation: u64,
    bounds: Option<BestPossible>,
    /// `(spec, capacity, at_event)` → the op explained and its explanation.
    explained: BTreeMap<ExplainKey, (u32, Arc<Explanation>)>,
}

use search::{ExplainKey, explain_at, min_capacity_response, runtimes, what_if};

/// At most this many explanations are kept (one per OOM and configuration asked about).
const EXPLAINED_KEPT: usize = 64;

impl Cache {
    fn clear(&mut self) {
        self.generation += 1;
        self.bounds = None;
        self.explained.clear();
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("name", &self.name)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine with nothing loaded.
    #[must_use]
    pub fn new() -> Engine {
        Engine::default()
    }

    /// Handles one request; answers go to `emit` (progress first, the result last).
    pub fn handle(&mut self, req: Request, emit: &mut dyn FnMut(Response)) {
        match req {
            Request::Load { job, name, bytes } => self.load(job, name, &bytes, emit),
            Request::Open {
                job,
                name,
                path,
                main,
            } => self.open(job, name, &path, &main, emit),
            Request::SelectDevice { job, device } => {
                let Some(trace) = &self.trace else {
                    return emit(Response::Failed {
                        job,
                        message: "no trace is loaded".into(),
                    });
                };
                if device as usize >= trace.devices.len() {
                    return emit(Response::Failed {
                        job,
                        message: format!("the trace has no device {device}"),
                    });
                }
                self.device = device as usize;
                self.show_device(job, false, emit);
            }
            Request::Replay {
                job,
                slot,
                spec,
                capacity_bytes,
            } => self.replay(job, slot, &spec, capacity_bytes, emit),
            Request::ExportCsv {
                job,
                spec,
                capacity_bytes,
            } => self.export_csv(job, &spec, capacity_bytes, emit),
            Request::DropSlot { slot } => {
                if let Some(s) = self.slots.get_mut(slot as usize) {
                    *s = None;
                }
            }
            Request::Layout { job, slot, op } => self.emit_layout(job, slot, op, emit),
            Request::StartLayout {
                job,
                slot,
                otherwise,
            } => {
                let main = self.slots.first().and_then(Option::as_ref);
                let op = main.map_or(otherwise, |s| s.start_op);
                self.emit_layout(job, slot, op, emit);
            }
            Request::FindAddress { job, slot, addr } => match self.find_address(slot, addr) {
                Ok(hits) => emit(Response::AddressHits {
                    job,
                    slot,
                    addr,
                    hits,
                }),
                Err(message) => emit(Response::Failed { job, message }),
            },
            req @ (Request::WhatIf { .. }
            | Request::Runtimes { .. }
            | Request::Explain { .. }
            | Request::Bounds { .. }
            | Request::Bands { .. }
            | Request::Diff { .. }
            | Request::Ranks { .. }
            | Request::Rank { .. }) => {
                // Run here, in order (the web worker, tests); natively the host runs it
                // beside the engine.
                if let Ok(work) = self.detached(req) {
                    work(emit);
                }
            }
            Request::Cancel { job } => self.cancels().cancel(job),
            Request::Workload { job, spec } => {
                emit(Response::Progress {
                    job,
                    stage: format!("generating {spec}"),
                    fraction: 0.05,
                });
                match workloads::generate(&spec) {
                    Ok(trace) => {
                        self.adopt(trace, Vec::new(), spec, 0);
                        self.show_device(job, false, emit);
                    }
                    Err(e) => emit(Response::Failed {
                        job,
                        message: e.to_string(),
                    }),
                }
            }
            Request::SweepSizes { job } => {
                emit(search::sweep_sizes(self.trace.as_deref(), self.device, job));
            }
            Request::SweepReplays {
                job,
                indices,
                specs,
                capacity_bytes,
            } => {
                search::sweep_replays(
                    self.trace.as_deref(),
                    self.device,
                    job,
                    (&indices, &specs),
                    capacity_bytes,
                    emit,
                );
            }
            Request::ShareTrace { job } => emit(match self.shared() {
                Ok((device, t)) => Response::SharedTrace {
                    job,
                    device,
                    trace: allocsim_core::trace::binary::encode(&t),
                },
                Err(message) => Response::Failed { job, message },
            }),
            // Only a search worker takes a trace so ([`Engine::handle_search`]).
            Request::SearchTrace { .. } => {}
            Request::MinCapacity { job, slot, spec } => {
                let r = min_capacity_response(
                    self.trace.as_deref(),
                    self.device,
                    job,
                    slot,
                    &spec,
                    emit,
                );
                emit(r);
            }
        }
    }

    /// The engine of a worker that runs only searches (the browser's search worker, which
    /// Cancel terminates, beside the engine that answers the UI): a load, a workload or a
    /// device choice sets its trace without the UI's copy of it and answers nothing (the
    /// engine beside it answers them); any other request is handled as by
    /// [`Engine::handle`].
    pub fn handle_search(&mut self, req: Request, emit: &mut dyn FnMut(Response)) {
        match req {
            Request::Load { name, bytes, .. } => {
                let decoded =
                    allocsim_core::snapshot::decode_snapshot(&bytes).map_err(|e| e.to_string());
                self.search_adopt(name, decoded);
            }
            Request::Workload { spec, .. } => match workloads::generate(&spec) {
                Ok(trace) => self.adopt(trace, Vec::new(), spec, 0),
                Err(_) => self.trace = None,
            },
            Request::SearchTrace { device, trace, .. } => {
                match allocsim_core::trace::binary::decode(&trace) {
                    Ok(t) if (device as usize) < t.devices.len() => {
                        self.adopt(t, Vec::new(), String::new(), device as usize);
                    }
                    _ => self.trace = None,
                }
            }
            Request::SelectDevice { device, .. } => {
                if self
                    .trace
                    .as_ref()
                    .is_some_and(|t| (device as usize) < t.devices.len())
                {
                    self.device = device as usize;
                    self.forget();
                }
            }
            other => self.handle(other, emit),
        }
    }

    /// The search worker's trace from a snapshot decoded elsewhere (a load, or in the
    /// browser a `File` read in slices): set, nothing sent (the engine's worker shows it).
    pub fn search_adopt(
        &mut self,
        name: String,
        decoded: Result<allocsim_core::snapshot::RawSnapshot, String>,
    ) {
        match decoded
            .and_then(|snap| allocsim_core::build::build(snap, None).map_err(|e| e.to_string()))
        {
            Ok(v) => {
                let device = v.trace.busiest_device();
                self.adopt(v.trace, v.devices, name, device);
            }
            Err(_) => self.trace = None,
        }
    }

    /// Takes `trace` (decoded from `name`, with its validation reports) as the one shown,
    /// on device `device`, and forgets what was computed before.
    fn adopt(&mut self, trace: Trace, reports: Vec<DeviceReport>, name: String, device: usize) {
        self.device = device;
        self.trace = Some(Arc::new(trace));
        self.reports = reports;
        self.name = name;
        self.forget();
    }

    /// Shows device `self.device` of the trace: what was computed for the one shown before
    /// is dropped, the UI gets its copy ([`Response::Loaded`]).
    /// `main_answered`: the main configuration's replay and layout follow unasked (no
    /// progress frame before them either: its paint would delay theirs).
    fn show_device(&mut self, job: u64, main_answered: bool, emit: &mut dyn FnMut(Response)) {
        self.forget();
        let mut quiet = |_: Response| {};
        let data = self.trace_data(if main_answered { &mut quiet } else { emit }, job);
        emit(Response::Loaded {
            job,
            trace: Box::new(data),
            main_answered,
        });
        // Where the UI took the table as its contents and nothing else holds it (the
        // browser's worker posts a message and drops it), the engine keeps only the
        // columns it reads: on the 1.12 GB snapshot about 100 MiB less of the worker's
        // memory beside its replays. Natively the UI shares this very table: kept whole.
        if let Some(ops) = Arc::get_mut(&mut self.ops) {
            ops.keep_engine_columns();
        }
    }

    /// Drops the replays and what was computed for the trace or device shown before.
    fn forget(&mut self) {
        self.slots.clear();
        self.beside = None;
        if let Ok(mut c) = self.cache.lock() {
            c.clear();
        }
    }

    fn load(&mut self, job: u64, name: String, bytes: &[u8], emit: &mut dyn FnMut(Response)) {
        emit(Response::Progress {
            job,
            stage: format!("decoding {name}"),
            fraction: 0.05,
        });
        let decoded = allocsim_core::snapshot::decode_snapshot(bytes)
            .map_err(|e| format!("{name}: {}", allocsim_core::Error::from(e)));
        self.open_decoded(job, name, decoded, emit);
    }

    /// Opens the file at `path` read in pieces ([`open::decode_file`]): progress while
    /// it decodes, [`Request::Cancel`] stops it (the host sets the flag: this thread is
    /// busy), and the file's bytes are gone once decoded. The main configuration `main`
    /// is replayed beside the trace's build ([`open::build_beside`]).
    fn open(
        &mut self,
        job: u64,
        name: String,
        path: &str,
        main: &MainReplay,
        emit: &mut dyn FnMut(Response),
    ) {
        let flag = Arc::new(AtomicBool::new(false));
        if let Ok(mut c) = self.cancels.lock() {
            c.insert(job, Arc::clone(&flag));
        }
        let mut report = open::ProgressReport::new(job, &name);
        let decoded = open::decode_file(std::path::Path::new(path), &mut |p| {
            report.report(p, emit);
            !flag.load(Ordering::Relaxed)
        });
        if let Ok(mut c) = self.cancels.lock() {
            c.remove(&job);
        }
        let decoded = decoded.map_err(|e| match e {
            open::OpenError::Cancelled => format!("opening {name}: cancelled"),
            open::OpenError::Failed(message) => message,
        });
        let mut beside = None;
        let r = decoded.and_then(|snap| {
            // The recorded timeline, made and sent while the trace is built.
            let (built, kept) = open::build_beside(snap, main, |snap| {
                emit(recorded::response(job, snap, &name));
            });
            beside = kept;
            built.map_err(|e| format!("{name}: {e}"))
        });
        self.install_answering(job, name, r, Some(main), |_| beside, emit);
    }

    /// Takes a snapshot decoded elsewhere (natively [`Engine::open`]; in the browser the
    /// worker's reading of a `File` in slices): builds its trace and shows it, or says
    /// why not (`decoded`'s error is the one-line message).
    pub fn open_decoded(
        &mut self,
        job: u64,
        name: String,
        decoded: Result<allocsim_core::snapshot::RawSnapshot, String>,
        emit: &mut dyn FnMut(Response),
    ) {
        self.open_decoded_replaying(job, name, decoded, None, emit);
    }

    /// [`Engine::open_decoded`], with `main` replayed once the trace is built (under the
    /// rule of [`open::build_beside`]: [`open::replayed_ahead`]) and kept for the UI's
    /// first [`Request::Replay`] of it; where `main` gives the UI's jobs, that replay and
    /// its start layout are answered unasked behind [`Response::Loaded`]. For the browser's
    /// worker, alone on its thread: it would otherwise wait while the page takes the trace
    /// and asks, and the page would draw a frame between the trace and the replay.
    pub fn open_decoded_replaying(
        &mut self,
        job: u64,
        name: String,
        decoded: Result<allocsim_core::snapshot::RawSnapshot, String>,
        main: Option<&MainReplay>,
        emit: &mut dyn FnMut(Response),
    ) {
        // Decoded, the file's own timeline and end state go to the UI at once; the trace
        // is built and validated after.
        let mut ahead = None;
        let mut kept = None;
        let r = decoded.and_then(|snap| {
            emit(recorded::response(job, &snap, &name));
            ahead = main.and_then(|m| open::replayed_ahead(&snap, m).map(|spec| (m, spec)));
            let built = match &ahead {
                Some((main, spec)) => open::build_keeping_replay(snap, main, spec),
                None => allocsim_core::build::build(snap, None).map(|v| (v, None)),
            };
            built
                .map(|(v, replayed)| {
                    kept = replayed;
                    v
                })
                .map_err(|e| format!("{name}: {e}"))
        });
        let ahead = |e: &Engine| {
            let (main, spec) = ahead?;
            // The build's pass was the replay where it kept one (of the device shown).
            match kept.filter(|b: &open::Beside| b.device == e.device) {
                Some(b) => Some(b),
                None => open::replay_built(e.trace.as_ref()?, e.device, main, &spec),
            }
        };
        self.install_answering(job, name, r, main, ahead, emit);
    }

    /// Takes a decoded and validated snapshot as the trace shown, or says why not; the
    /// main configuration's replay made beside or after the build (`ahead`, given the
    /// engine holding the trace) is kept for the UI's first [`Request::Replay`] of it, or,
    /// where `main` gives the UI's jobs, it and its start layout are answered unasked
    /// behind [`Response::Loaded`]: the UI takes the trace, the replay and the layout in
    /// one frame (in the browser a frame costs 50-200 ms of a software rasterizer).
    fn install_answering(
        &mut self,
        job: u64,
        name: String,
        loaded: Result<allocsim_core::validate::Validation, String>,
        main: Option<&MainReplay>,
        ahead: impl FnOnce(&Engine) -> Option<open::Beside>,
        emit: &mut dyn FnMut(Response),
    ) {
        let Ok(v) = loaded.map_err(|message| emit(Response::Failed { job, message })) else {
            return;
        };
        let device = v.trace.busiest_device();
        let ops = v.trace.devices.get(device).map_or(0, |d| d.ops.len());
        self.adopt(v.trace, v.devices, name, device);
        let answer = main.and_then(|m| m.answer.map(|jobs| (m, jobs)));
        // A big trace first: its answers follow whether or not the replay made now is
        // the one asked for (`handle` replays it again if not).
        let loaded_first = answer.is_some() && ops >= self.loaded_ahead.0;
        if loaded_first {
            self.show_device(job, true, emit);
        }
        let beside = ahead(self);
        let answer = answer
            .filter(|_| loaded_first || beside.as_ref().is_some_and(|b| b.device == self.device));
        if !loaded_first {
            self.show_device(job, answer.is_some(), emit);
        }
        self.beside = beside;
        for asked in answer.map_or_else(Vec::new, |(main, jobs)| main.requests(jobs)) {
            self.handle(asked, emit);
        }
    }

    /// The trace a [`Request::ShareTrace`] shares, and the device shown: a host may write
    /// the [`Response::SharedTrace`] bytes itself, where they go, instead of asking for
    /// them ([`crate::gui::chunked`]'s `search_trace_into` in the browser's worker).
    ///
    /// # Errors
    /// No trace is loaded.
    pub fn shared(&self) -> Result<(u32, Arc<Trace>), String> {
        match &self.trace {
            Some(t) => Ok((self.device as u32, Arc::clone(t))),
            None => Err("no trace is loaded".into()),
        }
    }

    /// The registry of cancel flags, for a host that must cancel a job while the engine
    /// is busy with it (an open: [`Request::Cancel`] would wait behind it).
    #[must_use]
    pub fn cancels(&self) -> Cancels {
        Cancels(Arc::clone(&self.cancels))
    }

    /// The UI's copy of the device shown (also refreshes the engine's ops table).
    fn trace_data(&mut self, emit: &mut dyn FnMut(Response), job: u64) -> TraceData {
        let Some(trace) = &self.trace else {
            return TraceData::default();
        };
        let dt = &trace.devices[self.device];
        emit(Response::Progress {
            job,
            stage: "building the ops table".into(),
            fraction: 0.7,
        });
        self.ops = Arc::new(OpsTable::of(&dt.ops));
        self.live = Arc::default();
        let report = self.reports.iter().find(|r| r.device == dt.device);
        let mut notes = Vec::new();
        if let Some(r) = report {
            if let Some(d) = &r.first_divergence {
                notes.push(format!(
                    "the PyTorch model first differs from the recording at event {}: {}",
                    d.event_index, d.context
                ));
            }
            if let Some(e) = &r.end_state_difference {
                notes.push(format!("end state: {e}"));
            }
        }
        notes.extend(trace.snapshot.extras().notes());
        notes.extend(dt.inferred.iter().take(20).map(|i| {
            format!(
                "event {}: inferred {} ({})",
                i.event_index, i.kind, i.detail
            )
        }));
        TraceData {
            name: self.name.clone(),
            device: dt.device,
            devices: trace
                .devices
                .iter()
                .map(|d| (d.events as u32, d.ops.len() as u32))
                .collect(),
            recorded_conf: trace.snapshot.settings.conf.clone(),
            recorded: !self.reports.is_empty(),
            exact: report.is_some_and(|r| r.exact),
            notes,
            starts_mid_program: !dt.starts_empty(),
            has_times: dt.ops.iter().any(|o| o.time_us != 0),
            recorded_capacity: (!self.reports.is_empty())
                .then(|| session::capacity(trace, self.device, CapacityArg::AsRecorded)),
            ops: Arc::clone(&self.ops),
            stacks: Arc::new(stack_table(&trace.snapshot.frames)),
            bands: Arc::default(),
        }
    }

    fn replay(
        &mut self,
        job: u64,
        slot: u32,
        spec: &str,
        capacity: Option<u64>,
        emit: &mut dyn FnMut(Response),
    ) {
        let Some(trace) = &self.trace else {
            return emit(Response::Failed {
                job,
                message: "no trace is loaded".into(),
            });
        };
        let parsed = match ModelSpec::parse(spec) {
            Ok(s) => s,
            Err(e) => {
                return emit(Response::Failed {
                    job,
                    message: e.to_string(),
                });
            }
        };
        emit(Response::Progress {
            job,
            stage: format!("replaying {spec}"),
            fraction: 0.1,
        });
        // The replay beside the build is taken once, where it is the one asked for.
        let beside = self
            .beside
            .take()
            .filter(|b| b.device == self.device && b.spec == spec && b.capacity_bytes == capacity);
        let replayed = match beside {
            Some(b) => Ok(b.result),
            None => session::replay_device(trace, self.device, &parsed, capacity, drawn_replay()),
        };
        let mut result = match replayed {
            Ok(r) => r,
            Err(e) => {
                return emit(Response::Failed {
                    job,
                    message: format!("{spec}: {e}"),
                });
            }
        };
        let data = replay_data(spec, &mut result);
        let i = slot as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        let start_op = data.start_op();
        self.slots[i] = Some(Slot { result, start_op });
        emit(Response::Replayed {
            job,
            slot,
            replay: Box::new(data),
        });
    }

    /// Answers [`Request::ExportCsv`]: `spec` replayed again, its CSV handed on in pieces
    /// of [`CSV_PIECE_ROWS`] rows as the replay makes them. The replay keeps no timeline,
    /// outcomes or checkpoints: each row is read from the model after its op (the timeline
    /// a replay would keep: the same samples, `ReplayRun::ops_done`), so the export costs
    /// the worker a model and the addresses served, not a second timeline.
    fn export_csv(
        &mut self,
        job: u64,
        spec: &str,
        capacity: Option<u64>,
        emit: &mut dyn FnMut(Response),
    ) {
        let failed = |message: String| Response::Failed { job, message };
        let Some(trace) = &self.trace else {
            return emit(failed("no trace is loaded".into()));
        };
        let parsed = match ModelSpec::parse(spec) {
            Ok(s) => s,
            Err(e) => return emit(failed(e.to_string())),
        };
        let (mut model, device, preloaded) =
            match session::start_model(trace, self.device, &parsed, capacity) {
                Ok(m) => m,
                Err(e) => return emit(failed(format!("{spec}: {e}"))),
            };
        emit(Response::Progress {
            job,
            stage: format!("exporting {spec} as CSV"),
            fraction: 0.0,
        });
        let dt = &trace.devices[self.device];
        // A summary's options (no timeline, outcomes or checkpoints): the rows are read
        // from the model.
        let opts = ReplayOptions {
            preloaded,
            ..allocsim_core::whatif::summary_options()
        };
        let mut run = replay::ReplayRun::over(dt, model.as_mut(), device, capacity, opts);
        let mut piece = String::from(allocsim_core::metrics::CSV_HEADER);
        let mut rows = 0;
        for op in &dt.ops {
            let k = run.ops_done();
            run.push(op);
            if run.ops_done() == k {
                continue;
            }
            let stats = run.model().stats();
            allocsim_core::metrics::csv_row(k, op.time_us, &stats, &mut piece);
            rows += 1;
            if rows == CSV_PIECE_ROWS {
                emit(Response::CsvPiece {
                    job,
                    bytes: std::mem::take(&mut piece).into_bytes(),
                    done: false,
                });
                rows = 0;
            }
        }
        emit(Response::CsvPiece {
            job,
            bytes: piece.into_bytes(),
            done: true,
        });
    }

    fn slot(&self, slot: u32) -> Result<(&DeviceTrace, &Slot), String> {
        let trace = self.trace.as_ref().ok_or("no trace is loaded")?;
        let s = self
            .slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .ok_or("this configuration has not been replayed yet")?;
        Ok((&trace.devices[self.device], s))
    }

    /// The layout after ops `0..=op`, each block linked to the allocation in it.
    /// Answers a layout request: slot `slot`'s layout after op `op`, or why not.
    fn emit_layout(&self, job: u64, slot: u32, op: u32, emit: &mut dyn FnMut(Response)) {
        match self.layout(slot, op) {
            Ok(layout) => emit(Response::Layout {
                job,
                slot,
                layout: Box::new(layout),
            }),
            Err(message) => emit(Response::Failed { job, message }),
        }
    }

    fn layout(&self, slot: u32, op: u32) -> Result<LayoutData, String> {
        let (dt, s) = self.slot(slot)?;
        let r = &s.result;
        if dt.ops.is_empty() {
            return Ok(LayoutData::default());
        }
        let wanted = (op as usize).min(dt.ops.len() - 1);
        let last = r.ops_done.saturating_sub(1);
        let at = wanted.min(last);
        let layout =
            replay::layout_at(dt, r, at + 1).ok_or("no checkpoint to rebuild the layout from")?;
        // Which allocation holds each address now (the latest one, were two held there).
        let held = self
            .live
            .get_or_init(|| live::LiveIndex::build(&self.ops))
            .held_after(at);
        let mut holder: std::collections::HashMap<u64, u32> =
            std::collections::HashMap::with_capacity(held.len());
        for a in held {
            if let Some(Outcome::Served(addr)) = r.outcomes.get(a as usize) {
                holder.insert(addr, a);
            }
        }
        let mut out = LayoutData {
            op,
            clamped_to: (at < wanted).then_some(at as u32),
            ..LayoutData::default()
        };
        for seg in &layout.segments {
            let first = out.blocks.len() as u32;
            for b in &seg.blocks {
                let state = match b.state {
                    LayoutBlockState::Allocated => block_state::ALLOCATED,
                    LayoutBlockState::Free => block_state::FREE,
                    LayoutBlockState::PendingFree => block_state::PENDING_FREE,
                    LayoutBlockState::Unmapped => block_state::UNMAPPED,
                };
                let alloc = if matches!(state, block_state::ALLOCATED | block_state::PENDING_FREE) {
                    holder.get(&b.addr).copied().unwrap_or(NO_OP)
                } else {
                    NO_OP
                };
                out.blocks.push(BlockView {
                    addr: b.addr,
                    size_bytes: b.size_bytes,
                    requested_bytes: b.requested_bytes,
                    state,
                    alloc,
                });
            }
            out.segments.push(SegmentView {
                addr: seg.addr,
                size_bytes: seg.size_bytes,
                stream: seg.stream,
                pool: (seg.pool.0, seg.pool.1),
                small: seg.small,
                expandable: seg.expandable,
                first,
                count: out.blocks.len() as u32 - first,
            });
        }
        Ok(out)
    }

    fn find_address(&self, slot: u32, addr: u64) -> Result<Vec<AddressHit>, String> {
        let (_, s) = self.slot(slot)?;
        let mut hits = Vec::new();
        for (a, o) in s.result.outcomes.iter().enumerate() {
            if let Outcome::Served(base) = o {
                let size = self.ops.size_bytes(a);
                if base <= addr && addr < base + size.max(1) {
                    hits.push(AddressHit {
                        alloc: a as u32,
                        addr: base,
                        size_bytes: size,
                    });
                    if hits.len() >= 1000 {
                        break;
                    }
                }
            }
        }
        Ok(hits)
    }

    /// A search that needs nothing of the engine but the trace ([`Request::MinCapacity`],
    /// [`Request::WhatIf`], [`Request::Runtimes`]: each replays the trace a dozen to a few
    /// hundred times; [`Request::Explain`], [`Request::Bounds`], [`Request::Bands`]), as work for a host that
    /// runs it beside the engine (natively: on its own thread), so that layouts keep
    /// coming meanwhile. It emits what [`Engine::handle`] would. Any other request is
    /// handed back.
    pub fn detached(&self, req: Request) -> Result<DetachedWork, Request> {
        let (trace, device) = (self.trace.clone(), self.device);
        let cache = self.cache.clone();
        let generation = self.cache.lock().map_or(0, |c| c.generation);
        match req {
            req @ (Request::Diff { .. } | Request::Ranks { .. } | Request::Rank { .. }) => {
                Ok(Box::new(move |emit: &mut dyn FnMut(Response)| {
                    multi::handle(req, emit);
                }))
            }
            Request::MinCapacity { job, slot, spec } => {
                Ok(Box::new(move |emit: &mut dyn FnMut(Response)| {
                    let r = min_capacity_response(trace.as_deref(), device, job, slot, &spec, emit);
                    emit(r);
                }))
            }
            Request::WhatIf {
                job,
                capacity_bytes,
            } => {
                let flag = Arc::new(AtomicBool::new(false));
                if let Ok(mut c) = self.cancels.lock() {
                    c.insert(job, flag.clone());
                }
                let cancels = self.cancels.clone();
                Ok(Box::new(move |emit: &mut dyn FnMut(Response)| {
                    let r =
                        match what_if(trace.as_deref(), device, job, capacity_bytes, &flag, emit) {
                            Ok(answer) => Response::WhatIf {
                                job,
                                answer: Box::new(answer),
                            },
                            Err(message) => Response::Failed { job, message },
                        };
                    if let Ok(mut c) = cancels.lock() {
                        c.remove(&job);
                    }
                    emit(r);
                }))
            }
            Request::Runtimes {
                job,
                capacity_bytes,
            } => Ok(Box::new(move |emit: &mut dyn FnMut(Response)| {
                let r = match runtimes(trace.as_deref(), device, job, capacity_bytes, emit) {
                    Ok(rows) => Response::Runtimes { job, rows },
                    Err(message) => Response::Failed { job, message },
                };
                emit(r);
            })),
            Request::Explain {
                job,
                spec,
                capacity_bytes,
                at_event,
            } => Ok(Box::new(move |emit: &mut dyn FnMut(Response)| {
                let key = (spec, capacity_bytes, at_event);
                let kept = cache
                    .lock()
                    .ok()
                    .and_then(|c| c.explained.get(&key).cloned());
                let answer = if let Some(a) = kept {
                    Ok(a)
                } else {
                    emit(Response::Progress {
                        job,
                        stage: format!("explaining event {at_event}"),
                        fraction: 0.2,
                    });
                    explain_at(trace.as_deref(), device, &key).map(|(op, e)| {
                        let a = (op, Arc::new(e));
                        if let Ok(mut c) = cache.lock()
                            && c.generation == generation
                        {
                            if c.explained.len() >= EXPLAINED_KEPT {
                                c.explained.clear();
                            }
                            c.explained.insert(key, a.clone());
                        }
                        a
                    })
                };
                emit(match answer {
                    Ok((op_index, e)) => Response::Explained {
                        job,
                        op_index,
                        explanation: Box::new((*e).clone()),
                    },
                    Err(message) => Response::Failed { job, message },
                });
            })),
            Request::Bands { job } => {
                let (ops, live) = (Arc::clone(&self.ops), Arc::clone(&self.live));
                Ok(Box::new(move |emit: &mut dyn FnMut(Response)| {
                    // The first layout needs it as soon as the main replay is done.
                    live.get_or_init(|| live::LiveIndex::build(&ops));
                    emit(Response::Bands {
                        job,
                        bands: Arc::new(bands::build(&ops)),
                    });
                }))
            }
            Request::Bounds { job } => Ok(Box::new(move |emit: &mut dyn FnMut(Response)| {
                let kept = cache.lock().ok().and_then(|c| c.bounds);
                let r = match (kept, trace.as_deref().and_then(|t| t.devices.get(device))) {
                    (Some(bounds), _) => Response::Bounds { job, bounds },
                    (None, Some(dt)) => {
                        let bounds = offline::best_possible(dt);
                        if let Ok(mut c) = cache.lock()
                            && c.generation == generation
                        {
                            c.bounds = Some(bounds);
                        }
                        Response::Bounds { job, bounds }
                    }
                    (None, None) => Response::Failed {
                        job,
                        message: "no trace is loaded".into(),
                    },
                };
                emit(r);
            })),
            other => Err(other),
        }
    }
}

/// Work [`Engine::detached`] hands out: run it with the sink for its answers.
pub type DetachedWork = Box<dyn FnOnce(&mut dyn FnMut(Response)) + Send + 'static>;

/// A flat copy of the core's frame table.
#[must_use]
pub fn stack_table(frames: &allocsim_core::snapshot::FrameTable) -> StackTable {
    use allocsim_core::snapshot::{FrameId, StackId, StrId};
    let mut t = StackTable::default();
    let mut strings: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    let mut intern = |t: &mut StackTable, s: StrId| -> u32 {
        *strings.entry(s.0).or_insert_with(|| {
            t.strings.push(frames.str(s).to_string());
            t.strings.len() as u32 - 1
        })
    };
    for f in 0..frames.frame_count() {
        let (name, file, line) = match frames.frame(FrameId(f as u32)) {
            Some(fr) => (
                intern(&mut t, fr.name),
                intern(&mut t, fr.filename),
                fr.line,
            ),
            None => (0, 0, 0),
        };
        t.frames.push((name, file, line));
    }
    t.offsets.push(0);
    for s in 0..frames.stack_count() {
        t.frame_ids
            .extend(frames.stack(StackId(s as u32)).iter().map(|f| f.0));
        t.offsets.push(t.frame_ids.len() as u32);
    }
    t
}

/// Rows of a [`Response::CsvPiece`]: about 6 MB of CSV.
pub const CSV_PIECE_ROWS: usize = 1 << 16;

/// The options of the app's replays: the timeline without requested bytes and free holes,
/// which the app never draws (5.5 bytes an op of each replay in the browser's worker and
/// page; the CSV export replays again with them: [`Request::ExportCsv`]).
#[must_use]
pub fn drawn_replay() -> ReplayOptions {
    ReplayOptions {
        keep_requested: false,
        ..ReplayOptions::default()
    }
}

/// What the UI gets of a replay: its numbers, and its timeline moved out of `r` (no
/// copy; the engine keeps the outcomes and checkpoints that layouts need, not the
/// timeline, which nothing of the engine reads after the replay).
#[must_use]
pub fn replay_data(spec: &str, r: &mut ReplayResult) -> ReplayData {
    let oom_data = |o: &OomReport| OomData {
        event_index: o.event_index,
        op_index: o.op_index as u32,
        requested_bytes: o.requested_bytes,
        reserved_bytes: o.reserved_bytes,
        allocated_bytes: o.allocated_bytes,
        free_bytes: o.free_bytes,
        largest_free_bytes: o.largest_free_bytes,
        free_holes: o.free_holes,
        pytorch_message: o.pytorch_message.clone(),
        explanation: o.explanation.clone(),
        recorded: o.recorded,
        fatal: o.fatal,
    };
    // The op times do not go with it: they are the trace's own (the UI's ops table has
    // them).
    let timeline = std::mem::take(&mut r.timeline);
    ReplayData {
        spec: spec.to_string(),
        summary: ReplaySummary {
            allocator: r.allocator.to_string(),
            config: r.config.clone(),
            capacity_bytes: r.capacity_bytes,
            ops_done: r.ops_done as u32,
            requests: r.requests as u32,
            peak_reserved_bytes: r.peak_reserved_bytes,
            peak_allocated_bytes: r.peak_allocated_bytes,
            peak_requested_bytes: r.peak_requested_bytes,
            final_reserved_bytes: r.final_reserved_bytes,
            internal_waste_bytes_at_peak: r.internal_waste_bytes_at_peak,
            fragmentation_at_peak: r.fragmentation_at_peak,
            max_fragmentation: r.max_fragmentation,
            segment_ops: r.segment_ops,
            oom: r.oom.as_ref().map(oom_data),
            ooms: r.ooms.iter().map(oom_data).collect(),
        },
        timeline,
    }
}

#[cfg(test)]
mod tests;
