//! `bfc`: TensorFlow/XLA/JAX's best-fit-with-coalescing allocator (`tsl::BFCAllocator`),
//! after `openxla/xla:xla/tsl/framework/bfc_allocator.cc` (peers.md §B.2, §B.7).
//!
//! Facts it rests on:
//! - Every size is rounded up to a multiple of 256 bytes (`kMinAllocationSize`).
//! - 21 bins (`kNumBins`): bin `b` holds free chunks of [256·2^b, 256·2^(b+1)) bytes, the
//!   last bin everything larger; a bin's chunks are ordered by (size, address). A request
//!   searches from its own bin upward and takes the first chunk that fits: the smallest
//!   fitting chunk, lowest address first.
//! - Split rule (`ShouldSplitChunk`): the chunk is split when it is at least twice the
//!   rounded request, or when it exceeds it by at least `max_internal_fragmentation_bytes`
//!   (128 MiB, or `fragmentation_fraction × memory_limit` when that option is set);
//!   otherwise the whole chunk is handed out. The allocation takes the low end.
//! - Freed chunks merge with free neighbours (next, then previous) of the same region;
//!   regions never merge (the CUDA sub-allocator does not coalesce).
//! - Regions (`Extend`): with `allow_growth` the first region is 2 MiB and each `Extend`
//!   doubles the next region size (doubling first until the request fits); without it one
//!   region of the whole memory limit is allocated at the first request. A region never
//!   exceeds what is left of the memory limit; when the device refuses, the size backs off
//!   by ×0.9 (as a 32-bit float, rounded up to 256 bytes) until it is below the request.
//! - Garbage collection (`DeallocateFreeRegions`, off by default): on failure, regions with
//!   no chunk in use are returned to the device, then `Extend` is tried again.
//! - The memory limit is `memory_fraction` × the device memory free at the first request
//!   (the `--capacity`, or the whole device).
//!
//! Not modelled: spatial partitioning, timestamped (stream-safe) chunks, the 10-second
//! retry (a replay has nobody to wait for). `empty_cache` does nothing (BFC has no such
//! call); streams and private pools make no difference.
//!
//! Config keys: `allow_growth` (True; False preallocates one region, as TF's default
//! `allow_growth=false` and JAX's default preallocation do), `memory_fraction` (1 with
//! growth, 0.75 — JAX's `XLA_CLIENT_MEM_FRACTION` default — without),
//! `garbage_collection` (False), `fragmentation_fraction` (0: the 128 MiB default).

use super::AllocatorKind;
use super::common::{self, Arena, FreeKey, State, round_down, round_up};
use super::common::{ArenaPolicy, Refusal};
use super::{AllocRequest, ModelEvent};
use crate::device::Device;
use crate::models::common::policy::arena_accessors;
use crate::units::format_size;

/// `kMinAllocationSize`.
pub const MIN_ALLOCATION_BYTES: u64 = 256;
/// `kNumBins`.
pub const NUM_BINS: u64 = 21;
/// The default `max_internal_fragmentation_bytes`.
pub const DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES: u64 = 128 << 20;
/// The first region with `allow_growth`.
pub const FIRST_REGION_BYTES: u64 = 2 << 20;

/// The BFC options a config string sets.
#[derive(Debug, Clone, PartialEq)]
pub struct BfcConfig {
    pub allow_growth: bool,
    pub memory_fraction: f64,
    pub garbage_collection: bool,
    pub fragmentation_fraction: f64,
}

impl BfcConfig {
    const KEYS: [&'static str; 4] = [
        "allow_growth",
        "memory_fraction",
        "garbage_collection",
        "fragmentation_fraction",
    ];

