//! `allocsim diff A B [--align time|events|steps] [--config-a STR] [--config-b STR] [--capacity SIZE|none] [--json]`:
//! two runs on a common axis and what changed at the peak (`allocsim_core::diff`). The two
//! runs decode and replay in parallel.

use std::path::{Path, PathBuf};

use allocsim_core::capacity::CapacityArg;
use allocsim_core::diff::{self, Align, Diff, DiffRun};
use allocsim_core::models::ModelSpec;
use allocsim_core::trace::Trace;
use allocsim_core::units::format_size;
use serde_json::Value;

use super::{
    Failure, InMemory, config_text, load_input, parse_capacity_arg, print_answer, schema_json,
};
use crate::engine::parallel::Threads;

/// At most this many sites in the text (the JSON has them all).
const TEXT_SITES: usize = 12;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The first snapshot (the "before")
    a: PathBuf,
    /// The second snapshot (the "after")
    b: PathBuf,
    /// The common axis: time since each run's first event, the event index, or steps (`annotate` or `user_metadata` markers, else the optimizer's calls)
    #[arg(long, default_value = "time", value_parser = Align::parse, value_name = "time|events|steps")]
    align: Align,
    /// A's PyTorch settings in key:value,… syntax (PyTorch's defaults plus STR; without it A's own settings)
    #[arg(long, value_name = "STR")]
    config_a: Option<String>,
    /// B's PyTorch settings, as --config-a
    #[arg(long, value_name = "STR")]
    config_b: Option<String>,
    /// The memory each run may hold, e.g. 80GiB, or `none` (default: each run's as recorded)
    #[arg(long, value_parser = parse_capacity_arg, value_name = "SIZE|none", allow_hyphen_values = true)]
    capacity: Option<CapacityArg>,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
    /// A's and B's snapshots already in memory (the Python package): A or B then only
    /// names it. None (or no entry): read the file.
    #[arg(skip)]
    pub memory: Vec<Option<InMemory>>,
}

/// Measures one side of a loaded trace (its errors name its file).
fn measure(
    path: &Path,
    trace: &Trace,
    config: Option<&String>,
    a: &Args,
) -> Result<DiffRun, Failure> {
    let name = path.display().to_string();
    let d = trace.busiest_device();
    let capacity = allocsim_core::session::capacity(trace, d, a.capacity.unwrap_or_default());
    let spec = ModelSpec {
        kind: allocsim_core::models::AllocatorKind::Pytorch,
        config: config.cloned(),
    };
    diff::run(&name, trace, d, &spec, capacity.bytes, a.align)
        .map_err(|e| Failure::bad_input(format!("{name}: {e}")))
}

/// Both runs measured and compared: what `--json` prints and the text reads.
pub fn outcome(a: &Args) -> Result<Diff, Failure> {
    let given = a.capacity.unwrap_or_default().given_bytes();
    let sides = [(&a.a, a.config_a.as_ref()), (&a.b, a.config_b.as_ref())];
    let memory = |i: usize| a.memory.get(i).and_then(Option::as_ref);
    // One snapshot under two settings (the same file, or the same bytes in memory).
    let same = match (memory(0), memory(1)) {
        (Some(x), Some(y)) => std::sync::Arc::ptr_eq(&x.bytes, &y.bytes),
        (None, None) => match (a.a.canonicalize(), a.b.canonicalize()) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        },
        _ => false,
    };
    let threads = Threads::all_cores();
    // One snapshot under two settings is decoded once; two each on its own thread.
    let runs = if same {
        let v = load_input(&a.a, memory(0), given)?;
        threads.map(2, &|i| measure(sides[i].0, &v.trace, sides[i].1, a))
    } else {
        threads.map(2, &|i| {
            let v = load_input(sides[i].0, memory(i), given)?;
            measure(sides[i].0, &v.trace, sides[i].1, a)
        })
    };
    let mut runs = runs.into_iter();
    let (Some(ra), Some(rb)) = (runs.next(), runs.next()) else {
        return Err(Failure::bad_input("diff: a run did not come back"));
    };
    Ok(diff::diff(ra?, rb?, a.align))
}

