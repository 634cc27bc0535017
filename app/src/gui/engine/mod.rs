//! The engine: everything slow the app does — decoding a snapshot, replaying it under
//! each compared configuration, rebuilding the layout at the cursor — behind a message
//! interface, so it runs off the UI thread: on a thread natively, in a Web Worker in the
//! browser ([`crate::gui::io`]). It holds the trace and the replays (with their
//! checkpoints); the UI holds the plain data the engine sends ([`wire`]).

pub mod bands;
pub mod wire;

use std::sync::Arc;

use allocsim_core::models::{LayoutBlockState, MODEL_NAMES, ModelSpec};
use allocsim_core::replay::{self, Outcome, ReplayOptions, ReplayResult};
use allocsim_core::trace::{DeviceTrace, OpKind, Trace};
use allocsim_core::validate::DeviceReport;
use allocsim_core::{session, whatif, workloads};

use wire::{
    AddressHit, BlockView, LayoutData, NO_OP, OomData, OpsTable, ReplayData, ReplaySummary,
    Request, Response, SegmentView, StackTable, TraceData, WhatIfRow, block_state, op_kind,
};

/// A replay kept for layouts and searches.
struct Slot {
    result: ReplayResult,
}

/// The engine's state: the loaded trace and one replay per compare slot.
#[derive(Default)]
pub struct Engine {
    /// Shared with work that runs beside the engine ([`Engine::detached_min_capacity`]).
    trace: Option<Arc<Trace>>,
    reports: Vec<DeviceReport>,
    name: String,
    device: usize,
    /// Ops table of the device shown (kept for layouts: alloc ↔ end links).
    ops: OpsTable,
    slots: Vec<Option<Slot>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("name", &self.name)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// Configurations the what-if table tries (PyTorch's own options), before the other models.
const WHAT_IF_PYTORCH: &[&str] = &[
    "pytorch",
    "pytorch@expandable_segments:True",
    "pytorch@max_split_size_mb:64",
    "pytorch@max_split_size_mb:256",
    "pytorch@roundup_power2_divisions:4",
    "pytorch@garbage_collection_threshold:0.6",
    "pytorch@expandable_segments:True,garbage_collection_threshold:0.6",
];

impl Engine {
    /// An engine with nothing loaded.
    #[must_use]
    pub fn new() -> Engine {
        Engine::default()
    }

    /// Handles one request; answers go to `emit` (progress first, the result last).
    pub fn handle(&mut self, req: Request, emit: &mut dyn FnMut(Response)) {
        match req {
            Request::Load { job, name, bytes } => self.load(job, name, &bytes, emit),
            Request::SelectDevice { job, device } => {
                let Some(trace) = &self.trace else {
                    return emit(Response::Failed {
                        job,
                        message: "no trace is loaded".into(),
                    });
                };
                if device as usize >= trace.devices.len() {
                    return emit(Response::Failed {
                        job,
                        message: format!("the trace has no device {device}"),
                    });
                }
                self.device = device as usize;
                self.slots.clear();
                let data = self.trace_data(emit, job);
                emit(Response::Loaded {
                    job,
                    trace: Box::new(data),
                });
            }
            Request::Replay {
                job,
                slot,
                spec,
                capacity_bytes,
            } => self.replay(job, slot, &spec, capacity_bytes, emit),
            Request::DropSlot { slot } => {
                if let Some(s) = self.slots.get_mut(slot as usize) {
                    *s = None;
                }
            }
            Request::Layout { job, slot, op } => match self.layout(slot, op) {
                Ok(layout) => emit(Response::Layout {
                    job,
                    slot,
                    layout: Box::new(layout),
                }),
                Err(message) => emit(Response::Failed { job, message }),
            },
            Request::FindAddress { job, slot, addr } => match self.find_address(slot, addr) {
                Ok(hits) => emit(Response::AddressHits {
                    job,
                    slot,
                    addr,
                    hits,
                }),
                Err(message) => emit(Response::Failed { job, message }),
            },
            Request::WhatIf {
                job,
                capacity_bytes,
            } => match self.what_if(job, capacity_bytes, emit) {
                Ok(rows) => emit(Response::WhatIf { job, rows }),
                Err(message) => emit(Response::Failed { job, message }),
            },
            Request::Workload { job, spec } => {
                emit(Response::Progress {
                    job,
                    stage: format!("generating {spec}"),
                    fraction: 0.05,
                });
                match workloads::generate(&spec) {
                    Ok(trace) => {
                        self.device = 0;
                        self.trace = Some(Arc::new(trace));
                        self.reports = Vec::new();
                        self.name = spec;
                        self.slots.clear();
                        let data = self.trace_data(emit, job);
                        emit(Response::Loaded {
                            job,
                            trace: Box::new(data),
                        });
                    }
                    Err(e) => emit(Response::Failed {
                        job,
                        message: e.to_string(),
                    }),
                }
            }
            Request::MinCapacity { job, slot, spec } => match self.min_capacity(job, &spec, emit) {
                Ok(bytes) => emit(Response::MinCapacity { job, slot, bytes }),
                Err(message) => emit(Response::Failed { job, message }),
            },
        }
    }

