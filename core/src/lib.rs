//! allocsim-core: the allocator models, the PyTorch snapshot import, the replay engine
//! and the metrics of allocsim. No UI, no GPU, no files, no threads: it builds for wasm32
//! and every other crate of the workspace stands on it.

pub mod snapshot;
pub mod device;
pub mod models;
pub mod units;
