//! What-if answers (DESIGN.md): the same trace under several allocators or configs
//! (`compare`), the smallest device that runs it (`min_capacity`), and the PyTorch settings
//! that serve it best at a given capacity (`recommend`). OOM explanations name the models or
//! configs that would have fit.
//!
//! Every function reports progress through a callback `(done, total)`, so a front end can
//! draw a bar; core itself has no threads and no terminal.

use crate::Error;
use crate::models::ModelSpec;
use crate::models::pytorch::PyTorchConfig;
use crate::replay::{ReplayOptions, ReplayResult};
use crate::session;
use crate::trace::Trace;
use crate::units::format_size;

/// The capacity grid of `min_capacity`: 2 MiB.
pub const GRID_BYTES: u64 = 2 << 20;

/// The options of a what-if replay: no checkpoints, no timeline (only the summary).
#[must_use]
pub fn summary_options() -> ReplayOptions {
    ReplayOptions {
        checkpoint_every: 0,
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

/// Appends to an OOM explanation which of `others` would have served every request.
fn note_fits(r: &mut ReplayResult, fitting: &[String], what: &str) {
    if let Some(o) = r.oom.as_mut() {
        let note = if fitting.is_empty() {
            format!("; no {what} would have fit")
        } else {
            format!("; would have fit: {}", fitting.join(", "))
        };
        o.explanation.push_str(&note);
    }
}

/// Replays device `device` of `trace` through every spec under `capacity`. Each OOM's
/// explanation ends with the compared models that served every request.
pub fn compare(
    trace: &Trace,
    device: usize,
    specs: &[ModelSpec],
    capacity: Option<u64>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<ReplayResult>, Error> {
    let mut results = Vec::with_capacity(specs.len());
    progress(0, specs.len());
    for (i, spec) in specs.iter().enumerate() {
        results.push(session::replay_device(
            trace,
            device,
            spec,
            capacity,
            summary_options(),
        )?);
        progress(i + 1, specs.len());
    }
    let fitting: Vec<String> = results
        .iter()
        .filter(|r| served_all(r))
        .map(label)
        .collect();
    for r in &mut results {
        note_fits(r, &fitting, "compared allocator");
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
        return Err(Error::Config(format!(
            "{} runs out of memory even without a capacity ({})",
            label(&unlimited),
            unlimited.oom.map(|o| o.explanation).unwrap_or_default()
        )));
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
            return Err(Error::Config(format!(
                "{} fits at no capacity up to {}",
                spec.label(),
                format_size(hi * GRID_BYTES)
            )));
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

/// The answer of [`recommend`].
#[derive(Debug)]
pub struct Recommendation {
    /// The snapshot's own settings (`pytorch` without `--config`).
    pub default: ReplayResult,
    /// The best candidate: no OOM, then lowest peak reserved, then fewest segment ops,
    /// then the shortest config string.
    pub best: ReplayResult,
    pub candidates_tried: usize,
    /// Candidates that served every request.
    pub candidates_fitting: usize,
}

/// Orders candidates: no OOM first, then those with no OOM of their own, then those that
/// got furthest; then lowest peak reserved, fewest segment ops, shortest config, and the
/// config itself for a total order.
fn rank(r: &ReplayResult) -> (u8, usize, u64, u64, usize, String) {
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
        r.peak_reserved_bytes,
        r.segment_ops,
        r.config.len(),
        r.config.clone(),
    )
}

/// Sweeps [`recommend_candidates`] at `capacity` (None: unlimited) and picks the best. The
/// default replay's OOM explanation ends with the best config when that one fits.
pub fn recommend(
    trace: &Trace,
    device: usize,
    capacity: Option<u64>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Recommendation, Error> {
    let candidates = recommend_candidates();
    let total = candidates.len() + 1;
    progress(0, total);
    let mut default = session::replay_device(
        trace,
        device,
        &ModelSpec {
            name: "pytorch".into(),
            config: None,
        },
        capacity,
        summary_options(),
    )?;
    progress(1, total);
    let mut best: Option<ReplayResult> = None;
    let (mut tried, mut fitting) = (0, 0);
    for (i, conf) in candidates.iter().enumerate() {
        progress(i + 2, total);
        // A combination PyTorch itself would reject is not a candidate.
        if PyTorchConfig::parse(conf).is_err() {
            continue;
        }
        let spec = ModelSpec {
            name: "pytorch".into(),
            config: Some(conf.clone()),
        };
        let r = session::replay_device(trace, device, &spec, capacity, summary_options())?;
        tried += 1;
        fitting += usize::from(served_all(&r));
        if best.as_ref().is_none_or(|b| rank(&r) < rank(b)) {
            best = Some(r);
        }
    }
    let best =
        best.ok_or_else(|| Error::Config("no candidate config could be built".to_string()))?;
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
        note_fits(&mut default, &[], &format!("of the {tried} swept configs"));
    }
    Ok(Recommendation {
        default,
        best,
        candidates_tried: tried,
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
