//! `allocsim_core::explain` on real snapshots: the holes and the blockers it names are
//! checked against the memory map by hand — every segment tiled by its blocks, the holes
//! exactly the free blocks of the request's pool and stream, and the blockers' removal
//! really leaving a free run ≥ the rounded request (or really letting a segment go and
//! making room under the capacity).

use std::path::PathBuf;

use allocsim_core::capacity::CapacityArg;
use allocsim_core::explain::{self, BlockerKind, ExplainOptions, Explanation, Moment};
use allocsim_core::models::{LayoutBlockState, LayoutSegment, ModelSpec};
use allocsim_core::trace::Trace;
use allocsim_core::{session, whatif};
use allocsim_tests::traces_dir;

const MIB: u64 = 1 << 20;

fn repo_trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("traces/{name}.pickle.gz"))
}

fn shared_trace(name: &str) -> Option<PathBuf> {
    let p = traces_dir()?.join(format!("{name}.pickle.gz"));
    if p.is_file() {
        Some(p)
    } else {
        println!("skipped: {} not found", p.display());
        None
    }
}

/// Loads FILE and explains its busiest device under the PyTorch model at `capacity`
/// (None: as recorded).
fn explain_file(path: &PathBuf, capacity: Option<u64>, at: Option<u64>) -> (Trace, Explanation) {
    let v = session::load(&std::fs::read(path).unwrap(), capacity).unwrap();
    let d = v.trace.busiest_device();
    let arg = capacity.map_or(CapacityArg::AsRecorded, CapacityArg::Bytes);
    let cap = session::capacity(&v.trace, d, arg).bytes;
    let spec = ModelSpec::parse("pytorch").unwrap();
    let opts = ExplainOptions {
        at_event: at,
        what_if: false,
        without_bounds: false,
    };
    let e = explain::explain(
        &v.trace,
        d,
        &spec,
        cap,
        opts,
        &whatif::InOrder,
        &mut |_, _| {},
    )
    .unwrap();
    check_against_layout(&e);
    (v.trace, e)
}

fn is_live(s: LayoutBlockState) -> bool {
    matches!(
        s,
        LayoutBlockState::Allocated | LayoutBlockState::PendingFree
    )
}

/// The longest run of free blocks once the blocks at `gone` are removed, by hand.
fn run_without(seg: &LayoutSegment, gone: &[u64]) -> u64 {
    let (mut best, mut run) = (0, 0);
    for b in &seg.blocks {
        let free =
            b.state == LayoutBlockState::Free || (is_live(b.state) && gone.contains(&b.addr));
        run = if free { run + b.size_bytes } else { 0 };
        best = best.max(run);
    }
    best
}