    /// Parses `key:value,…` on top of the defaults.
    pub fn parse(conf: &str) -> Result<BfcConfig, common::ConfigError> {
        let kv = common::parse_config(AllocatorKind::Bfc, conf, &Self::KEYS)?;
        let mut c = BfcConfig {
            allow_growth: true,
            memory_fraction: 0.0,
            garbage_collection: false,
            fragmentation_fraction: 0.0,
        };
        let mut fraction = None;
        for (k, v) in kv {
            match k {
                "allow_growth" => c.allow_growth = common::parse_bool(AllocatorKind::Bfc, k, v)?,
                "memory_fraction" => {
                    fraction = Some(common::parse_f64(
                        AllocatorKind::Bfc,
                        k,
                        v,
                        0.0,
                        1.0,
                        false,
                    )?);
                }
                "garbage_collection" => {
                    c.garbage_collection = common::parse_bool(AllocatorKind::Bfc, k, v)?;
                }
                _ => {
                    c.fragmentation_fraction =
                        common::parse_f64(AllocatorKind::Bfc, k, v, 0.0, 1.0, true)?;
                }
            }
        }
        c.memory_fraction = fraction.unwrap_or_else(|| c.default_fraction());
        Ok(c)
    }

    fn default_fraction(&self) -> f64 {
        if self.allow_growth { 1.0 } else { 0.75 }
    }

    /// The options that differ from the defaults, as `key:value,…`.
    #[must_use]
    pub fn canonical(&self) -> String {
        common::join_options([
            (!self.allow_growth).then(|| "allow_growth:False".to_string()),
            ((self.memory_fraction - self.default_fraction()).abs() > f64::EPSILON)
                .then(|| format!("memory_fraction:{}", self.memory_fraction)),
            self.garbage_collection
                .then(|| "garbage_collection:True".to_string()),
            (self.fragmentation_fraction > 0.0)
                .then(|| format!("fragmentation_fraction:{}", self.fragmentation_fraction)),
        ])
    }
}

/// Limits fixed at the first request.
#[derive(Debug, Clone, Copy)]
struct Limits {
    memory_limit: u64,
    max_internal_fragmentation: u64,
}

/// The BFC allocator of one device.
#[derive(Debug, Clone)]
pub struct BfcModel {
    cfg: BfcConfig,
    arena: Arena,
    limits: Option<Limits>,
    /// `curr_region_allocation_bytes_`.
    curr_region_bytes: u64,
    /// `stats_.pool_bytes`: Σ region sizes.
    pool_bytes: u64,
}

/// `BinNumForSize`.
#[must_use]
pub fn bin_for_size(size: u64) -> u64 {
    let units = size.max(MIN_ALLOCATION_BYTES) >> 8;
    u64::from(units.ilog2()).min(NUM_BINS - 1)
}

/// `RoundedBytes`.
#[must_use]
pub fn rounded_bytes(size: u64) -> u64 {
    round_up(size, MIN_ALLOCATION_BYTES)
}

impl BfcModel {
    /// A model with this configuration.
    #[must_use]
    pub fn new(cfg: BfcConfig) -> BfcModel {
        BfcModel {
            cfg,
            arena: Arena::new(),
            limits: None,
            curr_region_bytes: 0,
            pool_bytes: 0,
        }
    }

    fn key(&self, i: u32) -> common::FreeKey {
        let b = self.arena.b(i);
        FreeKey::new(bin_for_size(b.size), b.size, b.addr)
    }

    fn limits(&mut self, dev: &dyn Device) -> Limits {
        if let Some(l) = self.limits {
            return l;
        }
        let memory_limit = (self.cfg.memory_fraction * dev.free_bytes() as f64) as u64;
        let max_internal_fragmentation = if self.cfg.fragmentation_fraction > 0.0 {
            (self.cfg.fragmentation_fraction * memory_limit as f64) as u64
        } else {
            DEFAULT_MAX_INTERNAL_FRAGMENTATION_BYTES
        };
        self.curr_region_bytes = if self.cfg.allow_growth {
            rounded_bytes(memory_limit.min(FIRST_REGION_BYTES))
        } else {
            rounded_bytes(memory_limit)
        };
        let l = Limits {
            memory_limit,
            max_internal_fragmentation,
        };
        self.limits = Some(l);
        l
    }

