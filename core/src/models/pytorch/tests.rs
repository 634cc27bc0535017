//! Golden cases of pytorch-allocator.md and the PyTorch devlog, and rule-level checks.

use super::*;
use crate::device::SimulatedDevice;
use crate::snapshot::Action;

const MIB: u64 = 1 << 20;

struct Run {
    model: PyTorchModel,
    dev: SimulatedDevice,
    out: Vec<ModelEvent>,
}

impl Run {
    fn new(conf: &str) -> Run {
        Run::with_limit(conf, None)
    }

    fn with_limit(conf: &str, limit: Option<u64>) -> Run {
        Run {
            model: PyTorchModel::new(PyTorchConfig::parse(conf).unwrap(), limit),
            dev: SimulatedDevice::new(config::H200_TOTAL_BYTES, None),
            out: Vec::new(),
        }
    }

    fn alloc(&mut self, size: u64) -> u64 {
        let r = AllocRequest {
            size_bytes: size,
            stream: 0,
            pool: PoolId::DEFAULT,
        };
        let a = self.model.malloc(&mut self.dev, &r, &mut self.out).unwrap();
        self.model.check_invariants().unwrap();
        a
    }

    /// An alloc of `size` bytes on `stream` in `pool`.
    fn alloc_in(&mut self, pool: PoolId, stream: u64, size: u64) -> u64 {
        let r = AllocRequest {
            size_bytes: size,
            stream,
            pool,
        };
        let a = self.model.malloc(&mut self.dev, &r, &mut self.out).unwrap();
        self.model.check_invariants().unwrap();
        a
    }

    /// The `segment_free`s emitted since the last call, as (address, size).
    fn take_segment_frees(&mut self) -> Vec<(u64, u64)> {
        let frees = self
            .out
            .iter()
            .filter(|e| e.action == Action::SegmentFree)
            .map(|e| (e.addr, e.size))
            .collect();
        self.out.clear();
        frees
    }

    fn try_alloc(&mut self, size: u64) -> Result<u64, OomInfo> {
        let r = AllocRequest {
            size_bytes: size,
            stream: 0,
            pool: PoolId::DEFAULT,
        };
        let a = self.model.malloc(&mut self.dev, &r, &mut self.out);
        self.model.check_invariants().unwrap();
        a
    }

    fn free(&mut self, addr: u64) {
        self.model
            .free(&mut self.dev, addr, false, &mut self.out)
            .unwrap();
        self.model.check_invariants().unwrap();
    }

    fn reserved(&self) -> u64 {
        self.model.stats().reserved_bytes
    }
}

#[test]
fn golden_16_then_32_reserves_256_mib() {
    let mut r = Run::new("");
    let a: Vec<u64> = (0..8).map(|_| r.alloc(16 * MIB)).collect();
    for x in a {
        r.free(x);
    }
    let b: Vec<u64> = (0..4).map(|_| r.alloc(32 * MIB)).collect();
    assert_eq!(r.reserved(), 256 * MIB);
    for x in b {
        r.free(x);
    }
}

#[test]
fn golden_32_then_16_reserves_128_mib() {
    let mut r = Run::new("");
    let a: Vec<u64> = (0..4).map(|_| r.alloc(32 * MIB)).collect();
    for x in a {
        r.free(x);
    }
    for _ in 0..8 {
        r.alloc(16 * MIB);
    }
    assert_eq!(r.reserved(), 128 * MIB);
}

#[test]
fn golden_expandable_16_then_32_maps_140_mib() {
    let mut r = Run::new("expandable_segments:True");
    let a: Vec<u64> = (0..8).map(|_| r.alloc(16 * MIB)).collect();
    for x in a {
        r.free(x);
    }
    for _ in 0..4 {
        r.alloc(32 * MIB);
    }
    assert_eq!(r.reserved(), 140 * MIB);
}

#[test]
fn golden_one_mib_loophole_reserves_22_mib() {
    let mut r = Run::new("");
    r.alloc(2 * MIB);
    r.alloc(MIB / 2);
    assert_eq!(r.reserved(), 22 * MIB);
}

