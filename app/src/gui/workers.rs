//! The browser's Web Workers beside the engine's (`io`'s `WorkerEngine`): a pool that runs
//! the ranks of a set in parallel, a rank per worker at a time, and the search worker that
//! runs "What would fit?", the other runtimes and the min-capacity searches — which Cancel
//! terminates at once (a fresh one takes the next search), so the sweep stops mid-replay
//! and the engine's worker keeps answering layouts throughout. Natively the engine runs
//! each search on its own thread and the ranks on every core: none of this is used.
//!
//! [`Host`] is the scheduling, plain logic over [`Workers`] (spawn, post, terminate, take
//! the answers), tested natively with workers that are engines on the test's thread;
//! [`web::WebWorkers`] implements [`Workers`] with Web Workers running the page's wasm
//! (`worker.js`: a worker named [`SEARCH_WORKER`] keeps a trace for searches, the others
//! answer as the engine does).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use allocsim_core::models::ModelSpec;
use allocsim_core::prefix;
use allocsim_core::whatif::{Sweep, SweptReplay};

use crate::engine::multi;
use crate::engine::parallel::CANCELLED;
use crate::engine::search::what_if_data;
use crate::engine::wire::{CRASHED, RankOutcome, Request, Response};

/// A worker, as [`Workers`] names it.
pub type WorkerId = u32;

/// The name of the search worker (`worker.js` gives it the search entry point).
pub const SEARCH_WORKER: &str = "allocsim-search";
/// The name of a worker of the ranks' pool.
pub const RANK_WORKER: &str = "allocsim-rank";

/// How soon a worker's answer wakes the page (ms): at most two frames a second while
/// workers answer, not one per answer.
pub const WAKE_AFTER_MS: u64 = 500;

/// How soon an answer of a batch the host waits on wakes the page, but for the last one
/// (at once): the sweep's progress, a frame every 2 s (each costs a software rasterizer
/// 0.15–0.3 s of the cores the replays run on).
pub const AWAITED_WAKE_AFTER_MS: u64 = 2000;

/// Wakes the page for a worker's answer `ms` from now (0: at once) with one frame. egui's
/// `request_repaint` (no delay) paints twice, "to give things time to settle": each
/// answer that woke the page at once cost a second frame of the whole window, which a
/// software rasterizer pays for with the cores the sweep's replays run on. Any delay
/// paints once, so "at once" is 1 ms.
pub fn wake(ctx: &egui::Context, ms: u64) {
    ctx.request_repaint_after(std::time::Duration::from_millis(ms.max(1)));
}

/// The jobs of the host's own [`Request::ShareTrace`]s: above any the UI numbers, and
/// exact as a JS number (the engine's worker posts the job beside the trace as one).
pub const SHARE_JOBS: u64 = 1 << 50;

/// The jobs of the host's own [`Request::SweepSizes`] asked of the engine's worker with
/// a share ([`Host::plan_request`]): above the share jobs, exact as a JS number.
pub const PLAN_JOBS: u64 = 1 << 51;

/// The largest shared trace (its encoded bytes) the search workers decode as soon as it
/// is shared, before any sweep asks for it ([`Host::shared_trace`]): each holds a decoded
/// copy. `big_gpt_long_stacks_s9` and the 1 M-event kvcache (about 11 and 45 MB at 58
/// bytes an alloc and 30 a free) are under it; the 1.12 GB snapshot's 406 MiB is not:
/// its search workers take it when a sweep starts, as before.
pub const EAGER_DECODE_MAX_BYTES: u64 = 128 << 20;

/// The most ops a trace may have for the page to ask for its share as soon as its main
/// configuration runs out of memory, ahead of the other configurations' replays
/// (`AllocsimApp::release_held_replays`): an op is at most 58 bytes of the share, so the
/// share is then no larger than [`EAGER_DECODE_MAX_BYTES`] and the search workers decode
/// it as it comes. The 1.12 GB snapshot's 14.5 M ops are over it.
pub const EARLY_SHARE_MAX_OPS: usize = (EAGER_DECODE_MAX_BYTES / 64) as usize;

/// The most workers the ranks' pool starts: each holds a wasm instance whose memory grows
/// to its rank's trace and never shrinks until the worker ends.
pub const MAX_POOL: usize = 8;

/// The size of the ranks' pool: `asked` (the page's `?workers=N`) if given, else the
/// browser's `navigator.hardwareConcurrency` (`hardware`), at least 2; at most
/// [`MAX_POOL`] either way.
#[must_use]
pub fn pool_size(hardware: Option<usize>, asked: Option<usize>) -> usize {
    match asked {
        Some(n) => n.clamp(1, MAX_POOL),
        None => hardware.unwrap_or(2).clamp(2, MAX_POOL),
    }
}

