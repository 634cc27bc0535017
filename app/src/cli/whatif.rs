//! The what-if commands (DESIGN.md):
//!
//! ```text
//! allocsim compare      FILE [--allocators LIST] [--capacity SIZE] [--trace-device D] [--json]
//! allocsim min-capacity FILE [--allocator NAME] [--config STR] [--trace-device D] [--json]
//! allocsim recommend    FILE [--capacity SIZE|none] [--trace-device D] [--json]
//! ```
//!
//! `--workload SPEC` (a synthetic workload, `allocsim_core::workloads`) may stand instead of
//! FILE. Long runs draw a progress bar on stderr; stdout carries only the result.

use allocsim_core::capacity::{CapacityArg, CapacityChoice};
use allocsim_core::models::{ModelSpec, kind};
use allocsim_core::replay::ReplayResult;
use allocsim_core::units::format_size;
use allocsim_core::{offline, whatif};
use serde_json::json;

use super::progress::Progress;
use super::replay::{print_capacity_note, replay_json};
use super::source::{Loaded, Source, load_source};
use super::{Failure, parse_capacity_arg, pick_device, print_json};
use crate::engine::parallel::Threads;

fn core_failure(name: &str, e: &allocsim_core::Error) -> Failure {
    Failure::bad_input(format!("{name}: {e}"))
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    #[command(flatten)]
    pub(super) source: Source,
    #[arg(
        long,
        help = "';'-separated NAME or NAME@CONFIG entries (default: every model with its defaults plus pytorch@expandable_segments:True)"
    )]
    allocators: Option<String>,
    /// The memory each allocator may hold, e.g. 2.2GiB, or `none` (default: as recorded — inferred where the recording ran out of memory, else unlimited)
    #[arg(long, value_parser = parse_capacity_arg, value_name = "SIZE|none", allow_hyphen_values = true)]
    capacity: Option<CapacityArg>,
    #[arg(
        long,
        help = "Which device_traces[D] to replay (default: the one with the most events)"
    )]
    trace_device: Option<usize>,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
}

/// Loads the source under `--capacity` and picks the device and its capacity.
fn load_with_capacity(
    src: &Source,
    capacity: Option<CapacityArg>,
    trace_device: Option<usize>,
) -> Result<(Loaded, usize, CapacityChoice), Failure> {
    let arg = capacity.unwrap_or_default();
    let loaded = load_source(src, arg.given_bytes())?;
    let d = pick_device(&loaded.trace, trace_device)?;
    let choice = allocsim_core::session::capacity(&loaded.trace, d, arg);
    Ok((loaded, d, choice))
}

fn label(r: &ReplayResult) -> String {
    if r.config.is_empty() {
        r.allocator.to_string()
    } else {
        format!("{}@{}", r.allocator, r.config)
    }
}

/// `compare`'s rows of the two bounds (`allocsim_core::offline`).
const LIVE_ROW: &str = "live bytes (lower bound)";
const OFFLINE_ROW: &str = "offline placement (best possible)";

/// A comparison `a` asks for, and what its output shows.
pub struct CompareOutcome {
    name: String,
    device: usize,
    events: usize,
    capacity: CapacityChoice,
    best: offline::BestPossible,
    results: Vec<ReplayResult>,
}

impl CompareOutcome {
    /// The `--json` object.
    #[must_use]
    pub fn json(&self) -> serde_json::Value {
        let capacity = &self.capacity;
        json!({
            "schema": 1,
            "capacity_bytes": capacity.bytes,
            "capacity_source": capacity.source,
            "capacity_inferred": capacity.inferred,
            "capacity_note": capacity.note,
            "live_peak_bytes": self.best.live_peak_bytes,
            "offline_peak_bytes": self.best.offline_peak_bytes,
            "results": self.results.iter().map(|r| replay_json(r, self.events, capacity)).collect::<Vec<_>>(),
        })
    }
}

