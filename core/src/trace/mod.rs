//! The replayable trace: the requests of a recording (allocs, frees and their completion
//! points, streams, private-pool scopes, `empty_cache()` points) with what the snapshot
//! leaves implicit made explicit, plus the state at the start of a trace whose ring
//! buffer wrapped (pytorch-allocator.md §13).
//!
//! Built by [`crate::build`] (`build::annotate`), which replays the recording through the
//! PyTorch model on the recorded device to infer what the file does not say.

use crate::snapshot::{
    Action, FrameTable, OtherAction, RawEvent, RawSettings, RawSnapshot, SnapshotExtras, StackId,
    StrId,
};

pub mod binary;
pub mod evidence;

/// A private memory pool (`segment_pool_id`): CUDA-graph pools and `torch.cuda.MemPool`s.
/// `PoolId::DEFAULT` (0, 0) is the default pools.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct PoolId(pub u64, pub u64);

impl PoolId {
    /// The default pools.
    pub const DEFAULT: PoolId = PoolId(0, 0);

    /// Whether this is a private pool.
    #[must_use]
    pub fn is_private(self) -> bool {
        self != PoolId::DEFAULT
    }
}

/// The pool of an op as its trace names it: [`PoolIx::DEFAULT`] the default pools, `k > 0`
/// the trace's private pool `pools[k - 1]` ([`DeviceTrace::pools`]). Four bytes where a
/// [`PoolId`] takes sixteen, so that an [`Op`] is 48 bytes, not 64 (the gigabyte snapshot's
/// 9.67 M ops: 443 MiB, not 590, in the browser's engine while the trace is built).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PoolIx(pub u32);

impl PoolIx {
    /// The default pools.
    pub const DEFAULT: PoolIx = PoolIx(0);

    /// The pool this names among `pools` (a trace's [`DeviceTrace::pools`]).
    ///
    /// # Panics
    /// If `pools` does not hold it (an index not made by that trace's [`PoolTable`]).
    #[must_use]
    #[inline]
    pub fn id(self, pools: &[PoolId]) -> PoolId {
        match self.0.checked_sub(1) {
            None => PoolId::DEFAULT,
            Some(k) => pools[k as usize],
        }
    }
}

/// The private pools of a trace being made, each given its [`PoolIx`] once, in the order
/// first named ([`DeviceTrace::pools`]).
#[derive(Debug, Clone, Default)]
pub struct PoolTable {
    ids: Vec<PoolId>,
    index: std::collections::HashMap<PoolId, u32>,
}

impl PoolTable {
    /// The index naming `pool`, given it now if it has none.
    pub fn intern(&mut self, pool: PoolId) -> PoolIx {
        if !pool.is_private() {
            return PoolIx::DEFAULT;
        }
        let next = u32::try_from(self.ids.len() + 1).unwrap_or(u32::MAX);
        let ix = *self.index.entry(pool).or_insert(next);
        if ix == next {
            self.ids.push(pool);
        }
        PoolIx(ix)
    }

    /// The pools named so far, in index order (`PoolIx(k + 1)` is the `k`-th).
    #[must_use]
    pub fn ids(&self) -> &[PoolId] {
        &self.ids
    }

    /// [`PoolTable::ids`], the table dropped.
    #[must_use]
    pub fn into_ids(self) -> Vec<PoolId> {
        self.ids
    }
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Allocate `size_bytes` on `stream` in `pool` (of the trace's pools:
    /// [`DeviceTrace::pool`]). `recorded_oom`: the recording failed
    /// here and the program went on. `restored`: not a malloc but a block a CUDA-graph
    /// checkpoint restore (`setCheckpointPoolState`, inferred) re-created at the recorded
    /// address ([`crate::models::Allocator::alloc_at`]).
    Alloc {
        size_bytes: u64,
        stream: u64,
        pool: PoolIx,
        recorded_oom: bool,
        restored: bool,
    },
    /// Free the allocation made by op `alloc` (an index into [`DeviceTrace::ops`]);
    /// `deferred`: it waits for other streams (`record_stream`) until a `CompleteFree`.
    Free { alloc: u32, deferred: bool },
    /// A deferred free completes.
    CompleteFree { alloc: u32 },
    /// `torch.cuda.empty_cache()` (inferred).
    EmptyCache,
    /// A private pool was released (graph or `MemPool` deleted; inferred).
    ReleasePool { pool: PoolId },
}

/// One request, with where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub kind: OpKind,
    /// Index of the trace entry this op comes from in `device_traces[d]`.
    pub event_index: u32,
    /// Recorded address of an alloc (0 for other ops or a recorded OOM).
    pub recorded_addr: u64,
    pub stack: StackId,
    pub time_us: i64,
}

