//! The diff of two runs (`allocsim diff A B`): each run replayed under its own settings,
//! the two timelines on a common axis, and what changed at the peak.
//!
//! - **The common axis.** `time`: seconds since the run's first op; `events`: the event
//!   index; `steps`: the step number, a step starting at each repeated marker
//!   (`annotate`/`user_defined` entries or `user_metadata`, the most frequent text) or,
//!   without markers, at each call of the optimizer (the first allocation of every run of
//!   allocations from `torch/optim/` frames), positions between two starts interpolated by
//!   event index.
//! - **The peak** is the op that first brought reserved memory to its maximum. What was
//!   allocated there (blocks waiting for other streams after their free count as free, as
//!   in PyTorch's `allocated_bytes`) is grouped by allocation site ([`crate::explain::site_of`]: the top user
//!   frame, a size class without frames) and summed in block bytes, so that per run the
//!   sites add up to the allocated bytes at the peak and reserved = sites + reserved but
//!   unallocated. The sentence splits the change of peak reserved memory exactly so.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::Error;
use crate::explain::site_of;
use crate::models::{LayoutBlockState, ModelSpec};
use crate::replay::{self, Outcome, ReplayOptions, ReplayResult};
use crate::session;
use crate::trace::{DeviceTrace, OpKind, Trace};
use crate::units::format_size;

/// The common axis of the two timelines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Align {
    /// Seconds since the run's first op.
    #[default]
    Time,
    /// The event index (`device_traces[d][i]`).
    Events,
    /// The step number (markers, else the optimizer's calls).
    Steps,
}

impl Align {
    /// Parses `time`, `events` or `steps`.
    pub fn parse(s: &str) -> Result<Align, String> {
        match s {
            "time" => Ok(Align::Time),
            "events" => Ok(Align::Events),
            "steps" => Ok(Align::Steps),
            _ => Err(format!("'{s}': expected time, events or steps")),
        }
    }

    /// The axis's unit, for labels.
    #[must_use]
    pub fn unit(self) -> &'static str {
        match self {
            Align::Time => "s",
            Align::Events => "event",
            Align::Steps => "step",
        }
    }
}

/// Where a run's steps came from (`--align steps`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepSource {
    /// Repeated marker entries with this text.
    Markers { text: String },
    /// The optimizer's calls (allocations from `torch/optim/`).
    Optimizer,
}

/// One run of a diff: its replay's summary, where it peaked, and its curve on the axis.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DiffRun {
    pub file: String,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// The event of the op that first brought reserved memory to its peak (None: the
    /// state before the first op).
    pub peak_event: Option<u64>,
    pub fragmentation_at_peak: f64,
    /// The effective PyTorch (or other model's) configuration, canonical.
    pub config: String,
    pub allocator: String,
    pub capacity_bytes: Option<u64>,
    /// Allocated bytes at the reserved peak (the sum of the sites).
    pub allocated_at_peak_bytes: u64,
    /// The peak's position on the common axis.
    pub peak_at: f64,
    /// Where the steps came from (`--align steps` only; else None).
    pub steps: Option<StepSource>,
    /// The first request the run could not serve (a simulated OOM), as an event index.
    pub oom_event: Option<u64>,
    /// Live block bytes by allocation site at the peak.
    #[serde(skip)]
    pub by_site: BTreeMap<String, u64>,
    /// The timeline on the common axis: one point per op.
    #[serde(skip)]
    pub curve: Curve,
}

/// A run's reserved and allocated bytes after each op, at its position on the axis.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Curve {
    pub x: Vec<f64>,
    pub reserved_bytes: Vec<u64>,
    pub allocated_bytes: Vec<u64>,
}

/// One allocation site's live bytes at each run's peak.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SiteDelta {
    pub site: String,
    pub a_bytes: u64,
    pub b_bytes: u64,
    pub delta_bytes: i64,
}

