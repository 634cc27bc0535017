//! A PyTorch memory snapshot as the file states it (`torch.cuda.memory._snapshot()`):
//! segments of the end state, the per-device trace ring buffers and the allocator
//! settings, with stack frames interned once in a [`FrameTable`].
//!
//! This is the *faithful* form of the file; [`crate::trace`] builds the replayable trace
//! (what the file leaves implicit made explicit) on top of it.

mod error;
pub mod frames;
pub mod gzip;
pub mod import;
pub mod json;
pub mod pickle;
mod schema;
pub mod stream;
pub mod write;

pub use error::ImportError;
pub use frames::{Frame, FrameId, FrameTable, FxInfo, StackId, StrId};
pub use import::decode_snapshot;

/// Which of the two default pools a segment belongs to (`segment_type`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SegmentType {
    Small,
    Large,
}

/// A block's `state` in the snapshot's segment list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// `active_allocated`: a live allocation.
    ActiveAllocated,
    /// `active_pending_free`: freed, waiting for `record_stream` events.
    ActivePendingFree,
    /// `inactive`: free, cached in its pool.
    Inactive,
}

/// A trace entry's `action`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    bytemuck::Zeroable,
)]
#[serde(rename_all = "snake_case")]
#[repr(u8)] // all-zero is `Alloc`: entry lists are allocated zeroed (`pickle::parallel`)
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    /// The allocator raised out-of-memory; `addr` holds `device_free`, `size` the rounded request.
    Oom,
    /// A `snapshot()` call; no allocator decision.
    Snapshot,
    /// Anything else (`user_defined`, post-2.11 `annotate`, …): kept, never replayed.
    Other,
}

impl Action {
    /// The action as PyTorch spells it (`Other` as `other`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::Other => "other",
        }
    }

    /// Parses PyTorch's action string; unknown strings become [`Action::Other`].
    #[must_use]
    pub fn from_bytes(s: &[u8]) -> Action {
        match s {
            b"alloc" => Action::Alloc,
            b"free_requested" => Action::FreeRequested,
            b"free_completed" => Action::FreeCompleted,
            b"segment_alloc" => Action::SegmentAlloc,
            b"segment_free" => Action::SegmentFree,
            b"segment_map" => Action::SegmentMap,
            b"segment_unmap" => Action::SegmentUnmap,
            b"oom" => Action::Oom,
            b"snapshot" => Action::Snapshot,
            _ => Action::Other,
        }
    }
}

/// What an [`Action::Other`] entry is (the allocator's own actions are `Plain`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, bytemuck::Zeroable,
)]
#[serde(rename_all = "snake_case")]
#[repr(u8)] // all-zero is the first variant: entry lists are allocated zeroed
pub enum OtherAction {
    /// Not an [`Action::Other`].
    #[default]
    Plain,
    /// `annotate` (2.13+, `torch.cuda.memory._annotate_memory`, #190575): a note on a live
    /// block (`addr`, its requested `size`, `user_metadata` the note, `frames`); no
    /// allocator decision.
    Annotate,
    /// `user_defined` (older recordings' `record_function` annotations).
    UserDefined,
    /// An action this decoder does not know.
    Unknown,
}

impl OtherAction {
    /// Classifies an action string that [`Action::from_bytes`] maps to [`Action::Other`].
    #[must_use]
    pub fn from_bytes(s: &[u8]) -> OtherAction {
        match s {
            b"annotate" => OtherAction::Annotate,
            b"user_defined" => OtherAction::UserDefined,
            _ => OtherAction::Unknown,
        }
    }
}

