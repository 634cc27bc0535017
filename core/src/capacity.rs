//! The memory capacity a recording ran under, inferred from the recording itself
//! (`--capacity` as recorded): where PyTorch ran out of memory — under
//! `set_per_process_memory_fraction` or because the GPU itself was full — the snapshot
//! does not record the limit, but every segment PyTorch was granted bounds it from below
//! and every refusal bounds it from above.
//!
//! Facts it rests on (c10/cuda/CUDACachingAllocator.cpp, `malloc`):
//! - a request no cached block serves goes to `alloc_block`, which asks the device for
//!   `get_allocation_size(size)` bytes (or maps pages of an expandable segment); under a
//!   fraction it fails when `reserved + alloc_size > allowed`, else when cudaMalloc fails;
//! - on failure the malloc releases cached segments (`release_available_cached_blocks`,
//!   then `release_cached_blocks`) and retries: segment frees recorded inside a malloc
//!   show that its first `alloc_block` was refused at the reserved total before them —
//!   unless `garbage_collection_threshold` released them first, which PyTorch does only
//!   when `reserved > threshold × allowed`;
//! - when the last retry fails too, the `oom` trace entry records the rounded request and
//!   `device_free` (cudaMemGetInfo after the releases): the device cannot have handed out
//!   more than `reserved + device_free` (the driver keeps a page or two of that back).
//!
//! The bounds are exclusive above: every capacity in `[low, high)` explains the
//! recording. The replay uses `high − 1`, the most generous such capacity.

use crate::models::pytorch::PyTorchConfig;
use crate::snapshot::{Action, RawEvent};
pub use crate::trace::evidence::{Bound, BoundKind, CapacityEvidence, Verdict};
use crate::trace::{DeviceTrace, OpKind};
use crate::units::format_size;

/// The bytes a refused request needed from the device: a new segment of
/// `get_allocation_size(rounded)`, or, with expandable segments, at most the request
/// rounded up to the segment's page (fewer when the segment's free tail covers part).
fn needed_bytes(cfg: &PyTorchConfig, rounded: u64) -> u64 {
    const SMALL_SIZE: u64 = 1 << 20;
    const SMALL_BUFFER: u64 = 2 << 20;
    const MIN_LARGE_ALLOC: u64 = 10 << 20;
    const ROUND_LARGE: u64 = 2 << 20;
    if cfg.expandable_segments {
        let page = if rounded <= SMALL_SIZE {
            SMALL_BUFFER
        } else {
            cfg.large_segment_size_bytes
        };
        return rounded.saturating_add(page - 1) / page * page;
    }
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        cfg.large_segment_size_bytes
    } else {
        rounded.saturating_add(ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE
    }
}

/// Reads the capacity bounds of one device from its recorded `events` and the trace built
/// from them (whose inferred `empty_cache()` points are releases no refusal caused).
#[must_use]
pub fn infer(events: &[RawEvent], trace: &DeviceTrace, cfg: &PyTorchConfig) -> CapacityEvidence {
    let start_reserved = trace.start.iter().map(|s| s.size_bytes).sum();
    let empty_cache_at: Vec<u32> = trace
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::EmptyCache)
        .map(|o| o.event_index)
        .collect();
    read_events(events, start_reserved, cfg).finish(&empty_cache_at)
}

/// What [`infer`] reads from the recorded entries alone (the start state's reserved bytes
/// known): it may be read beside the build's pass, which makes the rest of what it needs
/// (the inferred `empty_cache()` points); [`EventBounds::finish`] adds them.
#[derive(Debug, Clone)]
pub struct EventBounds {
    evidence: CapacityEvidence,
    /// The upper bounds in entry order, each kept or not as `finish` finds.
    highs: Vec<High>,
}

/// An upper bound read from the entries.
#[derive(Debug, Clone, Copy)]
enum High {
    /// An `oom` entry's.
    Oom(u64, usize, BoundKind),
    /// A malloc's first `alloc_block` refused (segment frees inside it), unless the build
    /// inferred an `empty_cache()` there: then a reading of it as that.
    Retried(u64, usize),
}