impl Op {
    /// Whether the op is an allocation request.
    #[must_use]
    pub fn is_alloc(&self) -> bool {
        matches!(self.kind, OpKind::Alloc { .. })
    }
}

/// Ops handed on in order as a trace's build makes them ([`crate::build::Streamed::Ops`],
/// owned), with the private pools named so far, which their [`PoolIx`]es index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpsPiece {
    pub ops: Vec<Op>,
    pub pools: Vec<PoolId>,
}

/// A block alive when the trace window opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartBlock {
    pub addr: u64,
    /// Rounded block size (with the slack reconstruction of §13.2 step 4).
    pub size_bytes: u64,
    pub requested_bytes: u64,
    /// Freed already, waiting for `record_stream` events.
    pub pending: bool,
}

/// A segment present when the trace window opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartSegment {
    pub addr: u64,
    pub size_bytes: u64,
    pub stream: u64,
    pub pool: PoolId,
    pub small: bool,
    pub expandable: bool,
    /// Live blocks, in address order; the gaps are free.
    pub blocks: Vec<StartBlock>,
}

/// Something the file did not say, and what allocsim concluded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Inference {
    pub event_index: u32,
    /// `private_pool`, `empty_cache`, `pool_released`, `checkpoint_restore`, `start_state`,
    /// `unknown`.
    pub kind: &'static str,
    pub detail: String,
}

/// The replayable requests of one device.
#[derive(Debug, Clone, Default)]
pub struct DeviceTrace {
    pub device: u32,
    pub ops: Vec<Op>,
    /// The private pools the ops' [`PoolIx`]es name (`PoolIx(k + 1)` is `pools[k]`).
    pub pools: Vec<PoolId>,
    /// Segments and live blocks before the first event (empty when the trace starts
    /// from an empty allocator).
    pub start: Vec<StartSegment>,
    pub inferred: Vec<Inference>,
    /// Number of recorded events.
    pub events: usize,
    /// The first `initial_ops` ops allocate the blocks alive at the start (in address
    /// order): a model that cannot load [`DeviceTrace::start`] replays them first.
    pub initial_ops: usize,
    /// The recording's `segment_alloc` and `segment_map` events, in order: what a
    /// simulated device follows (kept here so a replay need not scan every event).
    pub segment_events: Vec<RawEvent>,
    /// What the recording says about the memory capacity it ran under.
    pub capacity: evidence::CapacityEvidence,
}

impl DeviceTrace {
    /// Whether the trace starts from an empty allocator.
    #[must_use]
    pub fn starts_empty(&self) -> bool {
        self.start.is_empty()
    }

    /// The pool `ix` names.
    #[must_use]
    #[inline]
    pub fn pool(&self, ix: PoolIx) -> PoolId {
        ix.id(&self.pools)
    }

    /// Number of allocation requests.
    #[must_use]
    pub fn requests(&self) -> usize {
        self.ops.iter().filter(|o| o.is_alloc()).count()
    }
}

/// An entry a step may start at (`diff`'s `--align steps`): an `annotate` or
/// `user_defined` entry, or one carrying `user_metadata`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    /// Index of the entry in `device_traces[d]`.
    pub event_index: u64,
    /// Its `user_metadata` (the note of an `annotate` entry; "" when it has none).
    pub text: StrId,
}

