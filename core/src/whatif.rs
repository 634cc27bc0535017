//! What-if answers (DESIGN.md): the same trace under several allocators or configs
//! (`compare`), the smallest device that runs it (`min_capacity`), and the PyTorch settings
//! that serve it best at a given capacity (`recommend`). OOM explanations name the models or
//! configs that would have fit.
//!
//! Every function reports progress through a callback `(done, total)`, so a front end can
//! draw a bar; core itself has no threads and no terminal.

use crate::models::pytorch::{PyTorchConfig, PyTorchModel};
use crate::models::{AllocatorKind, ModelSpec};
use crate::replay::{ReplayOptions, ReplayResult};
use crate::trace::Trace;
use crate::{Error, QueryError};
use crate::{prefix, session};

/// The capacity grid of `min_capacity`: 2 MiB.
pub const GRID_BYTES: u64 = 2 << 20;

/// The options of a what-if replay: no checkpoints, no timeline (only the summary).
#[must_use]
pub fn summary_options() -> ReplayOptions {
    ReplayOptions {
        checkpoint_every: 0,
        max_checkpoints: 0,
        check_every: 0,
        keep_timeline: false,
        keep_requested: false,
        preloaded: false,
    }
}

/// Whether a replay ran the whole trace: no OOM of its own (OOMs the recording also had
/// do not count: the program went on). `min_capacity`'s notion.
#[must_use]
pub fn fits(r: &ReplayResult) -> bool {
    r.oom.as_ref().is_none_or(|o| !o.fatal)
}

/// Whether a replay served every request: no OOM at all, not even where the recording
/// failed. `compare`'s and `recommend`'s notion: the allocator would have avoided the OOM.
#[must_use]
pub fn served_all(r: &ReplayResult) -> bool {
    r.oom.is_none()
}

fn label(r: &ReplayResult) -> String {
    if r.config.is_empty() {
        r.allocator.to_string()
    } else {
        format!("{}@{}", r.allocator, r.config)
    }
}

/// Appends to an OOM explanation which of `fitting` would have served every request, or
/// `if_none` when none would.
fn note_fits(r: &mut ReplayResult, fitting: &[String], if_none: &str) {
    if let Some(o) = r.oom.as_mut() {
        let note = if fitting.is_empty() {
            format!("; {if_none}")
        } else {
            format!("; would have fit: {}", fitting.join(", "))
        };
        o.explanation.push_str(&note);
    }
}

