//! `vmm-stitch`: a GMLake-style allocator on CUDA virtual memory (peers.md §B.6, §B.13):
//! free physical pages are stitched into one contiguous virtual range, so physical
//! fragmentation vanishes, at the cost of page-granular rounding and more map calls.
//!
//! Facts it rests on:
//! - VMM maps physical memory in pages of the allocation granularity, 2 MiB on current
//!   NVIDIA GPUs (`cuMemGetAllocationGranularity`); any set of physical pages can be mapped
//!   into one contiguous reserved virtual range (`cuMemAddressReserve` + `cuMemMap`).
//! - GMLake (arXiv 2401.08156) keeps freed blocks mapped and reuses them best-fit; when no
//!   single free block is big enough it stitches several free blocks into a new virtual
//!   range instead of allocating new memory; small allocations stay on the ordinary
//!   caching path.
//!
//! Rules of the model (through the device's `reserve`/`map`/`unmap`):
//! - Small requests (rounded to 512 bytes, at most 1 MiB) are served best fit from 2 MiB
//!   segments (`cudaMalloc`), split and merged inside a segment.
//! - A large request is rounded up to whole pages. It takes the smallest free mapped block
//!   that holds it (lowest address among equals), split at a page boundary. Otherwise it is
//!   stitched: a virtual range of its size is reserved (a cached one reused when possible);
//!   pages the free blocks cannot cover are mapped fresh first; then free blocks, largest
//!   first, are unmapped from where they were and mapped into the new range (the device
//!   interface has no remap, so one stitched piece costs an unmap and a map); the last
//!   piece is split when it is bigger than needed. A virtual range left with no mapped page
//!   is kept for reuse, not released.
//! - Freed large blocks stay mapped and merge with free neighbours of their range.
//! - When memory runs out: a large request first returns entirely free small segments; a
//!   small one first unmaps every free large block and returns free small segments (the
//!   `empty_cache` of this model), then tries once more.
//! - The largest free block reported is the larger of all free mapped large bytes (any
//!   request up to that size can be stitched from them) and the largest free small block.
//!
//! Streams and private pools make no difference.
//!
//! Config keys: none.

use crate::models::common::policy::arena_accessors;
use std::collections::BTreeSet;

use super::AllocatorKind;
use super::common::{self, Arena, FreeKey, PAGE_BYTES, State, round_up};
use super::common::{ArenaPolicy, Refusal};
use super::{AllocRequest, ModelEvent, ModelStats};
use crate::device::Device;
use crate::units::format_size;

/// Small requests round to this.
pub const SMALL_ROUND_BYTES: u64 = 512;
/// Largest small request.
pub const SMALL_MAX_BYTES: u64 = 1 << 20;
/// The small segment size.
pub const SMALL_SEGMENT_BYTES: u64 = 2 << 20;

const SMALL: u64 = 0;
const LARGE: u64 = 1;

/// The GMLake-style allocator of one device.
#[derive(Debug, Clone, Default)]
pub struct VmmStitchModel {
    arena: Arena,
    /// Reserved virtual ranges with nothing mapped, kept for reuse: (size, addr).
    va_cache: BTreeSet<(u64, u64)>,
    /// Σ free mapped large bytes.
    free_large_bytes: u64,
    /// Stitches so far (for tests and reports).
    pub stitches: u64,
}

impl VmmStitchModel {
    /// Parses the (empty) config.
    pub fn new(config: &str) -> Result<VmmStitchModel, common::ConfigError> {
        common::parse_config(AllocatorKind::VmmStitch, config, &[])?;
        Ok(VmmStitchModel::default())
    }

    fn insert(&mut self, i: u32) {
        let b = self.arena.b(i);
        let class = self.arena.seg(b.seg).tag;
        let k = FreeKey::new(class, b.size, b.addr);
        if class == LARGE {
            self.free_large_bytes += b.size;
        }
        self.arena.insert_free(i, k);
    }

    fn remove(&mut self, i: u32) {
        if self.arena.b(i).key.a() == LARGE {
            self.free_large_bytes -= self.arena.b(i).size;
        }
        self.arena.remove_free(i);
    }

    /// Best fit in `class`, split to `size` (the tail stays free).
    fn take(&mut self, class: u64, size: u64) -> Option<u32> {
        let (k, i) = self.arena.first_free_from(FreeKey::new(class, size, 0))?;
        if k.a() != class {
            return None;
        }
        self.remove(i);
        if self.arena.b(i).size > size {
            let t = self.arena.split(i, size);
            self.insert(t);
        }
        Some(i)
    }