    fn load(&mut self, job: u64, name: String, bytes: &[u8], emit: &mut dyn FnMut(Response)) {
        emit(Response::Progress {
            job,
            stage: format!("decoding {name}"),
            fraction: 0.05,
        });
        match session::load(bytes, None) {
            Ok(v) => {
                self.device = v.trace.busiest_device();
                self.trace = Some(Arc::new(v.trace));
                self.reports = v.devices;
                self.name = name;
                self.slots.clear();
                emit(Response::Progress {
                    job,
                    stage: "stacking allocations".into(),
                    fraction: 0.6,
                });
                let data = self.trace_data(emit, job);
                emit(Response::Loaded {
                    job,
                    trace: Box::new(data),
                });
            }
            Err(e) => emit(Response::Failed {
                job,
                message: format!("{name}: {e}"),
            }),
        }
    }

    /// The UI's copy of the device shown (also refreshes the engine's ops table).
    fn trace_data(&mut self, emit: &mut dyn FnMut(Response), job: u64) -> TraceData {
        let Some(trace) = &self.trace else {
            return TraceData::default();
        };
        let dt = &trace.devices[self.device];
        self.ops = ops_table(dt);
        emit(Response::Progress {
            job,
            stage: "stacking allocations".into(),
            fraction: 0.7,
        });
        let bands = bands::build(&self.ops);
        let report = self.reports.iter().find(|r| r.device == dt.device);
        let mut notes = Vec::new();
        if let Some(r) = report {
            if let Some(d) = &r.first_divergence {
                notes.push(format!(
                    "the PyTorch model first differs from the recording at event {}: {}",
                    d.event_index, d.context
                ));
            }
            if let Some(e) = &r.end_state_difference {
                notes.push(format!("end state: {e}"));
            }
        }
        notes.extend(dt.inferred.iter().take(20).map(|i| {
            format!(
                "event {}: inferred {} ({})",
                i.event_index, i.kind, i.detail
            )
        }));
        TraceData {
            name: self.name.clone(),
            device: dt.device,
            devices: trace
                .devices
                .iter()
                .map(|d| (d.events as u32, d.ops.len() as u32))
                .collect(),
            recorded_conf: trace.snapshot.settings.conf.clone(),
            recorded: !self.reports.is_empty(),
            exact: report.is_some_and(|r| r.exact),
            notes,
            starts_mid_program: !dt.starts_empty(),
            has_times: dt.ops.iter().any(|o| o.time_us != 0),
            ops: self.ops.clone(),
            stacks: stack_table(&trace.snapshot.frames),
            bands,
        }
    }

    fn replay(
        &mut self,
        job: u64,
        slot: u32,
        spec: &str,
        capacity: Option<u64>,
        emit: &mut dyn FnMut(Response),
    ) {
        let Some(trace) = &self.trace else {
            return emit(Response::Failed {
                job,
                message: "no trace is loaded".into(),
            });
        };
        let parsed = match ModelSpec::parse(spec) {
            Ok(s) => s,
            Err(e) => {
                return emit(Response::Failed {
                    job,
                    message: e.to_string(),
                });
            }
        };
        emit(Response::Progress {
            job,
            stage: format!("replaying {spec}"),
            fraction: 0.1,
        });
        let result = match session::replay_device(
            trace,
            self.device,
            &parsed,
            capacity,
            ReplayOptions::default(),
        ) {
            Ok(r) => r,
            Err(e) => {
                return emit(Response::Failed {
                    job,
                    message: format!("{spec}: {e}"),
                });
            }
        };
        let data = replay_data(spec, &result);
        let i = slot as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i] = Some(Slot { result });
        emit(Response::Replayed {
            job,
            slot,
            replay: Box::new(data),
        });
    }