/// One trace entry (`device_traces[d][i]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Zeroable)]
pub struct RawEvent {
    pub action: Action,
    /// Which kind of [`Action::Other`] entry this is.
    pub other: OtherAction,
    /// `addr`; for [`Action::Oom`] the entry's `device_free`.
    pub addr: u64,
    /// `size` (un-rounded request for alloc/free_*, rounded request for oom).
    pub size: u64,
    /// `stream` (`cudaStream_t` as an integer, 0 = legacy default stream).
    pub stream: u64,
    /// `time_us`, 0 when absent.
    pub time_us: i64,
    /// The entry's `frames`.
    pub stack: StackId,
    /// The entry's `pool_id` (2.12+, #177717): 1 + index into
    /// [`RawSnapshot::event_pools`]; 0 when the entry has none (older files) or it is not
    /// a pair of integers. Read it with [`RawSnapshot::pool_id`].
    pub pool: u32,
    /// `user_metadata` (≈2.8+; "" when absent or not a string); for an `annotate` entry
    /// the note.
    pub user_metadata: StrId,
}

impl RawEvent {
    /// An entry of `action` at `addr` of `size` bytes on `stream`, nothing else recorded
    /// (hand-built traces).
    #[must_use]
    pub fn new(action: Action, addr: u64, size: u64, stream: u64) -> RawEvent {
        RawEvent {
            action,
            other: OtherAction::Plain,
            addr,
            size,
            stream,
            time_us: 0,
            stack: StackId::EMPTY,
            pool: 0,
            user_metadata: StrId::default(),
        }
    }
}

/// One block of a segment in the end state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBlock {
    /// Block address (given in newer files; otherwise segment address + sizes before it).
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    pub stack: StackId,
}

/// One segment of the end state (`segments[i]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSegment {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    pub segment_type: SegmentType,
    /// `segment_pool_id`; `(0, 0)` for the default pools.
    pub segment_pool_id: (u64, u64),
    pub is_expandable: bool,
    pub stack: StackId,
    /// In address order, tiling the segment.
    pub blocks: Vec<RawBlock>,
}

/// `allocator_settings` (keys that are absent keep PyTorch's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct RawSettings {
    /// `PYTORCH_CUDA_ALLOC_CONF` as last parsed ("" if never set).
    pub conf: String,
    /// `max_split_size` in bytes; `None` for PyTorch's −1 (unlimited).
    pub max_split_size_bytes: Option<u64>,
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// The effective 16-entry `roundup_power2_divisions` table, if the file has it
    /// (keys "1", "2", … "32768" in MiB, index = log2 of the key).
    pub roundup_power2_divisions: Option<[u32; 16]>,
    /// Whether the file had an `allocator_settings` dict at all.
    pub present: bool,
    /// `trace_alloc_overflowed` (2.13+, #179276): per device, whether the ring buffer
    /// dropped its oldest entries (one value when the file gives a single bool).
    pub trace_alloc_overflowed: Vec<bool>,
    /// `trace_alloc_max_entries` (2.13+): per device, the ring buffer's size.
    pub trace_alloc_max_entries: Vec<u64>,
    /// Keys of `allocator_settings` this decoder does not interpret, in file order: kept to
    /// be reported, never refused.
    pub other_keys: Vec<String>,
}

impl Default for RawSettings {
    fn default() -> Self {
        RawSettings {
            conf: String::new(),
            max_split_size_bytes: None,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            roundup_power2_divisions: None,
            present: false,
            trace_alloc_overflowed: Vec::new(),
            trace_alloc_max_entries: Vec::new(),
            other_keys: Vec::new(),
        }
    }
}

/// A whole snapshot file, decoded.
#[derive(Debug, Clone, Default)]
pub struct RawSnapshot {
    /// Segments of every device, as in the file (sorted by address per device).
    pub segments: Vec<RawSegment>,
    /// `device_traces[d]`: the ring buffer of device `d`, oldest first.
    pub device_traces: Vec<Vec<RawEvent>>,
    pub settings: RawSettings,
    /// Every stack of the file, interned.
    pub frames: FrameTable,
    /// The distinct `pool_id`s of trace entries ([`RawEvent::pool`] − 1 indexes it).
    pub event_pools: Vec<(u64, u64)>,
    /// `host_segments` (2.13+, `record_pinned_host_memory`, #182407): the pinned host
    /// allocator's segments. Host memory, never counted as device memory.
    pub host_segments: Vec<HostSegment>,
    /// `host_traces`: the pinned host allocator's trace entries, oldest first (all lists
    /// of the file concatenated). Never replayed.
    pub host_traces: Vec<RawEvent>,
    /// Items of `host_segments` / `host_traces` that are not of the expected shape:
    /// skipped (host data is only displayed), counted here.
    pub host_items_skipped: u64,
}

