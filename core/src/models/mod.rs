//! Allocator models. Each model is one file behind the small object-safe [`Allocator`]
//! trait; every model gets its segments from a [`Device`] and never invents addresses.

pub mod bfc;
pub mod buddy;
pub mod common;
pub mod cuda_malloc;
pub mod kind;
pub mod pytorch;
pub mod rmm_arena;
pub mod rmm_binning;
pub mod rmm_pool;
pub mod sorted_index;
pub mod tlsf;
pub mod vmm_stitch;

pub use common::ConfigError;
pub use kind::{AllocatorKind, MODEL_NAMES, ModelSpec, ResolvedModel};

use crate::device::Device;
use crate::snapshot::Action;

pub use crate::trace::PoolId;

/// One request to allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocRequest {
    /// Bytes asked for (un-rounded).
    pub size_bytes: u64,
    /// The stream current at allocation time.
    pub stream: u64,
    /// The pool the request is diverted to (CUDA-graph capture, `use_mem_pool`).
    pub pool: PoolId,
}

/// An event a model emits, in PyTorch's trace vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelEvent {
    pub action: Action,
    /// Address; for [`Action::Oom`] the device's free bytes.
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}

/// A request the model could not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomInfo {
    /// The request as the allocator saw it (rounded where the model rounds).
    pub rounded_bytes: u64,
    /// Bytes the allocator would have asked the device for.
    pub alloc_bytes: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// Largest free block the request could have used (its pool and stream).
    pub largest_free_bytes: u64,
    /// Free blocks in that pool and stream.
    pub free_holes: u64,
    /// Free bytes in that pool and stream.
    pub pool_free_bytes: u64,
    /// Why it failed, in the model's own terms.
    pub reason: String,
}

/// A request that makes no sense to the model (unknown address, double free).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("free of address {0:#x}, which holds no live allocation")]
    UnknownAddress(u64),
    #[error("completion of a free at {0:#x}, which has no pending free")]
    NotPending(u64),
}

/// Totals a model keeps at every moment (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelStats {
    /// Bytes held from the device (segments and mapped pages).
    pub reserved_bytes: u64,
    /// Bytes of live blocks (rounded, with slack).
    pub allocated_bytes: u64,
    /// Bytes the live allocations asked for.
    pub requested_bytes: u64,
    /// Largest free (cached, mapped) block.
    pub largest_free_bytes: u64,
    /// Number of free (cached, mapped) blocks.
    pub free_holes: u64,
    /// Segment operations so far (allocs, frees, maps, unmaps).
    pub segment_ops: u64,
}

/// State of a block in a [`Layout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayoutBlockState {
    Allocated,
    /// Cached, free.
    Free,
    /// Freed by the program, waiting for other streams (`record_stream`).
    PendingFree,
    /// Reserved address space without memory (expandable segments).
    Unmapped,
}

/// One block of a [`LayoutSegment`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LayoutBlock {
    pub addr: u64,
    pub size_bytes: u64,
    pub requested_bytes: u64,
    pub state: LayoutBlockState,
}

/// One segment (a cudaMalloc, or an expandable reservation's mapped-or-not range).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LayoutSegment {
    pub addr: u64,
    pub size_bytes: u64,
    pub stream: u64,
    pub pool: PoolId,
    /// Small pool (≤ 1 MiB requests) rather than large.
    pub small: bool,
    pub expandable: bool,
    /// In address order, tiling the segment.
    pub blocks: Vec<LayoutBlock>,
}

/// The memory layout of a model at one moment: plain data for views and checks.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Layout {
    /// Sorted by pool, stream, address.
    pub segments: Vec<LayoutSegment>,
}

/// An allocator model. Object safe: the replay engine and the app hold `Box<dyn Allocator>`;
/// `Send`, so replays (and their checkpoints) can run on other threads.
pub trait Allocator: Send {
    /// The model's name as the CLI spells it (`pytorch`, `bfc`, …).
    fn name(&self) -> &'static str;
    /// Which of the models of [`AllocatorKind`] this is; `None` for an allocator that is
    /// not one of them (native-backend's raw pass-through).
    fn kind(&self) -> Option<AllocatorKind> {
        None
    }
    /// The effective configuration as a canonical `key:value,…` string.
    fn config_string(&self) -> String;
    /// Serves a request: emits `segment_*` events, then `alloc` (returning the address) or
    /// `oom` (returning why).
    fn malloc(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, OomInfo>;
    /// The program frees `addr` (`free_requested`); with `deferred` the block waits for other
    /// streams (`record_stream`) until [`Allocator::complete_free`], else it is freed now.
    fn free(
        &mut self,
        dev: &mut dyn Device,
        addr: u64,
        deferred: bool,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError>;
    /// A deferred free completes (`free_completed`).
    fn complete_free(
        &mut self,
        dev: &mut dyn Device,
        addr: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError>;
    /// `torch.cuda.empty_cache()`: returns cached memory to the device.
    fn empty_cache(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>);
    /// A block re-created at `addr` by a CUDA-graph checkpoint restore
    /// (`setCheckpointPoolState`), not by a malloc. Models that cannot place a block where
    /// asked serve it as a malloc.
    fn alloc_at(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        addr: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, OomInfo> {
        let _ = addr;
        self.malloc(dev, req, out)
    }
    /// A private pool is no longer in use (its graph or `MemPool` was deleted): its cached
    /// segments may be released by the next cache flush.
    fn release_pool(&mut self, pool: PoolId) {
        let _ = pool;
    }
    /// Free bytes cached in private pools (CUDA graphs, `MemPool`s), which PyTorch's OOM
    /// message counts as allocated; 0 for a model without private pools.
    fn private_pool_free_bytes(&self) -> u64 {
        0
    }
    /// Current totals.
    fn stats(&self) -> ModelStats;
    /// The whole layout (segments and blocks).
    fn layout(&self) -> Layout;
    /// Checks every structural invariant; the error names the first one broken.
    fn check_invariants(&self) -> Result<(), String>;
    /// A copy of the whole model state (for what-if branches and checkpoints).
    fn clone_box(&self) -> Box<dyn Allocator>;
}