impl EventBounds {
    /// The evidence, given the entries the trace built from them placed an inferred
    /// `empty_cache()` at (its [`OpKind::EmptyCache`] ops' `event_index`es, in op order).
    #[must_use]
    pub fn finish(self, empty_cache_at: &[u32]) -> CapacityEvidence {
        let mut ev = self.evidence;
        for h in self.highs {
            match h {
                High::Oom(bound, i, kind) => ev.lower_high(bound, i, kind),
                High::Retried(bound, i) => {
                    if empty_cache_at.binary_search(&(i as u32)).is_err() {
                        ev.lower_high(bound, i, BoundKind::RetriedMalloc);
                    } else if ev.read_as_empty_cache.is_none_or(|b| bound < b.bytes) {
                        ev.read_as_empty_cache = Some(Bound {
                            bytes: bound,
                            event_index: i as u32,
                            kind: BoundKind::RetriedMalloc,
                        });
                    }
                }
            }
        }
        ev
    }
}

/// [`EventBounds`] of one device's recorded `events`, from `start_reserved` bytes.
#[must_use]
pub fn read_events(events: &[RawEvent], start_reserved: u64, cfg: &PyTorchConfig) -> EventBounds {
    let mut ev = CapacityEvidence {
        memory_fraction: (cfg.per_process_memory_fraction < 1.0)
            .then_some(cfg.per_process_memory_fraction),
        ..CapacityEvidence::default()
    };
    let mut highs = Vec::new();
    let mut reserved = start_reserved;
    if reserved > 0 {
        ev.raise_low(reserved, 0, BoundKind::StartState);
    }
    let is_segment = |a: Action| {
        matches!(
            a,
            Action::SegmentAlloc | Action::SegmentMap | Action::SegmentFree | Action::SegmentUnmap
        )
    };
    let mut i = 0;
    while i < events.len() {
        let e = events[i];
        if !is_segment(e.action) {
            if e.action == Action::Oom {
                note_oom(&mut highs, cfg, reserved, i, &e);
            }
            i += 1;
            continue;
        }
        // A run of segment events; the malloc it belongs to follows it, if any.
        let mut j = i;
        while j < events.len() && is_segment(events[j].action) {
            j += 1;
        }
        let in_malloc = events
            .get(j)
            .is_some_and(|x| matches!(x.action, Action::Alloc | Action::Oom));
        let releases_first = matches!(e.action, Action::SegmentFree | Action::SegmentUnmap);
        let before = reserved;
        let first_new = events[i..j]
            .iter()
            .find(|x| matches!(x.action, Action::SegmentAlloc | Action::SegmentMap));
        if in_malloc
            && releases_first
            && let Some(new) = first_new
        {
            // The first alloc_block was refused at `before`, or GC released first,
            // which needs `before > threshold × capacity`.
            let mut bound = before.saturating_add(new.size);
            let gc = cfg.garbage_collection_threshold;
            if gc > 0.0 {
                bound = bound.max((before as f64 / gc).ceil() as u64);
            }
            highs.push(High::Retried(bound, i));
        }
        for (k, x) in events.iter().enumerate().take(j).skip(i) {
            match x.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    reserved = reserved.saturating_add(x.size);
                    ev.raise_low(reserved, k, BoundKind::Granted);
                }
                _ => reserved = reserved.saturating_sub(x.size),
            }
        }
        i = j;
    }
    EventBounds {
        evidence: ev,
        highs,
    }
}

fn note_oom(highs: &mut Vec<High>, cfg: &PyTorchConfig, reserved: u64, i: usize, e: &RawEvent) {
    let device_free = e.addr;
    highs.push(High::Oom(
        reserved.saturating_add(device_free).saturating_add(1),
        i,
        BoundKind::OomDeviceFree,
    ));
    highs.push(High::Oom(
        reserved.saturating_add(needed_bytes(cfg, e.size)),
        i,
        BoundKind::OomRequest,
    ));
}

