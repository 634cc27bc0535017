//! `rmm-binning`: RAPIDS RMM's `binning_memory_resource`: power-of-two bins of
//! `fixed_size_memory_resource`, larger requests straight to the upstream (`cudaMalloc`),
//! after `rapidsai/rmm:cpp/include/rmm/mr/binning_memory_resource.hpp` and
//! `fixed_size_memory_resource.hpp` (peers.md §B.3).
//!
//! Facts it rests on:
//! - One bin per power of two from 2^`min_size_exponent` to 2^`max_size_exponent` bytes
//!   (RMM's documented example: 18..22, 256 KiB to 4 MiB). A request goes to the smallest
//!   bin at least its size (`resource_bins_.lower_bound`), however small it is; a request
//!   over the largest bin goes to the upstream resource, here `cudaMalloc` (whole pages),
//!   and is freed straight back.
//! - A bin hands out blocks of exactly its size. It gets them from the upstream in chunks
//!   of `blocks_to_preallocate` blocks (default 128), one chunk preallocated when the bin
//!   is constructed (here: at the first request), another whenever its lists are empty.
//!   Chunks are never returned before destruction: `empty_cache` does nothing.
//! - Free lists are per stream and first-in first-out (`push_back`, `pop_front`); a new
//!   chunk's blocks are appended in address order. A request takes the front of its
//!   stream's list, else the front of another stream's list (in the order the streams first
//!   appeared: RMM orders them by event handle, created at a stream's first use),
//!   else a new chunk. Fixed-size blocks never merge.
//!
//! Private pools make no difference; a zero-byte request is served by the smallest bin.
//!
//! Config keys: `min_size_exponent` (18), `max_size_exponent` (22),
//! `blocks_to_preallocate` (128).

use super::AllocatorKind;
use super::common::{self, Arena, FreeKey, State, device_bytes};
use super::common::{ArenaPolicy, Block, Refusal, StreamLists};
use super::{AllocRequest, ModelEvent};
use crate::device::Device;
use crate::models::common::policy::arena_accessors;
use crate::units::format_size;

/// Segment tag of an upstream (over-the-largest-bin) allocation.
const TAG_UPSTREAM: u64 = u64::MAX;

/// The options a config string sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmmBinningConfig {
    pub min_size_exponent: u32,
    pub max_size_exponent: u32,
    pub blocks_to_preallocate: u64,
}

impl RmmBinningConfig {
    const DEFAULT: RmmBinningConfig = RmmBinningConfig {
        min_size_exponent: 18,
        max_size_exponent: 22,
        blocks_to_preallocate: 128,
    };

    /// Parses `key:value,…` on top of the defaults.
    pub fn parse(conf: &str) -> Result<RmmBinningConfig, common::ConfigError> {
        let kv = common::parse_config(
            AllocatorKind::RmmBinning,
            conf,
            &[
                "min_size_exponent",
                "max_size_exponent",
                "blocks_to_preallocate",
            ],
        )?;
        let mut c = RmmBinningConfig::DEFAULT;
        for (k, v) in kv {
            match k {
                "min_size_exponent" => {
                    c.min_size_exponent =
                        common::parse_u64(AllocatorKind::RmmBinning, k, v, 8, 40)? as u32;
                }
                "max_size_exponent" => {
                    c.max_size_exponent =
                        common::parse_u64(AllocatorKind::RmmBinning, k, v, 8, 40)? as u32;
                }
                _ => {
                    c.blocks_to_preallocate =
                        common::parse_u64(AllocatorKind::RmmBinning, k, v, 1, 1 << 20)?;
                }
            }
        }
        if c.min_size_exponent > c.max_size_exponent {
            return Err(common::ConfigError::Exceeds {
                model: AllocatorKind::RmmBinning,
                low_key: "min_size_exponent",
                low: u64::from(c.min_size_exponent),
                high_key: "max_size_exponent",
                high: u64::from(c.max_size_exponent),
            });
        }
        Ok(c)
    }

    /// The options that differ from the defaults.
    #[must_use]
    pub fn canonical(&self) -> String {
        let d = RmmBinningConfig::DEFAULT;
        common::join_options([
            common::changed(
                "min_size_exponent",
                self.min_size_exponent,
                d.min_size_exponent,
            ),
            common::changed(
                "max_size_exponent",
                self.max_size_exponent,
                d.max_size_exponent,
            ),
            common::changed(
                "blocks_to_preallocate",
                self.blocks_to_preallocate,
                d.blocks_to_preallocate,
            ),
        ])
    }

    fn bins(&self) -> u64 {
        u64::from(self.max_size_exponent - self.min_size_exponent + 1)
    }

    fn bin_bytes(&self, bin: u64) -> u64 {
        1u64 << (u64::from(self.min_size_exponent) + bin)
    }

    /// The bin a request of `size` bytes goes to (`None`: the upstream).
    fn bin_for(&self, size: u64) -> Option<u64> {
        if size > 1u64 << self.max_size_exponent {
            return None;
        }
        let e = size
            .max(1)
            .next_power_of_two()
            .ilog2()
            .max(self.min_size_exponent);
        Some(u64::from(e - self.min_size_exponent))
    }
}

