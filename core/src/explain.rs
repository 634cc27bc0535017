//! Why a request did not fit, in the terms a user can act on (`allocsim explain`): at the
//! first OOM of a replay (the one `replay` reports), at a chosen event, or at the peak
//! reserved memory.
//!
//! - **The moment.** At an OOM: the state after the failed malloc (PyTorch has already
//!   flushed its cache; its OOM sentence describes that state). At `--at EVENT`: the event
//!   maps to the last op at or before it, and the request examined is the first alloc op
//!   from there on, in the state just before it is served. At the peak (no OOM, no
//!   `--at`): the alloc op that first brought reserved memory to its peak — the request
//!   that found no hole big enough and took a new segment — just before it is served.
//! - **The holes** are the free blocks of the request's pool and stream (and, for the
//!   PyTorch model, its small or large pool): each with the free that opened it (the last
//!   free whose block lies in it; none if the segment was fresh) and its live neighbours.
//! - **The blockers** are the smallest set of live blocks (allocated or waiting for a
//!   deferred free) whose absence would let the request fit: either a window of one
//!   segment of those holes' pool and stream whose blocks, with the live ones removed,
//!   leave a free run ≥ the rounded request (a sliding window over the segment's blocks;
//!   unmapped pages bound a window), or every live block of a default-pool segment whose
//!   release would make room for the request's new segment under the capacity. The set
//!   with the fewest live bytes wins; its blocks are grouped by allocation site (the top
//!   user frame, `file.py:LINE function`, skipping `torch/` internals when the stack has
//!   other Python frames; a size class when there are no frames) and the groups ranked by
//!   the longest free run their absence alone would give.

use std::collections::{BTreeMap, HashMap};

use crate::models::pytorch::{PyTorchModel, SMALL_SIZE_BYTES};
use crate::models::{
    Layout, LayoutBlock, LayoutBlockState, LayoutSegment, ModelSpec, PoolId, ResolvedModel,
};
use crate::offline::{self, BestPossible};
use crate::replay::{OomReport, OpStepper, ReplayOptions, Step};
use crate::snapshot::{Action, FrameTable, StackId};
use crate::trace::{DeviceTrace, OpKind, Trace};
use crate::units::format_size;
use crate::{Error, QueryError};
use crate::{session, whatif};

/// At most this many frames of a stack are reported (innermost first).
pub const MAX_FRAMES: usize = 12;
/// At most this many holes are listed (the largest; the totals count them all).
pub const MAX_HOLES: usize = 64;

/// What to explain, and how much to compute.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExplainOptions {
    /// An event index into `device_traces[d]` (None: the OOM, else the peak).
    pub at_event: Option<u64>,
    /// Also sweep the PyTorch settings and bisect the smallest capacity ([`WouldFit`]).
    pub what_if: bool,
    /// Leave the trace's bounds out (`live_peak_bytes` and `offline_peak_bytes` are 0): for
    /// a caller that shows [`offline::best_possible`] computed apart (the app's `Bounds`),
    /// so that the offline placement, most of an explanation's time, is not paid twice.
    pub without_bounds: bool,
}

/// Which moment is explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Moment {
    /// The OOM a replay reports.
    Oom,
    /// A request chosen with `--at`.
    Event,
    /// The request that brought reserved memory to its peak.
    Peak,
}

/// The request examined.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub event_index: u64,
    pub requested_bytes: u64,
    /// The block size the model rounds it to (R).
    pub rounded_bytes: u64,
    /// The segment the model would ask the device for.
    pub segment_bytes: u64,
    pub stream: u64,
    pub pool: PoolId,
    /// Allocated at (the top user frame of its stack, or its size class).
    pub site: String,
    pub frames: Vec<String>,
}

/// A live block beside a hole.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Neighbour {
    pub addr: u64,
    pub bytes: u64,
    pub state: LayoutBlockState,
    pub site: Option<String>,
    /// The event that allocated it (None for a block of the start state the trace does not
    /// show being allocated).
    pub allocated_at_event: Option<u64>,
}

/// A free block of the request's pool and stream.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hole {
    pub bytes: u64,
    pub addr: u64,
    pub segment_addr: u64,
    /// The free that opened it: the last free (`free_requested` event) whose block lies
    /// in it. None when nothing freed into it since its segment was created.
    pub opened_at_event: Option<u64>,
    /// That free's stack, innermost first (at most [`MAX_FRAMES`]).
    pub frames: Vec<String>,
    /// Where the freed block had been allocated.
    pub freed_block_site: Option<String>,
    pub before: Option<Neighbour>,
    pub after: Option<Neighbour>,
}