/// A setting whose value differs (`None`: PyTorch's default, the key not set).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SettingDiff {
    pub setting: String,
    pub a: Option<String>,
    pub b: Option<String>,
}

/// The diff of two runs: the JSON of `allocsim diff` after `"schema"`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Diff {
    pub a: DiffRun,
    pub b: DiffRun,
    pub align: Align,
    pub peak_reserved_delta_bytes: i64,
    pub peak_allocated_delta_bytes: i64,
    /// Change of reserved-but-unallocated bytes at the peak (reserved − allocated there).
    pub free_at_peak_delta_bytes: i64,
    /// Every site live at either peak, the largest growth first.
    pub by_site: Vec<SiteDelta>,
    pub settings_differ: Vec<SettingDiff>,
    pub summary: String,
}

/// Why a run cannot be measured.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error(transparent)]
    Core(#[from] Error),
    /// `--align steps` on a run with neither markers nor optimizer calls.
    #[error(
        "no steps to align on: no repeated annotate or user_metadata markers, and fewer than two optimizer calls (allocations from torch/optim/ frames); use --align time or events"
    )]
    NoSteps,
}

/// Replays device `device` of `trace` (from `file`) through `spec` under `capacity` and
/// measures what [`diff`] compares, on the axis `align`.
pub fn run(
    file: &str,
    trace: &Trace,
    device: usize,
    spec: &ModelSpec,
    capacity: Option<u64>,
    align: Align,
) -> Result<DiffRun, DiffError> {
    let dt = trace
        .devices
        .get(device)
        .ok_or(crate::QueryError::NoDevice { device })
        .map_err(Error::from)?;
    let opts = ReplayOptions {
        keep_timeline: true,
        ..ReplayOptions::default()
    };
    let r = session::replay_device(trace, device, spec, capacity, opts)?;
    let (x, steps) = axis(trace, device, align)?;
    // The op that first brought reserved memory to its peak; none if the state before the
    // first op was the peak.
    let peak_op = r
        .timeline
        .reserved_bytes
        .iter()
        .position(|b| b == r.peak_reserved_bytes);
    let ops_done = peak_op.map_or(0, |k| k + 1);
    let by_site = sites_at(trace, dt, &r, ops_done);
    let allocated_at_peak_bytes = by_site.values().sum();
    let peak_at = match peak_op {
        Some(k) => x.get(k).copied().unwrap_or(0.0),
        None => x.first().copied().unwrap_or(0.0),
    };
    let mut x = x;
    x.truncate(r.timeline.len());
    let curve = Curve {
        reserved_bytes: r.timeline.reserved_bytes.to_vec(),
        allocated_bytes: r.timeline.allocated_bytes.to_vec(),
        x,
    };
    Ok(DiffRun {
        file: file.to_string(),
        peak_reserved_bytes: r.peak_reserved_bytes,
        peak_allocated_bytes: r.peak_allocated_bytes,
        peak_event: peak_op.map(|k| u64::from(dt.ops[k].event_index)),
        fragmentation_at_peak: r.fragmentation_at_peak,
        config: r.config.clone(),
        allocator: r.allocator.to_string(),
        capacity_bytes: r.capacity_bytes,
        allocated_at_peak_bytes,
        peak_at,
        steps,
        oom_event: r.ooms.iter().find(|o| o.fatal).map(|o| o.event_index),
        by_site,
        curve,
    })
}

