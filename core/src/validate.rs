//! `validate`: the PyTorch model on the recorded device, compared event by event with what
//! PyTorch really did — and, in the same pass, the inference of what the snapshot leaves
//! implicit (private pools, `empty_cache()` points), which builds the replayable
//! [`DeviceTrace`].

use std::collections::{BTreeMap, HashMap};

use crate::device::{Device, DeviceOom, SimulatedDevice};
use crate::models::pytorch::{MIN_BLOCK_BYTES, PyTorchConfig, PyTorchModel};
use crate::models::{AllocRequest, Allocator, ConfigError, LayoutBlockState, ModelEvent, PoolId};
use crate::snapshot::{Action, BlockState, RawEvent, RawSnapshot, SegmentType};
use crate::trace::{DeviceTrace, Inference, Op, OpKind, StartSegment, Trace, TraceError};

/// The recorded device: hands out the addresses of the recording's own segment events for
/// the malloc being replayed. With `oracle`, it refuses a segment request exactly where the
/// recording shows that malloc went down the out-of-memory path (a release is recorded
/// before the next segment, or nothing is recorded at all).
#[derive(Debug, Clone)]
pub struct RecordedDevice {
    group: Vec<RawEvent>,
    cursor: usize,
    oracle: bool,
    synth: SimulatedDevice,
}

impl RecordedDevice {
    fn new(group: Vec<RawEvent>, oracle: bool, synth: SimulatedDevice) -> RecordedDevice {
        RecordedDevice {
            group,
            cursor: 0,
            oracle,
            synth,
        }
    }

    fn peek(&self) -> Option<&RawEvent> {
        self.group.get(self.cursor)
    }
}

impl Device for RecordedDevice {
    fn malloc(&mut self, size: u64, stream: u64) -> Result<u64, DeviceOom> {
        match self.peek().copied() {
            Some(e) if e.action == Action::SegmentAlloc => {
                self.cursor += 1;
                if e.size == size {
                    Ok(e.addr)
                } else {
                    self.synth.malloc(size, stream)
                }
            }
            _ if self.oracle => Err(DeviceOom),
            _ => self.synth.malloc(size, stream),
        }
    }

    fn free(&mut self, addr: u64, _size: u64) {
        if self
            .peek()
            .is_some_and(|e| e.action == Action::SegmentFree && e.addr == addr)
        {
            self.cursor += 1;
        }
    }

    fn reserve(&mut self, size: u64, page: u64, stream: u64) -> Result<u64, DeviceOom> {
        match self.peek() {
            Some(e) if e.action == Action::SegmentMap => Ok(e.addr),
            _ if self.oracle => Err(DeviceOom),
            _ => self.synth.reserve(size, page, stream),
        }
    }

    fn release(&mut self, _addr: u64, _size: u64) {}

    fn map(&mut self, _addr: u64, _size: u64, _stream: u64) -> Result<(), DeviceOom> {
        match self.peek().copied() {
            Some(e) if e.action == Action::SegmentMap => {
                self.cursor += 1;
                Ok(())
            }
            _ if self.oracle => Err(DeviceOom),
            _ => Ok(()),
        }
    }

    fn unmap(&mut self, addr: u64, _size: u64) {
        if self
            .peek()
            .is_some_and(|e| e.action == Action::SegmentUnmap && e.addr == addr)
        {
            self.cursor += 1;
        }
    }

    fn free_bytes(&self) -> u64 {
        self.group
            .iter()
            .rev()
            .find(|e| e.action == Action::Oom)
            .map_or(0, |e| e.addr)
    }
}

/// A recorded or simulated event in a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EventView {
    pub action: &'static str,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}

impl EventView {
    fn recorded(e: &RawEvent) -> EventView {
        EventView {
            action: e.action.as_str(),
            addr: e.addr,
            size: e.size,
            stream: e.stream,
        }
    }
    fn simulated(e: &ModelEvent) -> EventView {
        EventView {
            action: e.action.as_str(),
            addr: e.addr,
            size: e.size,
            stream: e.stream,
        }
    }
}