    fn slot(&self, slot: u32) -> Result<(&DeviceTrace, &Slot), String> {
        let trace = self.trace.as_ref().ok_or("no trace is loaded")?;
        let s = self
            .slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .ok_or("this configuration has not been replayed yet")?;
        Ok((&trace.devices[self.device], s))
    }

    /// The layout after ops `0..=op`, each block linked to the allocation in it.
    fn layout(&self, slot: u32, op: u32) -> Result<LayoutData, String> {
        let (dt, s) = self.slot(slot)?;
        let r = &s.result;
        if dt.ops.is_empty() {
            return Ok(LayoutData::default());
        }
        let wanted = (op as usize).min(dt.ops.len() - 1);
        let last = r.ops_done.saturating_sub(1);
        let at = wanted.min(last);
        let layout =
            replay::layout_at(dt, r, at + 1).ok_or("no checkpoint to rebuild the layout from")?;
        // Which allocation holds each address now.
        let mut holder: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
        for a in 0..=at {
            if self.ops.kind[a] == op_kind::ALLOC
                && (self.ops.end[a] == NO_OP || self.ops.end[a] as usize > at)
                && let Some(Outcome::Served(addr)) = r.outcomes.get(a)
            {
                holder.insert(*addr, a as u32);
            }
        }
        let mut out = LayoutData {
            op,
            clamped_to: (at < wanted).then_some(at as u32),
            ..LayoutData::default()
        };
        for seg in &layout.segments {
            let first = out.blocks.len() as u32;
            for b in &seg.blocks {
                let state = match b.state {
                    LayoutBlockState::Allocated => block_state::ALLOCATED,
                    LayoutBlockState::Free => block_state::FREE,
                    LayoutBlockState::PendingFree => block_state::PENDING_FREE,
                    LayoutBlockState::Unmapped => block_state::UNMAPPED,
                };
                let alloc = if matches!(state, block_state::ALLOCATED | block_state::PENDING_FREE) {
                    holder.get(&b.addr).copied().unwrap_or(NO_OP)
                } else {
                    NO_OP
                };
                out.blocks.push(BlockView {
                    addr: b.addr,
                    size_bytes: b.size_bytes,
                    requested_bytes: b.requested_bytes,
                    state,
                    alloc,
                });
            }
            out.segments.push(SegmentView {
                addr: seg.addr,
                size_bytes: seg.size_bytes,
                stream: seg.stream,
                pool: (seg.pool.0, seg.pool.1),
                small: seg.small,
                expandable: seg.expandable,
                first,
                count: out.blocks.len() as u32 - first,
            });
        }
        Ok(out)
    }

    fn find_address(&self, slot: u32, addr: u64) -> Result<Vec<AddressHit>, String> {
        let (_, s) = self.slot(slot)?;
        let mut hits = Vec::new();
        for (a, o) in s.result.outcomes.iter().enumerate() {
            if let Outcome::Served(base) = *o {
                let size = self.ops.size_bytes[a];
                if base <= addr && addr < base + size.max(1) {
                    hits.push(AddressHit {
                        alloc: a as u32,
                        addr: base,
                        size_bytes: size,
                    });
                    if hits.len() >= 1000 {
                        break;
                    }
                }
            }
        }
        Ok(hits)
    }