#[test]
fn rounding_and_segment_sizes_follow_the_table() {
    let m = PyTorchModel::new(PyTorchConfig::default(), None);
    for (req, rounded, seg) in [
        (1, 512, 2 * MIB),
        (1000, 1024, 2 * MIB),
        (MIB, MIB, 2 * MIB),
        (MIB + 1, MIB + 512, 20 * MIB),
        (10 * MIB, 10 * MIB, 10 * MIB),
        (11 * MIB + 5, 11 * MIB + 512, 12 * MIB),
        (100 * MIB + 1, 100 * MIB + 512, 102 * MIB),
    ] {
        assert_eq!(m.round_size(req), rounded, "round_size({req})");
        assert_eq!(
            m.allocation_size(rounded),
            seg,
            "allocation_size({rounded})"
        );
    }
    let p = PyTorchModel::new(
        PyTorchConfig::parse("roundup_power2_divisions:4").unwrap(),
        None,
    );
    assert_eq!(p.round_size(1_258_291), 1_310_720);
    assert_eq!(p.round_size(1200), 1536);
}

#[test]
fn a_19_mib_request_takes_the_whole_20_mib_segment() {
    let mut r = Run::new("");
    let a = r.alloc(19 * MIB);
    let layout = r.model.layout();
    assert_eq!(layout.segments.len(), 1);
    assert_eq!(layout.segments[0].blocks.len(), 1);
    assert_eq!(layout.segments[0].blocks[0].size_bytes, 20 * MIB);
    r.free(a);
}

#[test]
fn equal_size_ties_go_to_the_lowest_address() {
    let mut r = Run::new("");
    let a = r.alloc(3 * MIB);
    let b = r.alloc(3 * MIB);
    let c = r.alloc(3 * MIB);
    let _d = r.alloc(3 * MIB);
    r.free(c);
    r.free(a);
    assert_eq!(r.alloc(3 * MIB), a);
    let _ = b;
}

#[test]
fn oom_under_a_cap_flushes_and_reports() {
    let mut r = Run::with_limit("", Some(100 * MIB));
    let a = r.alloc(60 * MIB);
    r.free(a);
    // The cached 60 MiB segment is released by the ladder, then 80 MiB fits.
    let b = r.alloc(80 * MIB);
    assert!(r.out.iter().any(|e| e.action == Action::SegmentFree));
    assert_eq!(r.model.num_alloc_retries, 1);
    let err = r.try_alloc(40 * MIB).unwrap_err();
    assert_eq!(err.rounded_bytes, 40 * MIB);
    assert_eq!(r.out.last().unwrap().action, Action::Oom);
    r.free(b);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let mut r = Run::new("max_split_size_mb:64");
    let a = r.alloc(100 * MIB);
    r.free(a);
    // A small large-pool request may not use the 100 MiB oversize block.
    let b = r.alloc(3 * MIB);
    assert_ne!(b, a);
    // A 90 MiB request may (100 < 90 + 20).
    assert_eq!(r.alloc(90 * MIB), a);
}

#[test]
fn expandable_grows_at_the_segment_edge() {
    let mut r = Run::new("expandable_segments:True");
    let a = r.alloc(3 * MIB);
    let maps: Vec<_> = r
        .out
        .iter()
        .filter(|e| e.action == Action::SegmentMap)
        .collect();
    assert_eq!(maps.len(), 1);
    assert_eq!((maps[0].addr, maps[0].size), (a, 20 * MIB));
    let b = r.alloc(25 * MIB);
    assert_eq!(b, a + 3 * MIB);
    let maps: Vec<_> = r
        .out
        .iter()
        .filter(|e| e.action == Action::SegmentMap)
        .collect();
    assert_eq!((maps[1].addr, maps[1].size), (a + 20 * MIB, 20 * MIB));
    r.free(b);
    r.model.empty_cache(&mut r.dev, &mut r.out);
    r.model.check_invariants().unwrap();
    let last = r.out.last().unwrap();
    assert_eq!(
        (last.action, last.addr, last.size),
        (Action::SegmentUnmap, a + 20 * MIB, 20 * MIB)
    );
    assert_eq!(r.reserved(), 20 * MIB);
}