/// Replays device `device` of `trace` through every spec under `capacity`, one after the
/// other ([`compare_with`] runs them on a [`Runner`]). Each OOM's explanation ends with the
/// compared models that served every request.
pub fn compare(
    trace: &Trace,
    device: usize,
    specs: &[ModelSpec],
    capacity: Option<u64>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<ReplayResult>, Error> {
    compare_with(trace, device, specs, capacity, &InOrder, progress)
}

/// [`compare`] on `runner`.
pub fn compare_with(
    trace: &Trace,
    device: usize,
    specs: &[ModelSpec],
    capacity: Option<u64>,
    runner: &dyn Runner,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<ReplayResult>, Error> {
    let total = specs.len();
    let mut done = 0;
    progress(0, total);
    let job =
        |i: usize| session::replay_device(trace, device, &specs[i], capacity, summary_options());
    let mut results = runner
        .run(total, &job, &mut || {
            done += 1;
            progress(done, total);
        })
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let fitting: Vec<String> = results
        .iter()
        .filter(|r| served_all(r))
        .map(label)
        .collect();
    for r in &mut results {
        note_fits(r, &fitting, "no compared allocator would have fit");
    }
    Ok(results)
}

/// The answer of [`min_capacity`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinCapacity {
    /// The model, as the CLI names it.
    pub allocator: &'static str,
    /// Its effective configuration (canonical string).
    pub config: String,
    /// C on the 2 MiB grid: a replay at C serves every request (no OOM at all, not even
    /// where the recording failed), one at C − 2 MiB does not (or C is the grid's first
    /// point, 2 MiB).
    pub min_capacity_bytes: u64,
    /// Peak reserved memory of the replay with no capacity.
    pub unlimited_peak_reserved_bytes: u64,
    /// Replays run (the unlimited one included).
    pub replays: usize,
}

/// The smallest capacity on a 2 MiB grid at which every request is served ([`served_all`]:
/// OOMs the recording also had count too, so a replay at the recorded capacity and this
/// answer never disagree): bisection between 2 MiB and the unlimited replay's peak reserved
/// memory (rounded up to the grid). The bisection keeps a failing lower and a serving upper
/// point, so the answer serves all at C and fails at C − 2 MiB even for models whose fit
/// is not monotonic in the capacity.
pub fn min_capacity(
    trace: &Trace,
    device: usize,
    spec: &ModelSpec,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<MinCapacity, Error> {
    let unlimited = session::replay_device(trace, device, spec, None, summary_options())?;
    let peak = unlimited.peak_reserved_bytes;
    let (allocator, config) = (unlimited.allocator, unlimited.config.clone());
    if !served_all(&unlimited) {
        return Err(Error::Query(QueryError::OomWithoutCapacity {
            label: label(&unlimited),
            explanation: unlimited.oom.map(|o| o.explanation).unwrap_or_default(),
        }));
    }
    let mut replays = 1;
    let mut hi = peak.div_ceil(GRID_BYTES).max(1);
    progress(1, 2);
    let fits_at = |k: u64, replays: &mut usize| -> Result<bool, Error> {
        *replays += 1;
        let r =
            session::replay_device(trace, device, spec, Some(k * GRID_BYTES), summary_options())?;
        Ok(served_all(&r))
    };
    // The unlimited peak should fit; a model sized from the capacity (a preallocated
    // fraction) may need more: double until it fits, up to 2^40 grid points.
    while !fits_at(hi, &mut replays)? {
        if hi >= 1 << 40 {
            return Err(Error::Query(QueryError::FitsNowhere {
                label: spec.label(),
                limit_bytes: hi * GRID_BYTES,
            }));
        }
        hi *= 2;
    }
    // What is left: the first grid point, then one replay per halving of the range.
    let total = replays + 1 + (64 - hi.leading_zeros()) as usize;
    progress(replays, total);
    if hi == 1 || fits_at(1, &mut replays)? {
        return Ok(MinCapacity {
            allocator,
            config,
            min_capacity_bytes: GRID_BYTES,
            unlimited_peak_reserved_bytes: peak,
            replays,
        });
    }
    let mut lo = 1;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits_at(mid, &mut replays)? {
            hi = mid;
        } else {
            lo = mid;
        }
        progress(replays, total.max(replays));
    }
    Ok(MinCapacity {
        allocator,
        config,
        min_capacity_bytes: hi * GRID_BYTES,
        unlimited_peak_reserved_bytes: peak,
        replays,
    })
}

/// The PyTorch configs `recommend` sweeps (DESIGN.md): `expandable_segments` off/on ×
/// `max_split_size_mb` unset or 32…1024 × `roundup_power2_divisions` 0/2/4/8 ×
/// `garbage_collection_threshold` unset/0.6/0.8, as config strings on top of PyTorch's
/// defaults (the keys in that order; defaults left out).
#[must_use]
pub fn recommend_candidates() -> Vec<String> {
    let mut out = Vec::new();
    for expandable in [false, true] {
        for split in [
            None,
            Some(32),
            Some(64),
            Some(128),
            Some(256),
            Some(512),
            Some(1024),
        ] {
            for div in [0, 2, 4, 8] {
                for gc in [None, Some("0.6"), Some("0.8")] {
                    let mut parts = Vec::new();
                    if expandable {
                        parts.push("expandable_segments:True".to_string());
                    }
                    if let Some(s) = split {
                        parts.push(format!("max_split_size_mb:{s}"));
                    }
                    if div > 0 {
                        parts.push(format!("roundup_power2_divisions:{div}"));
                    }
                    if let Some(g) = gc {
                        parts.push(format!("garbage_collection_threshold:{g}"));
                    }
                    out.push(parts.join(","));
                }
            }
        }
    }
    out
}

/// Runs independent replays, in parallel where the caller can: core has no threads, so a
/// front end with them (the CLI, the desktop app) passes its own.
pub trait Runner {
    /// Calls `job(i)` for every `i` in `0..n` and returns the results in that order,
    /// calling `done()` once after each job finishes.
    fn run(
        &self,
        n: usize,
        job: &(dyn Fn(usize) -> Result<ReplayResult, Error> + Sync),
        done: &mut dyn FnMut(),
    ) -> Vec<Result<ReplayResult, Error>>;

    /// Calls `job(i)` for every `i` in `0..n`, each answering several replays, and returns
    /// the answers in that order, calling `done(i)` once after job `i` finishes. One
    /// after the other unless the runner says otherwise.
    fn run_groups(
        &self,
        n: usize,
        job: &(dyn Fn(usize) -> Result<Vec<ReplayResult>, Error> + Sync),
        done: &mut dyn FnMut(usize),
    ) -> Vec<Result<Vec<ReplayResult>, Error>> {
        in_order(n, job, done)
    }

    /// How many jobs it runs at once.
    fn width(&self) -> usize {
        1
    }
}

/// One job after the other, on the calling thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct InOrder;

impl Runner for InOrder {
    fn run(
        &self,
        n: usize,
        job: &(dyn Fn(usize) -> Result<ReplayResult, Error> + Sync),
        done: &mut dyn FnMut(),
    ) -> Vec<Result<ReplayResult, Error>> {
        in_order(n, job, &mut |_| done())
    }
}

/// `job(i)` for every `i` in `0..n` on the calling thread, `done(i)` after each.
fn in_order<T>(n: usize, job: &dyn Fn(usize) -> T, done: &mut dyn FnMut(usize)) -> Vec<T> {
    (0..n)
        .map(|i| {
            let r = job(i);
            done(i);
            r
        })
        .collect()
}

/// The answer of [`recommend`] (or of a [`Sweep`] run anywhere, with the results `R` it
/// was given).
#[derive(Debug)]
pub struct Recommendation<R = ReplayResult> {
    /// The snapshot's own settings (`pytorch` without `--config`).
    pub default: R,
    /// The best candidate by [`rank`]: serves every request, then least predicted driver
    /// time, then lowest peak reserved, then the shortest config string.
    pub best: R,
    /// The best few candidates in rank order (the best first): the trade-off table.
    pub tradeoffs: Vec<R>,
    /// Candidates swept (every valid config of [`recommend_candidates`]).
    pub candidates_tried: usize,
    /// Of those, the ones replayed; the others behave exactly like one that was (a
    /// setting that cannot act on this trace) and share its result.
    pub candidates_replayed: usize,
    /// Candidates that served every request.
    pub candidates_fitting: usize,
}

/// How many candidates the trade-off table shows.
pub const TRADEOFF_ROWS: usize = 5;

/// A candidate's place in [`rank`]'s order (smaller is better).
pub type Rank = (u8, usize, u64, u64, usize, String);

/// The order of candidates: those that serve every request first, then those with no OOM
/// of their own, then those that got furthest; then the least predicted driver time
/// (nanoseconds), the lowest peak reserved, the shortest config, and the config itself for
/// a total order.
#[must_use]
pub fn rank(r: &ReplayResult) -> Rank {
    SweptReplay::from(r).rank()
}

/// What a sweep needs of a replay: its place in [`rank`]'s order, whether it served every
/// request, its peak, and the default's OOM explanation to complete. [`ReplayResult`]
/// (replayed where the sweep runs) and [`SweptReplay`] (posted from elsewhere, e.g. the
/// browser's search workers) are both.
pub trait Swept: Clone {
    fn swept(&self) -> SweptReplay;
    /// [`note_fits`] on the replay's OOM explanation, where it keeps one.
    fn note_fits(&mut self, fitting: &[String], if_none: &str);
    /// This replay as the replay of another setting of the same [`Effect`] (`config`: its
    /// canonical string) would be, where what is kept of it is only what the two decide
    /// alike and the setting's name; None where it keeps more (the setting is replayed
    /// under its own name then).
    fn renamed(&self, config: String) -> Option<Self>;
}

/// What a sweep keeps of one replay: enough to rank it and to show it in a trade-off
/// table. Plain data, to cross to another thread or worker.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweptReplay {
    /// The effective configuration (canonical string).
    pub config: String,
    pub ops_done: u64,
    pub peak_reserved_bytes: u64,
    pub segment_ops: u64,
    pub synchronizing_ops: u64,
    pub driver_time_us: f64,
    /// The first request not served: its event, and whether the program would have died
    /// there (the recording did not fail there too).
    pub oom: Option<(u64, bool)>,
}

