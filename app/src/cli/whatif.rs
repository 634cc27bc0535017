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

use super::progress;
use super::replay::{print_capacity_note, replay_json};
use super::source::{Source, load_device, load_source};
use super::{Failure, capacity_text, config_text, parse_capacity_arg, pick_device, print_answer};

/// The `--json` object of a run under `capacity`: the capacity's fields, then `fields`'.
fn with_capacity(capacity: &CapacityChoice, fields: serde_json::Value) -> serde_json::Value {
    let mut v = json!({
        "schema": 1,
        "capacity_bytes": capacity.bytes,
        "capacity_source": capacity.source,
        "capacity_inferred": capacity.inferred,
        "capacity_note": capacity.note,
    });
    if let (serde_json::Value::Object(m), serde_json::Value::Object(f)) = (&mut v, fields) {
        m.extend(f);
    }
    v
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
        with_capacity(
            capacity,
            json!({
                "live_peak_bytes": self.best.live_peak_bytes,
                "offline_peak_bytes": self.best.offline_peak_bytes,
                "results": self.results.iter().map(|r| replay_json(r, self.events, capacity)).collect::<Vec<_>>(),
            }),
        )
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
    let (src, d, capacity) = load_device(&a.source, a.capacity, a.trace_device)?;
    let results = progress::search("compare", &src.name, |threads, bar| {
        whatif::compare_with(&src.trace, d, &specs, capacity.bytes, threads, bar)
    })?;
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
    print_answer(a.json, || o.json(), || print_compare(&o))
}

fn print_compare(o: &CompareOutcome) {
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
    print_capacity_note(capacity);
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
    for r in results {
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
    for r in results {
        if let Some(o) = &r.oom {
            crate::say!();
            crate::say!("{}: {}", label(r), o.explanation);
        }
    }
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
    let m = progress::search("min-capacity", &src.name, |_, bar| {
        whatif::min_capacity(&src.trace, d, &spec, bar)
    })?;
    Ok(MinCapacityOutcome {
        name: src.name,
        device: d,
        result: m,
    })
}

/// `allocsim min-capacity`.
pub fn min_capacity(a: &MinCapacityArgs) -> Result<u8, Failure> {
    let o = min_capacity_outcome(a)?;
    print_answer(a.json, || o.json(), || print_min_capacity(&o))
}

fn print_min_capacity(o: &MinCapacityOutcome) {
    let MinCapacityOutcome {
        name,
        device: d,
        result: m,
    } = o;
    let conf = config_text(&m.config, "defaults");
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
        with_capacity(
            capacity,
            json!({
                "default": replay_json(&r.default, events, capacity),
                "best": replay_json(&r.best, events, capacity),
                "candidates_tried": r.candidates_tried,
                "candidates_replayed": r.candidates_replayed,
                "candidates_fitting": r.candidates_fitting,
                "tradeoffs": r.tradeoffs.iter().map(|t| replay_json(t, events, capacity)).collect::<Vec<_>>(),
            }),
        )
    }
}

/// Runs the sweep `recommend` asks for.
pub fn recommend_outcome(a: &RecommendArgs) -> Result<RecommendOutcome, Failure> {
    let (src, d, capacity) = load_device(&a.source, a.capacity, a.trace_device)?;
    let r = progress::search("recommend", &src.name, |threads, bar| {
        whatif::recommend_with(&src.trace, d, capacity.bytes, threads, bar)
    })?;
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
    print_answer(a.json, || o.json(), || print_recommend(&o))
}

fn print_recommend(o: &RecommendOutcome) {
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
    print_capacity_note(capacity);
    let status = |x: &ReplayResult| match &x.oom {
        Some(o) => format!("out of memory at event {}", o.event_index),
        None => format!(
            "fits, {} peak reserved, {} segment ops",
            format_size(x.peak_reserved_bytes),
            x.segment_ops
        ),
    };
    let default_conf = config_text(&r.default.config, "PyTorch's defaults");
    crate::say!(
        "  recorded settings   {default_conf}: {}",
        status(&r.default)
    );
    let best_conf = config_text(&r.best.config, "PyTorch's defaults");
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
    print_tradeoffs(r, capacity.bytes);
    if let Some(o) = &r.default.oom {
        crate::say!();
        crate::say!("{}", o.explanation);
    }
}

/// The trade-off table: the best candidates and the recorded settings, what each costs.
fn print_tradeoffs(r: &whatif::Recommendation, capacity: Option<u64>) {
    let name = |x: &ReplayResult| config_text(&x.config, "defaults").to_string();
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