/// Workers that run the engine's requests: Web Workers in the browser.
pub trait Workers {
    /// A request as it is posted (encoded once; the web keeps it outside wasm's memory,
    /// as a load's bytes are kept for the next search worker).
    type Msg: Clone;
    fn encode(&self, req: &Request) -> Result<Self::Msg, String>;
    /// Starts a worker: a search worker (`search`) or one of the ranks' pool.
    fn spawn(&mut self, search: bool) -> Result<WorkerId, String>;
    fn post(&mut self, w: WorkerId, msg: &Self::Msg);
    /// The bytes `msg` holds (a shared trace's size).
    fn bytes(&self, msg: &Self::Msg) -> u64;
    /// Ends `w` at once, wherever it is in its work; what it sent and was not taken is
    /// dropped.
    fn terminate(&mut self, w: WorkerId);
    /// The answers that arrived since the last call, each with its worker.
    fn take(&mut self) -> Vec<(WorkerId, Response)>;
    /// The host waits on the next `answers` answers before it can act (hand out a batch,
    /// or answer): the last of them wakes the page at once, not [`WAKE_AFTER_MS`] later.
    fn awaiting(&mut self, answers: usize) {
        let _ = answers;
    }
}

/// Counts down the answers the host waits on ([`Workers::awaiting`]) as they arrive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Awaited(usize);

impl Awaited {
    #[must_use]
    pub fn new(answers: usize) -> Awaited {
        Awaited(answers)
    }

    /// An answer arrived: how soon it wakes the page (ms): at once for the last one
    /// waited on, [`AWAITED_WAKE_AFTER_MS`] before it, [`WAKE_AFTER_MS`] when none is.
    pub fn arrived(&mut self) -> u64 {
        match self.0 {
            0 => WAKE_AFTER_MS,
            1 => {
                self.0 = 0;
                0
            }
            n => {
                self.0 = n - 1;
                AWAITED_WAKE_AFTER_MS
            }
        }
    }
}

/// What the workers did, for the page's markers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Workers that answered ranks of the last set of ranks.
    pub rank_workers: usize,
    /// Search workers started and terminated (by Cancel, or a crash) so far.
    pub search_started: usize,
    pub search_terminated: usize,
    /// Search workers alive now.
    pub search_live: usize,
    /// Search workers that answered replays of the last sweep ("What would fit?").
    pub sweep_workers: usize,
    /// Sweeps whose first search worker had read the trace and sent its sizes (the
    /// replays start then): the page's timing of the read apart from the replays.
    pub sweeps_planned: usize,
    /// Traces the engine's worker shared with the search workers
    /// ([`Request::ShareTrace`]).
    pub traces_shared: usize,
}

/// A set of ranks in flight in the pool.
struct RankJob {
    job: u64,
    what_if: String,
    /// The ranks not yet posted, in file order.
    queue: VecDeque<Request>,
    /// Each busy worker's rank (index), with its file and rank number.
    busy: BTreeMap<WorkerId, (u32, String, u32)>,
    results: Vec<Option<RankOutcome>>,
    answered_by: BTreeSet<WorkerId>,
    workers: usize,
}

/// "What would fit?" in flight: `recommend`'s sweep ([`Sweep`]) whose replays run on
/// the search workers, each worker's share of a batch in one message, ranked here.
struct SweepRun {
    job: u64,
    capacity: Option<u64>,
    /// Waiting for the engine's worker to share the trace ([`Request::ShareTrace`]):
    /// nothing is posted to the search workers before it arrives.
    waiting_trace: bool,
    /// Built once the first search worker told the trace's sizes.
    sweep: Option<Sweep<SweptReplay>>,
    /// The batch being replayed and the results so far.
    batch: Vec<ModelSpec>,
    results: Vec<Option<SweptReplay>>,
    /// Each busy worker's replays (indices into `batch`) not answered yet.
    busy: BTreeMap<WorkerId, VecDeque<usize>>,
    answered_by: BTreeSet<WorkerId>,
    /// Progress: replays and candidates decided.
    done: usize,
    /// Why a replay could not be handed out (the sweep fails).
    error: Option<String>,
}