impl SweptReplay {
    /// Whether it served every request ([`served_all`]).
    #[must_use]
    pub fn served_all(&self) -> bool {
        self.oom.is_none()
    }

    /// Its place in [`rank`]'s order.
    #[must_use]
    pub fn rank(&self) -> Rank {
        let class = match self.oom {
            None => 0,
            Some((_, false)) => 1,
            Some((_, true)) => 2,
        };
        (
            class,
            usize::MAX - self.ops_done as usize,
            (self.driver_time_us * 1000.0).round() as u64,
            self.peak_reserved_bytes,
            self.config.len(),
            self.config.clone(),
        )
    }
}

impl From<&ReplayResult> for SweptReplay {
    fn from(r: &ReplayResult) -> SweptReplay {
        SweptReplay {
            config: r.config.clone(),
            ops_done: r.ops_done as u64,
            peak_reserved_bytes: r.peak_reserved_bytes,
            segment_ops: r.segment_ops,
            synchronizing_ops: r.driver.synchronizing,
            driver_time_us: r.driver.driver_time_us,
            oom: r.oom.as_ref().map(|o| (o.event_index, o.fatal)),
        }
    }
}

impl Swept for ReplayResult {
    fn swept(&self) -> SweptReplay {
        SweptReplay::from(self)
    }
    fn note_fits(&mut self, fitting: &[String], if_none: &str) {
        note_fits(self, fitting, if_none);
    }
    fn renamed(&self, _: String) -> Option<Self> {
        // Its OOM explanation, layout and the rest are the replay's own: replayed.
        None
    }
}

