//! The replay engine: drives a trace's requests through a model on a device, and keeps
//! the outcome of every request, the metrics timeline and checkpoints of the state every
//! K ops, so the layout at any op is rebuilt quickly (scrubbing in the app).

use std::fmt::Write as _;

use crate::cost::{self, DriverCost};
use crate::device::{Device, RecordedSegmentOp, SimulatedDevice};
use crate::metrics::{self, Timeline};
use crate::models::{
    AllocRequest, Allocator, AllocatorKind, Layout, ModelEvent, ModelStats, OomInfo, PoolId,
};
use crate::op_addrs::OpAddrs;
use crate::snapshot::{Action, RawEvent};
use crate::trace::{DeviceTrace, Op, OpKind};
use crate::units::format_size;

/// What happened to one op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An alloc served at this address.
    Served(u64),
    /// An alloc the model could not serve.
    Oom,
    /// Not an alloc, or not reached.
    None,
}

/// The outcome of every op of a replay, 8 bytes an op (an [`Outcome`] is 16): a served
/// address as itself, [`Outcome::None`] and [`Outcome::Oom`] as the two largest `u64`s,
/// which no address reaches (a recorded block ends below 2^56, `impossible.rs`, and the
/// simulated device's synthetic and virtual ranges lie below 2^48).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcomes(Vec<u64>);

impl Outcomes {
    const NONE: u64 = u64::MAX;
    const OOM: u64 = u64::MAX - 1;

    /// Room for `n` outcomes.
    #[must_use]
    pub fn with_capacity(n: usize) -> Outcomes {
        Outcomes(Vec::with_capacity(n))
    }

    /// Appends the outcome of the next op.
    pub fn push(&mut self, o: Outcome) {
        self.0.push(match o {
            Outcome::Served(a) => {
                assert!(
                    a < Self::OOM,
                    "served address {a:#x} out of any device's range"
                );
                a
            }
            Outcome::Oom => Self::OOM,
            Outcome::None => Self::NONE,
        });
    }

    /// The outcome of op `k` (None past the ops replayed).
    #[must_use]
    pub fn get(&self, k: usize) -> Option<Outcome> {
        self.0.get(k).map(|&v| match v {
            Self::NONE => Outcome::None,
            Self::OOM => Outcome::Oom,
            a => Outcome::Served(a),
        })
    }

    /// The outcomes in op order.
    pub fn iter(&self) -> impl Iterator<Item = Outcome> + '_ {
        (0..self.0.len()).filter_map(|k| self.get(k))
    }

    /// Number of ops with an outcome.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no op has an outcome.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The heap bytes held (the capacity).
    #[must_use]
    pub fn capacity_bytes(&self) -> usize {
        self.0.capacity() * std::mem::size_of::<u64>()
    }
}

/// Where and why the replay ran out of memory.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OomReport {
    /// Index of the trace entry in `device_traces[d]`.
    pub event_index: u64,
    /// Index of the op in the trace's request list.
    #[serde(skip)]
    pub op_index: usize,
    pub requested_bytes: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    pub largest_free_bytes: u64,
    pub free_holes: u64,
    /// The recording failed here too (and the program went on).
    pub recorded: bool,
    /// The program would have died here (the recording did not fail there too).
    pub fatal: bool,
    /// PyTorch's own OOM sentence, as far as the replay knows it (None for other models).
    pub pytorch_message: Option<String>,
    /// Our explanation: the holes, the largest, why no segment could be had.
    pub explanation: String,
    /// The model's own reason.
    #[serde(skip)]
    pub reason: String,
}

/// The most checkpoints a replay keeps by default ([`ReplayOptions::max_checkpoints`]).
/// On a trace of more than `MAX_CHECKPOINTS × checkpoint_every` ops they are spaced
/// further apart ([`checkpoint_interval`]), so a gigabyte trace (9.67 M ops: 2,361 model
/// copies at the default spacing) keeps a bounded number, and a layout steps at most
/// `ops / MAX_CHECKPOINTS` ops from its checkpoint.
pub const MAX_CHECKPOINTS: usize = 256;

/// The spacing of a replay's checkpoints over `ops` ops when one every `every` ops (0:
/// none) and at most `max` (0: no limit) are asked for: `every`, or wider where that
/// would make more than `max`.
#[must_use]
pub fn checkpoint_interval(ops: usize, every: usize, max: usize) -> usize {
    if every == 0 || max == 0 {
        every
    } else {
        every.max(ops.div_ceil(max))
    }
}

/// Options of a replay.
#[derive(Debug, Clone, Copy)]
pub struct ReplayOptions {
    /// Keep a copy of the model every this many ops (0: none); on a long trace every
    /// [`checkpoint_interval`] ops, so that at most `max_checkpoints` are kept.
    pub checkpoint_every: usize,
    /// The most checkpoints kept (0: no limit); [`MAX_CHECKPOINTS`] by default.
    pub max_checkpoints: usize,
    /// Check the model's invariants every this many ops (0: never).
    pub check_every: usize,
    /// Keep the per-op timeline and outcomes.
    pub keep_timeline: bool,
    /// The timeline keeps requested bytes and free holes too (false: only the columns a
    /// plot draws, `Timeline::push_drawn`; the app's replays, 5.5 bytes an op less).
    pub keep_requested: bool,
    /// The model was loaded with the trace's start state: the first `initial_ops` ops
    /// (the blocks alive at the start) are already in place and are not replayed.
    pub preloaded: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            checkpoint_every: 4096,
            max_checkpoints: MAX_CHECKPOINTS,
            check_every: 0,
            keep_timeline: true,
            keep_requested: true,
            preloaded: false,
        }
    }
}