/// Where a replay's capacity came from (JSON `capacity_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// `--capacity SIZE`.
    Given,
    /// Inferred from the recording's refusals.
    Recorded,
    /// No limit: `--capacity none`, or nothing was refused (or the evidence contradicts
    /// itself).
    Unlimited,
}

/// What the user asked for (`--capacity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapacityArg {
    /// The capacity inferred from the recording where it shows a refusal, else unlimited.
    #[default]
    AsRecorded,
    /// `none`: unlimited.
    Unlimited,
    /// `SIZE`.
    Bytes(u64),
}

impl CapacityArg {
    /// Parses `SIZE` or `none`.
    pub fn parse(text: &str) -> Result<CapacityArg, String> {
        if text.trim().eq_ignore_ascii_case("none") {
            return Ok(CapacityArg::Unlimited);
        }
        crate::units::parse_size(text).map(CapacityArg::Bytes)
    }

    /// The capacity a trace is loaded (validated) under: a given one, else none (the
    /// recorded device then refuses exactly where the recording did).
    #[must_use]
    pub fn given_bytes(self) -> Option<u64> {
        match self {
            CapacityArg::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

/// The interval an inferred capacity comes from (JSON `capacity_inferred`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InferredInterval {
    /// The largest reserved total the recording was granted (0 when none).
    pub low_bytes: u64,
    /// The smallest total it was refused: every capacity below it and at or above
    /// `low_bytes` explains the recording.
    pub high_bytes: u64,
    pub low_event: Option<u32>,
    pub high_event: u32,
    /// What `high_bytes` was read from.
    pub high_kind: BoundKind,
}

/// The capacity a replay runs under, where it came from, and the one line that says so
/// (serialisable: the app's engine sends it to the UI as it is).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CapacityChoice {
    pub bytes: Option<u64>,
    pub source: CapacitySource,
    pub inferred: Option<InferredInterval>,
    /// One line for every text that uses this capacity: how it was inferred, or why none
    /// could be (None for a given or a plain unlimited capacity).
    pub note: Option<String>,
}

impl CapacityChoice {
    /// A capacity given by the caller, or none.
    #[must_use]
    pub fn given(bytes: Option<u64>) -> CapacityChoice {
        CapacityChoice {
            bytes,
            source: if bytes.is_some() {
                CapacitySource::Given
            } else {
                CapacitySource::Unlimited
            },
            inferred: None,
            note: None,
        }
    }

    /// The capacity `arg` asks for on a device whose recording gave `evidence`.
    #[must_use]
    pub fn choose(arg: CapacityArg, evidence: &CapacityEvidence) -> CapacityChoice {
        match arg {
            CapacityArg::Bytes(b) => CapacityChoice::given(Some(b)),
            CapacityArg::Unlimited => CapacityChoice::given(None),
            CapacityArg::AsRecorded => Self::as_recorded(evidence),
        }
    }

    fn as_recorded(ev: &CapacityEvidence) -> CapacityChoice {
        let mut c = Self::from_bounds(ev);
        if let Some(f) = ev.memory_fraction {
            let said = format!(
                "the snapshot's PYTORCH_CUDA_ALLOC_CONF sets per_process_memory_fraction:{f} (of the GPU's total memory, which the snapshot does not record)"
            );
            c.note = Some(match c.note {
                Some(n) => format!("{n}; {said}"),
                None => said,
            });
        }
        c
    }