/// The search workers and what they must know first.
struct Search<M> {
    /// The last load or workload, then the device chosen (as posted to the engine).
    setup: Vec<M>,
    /// Bumped when `setup` changes.
    generation: u64,
    /// The worker that runs searches in order (and a sweep's first request), and the
    /// setup generation it was given.
    worker: Option<(WorkerId, u64)>,
    /// The others that share a sweep's replays (up to the pool's size in all).
    helpers: Vec<(WorkerId, u64)>,
    /// Searches posted and not answered yet, in order.
    in_flight: Vec<(u64, M)>,
    /// The jobs among them that are bounds ([`Host::beside`]): not wanted once another
    /// trace is opened.
    bounds: Vec<u64>,
    /// The generation whose `setup` is the trace the engine's worker shared (not the
    /// file: a search worker takes it without decoding anything).
    shared: Option<u64>,
    /// Bumped when the trace changes (a load, a workload, an open; not a device choice).
    trace: u64,
    /// The last [`Request::ShareTrace`] asked of the engine's worker: its job and the
    /// trace it shares.
    asked: Option<(u64, u64)>,
    /// The trace the engine's worker could not share: its sweeps run on the file.
    unshared: Option<u64>,
    /// The sweep's plan (the trace's request sizes, [`Request::SweepSizes`]) asked of the
    /// engine's worker with the share: its job and the trace, then the sizes for that
    /// trace (dropped when a device is chosen).
    plan_asked: Option<(u64, u64)>,
    plan: Option<(u64, Vec<u64>)>,
}

/// Routes the requests that run beside the engine's worker and gathers their answers.
pub struct Host<W: Workers> {
    workers: W,
    pool_size: usize,
    ranks: Option<RankJob>,
    search: Search<W::Msg>,
    sweep: Option<SweepRun>,
    outbox: Vec<Response>,
    counts: Counts,
}

impl<W: Workers> Host<W> {
    #[must_use]
    pub fn new(workers: W, pool_size: usize) -> Host<W> {
        Host {
            workers,
            pool_size: pool_size.max(1),
            ranks: None,
            search: Search {
                setup: Vec::new(),
                generation: 0,
                worker: None,
                helpers: Vec::new(),
                in_flight: Vec::new(),
                bounds: Vec::new(),
                shared: None,
                trace: 0,
                asked: None,
                unshared: None,
                plan_asked: None,
                plan: None,
            },
            sweep: None,
            outbox: Vec::new(),
            counts: Counts::default(),
        }
    }

    /// What the workers did so far.
    #[must_use]
    pub fn counts(&self) -> Counts {
        Counts {
            search_live: usize::from(self.search.worker.is_some()) + self.search.helpers.len(),
            ..self.counts
        }
    }

    /// Takes `req` if it runs here (a set of ranks, a search, the cancel of a search);
    /// hands back what the engine's worker must run (everything else; a load, a workload
    /// and a device choice are also kept for the search worker; a request that cannot
    /// run here, no worker starting, is handed back too).
    pub fn route(&mut self, req: Request) -> Option<Request> {
        match req {
            Request::Ranks {
                job,
                files,
                what_if,
            } => self.start_ranks(job, files, what_if),
            Request::Load { .. } | Request::Workload { .. } => {
                self.set_trace(self.workers.encode(&req).into_iter().collect());
                Some(req)
            }
            Request::SelectDevice { .. } => {
                self.search.setup.truncate(1);
                self.search.setup.extend(self.workers.encode(&req));
                // A shared trace holds every device: it stays shared.
                let shared = self.search.shared == Some(self.search.generation);
                // The plan is the other device's.
                self.search.plan_asked = None;
                self.search.plan = None;
                self.search.generation += 1;
                self.search.shared = shared.then_some(self.search.generation);
                Some(req)
            }
            Request::WhatIf {
                job,
                capacity_bytes,
            } => self.start_sweep(job, capacity_bytes),
            Request::Runtimes { .. } | Request::MinCapacity { .. } => self.post_search(req),
            Request::Cancel { job }
                if self.search.in_flight.iter().any(|(j, _)| *j == job)
                    || self.sweep.as_ref().is_some_and(|s| s.job == job) =>
            {
                self.search.in_flight.retain(|(j, _)| *j != job);
                self.sweep = None;
                self.restart_search();
                self.outbox.push(Response::Failed {
                    job,
                    message: CANCELLED.to_string(),
                });
                None
            }
            other => Some(other),
        }
    }

    /// `req` run by the search worker (with the searches, in order), not by the engine's:
    /// `None`, its answer comes from there; handed back where no search worker starts.
    fn post_search(&mut self, req: Request) -> Option<Request> {
        let Ok(msg) = self.workers.encode(&req) else {
            return Some(req);
        };
        match self.search_worker() {
            Ok(w) => {
                self.workers.post(w, &msg);
                self.search.in_flight.push((req.job(), msg));
                None
            }
            Err(e) => {
                log::warn!("cannot start a search worker ({e}): the engine runs it");
                Some(req)
            }
        }
    }