/// A model and its device at one op, to replay forward from.
pub struct Checkpoint {
    /// The state after this many ops.
    pub ops_done: usize,
    pub model: Box<dyn Allocator>,
    pub device: SimulatedDevice,
}

impl Clone for Checkpoint {
    fn clone(&self) -> Checkpoint {
        Checkpoint {
            ops_done: self.ops_done,
            model: self.model.clone_box(),
            device: self.device.clone(),
        }
    }
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("ops_done", &self.ops_done)
            .finish_non_exhaustive()
    }
}

/// The result of a replay.
#[derive(Debug, Clone)]
pub struct ReplayResult {
    pub allocator: &'static str,
    pub config: String,
    pub capacity_bytes: Option<u64>,
    /// Ops replayed (all of them unless an OOM stopped the replay).
    pub ops_done: usize,
    pub requests: usize,
    pub outcomes: Outcomes,
    pub timeline: Timeline,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_requested_bytes: u64,
    pub final_reserved_bytes: u64,
    pub internal_waste_bytes_at_peak: u64,
    pub fragmentation_at_peak: f64,
    pub max_fragmentation: f64,
    pub segment_ops: u64,
    /// The segment operations' driver work and its predicted time ([`crate::cost`]).
    pub driver: DriverCost,
    /// The first request the model could not serve. The replay stops there unless the
    /// recording failed there too (the program caught the error and went on).
    pub oom: Option<OomReport>,
    /// Every request the model could not serve, in order (the recorded ones the replay
    /// went past, then the fatal one if any).
    pub ooms: Vec<OomReport>,
    /// OOMs the recording also had (the program went on).
    pub recorded_ooms_reproduced: usize,
    pub checkpoints: Vec<Checkpoint>,
    /// Invariant violation found by a check, with the op index.
    pub invariant_error: Option<(usize, String)>,
    /// The replay started from the trace's loaded start state.
    pub preloaded: bool,
}

/// The recording's segment requests, for a simulated device that follows them, from the
/// trace's recorded segment events ([`DeviceTrace::segment_events`]).
#[must_use]
pub fn recorded_segment_ops(
    events: &[RawEvent],
    reservation_bytes: impl Fn(u64) -> u64,
) -> Vec<RecordedSegmentOp> {
    let mut out = Vec::with_capacity(events.len());
    let mut reservations: Vec<(u64, u64)> = Vec::new();
    for e in events {
        match e.action {
            Action::SegmentAlloc => out.push(RecordedSegmentOp::Malloc {
                addr: e.addr,
                size: e.size,
            }),
            Action::SegmentMap => {
                let inside = reservations
                    .iter()
                    .any(|&(b, l)| e.addr >= b && e.addr < b + l);
                if !inside {
                    reservations.push((e.addr, reservation_bytes(e.size)));
                }
                out.push(RecordedSegmentOp::Map {
                    addr: e.addr,
                    size: e.size,
                    new_reservation: !inside,
                });
            }
            _ => {}
        }
    }
    out
}

/// Explains an OOM in PyTorch's own terms.
#[must_use]
pub fn explain_oom(who: &str, requested: u64, info: &OomInfo, capacity: Option<u64>) -> String {
    let free = info.reserved_bytes.saturating_sub(info.allocated_bytes);
    let mut s = format!(
        "Tried to allocate {}; {} reserved by {who}, {} of it free in {} holes, the largest {}",
        format_size(requested.max(info.rounded_bytes)),
        format_size(info.reserved_bytes),
        format_size(free),
        info.free_holes,
        format_size(info.largest_free_bytes)
    );
    if let Some(c) = capacity {
        let _ = write!(s, "; capacity {}", format_size(c));
    }
    let _ = write!(s, " ({})", info.reason);
    s
}

/// PyTorch's OOM sentence (`CUDACachingAllocator.cpp`, `malloc`) from what a replay knows:
/// the device size it tried to allocate, what PyTorch held, and the free bytes cached in
/// private pools (which PyTorch counts as allocated). The GPU's total capacity and the
/// memory outside PyTorch, which a snapshot does not record, are left out.
#[must_use]
pub fn pytorch_oom_message(
    alloc_bytes: u64,
    allocated_bytes: u64,
    reserved_bytes: u64,
    private_pool_free_bytes: u64,
) -> String {
    let in_private = if private_pool_free_bytes > 0 {
        format!(
            "with {} allocated in private pools (e.g., CUDA Graphs), ",
            format_size(private_pool_free_bytes)
        )
    } else {
        String::new()
    };
    format!(
        "CUDA out of memory. Tried to allocate {}. Of the allocated memory {} is allocated by PyTorch, {in_private}and {} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
        format_size(alloc_bytes),
        format_size(allocated_bytes + private_pool_free_bytes),
        format_size(
            reserved_bytes
                .saturating_sub(allocated_bytes)
                .saturating_sub(private_pool_free_bytes)
        ),
    )
}

