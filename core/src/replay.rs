//! The replay engine: drives a trace's requests through a model on a device, and keeps
//! the outcome of every request, the metrics timeline and checkpoints of the state every
//! K ops, so the layout at any op is rebuilt quickly (scrubbing in the app).

use std::fmt::Write as _;

use crate::cost::{self, DriverCost};
use crate::device::{Device, RecordedSegmentOp, SimulatedDevice};
use crate::metrics::{self, Timeline};
use crate::models::{AllocRequest, Allocator, AllocatorKind, Layout, ModelEvent, OomInfo};
use crate::snapshot::{Action, RawEvent};
use crate::trace::{DeviceTrace, OpKind};
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
#[derive(Debug, Clone)]
pub struct OpStepper<'r> {
    /// The first op this stepper steps: `addrs` and `dead` are indexed from it.
    base: usize,
    /// The replay's outcomes, read for the ops before `base` (none for a stepper at op 0).
    before: &'r Outcomes,
    /// Address served to alloc op `base + i` (0 for other ops).
    addrs: Vec<u64>,
    /// The program never held op `base + i`'s memory.
    dead: Vec<bool>,
    /// The model was loaded with the start state (see [`ReplayOptions::preloaded`]).
    preloaded: bool,
}

/// No outcomes: what a stepper at op 0 looks up.
static NO_OUTCOMES: Outcomes = Outcomes(Vec::new());