/// Found by fuzzing: a start state rebuilt from an inconsistent snapshot can hold a split
/// block of `max_split_size` or more (PyTorch never splits one). The OOM ladder's
/// `release_available_cached_blocks` must not release it as if it were a whole segment
/// (that freed part of a segment and broke the free-block count).
#[test]
fn a_split_oversize_block_of_a_start_state_is_never_released_alone() {
    let mut run = Run::with_limit("max_split_size_mb:96", Some(2048 * MIB));
    let base = 0x7f00_0000_0000;
    run.model.load_start(&[crate::trace::StartSegment {
        addr: base,
        size_bytes: 2048 * MIB,
        stream: 0,
        pool: PoolId::DEFAULT,
        small: false,
        expandable: false,
        blocks: vec![crate::trace::StartBlock {
            addr: base,
            size_bytes: 180 * MIB,
            requested_bytes: 180 * MIB,
            pending: true,
        }],
    }]);
    run.model.check_invariants().unwrap();
    run.dev.preload(2048 * MIB);
    // Nothing fits beside the 2 GiB segment: the ladder runs, completes the pending free
    // (the segment is whole again) and releases the segment only then.
    let r = run.try_alloc(2048 * MIB);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(run.reserved(), 2048 * MIB);
    let released: Vec<_> = run
        .out
        .iter()
        .filter(|e| e.action == Action::SegmentFree)
        .map(|e| (e.addr, e.size))
        .collect();
    assert_eq!(released, vec![(base, 2048 * MIB)]);
}

/// Cached segments of the default pools and of two freed CUDA-graph pools, plus one live
/// graph pool; returns the segments in the order `release_cached_blocks` must free them:
/// default large, default small, then each freed pool small then large, the pools in
/// `graph_pools_freeable`'s slot order ((0, 2) before (0, 1)).
fn cache_graph_pools(r: &mut Run) -> Vec<(u64, u64)> {
    const SIDE: u64 = 0x5a00;
    let (g1, g2, live) = (PoolId(0, 1), PoolId(0, 2), PoolId(0, 3));
    let d_large = r.alloc(4 * MIB);
    let d_small = r.alloc(1000);
    let g1_large = r.alloc_in(g1, SIDE, 30 * MIB);
    let g1_small = r.alloc_in(g1, SIDE, 512);
    let g2_large = r.alloc_in(g2, SIDE, 40 * MIB);
    let g2_small = r.alloc_in(g2, SIDE, 600);
    let live_large = r.alloc_in(live, SIDE, 12 * MIB);
    for a in [
        d_large, d_small, g1_large, g1_small, g2_large, g2_small, live_large,
    ] {
        r.free(a);
    }
    r.model.release_pool(g1);
    r.model.release_pool(g2);
    r.out.clear();
    vec![
        (d_large, 20 * MIB),
        (d_small, 2 * MIB),
        (g2_small, 2 * MIB),
        (g2_large, 40 * MIB),
        (g1_small, 2 * MIB),
        (g1_large, 30 * MIB),
    ]
}

#[test]
fn empty_cache_frees_the_default_pools_then_each_freed_graph_pool_small_then_large() {
    let mut r = Run::new("");
    let expected = cache_graph_pools(&mut r);
    r.model.empty_cache(&mut r.dev, &mut r.out);
    r.model.check_invariants().unwrap();
    assert_eq!(r.take_segment_frees(), expected);
    // The live graph's pool keeps its cached segment; the freed pools are gone.
    assert_eq!(r.reserved(), 12 * MIB);
    assert_eq!(r.model.private_pools(), vec![PoolId(0, 3)]);
}

#[test]
fn the_oom_path_frees_graph_pools_in_the_same_order_before_its_retry() {
    // 108 MiB reserved under a 110 MiB cap: a 60 MiB request fails its first cudaMalloc,
    // frees nothing oversize (no max_split_size), flushes everything and retries.
    let mut r = Run::with_limit("", Some(110 * MIB));
    let expected = cache_graph_pools(&mut r);
    assert_eq!(r.reserved(), 108 * MIB);
    r.alloc(60 * MIB);
    let events: Vec<Action> = r.out.iter().map(|e| e.action).collect();
    assert_eq!(
        events,
        [
            vec![Action::SegmentFree; 6],
            vec![Action::SegmentAlloc, Action::Alloc]
        ]
        .concat()
    );
    assert_eq!(r.take_segment_frees(), expected);
    assert_eq!(r.model.num_alloc_retries, 1);
}