/// What one op did, as [`OpStepper::step`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// An alloc served at this address (a recorded-OOM alloc is given back at once).
    Served(u64),
    /// An alloc the model could not serve. `fatal`: the program would have died here (the
    /// recording did not fail there too), so a replay stops.
    Oom { info: OomInfo, fatal: bool },
    /// Not an alloc.
    Done,
}

/// The op semantics of a replay, written once: the simulated replay here and the CUDA
/// replay of native-backend both step through it. It keeps which address each alloc got
/// and which allocs never reached the program (a failed or recorded-OOM alloc: its free
/// and free completion are skipped).
///
/// A stepper resumed inside a replay ([`OpStepper::resume`], for [`layout_at`]) keeps
/// those only for the ops it steps, its window; a free of an alloc before the window looks
/// the alloc up in the replay's outcomes (`'r`), so resuming costs the window, not the
/// ops before it.
/// What [`OpStepper`] keeps for an alloc whose memory the program never held (a failed or
/// recorded-OOM alloc): no served address is this (see [`Outcomes::push`]).
const DEAD: u64 = u64::MAX;

#[derive(Debug, Clone)]
pub struct OpStepper<'r> {
    /// The first op this stepper steps: `addrs` is indexed from it.
    base: usize,
    /// The replay's outcomes, read for the ops before `base` (none for a stepper at op 0).
    before: &'r Outcomes,
    /// Address served to alloc op `base + i` (0 for other ops), or [`DEAD`]: the program
    /// never held its memory. Shared with a fork's stepper up to the fork. Empty where
    /// `dead` is kept instead.
    addrs: OpAddrs,
    /// For a stepper that reads what it served from its replay's outcomes
    /// ([`OpStepper::reading_outcomes`]): the allocs served whose memory the program never
    /// held (a recorded OOM the model served), in order. A replay that keeps its outcomes
    /// (8 bytes an op) so does not keep the addresses too (77 MB more on the 1.12 GB
    /// snapshot's 9.67 M ops, in each replay the app shows).
    dead: Option<Vec<u32>>,
    /// The model was loaded with the start state (see [`ReplayOptions::preloaded`]).
    preloaded: bool,
}

/// Where a stepper reads back what it served an alloc before the op it steps.
#[derive(Clone, Copy)]
enum Served<'a> {
    /// Its own addresses (`addrs`), its replay's outcomes before its window and the ops
    /// before it (see [`OpStepper::step_op`]).
    Kept(&'a [Op]),
    /// Its replay's outcomes of every op before the one stepped.
    Outcomes(&'a Outcomes),
}

/// No outcomes: what a stepper at op 0 looks up.
static NO_OUTCOMES: Outcomes = Outcomes(Vec::new());

impl OpStepper<'static> {
    /// A stepper for `trace`, at its first op.
    #[must_use]
    pub fn new(trace: &DeviceTrace, preloaded: bool) -> OpStepper<'static> {
        OpStepper::with_room(trace.ops.len(), preloaded)
    }

    /// A stepper at the first op, with room for `ops` ops (it grows past them).
    #[must_use]
    pub fn with_room(ops: usize, preloaded: bool) -> OpStepper<'static> {
        OpStepper {
            base: 0,
            before: &NO_OUTCOMES,
            addrs: OpAddrs::zeroed(ops),
            dead: None,
            preloaded,
        }
    }

    /// A stepper at the first op that reads what it served an alloc from its replay's
    /// outcomes, which the replay passes to [`OpStepper::step_reading`] (a replay that
    /// keeps them: [`ReplayRun`]).
    #[must_use]
    fn reading_outcomes(preloaded: bool) -> OpStepper<'static> {
        OpStepper {
            base: 0,
            before: &NO_OUTCOMES,
            addrs: OpAddrs::zeroed(0),
            dead: Some(Vec::new()),
            preloaded,
        }
    }
}