/// Live block bytes by allocation site after `ops_done` ops of a replay kept with
/// checkpoints: the layout there, each live block traced to the alloc op served at its
/// address (the last one before: an earlier one at the same address was freed first).
fn sites_at(
    trace: &Trace,
    dt: &DeviceTrace,
    r: &ReplayResult,
    ops_done: usize,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(layout) = replay::layout_at(dt, r, ops_done) else {
        return out;
    };
    let mut op_at: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (k, o) in r.outcomes.iter().enumerate().take(ops_done) {
        if let Outcome::Served(a) = o {
            op_at.insert(a, k);
        }
    }
    let frames = &trace.snapshot.frames;
    for seg in &layout.segments {
        for b in &seg.blocks {
            // A block freed while other streams use it (`record_stream`) no longer counts
            // as allocated, in PyTorch's stats as in the model's: it is reserved-but-free.
            if b.state != LayoutBlockState::Allocated {
                continue;
            }
            let site = match op_at.get(&b.addr).map(|&k| &dt.ops[k]) {
                Some(op) => {
                    let size = match op.kind {
                        OpKind::Alloc { size_bytes, .. } => size_bytes,
                        _ => b.requested_bytes,
                    };
                    site_of(frames, op.stack, size)
                }
                None => site_of(frames, crate::snapshot::StackId::EMPTY, b.requested_bytes),
            };
            *out.entry(site).or_insert(0) += b.size_bytes;
        }
    }
    out
}

/// Each op's position on the axis `align`, and where the steps came from.
fn axis(
    trace: &Trace,
    device: usize,
    align: Align,
) -> Result<(Vec<f64>, Option<StepSource>), DiffError> {
    let dt = &trace.devices[device];
    Ok(match align {
        Align::Time => {
            let t0 = dt.ops.first().map_or(0, |o| o.time_us);
            let x = dt
                .ops
                .iter()
                .map(|o| (o.time_us - t0) as f64 / 1e6)
                .collect();
            (x, None)
        }
        Align::Events => (
            dt.ops.iter().map(|o| f64::from(o.event_index)).collect(),
            None,
        ),
        Align::Steps => {
            let (starts, source) = step_starts(trace, device)?;
            let x = dt
                .ops
                .iter()
                .map(|o| step_position(&starts, u64::from(o.event_index)))
                .collect();
            (x, Some(source))
        }
    })
}

/// The event indices at which steps start: the most frequent marker text's entries (at
/// least two), else the first allocation of each run of optimizer allocations.
pub fn step_starts(trace: &Trace, device: usize) -> Result<(Vec<u64>, StepSource), DiffError> {
    let snap = &trace.snapshot;
    let mut markers: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for m in snap.markers.get(device).map_or(&[][..], Vec::as_slice) {
        markers
            .entry(snap.frames.str(m.text))
            .or_default()
            .push(m.event_index);
    }
    // The most frequent text; among equals the first in order.
    if let Some((text, at)) = markers
        .into_iter()
        .filter(|(_, v)| v.len() >= 2)
        .max_by_key(|(_, v)| (v.len(), std::cmp::Reverse(v[0])))
    {
        return Ok((
            at,
            StepSource::Markers {
                text: text.to_string(),
            },
        ));
    }
    let dt = &trace.devices[device];
    let optim = |stack| {
        snap.frames.stack(stack).iter().any(|&f| {
            snap.frames
                .frame(f)
                .is_some_and(|fr| snap.frames.str(fr.filename).contains("torch/optim/"))
        })
    };
    let mut starts = Vec::new();
    let mut inside = false;
    for op in dt.ops.iter().filter(|o| o.is_alloc()) {
        let now = optim(op.stack);
        if now && !inside {
            starts.push(u64::from(op.event_index));
        }
        inside = now;
    }
    if starts.len() < 2 {
        return Err(DiffError::NoSteps);
    }
    Ok((starts, StepSource::Optimizer))
}

/// The step position of event `e`: `i + (e − s_i) / (s_{i+1} − s_i)` between starts
/// `s_i` and `s_{i+1}`, the first and last steps' lengths extended before and after.
/// `starts` holds at least two increasing events.
#[must_use]
pub fn step_position(starts: &[u64], e: u64) -> f64 {
    let n = starts.len();
    let i = starts
        .partition_point(|&s| s <= e)
        .saturating_sub(1)
        .min(n - 2);
    let (s0, s1) = (starts[i] as f64, starts[i + 1] as f64);
    i as f64 + (e as f64 - s0) / (s1 - s0).max(1.0)
}