    /// The best-possible bounds ([`Request::Bounds`]) of the trace loaded last, computed by
    /// the search worker: the offline placement takes seconds of one core (3.0–3.3 s on
    /// `big_gpt_long_stacks_s9` in the browser), and the engine's worker, which answers in
    /// order, would hold the layouts asked meanwhile and the next file dropped behind it.
    /// Any other request is handed back.
    pub fn beside(&mut self, req: Request) -> Option<Request> {
        match req {
            Request::Bounds { job } => {
                let back = self.post_search(req);
                if back.is_none() {
                    self.search.bounds.push(job);
                }
                back
            }
            other => Some(other),
        }
    }

    /// A file the engine's worker opens by itself (not a [`Request`]: in the browser a
    /// `File` it reads in slices): `msg` opens it in the next search worker too.
    pub fn opening(&mut self, msg: W::Msg) {
        self.set_trace(vec![msg]);
    }

    /// What the engine's worker must run next, after what was sent to it: the trace it
    /// loads shared with the search workers ([`Request::ShareTrace`]), asked once per
    /// trace: when a sweep is about to come (`EngineHandle::prepare_search`, as the main
    /// configuration runs out of memory, ahead of the searches and explanation asked
    /// then) or when one starts.
    pub fn share_request(&mut self) -> Option<Request> {
        let asked = self.once_per_trace(self.search.asked, SHARE_JOBS)?;
        self.search.asked = Some(asked);
        Some(Request::ShareTrace { job: asked.0 })
    }

    /// The job (numbered from `base`) and trace of a request asked of the engine's worker
    /// once per trace, unless `asked` is already this trace's (or there is no trace).
    fn once_per_trace(&self, asked: Option<(u64, u64)>, base: u64) -> Option<(u64, u64)> {
        let trace = self.search.trace;
        (!self.search.setup.is_empty() && asked.is_none_or(|(_, t)| t != trace))
            .then_some((base + trace, trace))
    }

    /// Starts the search workers of the pool (up to its size), telling them nothing yet:
    /// asked with the share of a sweep about to come (`EngineHandle::prepare_search`), so
    /// that their wasm instantiates while the engine's worker encodes the trace, not after.
    pub fn start_pool(&mut self) {
        if !self.search.setup.is_empty() {
            self.fill_pool();
        }
    }

    /// Spawns the search workers missing from the pool (the first, then the helpers),
    /// told nothing yet (generation 0: [`Host::tell_pool`] or [`Host::search_worker`]
    /// tells them the setup).
    fn fill_pool(&mut self) {
        while usize::from(self.search.worker.is_some()) + self.search.helpers.len() < self.pool_size
        {
            match self.workers.spawn(true) {
                Ok(w) => {
                    self.counts.search_started += 1;
                    if self.search.worker.is_none() {
                        self.search.worker = Some((w, 0));
                    } else {
                        self.search.helpers.push((w, 0));
                    }
                }
                Err(e) => {
                    log::warn!("cannot start a search worker ({e})");
                    break;
                }
            }
        }
    }

    /// Tells every live search worker the setup it does not hold yet.
    fn tell_pool(&mut self) {
        let generation = self.search.generation;
        for (w, had) in self
            .search
            .worker
            .iter_mut()
            .chain(&mut self.search.helpers)
        {
            if *had != generation {
                for m in &self.search.setup {
                    self.workers.post(*w, m);
                }
                *had = generation;
            }
        }
    }

    /// The sweep's plan, asked of the engine's worker right ahead of its share (which it
    /// answers in order, on the device it shares): the trace's request sizes
    /// ([`Request::SweepSizes`]), so that a sweep hands out its first replays as soon as
    /// the trace is shared, not after a search worker has decoded it and sent them. Asked
    /// once per trace and device, where a trace is shared.
    pub fn plan_request(&mut self) -> Option<Request> {
        let asked = self.once_per_trace(self.search.plan_asked, PLAN_JOBS)?;
        self.search.plan_asked = Some(asked);
        Some(Request::SweepSizes { job: asked.0 })
    }

    /// Takes the engine's worker's answer to [`Host::plan_request`] (`true`: it was one,
    /// and it is not the UI's); a plan for a trace since replaced, or one that failed, is
    /// dropped.
    pub fn take_plan(&mut self, r: &Response) -> bool {
        let job = r.job();
        if !(PLAN_JOBS..PLAN_JOBS * 2).contains(&job) {
            return false;
        }
        if let Response::SweepSizes { sizes, .. } = r
            && self.search.plan_asked == Some((job, self.search.trace))
        {
            self.search.plan = Some((self.search.trace, sizes.clone()));
        }
        true
    }