impl<'r> OpStepper<'r> {
    /// A stepper for the ops `window` of a replay of `trace` whose outcomes were
    /// `outcomes` (`window.start` a checkpoint's `ops_done`): each alloc before the window
    /// holds what the replay served it, a recorded OOM or a refused alloc nothing — so
    /// frees in the window find their block. It steps only the ops of `window`.
    #[must_use]
    pub fn resume(
        trace: &DeviceTrace,
        outcomes: &'r Outcomes,
        window: std::ops::Range<usize>,
        preloaded: bool,
    ) -> OpStepper<'r> {
        let len = window.end.min(trace.ops.len()).saturating_sub(window.start);
        OpStepper {
            base: window.start,
            before: outcomes,
            addrs: OpAddrs::zeroed(len),
            dead: None,
            preloaded,
        }
    }

    /// Where alloc op `alloc` put the program's memory: `Some(addr)` while the program
    /// may hold it (also before it is reached: 0), None for a failed or recorded-OOM
    /// alloc.
    fn served(&self, ops: &[Op], alloc: usize) -> Option<u64> {
        match alloc.checked_sub(self.base) {
            Some(i) => Some(self.addrs.get(i)).filter(|&a| a != DEAD),
            None => match (self.before.get(alloc), &ops[alloc].kind) {
                (Some(Outcome::Served(a)), OpKind::Alloc { recorded_oom, .. }) => {
                    (!recorded_oom).then_some(a)
                }
                _ => None,
            },
        }
    }

    /// Applies op `k` of `trace` to `model` on `device`; the model's events go to `out`.
    /// A resumed stepper steps only the ops of its window (another `k` panics).
    pub fn step<M: Allocator + ?Sized>(
        &mut self,
        trace: &DeviceTrace,
        k: usize,
        model: &mut M,
        device: &mut dyn Device,
        out: &mut Vec<ModelEvent>,
    ) -> Step {
        self.step_op(
            &trace.ops[k],
            k,
            trace.initial_ops,
            &trace.ops,
            &trace.pools,
            model,
            device,
            out,
        )
    }

    /// [`OpStepper::step`] of op `k`, `op`, of a trace whose first `initial_ops` ops are
    /// the blocks alive at its start; `ops`: the trace's ops before this stepper's first
    /// (none for a stepper at op 0, which grows its room as the ops come); `pools`: the
    /// trace's private pools ([`DeviceTrace::pools`], those named so far).
    #[allow(clippy::too_many_arguments)]
    pub fn step_op<M: Allocator + ?Sized>(
        &mut self,
        op: &Op,
        k: usize,
        initial_ops: usize,
        ops: &[Op],
        pools: &[PoolId],
        model: &mut M,
        device: &mut dyn Device,
        out: &mut Vec<ModelEvent>,
    ) -> Step {
        self.step_reading(
            op,
            k,
            initial_ops,
            Served::Kept(ops),
            pools,
            model,
            device,
            out,
        )
    }

    /// [`OpStepper::step_op`], what was served read back from `served`: a stepper made by
    /// [`OpStepper::reading_outcomes`] is given its replay's outcomes of every op before
    /// `k`, any other its own (`Served::Kept`).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn step_reading<M: Allocator + ?Sized>(
        &mut self,
        op: &Op,
        k: usize,
        initial_ops: usize,
        served: Served<'_>,
        pools: &[PoolId],
        model: &mut M,
        device: &mut dyn Device,
        out: &mut Vec<ModelEvent>,
    ) -> Step {
        let i = k - self.base;
        if self.dead.is_none() {
            self.addrs.grow_to(i + 1);
        }
        match op.kind {
            OpKind::Alloc { .. } if self.preloaded && k < initial_ops => {
                self.keep(i, op.recorded_addr);
                Step::Served(op.recorded_addr)
            }
            OpKind::Alloc {
                size_bytes,
                stream,
                pool,
                recorded_oom,
                restored,
            } => {
                let req = AllocRequest {
                    size_bytes,
                    stream,
                    pool: pool.id(pools),
                };
                match serve_alloc(model, device, &req, restored, op.recorded_addr, out) {
                    Ok(a) => {
                        if recorded_oom {
                            // The program never got this memory: give it back at once.
                            let _ = model.free(device, a, false, out);
                            self.keep(i, DEAD);
                        } else {
                            self.keep(i, a);
                        }
                        Step::Served(a)
                    }
                    Err(info) => {
                        self.keep(i, DEAD);
                        Step::Oom {
                            info,
                            fatal: !recorded_oom,
                        }
                    }
                }
            }
            OpKind::Free { alloc, deferred } => {
                if let Some(a) = self.served_from(served, alloc as usize) {
                    let _ = model.free(device, a, deferred, out);
                }
                Step::Done
            }
            OpKind::CompleteFree { alloc } => {
                if let Some(a) = self.served_from(served, alloc as usize) {
                    // Already completed if a cache flush synchronised it: not an error.
                    let _ = model.complete_free(device, a, out);
                }
                Step::Done
            }
            OpKind::EmptyCache => {
                model.empty_cache(device, out);
                Step::Done
            }
            OpKind::ReleasePool { pool } => {
                model.release_pool(pool);
                Step::Done
            }
        }
    }

    /// Keeps what op `base + i` served (`DEAD`: the program never held its memory).
    #[inline]
    fn keep(&mut self, i: usize, addr: u64) {
        match &mut self.dead {
            None => self.addrs.set(i, addr),
            Some(dead) => {
                if addr == DEAD {
                    dead.push((self.base + i) as u32);
                }
            }
        }
    }

    /// [`OpStepper::served`], read back from `served`.
    #[inline]
    fn served_from(&self, served: Served<'_>, alloc: usize) -> Option<u64> {
        match (served, &self.dead) {
            (Served::Outcomes(outcomes), Some(dead)) => match outcomes.get(alloc) {
                Some(Outcome::Served(a)) if dead.binary_search(&(alloc as u32)).is_err() => Some(a),
                _ => None,
            },
            (Served::Kept(ops), _) => self.served(ops, alloc),
            // A stepper that keeps its own addresses reads them.
            (Served::Outcomes(_), None) => self.served(&[], alloc),
        }
    }

    /// The address alloc op `alloc` was served at, while the program may hold it (None for
    /// an op that is no alloc, not reached yet, failed, or was a recorded OOM).
    #[must_use]
    pub fn held_addr(&self, trace: &DeviceTrace, alloc: usize) -> Option<u64> {
        // Served addresses are never 0 (every device hands out real or synthetic ones).
        let stepped = alloc < self.base + self.addrs.len();
        if !(stepped && trace.ops.get(alloc)?.is_alloc()) {
            return None;
        }
        self.served(&trace.ops, alloc).filter(|&a| a != 0)
    }
}