    /// `FindChunkPtr`: the best-fitting free chunk, split by the split rule.
    fn find_chunk(&mut self, rounded: u64, lim: Limits) -> Option<u32> {
        let (_, i) = self
            .arena
            .first_free_from(FreeKey::new(bin_for_size(rounded), rounded, 0))?;
        self.arena.remove_free(i);
        let size = self.arena.b(i).size;
        if size >= rounded * 2 || size - rounded >= lim.max_internal_fragmentation {
            let t = self.arena.split(i, rounded);
            let k = self.key(t);
            self.arena.insert_free(t, k);
        }
        Some(i)
    }

    /// `Extend`: a new region big enough for `rounded`, or false.
    fn extend(
        &mut self,
        dev: &mut dyn Device,
        rounded: u64,
        lim: Limits,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> bool {
        let available = round_down(
            lim.memory_limit.saturating_sub(self.pool_bytes),
            MIN_ALLOCATION_BYTES,
        );
        if rounded > available {
            return false;
        }
        let mut increased = false;
        while rounded > self.curr_region_bytes {
            self.curr_region_bytes *= 2;
            increased = true;
        }
        let mut bytes = self.curr_region_bytes.min(available);
        let addr = loop {
            if let Ok(a) = self.arena.dev_malloc(dev, bytes, stream, out) {
                break a;
            }
            // kBackpedalFactor is a float: size_t × 0.9f is computed in single precision.
            let shrunk = rounded_bytes(((bytes as f32) * 0.9_f32) as u64);
            bytes = if shrunk >= bytes {
                bytes - MIN_ALLOCATION_BYTES
            } else {
                shrunk
            };
            if bytes < rounded {
                return false;
            }
        };
        if !increased {
            self.curr_region_bytes *= 2;
        }
        self.pool_bytes += bytes;
        let b = self.arena.add_free_segment(addr, bytes, stream, 0);
        let k = self.key(b);
        self.arena.insert_free(b, k);
        true
    }

    /// `DeallocateFreeRegions`: returns regions with no chunk in use, if that can help.
    fn deallocate_free_regions(
        &mut self,
        dev: &mut dyn Device,
        rounded: u64,
        lim: Limits,
        out: &mut Vec<ModelEvent>,
    ) -> bool {
        if !self.cfg.garbage_collection {
            return false;
        }
        let mut free_regions: Vec<(u64, u32)> = self
            .arena
            .segments()
            .filter(|&(s, seg)| {
                let h = seg.head;
                self.arena.b(h).state == State::Free
                    && self.arena.b(h).size == seg.size
                    && self.arena.seg_blocks(s).count() == 1
            })
            .map(|(s, seg)| (seg.base, s))
            .collect();
        free_regions.sort_unstable();
        let total_free: u64 = free_regions
            .iter()
            .map(|&(_, s)| self.arena.seg(s).size)
            .sum();
        if total_free == 0 {
            return false;
        }
        if rounded > lim.memory_limit.saturating_sub(self.pool_bytes) + total_free {
            return false;
        }
        for (_, s) in free_regions {
            self.pool_bytes -= self.arena.seg(s).size;
            let _ = self.arena.dev_free(dev, s, out);
        }
        true
    }

    /// The memory limit in force (known after the first request).
    #[must_use]
    pub fn memory_limit(&self) -> Option<u64> {
        self.limits.map(|l| l.memory_limit)
    }
}

impl ArenaPolicy for BfcModel {
    const KIND: AllocatorKind = AllocatorKind::Bfc;

    arena_accessors!(cfg);