    /// Unmaps free large block `i` (indexed): its range keeps the address space; a range
    /// with nothing mapped left goes to the virtual-range cache.
    fn unmap_block(&mut self, dev: &mut dyn Device, i: u32, out: &mut Vec<ModelEvent>) {
        self.remove(i);
        let (s, addr, size) = {
            let b = self.arena.b(i);
            (b.seg, b.addr, b.size)
        };
        self.arena.dev_unmap(dev, s, addr, size, out);
        self.arena.set_unmapped(i);
        let m = self.arena.coalesce_unmapped(i);
        let seg = self.arena.seg(s);
        if self.arena.b(m).size == seg.size && seg.held == 0 {
            let (base, size) = (seg.base, seg.size);
            if self.arena.remove_segment(s).is_ok() {
                self.va_cache.insert((size, base));
            }
        }
    }

    /// Returns entirely free small segments to the device.
    fn release_small(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) -> bool {
        self.arena
            .release_free_segments(dev, out, |s| s.tag == SMALL)
    }

    /// Unmaps every free large block and returns free small segments.
    fn release_all_cached(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        let large: Vec<u32> = self
            .arena
            .free_range(FreeKey::new(LARGE, 0, 0), FreeKey::new(LARGE + 1, 0, 0))
            .map(|(_, i)| i)
            .collect();
        for i in large {
            self.unmap_block(dev, i, out);
        }
        self.release_small(dev, out);
    }