impl OpStepper<'static> {
    /// A stepper for `trace`, at its first op.
    #[must_use]
    pub fn new(trace: &DeviceTrace, preloaded: bool) -> OpStepper<'static> {
        OpStepper {
            base: 0,
            before: &NO_OUTCOMES,
            addrs: vec![0; trace.ops.len()],
            dead: vec![false; trace.ops.len()],
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
            addrs: vec![0; len],
            dead: vec![false; len],
            preloaded,
        }
    }

    /// Where alloc op `alloc` put the program's memory: `Some(addr)` while the program
    /// may hold it (also before it is reached: 0), None for a failed or recorded-OOM
    /// alloc.
    fn served(&self, trace: &DeviceTrace, alloc: usize) -> Option<u64> {
        match alloc.checked_sub(self.base) {
            Some(i) => (!self.dead[i]).then(|| self.addrs[i]),
            None => match (self.before.get(alloc), &trace.ops[alloc].kind) {
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
        let op = &trace.ops[k];
        match op.kind {
            OpKind::Alloc { .. } if self.preloaded && k < trace.initial_ops => {
                self.addrs[k - self.base] = op.recorded_addr;
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
                    pool,
                };
                match serve_alloc(model, device, &req, restored, op.recorded_addr, out) {
                    Ok(a) => {
                        self.addrs[k - self.base] = a;
                        if recorded_oom {
                            // The program never got this memory: give it back at once.
                            let _ = model.free(device, a, false, out);
                            self.dead[k - self.base] = true;
                        }
                        Step::Served(a)
                    }
                    Err(info) => {
                        self.dead[k - self.base] = true;
                        Step::Oom {
                            info,
                            fatal: !recorded_oom,
                        }
                    }
                }
            }
            OpKind::Free { alloc, deferred } => {
                if let Some(a) = self.served(trace, alloc as usize) {
                    let _ = model.free(device, a, deferred, out);
                }
                Step::Done
            }
            OpKind::CompleteFree { alloc } => {
                if let Some(a) = self.served(trace, alloc as usize) {
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

    /// The address alloc op `alloc` was served at, while the program may hold it (None for
    /// an op that is no alloc, not reached yet, failed, or was a recorded OOM).
    #[must_use]
    pub fn held_addr(&self, trace: &DeviceTrace, alloc: usize) -> Option<u64> {
        // Served addresses are never 0 (every device hands out real or synthetic ones).
        let stepped = alloc < self.base + self.addrs.len();
        if !(stepped && trace.ops.get(alloc)?.is_alloc()) {
            return None;
        }
        self.served(trace, alloc).filter(|&a| a != 0)
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
    mut device: SimulatedDevice,
    capacity: Option<u64>,
    opts: ReplayOptions,
) -> ReplayResult {
    let mut outcomes = if opts.keep_timeline {
        Outcomes::with_capacity(trace.ops.len())
    } else {
        Outcomes::default()
    };
    let mut timeline = Timeline::default();
    let mut out: Vec<ModelEvent> = Vec::with_capacity(16);
    let mut checkpoints = Vec::new();
    // The state before the first op counts too: a trace whose segments were all alive
    // when it started (a wrapped ring buffer, or no events at all) peaks there.
    let start = model.stats();
    let mut peak = start;
    let mut peak_at = start;
    let (mut peak_alloc, mut peak_req) = (start.allocated_bytes, start.requested_bytes);
    // The most fragmented state so far, as the stats it was computed from: compared
    // exactly in integers (no float division per op), converted once at the end.
    let mut max_frag = start;
    let mut oom = None;
    let mut ooms = Vec::new();
    let mut driver = DriverCost::default();
    let mut reproduced = 0;
    let mut ops_done = 0;
    let mut invariant_error = None;
    let mut stepper = OpStepper::new(trace, opts.preloaded);
    // Alloc ops replayed: `requests` without a second pass over the ops.
    let mut allocs_seen = 0;
    let every = checkpoint_interval(trace.ops.len(), opts.checkpoint_every, opts.max_checkpoints);
    for (k, op) in trace.ops.iter().enumerate() {
        if every > 0 && k % every == 0 {
            checkpoints.push(Checkpoint {
                ops_done: k,
                model: model.clone_box(),
                device: device.clone(),
            });
        }
        out.clear();
        let mut stop = false;
        allocs_seen += usize::from(op.is_alloc());
        let outcome = match stepper.step(trace, k, model, &mut device, &mut out) {
            Step::Served(a) => Outcome::Served(a),
            Step::Done => Outcome::None,
            Step::Oom { info, fatal } => {
                if !fatal {
                    reproduced += 1;
                }
                let size_bytes = match op.kind {
                    OpKind::Alloc { size_bytes, .. } => size_bytes,
                    _ => 0,
                };
                let st = model.stats();
                let pytorch = model.kind() == Some(AllocatorKind::Pytorch);
                let report = OomReport {
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
                        &info,
                        capacity,
                    ),
                    reason: info.reason.clone(),
                };
                // The first OOM is reported, unless a fatal one follows reproduced ones.
                if oom.is_none() || (fatal && oom.as_ref().is_some_and(|o: &OomReport| !o.fatal)) {
                    oom = Some(report.clone());
                }
                ooms.push(report);
                // The program would have died here.
                stop = fatal;
                Outcome::Oom
            }
        };
        driver.add(cost::DEFAULT, &out);
        let st = model.stats();
        if st.reserved_bytes > peak.reserved_bytes {
            peak = st;
            peak_at = st;
        }
        peak_alloc = peak_alloc.max(st.allocated_bytes);
        peak_req = peak_req.max(st.requested_bytes);
        if metrics::more_fragmented(&st, &max_frag) {
            max_frag = st;
        }
        if opts.keep_timeline {
            timeline.push(&st);
            outcomes.push(outcome);
        }
        ops_done = k + 1;
        if opts.check_every > 0
            && (k % opts.check_every == 0 || k + 1 == trace.ops.len())
            && invariant_error.is_none()
            && let Err(e) = model.check_invariants()
        {
            invariant_error = Some((k, e));
        }
        if stop {
            break;
        }
    }
    let fin = model.stats();
    timeline.shrink_to_fit();
    ReplayResult {
        allocator: model.name(),
        config: model.config_string(),
        capacity_bytes: capacity,
        ops_done,
        requests: allocs_seen
            + trace.ops[ops_done..]
                .iter()
                .filter(|o| o.is_alloc())
                .count(),
        outcomes,
        timeline,
        peak_reserved_bytes: peak.reserved_bytes,
        peak_allocated_bytes: peak_alloc,
        peak_requested_bytes: peak_req,
        final_reserved_bytes: fin.reserved_bytes,
        internal_waste_bytes_at_peak: metrics::internal_waste_bytes(&peak_at),
        fragmentation_at_peak: metrics::fragmentation(&peak_at),
        max_fragmentation: metrics::fragmentation(&max_frag),
        segment_ops: fin.segment_ops,
        driver,
        oom,
        ooms,
        recorded_ooms_reproduced: reproduced,
        checkpoints,
        invariant_error,
        preloaded: opts.preloaded,
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
