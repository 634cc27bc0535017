//! `tlsf`: a Two-Level Segregated Fit allocator over pools taken from the device — the
//! algorithm of VMA 3.x, D3D12MA, tlsf-bsd and `rlsf` (peers.md §B.9, §B.11).
//!
//! Facts it rests on:
//! - Free blocks sit in segregated lists: the first level is ⌊log2 size⌋, the second
//!   splits each power of two into 2^`sli` equal classes; small sizes (below 2^`sli`
//!   granules) have exact classes. A free block is filed under the class its size rounds
//!   *down* to.
//! - A request is rounded *up* to the next class boundary before searching, so that any
//!   block of the class found fits: the search takes the head of the first non-empty list
//!   at or above that class (bitmaps make it O(1)). It is good fit, not best fit, and a
//!   request **can fail although a free block that fits exists**: a block in the request's
//!   own class but above it is never looked at (the caveat the `xalloc` crate documents).
//! - Allocation splits the block, the remainder back into its list; lists are LIFO (new
//!   free blocks go to the head); a freed block merges with both free neighbours.
//! - Sizes are multiples of the granularity: here 256 bytes (CUDA's allocation alignment;
//!   `rlsf` uses 32 bytes on the CPU).
//!
//! Rules of the model: pools of `pool_size_mb` are taken from the device when the search
//! fails (VMA's default block size is 256 MiB); a request whose search class starts above
//! that gets a pool of that class size rounded up to 2 MiB, so a new pool always serves the
//! request that asked for it. If the device refuses, pools that are entirely free are
//! returned and the request is tried once more. `empty_cache` returns every entirely free
//! pool. Streams and private pools make no difference.
//!
//! Config keys: `sli` (log2 of the second-level subdivisions, 1..=6; default 4),
//! `pool_size_mb` (default 256).

use super::AllocatorKind;
use super::common::{self, Arena, FreeKey, PAGE_BYTES, State, round_up};
use super::common::{ArenaPolicy, Refusal};
use super::{AllocRequest, ModelEvent};
use crate::device::Device;
use crate::models::common::policy::arena_accessors;
use crate::units::format_size;

/// Size granularity.
pub const GRANULARITY_BYTES: u64 = 256;

/// The options a config string sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsfConfig {
    pub sli: u32,
    pub pool_bytes: u64,
}

impl TlsfConfig {
    const DEFAULT: TlsfConfig = TlsfConfig {
        sli: 4,
        pool_bytes: 256 << 20,
    };

    /// Parses `key:value,…` on top of the defaults.
    pub fn parse(conf: &str) -> Result<TlsfConfig, common::ConfigError> {
        let kv = common::parse_config(AllocatorKind::Tlsf, conf, &["sli", "pool_size_mb"])?;
        let mut c = TlsfConfig::DEFAULT;
        for (k, v) in kv {
            if k == "sli" {
                c.sli = common::parse_u64(AllocatorKind::Tlsf, k, v, 1, 6)? as u32;
            } else {
                c.pool_bytes = common::parse_u64(AllocatorKind::Tlsf, k, v, 2, 1 << 20)? << 20;
            }
        }
        Ok(c)
    }

    /// The options that differ from the defaults.
    #[must_use]
    pub fn canonical(&self) -> String {
        let d = TlsfConfig::DEFAULT;
        common::join_options([
            common::changed("sli", self.sli, d.sli),
            common::changed("pool_size_mb", self.pool_bytes >> 20, d.pool_bytes >> 20),
        ])
    }

    /// The class a free block of `granules` is filed under (`mapping_insert`).
    #[must_use]
    pub fn class_of(&self, granules: u64) -> u64 {
        let sllen = 1u64 << self.sli;
        if granules < sllen {
            return granules;
        }
        let f = granules.ilog2();
        let sl = (granules >> (f - self.sli)) - sllen;
        let fl = u64::from(f - self.sli + 1);
        fl * sllen + sl
    }

    /// The class a request of `granules` searches from (`mapping_search`): its size rounded
    /// up to the next class boundary.
    #[must_use]
    pub fn search_class(&self, granules: u64) -> u64 {
        let sllen = 1u64 << self.sli;
        if granules < sllen {
            return granules;
        }
        let f = granules.ilog2();
        self.class_of(granules + (1u64 << (f - self.sli)) - 1)
    }

