//! allocsim-core: the allocator models, the PyTorch snapshot import, the replay engine
//! and the metrics of allocsim. No UI, no GPU, no files, no threads: it builds for wasm32
//! and every other crate of the workspace stands on it.

pub mod build;
pub mod capacity;
pub mod cost;
pub mod device;
pub mod diff;
pub mod explain;
pub mod impossible;
pub mod models;
pub mod offline;
mod op_addrs;
pub mod prefix;
pub mod ranks;
pub mod record;
pub mod snapshot;
pub mod start;
pub mod trace;
pub mod units;
pub mod validate;
pub mod whatif;
pub mod workloads;

/// Any error of the core, for callers that do not need to tell them apart.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Import(#[from] snapshot::ImportError),
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    /// The model or its config cannot be built.
    #[error("bad allocator config: {0}")]
    Config(#[from] models::ConfigError),
    /// A recording that cannot have happened (a device PyTorch cannot have, …).
    #[error("{0}")]
    Impossible(String),
    /// A question the trace cannot answer: no such device, event or allocation.
    #[error(transparent)]
    Query(#[from] QueryError),
}

/// A question about a trace that the trace cannot answer (not a config problem).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("the trace has no device {device}")]
    NoDevice { device: usize },
    #[error("op {op} is not an allocation")]
    NotAnAllocation { op: usize },
    #[error("--at {at}: device {device} has {events} events")]
    EventOutOfRange { at: u64, device: u32, events: usize },
    #[error("--at {at}: no allocation at or after event {at}")]
    NoAllocationFrom { at: u64 },
    #[error("the trace has no allocation")]
    NoAllocation,
    /// `min-capacity`: the model runs out of memory with no capacity at all.
    #[error("{label} runs out of memory even without a capacity ({explanation})")]
    OomWithoutCapacity { label: String, explanation: String },
    /// `min-capacity`: no capacity up to `limit_bytes` serves every request.
    #[error("{label} fits at no capacity up to {}", units::format_size(*limit_bytes))]
    FitsNowhere { label: String, limit_bytes: u64 },
    /// `recommend`: no candidate config could be built.
    #[error("no candidate config could be built")]
    NoCandidate,
    /// `recommend`'s sweep was handed another number of results than the batch it asked
    /// for, or asked for its answer before its last batch.
    #[error("the sweep expected {expected} replay results, got {got}")]
    SweepResults { expected: usize, got: usize },
    /// A replay thread ended without an answer.
    #[error("a replay thread stopped")]
    ThreadStopped,
    /// A replay not run because the user cancelled the sweep.
    #[error("cancelled")]
    Cancelled,
}
pub mod metrics;
pub mod replay;
pub mod session;