    /// Core's what-if answers under `capacity`: PyTorch's main options and every other
    /// model side by side (`whatif::compare`), and the best PyTorch configuration
    /// (`whatif::recommend`) when there is a cap.
    fn what_if(
        &self,
        job: u64,
        capacity: Option<u64>,
        emit: &mut dyn FnMut(Response),
    ) -> Result<Vec<WhatIfRow>, String> {
        let trace = self.trace.as_ref().ok_or("no trace is loaded")?;
        let mut labels: Vec<String> = WHAT_IF_PYTORCH.iter().map(|s| (*s).to_string()).collect();
        labels.extend(
            MODEL_NAMES
                .iter()
                .filter(|m| **m != "pytorch")
                .map(|m| (*m).to_string()),
        );
        let specs: Vec<ModelSpec> = labels
            .iter()
            .map(|l| ModelSpec::parse(l))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let results = whatif::compare(trace, self.device, &specs, capacity, &mut |done, total| {
            emit(Response::Progress {
                job,
                stage: "what if: other configurations".into(),
                fraction: 0.5 * done as f32 / total.max(1) as f32,
            });
        })
        .map_err(|e| e.to_string())?;
        let mut rows: Vec<WhatIfRow> = labels
            .into_iter()
            .zip(&results)
            .map(|(spec, r)| row(spec, r, false))
            .collect();
        if let Some(cap) = capacity {
            let rec = whatif::recommend(trace, self.device, Some(cap), &mut |done, total| {
                emit(Response::Progress {
                    job,
                    stage: "what if: PyTorch options".into(),
                    fraction: 0.5 + 0.5 * done as f32 / total.max(1) as f32,
                });
            })
            .map_err(|e| e.to_string())?;
            if whatif::served_all(&rec.best) {
                let spec = if rec.best.config.is_empty() {
                    "pytorch".to_string()
                } else {
                    format!("pytorch@{}", rec.best.config)
                };
                rows.insert(0, row(spec, &rec.best, true));
            }
        }
        Ok(rows)
    }

    fn min_capacity(
        &self,
        job: u64,
        spec: &str,
        emit: &mut dyn FnMut(Response),
    ) -> Result<u64, String> {
        min_capacity_of(self.trace.as_deref(), self.device, job, spec, emit)
    }

    /// [`Request::MinCapacity`] as work that needs nothing of the engine but the trace,
    /// for a host that runs it beside the engine (natively: on its own thread): a search
    /// replays the trace a dozen times, and layouts keep coming meanwhile. It emits what
    /// [`Engine::handle`] would.
    pub fn detached_min_capacity(
        &self,
        job: u64,
        slot: u32,
        spec: String,
    ) -> impl FnOnce(&mut dyn FnMut(Response)) + Send + 'static {
        let (trace, device) = (self.trace.clone(), self.device);
        move |emit: &mut dyn FnMut(Response)| {
            let r = min_capacity_of(trace.as_deref(), device, job, &spec, emit);
            emit(match r {
                Ok(bytes) => Response::MinCapacity { job, slot, bytes },
                Err(message) => Response::Failed { job, message },
            });
        }
    }
}

/// The smallest capacity on which `spec` runs device `device` of `trace`, with progress.
fn min_capacity_of(
    trace: Option<&Trace>,
    device: usize,
    job: u64,
    spec: &str,
    emit: &mut dyn FnMut(Response),
) -> Result<u64, String> {
    let trace = trace.ok_or("no trace is loaded")?;
    let parsed = ModelSpec::parse(spec).map_err(|e| e.to_string())?;
    let m = whatif::min_capacity(trace, device, &parsed, &mut |done, total| {
        emit(Response::Progress {
            job,
            stage: format!("min capacity of {spec}"),
            fraction: done as f32 / total.max(1) as f32,
        });
    })
    .map_err(|e| e.to_string())?;
    Ok(m.min_capacity_bytes)
}

fn row(spec: String, r: &ReplayResult, recommended: bool) -> WhatIfRow {
    WhatIfRow {
        spec,
        recommended,
        fits: whatif::served_all(r),
        peak_reserved_bytes: r.peak_reserved_bytes,
        oom_event: r.oom.as_ref().map(|o| o.event_index),
        error: String::new(),
    }
}