/// How the blockers let the request fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockerKind {
    /// Removing them leaves a free run ≥ the rounded request inside the segment.
    Window,
    /// Removing them lets the segment be released, making room for a new one.
    Release,
}

/// The smallest set of live blocks whose absence would let the request fit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlockerSet {
    pub kind: BlockerKind,
    pub segment_addr: u64,
    pub segment_bytes: u64,
    pub blocks: usize,
    pub bytes: u64,
    /// Window: the free run their absence leaves (with the free blocks beside it).
    /// Release: the room for a new segment once the segment is released (capacity −
    /// reserved + its size).
    pub would_free_contiguous_bytes: u64,
    /// Window: the free bytes inside the run, split into holes each smaller than the
    /// rounded request. Release: the free bytes of the segment.
    pub free_bytes: u64,
}

/// The blockers allocated at one site.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Blocker {
    pub site: String,
    pub blocks: usize,
    pub bytes: u64,
    /// The longest free run of the segment if these blocks alone were gone.
    pub would_free_contiguous_bytes: u64,
    /// The events that allocated them, in order.
    pub events: Vec<u64>,
    pub addrs: Vec<u64>,
    /// Free bytes of the holes right beside them.
    pub adjacent_free_bytes: u64,
    pub sentence: String,
}

/// What would have fit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WouldFit {
    /// The best PyTorch setting of the sweep (`whatif::recommend`) when it serves every
    /// request ("" is PyTorch's defaults); None when none does.
    pub best_config: Option<String>,
    pub best_peak_reserved_bytes: u64,
    pub candidates_tried: usize,
    /// The smallest capacity on the 2 MiB grid at which the explained model serves every
    /// request (None when it fails even without a cap).
    pub min_capacity_bytes: Option<u64>,
    pub best_sentence: String,
    pub min_capacity_sentence: String,
}

/// The answer of [`explain`]: the contract type `allocsim explain --json` prints.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Explanation {
    pub at_event: u64,
    pub moment: Moment,
    /// Index of the op explained in the trace's request list.
    #[serde(skip)]
    pub op_index: usize,
    /// PyTorch's own OOM sentence (at an OOM of the PyTorch model).
    pub pytorch_message: Option<String>,
    /// Our sentence: the request, the holes it met, the largest.
    pub sentence: String,
    pub request: Request,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub capacity_bytes: Option<u64>,
    /// Every hole of the pool and stream (the list holds the largest [`MAX_HOLES`]).
    pub holes_count: usize,
    pub holes_bytes: u64,
    pub largest_hole_bytes: u64,
    pub holes: Vec<Hole>,
    /// Bytes of the cached default-pool segments with no live block, which the allocator
    /// releases (and retries) before it gives up.
    pub releasable_cached_bytes: u64,
    /// Whether the request fits as things are: in a hole (or free run) of its pool and
    /// stream, or in a new segment once the cached segments are released.
    pub fits_without_blockers: bool,
    /// None when [`Explanation::fits_without_blockers`] (or no set of live blocks would
    /// make room).
    pub blocker_set: Option<BlockerSet>,
    pub blockers: Vec<Blocker>,
    pub would_fit: Option<WouldFit>,
    pub live_peak_bytes: u64,
    pub offline_peak_bytes: u64,
    /// The layout at the moment explained (for views and tests; not in the JSON).
    #[serde(skip)]
    pub layout: Layout,
}