/// Runs the replays `compare` asks for.
pub fn compare_outcome(a: &CompareArgs) -> Result<CompareOutcome, Failure> {
    let specs = match &a.allocators {
        Some(list) => {
            kind::parse_list(list).map_err(|e| Failure::bad_input(format!("--allocators: {e}")))?
        }
        None => kind::DEFAULT_COMPARE
            .iter()
            .map(|s| ModelSpec::parse(s))
            .collect::<Result<_, _>>()
            .map_err(|e| Failure::bad_input(e.to_string()))?,
    };
    let (src, d, capacity) = load_with_capacity(&a.source, a.capacity, a.trace_device)?;
    let mut bar = Progress::new("compare");
    let results = whatif::compare_with(
        &src.trace,
        d,
        &specs,
        capacity.bytes,
        &Threads::all_cores(),
        &mut |done, total| bar.update(done, total),
    )
    .map_err(|e| core_failure(&src.name, &e))?;
    drop(bar);
    Ok(CompareOutcome {
        events: src.trace.devices[d].events,
        best: offline::best_possible(&src.trace.devices[d]),
        name: src.name,
        device: d,
        capacity,
        results,
    })
}

/// `allocsim compare`.
pub fn compare(a: &CompareArgs) -> Result<u8, Failure> {
    let o = compare_outcome(a)?;
    if a.json {
        print_json(&o.json());
        return Ok(0);
    }
    let CompareOutcome {
        name,
        device: d,
        events,
        capacity,
        best,
        results,
    } = o;
    crate::say!(
        "{name} — device {d}, {events} events, capacity {}",
        capacity_text(capacity.bytes)
    );
    print_capacity_note(&capacity);
    crate::say!();
    let width = results
        .iter()
        .map(|r| label(r).len())
        .max()
        .unwrap_or(9)
        .max(OFFLINE_ROW.len());
    crate::say!(
        "{:width$}  {:>12}  {:>12}  {:>9}  {:>11}  out of memory",
        "allocator",
        "peak reserved",
        "peak alloc.",
        "frag.",
        "segment ops"
    );
    for r in &results {
        let oom = oom_column(r);
        crate::say!(
            "{:width$}  {:>12}  {:>12}  {:>8.1}%  {:>11}  {oom}",
            label(r),
            format_size(r.peak_reserved_bytes),
            format_size(r.peak_allocated_bytes),
            r.fragmentation_at_peak * 100.0,
            r.segment_ops
        );
    }
    for (row, bytes) in [
        (LIVE_ROW, best.live_peak_bytes),
        (OFFLINE_ROW, best.offline_peak_bytes),
    ] {
        crate::say!("{row:width$}  {:>12}", format_size(bytes));
    }
    for r in &results {
        if let Some(o) = &r.oom {
            crate::say!();
            crate::say!("{}: {}", label(r), o.explanation);
        }
    }
    Ok(0)
}

/// The "out of memory" column of a replay: where, and whether the recording failed there
/// too (`recorded` and `fatal` are each other's opposite).
fn oom_column(r: &ReplayResult) -> String {
    match &r.oom {
        None => "never".to_string(),
        Some(o) if o.recorded => format!("at event {} (as recorded)", o.event_index),
        Some(o) => format!("at event {}", o.event_index),
    }
}

fn capacity_text(c: Option<u64>) -> String {
    c.map_or_else(|| "unlimited".to_string(), format_size)
}

#[derive(clap::Args, Debug)]
pub struct MinCapacityArgs {
    #[command(flatten)]
    pub(super) source: Source,
    /// The allocator model
    #[arg(long, default_value = "pytorch")]
    allocator: String,
    /// The model's config in PyTorch's key:value,key:value syntax (pytorch: defaults plus STR; without it the snapshot's own settings)
    #[arg(long)]
    config: Option<String>,
    #[arg(
        long,
        help = "Which device_traces[D] to replay (default: the one with the most events)"
    )]
    trace_device: Option<usize>,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
}

/// The search `min-capacity` asks for, and what its output shows.
pub struct MinCapacityOutcome {
    name: String,
    device: usize,
    result: whatif::MinCapacity,
}