    #[inline]
    fn find(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, Refusal> {
        let lim = self.limits(dev);
        let rounded = rounded_bytes(req.size_bytes.max(1));
        let stream = req.stream;
        let mut found = self.find_chunk(rounded, lim);
        if found.is_none() && self.extend(dev, rounded, lim, stream, out) {
            found = self.find_chunk(rounded, lim);
        }
        if found.is_none()
            && self.deallocate_free_regions(dev, rounded, lim, out)
            && self.extend(dev, rounded, lim, stream, out)
        {
            found = self.find_chunk(rounded, lim);
        }
        found.ok_or_else(|| {
            let left = lim.memory_limit.saturating_sub(self.pool_bytes);
            let reason = if rounded > round_down(left, MIN_ALLOCATION_BYTES) {
                format!(
                    "no free chunk fits and the memory limit of {} leaves only {} for a new region",
                    format_size(lim.memory_limit),
                    format_size(left)
                )
            } else {
                format!(
                    "no free chunk fits and the device refused a new region ({} free)",
                    format_size(dev.free_bytes())
                )
            };
            Refusal::new(rounded, self.curr_region_bytes.max(rounded), reason)
        })
    }

    fn put_back(&mut self, _dev: &mut dyn Device, i: u32, _out: &mut Vec<ModelEvent>) {
        let m = self.arena.coalesce(i, |_| true);
        let k = self.key(m);
        self.arena.insert_free(m, k);
    }

    fn check_policy(&self) -> Result<(), String> {
        let mut regions = 0u64;
        for (s, seg) in self.arena.segments() {
            regions += seg.size;
            for b in self.arena.seg_blocks(s) {
                let blk = self.arena.b(b);
                if !blk.size.is_multiple_of(MIN_ALLOCATION_BYTES) {
                    return Err(format!(
                        "chunk at {:#x} is {} bytes, not a multiple of 256",
                        blk.addr, blk.size
                    ));
                }
                if blk.state == State::Free && blk.key.a() != bin_for_size(blk.size) {
                    return Err(format!(
                        "free chunk at {:#x} is in bin {} instead of {}",
                        blk.addr,
                        blk.key.a(),
                        bin_for_size(blk.size)
                    ));
                }
            }
        }
        if regions != self.pool_bytes {
            return Err(format!(
                "pool_bytes {} != Σ regions {regions}",
                self.pool_bytes
            ));
        }
        if let Some(l) = self.limits
            && self.pool_bytes > l.memory_limit
        {
            return Err(format!(
                "regions hold {} bytes, over the memory limit {}",
                self.pool_bytes, l.memory_limit
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::common::testing::Run;
    use crate::models::{Allocator, LayoutBlockState};

    const MIB: u64 = 1 << 20;

    impl Run<BfcModel> {
        fn with(conf: &str, cap: Option<u64>) -> Self {
            Run::new(BfcModel::new(BfcConfig::parse(conf).unwrap()), cap)
        }
    }

    #[test]
    fn bins_cover_powers_of_two_from_256_bytes() {
        assert_eq!(bin_for_size(256), 0);
        assert_eq!(bin_for_size(511), 0);
        assert_eq!(bin_for_size(512), 1);
        assert_eq!(bin_for_size(256 << 19), 19);
        assert_eq!(bin_for_size(256 << 20), 20);
        assert_eq!(bin_for_size(1 << 40), 20);
        assert_eq!(rounded_bytes(1), 256);
    }

    #[test]
    fn split_rule_splits_at_twice_the_request_and_hands_out_the_whole_chunk_below() {
        let mut r = Run::with("", None);
        let a = r.alloc(1000).unwrap();
        // The first region is 2 MiB; 2 MiB ≥ 2 × 1024: split, the allocation at the low end.
        assert_eq!(
            r.blocks(),
            vec![
                (1024, LayoutBlockState::Allocated),
                (2 * MIB - 1024, LayoutBlockState::Free)
            ]
        );
        // 1.5 MiB: the free chunk (2 MiB − 1 KiB) is under twice the request and only
        // 511 KiB over it (< 128 MiB): the whole chunk is handed out.
        let b = r.alloc(3 * MIB / 2).unwrap();
        assert_eq!(b, a + 1024);
        assert_eq!(r.m.stats().allocated_bytes, 2 * MIB);
        assert_eq!(r.m.stats().requested_bytes, 1000 + 3 * MIB / 2);
        // Nothing free is left: the next region is doubled to 4 MiB.
        r.alloc(256).unwrap();
        assert_eq!(r.m.stats().reserved_bytes, 6 * MIB);
        r.free(a);
        r.free(b);
        // Both chunks of the first region merged back into one.
        assert_eq!(r.blocks()[0], (2 * MIB, LayoutBlockState::Free));
    }

    #[test]
    fn split_rule_splits_when_the_excess_reaches_128_mib() {
        let mut r = Run::with("allow_growth:False,memory_fraction:1", Some(1024 * MIB));
        r.alloc(600 * MIB).unwrap();
        // 1 GiB < 2 × 600 MiB but 424 MiB over it ≥ 128 MiB: split.
        assert_eq!(
            r.blocks(),
            vec![
                (600 * MIB, LayoutBlockState::Allocated),
                (424 * MIB, LayoutBlockState::Free)
            ]
        );
        let mut r = Run::with("allow_growth:False,memory_fraction:1", Some(1024 * MIB));
        r.alloc(900 * MIB).unwrap();
        // 124 MiB over: not split, the whole region is allocated.
        assert_eq!(r.blocks(), vec![(1024 * MIB, LayoutBlockState::Allocated)]);
        assert_eq!(r.m.stats().reserved_bytes, 1024 * MIB);
    }

    #[test]
    fn preallocation_takes_the_fraction_at_the_first_request() {
        let mut r = Run::with("allow_growth:False", Some(1024 * MIB));
        r.alloc(1).unwrap();
        assert_eq!(r.m.memory_limit(), Some(768 * MIB));
        assert_eq!(r.m.stats().reserved_bytes, 768 * MIB);
        let e = r.alloc(800 * MIB).unwrap_err();
        assert!(
            e.reason.contains("memory limit of 768.00 MiB"),
            "{}",
            e.reason
        );
        assert_eq!(r.m.config_string(), "allow_growth:False");
    }

    #[test]
    fn regions_double_until_the_request_fits() {
        let mut r = Run::with("", None);
        r.alloc(1).unwrap(); // region 2 MiB, next 4 MiB
        r.alloc(2 * MIB).unwrap(); // region 4 MiB, next 8 MiB
        r.alloc(20 * MIB).unwrap(); // doubled to 32 MiB first; 12 MiB over: handed out whole
        let sizes: Vec<u64> = r.m.layout().segments.iter().map(|s| s.size_bytes).collect();
        let mut sorted = sizes.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![2 * MIB, 4 * MIB, 32 * MIB]);
        r.alloc(20 * MIB).unwrap(); // nothing fits: another 32 MiB region (next: 64 MiB)
        assert_eq!(r.m.stats().reserved_bytes, 70 * MIB);
    }

    #[test]
    fn garbage_collection_returns_free_regions_so_a_bigger_one_fits() {
        for (gc, ok) in [(false, false), (true, true)] {
            let conf = if gc { "garbage_collection:True" } else { "" };
            let mut r = Run::with(conf, Some(6 * MIB));
            let a = r.alloc(3 * MIB / 2).unwrap();
            r.free(a);
            let b = r.alloc(5 * MIB);
            assert_eq!(b.is_ok(), ok, "gc={gc}");
            if ok {
                assert_eq!(r.m.stats().reserved_bytes, 6 * MIB);
            }
        }
    }

    #[test]
    fn config_errors_are_clear() {
        assert!(matches!(
            BfcConfig::parse("memory_fraction:1.5").unwrap_err(),
            common::ConfigError::OutOfRange { key, .. } if key == "memory_fraction"
        ));
        assert!(BfcConfig::parse("allow_growth:maybe").is_err());
        assert_eq!(
            BfcConfig::parse("allow_growth:True").unwrap().canonical(),
            ""
        );
    }
}