/// Compares two runs measured by [`run`] on the same axis.
#[must_use]
pub fn diff(a: DiffRun, b: DiffRun, align: Align) -> Diff {
    let delta = |x: u64, y: u64| i64::try_from(i128::from(y) - i128::from(x)).unwrap_or(i64::MAX);
    let mut by_site: Vec<SiteDelta> = a
        .by_site
        .keys()
        .chain(b.by_site.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|site| {
            let (x, y) = (
                a.by_site.get(site).copied().unwrap_or(0),
                b.by_site.get(site).copied().unwrap_or(0),
            );
            SiteDelta {
                site: site.clone(),
                a_bytes: x,
                b_bytes: y,
                delta_bytes: delta(x, y),
            }
        })
        .collect();
    by_site.sort_by(|p, q| {
        q.delta_bytes
            .cmp(&p.delta_bytes)
            .then_with(|| p.site.cmp(&q.site))
    });
    let free = |r: &DiffRun| {
        r.peak_reserved_bytes
            .saturating_sub(r.allocated_at_peak_bytes)
    };
    let free_delta = delta(free(&a), free(&b));
    let settings_differ = settings_differ(&a.config, &b.config);
    let reserved_delta = delta(a.peak_reserved_bytes, b.peak_reserved_bytes);
    let summary = summary(
        &a,
        &b,
        reserved_delta,
        &by_site,
        free_delta,
        &settings_differ,
    );
    Diff {
        peak_reserved_delta_bytes: reserved_delta,
        peak_allocated_delta_bytes: delta(a.peak_allocated_bytes, b.peak_allocated_bytes),
        free_at_peak_delta_bytes: free_delta,
        a,
        b,
        align,
        by_site,
        settings_differ,
        summary,
    }
}

/// A signed size: `+1.50 GiB`, `-20.00 MiB`, `0 bytes`.
#[must_use]
pub fn format_delta(bytes: i64) -> String {
    if bytes == 0 {
        return "0 bytes".to_string();
    }
    let sign = if bytes < 0 { '-' } else { '+' };
    format!("{sign}{}", format_size(bytes.unsigned_abs()))
}

/// The settings of two canonical config strings (`key:value,…`, defaults left out) whose
/// values differ, in key order.
#[must_use]
pub fn settings_differ(a: &str, b: &str) -> Vec<SettingDiff> {
    let (ma, mb) = (config_map(a), config_map(b));
    let keys: std::collections::BTreeSet<&String> = ma.keys().chain(mb.keys()).collect();
    keys.into_iter()
        .filter(|k| ma.get(*k) != mb.get(*k))
        .map(|k| SettingDiff {
            setting: k.clone(),
            a: ma.get(k).cloned(),
            b: mb.get(k).cloned(),
        })
        .collect()
}