impl MinCapacityOutcome {
    /// The `--json` object.
    #[must_use]
    pub fn json(&self) -> serde_json::Value {
        let m = &self.result;
        json!({
            "schema": 1,
            "allocator": m.allocator,
            "config": m.config,
            "min_capacity_bytes": m.min_capacity_bytes,
            "unlimited_peak_reserved_bytes": m.unlimited_peak_reserved_bytes,
        })
    }
}

/// Runs the search `min-capacity` asks for.
pub fn min_capacity_outcome(a: &MinCapacityArgs) -> Result<MinCapacityOutcome, Failure> {
    let spec = super::model_spec(&a.allocator, a.config.as_deref())?;
    let src = load_source(&a.source, None)?;
    let d = pick_device(&src.trace, a.trace_device)?;
    let mut bar = Progress::new("min-capacity");
    let m = whatif::min_capacity(&src.trace, d, &spec, &mut |done, total| {
        bar.update(done, total);
    })
    .map_err(|e| core_failure(&src.name, &e))?;
    drop(bar);
    Ok(MinCapacityOutcome {
        name: src.name,
        device: d,
        result: m,
    })
}

/// `allocsim min-capacity`.
pub fn min_capacity(a: &MinCapacityArgs) -> Result<u8, Failure> {
    let o = min_capacity_outcome(a)?;
    if a.json {
        print_json(&o.json());
        return Ok(0);
    }
    let MinCapacityOutcome {
        name,
        device: d,
        result: m,
    } = o;
    let conf = if m.config.is_empty() {
        "defaults".to_string()
    } else {
        m.config.clone()
    };
    crate::say!("{name} — device {d}, {} (config: {conf})", m.allocator);
    let mib = |b: u64| b >> 20;
    crate::say!(
        "  min capacity        {} ({} MiB = {} bytes; {} MiB runs out of memory)",
        format_size(m.min_capacity_bytes),
        mib(m.min_capacity_bytes),
        m.min_capacity_bytes,
        mib(m.min_capacity_bytes - whatif::GRID_BYTES)
    );
    crate::say!(
        "  unlimited peak      {} reserved",
        format_size(m.unlimited_peak_reserved_bytes)
    );
    crate::say!("  replays             {}", m.replays);
    Ok(0)
}

#[derive(clap::Args, Debug)]
pub struct RecommendArgs {
    #[command(flatten)]
    pub(super) source: Source,
    /// The memory the allocator may hold, e.g. 2.2GiB, or `none` (default: as recorded — inferred where the recording ran out of memory, else unlimited)
    #[arg(long, value_parser = parse_capacity_arg, value_name = "SIZE|none", allow_hyphen_values = true)]
    capacity: Option<CapacityArg>,
    #[arg(
        long,
        help = "Which device_traces[D] to replay (default: the one with the most events)"
    )]
    trace_device: Option<usize>,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
}

/// The sweep `recommend` asks for, and what its output shows.
pub struct RecommendOutcome {
    name: String,
    device: usize,
    events: usize,
    capacity: CapacityChoice,
    result: whatif::Recommendation,
}

impl RecommendOutcome {
    /// The `--json` object.
    #[must_use]
    pub fn json(&self) -> serde_json::Value {
        let (r, events, capacity) = (&self.result, self.events, &self.capacity);
        json!({
            "schema": 1,
            "capacity_bytes": capacity.bytes,
            "capacity_source": capacity.source,
            "capacity_inferred": capacity.inferred,
            "capacity_note": capacity.note,
            "default": replay_json(&r.default, events, capacity),
            "best": replay_json(&r.best, events, capacity),
            "candidates_tried": r.candidates_tried,
            "candidates_replayed": r.candidates_replayed,
            "candidates_fitting": r.candidates_fitting,
            "tradeoffs": r.tradeoffs.iter().map(|t| replay_json(t, events, capacity)).collect::<Vec<_>>(),
        })
    }
}

