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

use allocsim_core::metrics::Column;
use allocsim_core::snapshot::{Action, BlockState, RawEvent, RawSnapshot, SegmentType};

use super::wire::{BlockView, LayoutData, NO_OP, RecordedData, Response, SegmentView, block_state};

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

/// The [`Response::Recorded`] of `snap`: its own timeline and end state of its busiest
/// device, for the UI as soon as it is decoded. No progress message after it: in the
/// browser each answer wakes the page for a frame, which a software rasterizer pays for
/// with the CPU the validation needs; the recorded view says the trace is being built.
#[must_use]
pub fn response(job: u64, snap: &RawSnapshot, name: &str) -> Response {
    Response::Recorded {
        job,
        recorded: Box::new(recorded(snap, name, busiest_device(snap))),
    }
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
    let (reserved_bytes, requested_bytes) = timeline(events, (reserved, requested));
    RecordedData {
        name: name.to_string(),
        device,
        reserved_bytes,
        requested_bytes,
        end_state,
    }
}

/// The reserved and live requested bytes after each of `events`, `end` after the last, as
/// core's compact columns (exact; 4 to 5 bytes an entry where two `Vec<u64>` take 16: on the
/// 1.12 GB snapshot's 14.5 M entries no 221 MiB of plain vectors in the worker's memory,
/// which is never given back, nor in the message or the page's). Walked back from `end`
/// once without keeping anything, to the values after the first entry, then forward into
/// the columns; where the walk back clamps at 0 (a file whose entries say more was freed
/// than its end state holds) the forward walk could not retrace it, and the values are
/// walked back into plain vectors ([`walked_back`]) first.
fn timeline(events: &[RawEvent], end: (u64, u64)) -> (Column, Column) {
    let mut at = end;
    let mut retraceable = true;
    for e in events.iter().skip(1).rev() {
        let (before, exact) = undo(e, at);
        retraceable &= exact;
        at = before;
    }
    let (mut reserved, mut requested) = (Column::default(), Column::default());
    if retraceable {
        for (i, e) in events.iter().enumerate() {
            if i > 0 {
                at = redo(e, at);
            }
            reserved.push(at.0);
            requested.push(at.1);
        }
    } else {
        let (r, q) = walked_back(events, end);
        for (r, q) in r.into_iter().zip(q) {
            reserved.push(r);
            requested.push(q);
        }
    }
    reserved.shrink_to_fit();
    requested.shrink_to_fit();
    (reserved, requested)
}

/// The (reserved, requested) bytes after each of `events`, `end` after the last, walked back
/// from it: the value after entry `i` is the value after entry `i + 1` less what entry
/// `i + 1` changed (clamped at 0 and at `u64::MAX`).
fn walked_back(events: &[RawEvent], end: (u64, u64)) -> (Vec<u64>, Vec<u64>) {
    let n = events.len();
    let (mut reserved, mut requested) = (vec![0u64; n], vec![0u64; n]);
    let mut at = end;
    for (i, e) in events.iter().enumerate().rev() {
        (reserved[i], requested[i]) = at;
        at = undo(e, at).0;
    }
    (reserved, requested)
}

/// The (reserved, requested) bytes before entry `e` from those after it, and whether that
/// was exact (nothing clamped).
fn undo(e: &RawEvent, (r, q): (u64, u64)) -> ((u64, u64), bool) {
    let clamped = |x: Option<u64>, or: u64| x.map_or((or, false), |v| (v, true));
    match e.action {
        Action::Alloc => {
            let (q, ok) = clamped(q.checked_sub(e.size), 0);
            ((r, q), ok)
        }
        Action::FreeCompleted => {
            let (q, ok) = clamped(q.checked_add(e.size), u64::MAX);
            ((r, q), ok)
        }
        Action::SegmentAlloc | Action::SegmentMap => {
            let (r, ok) = clamped(r.checked_sub(e.size), 0);
            ((r, q), ok)
        }
        Action::SegmentFree | Action::SegmentUnmap => {
            let (r, ok) = clamped(r.checked_add(e.size), u64::MAX);
            ((r, q), ok)
        }
        Action::FreeRequested | Action::Oom | Action::Snapshot | Action::Other => ((r, q), true),
    }
}

/// The (reserved, requested) bytes after entry `e` from those before it: [`undo`]'s
/// inverse where it was exact.
fn redo(e: &RawEvent, (r, q): (u64, u64)) -> (u64, u64) {
    match e.action {
        Action::Alloc => (r, q + e.size),
        Action::FreeCompleted => (r, q - e.size),
        Action::SegmentAlloc | Action::SegmentMap => (r + e.size, q),
        Action::SegmentFree | Action::SegmentUnmap => (r - e.size, q),
        Action::FreeRequested | Action::Oom | Action::Snapshot | Action::Other => (r, q),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::examples::EXAMPLES;

    /// The columns hold exactly what the walk back from the end state gives, entry by
    /// entry: on every example (retraced forward), and with each one's end state taken as
    /// empty, where the walk back clamps at 0 and the columns are filled from it.
    #[test]
    fn the_columns_are_the_walk_back_from_the_end_state() {
        let (mut clamped, mut walked) = (0, 0);
        for ex in EXAMPLES {
            let snap = allocsim_core::snapshot::import::decode_snapshot(ex.bytes)
                .unwrap_or_else(|e| panic!("{}: {e}", ex.file));
            let device = busiest_device(&snap);
            let events = &snap.device_traces[device as usize];
            walked += events.len();
            let data = recorded(&snap, ex.file, device);
            let end = (
                data.reserved_bytes.iter().last().unwrap_or(0),
                data.requested_bytes.iter().last().unwrap_or(0),
            );
            for end in [end, (0, 0)] {
                let (r, q) = timeline(events, end);
                let (wr, wq) = walked_back(events, end);
                assert_eq!(r.to_vec(), wr, "{}: reserved bytes from {end:?}", ex.file);
                assert_eq!(q.to_vec(), wq, "{}: requested bytes from {end:?}", ex.file);
                if events.iter().skip(1).any(|e| !undo(e, (0, 0)).1) && end == (0, 0) {
                    clamped += 1;
                }
            }
        }
        assert!(walked > 1000, "{walked} entries walked");
        assert!(clamped > 0, "no example made the walk back clamp");
    }
}