    /// The engine's worker could not share the trace of job `job` (its answer failed): a
    /// sweep waiting for it runs on the file instead, each search worker decoding it.
    pub fn share_failed(&mut self, job: u64) {
        if let Some((j, trace)) = self.search.asked
            && j == job
        {
            self.search.unshared = Some(trace);
            self.launch_waiting();
        }
    }

    /// The trace the engine's worker shared ([`Response::SharedTrace`]) for job `job`, as
    /// the [`Request::SearchTrace`] `msg` that sets it in a search worker: from now on
    /// what a search worker is told first (a device chosen since still follows it); a
    /// sweep waiting for it starts. Otherwise the live search workers (those
    /// [`Host::start_pool`] started) decode it now, if it is no larger than
    /// [`EAGER_DECODE_MAX_BYTES`], so that the next sweep starts with it decoded; a larger
    /// one waits for a sweep. A trace shared for a trace since replaced is dropped.
    pub fn shared_trace(&mut self, job: u64, msg: W::Msg) {
        if self.search.setup.is_empty() || self.search.asked != Some((job, self.search.trace)) {
            return;
        }
        let eager = self.workers.bytes(&msg) <= EAGER_DECODE_MAX_BYTES;
        self.search.setup[0] = msg;
        self.search.generation += 1;
        self.search.shared = Some(self.search.generation);
        self.counts.traces_shared += 1;
        if self.sweep.as_ref().is_some_and(|s| s.waiting_trace) {
            self.launch_waiting();
        } else if eager {
            self.tell_pool();
        }
    }

    /// Starts the sweep waiting for the trace, if any.
    fn launch_waiting(&mut self) {
        if let Some(run) = self.sweep.take_if(|s| s.waiting_trace) {
            let job = run.job;
            if self.launch_sweep(run).is_some() {
                self.outbox.push(Response::Failed {
                    job,
                    message: "cannot start a search worker".to_string(),
                });
            }
        }
    }

    /// What a search worker must be told first from now on: a new trace.
    fn set_trace(&mut self, setup: Vec<W::Msg>) {
        self.search.setup = setup;
        self.search.generation += 1;
        self.search.trace += 1;
        // The old trace's bounds are not wanted any more (their answer would be dropped):
        // they fail, and a search worker busy only with them stops.
        for job in std::mem::take(&mut self.search.bounds) {
            if let Some(k) = self.search.in_flight.iter().position(|(j, _)| *j == job) {
                self.search.in_flight.remove(k);
                self.outbox.push(Response::Failed {
                    job,
                    message: "another file was opened".into(),
                });
            }
        }
        // Idle search workers hold the old trace: let their memory go.
        if self.search.in_flight.is_empty() && self.sweep.is_none() {
            if let Some((w, _)) = self.search.worker.take() {
                self.workers.terminate(w);
            }
            for (w, _) in std::mem::take(&mut self.search.helpers) {
                self.workers.terminate(w);
            }
        }
    }

    /// The answers that arrived (ranks gathered into one answer).
    pub fn poll(&mut self) -> Vec<Response> {
        for (w, r) in self.workers.take() {
            if self.ranks.as_ref().is_some_and(|j| j.busy.contains_key(&w)) {
                self.on_rank_answer(w, r);
            } else if self.sweep.as_ref().is_some_and(|s| s.job == r.job())
                && self.is_search_worker(w)
            {
                self.on_sweep_answer(w, r);
            } else if self.search.worker.is_some_and(|(s, _)| s == w) {
                self.on_search_answer(r);
            }
        }
        std::mem::take(&mut self.outbox)
    }

    /// The search worker, started and told the trace if needed.
    fn search_worker(&mut self) -> Result<WorkerId, String> {
        let (w, had) = if let Some(s) = self.search.worker {
            s
        } else {
            let w = self.workers.spawn(true)?;
            self.counts.search_started += 1;
            (w, 0)
        };
        if had != self.search.generation {
            for m in &self.search.setup {
                self.workers.post(w, m);
            }
        }
        self.search.worker = Some((w, self.search.generation));
        Ok(w)
    }

    /// Terminates every search worker at once; the searches still in flight go to a
    /// fresh one.
    fn restart_search(&mut self) {
        let helpers = std::mem::take(&mut self.search.helpers);
        for w in self.search.worker.take().into_iter().chain(helpers) {
            self.workers.terminate(w.0);
            self.counts.search_terminated += 1;
        }
        if self.search.in_flight.is_empty() {
            return;
        }
        match self.search_worker() {
            Ok(w) => {
                for (_, m) in &self.search.in_flight {
                    self.workers.post(w, m);
                }
            }
            Err(e) => {
                for (job, _) in std::mem::take(&mut self.search.in_flight) {
                    self.outbox.push(Response::Failed {
                        job,
                        message: format!("cannot start a search worker: {e}"),
                    });
                }
            }
        }
    }

