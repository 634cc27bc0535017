//! `build`: a recording → its replayable trace. Each device's events are replayed through
//! the PyTorch model on the recorded device ([`RecordedDevice`]: the recording's own
//! addresses and refusals), compared event by event with what PyTorch did
//! ([`crate::validate::Comparison`]), and what the snapshot leaves implicit is inferred in
//! the same pass ([`infer`]: private pools, `empty_cache()` points, pool releases and
//! CUDA-graph checkpoint restores). Where two pools explain a malloc equally the default is
//! taken; a later release that contradicts it revises it to a private pool in a new pass
//! from the start, kept only if it follows the recording further.
//!
//! Above the models (it runs the PyTorch model) and beside [`crate::validate`], whose
//! comparison and report it fills: so it is not in `trace/`, which sits below the models.

mod infer;
mod recorded;
mod slim;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use recorded::RecordedDevice;
use slim::MadeOps;

use crate::device::SimulatedDevice;
use crate::models::common::hasher::AddrMap;
use crate::models::pytorch::{PyTorchConfig, PyTorchModel};
use crate::models::{Allocator, ConfigError, ModelEvent, PoolId};
use crate::replay::{ReplayOptions, ReplayResult, Shadow};
use crate::snapshot::{Action, RawEvent, RawSnapshot};
use crate::trace::{
    DeviceTrace, Inference, Op, OpKind, PoolTable, SnapshotInfo, SnapshotRead, StartSegment, Trace,
    TraceError,
};
use crate::validate::{
    Comparison, DeviceReport, Validation, compared, end_state_difference, peak_reserved_recorded,
};

/// A pool choice revisited: the malloc group ending at the event this is keyed by used a
/// private pool, not the default pool it was first given. Both explain the group's own
/// events; the default pool leads to a release the recording contradicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Revision {
    /// The recorded event where the default-pool choice first left the recording.
    release_at: usize,
    /// The segment the default pool would have released there, out of the recorded order.
    segment_addr: u64,
}

/// A segment created by a malloc group, and whether a private pool was left untried
/// because the default pool, tried first, already explained the group.
#[derive(Debug, Clone, Copy)]
struct Creation {
    group_end: usize,
    segment_addr: u64,
    default_over_private: bool,
}

struct Annotator<'a, 's> {
    snap: &'a RawSnapshot,
    device: u32,
    events: &'a [RawEvent],
    capacity: Option<u64>,
    model: PyTorchModel,
    synth: SimulatedDevice,
    /// The ops made, slim until the build is done where [`OpsMemory::Slim`].
    ops: MadeOps,
    /// The private pools the ops name.
    pools: PoolTable,
    inferred: Vec<Inference>,
    /// Op of each live block and of each pending free, by address (looked up only).
    live: AddrMap,
    pending: AddrMap,
    scope: BTreeMap<u64, PoolId>,
    renames: BTreeMap<PoolId, PoolId>,
    next_provisional: u64,
    cmp: Comparison,
    peak_sim: u64,
    /// Every segment created so far, in event order (see [`Self::revision`]).
    creations: Vec<Creation>,
    /// The pool choices revisited in this pass, by the index of the group's last event.
    revised: BTreeMap<usize, Revision>,
    /// The ops of the blocks alive at the start (the first ops).
    initial_ops: usize,
    /// Where the ops go as they are made, in pieces ([`build_streaming`]; the first pass
    /// only), and how many went.
    sink: Option<&'s mut dyn FnMut(Streamed<'_>)>,
    sent: usize,
    /// The ops handed on in a piece, made whole.
    piece: Vec<Op>,
    /// The model's events of the group at hand: one vector for the pass, not one a group.
    out: Vec<ModelEvent>,
    /// The replay this pass is, while it is one ([`build_replaying`]; the first pass
    /// only).
    ride: Option<Shadow>,
}

/// What [`build_replaying`] needs to keep the replay its first pass is: the device that
/// replay runs on, as a replay of the built trace would start it (following the
/// recording's segment events, its start state not yet preloaded), those segment events
/// ([`segment_events`] of the device's entries, which the trace keeps: not read again),
/// its options, and its model's configuration (the pass is that replay only where it is
/// the build's).
#[derive(Debug, Clone)]
pub struct PassReplay {
    pub device: SimulatedDevice,
    pub segment_events: Vec<RawEvent>,
    pub opts: ReplayOptions,
    pub cfg: PyTorchConfig,
}