/// Replays `trace` through `model` on `device`.
#[must_use]
pub fn replay(
    trace: &DeviceTrace,
    mut model: Box<dyn Allocator>,
    device: SimulatedDevice,
    capacity: Option<u64>,
    opts: ReplayOptions,
) -> ReplayResult {
    replay_in(trace, model.as_mut(), device, capacity, opts)
}

/// [`replay`] of a model whose type is known here: the model's calls in the per-op loop
/// are direct rather than through the trait object, so they can be inlined (the PyTorch
/// model's replay goes this way).
#[must_use]
pub fn replay_model<M: Allocator>(
    trace: &DeviceTrace,
    mut model: M,
    device: SimulatedDevice,
    capacity: Option<u64>,
    opts: ReplayOptions,
) -> ReplayResult {
    replay_in(trace, &mut model, device, capacity, opts)
}

fn replay_in<M: Allocator + ?Sized>(
    trace: &DeviceTrace,
    model: &mut M,
    device: SimulatedDevice,
    capacity: Option<u64>,
    opts: ReplayOptions,
) -> ReplayResult {
    let mut run = ReplayRun::over(trace, model, device, capacity, opts);
    for op in &trace.ops {
        run.push(op);
    }
    run.finish()
}

/// A replay fed its ops one at a time, in order (the replay of [`replay`] and
/// [`replay_model`], which feed it a whole trace; a front end may feed it the ops as the
/// trace's build makes them, [`crate::build::build_streaming`]). Given the same ops, the
/// same model and device, its result is that of [`replay`].
pub struct ReplayRun<'m, M: Allocator + ?Sized> {
    model: &'m mut M,
    run: Run,
}

/// What a replay keeps of its ops as they are stepped, all but the model: the device, the
/// outcomes, the timeline, the checkpoints and the totals. [`ReplayRun`] steps the model
/// on it; [`Shadow`] reads a model another pass steps.
#[derive(Clone)]
struct Run {
    device: SimulatedDevice,
    capacity: Option<u64>,
    opts: ReplayOptions,
    initial_ops: usize,
    /// The number of ops, where known before they come (the last is then checked as
    /// [`ReplayOptions::check_every`] says; else at [`ReplayRun::finish`]).
    total: Option<usize>,
    every: usize,
    outcomes: Outcomes,
    timeline: Timeline,
    out: Vec<ModelEvent>,
    checkpoints: Vec<Checkpoint>,
    peak: ModelStats,
    peak_at: ModelStats,
    peak_alloc: u64,
    peak_req: u64,
    max_frag: ModelStats,
    oom: Option<OomReport>,
    ooms: Vec<OomReport>,
    driver: DriverCost,
    reproduced: usize,
    ops_done: usize,
    /// Ops pushed so far.
    pushed: usize,
    invariant_error: Option<(usize, String)>,
    stepper: OpStepper<'static>,
    /// The trace's private pools named so far ([`ReplayRun::set_pools`]).
    pools: Vec<PoolId>,
    /// Alloc ops pushed: `requests`, those after a fatal OOM included.
    allocs_seen: usize,
    /// A fatal OOM ended the replay: later ops are only counted.
    stopped: bool,
}

impl Run {
    fn new<M: Allocator + ?Sized>(
        model: &M,
        device: SimulatedDevice,
        capacity: Option<u64>,
        opts: ReplayOptions,
        initial_ops: usize,
        total: Option<usize>,
    ) -> Run {
        let n = total.unwrap_or(0);
        let outcomes = if opts.keep_timeline {
            Outcomes::with_capacity(n)
        } else {
            Outcomes::default()
        };
        // The state before the first op counts too: a trace whose segments were all
        // alive when it started (a wrapped ring buffer, or no events at all) peaks there.
        let start = model.stats();
        let every = match total {
            Some(n) => checkpoint_interval(n, opts.checkpoint_every, opts.max_checkpoints),
            None => 0,
        };
        Run {
            device,
            capacity,
            opts,
            initial_ops,
            total,
            every,
            outcomes,
            timeline: Timeline::default(),
            out: Vec::with_capacity(16),
            checkpoints: Vec::new(),
            peak: start,
            peak_at: start,
            peak_alloc: start.allocated_bytes,
            peak_req: start.requested_bytes,
            // The most fragmented state so far, as the stats it was computed from:
            // compared exactly in integers (no float division per op), converted once
            // at the end.
            max_frag: start,
            oom: None,
            ooms: Vec::new(),
            driver: DriverCost::default(),
            reproduced: 0,
            ops_done: 0,
            pushed: 0,
            invariant_error: None,
            // A replay keeping its outcomes reads what it served from them.
            stepper: if opts.keep_timeline {
                OpStepper::reading_outcomes(opts.preloaded)
            } else {
                OpStepper::with_room(n, opts.preloaded)
            },
            pools: Vec::new(),
            allocs_seen: 0,
            stopped: false,
        }
    }

    /// See [`ReplayRun::expecting`].
    fn expecting(&mut self, ops: usize) {
        debug_assert_eq!(self.pushed, 0, "before the first op");
        self.every =
            checkpoint_interval(ops, self.opts.checkpoint_every, self.opts.max_checkpoints);
        if self.opts.keep_timeline {
            self.outcomes = Outcomes::with_capacity(ops);
        }
    }