/// What a trace keeps of its snapshot once built: the settings, the frame table (each
/// string, frame and stack interned once: `explain`'s sites, `diff`'s, the app's stacks),
/// the summary of what the file holds beyond the device state, and the step markers. Not
/// the entries themselves: the ops replace them (the gigabyte snapshot's 14.5 M entries
/// are 0.70 GB decoded), nor the end state's segments, which the build compared.
#[derive(Debug, Clone, Default)]
pub struct SnapshotInfo {
    pub settings: RawSettings,
    pub frames: FrameTable,
    /// How many device traces the file has (`len(device_traces)`).
    pub device_traces: usize,
    /// Per device trace, its [`Marker`]s in order.
    pub markers: Vec<Vec<Marker>>,
    extras: SnapshotExtras,
}

/// What a [`SnapshotInfo`] keeps that is read from the snapshot's entries: its step
/// markers and the summary of what the file holds beyond the device state.
#[derive(Debug, Clone, Default)]
pub struct SnapshotRead {
    markers: Vec<Vec<Marker>>,
    extras: SnapshotExtras,
}

impl SnapshotInfo {
    /// What a trace keeps of `snap` that is read from its entries ([`SnapshotRead`]):
    /// it may be read on another thread while the snapshot is built.
    #[must_use]
    pub fn read(snap: &RawSnapshot) -> SnapshotRead {
        let extras = snap.extras();
        let markers = snap
            .device_traces
            .iter()
            .map(|events| {
                let step = |e: &RawEvent| {
                    (e.action == Action::Other
                        && matches!(e.other, OtherAction::Annotate | OtherAction::UserDefined))
                        || !snap.frames.str(e.user_metadata).is_empty()
                };
                events
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| step(e))
                    .map(|(i, e)| Marker {
                        event_index: i as u64,
                        text: e.user_metadata,
                    })
                    .collect()
            })
            .collect();
        SnapshotRead { markers, extras }
    }

    /// What a trace keeps of `snap`, given what was [`SnapshotInfo::read`] of it; the rest
    /// (the entries among it) is dropped.
    #[must_use]
    pub fn with(snap: RawSnapshot, read: SnapshotRead) -> SnapshotInfo {
        SnapshotInfo {
            device_traces: snap.device_traces.len(),
            markers: read.markers,
            extras: read.extras,
            settings: snap.settings,
            frames: snap.frames,
        }
    }

    /// What the file holds beyond the device state ([`RawSnapshot::extras`]).
    #[must_use]
    pub fn extras(&self) -> &SnapshotExtras {
        &self.extras
    }
}

/// A whole trace: what it keeps of the snapshot it came from and the replayable requests
/// of each device.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub snapshot: SnapshotInfo,
    pub devices: Vec<DeviceTrace>,
}

impl Trace {
    /// The device with the most events (the default `--trace-device`).
    #[must_use]
    pub fn busiest_device(&self) -> usize {
        self.devices
            .iter()
            .enumerate()
            .max_by_key(|(i, d)| (d.events, std::cmp::Reverse(*i)))
            .map_or(0, |(i, _)| i)
    }
}

/// A trace that cannot be replayed: the event index says where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device {device}, event {event_index}: {message}")]
pub struct TraceError {
    pub device: u32,
    pub event_index: usize,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_op_is_48_bytes() {
        // 9.67 M ops of the gigabyte snapshot: 443 MiB; at 64 bytes they were 590.
        assert_eq!(std::mem::size_of::<Op>(), 48);
    }

    #[test]
    fn a_pool_table_names_each_private_pool_once_in_first_use_order() {
        let mut t = PoolTable::default();
        assert_eq!(t.intern(PoolId::DEFAULT), PoolIx::DEFAULT);
        let a = t.intern(PoolId(1, 0));
        let b = t.intern(PoolId(0, 7));
        assert_eq!((a, b), (PoolIx(1), PoolIx(2)));
        assert_eq!(t.intern(PoolId(1, 0)), a);
        let ids = t.into_ids();
        assert_eq!(ids, vec![PoolId(1, 0), PoolId(0, 7)]);
        assert_eq!(
            [PoolIx::DEFAULT, a, b].map(|ix| ix.id(&ids)),
            [PoolId::DEFAULT, PoolId(1, 0), PoolId(0, 7)]
        );
    }
}