/// The device [`build_streaming`] streams, and where to.
pub type StreamTo<'s> = (u32, &'s mut dyn FnMut(Streamed<'_>));

/// The ops a streamed build hands on in one piece (or more, the pass's last).
const STREAM_PIECE: usize = 1 << 16;

/// What [`build_streaming`] hands on while it builds the device it streams: the start
/// state first, then the ops in order, in pieces, as its first pass makes them, each
/// with the private pools named so far (the ops' [`crate::trace::PoolIx`]es index them).
#[derive(Debug, Clone, Copy)]
pub enum Streamed<'s> {
    Start(&'s [StartSegment]),
    Ops(&'s [Op], &'s [PoolId]),
}

impl Annotator<'_, '_> {
    fn err(&self, i: usize, m: String) -> TraceError {
        TraceError {
            device: self.device,
            event_index: i,
            message: m,
        }
    }

    fn op(&mut self, i: usize, kind: OpKind, recorded_addr: u64) -> u32 {
        let e = &self.events[i];
        let op = Op {
            kind,
            event_index: i as u32,
            recorded_addr,
            stack: e.stack,
            time_us: e.time_us,
        };
        self.ops.push(op, self.events);
        if self.sink.is_some() && self.ops.len() - self.sent >= STREAM_PIECE {
            self.flush();
        }
        (self.ops.len() - 1) as u32
    }

    /// Hands the ops not yet handed on to the sink, if any.
    fn flush(&mut self) {
        if let Some(sink) = self.sink.as_mut() {
            let ops = self.ops.since(self.sent, self.events, &mut self.piece);
            sink(Streamed::Ops(ops, self.pools.ids()));
            self.sent = self.ops.len();
        }
    }

    /// The ride's next op begins ([`Annotator::ride`]), an alloc or not: before the model
    /// takes it.
    fn ride_begin(&mut self, is_alloc: bool) {
        if let Some(r) = self.ride.as_mut() {
            r.begin(is_alloc, &self.model);
        }
    }

    /// The ride's op is done, the model having served `served` (an alloc) and emitted
    /// `self.out`. Its segment calls are made on the ride's device, which must answer
    /// them as the recorded device did; one it would answer otherwise (another address,
    /// a refusal, a call the ride does not follow) ends the ride.
    fn ride_end(&mut self, served: Option<u64>) {
        let Some(r) = self.ride.as_mut() else {
            return;
        };
        if made_alike(r.device_mut(), &self.out) {
            r.end(served, &self.out, &self.model);
        } else {
            self.ride = None;
        }
    }

    /// The pass makes an op a replay would make otherwise, or takes one another way than
    /// a replay steps it (an inferred `empty_cache()`, a pool release or rename, a
    /// checkpoint restore, an OOM or a release inside a malloc): it is not the replay.
    fn ride_off(&mut self) {
        self.ride = None;
    }

    fn note_peak(&mut self) {
        self.peak_sim = self.peak_sim.max(self.model.reserved_bytes());
    }

    /// The events of `from..to` the recorded device hands out (segment events and OOMs).
    fn segment_group(&self, from: usize, to: usize) -> Vec<RawEvent> {
        self.events[from..to]
            .iter()
            .filter(|e| compared(e.action) && e.action != Action::Alloc)
            .copied()
            .collect()
    }

    fn run(&mut self) -> Result<(), TraceError> {
        let n = self.events.len();
        let mut i = 0;
        while i < n {
            let e = self.events[i];
            match e.action {
                Action::Alloc
                | Action::Oom
                | Action::SegmentAlloc
                | Action::SegmentMap
                | Action::SegmentFree
                | Action::SegmentUnmap => {
                    let mut j = i;
                    while j < n
                        && matches!(
                            self.events[j].action,
                            Action::SegmentAlloc
                                | Action::SegmentMap
                                | Action::SegmentFree
                                | Action::SegmentUnmap
                        )
                    {
                        j += 1;
                    }
                    if j == i
                        && let Some((end, pool, stream)) = self.restore_run(i)
                    {
                        self.restore_segment(i, end, pool, stream);
                        i = end;
                    } else if j < n && matches!(self.events[j].action, Action::Alloc | Action::Oom)
                    {
                        self.malloc_group(i, j);
                        i = j + 1;
                    } else {
                        if let Some(k) = (i..j).find(|&k| {
                            matches!(
                                self.events[k].action,
                                Action::SegmentAlloc | Action::SegmentMap
                            )
                        }) {
                            return Err(self.err(
                                k,
                                format!("{} outside any malloc", self.events[k].action.as_str()),
                            ));
                        }
                        self.empty_cache_group(i, j);
                        i = j;
                    }
                }
                Action::FreeRequested => {
                    let deferred = !self
                        .events
                        .get(i + 1)
                        .is_some_and(|x| x.action == Action::FreeCompleted && x.addr == e.addr);
                    let Some(alloc) = self.live.remove(&e.addr) else {
                        return Err(self.err(i, format!("free of address {:#x}, which holds no live allocation (unknown address or double free)", e.addr)));
                    };
                    self.ride_begin(false);
                    self.op(i, OpKind::Free { alloc, deferred }, e.addr);
                    if deferred {
                        self.pending.insert(e.addr, alloc);
                    }
                    self.out.clear();
                    let mut dev = RecordedDevice::new(&[], false, &self.synth);
                    if let Err(m) = self.model.free(&mut dev, e.addr, deferred, &mut self.out) {
                        self.cmp.diverge_input(i, &e, &m.to_string());
                    }
                    self.keep_synth(dev.into_synth());
                    self.ride_end(None);
                    i += if deferred { 1 } else { 2 };
                }
                Action::FreeCompleted => {
                    let Some(alloc) = self.pending.remove(&e.addr) else {
                        return Err(self.err(
                            i,
                            format!("free_completed at {:#x} without a pending free", e.addr),
                        ));
                    };
                    self.ride_begin(false);
                    self.op(i, OpKind::CompleteFree { alloc }, e.addr);
                    self.out.clear();
                    let mut dev = RecordedDevice::new(&[], false, &self.synth);
                    if let Err(m) = self.model.complete_free(&mut dev, e.addr, &mut self.out) {
                        self.cmp.diverge_input(i, &e, &m.to_string());
                    }
                    self.keep_synth(dev.into_synth());
                    self.ride_end(None);
                    i += 1;
                }
                Action::Snapshot | Action::Other => i += 1,
            }
        }
        Ok(())
    }

    /// The pool choice the first divergence contradicts, if any. The model released a
    /// segment where the recording released another; that segment was created by a malloc
    /// group given the default pool while a private pool, left untried, explained the group
    /// as well. Had the segment been the default pool's, `release_cached_blocks` (which
    /// frees the default pools' whole cached segments before any private pool's, and never
    /// those of a private pool still in use) would have freed it there: so it is the
    /// private pool's. The caller checks the revision by running the pass again with it.
    fn revision(&self) -> Option<(usize, Revision)> {
        let d = self.cmp.divergence.as_ref()?;
        let sim = d.simulated?;
        if sim.action != Action::SegmentFree.as_str() {
            return None;
        }
        let c = self
            .creations
            .iter()
            .rev()
            .find(|c| c.group_end < d.event_index && c.segment_addr == sim.addr)?;
        (c.default_over_private && !self.revised.contains_key(&c.group_end)).then_some((
            c.group_end,
            Revision {
                release_at: d.event_index,
                segment_addr: sim.addr,
            },
        ))
    }

    /// Whether this pass follows the recording further than `other` (no divergence at all
    /// counts as furthest).
    fn diverges_later_than(&self, other: &Annotator<'_, '_>) -> bool {
        self.cmp.diverges_at() > other.cmp.diverges_at()
    }
}

/// Whether `device` answers the segment calls behind the model's `events` as the recorded
/// device did (the `cudaMalloc` of each `segment_alloc` at its address), making them on
/// it; a call it does not follow (maps and unmaps, an OOM) answers no.
fn made_alike(device: &mut SimulatedDevice, events: &[ModelEvent]) -> bool {
    use crate::device::Device as _;
    events.iter().all(|e| match e.action {
        Action::SegmentAlloc => device.malloc(e.size, e.stream) == Ok(e.addr),
        Action::SegmentFree => {
            device.free(e.addr, e.size);
            true
        }
        Action::Alloc | Action::FreeRequested | Action::FreeCompleted => true,
        _ => false,
    })
}

/// One pass of the annotation over device `device`'s events from the rebuilt start state,
/// with the pool choices of `revised`.
#[allow(clippy::too_many_arguments)]
fn pass<'a, 's>(
    snap: &'a RawSnapshot,
    device: u32,
    events: &'a [RawEvent],
    cfg: &PyTorchConfig,
    capacity: Option<u64>,
    start: &[StartSegment],
    entries: usize,
    memory: OpsMemory,
    revised: BTreeMap<usize, Revision>,
    sink: Option<&'s mut dyn FnMut(Streamed<'_>)>,
    ride: Option<PassReplay>,
) -> Result<Annotator<'a, 's>, TraceError> {
    let mut model = PyTorchModel::new(cfg.clone(), capacity);
    model.load_start(start);
    // The replay of this pass starts as a replay of the built trace would: its model
    // loaded with the start state (this one), the start's segments preloaded on its
    // device, the first ops those of the blocks alive at the start.
    let ride = ride.filter(|r| r.cfg == *cfg).map(|mut r| {
        if !start.is_empty() {
            r.device.preload(start.iter().map(|s| s.size_bytes).sum());
            r.opts.preloaded = true;
        }
        let blocks = start.iter().map(|s| s.blocks.len()).sum();
        Shadow::new(
            &model,
            r.device,
            capacity,
            r.opts,
            blocks,
            ops_room(start, entries),
        )
    });
    let mut a = Annotator {
        snap,
        device,
        events,
        capacity,
        model,
        synth: SimulatedDevice::new(cfg.device_total_bytes, capacity),
        ops: MadeOps::with_capacity(memory == OpsMemory::Slim, ops_room(start, entries)),
        pools: PoolTable::default(),
        inferred: Vec::new(),
        live: AddrMap::default(),
        pending: AddrMap::default(),
        scope: BTreeMap::new(),
        renames: BTreeMap::new(),
        next_provisional: 1,
        cmp: Comparison::new(device),
        peak_sim: start.iter().map(|s| s.size_bytes).sum(),
        creations: Vec::new(),
        revised,
        initial_ops: 0,
        sent: 0,
        sink,
        piece: Vec::new(),
        out: Vec::new(),
        ride,
    };
    // Blocks alive at the start become the first ops, so every model can replay them.
    for s in start {
        for b in &s.blocks {
            let block = Op {
                kind: OpKind::Alloc {
                    size_bytes: b.requested_bytes,
                    stream: s.stream,
                    pool: a.pools.intern(s.pool),
                    recorded_oom: false,
                    restored: false,
                },
                event_index: u32::MAX,
                recorded_addr: b.addr,
                stack: crate::snapshot::StackId::EMPTY,
                time_us: 0,
            };
            a.ride_begin(true);
            a.ops.push(block, events);
            a.ride_end(Some(b.addr));
            let op = (a.ops.len() - 1) as u32;
            if b.pending {
                a.pending.insert(b.addr, op);
            } else {
                a.live.insert(b.addr, op);
            }
            a.initial_ops += 1;
        }
    }
    if !start.is_empty() {
        a.inferred.push(Inference {
            event_index: 0,
            kind: "start_state",
            detail: format!(
                "the trace does not start empty: {} segments and {} live blocks rebuilt from the end state",
                start.len(),
                a.initial_ops
            ),
        });
    }
    a.run()?;
    a.flush();
    Ok(a)
}