    /// The next op begins, `model` as the ops before it left it: counted, and a
    /// checkpoint taken where one is due. Its index, or none after a fatal OOM (the op is
    /// then only counted).
    #[inline]
    fn begin<M: Allocator + ?Sized>(&mut self, is_alloc: bool, model: &M) -> Option<usize> {
        let k = self.pushed;
        self.pushed += 1;
        self.allocs_seen += usize::from(is_alloc);
        if self.stopped {
            return None;
        }
        if self.every > 0 && k.is_multiple_of(self.every) {
            self.checkpoints.push(Checkpoint {
                ops_done: k,
                model: model.clone_box(),
                device: self.device.clone(),
            });
        }
        Some(k)
    }

    /// Op `k` (begun by [`Run::begin`]) is done, `model` as it left it, its events in
    /// `self.out`: its outcome, the driver's time, the totals, the timeline; `stop`: a
    /// fatal OOM ends the replay here.
    #[inline]
    fn end<M: Allocator + ?Sized>(&mut self, k: usize, outcome: Outcome, stop: bool, model: &M) {
        self.driver.add(cost::DEFAULT, &self.out);
        let st = model.stats();
        if st.reserved_bytes > self.peak.reserved_bytes {
            self.peak = st;
            self.peak_at = st;
        }
        self.peak_alloc = self.peak_alloc.max(st.allocated_bytes);
        self.peak_req = self.peak_req.max(st.requested_bytes);
        if metrics::more_fragmented(&st, &self.max_frag) {
            self.max_frag = st;
        }
        if self.opts.keep_timeline {
            if self.opts.keep_requested {
                self.timeline.push(&st);
            } else {
                self.timeline.push_drawn(&st);
            }
            self.outcomes.push(outcome);
        }
        self.ops_done = k + 1;
        if self.opts.check_every > 0
            && (k.is_multiple_of(self.opts.check_every) || self.total == Some(k + 1))
        {
            self.check(k, model);
        }
        self.stopped = stop;
    }

    fn check<M: Allocator + ?Sized>(&mut self, k: usize, model: &M) {
        if self.invariant_error.is_none()
            && let Err(e) = model.check_invariants()
        {
            self.invariant_error = Some((k, e));
        }
    }

    fn oom_report<M: Allocator + ?Sized>(
        &self,
        model: &M,
        op: &Op,
        k: usize,
        info: &OomInfo,
        fatal: bool,
    ) -> OomReport {
        let size_bytes = match op.kind {
            OpKind::Alloc { size_bytes, .. } => size_bytes,
            _ => 0,
        };
        let st = model.stats();
        let pytorch = model.kind() == Some(AllocatorKind::Pytorch);
        OomReport {
            event_index: u64::from(op.event_index),
            op_index: k,
            requested_bytes: size_bytes,
            reserved_bytes: st.reserved_bytes,
            allocated_bytes: st.allocated_bytes,
            free_bytes: metrics::free_bytes(&st),
            largest_free_bytes: info.largest_free_bytes,
            free_holes: info.free_holes,
            recorded: !fatal,
            fatal,
            pytorch_message: pytorch.then(|| {
                pytorch_oom_message(
                    info.alloc_bytes,
                    st.allocated_bytes,
                    st.reserved_bytes,
                    model.private_pool_free_bytes(),
                )
            }),
            explanation: explain_oom(
                if pytorch { "PyTorch" } else { model.name() },
                size_bytes,
                info,
                self.capacity,
            ),
            reason: info.reason.clone(),
        }
    }

    fn finish<M: Allocator + ?Sized>(mut self, model: &M) -> ReplayResult {
        // Without the number of ops beforehand the last op is checked here, as
        // [`ReplayRun::push`] checks it when it is known.
        if self.total.is_none()
            && self.opts.check_every > 0
            && !self.stopped
            && self.ops_done > 0
            && !(self.ops_done - 1).is_multiple_of(self.opts.check_every)
        {
            self.check(self.ops_done - 1, model);
        }
        let fin = model.stats();
        self.timeline.shrink_to_fit();
        ReplayResult {
            allocator: model.name(),
            config: model.config_string(),
            capacity_bytes: self.capacity,
            ops_done: self.ops_done,
            requests: self.allocs_seen,
            outcomes: self.outcomes,
            timeline: self.timeline,
            peak_reserved_bytes: self.peak.reserved_bytes,
            peak_allocated_bytes: self.peak_alloc,
            peak_requested_bytes: self.peak_req,
            final_reserved_bytes: fin.reserved_bytes,
            internal_waste_bytes_at_peak: metrics::internal_waste_bytes(&self.peak_at),
            fragmentation_at_peak: metrics::fragmentation(&self.peak_at),
            max_fragmentation: metrics::fragmentation(&self.max_frag),
            segment_ops: fin.segment_ops,
            driver: self.driver,
            oom: self.oom,
            ooms: self.ooms,
            recorded_ooms_reproduced: self.reproduced,
            checkpoints: self.checkpoints,
            invariant_error: self.invariant_error,
            preloaded: self.opts.preloaded,
        }
    }
}