    fn is_search_worker(&self, w: WorkerId) -> bool {
        self.search.worker.is_some_and(|(s, _)| s == w)
            || self.search.helpers.iter().any(|(h, _)| *h == w)
    }

    /// "What would fit?": unless the search workers hold the trace the engine's worker
    /// shared, it is asked for first ([`Request::ShareTrace`], handed back to run there);
    /// then the search worker is asked for the trace's sizes (the sweep's plan);
    /// meanwhile the other workers of the pool start and take the trace; then the
    /// sweep's replays go to all of them, each worker's share of a batch in one message.
    /// A sweep still running is cancelled: its replays are in the workers' queues.
    fn start_sweep(&mut self, job: u64, capacity: Option<u64>) -> Option<Request> {
        if let Some(old) = self.sweep.take() {
            self.restart_search();
            self.outbox.push(Response::Failed {
                job: old.job,
                message: CANCELLED.to_string(),
            });
        }
        let waiting_trace = !self.search.setup.is_empty()
            && self.search.shared != Some(self.search.generation)
            && self.search.unshared != Some(self.search.trace);
        let run = SweepRun {
            job,
            capacity,
            waiting_trace,
            sweep: None,
            batch: Vec::new(),
            results: Vec::new(),
            busy: BTreeMap::new(),
            answered_by: BTreeSet::new(),
            done: 0,
            error: None,
        };
        if waiting_trace {
            self.outbox.push(Response::Progress {
                job,
                stage: "what would fit: sharing the trace with the search workers".into(),
                fraction: 0.0,
            });
            self.sweep = Some(run);
            // Asked already (as the trace was sent) unless it was not.
            return self.share_request();
        }
        self.launch_sweep(run).map(|()| Request::WhatIf {
            job,
            capacity_bytes: capacity,
        })
    }

    /// Starts `run` on the search workers; `Some(())` if none could start (the engine's
    /// worker runs the sweep instead).
    fn launch_sweep(&mut self, mut run: SweepRun) -> Option<()> {
        run.waiting_trace = false;
        let job = run.job;
        let Ok(msg) = self.workers.encode(&Request::SweepSizes { job }) else {
            return Some(());
        };
        let trace = self.search.trace;
        let plan = (self.search.plan.as_ref())
            .filter(|(t, _)| *t == trace)
            .map(|(_, sizes)| Sweep::of_sizes(sizes, run.capacity));
        match self.search_worker() {
            // The plan the engine's worker sent: the replays start at once.
            Ok(_) if plan.is_some() => {}
            Ok(w) => {
                self.workers.post(w, &msg);
                // The plan: the replays start once it is here.
                self.workers.awaiting(1);
            }
            Err(e) => {
                log::warn!("cannot start a search worker ({e}): the engine runs it");
                return Some(());
            }
        }
        // The helpers: started (or told the new trace) now, so they read it while the
        // first worker works out the plan.
        self.fill_pool();
        self.tell_pool();
        self.outbox.push(Response::Progress {
            job,
            stage: format!(
                "what would fit: reading the trace in {} search workers",
                self.search.helpers.len() + 1
            ),
            fraction: 0.0,
        });
        if plan.is_some() {
            run.sweep = plan;
            self.counts.sweeps_planned += 1;
            self.next_sweep_batch(run);
        } else {
            self.sweep = Some(run);
        }
        None
    }

    fn on_sweep_answer(&mut self, w: WorkerId, r: Response) {
        let Some(mut run) = self.sweep.take() else {
            return;
        };
        match r {
            Response::SweepSizes { sizes, .. } if run.sweep.is_none() => {
                run.sweep = Some(Sweep::of_sizes(&sizes, run.capacity));
                self.counts.sweeps_planned += 1;
                self.next_sweep_batch(run);
            }
            Response::SweepReplayed { index, result, .. } => {
                let index = index as usize;
                // A worker answers its share in the order its replays end (those that
                // share a prefix end by where they fork).
                let Some((queue, at)) = run
                    .busy
                    .get_mut(&w)
                    .and_then(|q| q.iter().position(|&i| i == index).map(|at| (q, at)))
                else {
                    self.sweep = Some(run);
                    return;
                };
                queue.remove(at);
                run.answered_by.insert(w);
                run.results[index] = Some(result);
                if run.sweep.as_ref().is_some_and(Sweep::counts_progress) {
                    run.done += 1;
                    self.sweep_progress(&run);
                }
                if run.results.iter().all(Option::is_some) {
                    self.give_batch(run);
                } else {
                    self.keep_sweep(run);
                }
            }
            Response::Failed { job, message } => {
                // A replay that failed fails the sweep (as `recommend` does); a worker
                // that crashed cannot run again: every search worker starts afresh.
                self.restart_search();
                self.outbox.push(Response::Failed { job, message });
            }
            _ => self.sweep = Some(run),
        }
    }