/// Explains device `device` of `trace` under the model `spec` and `capacity`; the what-if
/// replays run on `runner`, `progress` reports them.
pub fn explain(
    trace: &Trace,
    device: usize,
    spec: &ModelSpec,
    capacity: Option<u64>,
    opts: ExplainOptions,
    runner: &dyn whatif::Runner,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Explanation, Error> {
    let dt = trace
        .devices
        .get(device)
        .ok_or(Error::Query(QueryError::NoDevice { device }))?;
    let replay_opts = ReplayOptions {
        checkpoint_every: 0,
        keep_timeline: true,
        ..ReplayOptions::default()
    };
    let r = session::replay_device(trace, device, spec, capacity, replay_opts)?;
    let (op_index, moment) = target(
        dt,
        r.oom.as_ref(),
        &r.timeline.reserved_bytes,
        opts.at_event,
    )?;
    let oom_report = r.ooms.iter().find(|o| o.op_index == op_index);
    let moment = if moment == Moment::Peak || oom_report.is_none() {
        moment
    } else {
        Moment::Oom
    };
    let state = step_to(
        trace,
        device,
        spec,
        capacity,
        op_index,
        oom_report.is_some(),
    )?;
    let frames = &trace.snapshot.frames;
    let op = &dt.ops[op_index];
    let OpKind::Alloc {
        size_bytes,
        stream,
        pool,
        ..
    } = op.kind
    else {
        return Err(Error::Query(QueryError::NotAnAllocation { op: op_index }));
    };
    let pool = dt.pool(pool);
    let pytorch = match spec.resolve(&trace.snapshot.settings)? {
        ResolvedModel::Pytorch(cfg) => Some(PyTorchModel::new(cfg, capacity)),
        _ => None,
    };
    let (rounded, segment_bytes) = match (&state.oom, &pytorch) {
        (Some(info), _) => (info.rounded_bytes, info.alloc_bytes),
        (None, Some(m)) => {
            let r = m.round_size(size_bytes);
            (r, m.allocation_size(r))
        }
        (None, None) => {
            let r = offline::rounded_bytes(size_bytes);
            (r, r)
        }
    };
    let request = Request {
        event_index: u64::from(op.event_index),
        requested_bytes: size_bytes,
        rounded_bytes: rounded,
        segment_bytes,
        stream,
        pool,
        site: site_of(frames, op.stack, size_bytes),
        frames: stack_text(frames, op.stack),
    };
    let layout = state.model.layout();
    let totals = state.model.stats();
    let small = pytorch.as_ref().map(|_| rounded <= SMALL_SIZE_BYTES);
    let mine: Vec<&LayoutSegment> = layout
        .segments
        .iter()
        .filter(|s| s.pool == pool && s.stream == stream && small.is_none_or(|sm| s.small == sm))
        .collect();
    let ctx = Ctx {
        trace: dt,
        frames,
        live: &state.live,
        painter: &state.painter,
    };
    let mut holes: Vec<Hole> = mine
        .iter()
        .flat_map(|s| {
            s.blocks
                .iter()
                .enumerate()
                .filter(|(_, b)| b.state == LayoutBlockState::Free)
                .map(|(i, _)| ctx.hole(s, i))
        })
        .collect();
    holes.sort_by_key(|h| (std::cmp::Reverse(h.bytes), h.addr));
    let holes_count = holes.len();
    let holes_bytes = holes.iter().map(|h| h.bytes).sum();
    let largest_hole_bytes = holes.first().map_or(0, |h| h.bytes);
    holes.truncate(MAX_HOLES);
    let releasable_cached_bytes: u64 = layout
        .segments
        .iter()
        .filter(|s| releasable(s) && !s.blocks.iter().any(is_live))
        .map(|s| s.size_bytes)
        .sum();
    let reserved_after_release = totals
        .reserved_bytes
        .saturating_sub(releasable_cached_bytes);
    let found = blockers(
        &mine,
        &layout,
        rounded,
        segment_bytes,
        capacity,
        reserved_after_release,
    );
    let fits_without_blockers = matches!(found, Found::Fits)
        || capacity.is_some_and(|c| {
            moment != Moment::Oom && c.saturating_sub(reserved_after_release) >= segment_bytes
        });
    let (blocker_set, blockers) = match found {
        Found::Set(c) if !fits_without_blockers => {
            let groups = ctx.group(&c, rounded);
            (Some(c.set), groups)
        }
        _ => (None, Vec::new()),
    };
    let best = if opts.without_bounds {
        BestPossible {
            live_peak_bytes: 0,
            offline_peak_bytes: 0,
        }
    } else {
        offline::best_possible(dt)
    };
    let sentence = moment_sentence(
        moment,
        &request,
        holes_count,
        holes_bytes,
        largest_hole_bytes,
    );
    let would_fit = if opts.what_if {
        Some(would_fit(trace, device, spec, capacity, runner, progress)?)
    } else {
        None
    };
    Ok(Explanation {
        at_event: request.event_index,
        moment,
        op_index,
        pytorch_message: oom_report.and_then(|o| o.pytorch_message.clone()),
        sentence,
        request,
        reserved_bytes: totals.reserved_bytes,
        allocated_bytes: totals.allocated_bytes,
        capacity_bytes: capacity,
        holes_count,
        holes_bytes,
        largest_hole_bytes,
        holes,
        releasable_cached_bytes,
        fits_without_blockers,
        blocker_set,
        blockers,
        would_fit,
        live_peak_bytes: best.live_peak_bytes,
        offline_peak_bytes: best.offline_peak_bytes,
        layout,
    })
}

impl Explanation {
    /// The bounds of the trace, as [`offline::best_possible`] gives them.
    #[must_use]
    pub fn best_possible(&self) -> BestPossible {
        BestPossible {
            live_peak_bytes: self.live_peak_bytes,
            offline_peak_bytes: self.offline_peak_bytes,
        }
    }
}

/// The op to explain: `--at`'s request, the reported OOM, or the peak's request.
fn target(
    dt: &DeviceTrace,
    oom: Option<&OomReport>,
    reserved: &crate::metrics::Column,
    at_event: Option<u64>,
) -> Result<(usize, Moment), Error> {
    let first_alloc_from = |k: usize| (k..dt.ops.len()).find(|&j| dt.ops[j].is_alloc());
    if let Some(at) = at_event {
        if at >= dt.events as u64 {
            return Err(Error::Query(QueryError::EventOutOfRange {
                at,
                device: dt.device,
                events: dt.events,
            }));
        }
        let k = dt
            .ops
            .partition_point(|o| u64::from(o.event_index) <= at)
            .saturating_sub(1);
        let j = first_alloc_from(k).ok_or(Error::Query(QueryError::NoAllocationFrom { at }))?;
        return Ok((j, Moment::Event));
    }
    if let Some(o) = oom {
        return Ok((o.op_index, Moment::Oom));
    }
    let peak = reserved.iter().max().unwrap_or(0);
    let k = reserved.iter().position(|r| r == peak).unwrap_or(0);
    let j = (0..=k.min(dt.ops.len().saturating_sub(1)))
        .rev()
        .find(|&j| dt.ops.get(j).is_some_and(super::trace::Op::is_alloc))
        .or_else(|| first_alloc_from(k))
        .ok_or(Error::Query(QueryError::NoAllocation))?;
    Ok((j, Moment::Peak))
}

/// Address ranges and the last op that freed into each (None: fresh segment memory).
#[derive(Debug, Default)]
struct Painter {
    /// Start → (end, free op); disjoint.
    spans: BTreeMap<u64, (u64, Option<u32>)>,
}

impl Painter {
    fn paint(&mut self, start: u64, end: u64, op: Option<u32>) {
        if start >= end {
            return;
        }
        // Split a span that straddles `start`, then drop or trim those inside.
        if let Some((&s, &(e, o))) = self.spans.range(..start).next_back()
            && e > start
        {
            self.spans.insert(s, (start, o));
            self.spans.insert(start, (e, o));
        }
        let inside: Vec<u64> = self.spans.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            if let Some((e, o)) = self.spans.remove(&s)
                && e > end
            {
                self.spans.insert(end, (e, o));
            }
        }
        self.spans.insert(start, (end, op));
    }

    /// The latest free op painted anywhere in `[start, end)`.
    fn last_free(&self, start: u64, end: u64) -> Option<u32> {
        let before = self
            .spans
            .range(..start)
            .next_back()
            .filter(|(_, (e, _))| *e > start)
            .and_then(|(_, (_, o))| *o);
        self.spans
            .range(start..end)
            .filter_map(|(_, (_, o))| *o)
            .chain(before)
            .max()
    }
}

