//! allocsim-core: the allocator models, the PyTorch snapshot import, the replay engine
//! and the metrics of allocsim. No UI, no GPU, no files, no threads: it builds for wasm32
//! and every other crate of the workspace stands on it.

pub mod capacity;
pub mod cost;
pub mod device;
pub mod diff;
pub mod explain;
pub mod models;
pub mod offline;
pub mod ranks;
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
    #[error("bad allocator config: {0}")]
    Config(String),
    /// A recording that cannot have happened (a device PyTorch cannot have, …).
    #[error("{0}")]
    Impossible(String),
}
pub mod metrics;
pub mod replay;
pub mod session;