    #[inline]
    fn small_malloc(
        &mut self,
        dev: &mut dyn Device,
        rounded: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Option<u32> {
        if let Some(i) = self.take(SMALL, rounded) {
            return Some(i);
        }
        let addr = if let Ok(a) = self.arena.dev_malloc(dev, SMALL_SEGMENT_BYTES, stream, out) {
            a
        } else {
            self.release_all_cached(dev, out);
            self.arena
                .dev_malloc(dev, SMALL_SEGMENT_BYTES, stream, out)
                .ok()?
        };
        let (_, b) = self.arena.add_segment(
            addr,
            SMALL_SEGMENT_BYTES,
            SMALL_SEGMENT_BYTES,
            stream,
            true,
            false,
            SMALL,
            State::Free,
        );
        self.insert(b);
        self.take(SMALL, rounded)
    }

    /// Stitches a new mapped range of `need` bytes from free blocks and fresh pages;
    /// returns its block (free, not indexed).
    fn stitch(
        &mut self,
        dev: &mut dyn Device,
        need: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Option<u32> {
        let fresh = need.saturating_sub(self.free_large_bytes);
        let (size, base) = match self.va_cache.range((need, 0)..).next().copied() {
            Some(v) => {
                self.va_cache.remove(&v);
                v
            }
            None => (need, dev.reserve(need, PAGE_BYTES, stream).ok()?),
        };
        let (s, head) =
            self.arena
                .add_segment(base, size, 0, stream, false, true, LARGE, State::Unmapped);
        let mut mapped: Vec<(u64, u64)> = Vec::new();
        if fresh > 0 {
            let at = base + need - fresh;
            let mut ok = self
                .arena
                .dev_map(dev, Some(s), at, fresh, stream, out)
                .is_ok();
            if !ok && self.release_small(dev, out) {
                ok = self
                    .arena
                    .dev_map(dev, Some(s), at, fresh, stream, out)
                    .is_ok();
            }
            if !ok {
                self.abandon(dev, s, &mapped, out);
                return None;
            }
            mapped.push((at, fresh));
        }
        self.stitches += 1;
        let mut covered = 0;
        while covered < need - fresh {
            let want = need - fresh - covered;
            let piece = match self
                .arena
                .last_free_below(FreeKey::new(LARGE + 1, 0, 0))
                .filter(|(k, _)| k.a() == LARGE)
            {
                Some((k, i)) => {
                    if k.b() > want {
                        self.remove(i);
                        let t = self.arena.split(i, want);
                        self.insert(t);
                        self.insert(i);
                    }
                    let piece = self.arena.b(i).size;
                    self.unmap_block(dev, i, out);
                    piece
                }
                // Cannot happen (the free blocks were counted above); map fresh pages.
                None => want,
            };
            // After the unmap this map only takes back the pages just released.
            if self
                .arena
                .dev_map(dev, Some(s), base + covered, piece, stream, out)
                .is_err()
            {
                self.abandon(dev, s, &mapped, out);
                return None;
            }
            mapped.push((base + covered, piece));
            covered += piece;
        }
        if size > need {
            self.arena.split(head, need);
        }
        self.arena.bm(head).state = State::Free;
        Some(head)
    }

    /// Undoes a stitch that could not complete: unmaps what it mapped and caches its range.
    fn abandon(
        &mut self,
        dev: &mut dyn Device,
        s: u32,
        mapped: &[(u64, u64)],
        out: &mut Vec<ModelEvent>,
    ) {
        for &(a, n) in mapped {
            self.arena.dev_unmap(dev, s, a, n, out);
        }
        let (base, size) = (self.arena.seg(s).base, self.arena.seg(s).size);
        if self.arena.remove_segment(s).is_ok() {
            self.va_cache.insert((size, base));
        }
    }

    #[inline]
    fn large_malloc(
        &mut self,
        dev: &mut dyn Device,
        need: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Option<u32> {
        if let Some(i) = self.take(LARGE, need) {
            return Some(i);
        }
        self.stitch(dev, need, stream, out)
    }
}

impl ArenaPolicy for VmmStitchModel {
    const KIND: AllocatorKind = AllocatorKind::VmmStitch;

    arena_accessors!();

    #[inline]
    fn find(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, Refusal> {
        let rounded = round_up(req.size_bytes.max(1), SMALL_ROUND_BYTES);
        let stream = req.stream;
        let small = rounded <= SMALL_MAX_BYTES;
        let size = if small {
            rounded
        } else {
            round_up(rounded, PAGE_BYTES)
        };
        let found = if small {
            self.small_malloc(dev, size, stream, out)
        } else {
            self.large_malloc(dev, size, stream, out)
        };
        let Some(i) = found else {
            let what = if small {
                "a new 2 MiB small segment"
            } else {
                "fresh pages for the stitched range"
            };
            return Err(Refusal::new(
                size,
                if small {
                    SMALL_SEGMENT_BYTES
                } else {
                    size - size.min(self.free_large_bytes)
                },
                format!(
                    "the device refused {what} ({} free, {} free in cached pages)",
                    format_size(dev.free_bytes()),
                    format_size(self.free_large_bytes)
                ),
            ));
        };
        if self.arena.b(i).indexed {
            self.remove(i);
        }
        Ok(i)
    }

    fn put_back(&mut self, _dev: &mut dyn Device, i: u32, _out: &mut Vec<ModelEvent>) {
        // The neighbours `coalesce` merges leave the index without going through `remove`.
        let (p, n) = (self.arena.b(i).prev, self.arena.b(i).next);
        for x in [p, n] {
            if x != common::NIL && self.arena.b(x).indexed && self.arena.b(x).key.a() == LARGE {
                self.free_large_bytes -= self.arena.b(x).size;
            }
        }
        let m = self.arena.coalesce(i, |_| true);
        self.insert(m);
    }

    fn release_cached(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        self.release_all_cached(dev, out);
    }

    fn check_policy(&self) -> Result<(), String> {
        let mut free_large = 0;
        for (s, seg) in self.arena.segments() {
            let mut mapped = 0;
            for b in self.arena.seg_blocks(s) {
                let blk = self.arena.b(b);
                if blk.state != State::Unmapped {
                    mapped += blk.size;
                }
                if seg.tag == LARGE {
                    if !blk.size.is_multiple_of(PAGE_BYTES)
                        || !(blk.addr - seg.base).is_multiple_of(PAGE_BYTES)
                    {
                        return Err(format!(
                            "large block at {:#x} is not page-aligned",
                            blk.addr
                        ));
                    }
                    if blk.state == State::Free {
                        free_large += blk.size;
                    }
                }
            }
            if seg.tag == LARGE && mapped != seg.held {
                return Err(format!(
                    "range {:#x} holds {} bytes but maps {mapped}",
                    seg.base, seg.held
                ));
            }
            if seg.tag == LARGE && mapped == 0 {
                return Err(format!(
                    "range {:#x} has nothing mapped but was kept as a segment",
                    seg.base
                ));
            }
            if seg.tag == SMALL && seg.size != SMALL_SEGMENT_BYTES {
                return Err(format!("small segment {:#x} is not 2 MiB", seg.base));
            }
            if self
                .va_cache
                .iter()
                .any(|&(sz, a)| a < seg.base + seg.size && seg.base < a + sz)
            {
                return Err(format!(
                    "cached virtual range overlaps live range {:#x}",
                    seg.base
                ));
            }
        }
        let small_largest = self
            .arena
            .last_free_below(FreeKey::new(LARGE, 0, 0))
            .map_or(0, |(k, _)| k.b());
        if self.totals().largest_free_bytes != free_large.max(small_largest) {
            return Err("the largest free block is misreported".to_string());
        }
        if free_large != self.free_large_bytes {
            return Err(format!(
                "free large bytes {} != Σ free large blocks {free_large}",
                self.free_large_bytes
            ));
        }
        Ok(())
    }

    fn totals(&self) -> ModelStats {
        // Small free blocks are at most 2 MiB and large ones at least 2 MiB, so the largest
        // free block of all, capped at 2 MiB, stands for the largest small one wherever it
        // matters (a large free block makes the stitchable bytes at least 2 MiB).
        let small_largest = self.arena.largest_free().min(SMALL_SEGMENT_BYTES);
        self.arena.stats_with(
            self.free_large_bytes.max(small_largest),
            self.arena.free_count(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::common::testing::Run;
    use crate::models::{Allocator, LayoutBlockState};

    const MIB: u64 = 1 << 20;

    impl Run<VmmStitchModel> {
        fn with(cap: Option<u64>) -> Self {
            Run::new(VmmStitchModel::new("").unwrap(), cap)
        }
    }

    #[test]
    fn free_blocks_of_separate_ranges_are_stitched_instead_of_new_memory() {
        // 12 MiB of device memory: three 4 MiB blocks, two of them freed, then 8 MiB.
        let mut r = Run::with(Some(12 * MIB));
        let a: Vec<u64> = (0..3).map(|_| r.alloc(4 * MIB).unwrap()).collect();
        assert_eq!(r.m.stats().segment_ops, 3, "three fresh maps");
        r.free(a[0]);
        r.free(a[2]);
        assert_eq!(
            r.m.stats().largest_free_bytes,
            8 * MIB,
            "free pages count as one block"
        );
        let b = r.alloc(7 * MIB).unwrap();
        assert_eq!(r.m.stitches, 4);
        assert_eq!(r.m.stats().reserved_bytes, 12 * MIB);
        assert_eq!(r.m.stats().allocated_bytes, 12 * MIB);
        // Two pieces, each an unmap and a map.
        assert_eq!(r.m.stats().segment_ops, 7);
        let seg =
            r.m.layout()
                .segments
                .into_iter()
                .find(|s| s.addr == b)
                .unwrap();
        assert_eq!(seg.size_bytes, 8 * MIB);
        // The emptied ranges are cached: a new 4 MiB range reuses one of their addresses.
        r.free(a[1]);
        r.free(b);
        r.m.empty_cache(&mut r.dev, &mut r.out);
        assert_eq!(r.m.stats().reserved_bytes, 0);
        let c = r.alloc(4 * MIB).unwrap();
        assert!(a.contains(&c) || c == b, "reused a cached virtual range");
        r.m.check_invariants().unwrap();
    }

    #[test]
    fn best_fit_splits_at_page_boundaries_and_fresh_pages_fill_the_rest() {
        let mut r = Run::with(None);
        let a = r.alloc(6 * MIB).unwrap();
        r.free(a);
        let b = r.alloc(3 * MIB + 1).unwrap(); // rounds to 4 MiB: the 6 MiB block split
        assert_eq!(b, a);
        assert_eq!(r.m.stats().reserved_bytes, 6 * MIB);
        assert_eq!(r.m.stats().largest_free_bytes, 2 * MIB);
        // 6 MiB: 2 MiB free to stitch, 4 MiB mapped fresh.
        r.alloc(6 * MIB).unwrap();
        assert_eq!(r.m.stats().reserved_bytes, 10 * MIB);
        let states: Vec<LayoutBlockState> =
            r.m.layout()
                .segments
                .iter()
                .find(|s| s.addr == a)
                .unwrap()
                .blocks
                .iter()
                .map(|b| b.state)
                .collect();
        assert_eq!(
            states,
            vec![LayoutBlockState::Allocated, LayoutBlockState::Unmapped]
        );
    }

    #[test]
    fn small_requests_use_two_mib_segments_and_unmap_cached_pages_when_full() {
        let mut r = Run::with(Some(4 * MIB));
        let big = r.alloc(4 * MIB).unwrap();
        let e = r.alloc(1000).unwrap_err();
        assert!(e.reason.contains("small segment"), "{}", e.reason);
        r.free(big);
        // The device is full of cached pages: they are unmapped for the small segment.
        let a = r.alloc(1000).unwrap();
        let b = r.alloc(1000).unwrap();
        assert_eq!(b, a + 1024);
        assert_eq!(r.m.stats().reserved_bytes, 2 * MIB);
        assert!(
            r.alloc(4 * MIB)
                .unwrap_err()
                .reason
                .contains("refused fresh pages")
        );
        r.alloc(2 * MIB).unwrap();
        assert!(VmmStitchModel::new("page_mb:2").is_err());
    }
}
