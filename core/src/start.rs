//! Rebuilding the state at the start of a trace from the snapshot's end state by undoing
//! the trace from its last event to its first (pytorch-allocator.md §13.2).

use std::collections::BTreeMap;

use crate::models::PoolId;
use crate::models::common::hasher::AddrMap;
use crate::models::pytorch::{PyTorchModel, SMALL_BUFFER_BYTES, SMALL_SIZE_BYTES};
use crate::snapshot::{Action, BlockState, RawSnapshot, SegmentType};
use crate::trace::{StartBlock, StartSegment, TraceError};

#[derive(Debug, Clone, Copy)]
struct Seg {
    size: u64,
    stream: u64,
    small: bool,
    pool: PoolId,
    expandable: bool,
}

#[derive(Debug, Clone, Copy)]
struct Live {
    requested: u64,
    pending: bool,
    /// Exact block size, known when the block lives from before the window to the end.
    exact_size: Option<u64>,
}

/// The segments and live blocks of device `device` before its first trace event.
/// `model` supplies the rounding rules (the recording's configuration).
pub fn rebuild_start(
    snap: &RawSnapshot,
    device: u32,
    model: &PyTorchModel,
) -> Result<Vec<StartSegment>, TraceError> {
    let err = |i: usize, m: String| TraceError {
        device,
        event_index: i,
        message: m,
    };
    let mut segs: BTreeMap<u64, Seg> = BTreeMap::new();
    // Looked up by address while the trace is undone (one entry per alloc and free:
    // a hash map), put in address order once the few left are known.
    let mut live: AddrMap<Live> = AddrMap::default();
    for s in snap.segments.iter().filter(|s| s.device == device) {
        segs.insert(
            s.address,
            Seg {
                size: s.total_size,
                stream: s.stream,
                small: s.segment_type == SegmentType::Small,
                pool: PoolId(s.segment_pool_id.0, s.segment_pool_id.1),
                expandable: s.is_expandable,
            },
        );
        for b in &s.blocks {
            if b.state != BlockState::Inactive {
                live.insert(
                    b.address,
                    Live {
                        requested: b.requested_size,
                        pending: b.state == BlockState::ActivePendingFree,
                        exact_size: Some(b.size),
                    },
                );
            }
        }
    }
    let events = snap
        .device_traces
        .get(device as usize)
        .map_or(&[][..], Vec::as_slice);
    for (i, e) in events.iter().enumerate().rev() {
        match e.action {
            Action::Alloc if live.remove(&e.addr).is_none() => {
                return Err(err(
                    i,
                    format!(
                        "alloc at {:#x} is neither alive at the end nor freed later",
                        e.addr
                    ),
                ));
            }
            Action::FreeCompleted => {
                live.insert(
                    e.addr,
                    Live {
                        requested: e.size,
                        pending: true,
                        exact_size: None,
                    },
                );
            }
            Action::FreeRequested => {
                if let Some(l) = live.get_mut(&e.addr) {
                    l.pending = false;
                } else {
                    live.insert(
                        e.addr,
                        Live {
                            requested: e.size,
                            pending: false,
                            exact_size: None,
                        },
                    );
                }
            }
            Action::SegmentAlloc => {
                segs.remove(&e.addr);
            }
            Action::SegmentFree => {
                segs.insert(
                    e.addr,
                    Seg {
                        size: e.size,
                        stream: e.stream,
                        small: e.size == SMALL_BUFFER_BYTES,
                        pool: PoolId::DEFAULT,
                        expandable: false,
                    },
                );
            }
            Action::SegmentMap => {
                // Carve the mapped range out of the run that holds it.
                let hit = segs.range(..=e.addr).next_back().map(|(a, s)| (*a, *s));
                if let Some((a, s)) = hit.filter(|(a, s)| e.addr + e.size <= a + s.size) {
                    segs.remove(&a);
                    if e.addr > a {
                        segs.insert(
                            a,
                            Seg {
                                size: e.addr - a,
                                ..s
                            },
                        );
                    }
                    let end = a + s.size;
                    if e.addr + e.size < end {
                        segs.insert(
                            e.addr + e.size,
                            Seg {
                                size: end - e.addr - e.size,
                                ..s
                            },
                        );
                    }
                }
            }
            Action::SegmentUnmap => {
                let small = e.size == SMALL_BUFFER_BYTES;
                let mut start = e.addr;
                let mut size = e.size;
                if let Some((&a, &s)) = segs.range(..e.addr).next_back()
                    && a + s.size == e.addr
                    && s.expandable
                    && s.stream == e.stream
                {
                    segs.remove(&a);
                    start = a;
                    size += s.size;
                }
                if let Some(&s) = segs.get(&(e.addr + e.size))
                    && s.expandable
                    && s.stream == e.stream
                {
                    segs.remove(&(e.addr + e.size));
                    size += s.size;
                }
                segs.insert(
                    start,
                    Seg {
                        size,
                        stream: e.stream,
                        small,
                        pool: PoolId::DEFAULT,
                        expandable: true,
                    },
                );
            }
            _ => {}
        }
    }
    let live: BTreeMap<u64, Live> = live.into_iter().collect();
    let mut out = Vec::new();
    for (&addr, s) in &segs {
        let end = addr + s.size;
        let mut blocks: Vec<StartBlock> = live
            .range(addr..end)
            .map(|(&a, l)| StartBlock {
                addr: a,
                size_bytes: l
                    .exact_size
                    .unwrap_or_else(|| model.round_size(l.requested)),
                requested_bytes: l.requested,
                pending: l.pending,
            })
            .collect();
        // Slack the allocator would have left unsplit belongs to the block before it.
        for k in 0..blocks.len() {
            let next = blocks.get(k + 1).map_or(end, |b| b.addr);
            let b = &mut blocks[k];
            let gap = next.saturating_sub(b.addr + b.size_bytes);
            let absorb = if s.small || s.expandable {
                gap < 512
            } else {
                gap <= SMALL_SIZE_BYTES
            };
            if gap > 0 && absorb {
                b.size_bytes += gap;
            }
            if b.addr + b.size_bytes > next {
                b.size_bytes = next - b.addr;
            }
        }
        out.push(StartSegment {
            addr,
            size_bytes: s.size,
            stream: s.stream,
            pool: s.pool,
            small: s.small,
            expandable: s.expandable,
            blocks,
        });
    }
    // A block outside every segment means the file contradicts itself.
    for &a in live.keys() {
        let inside = segs
            .range(..=a)
            .next_back()
            .is_some_and(|(&sa, s)| a < sa + s.size);
        if !inside {
            return Err(err(
                0,
                format!("block {a:#x} alive at the start lies in no segment"),
            ));
        }
    }
    Ok(out)
}