impl<'m, M: Allocator + ?Sized> ReplayRun<'m, M> {
    /// A replay of `model` on `device` before its first op; `initial_ops`: the trace's
    /// ops of the blocks alive at its start ([`DeviceTrace::initial_ops`]); `total`: its
    /// number of ops if known (the checkpoints are spaced from it: none without it).
    pub fn new(
        model: &'m mut M,
        device: SimulatedDevice,
        capacity: Option<u64>,
        opts: ReplayOptions,
        initial_ops: usize,
        total: Option<usize>,
    ) -> Self {
        let run = Run::new(&*model, device, capacity, opts, initial_ops, total);
        ReplayRun { model, run }
    }

    /// A replay of `model` on `device` before the first op of the whole of `trace` (its
    /// ops to be pushed in order): [`ReplayRun::new`] with the trace's start ops, number of
    /// ops and private pools.
    pub fn over(
        trace: &DeviceTrace,
        model: &'m mut M,
        device: SimulatedDevice,
        capacity: Option<u64>,
        opts: ReplayOptions,
    ) -> Self {
        let mut run = ReplayRun::new(
            model,
            device,
            capacity,
            opts,
            trace.initial_ops,
            Some(trace.ops.len()),
        );
        run.set_pools(&trace.pools);
        run
    }

    /// Spaces the checkpoints (and makes room for the outcomes) as for about `ops` ops,
    /// where their number is not known before the last (a replay beside the trace's
    /// build: [`crate::build::expected_ops`]). Before the first op only. The layouts
    /// rebuilt from them are the same, however spaced; only their speed differs.
    #[must_use]
    pub fn expecting(mut self, ops: usize) -> Self {
        self.run.expecting(ops);
        self
    }

    /// The model replayed.
    #[must_use]
    pub fn model(&self) -> &M {
        self.model
    }

    /// The ops replayed so far: the timeline's samples (a fatal OOM stops it at its op).
    /// With `model().stats()` after each op that added one, a caller reads the timeline
    /// as it is made without keeping it (the app's CSV export).
    #[must_use]
    pub fn ops_done(&self) -> usize {
        self.run.ops_done
    }

    /// The simulated device the model's segments are on.
    #[must_use]
    pub fn device(&self) -> &SimulatedDevice {
        &self.run.device
    }

    /// What the model did in the last op pushed.
    #[must_use]
    pub fn last_events(&self) -> &[ModelEvent] {
        &self.run.out
    }

    /// This replay's state (all of it but the model) driving `model` from here: a copy of
    /// this replay's model, perhaps under another configuration. Where that configuration
    /// decides every op before here as this one did, pushing it the rest of the ops ends
    /// as a replay of the whole trace through it would have (`core::prefix`).
    pub fn fork<'n, N: Allocator + ?Sized>(&self, model: &'n mut N) -> ReplayRun<'n, N> {
        let mut run = self.run.clone();
        run.out = Vec::with_capacity(16);
        ReplayRun { model, run }
    }

    /// The private pools the ops name ([`DeviceTrace::pools`]); before an op that names
    /// one, with it and those before it (a replay beside the build: the pools named so
    /// far, [`crate::build::Streamed::Ops`]).
    /// The table only grows as a build names pools: one of the same length is the same.
    pub fn set_pools(&mut self, pools: &[PoolId]) {
        if pools.len() != self.run.pools.len() {
            self.run.pools.clear();
            self.run.pools.extend_from_slice(pools);
        }
    }

    /// Replays the next op.
    #[inline]
    pub fn push(&mut self, op: &Op) {
        let Some(k) = self.run.begin(op.is_alloc(), &*self.model) else {
            return;
        };
        let r = &mut self.run;
        r.out.clear();
        let served = if r.opts.keep_timeline {
            Served::Outcomes(&r.outcomes)
        } else {
            Served::Kept(&[])
        };
        let step = r.stepper.step_reading(
            op,
            k,
            r.initial_ops,
            served,
            &r.pools,
            self.model,
            &mut r.device,
            &mut r.out,
        );
        let (outcome, fatal_oom) = match step {
            Step::Served(a) => (Outcome::Served(a), false),
            Step::Done => (Outcome::None, false),
            Step::Oom { info, fatal } => {
                if !fatal {
                    r.reproduced += 1;
                }
                let report = r.oom_report(&*self.model, op, k, &info, fatal);
                // The first OOM is reported, unless a fatal one follows reproduced ones.
                if r.oom.is_none()
                    || (fatal && r.oom.as_ref().is_some_and(|o: &OomReport| !o.fatal))
                {
                    r.oom = Some(report.clone());
                }
                r.ooms.push(report);
                // The program would have died here.
                (Outcome::Oom, fatal)
            }
        };
        r.end(k, outcome, fatal_oom, &*self.model);
    }

    /// The replay's result once every op is pushed.
    #[must_use]
    pub fn finish(self) -> ReplayResult {
        self.run.finish(&*self.model)
    }
}

/// A replay made by reading a model that another pass steps through the same ops (the
/// trace's build: [`crate::build::build_replaying`]), not by stepping one: for each op,
/// [`Shadow::begin`] before the model takes it and [`Shadow::end`] after, with what the
/// model served and the events it emitted. Where the model took each op as a replay's
/// model would have on this device (the caller's to ensure: the same model, the device's
/// calls answered alike), its result is that replay's.
pub struct Shadow {
    run: Run,
}