/// Where the simulation first left the recording.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Divergence {
    pub device: u32,
    /// Index into `device_traces[device]`.
    pub event_index: usize,
    pub recorded: Option<EventView>,
    pub simulated: Option<EventView>,
    pub context: String,
}

/// The validation of one device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceReport {
    pub device: u32,
    pub exact: bool,
    pub events_compared: u64,
    pub events_matched: u64,
    pub end_state_matches: bool,
    pub end_state_difference: Option<String>,
    pub first_divergence: Option<Divergence>,
    pub peak_reserved_recorded: u64,
    pub peak_reserved_simulated: u64,
    pub inferred: Vec<Inference>,
    pub starts_empty: bool,
}

fn compared(a: Action) -> bool {
    matches!(
        a,
        Action::Alloc
            | Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap
            | Action::Oom
    )
}

fn same(r: &RawEvent, s: &ModelEvent) -> bool {
    r.action == s.action
        && r.size == s.size
        && r.stream == s.stream
        && (r.action == Action::Oom || r.addr == s.addr)
}

/// How a group of recorded events with leading segment releases is explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interp {
    /// The malloc itself released them (GC or the OOM ladder).
    Ladder,
    /// An `empty_cache()` released them, then the malloc ran.
    EmptyFirst,
}

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

struct Annotator<'a> {
    snap: &'a RawSnapshot,
    device: u32,
    events: &'a [RawEvent],
    capacity: Option<u64>,
    model: PyTorchModel,
    synth: SimulatedDevice,
    ops: Vec<Op>,
    inferred: Vec<Inference>,
    live: HashMap<u64, u32>,
    pending: HashMap<u64, u32>,
    scope: BTreeMap<u64, PoolId>,
    renames: BTreeMap<PoolId, PoolId>,
    next_provisional: u64,
    compared: u64,
    matched: u64,
    divergence: Option<Divergence>,
    peak_sim: u64,
    /// Every segment created so far, in event order (see [`Self::revision`]).
    creations: Vec<Creation>,
    /// The pool choices revisited in this pass, by the index of the group's last event.
    revised: BTreeMap<usize, Revision>,
    /// The ops of the blocks alive at the start (the first ops).
    initial_ops: usize,
}