/// The model stepped to the moment explained, with what the replay learnt on the way.
struct State {
    model: Box<dyn crate::models::Allocator>,
    /// The failed malloc's report, at an OOM.
    oom: Option<crate::models::OomInfo>,
    /// Address of a live block → the alloc op that made it.
    live: HashMap<u64, u32>,
    painter: Painter,
}

/// Steps the ops before `op_index` (and `op_index` itself when `through`: the failed
/// malloc of an OOM) exactly as the replay does.
fn step_to(
    trace: &Trace,
    device: usize,
    spec: &ModelSpec,
    capacity: Option<u64>,
    op_index: usize,
    through: bool,
) -> Result<State, Error> {
    let dt = &trace.devices[device];
    let (mut model, mut dev, preloaded) = session::start_model(trace, device, spec, capacity)?;
    let mut stepper = OpStepper::new(dt, preloaded);
    let mut out = Vec::new();
    let mut live: HashMap<u64, u32> = HashMap::new();
    let mut painter = Painter::default();
    // Address → (block bytes, free op) of a free not yet completed.
    let mut freeing: HashMap<u64, (u64, u32)> = HashMap::new();
    let mut oom = None;
    let end = if through { op_index + 1 } else { op_index };
    for k in 0..end.min(dt.ops.len()) {
        out.clear();
        let before = model.stats().allocated_bytes;
        let freed_addr = match dt.ops[k].kind {
            OpKind::Free { alloc, .. } => stepper.held_addr(dt, alloc as usize),
            _ => None,
        };
        let step = stepper.step(dt, k, model.as_mut(), &mut dev, &mut out);
        let k32 = u32::try_from(k).unwrap_or(u32::MAX);
        match step {
            Step::Served(a) if stepper.held_addr(dt, k).is_some() => {
                live.insert(a, k32);
            }
            Step::Oom { info, .. } if k == op_index => oom = Some(info),
            _ => {}
        }
        if let Some(a) = freed_addr {
            let bytes = before.saturating_sub(model.stats().allocated_bytes);
            freeing.insert(a, (bytes, k32));
        }
        for e in &out {
            match e.action {
                Action::FreeCompleted => {
                    if let Some((bytes, free_op)) = freeing.remove(&e.addr) {
                        painter.paint(e.addr, e.addr + bytes, Some(free_op));
                        live.remove(&e.addr);
                    }
                }
                Action::SegmentAlloc | Action::SegmentMap => {
                    painter.paint(e.addr, e.addr + e.size, None);
                }
                _ => {}
            }
        }
    }
    Ok(State {
        model,
        oom,
        live,
        painter,
    })
}

