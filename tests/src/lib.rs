//! Shared helpers of allocsim's corpus tests: where the real traces are (the shared corpus
//! and the repository's own `tests/traces`) and what their `.stats.json` files say.

pub mod generate;

use std::path::{Path, PathBuf};

/// `../shared/traces` beside the checkout (or `$ALLOCSIM_TRACES`), if present.
#[must_use]
pub fn traces_dir() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ALLOCSIM_TRACES") {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces");
    p.is_dir().then_some(p)
}

/// The snapshot a benchmark runs on: `file` if given, else `big_gpt_long_stacks_s9` from
/// [`traces_dir`]; `None` (the caller prints `skipped: …`) when neither is there.
#[must_use]
pub fn bench_trace(file: Option<PathBuf>) -> Option<PathBuf> {
    file.or_else(|| traces_dir().map(|d| d.join("big_gpt_long_stacks_s9.pickle.gz")))
}

/// One shared trace and the facts recorded beside it.
#[derive(Debug, Clone)]
pub struct CorpusTrace {
    pub name: String,
    pub path: PathBuf,
    /// The memory cap the program ran under, if it set one: `round(memory_fraction ×
    /// total_memory)` where the stats give the fraction passed to
    /// `set_per_process_memory_fraction`, else `memory_fraction_cap_gib` as bytes
    /// (`round(cap × 2^30)`).
    pub cap_bytes: Option<u64>,
    /// `memory_stats()["reserved_bytes.all.peak"]` of device 0.
    pub stats_peak_reserved: u64,
    pub oom_raised: bool,
    pub bytes_on_disk: u64,
}

/// Every trace of the corpus, sorted by name (empty if the corpus is absent).
#[must_use]
pub fn corpus() -> Vec<CorpusTrace> {
    traces_dir().map_or_else(Vec::new, |dir| traces_in(&dir))
}

/// The real snapshots of `incoming/` the corpus does not pass yet (its README), sorted by
/// name (empty if absent).
#[must_use]
pub fn incoming() -> Vec<CorpusTrace> {
    traces_dir().map_or_else(Vec::new, |dir| traces_in(&dir.join("incoming")))
}

/// The real snapshots recorded for this repository (`tests/traces` and its subfolders, as
/// `diff/` and `ranks/`), sorted by folder then name: always there, so the checks on them run
/// without the shared corpus too.
#[must_use]
pub fn repo_traces() -> Vec<CorpusTrace> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces");
    let mut out = traces_in(&root);
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    subdirs.sort();
    for dir in subdirs {
        out.extend(traces_in(&dir));
    }
    out
}

/// The traces of one folder, each with its `.stats.json`, sorted by name.
// The corpus names its files in lower case (`NAME.pickle.gz`, `NAME.stats.json`).
#[allow(clippy::case_sensitive_file_extension_comparisons)]
fn traces_in(dir: &Path) -> Vec<CorpusTrace> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or("")
            .to_string();
        if file.ends_with(".stats.json")
            || !(file.ends_with(".pickle.gz") || file.ends_with(".json"))
        {
            continue;
        }
        let name = file.split('.').next().unwrap_or("").to_string();
        let stats_path = dir.join(format!("{name}.stats.json"));
        let Ok(text) = std::fs::read_to_string(&stats_path) else {
            continue;
        };
        let Ok(stats) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let of_total = stats["memory_fraction"]
            .as_f64()
            .zip(stats["total_memory"].as_f64())
            .map(|(f, total)| (f * total).round() as u64);
        let cap_bytes = of_total.or_else(|| {
            stats["memory_fraction_cap_gib"]
                .as_f64()
                .map(|c| (c * f64::from(1u32 << 30)).round() as u64)
        });
        let stats_peak_reserved = stats["memory_stats"]["reserved_bytes.all.peak"]
            .as_u64()
            .unwrap_or(0);
        let oom_raised = stats["oom_raised"].as_bool().unwrap_or(false);
        let bytes_on_disk = std::fs::metadata(&path).map_or(0, |m| m.len());
        out.push(CorpusTrace {
            name,
            path,
            cap_bytes,
            stats_peak_reserved,
            oom_raised,
            bytes_on_disk,
        });
    }
    out
}

/// Prints `skipped: <reason>` and returns true when the corpus is missing.
#[must_use]
pub fn skip_without_corpus() -> bool {
    if traces_dir().is_none() {
        println!("skipped: ../shared/traces not found (set ALLOCSIM_TRACES)");
        return true;
    }
    false
}

/// What the CLI's JSON shows of a replay, and more, in one line: two replays that should
/// agree are compared by it.
#[must_use]
pub fn replay_summary(r: &allocsim_core::replay::ReplayResult) -> String {
    format!(
        "{} {} {:?} ops_done={} requests={} peaks={} {} {} final={} waste={} frag={} {} seg={} {:?} oom={:?} ooms={} reproduced={}",
        r.allocator,
        r.config,
        r.capacity_bytes,
        r.ops_done,
        r.requests,
        r.peak_reserved_bytes,
        r.peak_allocated_bytes,
        r.peak_requested_bytes,
        r.final_reserved_bytes,
        r.internal_waste_bytes_at_peak,
        r.fragmentation_at_peak,
        r.max_fragmentation,
        r.segment_ops,
        r.driver,
        r.oom,
        r.ooms.len(),
        r.recorded_ooms_reproduced,
    )
}