/// About how many ops `events` make, so their vector is allocated once rather than grown by
/// doubling (up to twice the memory, while the decoded snapshot is still held): an op per
/// block alive at the start, per malloc (an `alloc` or `oom` entry), per `free_requested`,
/// and per `free_completed` not right after its `free_requested`; plus room for the
/// inferred `empty_cache()` points and pool releases (a vector that outgrows it still grows).
#[must_use]
pub fn expected_ops(events: &[RawEvent], start: &[StartSegment]) -> usize {
    ops_room(start, entries_making_ops(events))
}

/// [`expected_ops`] of the entries' count ([`entries_making_ops`]) and the start state.
fn ops_room(start: &[StartSegment], entries: usize) -> usize {
    let n = start.iter().map(|s| s.blocks.len()).sum::<usize>() + entries;
    n + n / 256 + 64
}

/// How many of `events` make an op ([`expected_ops`]).
fn entries_making_ops(events: &[RawEvent]) -> usize {
    let mut n = 0;
    for (k, e) in events.iter().enumerate() {
        n += usize::from(match e.action {
            Action::Alloc | Action::Oom | Action::FreeRequested => true,
            Action::FreeCompleted => !k.checked_sub(1).is_some_and(|p| {
                events[p].action == Action::FreeRequested && events[p].addr == e.addr
            }),
            _ => false,
        });
    }
    n
}

