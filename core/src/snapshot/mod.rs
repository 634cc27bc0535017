//! A PyTorch memory snapshot as the file states it (`torch.cuda.memory._snapshot()`):
//! segments of the end state, the per-device trace ring buffers and the allocator
//! settings, with stack frames interned once in a [`FrameTable`].
//!
//! This is the *faithful* form of the file; [`crate::trace`] builds the replayable trace
//! (what the file leaves implicit made explicit) on top of it.

pub mod frames;
pub mod import;
pub mod json;
pub mod pickle;

pub use frames::{Frame, FrameId, FrameTable, StackId, StrId};
pub use import::{ImportError, decode_snapshot};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
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

/// One trace entry (`device_traces[d][i]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    pub action: Action,
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
}