fn check_against_layout(e: &Explanation) {
    let r = &e.request;
    // Blocks tile each segment: holes + live blocks (+ unmapped pages) = its size.
    for s in &e.layout.segments {
        let mut at = s.addr;
        for b in &s.blocks {
            assert_eq!(b.addr, at, "segment {:#x} not tiled", s.addr);
            at += b.size_bytes;
        }
        assert_eq!(at - s.addr, s.size_bytes, "segment {:#x}", s.addr);
    }
    // The holes are exactly the free blocks of the request's pool and stream (and its
    // small or large pool).
    let small = r.rounded_bytes <= MIB;
    let mine: Vec<&LayoutSegment> = e
        .layout
        .segments
        .iter()
        .filter(|s| s.pool == r.pool && s.stream == r.stream && s.small == small)
        .collect();
    let free: Vec<(u64, u64)> = mine
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == LayoutBlockState::Free)
        .map(|b| (b.addr, b.size_bytes))
        .collect();
    assert_eq!(e.holes_count, free.len());
    assert_eq!(e.holes_bytes, free.iter().map(|f| f.1).sum::<u64>());
    assert_eq!(
        e.largest_hole_bytes,
        free.iter().map(|f| f.1).max().unwrap_or(0)
    );
    for h in &e.holes {
        assert!(free.contains(&(h.addr, h.bytes)), "hole {:#x}", h.addr);
        for n in [&h.before, &h.after].into_iter().flatten() {
            assert!(is_live(n.state));
            assert!(n.addr + n.bytes == h.addr || h.addr + h.bytes == n.addr);
        }
    }
    if e.holes_count > 0 && e.moment == Moment::Oom {
        assert!(
            e.largest_hole_bytes < r.rounded_bytes,
            "an OOM with a hole that fits"
        );
    }
    let Some(set) = &e.blocker_set else {
        assert!(e.blockers.is_empty());
        return;
    };
    assert!(!e.fits_without_blockers);
    let seg = e
        .layout
        .segments
        .iter()
        .find(|s| s.addr == set.segment_addr)
        .expect("the blockers' segment");
    let gone: Vec<u64> = e.blockers.iter().flat_map(|b| b.addrs.clone()).collect();
    assert_eq!(gone.len(), set.blocks);
    assert_eq!(
        e.blockers.iter().map(|b| b.blocks).sum::<usize>(),
        set.blocks
    );
    let live_bytes: u64 = seg
        .blocks
        .iter()
        .filter(|b| gone.contains(&b.addr))
        .inspect(|b| assert!(is_live(b.state)))
        .map(|b| b.size_bytes)
        .sum();
    assert_eq!(live_bytes, set.bytes);
    assert_eq!(e.blockers.iter().map(|b| b.bytes).sum::<u64>(), set.bytes);
    match set.kind {
        BlockerKind::Window => {
            assert!(mine.iter().any(|s| s.addr == seg.addr));
            let run = run_without(seg, &gone);
            assert!(run >= r.rounded_bytes, "run {run} < {}", r.rounded_bytes);
            assert_eq!(run, set.would_free_contiguous_bytes);
            // Each group's figure is the run its absence alone gives.
            for b in &e.blockers {
                assert_eq!(run_without(seg, &b.addrs), b.would_free_contiguous_bytes);
            }
        }
        BlockerKind::Release => {
            assert_eq!(
                seg.blocks.iter().filter(|b| is_live(b.state)).count(),
                set.blocks
            );
            let cap = e.capacity_bytes.expect("a release needs a capacity");
            let reserved = e.reserved_bytes - e.releasable_cached_bytes - seg.size_bytes;
            assert_eq!(cap - reserved, set.would_free_contiguous_bytes);
            assert!(cap - reserved >= r.segment_bytes);
        }
    }
    let ranks: Vec<u64> = e
        .blockers
        .iter()
        .map(|b| b.would_free_contiguous_bytes)
        .collect();
    assert!(ranks.windows(2).all(|w| w[0] >= w[1]), "{ranks:?}");
}

#[test]
fn explain_oom_story_names_the_holes_and_the_block_between_them() {
    let Some(f) = shared_trace("oom_story") else {
        return;
    };
    let (_, e) = explain_file(&f, None, None);
    assert_eq!((e.moment, e.at_event), (Moment::Oom, 27));
    let msg = e.pytorch_message.as_deref().unwrap();
    assert!(
        msg.starts_with("CUDA out of memory. Tried to allocate 400.00 MiB."),
        "{msg}"
    );
    assert_eq!(e.request.rounded_bytes, 400 * MIB);
    assert_eq!((e.holes_count, e.largest_hole_bytes), (6, 248 * MIB));
    assert_eq!(e.holes_bytes, 248 * MIB + 5 * 180 * MIB);
    // Every hole was opened by a free of a 180 MiB tensor from the same line.
    for h in &e.holes {
        assert!(h.opened_at_event.is_some() && !h.frames.is_empty());
        assert_eq!(
            h.freed_block_site.as_deref(),
            Some("capture.py:283 oom_story")
        );
    }
    let set = e.blocker_set.as_ref().unwrap();
    assert_eq!(set.kind, BlockerKind::Window);
    assert_eq!((set.blocks, set.bytes), (1, 180 * MIB));
    assert_eq!(set.would_free_contiguous_bytes, 540 * MIB);
    assert_eq!(e.blockers.len(), 1);
    assert_eq!(e.blockers[0].site, "capture.py:283 oom_story");
    assert!(
        e.blockers[0].sentence.starts_with(
            "1 block (180.00 MiB) allocated at capture.py:283 oom_story split 360.00 MiB of free space into holes under 400.00 MiB"
        ),
        "{}",
        e.blockers[0].sentence
    );
    assert_eq!(
        (e.live_peak_bytes, e.offline_peak_bytes),
        (2 << 30, 2 << 30)
    );
}