/// Replays device `device` of a snapshot through the PyTorch model on the recorded device:
/// builds the replayable requests and the validation report.
pub fn annotate(
    snap: &RawSnapshot,
    device: u32,
    cfg: &PyTorchConfig,
    capacity: Option<u64>,
) -> Result<(DeviceTrace, DeviceReport), TraceError> {
    let events = snap
        .device_traces
        .get(device as usize)
        .map_or(&[][..], Vec::as_slice);
    annotate_streaming(snap, device, cfg, capacity, OpsMemory::HERE, None, None)
        .map(|(t, r, _, _)| (t.copied(events), r))
}

/// A device's trace once its passes are done, its ops as the build keeps them
/// ([`OpsMemory`]): made whole from the entries they came from ([`Pending::copied`]), or
/// with the entries handed over ([`Pending::written_over`]: slim ops are written over
/// them, their memory becomes the ops').
#[derive(Debug)]
struct Pending {
    /// The trace, its `ops` empty and its capacity's evidence not yet read.
    trace: DeviceTrace,
    ops: MadeOps,
    bounds: Option<crate::capacity::EventBounds>,
}

impl Pending {
    /// The trace, its ops copied out of `events` (the device's entries).
    fn copied(self, events: &[RawEvent]) -> DeviceTrace {
        self.made(|ops| ops.copied(events))
    }