#[test]
fn a_freed_graph_pool_with_a_live_block_keeps_its_split_segment_until_it_is_freed() {
    let mut r = Run::new("");
    let g = PoolId(0, 1);
    let a = r.alloc_in(g, 0, 4 * MIB);
    let b = r.alloc_in(g, 0, 4 * MIB);
    let whole = r.alloc_in(g, 0, 30 * MIB);
    r.free(a);
    r.free(whole);
    r.model.release_pool(g);
    r.out.clear();
    r.model.empty_cache(&mut r.dev, &mut r.out);
    // The 20 MiB segment is split (b lives): only the whole 30 MiB one goes.
    assert_eq!(r.take_segment_frees(), vec![(whole, 30 * MIB)]);
    assert_eq!(r.model.private_pools(), vec![g]);
    r.free(b);
    r.model.empty_cache(&mut r.dev, &mut r.out);
    assert_eq!(r.take_segment_frees(), vec![(a, 20 * MIB)]);
    assert!(r.model.private_pools().is_empty());
}

#[test]
fn a_checkpoint_restore_carves_blocks_in_place_where_malloc_would_not() {
    // A graph pool with a cached 2 MiB small segment and a cached 20 MiB large one.
    let mut r = Run::new("");
    let g = PoolId(0, 1);
    let small = r.alloc_in(g, 7, 512);
    let large = r.alloc_in(g, 7, 4 * MIB);
    r.free(small);
    r.free(large);
    let req = |size_bytes| AllocRequest {
        size_bytes,
        stream: 7,
        pool: g,
    };
    // A block of 2 MiB - 512 in the small segment (a malloc would go to the large pool),
    // and a large block leaving 512 KiB (a malloc would not split it).
    let mut out = Vec::new();
    let at = r
        .model
        .alloc_at(&mut r.dev, &req(512), small, &mut out)
        .unwrap();
    assert_eq!(at, small);
    let rest = small + 512;
    let at = r
        .model
        .alloc_at(&mut r.dev, &req(2 * MIB - 512), rest, &mut out)
        .unwrap();
    assert_eq!(at, rest);
    let at = r
        .model
        .alloc_at(&mut r.dev, &req(20 * MIB - MIB / 2), large, &mut out)
        .unwrap();
    assert_eq!(at, large);
    r.model.check_invariants().unwrap();
    let layout = r.model.layout();
    let blocks: Vec<(u64, u64)> = layout
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter().map(|b| (b.addr, b.size_bytes)))
        .collect();
    assert!(blocks.contains(&(rest, 2 * MIB - 512)));
    assert!(blocks.contains(&(large + 20 * MIB - MIB / 2, MIB / 2)));
    assert!(out.iter().all(|e| e.action == Action::Alloc));
    assert_eq!(
        r.model.free_block_at(large + 20 * MIB - MIB / 2),
        Some((MIB / 2, false))
    );
    // Where no free block of the pool starts at the address, it is a malloc.
    let elsewhere = r
        .model
        .alloc_at(&mut r.dev, &req(4 * MIB), 1 << 40, &mut out)
        .unwrap();
    assert_ne!(elsewhere, 1 << 40);
}