impl Swept for SweptReplay {
    fn swept(&self) -> SweptReplay {
        self.clone()
    }
    fn note_fits(&mut self, _: &[String], _: &str) {}
    fn renamed(&self, config: String) -> Option<Self> {
        // Every other field is what the replay decided (peak, segment and synchronizing
        // ops, driver time, first OOM), which a setting of the same effect decides alike.
        Some(SweptReplay {
            config,
            ..self.clone()
        })
    }
}

/// What a PyTorch config does on one trace: two configs with the same effect replay the
/// same. `max_split_size_mb` above every block the trace can make (without expandable
/// segments: every segment is a request's allocation size) acts like no limit;
/// `roundup_power2_divisions` act only through the block sizes they round the trace's
/// requests to (`round_size` is the only place the model reads them), so two settings
/// that round every request alike act alike; `garbage_collection_threshold` without a
/// capacity never runs.
#[derive(Debug, Clone, PartialEq)]
struct Effect {
    expandable: bool,
    split: u64,
    /// The rounded size of each of the trace's sizes, where any differs from the rounding
    /// without divisions (None: none does).
    rounded: Option<Vec<u64>>,
    gc: Option<String>,
}

fn effect(cfg: &PyTorchConfig, sizes: &[u64], capacity: Option<u64>, gc: Option<&str>) -> Effect {
    let model = PyTorchModel::new(cfg.clone(), None);
    let mut plain_cfg = cfg.clone();
    plain_cfg.roundup_power2_divisions = [0; 16];
    let plain = PyTorchModel::new(plain_cfg, None);
    let rounded: Vec<u64> = sizes.iter().map(|&s| model.round_size(s)).collect();
    let rounds_alike = sizes
        .iter()
        .zip(&rounded)
        .all(|(&s, &r)| r == plain.round_size(s));
    let largest_segment = rounded
        .iter()
        .map(|&r| model.allocation_size(r))
        .max()
        .unwrap_or(0);
    let split = if !cfg.expandable_segments && cfg.max_split_size_bytes > largest_segment {
        u64::MAX
    } else {
        cfg.max_split_size_bytes
    };
    Effect {
        expandable: cfg.expandable_segments,
        split,
        rounded: (!rounds_alike).then_some(rounded),
        gc: capacity.and(gc.map(str::to_string)),
    }
}