/// The RMM binning resource of one device.
#[derive(Debug, Clone)]
pub struct RmmBinningModel {
    cfg: RmmBinningConfig,
    arena: Arena,
    initialized: bool,
    /// The constructor's preallocation failed: the resource does not exist.
    init_error: Option<String>,
    /// Insertion counter: free-list order (keys are `(bin, list, seq)`).
    seq: u64,
    /// The streams in the order they first appeared; a stream's lists are named by its
    /// index here (a block's `owner`).
    streams: StreamLists,
}

impl RmmBinningModel {
    /// A model with this configuration.
    #[must_use]
    pub fn new(cfg: RmmBinningConfig) -> RmmBinningModel {
        RmmBinningModel {
            cfg,
            arena: Arena::new(),
            initialized: false,
            init_error: None,
            seq: 0,
            streams: StreamLists::default(),
        }
    }

    /// Appends free block `i` to the back of `stream`'s list of `bin`.
    fn push_back(&mut self, i: u32, bin: u64, stream: u64) {
        self.seq += 1;
        let list = self.streams.list_of(stream);
        self.arena.bm(i).owner = list;
        self.arena.insert_free(i, FreeKey::new(bin, list, self.seq));
    }

    /// A new chunk for `bin`, its blocks appended to `stream`'s list.
    fn chunk(
        &mut self,
        dev: &mut dyn Device,
        bin: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> bool {
        let block = self.cfg.bin_bytes(bin);
        let size = block * self.cfg.blocks_to_preallocate;
        let Ok(addr) = self.arena.dev_malloc(dev, size, stream, out) else {
            return false;
        };
        let (_, mut b) = self.arena.add_segment(
            addr,
            size,
            device_bytes(size),
            stream,
            true,
            false,
            bin,
            State::Free,
        );
        for _ in 1..self.cfg.blocks_to_preallocate {
            let t = self.arena.split(b, block);
            self.push_back(b, bin, stream);
            b = t;
        }
        self.push_back(b, bin, stream);
        true
    }

    /// The front of `stream`'s list of `bin`, else of another stream's list (in the order
    /// the streams first appeared).
    fn front(&mut self, bin: u64, stream: u64) -> Option<u32> {
        let list = self.streams.list_of(stream);
        if let Some((k, i)) = self.arena.first_free_from(FreeKey::new(bin, list, 0))
            && k.a() == bin
            && k.b() == list
        {
            return Some(i);
        }
        self.arena
            .first_free_from(FreeKey::new(bin, 0, 0))
            .filter(|(k, _)| k.a() == bin)
            .map(|(_, i)| i)
    }

    fn start(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        self.initialized = true;
        for bin in 0..self.cfg.bins() {
            if !self.chunk(dev, bin, 0, out) {
                let chunk = self.cfg.bin_bytes(bin) * self.cfg.blocks_to_preallocate;
                self.init_error = Some(format!(
                    "the {} bin could not preallocate its {} chunk ({} free)",
                    format_size(self.cfg.bin_bytes(bin)),
                    format_size(chunk),
                    format_size(dev.free_bytes())
                ));
                return;
            }
        }
    }
}

impl ArenaPolicy for RmmBinningModel {
    const KIND: AllocatorKind = AllocatorKind::RmmBinning;

    arena_accessors!(cfg);