#[test]
fn explain_devfull_oom_finds_the_three_tensors_that_split_the_free_space() {
    let (_, e) = explain_file(&repo_trace("devfull_oom_msg"), None, None);
    assert_eq!((e.moment, e.at_event), (Moment::Oom, 32));
    assert!(
        e.pytorch_message
            .as_deref()
            .unwrap()
            .contains("Tried to allocate 23.60 GiB")
    );
    assert_eq!(e.holes_count, 7);
    let set = e.blocker_set.as_ref().unwrap();
    assert_eq!((set.kind, set.blocks), (BlockerKind::Window, 3));
    assert_eq!(e.blockers.len(), 1);
    assert_eq!(e.blockers[0].site, "capture.py:372 devfull_split_oom");
    assert_eq!(e.blockers[0].events.len(), 3);
}

#[test]
fn explain_gpt2_oom_names_transformers_sites_and_a_segment_to_release() {
    let (_, e) = explain_file(&repo_trace("gpt2_big_batch_oom_msg"), None, None);
    assert_eq!((e.moment, e.at_event), (Moment::Oom, 933));
    assert_eq!(e.request.rounded_bytes, 1 << 30);
    // The top user frame, past torch's own modules.
    assert_eq!(e.request.site, "pytorch_utils.py:119 forward");
    assert_eq!(e.holes_count, 2);
    let set = e.blocker_set.as_ref().unwrap();
    assert_eq!(set.kind, BlockerKind::Release);
    assert_eq!((set.blocks, set.bytes), (1, 128 * MIB));
    assert_eq!(e.blockers[0].site, "modeling_gpt2.py:224 forward");
}

#[test]
fn explain_at_the_release_and_retry_of_oom_fragmented() {
    let Some(f) = shared_trace("oom_fragmented") else {
        return;
    };
    // The 2 GiB cap of the recording (its stats.json): the 500 MiB malloc at event 183
    // releases two cached 300 MiB segments (events 180, 181) and retries.
    let (_, e) = explain_file(&f, Some(2 << 30), Some(182));
    assert_eq!((e.moment, e.at_event), (Moment::Event, 183));
    assert_eq!(e.request.rounded_bytes, 500 * MIB);
    assert!(e.pytorch_message.is_none());
    assert_eq!(e.largest_hole_bytes, 300 * MIB);
    assert_eq!(e.releasable_cached_bytes, 600 * MIB);
    assert!(e.fits_without_blockers && e.blocker_set.is_none());
    // Without a cap nothing is released: the peak is explained instead.
    let (_, p) = explain_file(&f, None, None);
    assert_eq!(p.moment, Moment::Peak);
}

#[test]
fn explain_rejects_an_event_past_the_end() {
    let path = repo_trace("devfull_oom_msg");
    let v = session::load(&std::fs::read(path).unwrap(), None).unwrap();
    let spec = ModelSpec::parse("pytorch").unwrap();
    let opts = ExplainOptions {
        at_event: Some(1_000_000),
        what_if: false,
        without_bounds: false,
    };
    let err = explain::explain(
        &v.trace,
        0,
        &spec,
        None,
        opts,
        &whatif::InOrder,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("--at 1000000"), "{err}");
}