/// The distinct sizes a trace asks for, and those of the segments alive when it starts (a
/// wrapped trace's): what [`effect`] needs to know of a trace.
fn block_sizes(dt: &crate::trace::DeviceTrace) -> Vec<u64> {
    let mut sizes: Vec<u64> = dt
        .ops
        .iter()
        .filter_map(|o| match o.kind {
            crate::trace::OpKind::Alloc { size_bytes, .. } => Some(size_bytes),
            _ => None,
        })
        .chain(dt.start.iter().map(|seg| seg.size_bytes))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// What a [`Sweep`] needs to know of device `device` of `trace`: the distinct sizes it
/// asks for and those of its start segments.
pub fn sweep_sizes(trace: &Trace, device: usize) -> Result<Vec<u64>, Error> {
    trace
        .devices
        .get(device)
        .map(block_sizes)
        .ok_or(Error::Query(QueryError::NoDevice { device }))
}

/// Sweeps [`recommend_candidates`] at `capacity` (None: unlimited) and picks the best, one
/// replay after the other ([`recommend_with`] runs them on a [`Runner`]).
pub fn recommend(
    trace: &Trace,
    device: usize,
    capacity: Option<u64>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Recommendation, Error> {
    recommend_with(trace, device, capacity, &InOrder, progress)
}

/// Sweeps [`recommend_candidates`] at `capacity` (None: unlimited) on `runner` and picks
/// the best by [`rank`]: a [`Sweep`] whose batches run on `runner`. Progress counts the
/// default, each distinct replay and each candidate decided without one.
pub fn recommend_with(
    trace: &Trace,
    device: usize,
    capacity: Option<u64>,
    runner: &dyn Runner,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Recommendation, Error> {
    let mut sweep = Sweep::new(trace, device, capacity)?;
    let total = sweep.progress_total();
    let mut done = 0;
    progress(done, total);
    loop {
        let specs = sweep.next_batch();
        if specs.is_empty() {
            break;
        }
        let counted = sweep.counts_progress();
        let results = replay_shared(trace, device, &specs, capacity, runner, &mut |n| {
            if counted {
                done += n;
                progress(done, total);
            }
        })?;
        sweep.give(results)?;
    }
    sweep.finish()
}

/// Replays `specs` on `runner` in as many groups as it runs at once (or as the settings
/// have roots, [`prefix::share`]), each group's settings sharing their prefixes
/// ([`prefix::replay_sharing`]): the results in `specs`' order, each the one a replay
/// from the start gives; `done(n)` as a group of `n` finishes.
pub fn replay_shared(
    trace: &Trace,
    device: usize,
    specs: &[ModelSpec],
    capacity: Option<u64>,
    runner: &dyn Runner,
    done: &mut dyn FnMut(usize),
) -> Result<Vec<ReplayResult>, Error> {
    let groups = prefix::share(specs, runner.width());
    let job = |g: usize| -> Result<Vec<ReplayResult>, Error> {
        let group = &groups[g];
        let mine: Vec<ModelSpec> = group.iter().map(|&i| specs[i].clone()).collect();
        let mut out: Vec<Option<Result<ReplayResult, Error>>> =
            group.iter().map(|_| None).collect();
        prefix::replay_sharing(
            trace,
            device,
            &mine,
            capacity,
            summary_options(),
            &mut |i, _, r| {
                out[i] = Some(r);
            },
        )?;
        out.into_iter()
            .map(|r| r.unwrap_or(Err(Error::Query(QueryError::ThreadStopped))))
            .collect()
    };
    let answers = runner.run_groups(groups.len(), &job, &mut |g| done(groups[g].len()));
    let mut results: Vec<Option<ReplayResult>> = specs.iter().map(|_| None).collect();
    for (group, answer) in groups.iter().zip(answers) {
        for (&i, r) in group.iter().zip(answer?) {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.ok_or(Error::Query(QueryError::ThreadStopped)))
        .collect()
}

/// Where a [`Sweep`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The default and one candidate of each distinct effect.
    First,
    /// The candidates the answer names whose own replay is not held yet (none where the
    /// results kept are [`SweptReplay`]s: [`Swept::renamed`]).
    Named,
    Done,
}

/// `recommend`'s sweep as batches of replays to run anywhere ([`recommend_with`] runs them
/// on a [`Runner`]; the browser on its search workers): [`Sweep::next_batch`] says which
/// settings to replay, [`Sweep::give`] takes their results in that order, until the batch
/// is empty; then [`Sweep::finish`] ranks. Candidates that cannot act differently on this
/// trace share one replay (and the replays of the others share their prefixes where they
/// decide alike, [`replay_shared`]). The default replay's OOM explanation ends with the best config when that
/// one fits.
#[derive(Debug)]
pub struct Sweep<R = ReplayResult> {
    /// Every valid candidate.
    configs: Vec<String>,
    /// Each distinct effect, the candidate replayed for it and its result.
    effects: Vec<Effect>,
    replayed: Vec<usize>,
    results: Vec<Option<R>>,
    /// Per candidate: its effect.
    effect_of: Vec<usize>,
    default: Option<R>,
    stage: Stage,
    /// What the batch handed out last stands for: effects, or (at [`Stage::Named`])
    /// candidates.
    pending: Vec<usize>,
    /// Candidates in rank order (with their rank), once ranked.
    order: Vec<usize>,
    /// The named candidates' own results.
    named: Vec<(usize, R)>,
}

impl<R: Swept> Sweep<R> {
    /// The sweep of device `device` of `trace` at `capacity` (None: unlimited).
    pub fn new(trace: &Trace, device: usize, capacity: Option<u64>) -> Result<Sweep<R>, Error> {
        Ok(Sweep::of_sizes(&sweep_sizes(trace, device)?, capacity))
    }

    /// The sweep of a trace whose [`sweep_sizes`] are `sizes`, at `capacity`: for a front
    /// end that does not hold the trace (its replays run where it is).
    #[must_use]
    pub fn of_sizes(sizes: &[u64], capacity: Option<u64>) -> Sweep<R> {
        let mut sweep = Sweep {
            configs: Vec::new(),
            effects: Vec::new(),
            replayed: Vec::new(),
            results: Vec::new(),
            effect_of: Vec::new(),
            default: None,
            stage: Stage::First,
            pending: Vec::new(),
            order: Vec::new(),
            named: Vec::new(),
        };
        // Every valid candidate with its effect; the first of each effect is replayed.
        for conf in recommend_candidates() {
            // A combination PyTorch itself would reject is not a candidate.
            let Ok(cfg) = PyTorchConfig::parse(&conf) else {
                continue;
            };
            let gc = conf
                .split(',')
                .find_map(|kv| kv.strip_prefix("garbage_collection_threshold:"))
                .map(str::to_string);
            let e = effect(&cfg, sizes, capacity, gc.as_deref());
            let k = if let Some(k) = sweep.effects.iter().position(|x| *x == e) {
                k
            } else {
                sweep.effects.push(e);
                sweep.replayed.push(sweep.configs.len());
                sweep.effects.len() - 1
            };
            sweep.effect_of.push(k);
            sweep.configs.push(conf);
        }
        sweep.results = (0..sweep.effects.len()).map(|_| None).collect();
        sweep
    }

    /// The progress bar's total: the default and one per distinct effect.
    #[must_use]
    pub fn progress_total(&self) -> usize {
        1 + self.effects.len()
    }

    /// Whether the replays of the batch just handed out count in [`Self::progress_total`]
    /// (those of the named candidates do not: they repeat an effect's replay under its
    /// own name).
    #[must_use]
    pub fn counts_progress(&self) -> bool {
        self.stage != Stage::Named
    }

    fn spec_of(&self, candidate: usize) -> ModelSpec {
        ModelSpec::with_config(AllocatorKind::Pytorch, &self.configs[candidate])
    }

    /// The settings to replay next (device, trace and capacity those of [`Sweep::new`]),
    /// in the order [`Sweep::give`] takes their results; empty when the sweep is ranked.
    pub fn next_batch(&mut self) -> Vec<ModelSpec> {
        loop {
            let specs: Vec<ModelSpec> = match self.stage {
                Stage::First => {
                    // Every effect at once: replays that share their prefix
                    // ([`replay_shared`]) make a threshold that never acts cost a copy of
                    // its twin's replay, and the roots they fork from are replayed once.
                    self.pending = (0..self.effects.len()).collect();
                    std::iter::once(ModelSpec::new(AllocatorKind::Pytorch))
                        .chain(self.pending.iter().map(|&k| self.spec_of(self.replayed[k])))
                        .collect()
                }
                Stage::Named => self.pending.iter().map(|&i| self.spec_of(i)).collect(),
                Stage::Done => return Vec::new(),
            };
            if !specs.is_empty() {
                return specs;
            }
            // Nothing to replay at this stage: on to the next.
            self.advance(Vec::new());
        }
    }

    /// The results of the batch [`Sweep::next_batch`] handed out last, in its order.
    pub fn give(&mut self, results: Vec<R>) -> Result<(), Error> {
        let expected = match self.stage {
            Stage::First => 1 + self.pending.len(),
            Stage::Done => 0,
            Stage::Named => self.pending.len(),
        };
        if results.len() != expected {
            return Err(Error::Query(QueryError::SweepResults {
                expected,
                got: results.len(),
            }));
        }
        self.advance(results);
        Ok(())
    }

    fn advance(&mut self, results: Vec<R>) {
        match self.stage {
            Stage::First => {
                let mut it = results.into_iter();
                self.default = it.next();
                for (k, r) in std::mem::take(&mut self.pending).into_iter().zip(it) {
                    self.results[k] = Some(r);
                }
                self.rank_all();
                self.stage = Stage::Named;
            }
            Stage::Named => {
                self.named
                    .extend(std::mem::take(&mut self.pending).into_iter().zip(results));
                self.stage = Stage::Done;
            }
            Stage::Done => {}
        }
    }

    /// The result candidate `i` is ranked by: its effect's replay.
    fn result_of(&self, i: usize) -> Option<&R> {
        self.results[self.effect_of[i]].as_ref()
    }

    /// Every candidate ranked by its effect's replay, under its own config string; the
    /// named ones (the trade-off table's) whose own replay is not held, and that their
    /// effect's replay cannot stand for renamed ([`Swept::renamed`]), are the next batch.
    fn rank_all(&mut self) {
        let mut order: Vec<(usize, Rank)> = (0..self.configs.len())
            .filter_map(|i| {
                let mut key = self.result_of(i)?.swept().rank();
                key.4 = self.configs[i].len();
                key.5.clone_from(&self.configs[i]);
                Some((i, key))
            })
            .collect();
        order.sort_by(|a, b| a.1.cmp(&b.1));
        self.order = order.into_iter().map(|(i, _)| i).collect();
        for &i in self.order.iter().take(TRADEOFF_ROWS) {
            // The replay held for this candidate was run under its own config string:
            // it is this candidate's own replay (replays are deterministic).
            let k = self.effect_of[i];
            let held = self.results[k].as_ref();
            if self.configs[self.replayed[k]] == self.configs[i] {
                let r = held.cloned().expect("ranked candidates have results");
                self.named.push((i, r));
            } else if let Some(r) = held.and_then(|r| {
                // Where a sweep keeps only what a replay decided, a candidate of the same
                // effect is its effect's replay under its own name ([`Swept::renamed`]):
                // no replay (the canonical string is what a replay of it reports).
                let cfg = PyTorchConfig::parse(&self.configs[i]).ok()?;
                r.renamed(cfg.canonical())
            }) {
                self.named.push((i, r));
            } else {
                self.pending.push(i);
            }
        }
    }

    /// The answer, once [`Sweep::next_batch`] is empty.
    pub fn finish(self) -> Result<Recommendation<R>, Error> {
        let (Stage::Done, Some(mut default)) = (self.stage, self.default.clone()) else {
            return Err(Error::Query(QueryError::SweepResults {
                expected: self.pending.len().max(1),
                got: 0,
            }));
        };
        let named = |i: usize| self.named.iter().find(|(j, _)| *j == i).map(|(_, r)| r);
        let tradeoffs: Vec<R> = self
            .order
            .iter()
            .take(TRADEOFF_ROWS)
            .filter_map(|&i| named(i).cloned())
            .collect();
        let best = tradeoffs
            .first()
            .cloned()
            .ok_or(Error::Query(QueryError::NoCandidate))?;
        let fitting = (0..self.configs.len())
            .filter(|&i| self.result_of(i).is_some_and(|r| r.swept().served_all()))
            .count();
        let tried = self.configs.len();
        if best.swept().served_all() {
            let config = best.swept().config;
            let conf = if config.is_empty() {
                "PyTorch's defaults".to_string()
            } else {
                format!("pytorch@{config}")
            };
            default.note_fits(
                &[format!(
                    "{conf} (one of {fitting} fitting configs of {tried})"
                )],
                "config",
            );
        } else {
            default.note_fits(
                &[],
                &format!("none of the {tried} swept configs would have fit"),
            );
        }
        Ok(Recommendation {
            default,
            best,
            tradeoffs,
            candidates_tried: tried,
            candidates_replayed: self.effects.len(),
            candidates_fitting: fitting,
        })
    }
}

#[cfg(test)]
#[path = "whatif_tests.rs"]
mod tests;