/// The `--json` object of a diff.
#[must_use]
pub fn json(d: &Diff) -> Value {
    schema_json(d)
}

pub fn run(a: &Args) -> Result<u8, Failure> {
    let d = outcome(a)?;
    print_answer(a.json, || json(&d), || print_text(&d))
}

fn at_text(r: &DiffRun, align: Align) -> String {
    let pos = match align {
        Align::Time => format!("{:.3} s", r.peak_at),
        Align::Events => format!("event {}", r.peak_at),
        Align::Steps => format!("step {:.2}", r.peak_at),
    };
    match (r.peak_event, align) {
        (Some(e), Align::Time | Align::Steps) => format!("{pos} (event {e})"),
        (None, _) => "before the first event".to_string(),
        _ => pos,
    }
}

fn print_text(d: &Diff) {
    crate::say!("{}.", d.summary);
    crate::say!();
    let row = |label: &str, a: String, b: String, delta: String| {
        crate::say!("  {label:<26} {a:>24} {b:>24}   {delta}");
    };
    let cfg = |c: &str| config_text(c, "defaults").to_string();
    crate::say!("A: {}", d.a.file);
    crate::say!("B: {}", d.b.file);
    row("", "A".into(), "B".into(), "B − A".into());
    row("config", cfg(&d.a.config), cfg(&d.b.config), String::new());
    row(
        "peak reserved",
        format_size(d.a.peak_reserved_bytes),
        format_size(d.b.peak_reserved_bytes),
        diff::format_delta(d.peak_reserved_delta_bytes),
    );
    row(
        "peak allocated",
        format_size(d.a.peak_allocated_bytes),
        format_size(d.b.peak_allocated_bytes),
        diff::format_delta(d.peak_allocated_delta_bytes),
    );
    row(
        "allocated at reserved peak",
        format_size(d.a.allocated_at_peak_bytes),
        format_size(d.b.allocated_at_peak_bytes),
        String::new(),
    );
    row(
        "reserved-but-free at peak",
        format_size(d.a.peak_reserved_bytes - d.a.allocated_at_peak_bytes),
        format_size(d.b.peak_reserved_bytes - d.b.allocated_at_peak_bytes),
        diff::format_delta(d.free_at_peak_delta_bytes),
    );
    row(
        "fragmentation at peak",
        format!("{:.1}%", d.a.fragmentation_at_peak * 100.0),
        format!("{:.1}%", d.b.fragmentation_at_peak * 100.0),
        String::new(),
    );
    row(
        "peak at",
        at_text(&d.a, d.align),
        at_text(&d.b, d.align),
        String::new(),
    );
    let oom = |r: &DiffRun| {
        r.oom_event
            .map_or_else(|| "never".into(), |e| format!("event {e}"))
    };
    row("out of memory", oom(&d.a), oom(&d.b), String::new());
    crate::say!();
    crate::say!("Live bytes by allocation site at each run's peak (largest growth first):");
    for s in d.by_site.iter().take(TEXT_SITES) {
        crate::say!(
            "  {:>12}  {:>12} → {:<12}  {}",
            diff::format_delta(s.delta_bytes),
            format_size(s.a_bytes),
            format_size(s.b_bytes),
            s.site
        );
    }
    if d.by_site.len() > TEXT_SITES {
        crate::say!("  … and {} more sites", d.by_site.len() - TEXT_SITES);
    }
    crate::say!();
    if d.settings_differ.is_empty() {
        crate::say!("Settings: the same");
    } else {
        crate::say!("Settings that differ:");
        for s in &d.settings_differ {
            crate::say!(
                "  {:<32} A {:<12} B {}",
                s.setting,
                s.a.as_deref().unwrap_or("default"),
                s.b.as_deref().unwrap_or("default")
            );
        }
    }
}