    /// The smallest size (granules) of class `c`.
    #[must_use]
    pub fn class_start(&self, c: u64) -> u64 {
        let sllen = 1u64 << self.sli;
        let (fl, sl) = (c / sllen, c % sllen);
        if fl == 0 {
            sl
        } else {
            (sllen + sl) << (fl - 1)
        }
    }
}

/// The TLSF allocator of one device.
#[derive(Debug, Clone)]
pub struct TlsfModel {
    cfg: TlsfConfig,
    arena: Arena,
    /// Insertion counter: lists are LIFO (keys are `(class, MAX − seq, addr)`).
    seq: u64,
}

impl TlsfModel {
    /// A model with this configuration.
    #[must_use]
    pub fn new(cfg: TlsfConfig) -> TlsfModel {
        TlsfModel {
            cfg,
            arena: Arena::new(),
            seq: 0,
        }
    }

    /// Files free block `i` at the head of its list.
    fn push(&mut self, i: u32) {
        self.seq += 1;
        let b = self.arena.b(i);
        let k = FreeKey::new(
            self.cfg.class_of(b.size / GRANULARITY_BYTES),
            FreeKey::B_MAX - self.seq,
            b.addr,
        );
        self.arena.insert_free(i, k);
    }

    /// The good-fit search: the head of the first non-empty list at or above the request's
    /// search class, split.
    fn take(&mut self, rounded: u64) -> Option<u32> {
        let c = self.cfg.search_class(rounded / GRANULARITY_BYTES);
        let (_, i) = self.arena.first_free_from(FreeKey::new(c, 0, 0))?;
        self.arena.remove_free(i);
        if self.arena.b(i).size > rounded {
            let t = self.arena.split(i, rounded);
            self.push(t);
        }
        Some(i)
    }

    fn new_pool(
        &mut self,
        dev: &mut dyn Device,
        rounded: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> bool {
        let class_bytes = self
            .cfg
            .class_start(self.cfg.search_class(rounded / GRANULARITY_BYTES))
            * GRANULARITY_BYTES;
        let size = self.cfg.pool_bytes.max(round_up(class_bytes, PAGE_BYTES));
        let Ok(addr) = self.arena.dev_malloc(dev, size, stream, out) else {
            return false;
        };
        let b = self.arena.add_free_segment(addr, size, stream, 0);
        self.push(b);
        true
    }

    fn release_free_pools(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) -> bool {
        self.arena.release_free_segments(dev, out, |_| true)
    }

    /// A free block that fits `rounded` but sits below the search class (the caveat).
    fn skipped_fit(&self, rounded: u64) -> Option<u64> {
        let u = rounded / GRANULARITY_BYTES;
        let (lo, hi) = (self.cfg.class_of(u), self.cfg.search_class(u));
        self.arena
            .free_range(FreeKey::new(lo, 0, 0), FreeKey::new(hi, 0, 0))
            .map(|(_, i)| self.arena.b(i).size)
            .filter(|&s| s >= rounded)
            .max()
    }
}

impl ArenaPolicy for TlsfModel {
    const KIND: AllocatorKind = AllocatorKind::Tlsf;

    arena_accessors!(cfg);