/// `throw_on_cudamalloc_oom` (2.12+): a hand-built trace on a 100 MiB device. A 60 MiB
/// segment cached on stream 1, then 50 MiB on stream 0: without the option the device
/// refuses, the ladder releases the cached segment and the retry succeeds; with it the
/// first attempt is rejected and the malloc fails at once, leaving the cache alone and
/// writing no `oom` entry.
#[test]
fn throw_on_cudamalloc_oom_rejects_before_the_ladder() {
    let run = |conf: &str, total: u64| {
        let mut cfg = PyTorchConfig::parse(conf).unwrap();
        cfg.device_total_bytes = total;
        let mut r = Run {
            model: PyTorchModel::new(cfg, None),
            dev: SimulatedDevice::new(total, None),
            out: Vec::new(),
        };
        let on = |stream, size_bytes| AllocRequest {
            size_bytes,
            stream,
            pool: PoolId::DEFAULT,
        };
        let a = r
            .model
            .malloc(&mut r.dev, &on(1, 60 * MIB), &mut r.out)
            .unwrap();
        r.free(a);
        r.out.clear();
        let second = r.model.malloc(&mut r.dev, &on(0, 50 * MIB), &mut r.out);
        r.model.check_invariants().unwrap();
        let actions: Vec<Action> = r.out.iter().map(|e| e.action).collect();
        (r, second, actions)
    };

    let (r, second, actions) = run("", 100 * MIB);
    assert!(second.is_ok());
    assert_eq!(
        actions,
        [Action::SegmentFree, Action::SegmentAlloc, Action::Alloc]
    );
    assert_eq!(
        (r.model.num_alloc_retries, r.model.num_oom_rejections),
        (1, 0)
    );

    let (r, second, actions) = run("throw_on_cudamalloc_oom:True", 100 * MIB);
    let info = second.unwrap_err();
    assert!(
        info.reason.contains("throw_on_cudamalloc_oom"),
        "{}",
        info.reason
    );
    assert_eq!(info.alloc_bytes, 50 * MIB);
    assert!(actions.is_empty(), "no release, no oom entry: {actions:?}");
    assert_eq!(r.reserved(), 60 * MIB, "the cached segment stays");
    assert_eq!(
        (
            r.model.num_oom_rejections,
            r.model.num_ooms,
            r.model.num_alloc_retries
        ),
        (1, 0, 0)
    );

    // Under a fraction the cap is checked first and its failure runs the ladder as
    // before: the option changes nothing here (a 200 MiB device at 0.5 = 100 MiB).
    let (r, second, actions) = run(
        "throw_on_cudamalloc_oom:True,per_process_memory_fraction:0.5",
        200 * MIB,
    );
    assert!(second.is_ok());
    assert_eq!(
        actions,
        [Action::SegmentFree, Action::SegmentAlloc, Action::Alloc]
    );
    assert_eq!(r.model.num_oom_rejections, 0);

    // Below the bound nothing is rejected.
    let (r, second, _) = run("throw_on_cudamalloc_oom:True", 120 * MIB);
    assert!(second.is_ok());
    assert_eq!((r.reserved(), r.model.num_oom_rejections), (110 * MIB, 0));
}

/// A device that hands out the addresses it is given, in order (a recording's, right or
/// wrong for the model), for segments and reservations alike.
struct Handing(Vec<u64>);

impl crate::device::Device for Handing {
    fn malloc(&mut self, _size: u64, _stream: u64) -> Result<u64, crate::device::DeviceOom> {
        if self.0.is_empty() {
            return Err(crate::device::DeviceOom);
        }
        Ok(self.0.remove(0))
    }
    fn free(&mut self, _addr: u64, _size: u64) {}
    fn reserve(
        &mut self,
        size: u64,
        _page: u64,
        stream: u64,
    ) -> Result<u64, crate::device::DeviceOom> {
        self.malloc(size, stream)
    }
    fn release(&mut self, _addr: u64, _size: u64) {}
    fn map(
        &mut self,
        _addr: u64,
        _size: u64,
        _stream: u64,
    ) -> Result<(), crate::device::DeviceOom> {
        Ok(())
    }
    fn unmap(&mut self, _addr: u64, _size: u64) {}
    fn free_bytes(&self) -> u64 {
        0
    }
}

/// `segment_of` as a walk over every segment in slot order: what the segment index must
/// answer.
fn segment_of_by_walk(m: &PyTorchModel, addr: u64) -> Option<(PoolId, u64, bool)> {
    m.segments
        .iter()
        .find(|s| s.live && addr >= s.base && addr < s.base + s.size)
        .map(|s| {
            let p = &m.pools[s.pool as usize];
            (p.id, s.stream, p.small)
        })
}

/// Every segment's base, last byte, end, a byte before it and the middle of each gap.
fn probes(m: &PyTorchModel) -> Vec<u64> {
    let mut at = vec![0, 1, u64::MAX];
    for s in &m.segments {
        at.extend([s.base.saturating_sub(1), s.base, s.base + s.size / 2]);
        at.extend([s.base + s.size - 1, s.base + s.size, s.base + s.size + MIB]);
    }
    at
}