    #[inline]
    fn find(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, Refusal> {
        if !self.initialized {
            self.start(dev, out);
        }
        let stream = req.stream;
        let size = req.size_bytes;
        // The oom event records the request as asked; no free block serves another bin.
        let refusal = |rounded: u64, alloc: u64, reason: &str, dev: &dyn Device| {
            Refusal::new(
                rounded,
                alloc,
                format!(
                    "{reason} ({} free on the device)",
                    format_size(dev.free_bytes())
                ),
            )
            .with_event_bytes(size)
            .without_usable_free_blocks()
        };
        if let Some(e) = &self.init_error {
            return Err(refusal(size, 0, e, dev));
        }
        let i = if let Some(bin) = self.cfg.bin_for(size) {
            let mut found = self.front(bin, stream);
            if found.is_none() && self.chunk(dev, bin, stream, out) {
                found = self.front(bin, stream);
            }
            let Some(i) = found else {
                let chunk = self.cfg.bin_bytes(bin) * self.cfg.blocks_to_preallocate;
                let reason = format!(
                    "the {} bin is empty and the device refused a new {} chunk",
                    format_size(self.cfg.bin_bytes(bin)),
                    format_size(chunk)
                );
                return Err(refusal(self.cfg.bin_bytes(bin), chunk, &reason, dev));
            };
            self.arena.remove_free(i);
            i
        } else {
            let Ok(addr) = self.arena.dev_malloc(dev, size, stream, out) else {
                let reason = format!("the upstream cudaMalloc of {} failed", format_size(size));
                return Err(refusal(size, size, &reason, dev));
            };
            self.arena
                .add_free_segment(addr, size, stream, TAG_UPSTREAM)
        };
        Ok(i)
    }

    fn put_back(&mut self, dev: &mut dyn Device, i: u32, out: &mut Vec<ModelEvent>) {
        let seg = self.arena.b(i).seg;
        let tag = self.arena.seg(seg).tag;
        if tag == TAG_UPSTREAM {
            let _ = self.arena.dev_free(dev, seg, out);
        } else {
            let stream = self.arena.b(i).stream;
            self.push_back(i, tag, stream);
        }
    }

    fn adjacent_free_ok(&self, _: &Block, _: &Block) -> bool {
        // Fixed-size blocks never merge.
        true
    }

    fn check_policy(&self) -> Result<(), String> {
        for (s, seg) in self.arena.segments() {
            if seg.tag == TAG_UPSTREAM {
                if self.arena.seg_blocks(s).count() != 1
                    || self.arena.b(seg.head).state == State::Free
                {
                    return Err(format!(
                        "upstream allocation {:#x} is split or cached",
                        seg.base
                    ));
                }
                continue;
            }
            let block = self.cfg.bin_bytes(seg.tag);
            if seg.size != block * self.cfg.blocks_to_preallocate {
                return Err(format!("chunk {:#x} has the wrong size", seg.base));
            }
            for b in self.arena.seg_blocks(s) {
                let blk = self.arena.b(b);
                if blk.size != block {
                    return Err(format!(
                        "block at {:#x} is {} bytes in the {block}-byte bin",
                        blk.addr, blk.size
                    ));
                }
                if blk.state == State::Free && (blk.key.a() != seg.tag || blk.key.b() != blk.owner)
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
    use crate::models::common::testing::req;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    fn run(conf: &str, cap: Option<u64>) -> (RmmBinningModel, SimulatedDevice, Vec<ModelEvent>) {
        (
            RmmBinningModel::new(RmmBinningConfig::parse(conf).unwrap()),
            SimulatedDevice::new(1 << 40, cap),
            Vec::new(),
        )
    }

    #[test]
    fn every_bin_preallocates_a_chunk_and_small_requests_take_the_smallest_bin() {
        let (mut m, mut dev, mut out) = run("", None);
        let a = m.malloc(&mut dev, &req(4, 0), &mut out).unwrap();
        m.check_invariants().unwrap();
        // 128 × (256 KiB + 512 KiB + 1 MiB + 2 MiB + 4 MiB) = 992 MiB up front.
        assert_eq!(m.stats().reserved_bytes, 992 * MIB);
        assert_eq!(m.stats().allocated_bytes, 256 * KIB);
        let b = m.malloc(&mut dev, &req(300 * KIB, 0), &mut out).unwrap();
        assert_eq!(m.arena.b(m.arena.live_block(b).unwrap()).size, 512 * KIB);
        // Over the largest bin: a cudaMalloc of its own, freed straight back.
        let c = m.malloc(&mut dev, &req(5 * MIB, 0), &mut out).unwrap();
        assert_eq!(m.stats().reserved_bytes, 998 * MIB);
        m.free(&mut dev, c, false, &mut out).unwrap();
        assert_eq!(m.stats().reserved_bytes, 992 * MIB);
        m.free(&mut dev, a, false, &mut out).unwrap();
        m.check_invariants().unwrap();
    }

    #[test]
    #[allow(clippy::many_single_char_names)]
    fn lists_are_fifo_and_grow_by_a_chunk() {
        let (mut m, mut dev, mut out) = run(
            "min_size_exponent:10,max_size_exponent:10,blocks_to_preallocate:2",
            None,
        );
        let a = m.malloc(&mut dev, &req(1000, 0), &mut out).unwrap();
        let b = m.malloc(&mut dev, &req(1000, 0), &mut out).unwrap();
        assert_eq!(b, a + 1024);
        let c = m.malloc(&mut dev, &req(1000, 0), &mut out).unwrap();
        assert_eq!(
            m.stats().reserved_bytes,
            4 * MIB,
            "a second chunk (its own page)"
        );
        m.free(&mut dev, b, false, &mut out).unwrap();
        m.free(&mut dev, a, false, &mut out).unwrap();
        // The new chunk's second block was queued first, then b, then a.
        let d = m.malloc(&mut dev, &req(1000, 0), &mut out).unwrap();
        assert_eq!(d, c + 1024);
        assert_eq!(m.malloc(&mut dev, &req(1000, 0), &mut out).unwrap(), b);
        // Another stream takes the front of stream 0's list.
        assert_eq!(m.malloc(&mut dev, &req(1000, 7), &mut out).unwrap(), a);
        m.check_invariants().unwrap();
    }

    #[test]
    fn a_failed_preallocation_fails_every_request() {
        let (mut m, mut dev, mut out) = run("", Some(512 * MIB));
        let e = m.malloc(&mut dev, &req(4, 0), &mut out).unwrap_err();
        assert!(e.reason.contains("could not preallocate"), "{}", e.reason);
        assert!(RmmBinningConfig::parse("min_size_exponent:23").is_err());
    }
}