    #[inline]
    fn find(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, Refusal> {
        let rounded = round_up(req.size_bytes.max(1), GRANULARITY_BYTES);
        let stream = req.stream;
        let mut found = self.take(rounded);
        if found.is_none()
            && (self.new_pool(dev, rounded, stream, out)
                || (self.release_free_pools(dev, out) && self.new_pool(dev, rounded, stream, out)))
        {
            found = self.take(rounded);
        }
        found.ok_or_else(|| {
            let mut reason = format!(
                "no list at or above the request's class has a block and the device refused a new pool ({} free)",
                format_size(dev.free_bytes())
            );
            if let Some(s) = self.skipped_fit(rounded) {
                reason.push_str("; a free block of ");
                reason.push_str(&format_size(s));
                reason.push_str(
                    " fits but sits in the request's own class, which good-fit search skips",
                );
            }
            Refusal::new(rounded, self.cfg.pool_bytes.max(rounded), reason)
        })
    }

    fn put_back(&mut self, _dev: &mut dyn Device, i: u32, _out: &mut Vec<ModelEvent>) {
        let m = self.arena.coalesce(i, |_| true);
        self.push(m);
    }

    fn release_cached(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        self.release_free_pools(dev, out);
    }

    fn check_policy(&self) -> Result<(), String> {
        for (s, _) in self.arena.segments() {
            for b in self.arena.seg_blocks(s) {
                let blk = self.arena.b(b);
                if !blk.size.is_multiple_of(GRANULARITY_BYTES) {
                    return Err(format!(
                        "block at {:#x} is not a multiple of the granularity",
                        blk.addr
                    ));
                }
                if blk.state == State::Free
                    && blk.key.a() != self.cfg.class_of(blk.size / GRANULARITY_BYTES)
                {
                    return Err(format!(
                        "free block at {:#x} is in the wrong list",
                        blk.addr
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimulatedDevice;
    use crate::models::Allocator;
    use crate::models::common::testing;

    const G: u64 = GRANULARITY_BYTES;
    const MIB: u64 = 1 << 20;

    fn req(size: u64) -> AllocRequest {
        testing::req(size, 0)
    }

    #[test]
    fn classes_round_down_for_blocks_and_up_for_requests() {
        let c = TlsfConfig::parse("").unwrap();
        // Exact classes below 16 granules, then 16 per power of two.
        assert_eq!(c.class_of(15), 15);
        assert_eq!(c.class_of(16), 16);
        assert_eq!(c.class_of(31), 31);
        assert_eq!(c.class_of(32), 32);
        assert_eq!(
            c.class_of(33),
            32,
            "33 granules share the class of 32 (step 2)"
        );
        assert_eq!(
            c.search_class(33),
            33,
            "a request of 33 searches from the class of 34"
        );
        assert_eq!(c.class_start(33), 34);
        assert_eq!(c.search_class(32), 32);
        for u in 1..5000 {
            let s = c.search_class(u);
            assert!(
                c.class_start(s) >= u,
                "every block of the search class fits {u}"
            );
            assert!(c.class_start(c.class_of(u)) <= u);
        }
    }

    #[test]
    fn a_request_fails_although_a_fitting_block_is_free() {
        let mut m = TlsfModel::new(TlsfConfig::parse("pool_size_mb:2").unwrap());
        // The device holds exactly one 2 MiB pool: no second pool can rescue the search.
        let mut dev = SimulatedDevice::new(1 << 40, Some(2 * MIB));
        let mut out = Vec::new();
        m.malloc(&mut dev, &req(2 * MIB - 33 * G), &mut out)
            .unwrap();
        m.check_invariants().unwrap();
        assert_eq!(
            m.stats().largest_free_bytes,
            33 * G,
            "one free block of 33 granules"
        );
        let e = m.malloc(&mut dev, &req(33 * G), &mut out).unwrap_err();
        assert!(e.reason.contains("good-fit search skips"), "{}", e.reason);
        assert_eq!(e.largest_free_bytes, 33 * G);
        // 32 granules search from class 32, which holds the block: it fits.
        let a = m.malloc(&mut dev, &req(32 * G), &mut out).unwrap();
        m.check_invariants().unwrap();
        m.free(&mut dev, a, false, &mut out).unwrap();
        m.check_invariants().unwrap();
    }

    #[test]
    fn lists_are_lifo_and_frees_merge_both_ways() {
        let mut m = TlsfModel::new(TlsfConfig::parse("pool_size_mb:2").unwrap());
        let mut dev = SimulatedDevice::new(1 << 40, None);
        let mut out = Vec::new();
        let a: Vec<u64> = (0..5)
            .map(|_| m.malloc(&mut dev, &req(4 * G), &mut out).unwrap())
            .collect();
        m.free(&mut dev, a[1], false, &mut out).unwrap();
        m.free(&mut dev, a[3], false, &mut out).unwrap();
        // Both freed blocks are in class 4: the last freed (a[3]) is at the head.
        assert_eq!(m.malloc(&mut dev, &req(4 * G), &mut out).unwrap(), a[3]);
        m.free(&mut dev, a[0], false, &mut out).unwrap();
        m.free(&mut dev, a[2], false, &mut out).unwrap();
        // a[0], a[1], a[2] merged into one 12-granule block.
        assert_eq!(m.stats().free_holes, 2);
        assert_eq!(m.malloc(&mut dev, &req(12 * G), &mut out).unwrap(), a[0]);
        m.check_invariants().unwrap();
    }
}