/// `key:value` pairs of a canonical config; commas inside brackets belong to the value.
fn config_map(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let (mut depth, mut start) = (0i32, 0);
    let bytes = s.as_bytes();
    for i in 0..=bytes.len() {
        let c = bytes.get(i).copied();
        match c {
            Some(b'[') => depth += 1,
            Some(b']') => depth -= 1,
            Some(b',') | None if depth <= 0 => {
                let item = s[start..i].trim();
                if !item.is_empty() {
                    let (k, v) = item.split_once(':').unwrap_or((item, ""));
                    out.insert(k.trim().to_string(), v.trim().to_string());
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    out
}

/// "B peaks 152.00 MiB higher (1.36 GiB → 1.50 GiB reserved): +12.00 MiB at
/// `capture.py:586 diff_train`, +140.00 MiB more reserved-but-free": the change of peak
/// reserved memory split exactly into the sites that changed most, the rest of the sites,
/// and reserved-but-unallocated bytes.
fn summary(
    a: &DiffRun,
    b: &DiffRun,
    reserved_delta: i64,
    by_site: &[SiteDelta],
    free_delta: i64,
    settings: &[SettingDiff],
) -> String {
    let peaks = format!(
        "({} → {} reserved)",
        format_size(a.peak_reserved_bytes),
        format_size(b.peak_reserved_bytes)
    );
    let mut s = match reserved_delta.cmp(&0) {
        std::cmp::Ordering::Equal => format!(
            "B peaks at the same reserved memory as A ({})",
            format_size(a.peak_reserved_bytes)
        ),
        std::cmp::Ordering::Greater => format!(
            "B peaks {} higher {peaks}",
            format_size(reserved_delta.unsigned_abs())
        ),
        std::cmp::Ordering::Less => format!(
            "B peaks {} lower {peaks}",
            format_size(reserved_delta.unsigned_abs())
        ),
    };
    // The two sites that moved most in the direction of the change (growth when B peaks
    // at least as high), then the rest, then the free bytes: they add up exactly.
    let mut named: Vec<&SiteDelta> = by_site.iter().filter(|d| d.delta_bytes != 0).collect();
    if reserved_delta < 0 {
        named.sort_by(|p, q| p.delta_bytes.cmp(&q.delta_bytes).then(p.site.cmp(&q.site)));
    }
    named.truncate(2);
    let mut parts: Vec<String> = named
        .iter()
        .map(|d| format!("{} at {}", format_delta(d.delta_bytes), d.site))
        .collect();
    let rest: i64 = by_site.iter().map(|d| d.delta_bytes).sum::<i64>()
        - named.iter().map(|d| d.delta_bytes).sum::<i64>();
    if rest != 0 {
        parts.push(format!("{} at other sites", format_delta(rest)));
    }
    if free_delta != 0 {
        parts.push(format!(
            "{} {} reserved-but-free",
            format_delta(free_delta),
            if free_delta > 0 { "more" } else { "less" }
        ));
    }
    if !parts.is_empty() {
        let _ = write!(s, ": {}", parts.join(", "));
    }
    if !settings.is_empty() {
        let list: Vec<String> = settings
            .iter()
            .map(|d| {
                format!(
                    "{} {} → {}",
                    d.setting,
                    d.a.as_deref().unwrap_or("default"),
                    d.b.as_deref().unwrap_or("default")
                )
            })
            .collect();
        let _ = write!(s, "; settings differ: {}", list.join(", "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_differ_reads_bracketed_values_and_defaults() {
        let d = settings_differ(
            "expandable_segments:True,roundup_power2_divisions:[1:4,2:4]",
            "roundup_power2_divisions:[1:4,2:8],max_split_size_mb:256",
        );
        let keys: Vec<&str> = d.iter().map(|x| x.setting.as_str()).collect();
        assert_eq!(
            keys,
            [
                "expandable_segments",
                "max_split_size_mb",
                "roundup_power2_divisions"
            ]
        );
        assert_eq!(d[0].a.as_deref(), Some("True"));
        assert_eq!(d[0].b, None);
        assert_eq!(d[2].b.as_deref(), Some("[1:4,2:8]"));
        assert!(settings_differ("", "").is_empty());
    }

    #[test]
    fn step_positions_interpolate_between_starts_and_extend_at_the_ends() {
        let s = [100, 200, 400];
        assert!((step_position(&s, 100) - 0.0).abs() < 1e-12);
        assert!((step_position(&s, 150) - 0.5).abs() < 1e-12);
        assert!((step_position(&s, 300) - 1.5).abs() < 1e-12);
        assert!((step_position(&s, 400) - 2.0).abs() < 1e-12);
        assert!((step_position(&s, 600) - 3.0).abs() < 1e-12);
        assert!((step_position(&s, 50) + 0.5).abs() < 1e-12);
    }

    #[test]
    fn deltas_print_with_their_sign() {
        assert_eq!(format_delta(12 << 20), "+12.00 MiB");
        assert_eq!(format_delta(-(3 << 30)), "-3.00 GiB");
        assert_eq!(format_delta(0), "0 bytes");
    }
}