/// What the hole and blocker descriptions read.
struct Ctx<'a> {
    trace: &'a DeviceTrace,
    frames: &'a FrameTable,
    live: &'a HashMap<u64, u32>,
    painter: &'a Painter,
}

impl Ctx<'_> {
    fn neighbour(&self, b: Option<&LayoutBlock>) -> Option<Neighbour> {
        let b = b.filter(|b| {
            matches!(
                b.state,
                LayoutBlockState::Allocated | LayoutBlockState::PendingFree
            )
        })?;
        let op = self.live.get(&b.addr).map(|&k| &self.trace.ops[k as usize]);
        Some(Neighbour {
            addr: b.addr,
            bytes: b.size_bytes,
            state: b.state,
            site: Some(self.site_of_block(b)),
            allocated_at_event: op.map(|o| u64::from(o.event_index)),
        })
    }

    fn site_of_block(&self, b: &LayoutBlock) -> String {
        let stack = self
            .live
            .get(&b.addr)
            .map_or(StackId::EMPTY, |&k| self.trace.ops[k as usize].stack);
        site_of(self.frames, stack, b.size_bytes)
    }

    fn hole(&self, seg: &LayoutSegment, i: usize) -> Hole {
        let b = &seg.blocks[i];
        let opener = self
            .painter
            .last_free(b.addr, b.addr + b.size_bytes)
            .map(|k| &self.trace.ops[k as usize]);
        let freed_block_site = opener.and_then(|o| match o.kind {
            OpKind::Free { alloc, .. } => self.trace.ops.get(alloc as usize).map(|a| {
                let size = match a.kind {
                    OpKind::Alloc { size_bytes, .. } => size_bytes,
                    _ => 0,
                };
                site_of(self.frames, a.stack, size)
            }),
            _ => None,
        });
        Hole {
            bytes: b.size_bytes,
            addr: b.addr,
            segment_addr: seg.addr,
            opened_at_event: opener.map(|o| u64::from(o.event_index)),
            frames: opener.map_or_else(Vec::new, |o| stack_text(self.frames, o.stack)),
            freed_block_site,
            before: self.neighbour(i.checked_sub(1).and_then(|j| seg.blocks.get(j))),
            after: self.neighbour(seg.blocks.get(i + 1)),
        }
    }

    /// The blockers of `c` grouped by site, ranked.
    fn group(&self, c: &Candidate, rounded: u64) -> Vec<Blocker> {
        let seg = &c.segment;
        let mut by_site: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for &i in &c.blocks {
            by_site
                .entry(self.site_of_block(&seg.blocks[i]))
                .or_default()
                .push(i);
        }
        let mut out: Vec<Blocker> = by_site
            .into_iter()
            .map(|(site, idx)| {
                let gone = |i: usize| idx.contains(&i);
                let contiguous = longest_run(&seg.blocks, gone);
                let mut adjacent: Vec<usize> = idx
                    .iter()
                    .flat_map(|&i| [i.checked_sub(1), Some(i + 1)])
                    .flatten()
                    .filter(|&j| {
                        seg.blocks
                            .get(j)
                            .is_some_and(|b| b.state == LayoutBlockState::Free)
                    })
                    .collect();
                adjacent.sort_unstable();
                adjacent.dedup();
                let adjacent_free_bytes = adjacent.iter().map(|&j| seg.blocks[j].size_bytes).sum();
                let bytes = idx.iter().map(|&i| seg.blocks[i].size_bytes).sum();
                let mut events: Vec<u64> = idx
                    .iter()
                    .filter_map(|&i| self.live.get(&seg.blocks[i].addr))
                    .map(|&k| u64::from(self.trace.ops[k as usize].event_index))
                    .collect();
                events.sort_unstable();
                let n = idx.len();
                let blocks_word = if n == 1 { "block" } else { "blocks" };
                let sentence = match c.set.kind {
                    BlockerKind::Window => format!(
                        "{n} {blocks_word} ({}) allocated at {site} split {} of free space into holes under {}; without them the largest free run of the segment at {:#x} would be {}",
                        format_size(bytes),
                        format_size(adjacent_free_bytes),
                        format_size(rounded),
                        seg.addr,
                        format_size(contiguous)
                    ),
                    BlockerKind::Release => format!(
                        "{n} {blocks_word} ({}) allocated at {site} keep the {} segment at {:#x} from being released",
                        format_size(bytes),
                        format_size(seg.size_bytes),
                        seg.addr
                    ),
                };
                Blocker {
                    site,
                    blocks: n,
                    bytes,
                    would_free_contiguous_bytes: contiguous,
                    events,
                    addrs: idx.iter().map(|&i| seg.blocks[i].addr).collect(),
                    adjacent_free_bytes,
                    sentence,
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.would_free_contiguous_bytes
                .cmp(&a.would_free_contiguous_bytes)
                .then(b.bytes.cmp(&a.bytes))
                .then(a.site.cmp(&b.site))
        });
        out
    }
}

