//! A set of ranks (`allocsim ranks DIR|FILE…`): one snapshot per rank of a distributed
//! job, each replayed under its own settings and capacity as recorded, the outlier among
//! them, and one what-if setting applied to every rank.
//!
//! [`rank`] does the work of one rank (decode, replay, smallest capacity, what-if) so a
//! front end with threads runs the ranks in parallel; [`summarize`] puts the rows
//! together. The **outlier** is the rank whose peak reserved memory is furthest above the
//! median, named when it is more than 10 % above it; the median of an even count is the
//! mean of the middle two, rounded down.

use crate::capacity::{CapacityArg, CapacitySource};
use crate::models::{AllocatorKind, ModelSpec};
use crate::replay::ReplayResult;
use crate::units::format_size;
use crate::{Error, session, whatif};

/// The what-if setting applied to every rank unless another is given.
pub const DEFAULT_WHAT_IF: &str = "expandable_segments:True";

/// What to replay each rank under.
#[derive(Debug, Clone)]
pub struct RankOptions {
    /// The capacity of every replay (default: each rank's as recorded).
    pub capacity: CapacityArg,
    /// The PyTorch setting tried on every rank (defaults plus this).
    pub what_if: String,
    /// Also bisect each rank's smallest capacity (a dozen or more replays per rank).
    pub min_capacity: bool,
}

impl Default for RankOptions {
    fn default() -> Self {
        RankOptions {
            capacity: CapacityArg::default(),
            what_if: DEFAULT_WHAT_IF.to_string(),
            min_capacity: true,
        }
    }
}

/// A simulated OOM of a rank.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RankOom {
    pub event_index: u64,
    pub requested_bytes: u64,
    /// The program would have died here (the recording did not fail there too).
    pub fatal: bool,
}

/// One rank under the what-if setting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RankWhatIf {
    pub peak_reserved_bytes: u64,
    /// Every request served, even where the recording failed.
    pub served_all: bool,
}

/// One row: a rank replayed under its own settings and capacity.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankRow {
    pub file: String,
    pub rank: u32,
    /// The replayed `device_traces[D]` (the busiest).
    pub device: usize,
    pub events: usize,
    pub requests: usize,
    pub allocator: String,
    pub config: String,
    pub capacity_bytes: Option<u64>,
    pub capacity_source: CapacitySource,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub fragmentation_at_peak: f64,
    pub max_fragmentation: f64,
    /// The first OOM of the replay (None: every request served).
    pub oom: Option<RankOom>,
    /// The smallest capacity on a 2 MiB grid that serves every request (None when not
    /// computed, or when no capacity does).
    pub min_capacity_bytes: Option<u64>,
    pub what_if: RankWhatIf,
    /// How many entries `device_traces` has (the GPUs the process saw).
    #[serde(skip)]
    pub devices: usize,
}

/// A rank that could not be read: the others are still shown.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RankFailure {
    pub file: String,
    pub rank: u32,
    pub error: String,
}

/// The outlier: furthest above the median peak reserved, by more than 10 %.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Outlier {
    pub file: String,
    pub rank: u32,
    pub above_median_bytes: u64,
}

/// The what-if applied to every rank.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WhatIfAll {
    pub config: String,
    /// Ranks where it served every request, of `ranks`.
    pub fits: usize,
    pub ranks: usize,
    /// The largest peak reserved over the ranks under it, and under their own settings.
    pub max_peak_reserved_bytes: u64,
    pub recorded_max_peak_reserved_bytes: u64,
    pub sentence: String,
}

/// The rows together: the JSON of `allocsim ranks` after `"schema"`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RanksReport {
    pub ranks: Vec<RankRow>,
    pub median_peak_reserved_bytes: u64,
    pub outlier: Option<Outlier>,
    pub what_if: WhatIfAll,
    pub summary: String,
}