impl Shadow {
    /// Before the first op of a trace whose first `initial_ops` ops are the blocks alive at
    /// its start, `model` as it is there; the checkpoints spaced as for `expected_ops` ops
    /// ([`ReplayRun::expecting`]).
    #[must_use]
    pub fn new<M: Allocator + ?Sized>(
        model: &M,
        device: SimulatedDevice,
        capacity: Option<u64>,
        opts: ReplayOptions,
        initial_ops: usize,
        expected_ops: usize,
    ) -> Shadow {
        let mut run = Run::new(model, device, capacity, opts, initial_ops, None);
        run.expecting(expected_ops);
        Shadow { run }
    }

    /// The device the replay's segments are on, which the caller keeps as the replay's
    /// would be: the model's device calls made on it too.
    pub fn device_mut(&mut self) -> &mut SimulatedDevice {
        &mut self.run.device
    }

    /// The next op begins (an alloc or not), `model` as the ops before it left it.
    #[inline]
    pub fn begin<M: Allocator + ?Sized>(&mut self, is_alloc: bool, model: &M) {
        let _ = self.run.begin(is_alloc, model);
    }

    /// The op begun is done, `model` as it left it: an alloc served at `served`, another
    /// op `None`; `events`: what the model emitted.
    #[inline]
    pub fn end<M: Allocator + ?Sized>(
        &mut self,
        served: Option<u64>,
        events: &[ModelEvent],
        model: &M,
    ) {
        let k = self.run.pushed - 1;
        self.run.out.clear();
        self.run.out.extend_from_slice(events);
        let outcome = served.map_or(Outcome::None, Outcome::Served);
        self.run.end(k, outcome, false, model);
    }

    /// The replay's result, `model` as the last op left it.
    #[must_use]
    pub fn finish<M: Allocator + ?Sized>(self, model: &M) -> ReplayResult {
        self.run.finish(model)
    }
}

/// The layout after `ops_done` ops, rebuilt from the nearest checkpoint at or before it.
#[must_use]
pub fn layout_at(trace: &DeviceTrace, result: &ReplayResult, ops_done: usize) -> Option<Layout> {
    let cp = result
        .checkpoints
        .iter()
        .rev()
        .find(|c| c.ops_done <= ops_done)?;
    let mut model = cp.model.clone_box();
    let mut device = cp.device.clone();
    let mut out = Vec::new();
    let window = cp.ops_done..ops_done.min(trace.ops.len());
    let mut stepper = OpStepper::resume(trace, &result.outcomes, window.clone(), result.preloaded);
    for k in window {
        out.clear();
        stepper.step(trace, k, &mut *model, &mut device, &mut out);
    }
    Some(model.layout())
}

/// Serves an alloc op: a malloc, or for a checkpoint restore the block re-created at its
/// recorded address.
fn serve_alloc<M: Allocator + ?Sized>(
    model: &mut M,
    device: &mut dyn Device,
    req: &AllocRequest,
    restored: bool,
    recorded_addr: u64,
    out: &mut Vec<ModelEvent>,
) -> Result<u64, OomInfo> {
    if restored {
        model.alloc_at(device, req, recorded_addr, out)
    } else {
        model.malloc(device, req, out)
    }
}

/// Checks a device handed out by a replay: totals the device saw (for tests).
#[must_use]
pub fn device_free_bytes(device: &SimulatedDevice) -> u64 {
    device.free_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_keep_every_outcome_in_eight_bytes() {
        let all = [
            Outcome::Served(0x7f00_0000_0000),
            Outcome::None,
            Outcome::Oom,
            Outcome::Served(1),
            Outcome::Served(Outcomes::OOM - 1),
            Outcome::None,
        ];
        let mut o = Outcomes::with_capacity(all.len());
        for x in all {
            o.push(x);
        }
        assert_eq!(o.len(), all.len());
        assert_eq!(o.iter().collect::<Vec<_>>(), all);
        assert_eq!(o.get(2), Some(Outcome::Oom));
        assert_eq!(o.get(all.len()), None);
        assert_eq!(o.capacity_bytes(), 8 * all.len());
    }

    #[test]
    #[should_panic(expected = "out of any device's range")]
    fn an_address_that_would_read_back_as_another_outcome_is_refused() {
        Outcomes::default().push(Outcome::Served(u64::MAX));
    }

    #[test]
    fn checkpoints_are_spaced_so_that_at_most_the_budget_is_kept() {
        // Short traces keep the asked spacing; long ones at most `max` checkpoints.
        assert_eq!(checkpoint_interval(1_000, 4096, 256), 4096);
        assert_eq!(checkpoint_interval(1_048_576, 4096, 256), 4096);
        assert_eq!(checkpoint_interval(1_048_577, 4096, 256), 4097);
        assert_eq!(checkpoint_interval(9_670_000, 4096, 256), 37_774);
        assert_eq!(checkpoint_interval(9_670_000, 0, 256), 0);
        assert_eq!(checkpoint_interval(9_670_000, 4096, 0), 4096);
        for ops in [1, 255, 256, 257, 1000, 65_537, 9_670_000] {
            let every = checkpoint_interval(ops, 1, MAX_CHECKPOINTS);
            assert!(ops.div_ceil(every) <= MAX_CHECKPOINTS, "{ops} ops");
        }
    }
}