/// The ops of a device as columns.
#[must_use]
pub fn ops_table(dt: &DeviceTrace) -> OpsTable {
    let n = dt.ops.len();
    let mut t = OpsTable {
        kind: Vec::with_capacity(n),
        size_bytes: Vec::with_capacity(n),
        link: vec![NO_OP; n],
        end: vec![NO_OP; n],
        stream: Vec::with_capacity(n),
        stack: Vec::with_capacity(n),
        event_index: Vec::with_capacity(n),
        time_us: Vec::with_capacity(n),
    };
    for (k, op) in dt.ops.iter().enumerate() {
        let (kind, size, stream) = match op.kind {
            OpKind::Alloc {
                size_bytes,
                stream,
                recorded_oom,
                ..
            } => (
                if recorded_oom {
                    op_kind::ALLOC_RECORDED_OOM
                } else {
                    op_kind::ALLOC
                },
                size_bytes,
                stream,
            ),
            OpKind::Free { alloc, deferred } => {
                if let Some(a) = t.link.get_mut(alloc as usize) {
                    *a = k as u32;
                    // A deferred free holds its memory until its completion (if any).
                    if !deferred {
                        t.end[alloc as usize] = k as u32;
                    }
                }
                t.link[k] = alloc;
                (op_kind::FREE, 0, 0)
            }
            OpKind::CompleteFree { alloc } => {
                if let Some(e) = t.end.get_mut(alloc as usize) {
                    *e = k as u32;
                }
                t.link[k] = alloc;
                (op_kind::COMPLETE_FREE, 0, 0)
            }
            OpKind::EmptyCache => (op_kind::EMPTY_CACHE, 0, 0),
            OpKind::ReleasePool { .. } => (op_kind::RELEASE_POOL, 0, 0),
        };
        t.kind.push(kind);
        t.size_bytes.push(size);
        t.stream.push(stream);
        t.stack.push(op.stack.0);
        t.event_index.push(op.event_index);
        t.time_us.push(op.time_us);
    }
    t
}

/// A flat copy of the core's frame table.
#[must_use]
pub fn stack_table(frames: &allocsim_core::snapshot::FrameTable) -> StackTable {
    use allocsim_core::snapshot::{FrameId, StackId, StrId};
    let mut t = StackTable::default();
    let mut strings: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    let mut intern = |t: &mut StackTable, s: StrId| -> u32 {
        *strings.entry(s.0).or_insert_with(|| {
            t.strings.push(frames.str(s).to_string());
            t.strings.len() as u32 - 1
        })
    };
    for f in 0..frames.frame_count() {
        let (name, file, line) = match frames.frame(FrameId(f as u32)) {
            Some(fr) => (
                intern(&mut t, fr.name),
                intern(&mut t, fr.filename),
                fr.line,
            ),
            None => (0, 0, 0),
        };
        t.frames.push((name, file, line));
    }
    t.offsets.push(0);
    for s in 0..frames.stack_count() {
        t.frame_ids
            .extend(frames.stack(StackId(s as u32)).iter().map(|f| f.0));
        t.offsets.push(t.frame_ids.len() as u32);
    }
    t
}

/// The UI's copy of a replay.
#[must_use]
pub fn replay_data(spec: &str, r: &ReplayResult) -> ReplayData {
    let oom = r.oom.as_ref().map(|o| OomData {
        event_index: o.event_index,
        op_index: o.op_index as u32,
        requested_bytes: o.requested_bytes,
        reserved_bytes: o.reserved_bytes,
        allocated_bytes: o.allocated_bytes,
        free_bytes: o.free_bytes,
        largest_free_bytes: o.largest_free_bytes,
        free_holes: o.free_holes,
        explanation: o.explanation.clone(),
        fatal: o.fatal,
    });
    ReplayData {
        spec: spec.to_string(),
        summary: ReplaySummary {
            allocator: r.allocator.to_string(),
            config: r.config.clone(),
            capacity_bytes: r.capacity_bytes,
            ops_done: r.ops_done as u32,
            requests: r.requests as u32,
            peak_reserved_bytes: r.peak_reserved_bytes,
            peak_allocated_bytes: r.peak_allocated_bytes,
            peak_requested_bytes: r.peak_requested_bytes,
            final_reserved_bytes: r.final_reserved_bytes,
            internal_waste_bytes_at_peak: r.internal_waste_bytes_at_peak,
            fragmentation_at_peak: r.fragmentation_at_peak,
            max_fragmentation: r.max_fragmentation,
            segment_ops: r.segment_ops,
            oom,
        },
        reserved_bytes: r.timeline.reserved_bytes.clone(),
        allocated_bytes: r.timeline.allocated_bytes.clone(),
        requested_bytes: r.timeline.requested_bytes.clone(),
        largest_free_bytes: r.timeline.largest_free_bytes.clone(),
        free_holes: r.timeline.free_holes.clone(),
    }
}

#[cfg(test)]
mod tests;
