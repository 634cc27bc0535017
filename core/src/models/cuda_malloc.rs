//! `cuda-malloc`: no caching allocator at all — every request is a `cudaMalloc` and every
//! free a `cudaFree` (what `PYTORCH_NO_CUDA_MEMORY_CACHING=1`, JAX's
//! `XLA_PYTHON_CLIENT_ALLOCATOR=platform` and RMM's `cuda_memory_resource` do).
//!
//! Facts it rests on:
//! - The driver holds physical memory in 2 MiB pages (peers.md §B.5, §B.6).
//! - Small requests are packed inside a page at 512-byte steps: measured on an H200,
//!   1000 × `cudaMalloc(512)` cost one 2 MiB page of `cudaMemGetInfo` (issue 3).
//! - Addresses are aligned to at least 256 bytes (CUDA C++ Programming Guide); the packing
//!   step of 512 bytes satisfies that.
//!
//! Rules of the model: a request is rounded up to a multiple of 512 bytes (a zero-byte
//! request to 512). A rounded size below 2 MiB is packed into a page the model already
//! holds — into the smallest free gap that fits, lowest address first (the driver's own
//! placement is undocumented; only its page count is measured) — or into a new 2 MiB page.
//! A larger request gets its own allocation of the rounded size, holding whole pages. A
//! page is returned to the device as soon as its last block is freed: nothing is cached,
//! so `empty_cache` does nothing. `segment_ops` counts every `cudaMalloc` and `cudaFree`
//! the program makes (one per request and one per free), whether or not it reached the
//! page level. Streams and private pools make no difference.
//!
//! Config keys: none.

use super::AllocatorKind;
use super::common::{self, Arena, FreeKey, PAGE_BYTES, State, round_up};
use super::common::{ArenaPolicy, Refusal};
use super::{AllocRequest, ModelEvent};
use crate::device::Device;
use crate::models::common::policy::arena_accessors;
use crate::units::format_size;

/// The packing step inside a page (and the rounding of every request).
pub const STEP_BYTES: u64 = 512;

/// Segment tags: a shared page of packed small requests, or one large allocation.
const TAG_PAGE: u64 = 0;
const TAG_LARGE: u64 = 1;

/// The no-caching model.
#[derive(Debug, Clone, Default)]
pub struct CudaMallocModel {
    arena: Arena,
}

impl CudaMallocModel {
    /// Parses the (empty) config.
    pub fn new(config: &str) -> Result<CudaMallocModel, common::ConfigError> {
        common::parse_config(AllocatorKind::CudaMalloc, config, &[])?;
        Ok(CudaMallocModel::default())
    }

    fn key(&self, i: u32) -> common::FreeKey {
        let b = self.arena.b(i);
        FreeKey::new(0, b.size, b.addr)
    }
}

impl ArenaPolicy for CudaMallocModel {
    const KIND: AllocatorKind = AllocatorKind::CudaMalloc;

    arena_accessors!();

