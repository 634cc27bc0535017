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
use crate::session;
use crate::trace::Trace;
use crate::{Error, QueryError};

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
        (0..n)
            .map(|i| {
                let r = job(i);
                done();
                r
            })
            .collect()
    }
}

/// The answer of [`recommend`].
#[derive(Debug)]
pub struct Recommendation {
    /// The snapshot's own settings (`pytorch` without `--config`).
    pub default: ReplayResult,
    /// The best candidate by [`rank`]: serves every request, then least predicted driver
    /// time, then lowest peak reserved, then the shortest config string.
    pub best: ReplayResult,
    /// The best few candidates in rank order (the best first): the trade-off table.
    pub tradeoffs: Vec<ReplayResult>,
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
    let class = if served_all(r) {
        0
    } else if fits(r) {
        1
    } else {
        2
    };
    let progress = usize::MAX - r.ops_done;
    (
        class,
        progress,
        (r.driver.driver_time_us * 1000.0).round() as u64,
        r.peak_reserved_bytes,
        r.config.len(),
        r.config.clone(),
    )
}

/// What a PyTorch config does on one trace: two configs with the same effect replay the
/// same. `max_split_size_mb` above every block the trace can make (without expandable
/// segments: every segment is a request's allocation size) acts like no limit;
/// `roundup_power2_divisions` that round no request differently act like none;
/// `garbage_collection_threshold` without a capacity never runs.
#[derive(Debug, Clone, PartialEq)]
struct Effect {
    expandable: bool,
    split: u64,
    divisions: [u32; 16],
    gc: Option<String>,
}

