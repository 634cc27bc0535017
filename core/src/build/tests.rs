//! The inference of the trace builder on small recordings written for it.

use super::build;
use crate::models::PoolId;
use crate::snapshot::{Action, BlockState, RawEvent, RawSnapshot, SegmentType};
use crate::snapshot::{RawBlock, RawSegment, StackId};
use crate::trace::OpKind;

const SIDE: u64 = 0x4e06_e340;
const BASE: u64 = 0x7f23_7620_0000;
const TWO_MIB: u64 = 2 << 20;

fn ev(action: Action, addr: u64, size: u64) -> RawEvent {
    RawEvent::new(action, addr, size, SIDE)
}

/// A snapshot of `events` on stream `SIDE` whose end state is one 2 MiB small segment of
/// `pool` at `BASE`: 512 bytes live at its base, the rest free.
fn ends_with_one_small_segment(pool: (u64, u64), events: Vec<RawEvent>) -> RawSnapshot {
    let block = |address, size, state| RawBlock {
        address,
        size,
        requested_size: size,
        state,
        stack: StackId::EMPTY,
    };
    RawSnapshot {
        segments: vec![RawSegment {
            device: 0,
            address: BASE,
            total_size: TWO_MIB,
            allocated_size: 512,
            active_size: 512,
            requested_size: 512,
            stream: SIDE,
            segment_type: SegmentType::Small,
            segment_pool_id: pool,
            is_expandable: false,
            stack: StackId::EMPTY,
            blocks: vec![
                block(BASE, 512, BlockState::ActiveAllocated),
                block(BASE + 512, TWO_MIB - 512, BlockState::Inactive),
            ],
        }],
        device_traces: vec![events],
        ..RawSnapshot::default()
    }
}

/// `graph_freed_empty_cache` in small: a graph capture's first request takes a new
/// segment, which the default pool (tried first) explains as well as a private one; only
/// the `empty_cache()` after the graph is freed, releasing the private pool's small
/// segment before that large one, shows it was the graph's.
#[test]
fn a_release_order_only_a_private_pool_gives_revisits_the_pool_choice() {
    let small = BASE;
    let large = BASE + 0x1000_0000;
    let graph_small = BASE + 0x2000_0000;
    let large_bytes = 20 << 20;
    let events = vec![
        // Before the capture: a default small segment on the side stream, kept busy.
        ev(Action::SegmentAlloc, small, TWO_MIB),
        ev(Action::Alloc, small, 512),
        // The capture: a new large segment (either pool), then a small request that the
        // default small segment would have served, so a private pool's.
        ev(Action::SegmentAlloc, large, large_bytes),
        ev(Action::Alloc, large, large_bytes),
        ev(Action::SegmentAlloc, graph_small, TWO_MIB),
        ev(Action::Alloc, graph_small, 512),
        // Graph and outputs deleted, then empty_cache(): the private pool's small
        // segment first, then its large one.
        ev(Action::FreeRequested, large, large_bytes),
        ev(Action::FreeCompleted, large, large_bytes),
        ev(Action::FreeRequested, graph_small, 512),
        ev(Action::FreeCompleted, graph_small, 512),
        ev(Action::SegmentFree, graph_small, TWO_MIB),
        ev(Action::SegmentFree, large, large_bytes),
    ];
    let v = build(ends_with_one_small_segment((0, 0), events), None).unwrap();
    let d = &v.devices[0];
    assert!(
        d.exact,
        "{:?} {:?}",
        d.first_divergence, d.end_state_difference
    );
    assert_eq!((d.events_compared, d.events_matched), (8, 8));
    let found: Vec<(u32, &str)> = d.inferred.iter().map(|x| (x.event_index, x.kind)).collect();
    assert_eq!(
        found,
        [
            (3, "private_pool"),
            (10, "pool_released"),
            (10, "empty_cache")
        ]
    );
    assert!(
        d.inferred[0].detail.contains("at event 10"),
        "{}",
        d.inferred[0].detail
    );
    // Both requests of the capture in one private pool; the one before it in the default.
    let pools: Vec<PoolId> = v.trace.devices[0]
        .ops
        .iter()
        .filter_map(|o| match o.kind {
            OpKind::Alloc { pool, .. } => Some(v.trace.devices[0].pool(pool)),
            _ => None,
        })
        .collect();
    assert_eq!(pools.len(), 3);
    assert_eq!(pools[0], PoolId::DEFAULT);
    assert!(pools[1].is_private());
    assert_eq!(pools[1], pools[2]);
}