    #[inline]
    fn find(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, Refusal> {
        let rounded = round_up(req.size_bytes.max(1), STEP_BYTES);
        let stream = req.stream;
        let i = if rounded < PAGE_BYTES {
            if let Some((_, i)) = self.arena.first_free_from(FreeKey::new(0, rounded, 0)) {
                self.arena.remove_free(i);
                self.arena.count_segment_op();
                i
            } else {
                let addr = self
                    .arena
                    .dev_malloc(dev, PAGE_BYTES, stream, out)
                    .map_err(|_| refusal(dev, rounded, PAGE_BYTES))?;
                self.arena
                    .add_segment(
                        addr,
                        PAGE_BYTES,
                        PAGE_BYTES,
                        stream,
                        true,
                        false,
                        TAG_PAGE,
                        State::Free,
                    )
                    .1
            }
        } else {
            let addr = self
                .arena
                .dev_malloc(dev, rounded, stream, out)
                .map_err(|_| refusal(dev, rounded, rounded))?;
            self.arena
                .add_free_segment(addr, rounded, stream, TAG_LARGE)
        };
        if self.arena.b(i).size > rounded {
            let t = self.arena.split(i, rounded);
            let k = self.key(t);
            self.arena.insert_free(t, k);
        }
        Ok(i)
    }

    /// Frees block `i` (released, not indexed): merges it inside its page and gives the page
    /// back when it is empty.
    fn put_back(&mut self, dev: &mut dyn Device, i: u32, out: &mut Vec<ModelEvent>) {
        let m = self.arena.coalesce(i, |_| true);
        let s = self.arena.b(m).seg;
        if self.arena.b(m).size == self.arena.seg(s).size {
            // The whole page (or large allocation) is free: cudaFree reaches the device.
            let _ = self.arena.dev_free(dev, s, out);
        } else {
            self.arena.count_segment_op();
            let k = self.key(m);
            self.arena.insert_free(m, k);
        }
    }

    fn check_policy(&self) -> Result<(), String> {
        for (s, seg) in self.arena.segments() {
            if seg.tag == TAG_PAGE && seg.size != PAGE_BYTES {
                return Err(format!(
                    "page {:#x} is {} bytes, not 2 MiB",
                    seg.base, seg.size
                ));
            }
            if self
                .arena
                .seg_blocks(s)
                .all(|b| self.arena.b(b).state == State::Free)
            {
                return Err(format!(
                    "segment {:#x} is empty but still held (nothing is cached)",
                    seg.base
                ));
            }
            if seg.tag == TAG_LARGE && self.arena.seg_blocks(s).count() != 1 {
                return Err(format!("large allocation {:#x} was split", seg.base));
            }
        }
        Ok(())
    }
}

/// The device refused a `cudaMalloc` of `alloc` bytes for a request rounded to `rounded`;
/// only a request packed into a page could have used a free gap.
fn refusal(dev: &dyn Device, rounded: u64, alloc: u64) -> Refusal {
    let r = Refusal::new(
        rounded,
        alloc,
        format!(
            "cudaMalloc of {} failed: the device has {} free",
            format_size(alloc),
            format_size(dev.free_bytes())
        ),
    );
    if rounded < PAGE_BYTES {
        r
    } else {
        r.without_usable_free_blocks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimulatedDevice;
    use crate::models::Allocator;
    use crate::models::common::testing;

    fn req(size: u64) -> AllocRequest {
        testing::req(size, 0)
    }

    #[test]
    fn a_thousand_512_byte_requests_cost_one_page() {
        let mut m = CudaMallocModel::new("").unwrap();
        let mut dev = SimulatedDevice::new(1 << 40, None);
        let mut out = Vec::new();
        let addrs: Vec<u64> = (0..1000)
            .map(|_| m.malloc(&mut dev, &req(512), &mut out).unwrap())
            .collect();
        m.check_invariants().unwrap();
        assert_eq!(m.stats().reserved_bytes, PAGE_BYTES);
        assert_eq!(m.stats().allocated_bytes, 512_000);
        // Packed at 512-byte steps: consecutive addresses inside the one page.
        assert!(addrs.windows(2).all(|w| w[1] == w[0] + 512));
        assert_eq!(m.stats().segment_ops, 1000);
        // A page holds exactly 4096 such blocks: the 4097th needs a second page.
        for _ in 1000..4096 {
            m.malloc(&mut dev, &req(512), &mut out).unwrap();
        }
        assert_eq!(m.stats().reserved_bytes, PAGE_BYTES);
        m.malloc(&mut dev, &req(1), &mut out).unwrap();
        assert_eq!(m.stats().reserved_bytes, 2 * PAGE_BYTES);
        m.check_invariants().unwrap();
    }

    #[test]
    fn pages_go_back_when_empty_and_large_requests_hold_whole_pages() {
        let mut m = CudaMallocModel::new("").unwrap();
        let mut dev = SimulatedDevice::new(1 << 40, None);
        let mut out = Vec::new();
        let a = m.malloc(&mut dev, &req(700), &mut out).unwrap();
        let b = m.malloc(&mut dev, &req(300), &mut out).unwrap();
        assert_eq!(b, a + 1024, "700 bytes round to 1024");
        m.free(&mut dev, a, false, &mut out).unwrap();
        m.check_invariants().unwrap();
        assert_eq!(m.stats().reserved_bytes, PAGE_BYTES);
        m.free(&mut dev, b, false, &mut out).unwrap();
        assert_eq!(m.stats().reserved_bytes, 0);
        let c = m.malloc(&mut dev, &req(3 << 20), &mut out).unwrap();
        assert_eq!(m.stats().reserved_bytes, 4 << 20);
        assert_eq!(m.stats().allocated_bytes, 3 << 20);
        m.check_invariants().unwrap();
        m.free(&mut dev, c, false, &mut out).unwrap();
        assert_eq!(m.stats().reserved_bytes, 0);
        assert_eq!(m.stats().segment_ops, 6);
        assert!(m.free(&mut dev, c, false, &mut out).is_err());
    }

    #[test]
    fn the_device_refusal_is_an_oom() {
        let mut m = CudaMallocModel::new("").unwrap();
        let mut dev = SimulatedDevice::new(1 << 40, Some(4 << 20));
        let mut out = Vec::new();
        m.malloc(&mut dev, &req(3 << 20), &mut out).unwrap();
        let e = m.malloc(&mut dev, &req(1 << 20), &mut out).unwrap_err();
        assert_eq!(e.rounded_bytes, 1 << 20);
        assert!(e.reason.contains("cudaMalloc of 2.00 MiB failed"));
        assert!(CudaMallocModel::new("x:1").is_err());
    }
}