fn is_live(b: &LayoutBlock) -> bool {
    matches!(
        b.state,
        LayoutBlockState::Allocated | LayoutBlockState::PendingFree
    )
}

/// The longest run of free blocks (and blocks `gone` says are removed) of a segment.
#[must_use]
pub fn longest_run(blocks: &[LayoutBlock], gone: impl Fn(usize) -> bool) -> u64 {
    let (mut best, mut run) = (0, 0);
    for (i, b) in blocks.iter().enumerate() {
        if b.state == LayoutBlockState::Free || (is_live(b) && gone(i)) {
            run += b.size_bytes;
            best = best.max(run);
        } else {
            run = 0;
        }
    }
    best
}

/// A blocker set and the segment it lies in.
struct Candidate {
    set: BlockerSet,
    segment: LayoutSegment,
    /// Indexes of its live blocks in `segment.blocks`.
    blocks: Vec<usize>,
}

/// The smallest window of `seg`'s blocks (no unmapped block inside) whose bytes reach
/// `rounded`, by live bytes, then live blocks, then address: (first, last, live bytes,
/// live blocks).
fn best_window(seg: &LayoutSegment, rounded: u64) -> Option<(usize, usize, u64, usize)> {
    let b = &seg.blocks;
    let mut best: Option<(usize, usize, u64, usize)> = None;
    // Each run of mapped blocks on its own: a window cannot cross an unmapped block.
    let mut start = 0;
    while start < b.len() {
        let end = (start..b.len())
            .find(|&k| b[k].state == LayoutBlockState::Unmapped)
            .unwrap_or(b.len());
        let (mut total, mut live_bytes, mut live_n) = (0u64, 0u64, 0usize);
        let mut j = start; // one past the window's last block
        for i in start..end {
            while j < end && total < rounded {
                total += b[j].size_bytes;
                if is_live(&b[j]) {
                    live_bytes += b[j].size_bytes;
                    live_n += 1;
                }
                j += 1;
            }
            if total < rounded {
                break;
            }
            if best.is_none_or(|(_, _, lb, ln)| (live_bytes, live_n) < (lb, ln)) {
                best = Some((i, j - 1, live_bytes, live_n));
            }
            total -= b[i].size_bytes;
            if is_live(&b[i]) {
                live_bytes -= b[i].size_bytes;
                live_n -= 1;
            }
        }
        start = end + 1;
    }
    best
}