fn effect(cfg: &PyTorchConfig, sizes: &[u64], capacity: Option<u64>, gc: Option<&str>) -> Effect {
    let model = PyTorchModel::new(cfg.clone(), None);
    let mut plain_cfg = cfg.clone();
    plain_cfg.roundup_power2_divisions = [0; 16];
    let plain = PyTorchModel::new(plain_cfg, None);
    let rounds_alike = sizes
        .iter()
        .all(|&s| model.round_size(s) == plain.round_size(s));
    let largest_segment = sizes
        .iter()
        .map(|&s| model.allocation_size(model.round_size(s)))
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
        divisions: if rounds_alike {
            [0; 16]
        } else {
            cfg.roundup_power2_divisions
        },
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
/// the best by [`rank`]. Candidates that cannot act differently on this trace share one
/// replay; a `garbage_collection_threshold` candidate shares its twin's result when the
/// twin never reserves above threshold × capacity (PyTorch collects only above it). The
/// default replay's OOM explanation ends with the best config when that one fits.
pub fn recommend_with(
    trace: &Trace,
    device: usize,
    capacity: Option<u64>,
    runner: &dyn Runner,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Recommendation, Error> {
    let dt = trace
        .devices
        .get(device)
        .ok_or(Error::Query(QueryError::NoDevice { device }))?;
    let sizes = block_sizes(dt);
    // Every valid candidate with its effect; the first of each effect is replayed.
    let mut configs: Vec<String> = Vec::new();
    let mut effects: Vec<Effect> = Vec::new();
    let mut replayed: Vec<usize> = Vec::new(); // index into configs, per distinct effect
    let mut effect_of: Vec<usize> = Vec::new(); // per config: index into `replayed`
    for conf in recommend_candidates() {
        // A combination PyTorch itself would reject is not a candidate.
        let Ok(cfg) = PyTorchConfig::parse(&conf) else {
            continue;
        };
        let gc = conf
            .split(',')
            .find_map(|kv| kv.strip_prefix("garbage_collection_threshold:"))
            .map(str::to_string);
        let e = effect(&cfg, &sizes, capacity, gc.as_deref());
        let k = if let Some(k) = effects.iter().position(|x| *x == e) {
            k
        } else {
            effects.push(e);
            replayed.push(configs.len());
            effects.len() - 1
        };
        effect_of.push(k);
        configs.push(conf);
    }
    let spec_of = |conf: &str| ModelSpec::with_config(AllocatorKind::Pytorch, conf);
    // GC candidates after their twins: a twin that never reserves above threshold × C
    // makes the GC run a no-op.
    let is_gc = |k: usize| effects[k].gc.is_some();
    let first: Vec<usize> = (0..replayed.len()).filter(|&k| !is_gc(k)).collect();
    let total = 1 + replayed.len();
    let mut done = 0;
    progress(done, total);
    let default = session::replay_device(
        trace,
        device,
        &ModelSpec::new(AllocatorKind::Pytorch),
        capacity,
        summary_options(),
    )?;
    done += 1;
    progress(done, total);
    let mut results: Vec<Option<ReplayResult>> = (0..replayed.len()).map(|_| None).collect();
    let run_batch = |ks: &[usize],
                     results: &mut Vec<Option<ReplayResult>>,
                     done: &mut usize,
                     progress: &mut dyn FnMut(usize, usize)|
     -> Result<(), Error> {
        let job = |i: usize| {
            let conf = &configs[replayed[ks[i]]];
            session::replay_device(trace, device, &spec_of(conf), capacity, summary_options())
        };
        let out = runner.run(ks.len(), &job, &mut || {
            *done += 1;
            progress(*done, total);
        });
        for (&k, r) in ks.iter().zip(out) {
            results[k] = Some(r?);
        }
        Ok(())
    };
    run_batch(&first, &mut results, &mut done, progress)?;
    // A GC candidate's twin: the same effect without the threshold. Where the twin never
    // reserves above threshold × capacity, PyTorch never collects: the same replay.
    let mut alias: Vec<usize> = (0..replayed.len()).collect();
    let mut second = Vec::new();
    for k in (0..replayed.len()).filter(|&k| is_gc(k)) {
        let mut e = effects[k].clone();
        let threshold: f64 = e.gc.take().and_then(|g| g.parse().ok()).unwrap_or(0.0);
        let twin = effects.iter().position(|x| *x == e);
        match (twin, capacity) {
            (Some(t), Some(c))
                if results[t]
                    .as_ref()
                    .is_some_and(|r| r.peak_reserved_bytes as f64 <= threshold * c as f64) =>
            {
                alias[k] = t;
                done += 1;
                progress(done, total);
            }
            _ => second.push(k),
        }
    }
    run_batch(&second, &mut results, &mut done, progress)?;
    let result_of = |i: usize| results[alias[effect_of[i]]].as_ref();
    // Every candidate ranked by its effect's replay, under its own config string.
    let mut order: Vec<(usize, Rank)> = configs
        .iter()
        .enumerate()
        .filter_map(|(i, conf)| {
            let mut key = rank(result_of(i)?);
            key.4 = conf.len();
            key.5.clone_from(conf);
            Some((i, key))
        })
        .collect();
    order.sort_by(|a, b| a.1.cmp(&b.1));
    let fitting = (0..configs.len())
        .filter(|&i| result_of(i).is_some_and(served_all))
        .count();
    let tried = configs.len();
    let named = |i: usize| -> Result<ReplayResult, Error> {
        // The replay of this candidate's effect, named by the candidate itself.
        session::replay_device(
            trace,
            device,
            &spec_of(&configs[i]),
            capacity,
            summary_options(),
        )
    };
    let mut tradeoffs = Vec::new();
    for &(i, _) in order.iter().take(TRADEOFF_ROWS) {
        tradeoffs.push(named(i)?);
    }
    let best = named(
        order
            .first()
            .map(|o| o.0)
            .ok_or(Error::Query(QueryError::NoCandidate))?,
    )?;
    let mut default = default;
    if served_all(&best) {
        let conf = if best.config.is_empty() {
            "PyTorch's defaults".to_string()
        } else {
            format!("pytorch@{}", best.config)
        };
        note_fits(
            &mut default,
            &[format!(
                "{conf} (one of {fitting} fitting configs of {tried})"
            )],
            "config",
        );
    } else {
        note_fits(
            &mut default,
            &[],
            &format!("none of the {tried} swept configs would have fit"),
        );
    }
    Ok(Recommendation {
        default,
        best,
        tradeoffs,
        candidates_tried: tried,
        candidates_replayed: replayed.len(),
        candidates_fitting: fitting,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads;

    fn story() -> Trace {
        workloads::generate("oom-story").unwrap()
    }

    const CAP: u64 = 2_362_232_013; // round(2.2 × 2^30)

    #[test]
    fn compare_says_which_models_fit() {
        let specs: Vec<ModelSpec> = ["pytorch", "pytorch@expandable_segments:True", "bfc"]
            .iter()
            .map(|s| ModelSpec::parse(s).unwrap())
            .collect();
        let mut calls = 0;
        let r = compare(&story(), 0, &specs, Some(CAP), &mut |_, _| calls += 1).unwrap();
        assert_eq!(calls, 4);
        assert!(!fits(&r[0]) && served_all(&r[1]));
        let e = &r[0].oom.as_ref().unwrap().explanation;
        assert!(e.starts_with("Tried to allocate 400.00 MiB"), "{e}");
        assert!(
            e.ends_with("would have fit: pytorch@expandable_segments:True"),
            "{e}"
        );
    }

    #[test]
    fn min_capacity_fits_there_and_fails_two_mib_below() {
        let t = story();
        for name in ["pytorch", "bfc", "buddy", "vmm-stitch"] {
            let spec = ModelSpec::parse(name).unwrap();
            let m = min_capacity(&t, 0, &spec, &mut |_, _| {}).unwrap();
            let at =
                session::replay_device(&t, 0, &spec, Some(m.min_capacity_bytes), summary_options())
                    .unwrap();
            let below = session::replay_device(
                &t,
                0,
                &spec,
                Some(m.min_capacity_bytes - GRID_BYTES),
                summary_options(),
            )
            .unwrap();
            assert!(served_all(&at), "{name} at {}", m.min_capacity_bytes);
            assert!(!served_all(&below), "{name} below {}", m.min_capacity_bytes);
            assert!(
                m.min_capacity_bytes
                    <= m.unlimited_peak_reserved_bytes.div_ceil(GRID_BYTES) * GRID_BYTES,
                "{name}"
            );
        }
    }

    #[test]
    fn recommend_ranks_the_cheaper_driver_work_above_the_lower_peak() {
        let r = recommend(&story(), 0, Some(CAP), &mut |_, _| {}).unwrap();
        assert!(served_all(&r.best));
        // Expandable segments fit with a lower peak, but map and unmap pages all along:
        // more predicted driver time, so ranked below the best.
        let spec = ModelSpec::parse("pytorch@expandable_segments:True").unwrap();
        let expandable =
            session::replay_device(&story(), 0, &spec, Some(CAP), summary_options()).unwrap();
        assert!(served_all(&expandable));
        assert!(expandable.peak_reserved_bytes < r.best.peak_reserved_bytes);
        assert!(expandable.driver.driver_time_us > r.best.driver.driver_time_us);
        assert!(rank(&r.best) < rank(&expandable));
        // The trade-off table is in rank order and starts with the best.
        assert_eq!(r.tradeoffs[0].config, r.best.config);
        for w in r.tradeoffs.windows(2) {
            assert!(rank(&w[0]) <= rank(&w[1]));
        }
        assert!(r.tradeoffs.len() <= TRADEOFF_ROWS);
    }

    /// What a replay decided, for comparing two of them.
    type Outcome = (u64, u64, u64, u64, Option<u64>);

    fn outcome(r: &ReplayResult) -> Outcome {
        (
            r.peak_reserved_bytes,
            r.peak_allocated_bytes,
            r.segment_ops,
            (r.driver.driver_time_us * 1000.0).round() as u64,
            r.oom.as_ref().map(|o| o.event_index),
        )
    }

    #[test]
    fn candidates_that_cannot_act_on_the_trace_share_a_replay_and_it_is_theirs() {
        let t = story();
        let sizes = block_sizes(&t.devices[0]);
        for capacity in [None, Some(CAP)] {
            // Every candidate replayed on its own: candidates of one effect decide alike.
            let mut seen: Vec<(Effect, Outcome)> = Vec::new();
            let mut twins = 0;
            for conf in recommend_candidates() {
                let Ok(cfg) = PyTorchConfig::parse(&conf) else {
                    continue;
                };
                let gc = conf
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("garbage_collection_threshold:"));
                let spec = ModelSpec::parse(&format!("pytorch@{conf}")).unwrap();
                let r = session::replay_device(&t, 0, &spec, capacity, summary_options()).unwrap();
                let e = effect(&cfg, &sizes, capacity, gc);
                match seen.iter().find(|(x, _)| *x == e) {
                    Some((_, o)) => {
                        assert_eq!(*o, outcome(&r), "{conf} at {capacity:?}");
                        twins += 1;
                    }
                    None => seen.push((e, outcome(&r))),
                }
            }
            // Without a capacity the GC thresholds cannot act (with one, every setting
            // acts on oom-story: its segments are over 1 GiB, its sizes round apart).
            assert_eq!(twins > 0, capacity.is_none(), "{capacity:?}");
        }
        // Without a capacity every GC candidate shares its twin's replay.
        let r = recommend(&t, 0, None, &mut |_, _| {}).unwrap();
        assert_eq!(r.candidates_tried, 168);
        assert!(
            r.candidates_replayed <= 168 / 3,
            "{}",
            r.candidates_replayed
        );
    }

    #[test]
    fn a_gc_threshold_the_twin_never_crosses_decides_as_the_twin() {
        let t = story();
        for (plain, gc) in [
            ("max_split_size_mb:64", "0.8"),
            ("expandable_segments:True", "0.6"),
            ("", "0.8"),
        ] {
            let twin_conf = plain.to_string();
            let gc_conf = if plain.is_empty() {
                format!("garbage_collection_threshold:{gc}")
            } else {
                format!("{plain},garbage_collection_threshold:{gc}")
            };
            let run = |conf: &str| {
                let spec = ModelSpec::with_config(AllocatorKind::Pytorch, conf);
                session::replay_device(&t, 0, &spec, Some(CAP), summary_options()).unwrap()
            };
            let twin = run(&twin_conf);
            let with_gc = run(&gc_conf);
            let threshold: f64 = gc.parse().unwrap();
            if twin.peak_reserved_bytes as f64 <= threshold * CAP as f64 {
                assert_eq!(outcome(&twin), outcome(&with_gc), "{gc_conf}");
            }
        }
    }

    #[test]
    fn recommend_sweeps_168_configs_and_finds_one_that_fits() {
        assert_eq!(recommend_candidates().len(), 168);
        let r = recommend(&story(), 0, Some(CAP), &mut |_, _| {}).unwrap();
        assert!(!fits(&r.default));
        assert!(served_all(&r.best), "{:?}", r.best.oom);
        assert_eq!(r.candidates_tried, 168);
        let e = r.default.oom.unwrap().explanation;
        assert!(
            e.contains(&format!(
                "would have fit: pytorch@{} (one of",
                r.best.config
            )),
            "{e}"
        );
        // Ties are broken by fewer segment ops, then the shorter config.
        assert!(r.candidates_fitting > 1);
    }
}