    /// The trace, `events` (the device's entries) given up: slim ops are written over
    /// them.
    fn written_over(self, events: Vec<RawEvent>) -> DeviceTrace {
        self.made(|ops| ops.written_over(events))
    }

    fn made(self, whole: impl FnOnce(MadeOps) -> Vec<Op>) -> DeviceTrace {
        let Pending {
            mut trace,
            ops,
            bounds,
        } = self;
        if let Some(b) = bounds {
            trace.capacity = b.finish(&ops.empty_cache_at());
        }
        trace.ops = whole(ops);
        trace
    }
}

/// [`annotate`], handing the start state and the first pass's ops to `sink` as they are
/// made; the flag says whether they are the trace's ops (no later pass was kept and no
/// pool was renamed). With `ride`, the replay the first pass is, where it is the replay
/// of the built trace ([`build_replaying`]).
fn annotate_streaming(
    snap: &RawSnapshot,
    device: u32,
    cfg: &PyTorchConfig,
    capacity: Option<u64>,
    memory: OpsMemory,
    mut sink: Option<&mut dyn FnMut(Streamed<'_>)>,
    mut ride: Option<PassReplay>,
) -> Result<(Pending, DeviceReport, bool, Option<ReplayResult>), TraceError> {
    // Those the replay's device was made from, if any: read once.
    let made = ride.as_mut().map(|r| std::mem::take(&mut r.segment_events));
    let events = snap
        .device_traces
        .get(device as usize)
        .map_or(&[][..], Vec::as_slice);
    // The ops' room is counted beside the start state's rebuilding (natively).
    let (start, entries) = beside(
        || crate::start::rebuild_start(snap, device, &PyTorchModel::new(cfg.clone(), capacity)),
        || entries_making_ops(events),
    );
    let start = start?;
    if let Some(sink) = sink.as_mut() {
        sink(Streamed::Start(&start));
    }
    let start_reserved: u64 = start.iter().map(|s| s.size_bytes).sum();
    // What the trace keeps of the recording's own segment events is read beside the first
    // pass (natively: another pass over every entry, off the way to the trace).
    let recorded = snap.device_traces.get(device as usize).is_some();
    let (first, (peak_rec, kept_segment_events, bounds)) = beside(
        || {
            pass(
                snap,
                device,
                events,
                cfg,
                capacity,
                &start,
                entries,
                memory,
                BTreeMap::new(),
                sink,
                ride,
            )
        },
        || {
            (
                peak_reserved_recorded(events, start_reserved),
                made.unwrap_or_else(|| segment_events(events)),
                recorded.then(|| crate::capacity::read_events(events, start_reserved, cfg)),
            )
        },
    );
    let mut a = first?;
    // The first pass's replay, kept where that pass is the trace's and followed the
    // recording throughout (the ops a replay steps are then the ones it took).
    let exact_pass = a.cmp.divergence.is_none() && a.cmp.matched == a.cmp.compared;
    let mut replayed = a
        .ride
        .take()
        .filter(|_| exact_pass)
        .map(|r| r.finish(&a.model));
    let mut first_kept = true;
    // Revisit a pool choice the recording contradicts later, by a pass from the start with
    // the other choice, kept only where it follows the recording further. Each revision is
    // a different malloc group and moves the first divergence later, so this ends; an
    // exact trace takes one pass.
    while let Some((group_end, revision)) = a.revision() {
        let mut revised = a.revised.clone();
        revised.insert(group_end, revision);
        match pass(
            snap, device, events, cfg, capacity, &start, entries, memory, revised, None, None,
        ) {
            Ok(b) if b.diverges_later_than(&a) => {
                a = b;
                first_kept = false;
                replayed = None;
            }
            _ => break,
        }
    }
    let initial = a.initial_ops;
    let end_diff = end_state_difference(snap, device, &a.model, &a.renames);
    // Rename provisional pools that were identified later.
    let renames = a.renames.clone();
    let resolve = |p: PoolId| {
        let mut p = p;
        while let Some(&q) = renames.get(&p) {
            p = q;
        }
        p
    };
    // The ops name each pool once (two provisional names may resolve to one pool).
    let mut pools = PoolTable::default();
    // `PoolIx(k + 1)` of the pass is `new_ix[k]` of the trace.
    let new_ix: Vec<_> = a
        .pools
        .ids()
        .iter()
        .map(|&p| pools.intern(resolve(p)))
        .collect();
    // Nothing renamed and every pool keeps its index: the ops stay as they are (a walk
    // over every op otherwise).
    let renumbered = !renames.is_empty()
        || new_ix
            .iter()
            .enumerate()
            .any(|(k, ix)| ix.0 as usize != k + 1);
    if renumbered {
        a.ops.rename_pools(&new_ix, resolve);
    }
    let report = a.cmp.report(
        end_diff,
        peak_rec,
        a.peak_sim,
        a.inferred.clone(),
        start.is_empty(),
    );
    // Their room was estimated (`expected_ops`): only what they use is kept.
    a.ops.shrink_to_fit();
    let streamed_exact = first_kept && renames.is_empty();
    let replayed = replayed.filter(|_| streamed_exact);
    let trace = DeviceTrace {
        device,
        ops: Vec::new(),
        pools: pools.into_ids(),
        start,
        inferred: a.inferred,
        events: events.len(),
        initial_ops: initial,
        segment_events: kept_segment_events,
        capacity: crate::capacity::CapacityEvidence::default(),
    };
    let pending = Pending {
        trace,
        ops: a.ops,
        bounds,
    };
    Ok((pending, report, streamed_exact, replayed))
}

/// `a` and `b`: natively `b` on a thread of its own beside `a` (on the calling thread),
/// in the browser (one thread) one after the other. The build's passes that need no
/// model run so beside the ones that do; front ends use it for independent work whose
/// answers are waited for together.
pub fn beside<A, B: Send>(a: impl FnOnce() -> A, b: impl FnOnce() -> B + Send) -> (A, B) {
    if cfg!(target_arch = "wasm32") {
        let a = a();
        (a, b())
    } else {
        std::thread::scope(|s| {
            let other = s.spawn(b);
            let a = a();
            let b = other
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (a, b)
        })
    }
}

/// The recorded segment events a device's trace keeps ([`DeviceTrace::segment_events`]).
#[must_use]
pub fn segment_events(events: &[RawEvent]) -> Vec<RawEvent> {
    events
        .iter()
        .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
        .copied()
        .collect()
}

/// The largest device index PyTorch can record (`c10::DeviceIndex` is an `int8_t`).
pub const MAX_DEVICE: u32 = 127;

/// Builds the replayable trace of every device, validating each on the way.
pub fn build(snap: RawSnapshot, capacity: Option<u64>) -> Result<Validation, crate::Error> {
    build_streaming(snap, capacity, None).map(|(v, _)| v)
}

/// [`build`], handing device `stream.0`'s start state and ops to `stream.1` as they are
/// made ([`Streamed`]), so that a front end may replay them on another thread while the
/// trace is built. The flag says whether what was handed on is that device's start
/// state and ops in the trace (else a replay of them is to be done again on the trace:
/// a later pass revised a pool choice, or a pool was renamed).
pub fn build_streaming(
    snap: RawSnapshot,
    capacity: Option<u64>,
    stream: Option<StreamTo<'_>>,
) -> Result<(Validation, bool), crate::Error> {
    let built = build_devices(&snap, capacity, stream)?;
    let read = SnapshotInfo::read(&snap);
    Ok(built.validation(snap, read))
}

/// Every device's trace and report, built from a snapshot the caller still holds
/// ([`build_devices`]), so that other work may read the snapshot on other threads while
/// it is built, and what the trace keeps of it be taken beside work on the devices'
/// traces ([`Built::validation`]).
#[derive(Debug)]
pub struct Built {
    /// Each device's trace, by index (a device without entries or segments too), its ops
    /// as the build keeps them.
    devices: Vec<Pending>,
    reports: Vec<DeviceReport>,
    /// Whether what was streamed is the streamed device's start state and ops in the
    /// trace ([`build_streaming`]'s flag).
    pub exact: bool,
    /// The replay the first pass of the device asked for was ([`build_replaying`]),
    /// where it is the replay of the built trace.
    pub replayed: Option<ReplayResult>,
}

impl Built {
    /// The validation: the trace of these devices and what it keeps of the snapshot they
    /// were built from, `snap` (`read`: [`SnapshotInfo::read`] of it), and
    /// [`Built::exact`]. Each device's entries are taken from `snap`: where the ops were
    /// kept slim ([`OpsMemory::Slim`]) they are written over them, whose memory becomes
    /// the ops'; else the entries are dropped.
    #[must_use]
    pub fn validation(self, mut snap: RawSnapshot, read: SnapshotRead) -> (Validation, bool) {
        let devices = self
            .devices
            .into_iter()
            .enumerate()
            .map(|(d, pending)| {
                let events = snap
                    .device_traces
                    .get_mut(d)
                    .map(std::mem::take)
                    .unwrap_or_default();
                pending.written_over(events)
            })
            .collect();
        (
            Validation {
                trace: Trace {
                    snapshot: SnapshotInfo::with(snap, read),
                    devices,
                },
                devices: self.reports,
            },
            self.exact,
        )
    }
}

/// Where a build keeps the ops of a trace while it makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpsMemory {
    /// Whole, as they are made (48 bytes an op); the entries are dropped after the build.
    Whole,
    /// Slim while the trace is built (12 bytes an op, the rest read from its entry), then
    /// written over the entries they came from ([`Built::validation`]): the build's peak
    /// is the entries and the slim ops, not the entries and the ops (on the 1.12 GB
    /// snapshot 0.78 GB, not 1.1), for one more pass over the entries (0.3 s there on a
    /// 2-core VM).
    Slim,
}