/// What [`blockers`] found.
enum Found {
    /// A hole (or free run) of the pool and stream already holds the request.
    Fits,
    Set(Candidate),
    /// No set of live blocks would make room.
    Nothing,
}

/// A segment whose release returns memory to the device: a default-pool cudaMalloc
/// (private pools keep theirs until the pool is released; expandable segments unmap pages).
fn releasable(seg: &LayoutSegment) -> bool {
    seg.pool == PoolId::DEFAULT && !seg.expandable
}

/// The blocker set (see the module doc). `reserved` is the reserved memory once the
/// cached segments without live blocks are released.
fn blockers(
    mine: &[&LayoutSegment],
    layout: &Layout,
    rounded: u64,
    segment_bytes: u64,
    capacity: Option<u64>,
    reserved: u64,
) -> Found {
    let mut best: Option<Candidate> = None;
    let better = |c: &Candidate, best: &Option<Candidate>| {
        best.as_ref().is_none_or(|b| {
            (c.set.bytes, c.set.blocks, c.set.segment_addr)
                < (b.set.bytes, b.set.blocks, b.set.segment_addr)
        })
    };
    for seg in mine {
        let Some((i, j, live_bytes, live_n)) = best_window(seg, rounded) else {
            continue;
        };
        if live_n == 0 {
            return Found::Fits;
        }
        let (mut lo, mut hi) = (i, j);
        while lo > 0 && seg.blocks[lo - 1].state == LayoutBlockState::Free {
            lo -= 1;
        }
        while hi + 1 < seg.blocks.len() && seg.blocks[hi + 1].state == LayoutBlockState::Free {
            hi += 1;
        }
        let run: &[LayoutBlock] = &seg.blocks[lo..=hi];
        let c = Candidate {
            set: BlockerSet {
                kind: BlockerKind::Window,
                segment_addr: seg.addr,
                segment_bytes: seg.size_bytes,
                blocks: live_n,
                bytes: live_bytes,
                would_free_contiguous_bytes: run.iter().map(|b| b.size_bytes).sum(),
                free_bytes: run
                    .iter()
                    .filter(|b| b.state == LayoutBlockState::Free)
                    .map(|b| b.size_bytes)
                    .sum(),
            },
            segment: (*seg).clone(),
            blocks: (i..=j).filter(|&k| is_live(&seg.blocks[k])).collect(),
        };
        if better(&c, &best) {
            best = Some(c);
        }
    }
    if let Some(cap) = capacity {
        for seg in &layout.segments {
            let live: Vec<usize> = (0..seg.blocks.len())
                .filter(|&k| is_live(&seg.blocks[k]))
                .collect();
            let room = cap.saturating_sub(reserved.saturating_sub(seg.size_bytes));
            if !releasable(seg) || live.is_empty() || room < segment_bytes {
                continue;
            }
            let c = Candidate {
                set: BlockerSet {
                    kind: BlockerKind::Release,
                    segment_addr: seg.addr,
                    segment_bytes: seg.size_bytes,
                    blocks: live.len(),
                    bytes: live.iter().map(|&k| seg.blocks[k].size_bytes).sum(),
                    would_free_contiguous_bytes: room,
                    free_bytes: seg
                        .blocks
                        .iter()
                        .filter(|b| b.state == LayoutBlockState::Free)
                        .map(|b| b.size_bytes)
                        .sum(),
                },
                segment: seg.clone(),
                blocks: live,
            };
            if better(&c, &best) {
                best = Some(c);
            }
        }
    }
    best.map_or(Found::Nothing, Found::Set)
}

/// The stack as text, innermost first, at most [`MAX_FRAMES`] frames.
fn stack_text(frames: &FrameTable, stack: StackId) -> Vec<String> {
    let mut v = frames.format_stack(stack);
    v.truncate(MAX_FRAMES);
    v
}

