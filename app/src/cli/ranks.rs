//! `allocsim ranks DIR|FILE… [--config STR] [--capacity SIZE|none] [--no-min-capacity] [--json]`:
//! one snapshot per rank, a row each, the outlier and a what-if on every rank
//! (`allocsim_core::ranks`). The ranks run in parallel, one per core.

use std::path::{Path, PathBuf};

use allocsim_core::capacity::CapacityArg;
use allocsim_core::ranks::{self, RankOptions, RankRow, RanksReport};
use allocsim_core::units::format_size;
use serde_json::Value;

use super::{Failure, InMemory, load_input, parse_capacity_arg, print_answer, schema_json};
use crate::engine::multi;
use crate::engine::parallel::Threads;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Snapshots, one per rank, or a directory of them (its .pickle, .pickle.gz, .pkl, .json and .json.gz files, not capture.py's .stats.json)
    #[arg(required = true, value_name = "DIR|FILE")]
    inputs: Vec<PathBuf>,
    /// The PyTorch setting tried on every rank (PyTorch's defaults plus STR)
    #[arg(long, value_name = "STR", default_value = ranks::DEFAULT_WHAT_IF)]
    config: String,
    /// The memory every replay may hold, e.g. 80GiB, or `none` (default: each rank's as recorded)
    #[arg(long, value_parser = parse_capacity_arg, value_name = "SIZE|none", allow_hyphen_values = true)]
    capacity: Option<CapacityArg>,
    /// Skip each rank's smallest-capacity bisection (a dozen or more replays per rank)
    #[arg(long)]
    no_min_capacity: bool,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
    /// The snapshots of the inputs already in memory, in the inputs' order (the Python
    /// package): such an input only names its snapshot. None (or no entry): read it.
    #[arg(skip)]
    pub memory: Vec<Option<InMemory>>,
}

/// Whether a directory entry's name is a snapshot's.
fn is_snapshot_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    if n.ends_with(".stats.json") {
        return false;
    }
    [
        ".pickle",
        ".pickle.gz",
        ".pkl",
        ".pkl.gz",
        ".json",
        ".json.gz",
    ]
    .iter()
    .any(|ext| n.ends_with(ext))
}

/// The files to read, each with its snapshot if it is in memory (`memory[i]` for
/// `inputs[i]`): each FILE as given, each DIR's snapshots in name order.
pub fn collect_inputs(
    inputs: &[PathBuf],
    memory: &[Option<InMemory>],
) -> Result<Vec<(PathBuf, Option<InMemory>)>, Failure> {
    let mut files = Vec::new();
    for (i, p) in inputs.iter().enumerate() {
        if let Some(m) = memory.get(i).cloned().flatten() {
            files.push((p.clone(), Some(m)));
            continue;
        }
        if !p.is_dir() {
            files.push((p.clone(), None));
            continue;
        }
        let entries = std::fs::read_dir(p)
            .map_err(|e| Failure::bad_input(format!("{}: cannot read: {e}", p.display())))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|f| {
                f.is_file()
                    && f.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(is_snapshot_name)
            })
            .collect();
        if found.is_empty() {
            return Err(Failure::bad_input(format!(
                "{}: no snapshots in this directory (.pickle, .pickle.gz, .pkl, .json, .json.gz)",
                p.display()
            )));
        }
        found.sort();
        files.extend(found.into_iter().map(|f| (f, None)));
    }
    Ok(files)
}

fn read_rank(
    path: &Path,
    memory: Option<&InMemory>,
    rank: u32,
    opts: &RankOptions,
) -> Result<RankRow, String> {
    let name = path.display().to_string();
    if memory.is_some() {
        let v = load_input(path, memory, opts.capacity.given_bytes()).map_err(|f| f.message)?;
        return ranks::rank_trace(&name, rank, &v.trace, opts).map_err(|e| format!("{name}: {e}"));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    ranks::rank(&name, rank, &bytes, opts).map_err(|e| format!("{name}: {e}"))
}

/// Every rank read and replayed, together: what `--json` prints and the text reads.
pub fn outcome(a: &Args) -> Result<RanksReport, Failure> {
    let opts = RankOptions {
        capacity: a.capacity.unwrap_or_default(),
        what_if: a.config.clone(),
        min_capacity: !a.no_min_capacity,
    };
    // A bad setting is a usage error before any rank is read.
    allocsim_core::models::pytorch::PyTorchConfig::parse(&opts.what_if)
        .map_err(|e| Failure::bad_input(format!("--config: {}", e.0)))?;
    let files = collect_inputs(&a.inputs, &a.memory)?;
    let names: Vec<String> = files.iter().map(|f| f.0.display().to_string()).collect();
    let rank_of = ranks::assign_ranks(&names);
    let results = Threads::all_cores().map(files.len(), &|i| {
        read_rank(&files[i].0, files[i].1.as_ref(), rank_of[i], &opts)
    });
    let (mut rows, mut failed) = (Vec::new(), Vec::new());
    for r in results {
        match r {
            Ok(row) => rows.push(row),
            Err(e) => failed.push(e),
        }
    }
    if let Some(first) = failed.first() {
        let others = if failed.len() > 1 {
            format!(" (and {} more unreadable)", failed.len() - 1)
        } else {
            String::new()
        };
        return Err(Failure::bad_input(format!("{first}{others}")));
    }
    ranks::summarize(rows, &opts).map_err(|e| Failure::bad_input(e.to_string()))
}

/// The `--json` object of a set of ranks.
#[must_use]
pub fn json(r: &RanksReport) -> Value {
    schema_json(r)
}

pub fn run(a: &Args) -> Result<u8, Failure> {
    let report = outcome(a)?;
    print_answer(a.json, || json(&report), || print_text(&report))
}

fn print_text(r: &RanksReport) {
    crate::say!("{}.", r.summary);
    crate::say!("{}.", r.what_if.sentence);
    crate::say!();
    crate::say!(
        "  {:>4}  {:<28} {:>14} {:>14} {:>8}  {:<18} {:>14}  {}",
        "rank",
        "file",
        "peak reserved",
        "peak alloc.",
        "frag.",
        "out of memory",
        "min capacity",
        r.what_if.config
    );
    for row in &r.ranks {
        let file = Path::new(&row.file)
            .file_name()
            .map_or_else(|| row.file.clone(), |n| n.to_string_lossy().into_owned());
        let oom = match &row.oom {
            None => "never".to_string(),
            Some(o) if o.fatal => format!("event {}", o.event_index),
            Some(o) => format!("event {} (caught)", o.event_index),
        };
        let what_if = multi::what_if_cell(row);
        let mark = if multi::is_outlier(r, row) {
            "  ← outlier"
        } else {
            ""
        };
        crate::say!(
            "  {:>4}  {:<28} {:>14} {:>14} {:>7.1}%  {:<18} {:>14}  {what_if}{mark}",
            row.rank,
            file,
            format_size(row.peak_reserved_bytes),
            format_size(row.peak_allocated_bytes),
            row.fragmentation_at_peak * 100.0,
            oom,
            row.min_capacity_bytes
                .map_or_else(|| "—".to_string(), format_size),
        );
    }
    crate::say!();
    crate::say!(
        "  median peak reserved: {}",
        format_size(r.median_peak_reserved_bytes)
    );
}