impl Annotator<'_> {
    fn err(&self, i: usize, m: String) -> TraceError {
        TraceError {
            device: self.device,
            event_index: i,
            message: m,
        }
    }

    fn op(&mut self, i: usize, kind: OpKind, recorded_addr: u64) -> u32 {
        let e = &self.events[i];
        self.ops.push(Op {
            kind,
            event_index: i as u32,
            recorded_addr,
            stack: e.stack,
            time_us: e.time_us,
        });
        (self.ops.len() - 1) as u32
    }

    fn note_peak(&mut self) {
        self.peak_sim = self.peak_sim.max(self.model.stats().reserved_bytes);
    }

    /// Compares the model's events with the recorded slice; counts and keeps the first
    /// divergence.
    fn compare(
        &mut self,
        first: usize,
        recorded: &[RawEvent],
        out: &[ModelEvent],
        context: &dyn Fn() -> String,
    ) {
        let rec: Vec<(usize, &RawEvent)> = recorded
            .iter()
            .enumerate()
            .filter(|(_, e)| compared(e.action))
            .map(|(k, e)| (first + k, e))
            .collect();
        let sim: Vec<&ModelEvent> = out.iter().filter(|e| compared(e.action)).collect();
        self.compared += rec.len() as u64;
        let mut bad: Option<(usize, Option<EventView>, Option<EventView>)> = None;
        for k in 0..rec.len().max(sim.len()) {
            match (rec.get(k), sim.get(k)) {
                (Some((_, r)), Some(s)) if same(r, s) => self.matched += 1,
                (r, s) => {
                    if bad.is_none() {
                        let idx =
                            r.map_or_else(|| first + recorded.len().saturating_sub(1), |(i, _)| *i);
                        bad = Some((
                            idx,
                            r.map(|(_, e)| EventView::recorded(e)),
                            s.map(|e| EventView::simulated(e)),
                        ));
                    }
                }
            }
        }
        if let (Some((idx, r, s)), None) = (bad, &self.divergence) {
            self.divergence = Some(Divergence {
                device: self.device,
                event_index: idx,
                recorded: r,
                simulated: s,
                context: context(),
            });
        }
    }

    fn matches(recorded: &[RawEvent], out: &[ModelEvent]) -> bool {
        let mut r = recorded.iter().filter(|e| compared(e.action));
        let mut s = out.iter().filter(|e| compared(e.action));
        loop {
            match (r.next(), s.next()) {
                (None, None) => return true,
                (Some(a), Some(b)) if same(a, b) => {}
                _ => return false,
            }
        }
    }

    fn segment_group(&self, from: usize, to: usize) -> Vec<RawEvent> {
        self.events[from..to]
            .iter()
            .filter(|e| compared(e.action) && e.action != Action::Alloc)
            .copied()
            .collect()
    }

    /// Runs one interpretation of a malloc group on `model`.
    fn run_malloc(
        &self,
        model: &mut PyTorchModel,
        interp: Interp,
        req: &AllocRequest,
        group: &[RawEvent],
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, ()> {
        let mut dev =
            RecordedDevice::new(group.to_vec(), self.capacity.is_none(), self.synth.clone());
        if interp == Interp::EmptyFirst {
            model.empty_cache(&mut dev, out);
        }
        model.malloc(&mut dev, req, out).map_err(|_| ())
    }

    fn end_state_pool(&self, addr: u64) -> Option<PoolId> {
        self.snap
            .segments
            .iter()
            .filter(|s| s.device == self.device)
            .find(|s| addr >= s.address && addr < s.address + s.total_size.max(1))
            .map(|s| PoolId(s.segment_pool_id.0, s.segment_pool_id.1))
    }

    fn release_private_pools_in(&mut self, i: usize, group: &[RawEvent]) {
        let mut seen = Vec::new();
        for e in group
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentFree | Action::SegmentUnmap))
        {
            if let Some((pool, _, _)) = self.model.segment_of(e.addr)
                && pool.is_private()
                && !seen.contains(&pool)
            {
                seen.push(pool);
            }
        }
        for pool in seen {
            self.model.release_pool(pool);
            self.op(i, OpKind::ReleasePool { pool }, 0);
            self.inferred.push(Inference {
                event_index: i as u32,
                kind: "pool_released",
                detail: format!("private pool {pool:?} was released before event {i} (its cached segments are freed there)"),
            });
        }
    }

    fn malloc_group(&mut self, i: usize, j: usize) {
        let last = self.events[j];
        let is_oom = last.action == Action::Oom;
        let group_all = &self.events[i..=j];
        let seg_events = self.segment_group(i, j + 1);
        let leading_free = matches!(
            self.events[i].action,
            Action::SegmentFree | Action::SegmentUnmap
        );
        let first_new = seg_events
            .iter()
            .find(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
            .copied();
        let stream = last.stream;
        let scope = self.scope.get(&stream).copied().unwrap_or(PoolId::DEFAULT);
        // Which pools to try, most likely first.
        let mut pools: Vec<PoolId> = Vec::new();
        let mut known_from_end: Option<PoolId> = None;
        if !is_oom && first_new.is_none() {
            pools.push(self.model.segment_of(last.addr).map_or(scope, |s| s.0));
        } else if let Some(n) = first_new {
            match self.end_state_pool(n.addr) {
                Some(p) if p.is_private() => {
                    known_from_end = Some(p);
                    pools.push(p);
                }
                _ => {
                    if scope.is_private() {
                        pools.push(scope);
                    }
                    if !self.revised.contains_key(&j) {
                        pools.push(PoolId::DEFAULT);
                    }
                    pools.push(PoolId(u64::MAX, self.next_provisional));
                }
            }
        } else {
            pools.push(scope);
        }
        if let Some(p) = known_from_end {
            // The private pool the scope was using gets its real name now.
            if scope.is_private() && scope.0 == u64::MAX && !self.model.private_pools().contains(&p)
            {
                self.model.rename_pool(scope, p);
                self.renames.insert(scope, p);
                self.inferred.push(Inference {
                    event_index: j as u32,
                    kind: "private_pool",
                    detail: format!("the private pool used since earlier on stream {stream:#x} is {p:?} (its segment survives to the end)"),
                });
            }
        }
        let interps: Vec<Interp> = if !leading_free {
            vec![Interp::Ladder]
        } else if is_oom || self.capacity.is_some() {
            vec![Interp::Ladder, Interp::EmptyFirst]
        } else {
            vec![Interp::EmptyFirst, Interp::Ladder]
        };
        if leading_free {
            self.release_private_pools_in(i, group_all);
        }
        let combos: Vec<(Interp, PoolId)> = interps
            .iter()
            .flat_map(|&it| pools.iter().map(move |&p| (it, p)))
            .collect();
        let req_for = |p: PoolId| AllocRequest {
            size_bytes: last.size,
            stream,
            pool: p,
        };
        let mut chosen = combos[0];
        let mut out = Vec::new();
        let result;
        if combos.len() == 1 {
            let mut m = std::mem::replace(
                &mut self.model,
                PyTorchModel::new(PyTorchConfig::default(), None),
            );
            result = self.run_malloc(&mut m, chosen.0, &req_for(chosen.1), &seg_events, &mut out);
            self.model = m;
        } else {
            let mut found = None;
            for &(it, p) in &combos {
                let mut trial = self.model.clone();
                let mut o = Vec::new();
                let r = self.run_malloc(&mut trial, it, &req_for(p), &seg_events, &mut o);
                if Self::matches(group_all, &o) {
                    found = Some((it, p, trial, o, r));
                    break;
                }
            }
            if let Some((it, p, trial, o, r)) = found {
                chosen = (it, p);
                self.model = trial;
                out = o;
                result = r;
            } else {
                let mut m = self.model.clone();
                result =
                    self.run_malloc(&mut m, chosen.0, &req_for(chosen.1), &seg_events, &mut out);
                self.model = m;
            }
        }
        let (interp, pool) = chosen;
        let default_over_private =
            pool == PoolId::DEFAULT && pools.last().is_some_and(|p| p.is_private());
        for e in seg_events
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
        {
            self.creations.push(Creation {
                group_end: j,
                segment_addr: e.addr,
                default_over_private,
            });
        }
        let revision = self.revised.get(&j).copied().filter(|_| pool.is_private());
        let new_pool = pool.0 == u64::MAX && pool.1 == self.next_provisional;
        if new_pool {
            self.next_provisional += 1;
        }
        if let Some(r) = revision {
            self.inferred.push(Inference {
                event_index: j as u32,
                kind: "private_pool",
                detail: format!(
                    "the request of {} on stream {stream:#x} used a private pool (MemPool or CUDA graph): the default pool explains its own events as well, but then release_cached_blocks, which frees the default pools' cached segments before any private pool's, would free its segment {:#x} at event {} where the recording frees another",
                    crate::units::format_size(last.size),
                    r.segment_addr,
                    r.release_at
                ),
            });
        } else if new_pool {
            self.inferred.push(Inference {
                event_index: j as u32,
                kind: "private_pool",
                detail: format!(
                    "the request of {} on stream {stream:#x} cannot have come from the default pool: it used a private pool (MemPool or CUDA graph)",
                    crate::units::format_size(last.size)
                ),
            });
        }
        if interp == Interp::EmptyFirst {
            self.op(i, OpKind::EmptyCache, 0);
            self.inferred.push(Inference {
                event_index: i as u32,
                kind: "empty_cache",
                detail: format!("empty_cache() was called before event {i} (segment releases outside the malloc's own path)"),
            });
        }
        let dev = self.device;
        let hint = if leading_free && self.capacity.is_none() {
            if self.model.config().garbage_collection_threshold > 0.0 {
                "; unknown: the memory cap (not recorded in the snapshot) — the recording released only some cached segments, which garbage_collection_threshold does under a cap: pass --capacity"
            } else {
                "; unknown: the memory cap (not recorded in the snapshot): pass --capacity if the program set one"
            }
        } else {
            ""
        };
        let ctx = move || {
            format!(
                "device {dev}: malloc of {} ({} bytes) on stream {stream:#x}, pool {pool:?}{}{hint}",
                crate::units::format_size(last.size),
                last.size,
                if interp == Interp::EmptyFirst {
                    ", after an inferred empty_cache()"
                } else {
                    ""
                }
            )
        };
        self.compare(i, group_all, &out, &ctx);
        if !is_oom {
            self.scope.insert(stream, pool);
        }
        let op = self.op(
            j,
            OpKind::Alloc {
                size_bytes: last.size,
                stream,
                pool,
                recorded_oom: is_oom,
                restored: false,
            },
            if is_oom { 0 } else { last.addr },
        );
        if !is_oom {
            self.live.insert(last.addr, op);
        }
        if result.is_ok() == is_oom {
            // Already counted as a divergence by the comparison.
        }
        self.note_peak();
    }

    /// A CUDA-graph checkpoint restore of one segment (`setCheckpointPoolState` →
    /// `setSegmentStateToCheckpoint`, which records only ordinary `alloc`s and `free`s):
    /// from event `i`, allocs with nothing between them that tile a wholly free segment of
    /// a private pool from its base, each where the previous one ended, in block sizes —
    /// which mallocs do not reproduce. Returns the end of the run (exclusive), the pool and
    /// the stream.
    fn restore_run(&self, i: usize) -> Option<(usize, PoolId, u64)> {
        let first = self.events[i];
        if first.action != Action::Alloc {
            return None;
        }
        let (pool, stream, _) = self.model.segment_of(first.addr)?;
        if !pool.is_private() || stream != first.stream {
            return None;
        }
        let (segment_bytes, whole) = self.model.free_block_at(first.addr)?;
        if !whole {
            return None;
        }
        let end_addr = first.addr + segment_bytes;
        let mut at = first.addr;
        let mut end = i;
        while at < end_addr {
            let e = self.events.get(end)?;
            if e.action != Action::Alloc
                || e.addr != at
                || e.stream != stream
                || e.size == 0
                || e.size % MIN_BLOCK_BYTES != 0
            {
                return None;
            }
            at += e.size;
            end += 1;
        }
        if at != end_addr {
            return None;
        }
        // Mallocs first: a restore only where they cannot explain the run.
        let mut trial = self.model.clone();
        let mut dev = RecordedDevice::new(Vec::new(), self.capacity.is_none(), self.synth.clone());
        let mut out = Vec::new();
        for e in &self.events[i..end] {
            out.clear();
            let req = AllocRequest {
                size_bytes: e.size,
                stream,
                pool,
            };
            let _ = trial.malloc(&mut dev, &req, &mut out);
            if !Self::matches(std::slice::from_ref(e), &out) {
                return Some((end, pool, stream));
            }
        }
        None
    }

    /// Applies the restore run `i..end` found by [`Self::restore_run`]: each block taken in
    /// place ([`Allocator::alloc_at`]).
    fn restore_segment(&mut self, i: usize, end: usize, pool: PoolId, stream: u64) {
        let events = self.events;
        let base = events[i].addr;
        for (x, e) in events.iter().enumerate().take(end).skip(i) {
            let req = AllocRequest {
                size_bytes: e.size,
                stream,
                pool,
            };
            let mut out = Vec::new();
            let mut dev =
                RecordedDevice::new(Vec::new(), self.capacity.is_none(), self.synth.clone());
            // The run was checked to fit: `alloc_at` takes the block in place.
            let _ = self.model.alloc_at(&mut dev, &req, e.addr, &mut out);
            let dev_n = self.device;
            self.compare(x, std::slice::from_ref(e), &out, &move || {
                format!("device {dev_n}: block {x} of the checkpoint restore of segment {base:#x}")
            });
            let op = self.op(
                x,
                OpKind::Alloc {
                    size_bytes: e.size,
                    stream,
                    pool,
                    recorded_oom: false,
                    restored: true,
                },
                e.addr,
            );
            self.live.insert(e.addr, op);
        }
        self.scope.insert(stream, pool);
        self.note_peak();
        self.inferred.push(Inference {
            event_index: i as u32,
            kind: "checkpoint_restore",
            detail: format!(
                "events {i}..{} re-create the blocks of segment {base:#x} of private pool {pool:?} as a CUDA-graph checkpoint held them (setCheckpointPoolState): each taken in place, in the segment's own pool, split wherever bytes remain — not by malloc",
                end - 1
            ),
        });
    }

    fn empty_cache_group(&mut self, i: usize, j: usize) {
        let group = self.events[i..j].to_vec();
        self.release_private_pools_in(i, &group);
        let seg_events = self.segment_group(i, j);
        let mut dev = RecordedDevice::new(seg_events, self.capacity.is_none(), self.synth.clone());
        let mut out = Vec::new();
        self.model.empty_cache(&mut dev, &mut out);
        let dev_n = self.device;
        self.compare(i, &group, &out, &move || {
            format!("device {dev_n}: empty_cache() inferred before event {i}")
        });
        self.op(i, OpKind::EmptyCache, 0);
        self.inferred.push(Inference {
            event_index: i as u32,
            kind: "empty_cache",
            detail: format!(
                "empty_cache() was called before event {i} (segment releases outside any malloc)"
            ),
        });
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
                    self.op(i, OpKind::Free { alloc, deferred }, e.addr);
                    if deferred {
                        self.pending.insert(e.addr, alloc);
                    }
                    let mut out = Vec::new();
                    let mut dev = RecordedDevice::new(Vec::new(), false, self.synth.clone());
                    if let Err(m) = self.model.free(&mut dev, e.addr, deferred, &mut out) {
                        self.diverge_input(i, &e, &m.to_string());
                    }
                    i += if deferred { 1 } else { 2 };
                }
                Action::FreeCompleted => {
                    let Some(alloc) = self.pending.remove(&e.addr) else {
                        return Err(self.err(
                            i,
                            format!("free_completed at {:#x} without a pending free", e.addr),
                        ));
                    };
                    self.op(i, OpKind::CompleteFree { alloc }, e.addr);
                    let mut out = Vec::new();
                    let mut dev = RecordedDevice::new(Vec::new(), false, self.synth.clone());
                    if let Err(m) = self.model.complete_free(&mut dev, e.addr, &mut out) {
                        self.diverge_input(i, &e, &m.to_string());
                    }
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
        let d = self.divergence.as_ref()?;
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
    fn diverges_later_than(&self, other: &Annotator<'_>) -> bool {
        let at = |a: &Annotator<'_>| a.divergence.as_ref().map_or(usize::MAX, |d| d.event_index);
        at(self) > at(other)
    }

    fn diverge_input(&mut self, i: usize, e: &RawEvent, why: &str) {
        if self.divergence.is_none() {
            self.divergence = Some(Divergence {
                device: self.device,
                event_index: i,
                recorded: Some(EventView::recorded(e)),
                simulated: None,
                context: format!(
                    "device {}: the model cannot apply this event: {why}",
                    self.device
                ),
            });
        }
    }
}

/// The end state of the model in the snapshot's form (expandable segments as runs of
/// mapped blocks), compared with the snapshot's `segments` of the device.
/// One end-state segment: address, size, small pool, pool, blocks (address, size, state).
type EndSegment = (u64, u64, bool, PoolId, Vec<(u64, u64, BlockState)>);
/// A run of mapped blocks being collected: start, length, blocks.
type EndRun = (u64, u64, Vec<(u64, u64, BlockState)>);

fn end_state_difference(
    snap: &RawSnapshot,
    device: u32,
    model: &PyTorchModel,
    renames: &BTreeMap<PoolId, PoolId>,
) -> Option<String> {
    let mut sim: Vec<EndSegment> = Vec::new();
    for s in model.layout().segments {
        let pool = renames.get(&s.pool).copied().unwrap_or(s.pool);
        let mut run: Option<EndRun> = None;
        for b in &s.blocks {
            let st = match b.state {
                LayoutBlockState::Allocated => Some(BlockState::ActiveAllocated),
                LayoutBlockState::PendingFree => Some(BlockState::ActivePendingFree),
                LayoutBlockState::Free => Some(BlockState::Inactive),
                LayoutBlockState::Unmapped => None,
            };
            match st {
                Some(st) => {
                    let r = run.get_or_insert((b.addr, 0, Vec::new()));
                    r.1 += b.size_bytes;
                    r.2.push((b.addr, b.size_bytes, st));
                }
                None => {
                    if let Some((a, sz, bl)) = run.take() {
                        sim.push((a, sz, s.small, pool, bl));
                    }
                }
            }
        }
        if let Some((a, sz, bl)) = run.take() {
            sim.push((a, sz, s.small, pool, bl));
        }
    }
    sim.sort_by_key(|s| s.0);
    let rec: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .collect();
    if rec.len() != sim.len() {
        return Some(format!(
            "{} segments recorded at the end, {} simulated",
            rec.len(),
            sim.len()
        ));
    }
    for (r, s) in rec.iter().zip(&sim) {
        if r.address != s.0 || r.total_size != s.1 {
            return Some(format!(
                "segment {:#x} ({} bytes) recorded, {:#x} ({} bytes) simulated",
                r.address, r.total_size, s.0, s.1
            ));
        }
        if (r.segment_type == SegmentType::Small) != s.2 {
            return Some(format!("segment {:#x}: pool type differs", r.address));
        }
        let rp = PoolId(r.segment_pool_id.0, r.segment_pool_id.1);
        if rp.is_private() != s.3.is_private() || (s.3.0 != u64::MAX && rp != s.3) {
            return Some(format!(
                "segment {:#x}: pool {rp:?} recorded, {:?} simulated",
                r.address, s.3
            ));
        }
        let rb: Vec<(u64, u64, BlockState)> = r
            .blocks
            .iter()
            .map(|b| (b.address, b.size, b.state))
            .collect();
        if rb != s.4 {
            let k = rb
                .iter()
                .zip(&s.4)
                .position(|(a, b)| a != b)
                .unwrap_or(rb.len().min(s.4.len()));
            return Some(format!(
                "segment {:#x}: block {k} is {:?} recorded, {:?} simulated",
                r.address,
                rb.get(k),
                s.4.get(k)
            ));
        }
    }
    None
}

/// One pass of the annotation over device `device`'s events from the rebuilt start state,
/// with the pool choices of `revised`.
fn pass<'a>(
    snap: &'a RawSnapshot,
    device: u32,
    events: &'a [RawEvent],
    cfg: &PyTorchConfig,
    capacity: Option<u64>,
    start: &[StartSegment],
    revised: BTreeMap<usize, Revision>,
) -> Result<Annotator<'a>, TraceError> {
    let mut model = PyTorchModel::new(cfg.clone(), capacity);
    model.load_start(start);
    let mut a = Annotator {
        snap,
        device,
        events,
        capacity,
        model,
        synth: SimulatedDevice::new(cfg.device_total_bytes, capacity),
        ops: Vec::new(),
        inferred: Vec::new(),
        live: HashMap::new(),
        pending: HashMap::new(),
        scope: BTreeMap::new(),
        renames: BTreeMap::new(),
        next_provisional: 1,
        compared: 0,
        matched: 0,
        divergence: None,
        peak_sim: start.iter().map(|s| s.size_bytes).sum(),
        creations: Vec::new(),
        revised,
        initial_ops: 0,
    };
    // Blocks alive at the start become the first ops, so every model can replay them.
    for s in start {
        for b in &s.blocks {
            a.ops.push(Op {
                kind: OpKind::Alloc {
                    size_bytes: b.requested_bytes,
                    stream: s.stream,
                    pool: s.pool,
                    recorded_oom: false,
                    restored: false,
                },
                event_index: u32::MAX,
                recorded_addr: b.addr,
                stack: crate::snapshot::StackId::EMPTY,
                time_us: 0,
            });
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
    Ok(a)
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
    let start =
        crate::start::rebuild_start(snap, device, &PyTorchModel::new(cfg.clone(), capacity))?;
    let start_reserved: u64 = start.iter().map(|s| s.size_bytes).sum();
    let mut a = pass(snap, device, events, cfg, capacity, &start, BTreeMap::new())?;
    // Revisit a pool choice the recording contradicts later, by a pass from the start with
    // the other choice, kept only where it follows the recording further. Each revision is
    // a different malloc group and moves the first divergence later, so this ends; an
    // exact trace takes one pass.
    while let Some((group_end, revision)) = a.revision() {
        let mut revised = a.revised.clone();
        revised.insert(group_end, revision);
        match pass(snap, device, events, cfg, capacity, &start, revised) {
            Ok(b) if b.diverges_later_than(&a) => a = b,
            _ => break,
        }
    }
    let initial = a.initial_ops;
    let mut reserved = start_reserved;
    let mut peak_rec = reserved;
    for e in events {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => reserved += e.size,
            Action::SegmentFree | Action::SegmentUnmap => {
                reserved = reserved.saturating_sub(e.size);
            }
            _ => {}
        }
        peak_rec = peak_rec.max(reserved);
    }
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
    for op in &mut a.ops {
        if let OpKind::Alloc { pool, .. } | OpKind::ReleasePool { pool } = &mut op.kind {
            *pool = resolve(*pool);
        }
    }
    let report = DeviceReport {
        device,
        exact: a.divergence.is_none() && end_diff.is_none() && a.compared == a.matched,
        events_compared: a.compared,
        events_matched: a.matched,
        end_state_matches: end_diff.is_none(),
        end_state_difference: end_diff,
        first_divergence: a.divergence,
        peak_reserved_recorded: peak_rec,
        peak_reserved_simulated: a.peak_sim,
        inferred: a.inferred.clone(),
        starts_empty: start.is_empty(),
    };
    let trace = DeviceTrace {
        device,
        ops: a.ops,
        start,
        inferred: a.inferred,
        events: events.len(),
        initial_ops: initial,
        segment_events: events
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
            .copied()
            .collect(),
        capacity: crate::capacity::CapacityEvidence::default(),
    };
    Ok((trace, report))
}