/// `compile_reduce_overhead`'s first restore, by hand: a graph pool's small segment is
/// used and freed during a recording, then `setCheckpointPoolState` re-creates its two
/// checkpointed blocks (512 bytes, live, and the 2 MiB − 512 rest, freed again).
#[test]
fn a_checkpoint_restore_is_inferred_where_mallocs_cannot_explain_it() {
    let rest = TWO_MIB - 512;
    let events = vec![
        ev(Action::SegmentAlloc, BASE, TWO_MIB),
        ev(Action::Alloc, BASE, 100),
        ev(Action::FreeRequested, BASE, 100),
        ev(Action::FreeCompleted, BASE, 100),
        ev(Action::Alloc, BASE, 512),
        ev(Action::Alloc, BASE + 512, rest),
        ev(Action::FreeRequested, BASE + 512, rest),
        ev(Action::FreeCompleted, BASE + 512, rest),
    ];
    let v = build(ends_with_one_small_segment((0, 1), events), None).unwrap();
    let d = &v.devices[0];
    assert!(
        d.exact,
        "{:?} {:?}",
        d.first_divergence, d.end_state_difference
    );
    assert_eq!((d.events_compared, d.events_matched), (4, 4));
    let kinds: Vec<&str> = d.inferred.iter().map(|x| x.kind).collect();
    assert_eq!(kinds, ["checkpoint_restore"]);
    assert_eq!(d.inferred[0].event_index, 4);
    let restored: Vec<bool> = v.trace.devices[0]
        .ops
        .iter()
        .filter_map(|o| match o.kind {
            OpKind::Alloc { restored, .. } => Some(restored),
            _ => None,
        })
        .collect();
    assert_eq!(restored, [false, true, true]);
}

/// The trace keeps what is read after the build — the settings, the frames, the extras'
/// summary, the number of device traces and the entries a step may start at — and drops
/// the entries themselves.
#[test]
fn the_trace_keeps_of_the_snapshot_what_is_read_after_the_build() {
    use crate::snapshot::OtherAction;
    use crate::trace::Marker;
    let mut snap = ends_with_one_small_segment((0, 0), Vec::new());
    let step = snap.frames.intern_str("step");
    let note = snap.frames.intern_str("a note");
    let marked = |other, text| RawEvent {
        other,
        user_metadata: text,
        ..ev(Action::Other, BASE, 512)
    };
    snap.device_traces[0] = vec![
        ev(Action::SegmentAlloc, BASE, TWO_MIB),
        RawEvent {
            user_metadata: step,
            ..ev(Action::Alloc, BASE, 512)
        },
        marked(OtherAction::UserDefined, crate::snapshot::StrId::default()),
        marked(OtherAction::Annotate, note),
        marked(OtherAction::Plain, crate::snapshot::StrId::default()),
        marked(OtherAction::Unknown, step),
    ];
    snap.settings.conf = "expandable_segments:False".into();
    let extras = snap.extras();
    let v = build(snap, None).unwrap();
    assert!(v.devices[0].exact, "{:?}", v.devices[0].first_divergence);
    let kept = &v.trace.snapshot;
    assert_eq!(kept.extras(), &extras);
    assert_eq!(
        (extras.annotate_entries, extras.user_metadata_entries),
        (1, 3)
    );
    assert_eq!(kept.settings.conf, "expandable_segments:False");
    assert_eq!(kept.device_traces, 1);
    let at = |event_index, text| Marker { event_index, text };
    assert_eq!(
        kept.markers,
        [vec![
            at(1, step),
            at(2, crate::snapshot::StrId::default()),
            at(3, note),
            at(5, step)
        ]]
    );
    assert_eq!(kept.frames.str(kept.markers[0][2].text), "a note");
}
