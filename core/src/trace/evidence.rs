//! What a recording says about the capacity it ran under: the bounds the trace builder
//! reads off it (`capacity::read_events`, finished by `EventBounds::finish`) and keeps on
//! each device's trace. The choice a replay makes from them is `capacity.rs`'s.

/// What a bound on the capacity was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundKind {
    /// The segments alive when the trace window opens (a wrapped ring buffer).
    StartState,
    /// A segment (or mapped pages) the device granted: reserved after it.
    Granted,
    /// An `oom` entry's `device_free`: reserved + `device_free` is all the device had.
    OomDeviceFree,
    /// An `oom` entry's request: reserved + the segment it needed was refused.
    OomRequest,
    /// Segment releases inside a malloc: its first attempt was refused.
    RetriedMalloc,
}

impl BoundKind {
    /// The bound's origin in a few words, for one-line notes.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            BoundKind::StartState => "the segments alive when the trace starts",
            BoundKind::Granted => "a segment the device granted",
            BoundKind::OomDeviceFree => "the OOM report's free device memory",
            BoundKind::OomRequest => "the segment an out-of-memory request needed",
            BoundKind::RetriedMalloc => "a malloc that released cached segments to retry",
        }
    }
}

/// One bound and the event it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Bound {
    pub bytes: u64,
    /// Index into `device_traces[d]`.
    pub event_index: u32,
    pub kind: BoundKind,
}

/// The bounds a recording puts on its capacity: `low` the largest reserved total it was
/// granted (inclusive), `high` the smallest total it was refused (exclusive).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CapacityEvidence {
    pub low: Option<Bound>,
    pub high: Option<Bound>,
    /// Releases inside a malloc that the trace reads as an `empty_cache()` call: had they
    /// been PyTorch's retry under a cap, the cap would be below this (not a bound).
    pub read_as_empty_cache: Option<Bound>,
    /// The snapshot's own `per_process_memory_fraction` (its `PYTORCH_CUDA_ALLOC_CONF`),
    /// when below 1: a fraction of a total memory the snapshot does not record.
    pub memory_fraction: Option<f64>,
}

/// What the evidence says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing was refused: the recording says nothing about a limit.
    NoRefusal,
    /// Every capacity in `[low, high)` explains the recording; this is `high − 1`.
    Inferred(u64),
    /// A total at or above a refused one was granted: no single capacity explains it
    /// (memory outside PyTorch changed during the run, or another process).
    Contradiction,
}

impl CapacityEvidence {
    pub(crate) fn raise_low(&mut self, bytes: u64, event_index: usize, kind: BoundKind) {
        if self.low.is_none_or(|b| bytes > b.bytes) {
            self.low = Some(Bound {
                bytes,
                event_index: event_index as u32,
                kind,
            });
        }
    }

    pub(crate) fn lower_high(&mut self, bytes: u64, event_index: usize, kind: BoundKind) {
        if self.high.is_none_or(|b| bytes < b.bytes) {
            self.high = Some(Bound {
                bytes,
                event_index: event_index as u32,
                kind,
            });
        }
    }

    /// What the bounds say.
    #[must_use]
    pub fn verdict(&self) -> Verdict {
        match (self.low, self.high) {
            (_, None) => Verdict::NoRefusal,
            (Some(l), Some(h)) if l.bytes >= h.bytes => Verdict::Contradiction,
            (_, Some(h)) => Verdict::Inferred(h.bytes.saturating_sub(1)),
        }
    }
}