    fn from_bounds(ev: &CapacityEvidence) -> CapacityChoice {
        let at = |b: Bound| format!("{} at event {}", b.kind.describe(), b.event_index);
        match (ev.verdict(), ev.high) {
            (Verdict::Inferred(c), Some(h)) => {
                let granted = ev.low.map_or_else(String::new, |l| {
                    format!(
                        " (the recording was granted up to {}, event {})",
                        format_size(l.bytes),
                        l.event_index
                    )
                });
                CapacityChoice {
                    bytes: Some(c),
                    source: CapacitySource::Recorded,
                    inferred: Some(InferredInterval {
                        low_bytes: ev.low.map_or(0, |l| l.bytes),
                        high_bytes: h.bytes,
                        low_event: ev.low.map(|l| l.event_index),
                        high_event: h.event_index,
                        high_kind: h.kind,
                    }),
                    note: Some(format!(
                        "capacity as recorded: {}, inferred from {}{granted}",
                        format_size(c),
                        at(h)
                    )),
                }
            }
            (Verdict::Contradiction, Some(h)) => {
                let l = ev.low.unwrap_or(h);
                CapacityChoice {
                    bytes: None,
                    source: CapacitySource::Unlimited,
                    inferred: None,
                    note: Some(format!(
                        "no capacity inferred: the recording was refused below {} ({}) yet granted {} ({}) — the memory available to PyTorch changed during the run; replayed without a capacity",
                        format_size(h.bytes),
                        at(h),
                        format_size(l.bytes),
                        at(l)
                    )),
                }
            }
            _ => {
                let mut c = CapacityChoice::given(None);
                c.note = ev.read_as_empty_cache.map(|b| {
                    format!(
                        "no refusal recorded: the segment releases before event {} are read as an empty_cache() call; had they been PyTorch's retry under a memory cap, the cap was below {} — pass --capacity to replay under it",
                        b.event_index,
                        format_size(b.bytes)
                    )
                });
                c
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::StackId;

    fn ev(action: Action, addr: u64, size: u64) -> RawEvent {
        RawEvent::new(action, addr, size, 0)
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn an_oom_bounds_the_capacity_by_device_free_and_by_the_segment_it_needed() {
        let cfg = PyTorchConfig::default();
        let events = [
            ev(Action::SegmentAlloc, 0x1000_0000, 2048 * MIB),
            ev(Action::Alloc, 0x1000_0000, 2048 * MIB),
            // 400 MiB refused with 1 GiB free on the device: the request binds.
            ev(Action::Oom, 1024 * MIB, 400 * MIB),
        ];
        let e = infer(&events, &DeviceTrace::default(), &cfg);
        assert_eq!(e.low.unwrap().bytes, 2048 * MIB);
        assert_eq!(e.low.unwrap().event_index, 0);
        let h = e.high.unwrap();
        assert_eq!(
            (h.bytes, h.event_index, h.kind),
            (2448 * MIB, 2, BoundKind::OomRequest)
        );
        assert_eq!(e.verdict(), Verdict::Inferred(2448 * MIB - 1));
        // 400 MiB refused with 300 MiB free: the device's free memory binds.
        let events = [events[0], events[1], ev(Action::Oom, 300 * MIB, 400 * MIB)];
        let e = infer(&events, &DeviceTrace::default(), &cfg);
        assert_eq!(e.high.unwrap().kind, BoundKind::OomDeviceFree);
        assert_eq!(e.verdict(), Verdict::Inferred(2348 * MIB));
    }

    #[test]
    fn releases_inside_a_malloc_are_a_refusal_unless_read_as_empty_cache() {
        let cfg = PyTorchConfig::default();
        let events = [
            ev(Action::SegmentAlloc, 0x1000_0000, 300 * MIB),
            ev(Action::Alloc, 0x1000_0000, 300 * MIB),
            ev(Action::FreeRequested, 0x1000_0000, 300 * MIB),
            ev(Action::FreeCompleted, 0x1000_0000, 300 * MIB),
            ev(Action::SegmentFree, 0x1000_0000, 300 * MIB),
            ev(Action::SegmentAlloc, 0x2000_0000, 500 * MIB),
            ev(Action::Alloc, 0x2000_0000, 500 * MIB),
        ];
        let e = infer(&events, &DeviceTrace::default(), &cfg);
        let h = e.high.unwrap();
        assert_eq!((h.bytes, h.event_index), (800 * MIB, 4));
        assert_eq!(e.low.unwrap().bytes, 500 * MIB);
        // The same releases explained by an empty_cache() call: no refusal.
        let trace = DeviceTrace {
            ops: vec![crate::trace::Op {
                kind: OpKind::EmptyCache,
                event_index: 4,
                recorded_addr: 0,
                stack: StackId::EMPTY,
                time_us: 0,
            }],
            ..DeviceTrace::default()
        };
        let e = infer(&events, &trace, &cfg);
        assert_eq!(e.verdict(), Verdict::NoRefusal);
        let c = CapacityChoice::choose(CapacityArg::AsRecorded, &e);
        assert_eq!((c.bytes, c.source), (None, CapacitySource::Unlimited));
        // The other reading is said, with the cap it would imply.
        let note = c.note.unwrap();
        assert!(
            note.contains("event 4") && note.contains("800.00 MiB"),
            "{note}"
        );
    }

    #[test]
    fn a_grant_above_a_refusal_is_a_contradiction_and_no_capacity() {
        let cfg = PyTorchConfig::default();
        let events = [
            ev(Action::Oom, 0, 100 * MIB),
            ev(Action::SegmentAlloc, 0x1000_0000, 200 * MIB),
            ev(Action::Alloc, 0x1000_0000, 200 * MIB),
        ];
        let e = infer(&events, &DeviceTrace::default(), &cfg);
        assert_eq!(e.verdict(), Verdict::Contradiction);
        let c = CapacityChoice::choose(CapacityArg::AsRecorded, &e);
        assert_eq!((c.bytes, c.source), (None, CapacitySource::Unlimited));
        let note = c.note.unwrap();
        assert!(note.starts_with("no capacity inferred"), "{note}");
        assert!(
            note.contains("event 0") && note.contains("event 1"),
            "{note}"
        );
    }

    #[test]
    fn a_snapshots_own_memory_fraction_is_reported_as_a_fraction() {
        let cfg = PyTorchConfig::parse("per_process_memory_fraction:0.5").unwrap();
        let e = infer(&[], &DeviceTrace::default(), &cfg);
        assert_eq!(e.memory_fraction, Some(0.5));
        let c = CapacityChoice::choose(CapacityArg::AsRecorded, &e);
        let note = c.note.unwrap();
        assert!(note.contains("per_process_memory_fraction:0.5"), "{note}");
        assert!(note.contains("does not record"), "{note}");
        let plain = infer(&[], &DeviceTrace::default(), &PyTorchConfig::default());
        assert_eq!(plain.memory_fraction, None);
    }

    #[test]
    fn capacity_arguments_parse_sizes_and_none() {
        assert_eq!(CapacityArg::parse("none"), Ok(CapacityArg::Unlimited));
        assert_eq!(CapacityArg::parse("NONE"), Ok(CapacityArg::Unlimited));
        assert_eq!(CapacityArg::parse("2GiB"), Ok(CapacityArg::Bytes(2 << 30)));
        assert!(CapacityArg::parse("lots").is_err());
        let c = CapacityChoice::choose(CapacityArg::Bytes(5), &CapacityEvidence::default());
        assert_eq!((c.bytes, c.source), (Some(5), CapacitySource::Given));
    }

    #[test]
    fn expandable_segments_need_at_most_the_request_in_whole_pages() {
        let mut cfg = PyTorchConfig::default();
        assert_eq!(needed_bytes(&cfg, 512), 2 * MIB);
        assert_eq!(needed_bytes(&cfg, 5 * MIB), 20 * MIB);
        assert_eq!(needed_bytes(&cfg, 21 * MIB), 22 * MIB);
        cfg.expandable_segments = true;
        assert_eq!(needed_bytes(&cfg, 512), 2 * MIB);
        assert_eq!(needed_bytes(&cfg, 21 * MIB), 40 * MIB);
    }
}