impl OpsMemory {
    /// Slim in wasm, where the build is the browser engine worker's floor (its memory is
    /// never given back); whole natively, where the app's peak comes later (every
    /// configuration replayed and drawn) and the pass would lengthen the way to the first
    /// frame (by 0.2–0.3 s on the 16-core host).
    pub const HERE: OpsMemory = if cfg!(target_arch = "wasm32") {
        OpsMemory::Slim
    } else {
        OpsMemory::Whole
    };
}

/// [`build_streaming`]'s work on every device, the snapshot borrowed.
pub fn build_devices(
    snap: &RawSnapshot,
    capacity: Option<u64>,
    stream: Option<StreamTo<'_>>,
) -> Result<Built, crate::Error> {
    build_devices_in(snap, capacity, stream, OpsMemory::HERE)
}

/// [`build_devices`], the ops kept as `memory` says.
pub fn build_devices_in(
    snap: &RawSnapshot,
    capacity: Option<u64>,
    stream: Option<StreamTo<'_>>,
    memory: OpsMemory,
) -> Result<Built, crate::Error> {
    build_devices_with(snap, capacity, stream, None, memory)
}

/// [`build_devices`], keeping the replay of device `ride.0` that its first pass is
/// ([`Built::replayed`]), where that pass is the trace's and took every op as a replay of
/// the built trace through `ride.1`'s model on its device would have:
///
/// - the model's configuration is the build's (so is the capacity: `capacity`);
/// - the pass followed the recording at every event, and no later pass was kept;
/// - it made no op a replay takes another way (an inferred `empty_cache()`, a pool
///   release, a checkpoint restore), renamed no pool, and took no malloc that released
///   segments or ran out of memory;
/// - the replay's device answered each segment call of the model as the recorded device
///   did.
///
/// The replay is then the one [`crate::session::replay_device`] makes of the built trace
/// (its checkpoints spaced from the ops expected, as a replay beside the build's:
/// [`crate::replay::ReplayRun::expecting`]), without stepping the model a second time:
/// the browser's worker, on one thread, saves that replay.
pub fn build_replaying(
    snap: &RawSnapshot,
    capacity: Option<u64>,
    ride: (u32, PassReplay),
) -> Result<Built, crate::Error> {
    build_devices_with(snap, capacity, None, Some(ride), OpsMemory::HERE)
}