    /// The results of the batch in flight to the sweep, then its next batch.
    fn give_batch(&mut self, mut run: SweepRun) {
        let Some(sweep) = run.sweep.as_mut() else {
            return;
        };
        let results = std::mem::take(&mut run.results)
            .into_iter()
            .flatten()
            .collect();
        if let Err(e) = sweep.give(results) {
            self.outbox.push(Response::Failed {
                job: run.job,
                message: e.to_string(),
            });
            return;
        }
        self.next_sweep_batch(run);
    }

    /// Hands the sweep's next batch to every search worker, or answers once it is ranked.
    fn next_sweep_batch(&mut self, mut run: SweepRun) {
        let Some(sweep) = run.sweep.as_mut() else {
            return;
        };
        let batch = sweep.next_batch();
        if batch.is_empty() {
            let answer = run.sweep.take().map(Sweep::finish);
            self.counts.sweep_workers = run.answered_by.len();
            self.outbox.push(match answer {
                Some(Ok(rec)) => Response::WhatIf {
                    job: run.job,
                    answer: Box::new(what_if_data(run.capacity, &rec)),
                },
                Some(Err(e)) => Response::Failed {
                    job: run.job,
                    message: e.to_string(),
                },
                None => return,
            });
            return;
        }
        self.sweep_progress(&run);
        run.results = vec![None; batch.len()];
        run.batch = batch;
        let workers: Vec<WorkerId> = (self.search.worker.iter())
            .chain(&self.search.helpers)
            .map(|(w, _)| *w)
            .collect();
        // The parts that share a replay's prefix, the largest first, dealt out in turn.
        let mut shares: Vec<Vec<usize>> = vec![Vec::new(); workers.len()];
        for (k, part) in prefix::share(&run.batch, workers.len())
            .into_iter()
            .enumerate()
        {
            shares[k % workers.len().max(1)].extend(part);
        }
        for (w, share) in workers.iter().zip(shares) {
            self.post_share(&mut run, *w, share);
        }
        // One answer per replay; the last one hands out the next batch or the answer.
        self.workers.awaiting(run.batch.len());
        self.keep_sweep(run);
    }

    /// Keeps `run` in flight, or fails it if a replay could not be handed out.
    fn keep_sweep(&mut self, mut run: SweepRun) {
        match run.error.take() {
            None => self.sweep = Some(run),
            Some(message) => {
                self.restart_search();
                self.outbox.push(Response::Failed {
                    job: run.job,
                    message,
                });
            }
        }
    }

    /// Worker `w`'s share of the batch (`indices`: core's `prefix::share`, the settings
    /// that share a replay's prefix kept together, shares of about the same size), in one
    /// message: it never waits for the page to hand it the next one.
    fn post_share(&mut self, run: &mut SweepRun, w: WorkerId, indices: Vec<usize>) {
        if indices.is_empty() {
            return;
        }
        let req = Request::SweepReplays {
            job: run.job,
            indices: indices.iter().map(|&i| i as u32).collect(),
            specs: indices.iter().map(|&i| run.batch[i].clone()).collect(),
            capacity_bytes: run.capacity,
        };
        match self.workers.encode(&req) {
            Ok(msg) => {
                self.workers.post(w, &msg);
                run.busy.entry(w).or_default().extend(indices);
            }
            Err(e) => run.error = Some(e),
        }
    }

    fn sweep_progress(&mut self, run: &SweepRun) {
        let total = run.sweep.as_ref().map_or(1, Sweep::progress_total);
        let done = run.done.min(total);
        self.outbox.push(Response::Progress {
            job: run.job,
            stage: format!(
                "what would fit: {done} of {total} settings replayed on {} workers",
                self.search.helpers.len() + 1
            ),
            fraction: done as f32 / total.max(1) as f32,
        });
    }

    fn on_search_answer(&mut self, r: Response) {
        let job = r.job();
        if !self.search.in_flight.iter().any(|(j, _)| *j == job) {
            // The setup's answers (the engine's worker gives those), or a cancelled job's.
            return;
        }
        let crashed =
            matches!(&r, Response::Failed { message, .. } if message.starts_with(CRASHED));
        if !matches!(r, Response::Progress { .. }) {
            self.search.in_flight.retain(|(j, _)| *j != job);
        }
        self.outbox.push(r);
        if crashed {
            // A wasm instance that panicked cannot run again.
            self.restart_search();
        }
    }

