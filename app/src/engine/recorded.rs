//! What a snapshot itself records, read straight from the decoded file before the trace is
//! built or anything is replayed: the reserved bytes and the live requested bytes after
//! each trace entry of a device, and that device's end state (the file's `segments`) as a
//! memory map. The app draws it as soon as the file is decoded (issue 17); the validated
//! trace and the replays fill in after.
//!
//! The timeline is exact for what the entries state: PyTorch records `alloc` and
//! `free_completed` with the request's size (`orig_size` / `requested_size`), and
//! `segment_alloc`/`segment_map` (`segment_free`/`segment_unmap`) with the bytes reserved
//! (released). A ring buffer that wrapped has lost its first entries, so the walk goes
//! backwards from the end state, which the file states completely: after the last entry
//! the values are those of `segments`, and each entry's value is the one after it less
//! what the later entry added.

use allocsim_core::snapshot::{Action, BlockState, RawSnapshot, SegmentType};

use super::wire::{BlockView, LayoutData, NO_OP, RecordedData, SegmentView, block_state};

/// The device a decoded snapshot is shown on first: the one with the most trace entries
/// (the lowest index on a tie), as [`allocsim_core::trace::Trace::busiest_device`] picks
/// it once the trace is built.
#[must_use]
pub fn busiest_device(snap: &RawSnapshot) -> u32 {
    snap.device_traces
        .iter()
        .enumerate()
        .max_by_key(|(i, events)| (events.len(), std::cmp::Reverse(*i)))
        .map_or(0, |(i, _)| i as u32)
}

/// The recorded timeline and end state of device `device` of `snap`.
#[must_use]
pub fn recorded(snap: &RawSnapshot, name: &str, device: u32) -> RecordedData {
    let end_state = end_state(snap, device);
    let mut reserved = 0u64;
    let mut requested = 0u64;
    for s in &end_state.segments {
        reserved = reserved.saturating_add(s.size_bytes);
    }
    for b in &end_state.blocks {
        if matches!(b.state, block_state::ALLOCATED | block_state::PENDING_FREE) {
            requested = requested.saturating_add(b.requested_bytes);
        }
    }
    let events = snap
        .device_traces
        .get(device as usize)
        .map_or(&[][..], Vec::as_slice);
    let n = events.len();
    let mut reserved_bytes = vec![0u64; n];
    let mut requested_bytes = vec![0u64; n];
    // Backwards: the value after entry `i` is the value after entry `i + 1` less what
    // entry `i + 1` changed.
    for (i, e) in events.iter().enumerate().rev() {
        reserved_bytes[i] = reserved;
        requested_bytes[i] = requested;
        match e.action {
            Action::Alloc => requested = requested.saturating_sub(e.size),
            Action::FreeCompleted => requested = requested.saturating_add(e.size),
            Action::SegmentAlloc | Action::SegmentMap => reserved = reserved.saturating_sub(e.size),
            Action::SegmentFree | Action::SegmentUnmap => {
                reserved = reserved.saturating_add(e.size);
            }
            Action::FreeRequested | Action::Oom | Action::Snapshot | Action::Other => {}
        }
    }
    RecordedData {
        name: name.to_string(),
        device,
        reserved_bytes,
        requested_bytes,
        end_state,
    }
}

/// The file's `segments` of `device` as a layout at its last entry, grouped as the
/// replays' layouts are (pool, stream, address). No block is linked to an alloc op: the
/// ops do not exist yet.
#[must_use]
pub fn end_state(snap: &RawSnapshot, device: u32) -> LayoutData {
    let mut segments: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .collect();
    segments.sort_by_key(|s| (s.segment_pool_id, s.stream, s.address));
    let events = snap.device_traces.get(device as usize).map_or(0, Vec::len);
    let mut out = LayoutData {
        op: u32::try_from(events.saturating_sub(1)).unwrap_or(u32::MAX),
        ..LayoutData::default()
    };
    for seg in segments {
        let first = out.blocks.len() as u32;
        out.blocks.extend(seg.blocks.iter().map(|b| BlockView {
            addr: b.address,
            size_bytes: b.size,
            requested_bytes: b.requested_size,
            state: match b.state {
                BlockState::ActiveAllocated => block_state::ALLOCATED,
                BlockState::ActivePendingFree => block_state::PENDING_FREE,
                BlockState::Inactive => block_state::FREE,
            },
            alloc: NO_OP,
        }));
        out.segments.push(SegmentView {
            addr: seg.address,
            size_bytes: seg.total_size,
            stream: seg.stream,
            pool: seg.segment_pool_id,
            small: seg.segment_type == SegmentType::Small,
            expandable: seg.is_expandable,
            first,
            count: out.blocks.len() as u32 - first,
        });
    }
    out
}