fn build_devices_with(
    snap: &RawSnapshot,
    capacity: Option<u64>,
    mut stream: Option<StreamTo<'_>>,
    mut ride: Option<(u32, PassReplay)>,
    memory: OpsMemory,
) -> Result<Built, crate::Error> {
    let cfg = PyTorchConfig::from_settings(&snap.settings).map_err(ConfigError::from)?;
    // PyTorch's device index is an `int8_t` (`c10::DeviceIndex`): no recording has a
    // device above 127, and one claiming it would make every device up to it a trace.
    if let Some(s) = snap.segments.iter().find(|s| s.device > MAX_DEVICE) {
        return Err(crate::Error::Impossible(format!(
            "segment at {:#x}: device {} is not a CUDA device index (PyTorch's are 0 to {MAX_DEVICE})",
            s.address, s.device
        )));
    }
    if snap.device_traces.len() > MAX_DEVICE as usize + 1 {
        return Err(crate::Error::Impossible(format!(
            "device_traces has {} devices; PyTorch's device indexes are 0 to {MAX_DEVICE}",
            snap.device_traces.len()
        )));
    }
    crate::impossible::check(snap)?;
    let mut devices = Vec::new();
    let mut reports = Vec::new();
    let n = snap.device_traces.len().max(
        snap.segments
            .iter()
            .map(|s| s.device as usize + 1)
            .max()
            .unwrap_or(0),
    );
    let mut exact = false;
    let mut replayed = None;
    for d in 0..n as u32 {
        let sink = match stream.as_mut() {
            Some((sd, sink)) if *sd == d => Some(&mut **sink as &mut dyn FnMut(Streamed<'_>)),
            _ => None,
        };
        let streamed = sink.is_some();
        let asked = match &ride {
            Some((rd, _)) if *rd == d => ride.take().map(|(_, r)| r),
            _ => None,
        };
        let (t, r, e, made) = annotate_streaming(snap, d, &cfg, capacity, memory, sink, asked)?;
        exact |= streamed && e;
        replayed = replayed.or(made);
        if t.trace.events > 0 || !t.trace.start.is_empty() {
            reports.push(r);
        }
        devices.push(t);
    }
    Ok(Built {
        devices,
        reports,
        exact,
        replayed,
    })
}