    fn start_ranks(
        &mut self,
        job: u64,
        files: Vec<crate::engine::wire::NamedBytes>,
        what_if: String,
    ) -> Option<Request> {
        if let Some(old) = self.ranks.take() {
            for w in old.busy.keys() {
                self.workers.terminate(*w);
            }
        }
        let n = files.len();
        let mut spawned = Vec::new();
        for _ in 0..self.pool_size.min(n) {
            match self.workers.spawn(false) {
                Ok(w) => spawned.push(w),
                Err(e) => {
                    log::warn!("cannot start a rank worker ({e})");
                    break;
                }
            }
        }
        if spawned.is_empty() && n > 0 {
            return Some(Request::Ranks {
                job,
                files,
                what_if,
            });
        }
        self.outbox.push(Response::Progress {
            job,
            stage: format!("replaying {n} ranks on {} workers", spawned.len()),
            fraction: 0.05,
        });
        let mut j = RankJob {
            job,
            queue: multi::split_ranks(job, files, &what_if).into(),
            what_if,
            busy: BTreeMap::new(),
            results: vec![None; n],
            answered_by: BTreeSet::new(),
            workers: spawned.len(),
        };
        for w in spawned {
            self.next_rank(&mut j, w);
        }
        self.finish_ranks(j);
        None
    }

    /// Posts the next rank to `w`, or ends `w` when none is left.
    fn next_rank(&mut self, j: &mut RankJob, w: WorkerId) {
        while let Some(req) = j.queue.pop_front() {
            let Request::Rank {
                index,
                rank,
                ref file,
                ..
            } = req
            else {
                continue;
            };
            match self.workers.encode(&req) {
                Ok(msg) => {
                    j.busy.insert(w, (index, file.name.clone(), rank));
                    self.workers.post(w, &msg);
                    return;
                }
                Err(e) => j.results[index as usize] = Some(failure(&file.name, rank, e)),
            }
        }
        self.workers.terminate(w);
    }

    fn on_rank_answer(&mut self, w: WorkerId, r: Response) {
        let Some(mut j) = self.ranks.take() else {
            return;
        };
        let done = match r {
            Response::RankDone { index, outcome, .. } => Some((index, *outcome, false)),
            Response::Failed { message, .. } => j
                .busy
                .get(&w)
                .map(|(index, file, rank)| (*index, failure(file, *rank, message), true)),
            _ => None,
        };
        if let Some((index, outcome, crashed)) = done
            && j.busy.remove(&w).is_some()
        {
            if let Some(slot) = j.results.get_mut(index as usize) {
                *slot = Some(outcome);
            }
            j.answered_by.insert(w);
            let finished = j.results.iter().filter(|r| r.is_some()).count();
            self.outbox.push(Response::Progress {
                job: j.job,
                stage: format!(
                    "ranks: {finished} of {} replayed on {} workers",
                    j.results.len(),
                    j.workers
                ),
                fraction: finished as f32 / j.results.len().max(1) as f32,
            });
            let next = if crashed {
                // A wasm instance that panicked cannot run again: a fresh one goes on.
                self.workers.terminate(w);
                if j.queue.is_empty() {
                    None
                } else {
                    self.workers.spawn(false).ok()
                }
            } else {
                Some(w)
            };
            if let Some(w) = next {
                self.next_rank(&mut j, w);
            }
        }
        self.finish_ranks(j);
    }

    /// Gathers the set once every rank answered; else keeps it in flight.
    fn finish_ranks(&mut self, mut j: RankJob) {
        if j.busy.is_empty() && !j.queue.is_empty() {
            // No worker left (none could be started again): the rest fail.
            for req in std::mem::take(&mut j.queue) {
                if let Request::Rank {
                    index, rank, file, ..
                } = req
                {
                    j.results[index as usize] = Some(failure(
                        &file.name,
                        rank,
                        "no worker could run it".to_string(),
                    ));
                }
            }
        }
        if j.results.iter().all(Option::is_some) {
            self.counts.rank_workers = j.answered_by.len();
            let results = j.results.into_iter().flatten().collect();
            self.outbox.push(Response::Ranked {
                job: j.job,
                data: Box::new(multi::gather_ranks(results, &j.what_if)),
            });
        } else {
            self.ranks = Some(j);
        }
    }
}

fn failure(file: &str, rank: u32, error: String) -> RankOutcome {
    RankOutcome {
        row: Err(allocsim_core::ranks::RankFailure {
            file: file.to_string(),
            rank,
            error,
        }),
        devices: 0,
    }
}

#[cfg(target_arch = "wasm32")]
#[path = "workers_web.rs"]
pub mod web;

#[cfg(test)]
#[path = "workers_tests.rs"]
mod tests;