/// An allocation site: the top user frame of the stack as `file.py:LINE function`
/// (frames of torch's own package skipped when the stack has other Python frames), else the first
/// frame, else the size class of `size_bytes`.
#[must_use]
pub fn site_of(frames: &FrameTable, stack: StackId, size_bytes: u64) -> String {
    let all: Vec<_> = frames
        .stack(stack)
        .iter()
        .filter_map(|&f| frames.frame(f))
        .collect();
    let file = |f: &crate::snapshot::Frame| frames.str(f.filename).to_string();
    let python = |f: &&&crate::snapshot::Frame| file(f).to_ascii_lowercase().ends_with(".py");
    let internal = |f: &&&crate::snapshot::Frame| {
        let name = file(f);
        // `site-packages/torch/…`, `dist-packages/torch/…`, or a path relative to torch's
        // own tree; not any path that merely has a `torch` folder (a venv in /opt/torch).
        name.contains("-packages/torch/") || name.starts_with("torch/")
    };
    let pick = all
        .iter()
        .find(|f| python(f) && !internal(f))
        .or_else(|| all.iter().find(|f| python(f)))
        .or_else(|| all.first());
    match pick {
        Some(f) => {
            let path = file(f);
            let base = path.rsplit('/').next().unwrap_or(&path);
            format!("{base}:{} {}", frames.line_label(f), frames.str(f.name))
        }
        None => size_class(size_bytes),
    }
}

/// `size class [2^k, 2^(k+1))` of a block without stack frames.
fn size_class(bytes: u64) -> String {
    let lo = if bytes == 0 { 0 } else { 1u64 << bytes.ilog2() };
    format!(
        "size class {}–{} (no stack frames)",
        format_size(lo),
        format_size(lo.saturating_mul(2))
    )
}

fn moment_sentence(
    moment: Moment,
    req: &Request,
    holes: usize,
    holes_bytes: u64,
    largest: u64,
) -> String {
    let when = match moment {
        Moment::Oom => "At the out-of-memory",
        Moment::Event => "At the chosen event",
        Moment::Peak => "At the peak of reserved memory",
    };
    format!(
        "{when} (event {}), a request of {} (a {} block) from {} on stream {} met {} of free space in {holes} holes of its pool and stream, the largest {}",
        req.event_index,
        format_size(req.requested_bytes),
        format_size(req.rounded_bytes),
        req.site,
        req.stream,
        format_size(holes_bytes),
        format_size(largest)
    )
}

fn would_fit(
    trace: &Trace,
    device: usize,
    spec: &ModelSpec,
    capacity: Option<u64>,
    runner: &dyn whatif::Runner,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<WouldFit, Error> {
    let rec = whatif::recommend_with(trace, device, capacity, runner, progress)?;
    let cap_text = capacity.map_or_else(
        || "without a capacity".to_string(),
        |c| format!("under {}", format_size(c)),
    );
    let serves = whatif::served_all(&rec.best);
    let best_config = serves.then(|| rec.best.config.clone());
    let best_sentence = match &best_config {
        Some(c) if c.is_empty() => format!(
            "PyTorch's defaults serve every request {cap_text} (peak reserved {}; {} settings tried)",
            format_size(rec.best.peak_reserved_bytes),
            rec.candidates_tried
        ),
        Some(c) => format!(
            "With PYTORCH_CUDA_ALLOC_CONF={c} every request is served {cap_text} (peak reserved {}; {} settings tried)",
            format_size(rec.best.peak_reserved_bytes),
            rec.candidates_tried
        ),
        None => format!(
            "None of the {} PyTorch settings tried serves every request {cap_text}",
            rec.candidates_tried
        ),
    };
    let min = whatif::min_capacity(trace, device, spec, progress).ok();
    let min_capacity_sentence = match &min {
        Some(m) => format!(
            "The smallest capacity at which {} serves every request is {}",
            spec.label(),
            format_size(m.min_capacity_bytes)
        ),
        None => format!(
            "{} runs out of memory even without a capacity",
            spec.label()
        ),
    };
    Ok(WouldFit {
        best_config,
        best_peak_reserved_bytes: rec.best.peak_reserved_bytes,
        candidates_tried: rec.candidates_tried,
        min_capacity_bytes: min.map(|m| m.min_capacity_bytes),
        best_sentence,
        min_capacity_sentence,
    })
}
