//! What no recording can hold: segments and blocks past the address space, end-state
//! segments that overlap, a device event whose range wraps past 2^64. Checked once on the
//! decoded snapshot, before any model sees it, so every command refuses such a file with
//! [`crate::Error::Impossible`] naming the segment or event (issue 19).

use std::collections::BTreeMap;

use crate::Error;
use crate::models::common::hasher::AddrMap;
use crate::models::common::rounding::MAX_REQUEST_BYTES;
use crate::snapshot::{Action, RawSnapshot, SegmentType};
use crate::units::format_size;

/// No CUDA virtual address reaches 2^56: a process's addresses lie below 2^56 even with
/// 5-level paging (x86-64 LA57, the widest user address space CUDA runs under), and a
/// GPU's own address space is 49 bits on every GPU so far.
pub const ADDRESS_LIMIT: u64 = 1 << 56;

/// A small-pool segment (`kSmallBuffer`).
const SMALL_SEGMENT_BYTES: u64 = 2 << 20;

fn end(addr: u64, size: u64) -> Option<u64> {
    addr.checked_add(size).filter(|&e| e <= ADDRESS_LIMIT)
}

/// Refuses a snapshot that cannot have been recorded.
pub fn check(snap: &RawSnapshot) -> Result<(), Error> {
    let impossible = |m: String| Err(Error::Impossible(m));
    let mut spans = Vec::with_capacity(snap.segments.len());
    for (i, s) in snap.segments.iter().enumerate() {
        if s.total_size > MAX_REQUEST_BYTES {
            return impossible(format!(
                "segments[{i}] at {:#x}: {} ({} bytes) is more memory than any device has",
                s.address,
                format_size(s.total_size),
                s.total_size
            ));
        }
        // PyTorch's small pool takes its memory in 2 MiB segments (`kSmallBuffer`), or in
        // 2 MiB pages of an expandable segment.
        let small_ok = if s.is_expandable {
            s.total_size % SMALL_SEGMENT_BYTES == 0
        } else {
            s.total_size == SMALL_SEGMENT_BYTES
        };
        if s.segment_type == SegmentType::Small && !small_ok {
            return impossible(format!(
                "segments[{i}] at {:#x}: a small-pool segment of {} bytes (PyTorch's are 2 MiB{})",
                s.address,
                s.total_size,
                if s.is_expandable { " pages" } else { "" }
            ));
        }
        let Some(e) = end(s.address, s.total_size) else {
            return impossible(format!(
                "segments[{i}] at {:#x} of {} bytes ends past the address space (2^56)",
                s.address, s.total_size
            ));
        };
        for (j, b) in s.blocks.iter().enumerate() {
            if b.address < s.address || end(b.address, b.size).is_none_or(|be| be > e) {
                return impossible(format!(
                    "segments[{i}].blocks[{j}] at {:#x} of {} bytes lies outside its segment \
                     ({:#x}, {} bytes)",
                    b.address, b.size, s.address, s.total_size
                ));
            }
        }
        spans.push((s.device, s.address, e, i));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        let (&(d0, a0, e0, i0), &(d1, a1, _, i1)) = (&w[0], &w[1]);
        if d0 == d1 && a1 < e0 {
            return impossible(format!(
                "segments[{i0}] ({:#x}, {} bytes) and segments[{i1}] (at {a1:#x}) overlap on \
                 device {d0}",
                a0,
                e0 - a0
            ));
        }
    }
    for (d, events) in snap.device_traces.iter().enumerate() {
        // Segments `segment_alloc`ed in the trace and not yet freed: address → (size,
        // event). A segment the trace frees without allocating it may predate the trace
        // (a wrapped history); one it allocated is known exactly.
        let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
        // Blocks `alloc`ed in the trace whose free has not completed: address → (size,
        // event). PyTorch records a block's free with the size its alloc recorded
        // (`requested_size`), so a free of another size cannot have been recorded.
        // Looked up only, never iterated: the address hasher.
        let mut blocks: AddrMap<(u64, usize)> = AddrMap::default();
        for (k, ev) in events.iter().enumerate() {
            let ranged = matches!(
                ev.action,
                Action::Alloc
                    | Action::FreeRequested
                    | Action::FreeCompleted
                    | Action::SegmentAlloc
                    | Action::SegmentFree
                    | Action::SegmentMap
                    | Action::SegmentUnmap
            );
            if ranged && (ev.size > MAX_REQUEST_BYTES || end(ev.addr, ev.size).is_none()) {
                let what = if matches!(
                    ev.action,
                    Action::SegmentAlloc
                        | Action::SegmentFree
                        | Action::SegmentMap
                        | Action::SegmentUnmap
                ) {
                    "segment"
                } else {
                    "block"
                };
                return impossible(format!(
                    "device {d} event {k}: {} of a {what} of {} bytes at {:#x}: no device \
                     has that memory or address",
                    ev.action.as_str(),
                    ev.size,
                    ev.addr
                ));
            }
            // The live segment holding `ev.addr` (asked only by segment events).
            let holder = || {
                live.range(..=ev.addr)
                    .next_back()
                    .map(|(&a, &(s, at))| (a, s, at))
                    .filter(|&(a, s, _)| ev.addr < a + s)
            };
            match ev.action {
                Action::Alloc => {
                    blocks.insert(ev.addr, (ev.size, k));
                }
                Action::FreeRequested | Action::FreeCompleted => {
                    // A completed free takes the block out in the same lookup (the map is
                    // not read again if the sizes differ: the file is refused).
                    let alloc = if ev.action == Action::FreeCompleted {
                        blocks.remove(&ev.addr)
                    } else {
                        blocks.get(&ev.addr).copied()
                    };
                    if let Some((size, at)) = alloc
                        && size != ev.size
                    {
                        return impossible(format!(
                            "device {d} event {k}: {} at {:#x} of {} bytes, but the alloc there \
                             (event {at}) was of {size} bytes; PyTorch records a free with its \
                             alloc's size",
                            ev.action.as_str(),
                            ev.addr,
                            ev.size
                        ));
                    }
                }
                Action::SegmentAlloc => {
                    let next = live.range(ev.addr..).next().map(|(&a, &(_, at))| (a, at));
                    let clash = holder()
                        .map(|(a, _, at)| (a, at))
                        .or(next.filter(|&(a, _)| a < ev.addr + ev.size));
                    if let Some((a, at)) = clash {
                        return impossible(format!(
                            "device {d} event {k}: segment_alloc at {:#x} of {} bytes overlaps \
                             the segment at {a:#x} allocated at event {at} and not freed",
                            ev.addr, ev.size
                        ));
                    }
                    live.insert(ev.addr, (ev.size, k));
                }
                Action::SegmentFree => match holder() {
                    Some((a, s, _)) if a == ev.addr && s == ev.size => {
                        live.remove(&a);
                    }
                    Some((a, s, at)) => {
                        return impossible(format!(
                            "device {d} event {k}: segment_free at {:#x} of {} bytes frees no \
                             segment: the segment there is at {a:#x} of {s} bytes (event {at})",
                            ev.addr, ev.size
                        ));
                    }
                    None => {}
                },
                _ => {}
            }
        }
    }
    Ok(())
}