fn segment_of_agrees_with_the_walk(m: &PyTorchModel) {
    for addr in probes(m) {
        assert_eq!(
            m.segment_of(addr),
            segment_of_by_walk(m, addr),
            "at {addr:#x}"
        );
    }
}

#[test]
fn segment_of_answers_as_the_walk_through_releases_and_overlaps() {
    for conf in ["", "expandable_segments:True"] {
        let g = 1u64 << 40;
        let mut m = PyTorchModel::new(PyTorchConfig::parse(conf).unwrap(), None);
        let mut out = Vec::new();
        // Segments out of address order, in two pools and two streams.
        let mut dev = Handing(vec![5 * g, 2 * g, 9 * g, 7 * g]);
        let mut live = Vec::new();
        for (size, stream, pool) in [
            (30 * MIB, 0, PoolId::DEFAULT),
            (100 * 1024, 0, PoolId::DEFAULT),
            (50 * MIB, 7, PoolId::DEFAULT),
            (30 * MIB, 0, PoolId(0, 3)),
        ] {
            let r = AllocRequest {
                size_bytes: size,
                stream,
                pool,
            };
            live.push(m.malloc(&mut dev, &r, &mut out).unwrap());
            segment_of_agrees_with_the_walk(&m);
        }
        assert!(m.segment_of(5 * g).is_some() && m.segment_of(5 * g - 1).is_none());
        // Released segments are gone; their slots are taken again.
        m.free(&mut dev, live[0], false, &mut out).unwrap();
        m.free(&mut dev, live[2], false, &mut out).unwrap();
        m.empty_cache(&mut dev, &mut out);
        segment_of_agrees_with_the_walk(&m);
        assert_eq!(m.segment_of(5 * g), None);
        dev.0 = vec![3 * g];
        let r = AllocRequest {
            size_bytes: 30 * MIB,
            stream: 0,
            pool: PoolId::DEFAULT,
        };
        live[0] = m.malloc(&mut dev, &r, &mut out).unwrap();
        segment_of_agrees_with_the_walk(&m);
        // A device that hands out an address inside a live segment (a replay off the
        // recording): the index is given up, the walk's first segment in slot order answers.
        dev.0 = vec![3 * g + 4 * MIB];
        let r = AllocRequest {
            size_bytes: 40 * MIB,
            stream: 2,
            pool: PoolId::DEFAULT,
        };
        m.malloc(&mut dev, &r, &mut out).unwrap();
        assert!(m.seg_index.given_up);
        segment_of_agrees_with_the_walk(&m);
        assert!(m.segment_of(3 * g + 5 * MIB).is_some());
    }
}

/// `peek_collects` answers whether a collection now releases a block, as
/// `garbage_collect` then does: a free unsplit block releases; a free block that is a
/// split remainder does not (nor does an empty pool), and the collection then changes
/// nothing.
#[test]
fn peek_collects_says_whether_the_collection_releases() {
    let mut r = Run::with_limit("garbage_collection_threshold:0.5", Some(100 * MIB));
    assert!(!r.model.peek_collects(), "no free block");
    // A 40 MiB segment, freed, then split by a 20 MiB request: its free remainder is
    // split, so nothing can be released.
    let a = r.alloc(40 * MIB);
    r.free(a);
    let b = r.alloc(20 * MIB);
    let c = r.alloc(30 * MIB);
    assert_eq!(r.reserved(), 70 * MIB);
    assert!(!r.model.peek_collects(), "only a split remainder is free");
    r.out.clear();
    r.model.garbage_collect(&mut r.dev, &mut r.out);
    assert!(r.take_segment_frees().is_empty());
    assert_eq!(r.reserved(), 70 * MIB);
    // The 30 MiB segment freed whole: released.
    r.free(c);
    assert!(r.model.peek_collects(), "a whole segment is free");
    r.model.garbage_collect(&mut r.dev, &mut r.out);
    assert_eq!(r.take_segment_frees().len(), 1);
    assert_eq!(r.reserved(), 40 * MIB);
    r.free(b);
}