/// One segment of the pinned host allocator (`host_segments[i]`), as far as it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSegment {
    pub address: u64,
    /// `total_size` (or `size`).
    pub total_size: u64,
    /// `allocated_size`, 0 when absent.
    pub allocated_size: u64,
}

/// What a snapshot holds beyond the device state and trace, in short: the `validate`
/// JSON's `"snapshot"` object (one contract type, serialised as is).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotExtras {
    pub host_segments: HostSummary,
    pub host_trace_entries: u64,
    pub host_items_skipped: u64,
    /// `annotate` entries over all device traces.
    pub annotate_entries: u64,
    /// Entries with an action this decoder does not know.
    pub unknown_action_entries: u64,
    /// Entries with a non-empty `user_metadata`.
    pub user_metadata_entries: u64,
    /// Distinct `pool_id`s on trace entries other than `(0, 0)`.
    pub entry_private_pools: Vec<(u64, u64)>,
    /// Per device, `trace_alloc_overflowed` (empty when the file does not say).
    pub trace_alloc_overflowed: Vec<bool>,
    /// Per device, `trace_alloc_max_entries`.
    pub trace_alloc_max_entries: Vec<u64>,
    /// `allocator_settings` keys kept but not interpreted.
    pub unknown_settings_keys: Vec<String>,
    /// Frames carrying FX node information (`torch.compile` graphs).
    pub fx_frames: u64,
}

impl SnapshotExtras {
    /// One line for each thing the snapshot holds beyond the device trace (what the app's
    /// "About this trace" lists); nothing for a plain 2.11 recording.
    #[must_use]
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        let h = &self.host_segments;
        if h.count > 0 || self.host_trace_entries > 0 {
            out.push(format!(
                "pinned host memory (not device memory, not replayed): {} segments, {} reserved, {} allocated; {} host trace entries",
                h.count,
                crate::units::format_size(h.total_bytes),
                crate::units::format_size(h.allocated_bytes),
                self.host_trace_entries
            ));
        }
        if self.annotate_entries > 0 {
            out.push(format!(
                "{} annotate entries (notes on live blocks; no allocator decision)",
                self.annotate_entries
            ));
        }
        if self.user_metadata_entries > 0 {
            out.push(format!(
                "{} entries carry user_metadata",
                self.user_metadata_entries
            ));
        }
        if self.fx_frames > 0 {
            out.push(format!(
                "{} stack frames carry torch.compile FX node information",
                self.fx_frames
            ));
        }
        if self.trace_alloc_overflowed.iter().any(|&o| o) {
            out.push("the trace's ring buffer overflowed (trace_alloc_overflowed): its oldest entries are gone".to_string());
        }
        if !self.unknown_settings_keys.is_empty() {
            out.push(format!(
                "allocator_settings keys kept but not interpreted: {}",
                self.unknown_settings_keys.join(", ")
            ));
        }
        if self.host_items_skipped + self.unknown_action_entries > 0 {
            out.push(format!(
                "{} host items of an unexpected shape and {} entries with an unknown action were skipped (displayed data only)",
                self.host_items_skipped, self.unknown_action_entries
            ));
        }
        out
    }
}

/// A count and a byte total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostSummary {
    pub count: u64,
    pub total_bytes: u64,
    pub allocated_bytes: u64,
}