/// Why the rows do not make one set of ranks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RanksError {
    #[error("no snapshots to compare")]
    Empty,
    /// Not one job's ranks: the processes saw different numbers of GPUs.
    #[error(
        "snapshots of different devices: {first} has {first_devices} device(s), {other} has {other_devices} (ranks compares the ranks of one job)"
    )]
    DifferentDevices {
        first: String,
        first_devices: usize,
        other: String,
        other_devices: usize,
    },
}

/// The rank a file name states: `rank3` (any case, digits right after) or `_3.` (the
/// last such); None when it states none.
#[must_use]
pub fn rank_from_name(name: &str) -> Option<u32> {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let lower = base.to_ascii_lowercase();
    let digits = |s: &str| -> Option<u32> {
        let d: String = s.chars().take_while(char::is_ascii_digit).collect();
        d.parse().ok()
    };
    if let Some(n) = lower
        .match_indices("rank")
        .find_map(|(i, _)| digits(&lower[i + 4..]))
    {
        return Some(n);
    }
    lower.match_indices('_').rev().find_map(|(i, _)| {
        let d: String = lower[i + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        (!d.is_empty() && lower[i + 1 + d.len()..].starts_with('.'))
            .then(|| d.parse().ok())
            .flatten()
    })
}

/// The rank of each of `names` (in the order given): as their names state them when every
/// name states a distinct one, else their position.
#[must_use]
pub fn assign_ranks(names: &[String]) -> Vec<u32> {
    let stated: Option<Vec<u32>> = names.iter().map(|n| rank_from_name(n)).collect();
    if let Some(v) = stated {
        let distinct: std::collections::BTreeSet<u32> = v.iter().copied().collect();
        if distinct.len() == v.len() {
            return v;
        }
    }
    (0..names.len())
        .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
        .collect()
}

/// One rank: decodes `bytes` (from `file`), replays its busiest device through the
/// PyTorch model under its own settings, bisects its smallest capacity, and replays it
/// under the what-if setting.
pub fn rank(file: &str, rank: u32, bytes: &[u8], opts: &RankOptions) -> Result<RankRow, Error> {
    let v = session::load(bytes, opts.capacity.given_bytes())?;
    rank_trace(file, rank, &v.trace, opts)
}

/// [`rank`] of a snapshot already decoded (under `opts.capacity`'s given bytes, if any).
pub fn rank_trace(
    file: &str,
    rank: u32,
    trace: &crate::trace::Trace,
    opts: &RankOptions,
) -> Result<RankRow, Error> {
    let d = trace.busiest_device();
    let capacity = session::capacity(trace, d, opts.capacity);
    let own = ModelSpec::new(AllocatorKind::Pytorch);
    let r = session::replay_device(trace, d, &own, capacity.bytes, whatif::summary_options())?;
    let min_capacity_bytes = if opts.min_capacity {
        whatif::min_capacity(trace, d, &own, &mut |_, _| {})
            .ok()
            .map(|m| m.min_capacity_bytes)
    } else {
        None
    };
    let alt = ModelSpec::with_config(AllocatorKind::Pytorch, opts.what_if.clone());
    let w = session::replay_device(trace, d, &alt, capacity.bytes, whatif::summary_options())?;
    Ok(row(
        file,
        rank,
        trace,
        d,
        &r,
        &w,
        &capacity,
        min_capacity_bytes,
    ))
}

#[allow(clippy::too_many_arguments)] // the parts of one row, each used once
fn row(
    file: &str,
    rank: u32,
    trace: &crate::trace::Trace,
    d: usize,
    r: &ReplayResult,
    w: &ReplayResult,
    capacity: &crate::capacity::CapacityChoice,
    min_capacity_bytes: Option<u64>,
) -> RankRow {
    RankRow {
        file: file.to_string(),
        rank,
        device: d,
        events: trace.devices[d].events,
        requests: r.requests,
        allocator: r.allocator.to_string(),
        config: r.config.clone(),
        capacity_bytes: r.capacity_bytes,
        capacity_source: capacity.source,
        peak_reserved_bytes: r.peak_reserved_bytes,
        peak_allocated_bytes: r.peak_allocated_bytes,
        fragmentation_at_peak: r.fragmentation_at_peak,
        max_fragmentation: r.max_fragmentation,
        oom: r.oom.as_ref().map(|o| RankOom {
            event_index: o.event_index,
            requested_bytes: o.requested_bytes,
            fatal: o.fatal,
        }),
        min_capacity_bytes,
        what_if: RankWhatIf {
            peak_reserved_bytes: w.peak_reserved_bytes,
            served_all: whatif::served_all(w),
        },
        devices: trace.snapshot.device_traces,
    }
}

/// The rows of every rank together (sorted by rank): the median, the outlier and the
/// what-if over all. Errors: no rows; snapshots of different devices (a different number
/// of `device_traces`: not one job's ranks).
pub fn summarize(mut rows: Vec<RankRow>, opts: &RankOptions) -> Result<RanksReport, RanksError> {
    rows.sort_by(|a, b| a.rank.cmp(&b.rank).then_with(|| a.file.cmp(&b.file)));
    let Some(first) = rows.first() else {
        return Err(RanksError::Empty);
    };
    if let Some(other) = rows.iter().find(|r| r.devices != first.devices) {
        return Err(RanksError::DifferentDevices {
            first: first.file.clone(),
            first_devices: first.devices,
            other: other.file.clone(),
            other_devices: other.devices,
        });
    }
    let mut peaks: Vec<u64> = rows.iter().map(|r| r.peak_reserved_bytes).collect();
    peaks.sort_unstable();
    let n = peaks.len();
    let median = if n % 2 == 1 {
        peaks[n / 2]
    } else {
        u64::midpoint(peaks[n / 2 - 1], peaks[n / 2])
    };
    // Furthest above the median; among equals the lowest rank. More than 10 %: exactly,
    // peak × 10 > median × 11.
    let outlier = rows
        .iter()
        .filter(|r| u128::from(r.peak_reserved_bytes) * 10 > u128::from(median) * 11)
        .max_by_key(|r| (r.peak_reserved_bytes, std::cmp::Reverse(r.rank)))
        .map(|r| Outlier {
            file: r.file.clone(),
            rank: r.rank,
            above_median_bytes: r.peak_reserved_bytes - median,
        });
    let what_if = what_if_all(&rows, opts);
    let summary = match &outlier {
        Some(o) => format!(
            "Rank {} is the outlier: its peak reserved memory is {} above the median of {} ranks ({}, {:.0} % above)",
            o.rank,
            format_size(o.above_median_bytes),
            n,
            format_size(median),
            o.above_median_bytes as f64 * 100.0 / median.max(1) as f64
        ),
        None => format!(
            "No outlier: every rank's peak reserved memory is within 10 % of the median of {} ranks ({})",
            n,
            format_size(median)
        ),
    };
    Ok(RanksReport {
        ranks: rows,
        median_peak_reserved_bytes: median,
        outlier,
        what_if,
        summary,
    })
}

fn what_if_all(rows: &[RankRow], opts: &RankOptions) -> WhatIfAll {
    let fits = rows.iter().filter(|r| r.what_if.served_all).count();
    let max_peak = rows
        .iter()
        .map(|r| r.what_if.peak_reserved_bytes)
        .max()
        .unwrap_or(0);
    let recorded_max = rows
        .iter()
        .map(|r| r.peak_reserved_bytes)
        .max()
        .unwrap_or(0);
    // The capacity the sentence names: the one given, else the ranks' as recorded (the
    // same on every rank, or "as recorded" when they differ or none was inferred).
    let caps: std::collections::BTreeSet<Option<u64>> =
        rows.iter().map(|r| r.capacity_bytes).collect();
    let at = match (opts.capacity, caps.len()) {
        (CapacityArg::Unlimited, _) => "without a capacity".to_string(),
        (_, 1) => match caps.first().copied().flatten() {
            Some(c) => format!("at {}", format_size(c)),
            None => "without a capacity (none was recorded)".to_string(),
        },
        _ => "at each rank's recorded capacity".to_string(),
    };
    let sentence = format!(
        "{} fits on {fits}/{} {at}: peak reserved at most {}, against {} under the recorded settings",
        opts.what_if,
        rows.len(),
        format_size(max_peak),
        format_size(recorded_max)
    );
    WhatIfAll {
        config: opts.what_if.clone(),
        fits,
        ranks: rows.len(),
        max_peak_reserved_bytes: max_peak,
        recorded_max_peak_reserved_bytes: recorded_max,
        sentence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_come_from_names_or_order() {
        assert_eq!(rank_from_name("dir/ddp4_rank3.pickle.gz"), Some(3));
        assert_eq!(rank_from_name("RANK12_snapshot.pickle"), Some(12));
        assert_eq!(rank_from_name("snap_7.pickle"), Some(7));
        assert_eq!(rank_from_name("snap_v2_7.json.gz"), Some(7));
        assert_eq!(rank_from_name("snapshot.pickle"), None);
        assert_eq!(rank_from_name("ranking.pickle"), None);
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        assert_eq!(assign_ranks(&names(&["a_rank2.p", "a_rank0.p"])), [2, 0]);
        // A duplicate or a missing rank: the order for all.
        assert_eq!(assign_ranks(&names(&["x_1.p", "y_1.p"])), [0, 1]);
        assert_eq!(assign_ranks(&names(&["x_1.p", "y.p"])), [0, 1]);
    }

    fn row(rank: u32, peak: u64) -> RankRow {
        RankRow {
            file: format!("r{rank}"),
            rank,
            device: 0,
            events: 0,
            requests: 0,
            allocator: "pytorch".into(),
            config: String::new(),
            capacity_bytes: None,
            capacity_source: CapacitySource::Unlimited,
            peak_reserved_bytes: peak,
            peak_allocated_bytes: peak,
            fragmentation_at_peak: 0.0,
            max_fragmentation: 0.0,
            oom: None,
            min_capacity_bytes: None,
            what_if: RankWhatIf {
                peak_reserved_bytes: peak / 2,
                served_all: rank != 1,
            },
            devices: 1,
        }
    }

    #[test]
    fn the_outlier_is_named_only_above_ten_percent() {
        let o = RankOptions::default();
        let r = summarize(vec![row(1, 100), row(0, 100), row(2, 111), row(3, 100)], &o).unwrap();
        assert_eq!(r.median_peak_reserved_bytes, 100);
        assert_eq!(
            r.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        let out = r.outlier.unwrap();
        assert_eq!((out.rank, out.above_median_bytes), (2, 11));
        // Exactly 10 % above is not an outlier.
        let r = summarize(vec![row(0, 100), row(1, 100), row(2, 110)], &o).unwrap();
        assert_eq!(r.outlier, None);
        assert_eq!(r.what_if.fits, 2);
        assert!(
            r.what_if
                .sentence
                .starts_with("expandable_segments:True fits on 2/3")
        );
        // The median of an even count: the mean of the middle two.
        let r = summarize(vec![row(0, 10), row(1, 20), row(2, 31), row(3, 40)], &o).unwrap();
        assert_eq!(r.median_peak_reserved_bytes, 25);
    }

    #[test]
    fn no_rows_and_different_devices_are_errors() {
        let o = RankOptions::default();
        assert!(summarize(Vec::new(), &o).is_err());
        let mut b = row(1, 100);
        b.devices = 8;
        let e = summarize(vec![row(0, 100), b], &o).unwrap_err().to_string();
        assert!(e.contains("different devices"), "{e}");
    }
}