/// Runs the sweep `recommend` asks for.
pub fn recommend_outcome(a: &RecommendArgs) -> Result<RecommendOutcome, Failure> {
    let (src, d, capacity) = load_with_capacity(&a.source, a.capacity, a.trace_device)?;
    let mut bar = Progress::new("recommend");
    let r = whatif::recommend_with(
        &src.trace,
        d,
        capacity.bytes,
        &Threads::all_cores(),
        &mut |done, total| bar.update(done, total),
    )
    .map_err(|e| core_failure(&src.name, &e))?;
    drop(bar);
    Ok(RecommendOutcome {
        events: src.trace.devices[d].events,
        name: src.name,
        device: d,
        capacity,
        result: r,
    })
}

/// `allocsim recommend`.
pub fn recommend(a: &RecommendArgs) -> Result<u8, Failure> {
    let o = recommend_outcome(a)?;
    if a.json {
        print_json(&o.json());
        return Ok(0);
    }
    let RecommendOutcome {
        name,
        device: d,
        capacity,
        result: r,
        ..
    } = o;
    crate::say!(
        "{name} — device {d}, capacity {}",
        capacity_text(capacity.bytes)
    );
    print_capacity_note(&capacity);
    let status = |x: &ReplayResult| match &x.oom {
        Some(o) => format!("out of memory at event {}", o.event_index),
        None => format!(
            "fits, {} peak reserved, {} segment ops",
            format_size(x.peak_reserved_bytes),
            x.segment_ops
        ),
    };
    let default_conf = if r.default.config.is_empty() {
        "PyTorch's defaults".to_string()
    } else {
        r.default.config.clone()
    };
    crate::say!(
        "  recorded settings   {default_conf}: {}",
        status(&r.default)
    );
    let best_conf = if r.best.config.is_empty() {
        "PyTorch's defaults".to_string()
    } else {
        r.best.config.clone()
    };
    crate::say!(
        "  best of {:<3}        {best_conf}: {}",
        r.candidates_tried,
        status(&r.best)
    );
    crate::say!(
        "  configs that fit    {} of {} ({} replays: the others cannot act differently on this trace)",
        r.candidates_fitting,
        r.candidates_tried,
        r.candidates_replayed
    );
    if whatif::served_all(&r.best) {
        if r.best.config.is_empty() {
            crate::say!("  set                 nothing: PyTorch's defaults are the best");
        } else {
            crate::say!("  set                 PYTORCH_CUDA_ALLOC_CONF={best_conf}");
        }
    }
    crate::say!();
    print_tradeoffs(&r, capacity.bytes);
    if let Some(o) = &r.default.oom {
        crate::say!();
        crate::say!("{}", o.explanation);
    }
    Ok(0)
}

/// The trade-off table: the best candidates and the recorded settings, what each costs.
fn print_tradeoffs(r: &whatif::Recommendation, capacity: Option<u64>) {
    let name = |x: &ReplayResult| {
        if x.config.is_empty() {
            "defaults".to_string()
        } else {
            x.config.clone()
        }
    };
    // The recorded settings' row is marked; added when not among the best.
    let mut rows: Vec<(String, &ReplayResult)> = r
        .tradeoffs
        .iter()
        .map(|t| {
            if t.config == r.default.config {
                (format!("{} (recorded)", name(t)), t)
            } else {
                (name(t), t)
            }
        })
        .collect();
    if !r.tradeoffs.iter().any(|t| t.config == r.default.config) {
        rows.push((format!("{} (recorded)", name(&r.default)), &r.default));
    }
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(8).max(8);
    crate::say!(
        "  {:width$}  {:>13}  {:>12}  {:>11}  {:>9}  {:>11}  out of memory",
        "setting",
        "peak reserved",
        "headroom",
        "segment ops",
        "sync ops",
        "driver time"
    );
    for (n, x) in rows {
        let headroom = capacity.map_or_else(
            || "-".to_string(),
            |c| format_size(c.saturating_sub(x.peak_reserved_bytes)),
        );
        let oom = oom_column(x);
        crate::say!(
            "  {n:width$}  {:>13}  {:>12}  {:>11}  {:>9}  {:>8.2} ms  {oom}",
            format_size(x.peak_reserved_bytes),
            headroom,
            x.segment_ops,
            x.driver.synchronizing,
            x.driver.driver_time_us / 1000.0
        );
    }
}