impl RawSnapshot {
    /// Approximate heap bytes held by the snapshot (capacities, not lengths, of its
    /// vectors; interned strings with their box overhead).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        let segments = self.segments.capacity() * std::mem::size_of::<RawSegment>()
            + self
                .segments
                .iter()
                .map(|s| s.blocks.capacity() * std::mem::size_of::<RawBlock>())
                .sum::<usize>();
        let traces = self.device_traces.capacity() * std::mem::size_of::<Vec<RawEvent>>()
            + self
                .device_traces
                .iter()
                .map(|t| t.capacity() * std::mem::size_of::<RawEvent>())
                .sum::<usize>();
        let extras = self.event_pools.capacity() * std::mem::size_of::<(u64, u64)>()
            + self.host_segments.capacity() * std::mem::size_of::<HostSegment>()
            + self.host_traces.capacity() * std::mem::size_of::<RawEvent>();
        segments + traces + extras + self.settings.conf.capacity() + self.frames.heap_bytes()
    }

    /// An entry's `pool_id`, if the file gives one.
    #[must_use]
    pub fn pool_id(&self, e: &RawEvent) -> Option<(u64, u64)> {
        let i = usize::try_from(e.pool.checked_sub(1)?).ok()?;
        self.event_pools.get(i).copied()
    }

    /// The short summary of what the snapshot holds beyond the device state.
    #[must_use]
    pub fn extras(&self) -> SnapshotExtras {
        let mut x = SnapshotExtras {
            host_trace_entries: self.host_traces.len() as u64,
            host_items_skipped: self.host_items_skipped,
            trace_alloc_overflowed: self.settings.trace_alloc_overflowed.clone(),
            trace_alloc_max_entries: self.settings.trace_alloc_max_entries.clone(),
            unknown_settings_keys: self.settings.other_keys.clone(),
            fx_frames: self.frames.fx_frame_count() as u64,
            ..SnapshotExtras::default()
        };
        for h in &self.host_segments {
            x.host_segments.count += 1;
            x.host_segments.total_bytes = x.host_segments.total_bytes.saturating_add(h.total_size);
            x.host_segments.allocated_bytes = x
                .host_segments
                .allocated_bytes
                .saturating_add(h.allocated_size);
        }
        for e in self.device_traces.iter().flatten() {
            match e.other {
                OtherAction::Annotate => x.annotate_entries += 1,
                OtherAction::Unknown => x.unknown_action_entries += 1,
                OtherAction::Plain | OtherAction::UserDefined => {}
            }
            if !self.frames.str(e.user_metadata).is_empty() {
                x.user_metadata_entries += 1;
            }
        }
        x.entry_private_pools = self
            .event_pools
            .iter()
            .copied()
            .filter(|&p| p != (0, 0))
            .collect();
        x.entry_private_pools.sort_unstable();
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_newer_snapshots_add_is_listed_and_host_memory_is_not_device_memory() {
        assert!(SnapshotExtras::default().notes().is_empty());
        let x = SnapshotExtras {
            host_segments: HostSummary {
                count: 2,
                total_bytes: 4 << 20,
                allocated_bytes: 1 << 20,
            },
            host_trace_entries: 7,
            annotate_entries: 3,
            trace_alloc_overflowed: vec![false, true],
            unknown_settings_keys: vec!["new_knob".into()],
            ..SnapshotExtras::default()
        };
        let notes = x.notes();
        assert!(
            notes[0].starts_with("pinned host memory (not device memory"),
            "{notes:?}"
        );
        assert!(notes[0].contains(
            "2 segments, 4.00 MiB reserved, 1024.00 KiB allocated; 7 host trace entries"
        ));
        assert!(notes.iter().any(|n| n.starts_with("3 annotate entries")));
        assert!(notes.iter().any(|n| n.contains("overflowed")));
        assert!(notes.iter().any(|n| n.ends_with("new_knob")));
    }
}