/// The whole validation: every device that has events.
#[derive(Debug, Clone)]
pub struct Validation {
    pub trace: Trace,
    pub devices: Vec<DeviceReport>,
}

impl Validation {
    /// Every device exact.
    #[must_use]
    pub fn exact(&self) -> bool {
        self.devices.iter().all(|d| d.exact)
    }
}

/// The largest device index PyTorch can record (`c10::DeviceIndex` is an `int8_t`).
pub const MAX_DEVICE: u32 = 127;

/// Builds the replayable trace of every device, validating each on the way.
pub fn validate(snap: RawSnapshot, capacity: Option<u64>) -> Result<Validation, crate::Error> {
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
    let mut devices = Vec::new();
    let mut reports = Vec::new();
    let n = snap.device_traces.len().max(
        snap.segments
            .iter()
            .map(|s| s.device as usize + 1)
            .max()
            .unwrap_or(0),
    );
    for d in 0..n as u32 {
        let (mut t, r) = annotate(&snap, d, &cfg, capacity)?;
        if let Some(events) = snap.device_traces.get(d as usize) {
            t.capacity = crate::capacity::infer(events, &t, &cfg);
        }
        if t.events > 0 || !t.start.is_empty() {
            reports.push(r);
        }
        devices.push(t);
    }
    Ok(Validation {
        trace: Trace {
            snapshot: snap,
            devices,
        },
        devices: reports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{RawBlock, RawSegment, StackId};

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
        let v = validate(ends_with_one_small_segment((0, 0), events), None).unwrap();
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
                OpKind::Alloc { pool, .. } => Some(pool),
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
        let v = validate(ends_with_one_small_segment((0, 1), events), None).unwrap();
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
}
