//! The harness the arena models' unit tests share: a model on a simulated device of 1 TiB
//! (capped or not), every request and free followed by the model's invariant check.

use crate::device::SimulatedDevice;
use crate::models::{AllocRequest, Allocator, LayoutBlockState, ModelEvent, OomInfo, PoolId};

/// A request of `size` bytes on `stream`, from the default pool.
#[must_use]
pub fn req(size: u64, stream: u64) -> AllocRequest {
    AllocRequest {
        size_bytes: size,
        stream,
        pool: PoolId::DEFAULT,
    }
}

/// A model, its device and the events it emitted.
pub struct Run<M> {
    pub m: M,
    pub dev: SimulatedDevice,
    pub out: Vec<ModelEvent>,
}

impl<M: Allocator> Run<M> {
    /// `m` on a 1 TiB device, capped at `cap` bytes if given.
    pub fn new(m: M, cap: Option<u64>) -> Run<M> {
        Run {
            m,
            dev: SimulatedDevice::new(1 << 40, cap),
            out: Vec::new(),
        }
    }

    /// Allocates `size` bytes on `stream`, then checks the invariants.
    pub fn alloc_on(&mut self, size: u64, stream: u64) -> Result<u64, OomInfo> {
        let r = self
            .m
            .malloc(&mut self.dev, &req(size, stream), &mut self.out);
        self.m.check_invariants().unwrap();
        r
    }

    /// Allocates `size` bytes on stream 0, then checks the invariants.
    pub fn alloc(&mut self, size: u64) -> Result<u64, OomInfo> {
        self.alloc_on(size, 0)
    }

    /// Frees the block at `a` at once, then checks the invariants.
    pub fn free(&mut self, a: u64) {
        self.m.free(&mut self.dev, a, false, &mut self.out).unwrap();
        self.m.check_invariants().unwrap();
    }

    /// Every block of every segment in layout order: size and state.
    pub fn blocks(&self) -> Vec<(u64, LayoutBlockState)> {
        self.m
            .layout()
            .segments
            .iter()
            .flat_map(|s| s.blocks.iter().map(|b| (b.size_bytes, b.state)))
            .collect()
    }
}
