//! The CUDA replay (`allocsim cuda-replay`): a trace's requests through a model on real
//! GPU memory, next to the same model on the simulated device, and the validation report
//! of DESIGN.md — reserved-bytes agreement at every segment event, where the real driver
//! and the simulation first refuse, driver-call latencies, and the data check.
//!
//! Both runs step through the core's [`OpStepper`], so they give every op the meaning the
//! simulated replay gives it.

use std::collections::BTreeMap;

use allocsim_core::device::{Device, DeviceOom};
use allocsim_core::models::{Allocator, ModelEvent, ModelSpec};
use allocsim_core::replay::{OpStepper, Step};
use allocsim_core::session;
use allocsim_core::snapshot::Action;
use allocsim_core::trace::{DeviceTrace, OpKind, Trace};

use crate::NativeError;
use crate::device::{CudaDevice, Refusal};
use crate::gpu::{DeviceInfo, DevicePtr, Gpu, GpuError};
use crate::latency::LatencyStats;
use crate::raw::RawPassthrough;

/// What reaches the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The model on real memory: only its segment operations reach the driver.
    Model,
    /// Every request a `cuMemAlloc`, every free a `cuMemFree`; the model named in the
    /// options (normally `cuda-malloc`) predicts the device usage on the simulated device.
    Raw,
}

/// What to replay, and how.
#[derive(Debug, Clone)]
pub struct CudaReplayOptions {
    pub mode: Mode,
    /// The model (model mode), or the model whose prediction raw mode checks.
    pub spec: ModelSpec,
    /// The memory the allocator may hold (PyTorch's memory fraction; the device refuses
    /// beyond it too).
    pub capacity_bytes: Option<u64>,
    /// Fill the GPU first so that only this much stays free: the driver itself refuses.
    pub balloon_free_bytes: Option<u64>,
    /// Write a pattern into every live block and check it before its free.
    pub verify_data: bool,
    /// Which `device_traces[D]` to replay.
    pub trace_device: usize,
}

/// One point of the real-vs-simulated curves, taken after op `op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// Index of the op in the trace's request list.
    pub op: u64,
    /// Index of its entry in `device_traces[d]`.
    pub event_index: u64,
    /// Device memory in use by the replay: `cuMemGetInfo` free before the first op minus
    /// free now.
    pub real_used_bytes: u64,
    /// What the model on the GPU says it holds (raw mode: the bytes requested).
    pub model_reserved_bytes: u64,
    /// What the same model on the simulated device holds after the same op (raw mode:
    /// the predicting model), if there is one.
    pub sim_reserved_bytes: Option<u64>,
    /// A segment event (a driver call for the model) happened at this op.
    pub segment_event: bool,
}

/// Reserved-bytes agreement at every segment event: after every op that made segment
/// events (a request that frees cached segments and maps new pages makes several), the
/// accounting is compared with the `cuMemGetInfo` delta.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Agreement {
    /// Ops with segment events compared.
    pub events_compared: u64,
    /// Equal at the driver's granularity: both rounded up to whole pages (`2 MiB`).
    pub events_equal: u64,
    pub max_abs_diff_bytes: u64,
    /// The first event where they differed.
    pub first_difference: Option<Difference>,
}

/// One disagreement.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Difference {
    pub event_index: u64,
    pub accounted_bytes: u64,
    pub real_bytes: u64,
}

/// The request (trace entry index) where something first happened, really and simulated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventPair {
    pub simulated_event_index: Option<u64>,
    pub real_event_index: Option<u64>,
}

/// The data check of `--verify-data`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VerifyReport {
    pub blocks_checked: u64,
    /// Blocks whose pattern had changed before their free.
    pub mismatches: u64,
    /// Bytes of device memory written (patterns) and read back (samples).
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// The first mismatch, described.
    pub first_mismatch: Option<String>,
}

/// The simulated device's usage against the real one, at every sampled op.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Prediction {
    /// `NAME` or `NAME@CONFIG` of the predicting model.
    pub model: String,
    pub ops_compared: u64,
    pub max_abs_error_bytes: u64,
    pub mean_abs_error_bytes: f64,
    /// Peak reserved of the simulation over the whole trace.
    pub peak_predicted_bytes: u64,
    /// Peak real usage over the sampled ops.
    pub peak_real_bytes: u64,
    /// `(peak_predicted − peak_real) / peak_real` (0 when nothing was used).
    pub peak_relative_error: f64,
}

/// Peaks of the three curves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Peaks {
    pub real_used_bytes: u64,
    pub model_reserved_bytes: u64,
    pub simulated_reserved_bytes: u64,
}

/// The validation report (`cuda-replay --json`, DESIGN.md; fields after `verify_data`
/// are additions).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CudaReplayReport {
    pub schema: u32,
    pub device: DeviceInfo,
    pub mode: Mode,
    pub allocator: String,
    pub config: String,
    pub capacity_bytes: Option<u64>,
    /// Free memory the balloon really left (`cuMemGetInfo`), when there was one.
    pub balloon_free_bytes: Option<u64>,
    pub events: usize,
    /// Segment events of the run on the GPU (driver calls for the model; raw mode: every
    /// request and free that reached the driver).
    pub segment_events: u64,
    pub reserved_agreement: Agreement,
    /// The first request that could not be served (the program's OOM).
    pub oom: EventPair,
    pub latency_us: BTreeMap<String, LatencyStats>,
    pub verify_data: Option<VerifyReport>,
    /// The first request at which the device refused memory (the model may have recovered
    /// by freeing its cache and retrying).
    pub first_refusal: EventPair,
    /// What the driver's first refusal asked for, and the free memory it left.
    pub driver_refusal: Option<Refusal>,
    pub prediction: Option<Prediction>,
    pub peaks: Peaks,
    /// The memory the simulated device was given: what the driver hands out of the free
    /// memory at the start (measured behind a balloon, else [`driver_usable_bytes`]), under
    /// the cap.
    pub simulated_limit_bytes: u64,
    /// Ops of the request list, and how many ran on the GPU.
    pub ops: usize,
    pub ops_replayed: usize,
    /// The observer stopped the replay early.
    pub stopped: bool,
    /// `cuMemGetInfo` free after everything was given back, and the difference to the
    /// free memory at the start (positive: memory not given back).
    pub free_bytes_at_end: u64,
    pub leaked_bytes: i64,
    /// What the report could not say, and why.
    pub notes: Vec<String>,
    /// Every sample, for curves and `--timeline`; not part of the JSON.
    #[serde(skip)]
    pub timeline: Vec<Sample>,
}

/// Watches a replay as it runs (the live panel's runner, a progress bar).
pub trait Observer {
    /// The GPU is open (and the balloon inflated).
    fn started(&mut self, device: &DeviceInfo, balloon_free_bytes: Option<u64>, ops_total: usize) {
        let _ = (device, balloon_free_bytes, ops_total);
    }
    /// A new point of the curves.
    fn sample(&mut self, sample: &Sample) {
        let _ = sample;
    }
    /// Called every [`PROGRESS_EVERY`] ops and at the end; `false` stops the replay.
    fn progress(&mut self, ops_done: usize, ops_total: usize) -> bool {
        let _ = (ops_done, ops_total);
        true
    }
}

/// An observer that watches nothing.
#[derive(Debug, Default)]
pub struct NoObserver;

impl Observer for NoObserver {}

/// How often [`Observer::progress`] is called, and a sample taken between segment events.
pub const PROGRESS_EVERY: usize = 256;

/// An estimate of how much of `free_bytes` (what `cuMemGetInfo` reports free) the driver
/// really hands out: whole pages of `granularity`, less one page it keeps for itself, as
/// measured on an H200 with driver 580 (with 101.125 MiB free, 2 MiB requests got 98 MiB
/// and 20 MiB pages 80 MiB; with 1025.125 MiB free, 1022 and 1020 MiB). An H100 with the
/// same driver keeps two pages back, so a replay behind a balloon measures the figure
/// instead ([`CudaDevice::probe_usable_bytes`]); this rule stands in where all the GPU is free.
#[must_use]
pub fn driver_usable_bytes(free_bytes: u64, granularity: u64) -> u64 {
    let g = granularity.max(1);
    (free_bytes / g).saturating_sub(1) * g
}

/// The OOM a replay reports, and whether it stops there — the rule of the core's
/// `replay::replay`: the first OOM is reported unless a fatal one (the recording did not
/// fail there too) follows reproduced ones; the replay stops at any fatal OOM.
#[derive(Debug, Default, Clone, Copy)]
struct OomSeen {
    event_index: Option<u64>,
    fatal: bool,
}

impl OomSeen {
    /// An OOM at `event_index`; returns whether the replay stops.
    fn note(&mut self, event_index: u64, fatal: bool) -> bool {
        if self.event_index.is_none() || (fatal && !self.fatal) {
            *self = OomSeen {
                event_index: Some(event_index),
                fatal,
            };
        }
        fatal
    }
}

/// Counts the refusals of a device (the simulated one).
struct Counting<D> {
    inner: D,
    refusals: u64,
}

impl<D: Device> Counting<D> {
    fn count<T>(&mut self, r: Result<T, DeviceOom>) -> Result<T, DeviceOom> {
        if r.is_err() {
            self.refusals += 1;
        }
        r
    }
}

impl<D: Device> Device for Counting<D> {
    fn malloc(&mut self, size: u64, stream: u64) -> Result<u64, DeviceOom> {
        let r = self.inner.malloc(size, stream);
        self.count(r)
    }
    fn free(&mut self, addr: u64, size: u64) {
        self.inner.free(addr, size);
    }
    fn reserve(&mut self, size: u64, page: u64, stream: u64) -> Result<u64, DeviceOom> {
        let r = self.inner.reserve(size, page, stream);
        self.count(r)
    }
    fn release(&mut self, addr: u64, size: u64) {
        self.inner.release(addr, size);
    }
    fn map(&mut self, addr: u64, size: u64, stream: u64) -> Result<(), DeviceOom> {
        let r = self.inner.map(addr, size, stream);
        self.count(r)
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        self.inner.unmap(addr, size);
    }
    fn free_bytes(&self) -> u64 {
        self.inner.free_bytes()
    }
    fn diverged_at(&self) -> Option<u64> {
        self.inner.diverged_at()
    }
}

/// The word written into every 4 bytes of the block op `op` allocated: distinct for
/// neighbouring ops, never 0 (fresh memory is often zero).
#[must_use]
pub fn pattern_word(op: usize) -> u32 {
    let w = (op as u32)
        .wrapping_add(1)
        .wrapping_mul(0x9E37_79B1)
        .rotate_left(11)
        ^ 0xA5A5_5A5A;
    if w == 0 { 0x0102_0304 } else { w }
}

/// The byte ranges `(offset, len)` of a block of `size` bytes that the check reads back:
/// the whole block up to `4 KiB`, else 256 bytes at its start, a third, two thirds and end.
#[must_use]
pub fn sample_spans(size: u64) -> Vec<(u64, u64)> {
    const WHOLE: u64 = 4096;
    const SPAN: u64 = 256;
    if size == 0 {
        return Vec::new();
    }
    if size <= WHOLE {
        return vec![(0, size)];
    }
    let mut v = vec![
        (0, SPAN),
        (size / 3 / 4 * 4, SPAN),
        (size * 2 / 3 / 4 * 4, SPAN),
        (size - SPAN, SPAN),
    ];
    v.dedup();
    v
}

/// Writes and checks the patterns of `--verify-data`.
#[derive(Debug, Default)]
struct Verifier {
    report: VerifyReport,
    buf: Vec<u8>,
}

impl Verifier {
    fn write<G: Gpu>(
        &mut self,
        gpu: &mut G,
        ptr: DevicePtr,
        size: u64,
        op: usize,
    ) -> Result<(), GpuError> {
        if size == 0 {
            return Ok(());
        }
        gpu.fill(ptr, size, pattern_word(op))?;
        self.report.bytes_written += size;
        Ok(())
    }

    fn check<G: Gpu>(
        &mut self,
        gpu: &mut G,
        ptr: DevicePtr,
        size: u64,
        op: usize,
        event_index: u64,
    ) -> Result<(), GpuError> {
        if size == 0 {
            return Ok(());
        }
        let le = pattern_word(op).to_le_bytes();
        let mut bad: Option<u64> = None;
        for (off, len) in sample_spans(size) {
            self.buf.resize(len as usize, 0);
            gpu.read(ptr + off, &mut self.buf)?;
            self.report.bytes_read += len;
            if bad.is_none() {
                bad = self
                    .buf
                    .iter()
                    .enumerate()
                    .find(|&(i, &b)| b != le[((off + i as u64) % 4) as usize])
                    .map(|(i, _)| off + i as u64);
            }
        }
        self.report.blocks_checked += 1;
        if let Some(at) = bad {
            self.report.mismatches += 1;
            if self.report.first_mismatch.is_none() {
                self.report.first_mismatch = Some(format!(
                    "the block of op {op} at {ptr:#x} ({size} bytes) changed at byte {at} before its free (event {event_index}): another live block overlaps it"
                ));
            }
        }
        Ok(())
    }
}

fn is_segment_event(e: &ModelEvent) -> bool {
    matches!(
        e.action,
        Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap
    )
}

fn driver(op: usize, event_index: u64, error: GpuError) -> NativeError {
    NativeError::Driver {
        op,
        event_index,
        error,
    }
}

/// The simulated twin of the GPU run.
struct SimRun {
    model: Box<dyn Allocator>,
    device: Counting<allocsim_core::device::SimulatedDevice>,
    stepper: OpStepper<'static>,
    done: bool,
    peak_reserved_bytes: u64,
}

/// Replays `trace` on `gpu` (see the module docs) and returns the validation report.
///
/// Everything allocated on the GPU — the balloon included — is given back before this
/// returns, whether it returns a report or an error, or unwinds from a panic.
pub fn cuda_replay<G: Gpu>(
    gpu: G,
    trace: &Trace,
    opts: &CudaReplayOptions,
    obs: &mut dyn Observer,
) -> Result<CudaReplayReport, NativeError> {
    let d = opts.trace_device;
    let dt: &DeviceTrace = trace.devices.get(d).ok_or_else(|| {
        NativeError::Config(format!(
            "--trace-device {d}: the trace has {} device(s)",
            trace.devices.len()
        ))
    })?;
    let settings = &trace.snapshot.settings;
    let mut notes = Vec::new();
    // The spec's config is parsed once: the models and the simulated device come from it.
    let resolved = match (opts.mode, opts.spec.resolve(settings)) {
        (_, Ok(r)) => Some(r),
        (Mode::Model, Err(e)) => return Err(e.into()),
        (Mode::Raw, Err(e)) => {
            notes.push(format!("no prediction: {e}"));
            None
        }
    };
    let sim_model = resolved.clone().map(|r| r.build(opts.capacity_bytes));
    let mut real_model: Box<dyn Allocator> = match (opts.mode, &sim_model) {
        (Mode::Model, Some(m)) => m.clone_box(),
        _ => Box::new(RawPassthrough::new()),
    };
    if dt.initial_ops > 0 {
        notes.push(format!("the trace starts mid-program: its {} initial blocks are allocated first, on the GPU and in the simulation alike", dt.initial_ops));
    }
    let info = gpu.info().clone();
    let granularity = gpu.granularity().max(1);
    let mut device = CudaDevice::new(gpu, opts.capacity_bytes);
    let balloon_free = match opts.balloon_free_bytes {
        None => None,
        Some(b) => {
            let (free, _) = device.gpu().mem_get_info().map_err(|e| driver(0, 0, e))?;
            if b > free {
                return Err(NativeError::Config(format!(
                    "--balloon {b}: only {free} bytes are free on {}",
                    info.name
                )));
            }
            Some(device.inflate_balloon(b).map_err(|e| driver(0, 0, e))?)
        }
    };
    let (baseline_free, _) = device.gpu().mem_get_info().map_err(|e| driver(0, 0, e))?;
    let n = dt.ops.len();
    obs.started(&info, balloon_free, n);

    // The simulation gets the memory the GPU has for the replay: what the driver hands out
    // of the free memory now, under the cap. Behind a balloon that is measured (the driver
    // keeps back a GPU-dependent part of what it reports free); on a GPU with all its
    // memory free the rule stands in, as probing would briefly take the whole GPU.
    let usable = if balloon_free.is_some() {
        device.probe_usable_bytes().map_err(|e| driver(0, 0, e))?
    } else {
        driver_usable_bytes(baseline_free, granularity)
    };
    let sim_limit = opts.capacity_bytes.map_or(usable, |c| c.min(usable));
    let mut sim = sim_model.zip(resolved).map(|(model, resolved)| SimRun {
        model,
        device: Counting {
            inner: session::simulated_device_for(
                trace,
                d,
                &resolved,
                info.total_bytes,
                Some(sim_limit),
            ),
            refusals: 0,
        },
        stepper: OpStepper::new(dt, false),
        done: false,
        peak_reserved_bytes: 0,
    });

    let mut stepper = OpStepper::new(dt, false);
    let mut verifier = opts.verify_data.then(Verifier::default);
    let mut out: Vec<ModelEvent> = Vec::with_capacity(16);
    let mut sim_out: Vec<ModelEvent> = Vec::with_capacity(16);
    let mut agreement = Agreement::default();
    let mut first_refusal = EventPair::default();
    let mut peaks = Peaks::default();
    let mut timeline: Vec<Sample> = Vec::new();
    let mut segment_events = 0u64;
    let mut real_done = false;
    let (mut real_oom, mut sim_oom) = (OomSeen::default(), OomSeen::default());
    let mut ops_replayed = 0;
    let mut stopped = false;
    let (mut pred_n, mut pred_sum, mut pred_max) = (0u64, 0f64, 0u64);

    for (k, op) in dt.ops.iter().enumerate() {
        let event_index = u64::from(op.event_index);
        let mut sample: Option<Sample> = None;
        if let Some(s) = sim.as_mut().filter(|s| !s.done) {
            sim_out.clear();
            if let Step::Oom { fatal, .. } =
                s.stepper
                    .step(dt, k, s.model.as_mut(), &mut s.device, &mut sim_out)
            {
                s.done = sim_oom.note(event_index, fatal);
            }
            if s.device.refusals > 0 && first_refusal.simulated_event_index.is_none() {
                first_refusal.simulated_event_index = Some(event_index);
            }
            s.peak_reserved_bytes = s.peak_reserved_bytes.max(s.model.stats().reserved_bytes);
        }
        if !real_done {
            // The data check reads a block back when the program frees it.
            if let (Some(v), OpKind::Free { alloc, .. }) = (verifier.as_mut(), op.kind)
                && let (Some(ptr), OpKind::Alloc { size_bytes, .. }) = (
                    stepper.held_addr(dt, alloc as usize),
                    dt.ops[alloc as usize].kind,
                )
            {
                v.check(
                    device.gpu_mut(),
                    ptr,
                    size_bytes,
                    alloc as usize,
                    event_index,
                )
                .map_err(|e| driver(k, event_index, e))?;
            }
            out.clear();
            let step = stepper.step(dt, k, real_model.as_mut(), &mut device, &mut out);
            if let Some(e) = device.fault() {
                return Err(driver(k, event_index, e.clone()));
            }
            match step {
                Step::Served(ptr) => {
                    if let (Some(v), Some(_), OpKind::Alloc { size_bytes, .. }) =
                        (verifier.as_mut(), stepper.held_addr(dt, k), op.kind)
                    {
                        v.write(device.gpu_mut(), ptr, size_bytes, k)
                            .map_err(|e| driver(k, event_index, e))?;
                    }
                }
                Step::Oom { fatal, .. } => real_done = real_oom.note(event_index, fatal),
                Step::Done => {}
            }
            if device.driver_refusals() > 0 && first_refusal.real_event_index.is_none() {
                first_refusal.real_event_index = Some(event_index);
            }
            ops_replayed = k + 1;
            let events = out.iter().filter(|e| is_segment_event(e)).count() as u64;
            segment_events += events;
            if events > 0 || (k + 1) % PROGRESS_EVERY == 0 || k + 1 == n {
                let (free, _) = device
                    .gpu()
                    .mem_get_info()
                    .map_err(|e| driver(k, event_index, e))?;
                let real = baseline_free.saturating_sub(free);
                let model_reserved = real_model.stats().reserved_bytes;
                let sim_reserved = sim.as_ref().map(|s| s.model.stats().reserved_bytes);
                peaks.real_used_bytes = peaks.real_used_bytes.max(real);
                peaks.model_reserved_bytes = peaks.model_reserved_bytes.max(model_reserved);
                if events > 0 {
                    // Model mode: the model's own accounting; raw mode: the prediction.
                    let accounted = match opts.mode {
                        Mode::Model => Some(model_reserved),
                        Mode::Raw => sim_reserved,
                    };
                    if let Some(acc) = accounted {
                        let diff = acc.abs_diff(real);
                        agreement.events_compared += 1;
                        agreement.max_abs_diff_bytes = agreement.max_abs_diff_bytes.max(diff);
                        if acc.div_ceil(granularity) == real.div_ceil(granularity) {
                            agreement.events_equal += 1;
                        } else if agreement.first_difference.is_none() {
                            agreement.first_difference = Some(Difference {
                                event_index,
                                accounted_bytes: acc,
                                real_bytes: real,
                            });
                        }
                    }
                }
                if let Some(sr) = sim_reserved {
                    let e = sr.abs_diff(real);
                    pred_n += 1;
                    pred_sum += e as f64;
                    pred_max = pred_max.max(e);
                }
                sample = Some(Sample {
                    op: k as u64,
                    event_index,
                    real_used_bytes: real,
                    model_reserved_bytes: model_reserved,
                    sim_reserved_bytes: sim_reserved,
                    segment_event: events > 0,
                });
            }
        }
        if let Some(s) = sample {
            obs.sample(&s);
            timeline.push(s);
        }
        if ((k + 1) % PROGRESS_EVERY == 0 || k + 1 == n) && !obs.progress(k + 1, n) {
            stopped = true;
            break;
        }
        if real_done && sim.as_ref().is_none_or(|s| s.done) {
            break;
        }
    }

    let oom = EventPair {
        simulated_event_index: sim_oom.event_index,
        real_event_index: real_oom.event_index,
    };
    let driver_refusal = device.first_refusal();
    if let (Some(rf), Some(real), Some(sim)) = (
        driver_refusal,
        first_refusal.real_event_index,
        first_refusal.simulated_event_index,
    ) && real != sim
    {
        notes.push(format!(
            "the driver first refused at event {real}, the simulation at event {sim}: the driver refused {} bytes with {} bytes still free (cuMemGetInfo), which the simulated device counts as usable",
            rf.requested_bytes, rf.free_bytes
        ));
    }
    let latency_us = device
        .latencies()
        .summary()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    device
        .release_all()
        .map_err(|e| driver(ops_replayed, 0, e))?;
    let (free_end, _) = device
        .gpu()
        .mem_get_info()
        .map_err(|e| driver(ops_replayed, 0, e))?;
    drop(device);

    let sim_peak = sim.as_ref().map_or(0, |s| s.peak_reserved_bytes);
    peaks.simulated_reserved_bytes = sim_peak;
    let prediction = sim.as_ref().map(|_| Prediction {
        model: opts.spec.label(),
        ops_compared: pred_n,
        max_abs_error_bytes: pred_max,
        mean_abs_error_bytes: if pred_n == 0 {
            0.0
        } else {
            pred_sum / pred_n as f64
        },
        peak_predicted_bytes: sim_peak,
        peak_real_bytes: peaks.real_used_bytes,
        peak_relative_error: if peaks.real_used_bytes == 0 {
            0.0
        } else {
            (sim_peak as f64 - peaks.real_used_bytes as f64) / peaks.real_used_bytes as f64
        },
    });
    let (allocator, config) = match (opts.mode, sim.as_ref()) {
        (Mode::Model, _) => (real_model.name().to_string(), real_model.config_string()),
        (Mode::Raw, Some(s)) => (s.model.name().to_string(), s.model.config_string()),
        (Mode::Raw, None) => (
            opts.spec.kind.name().to_string(),
            opts.spec.config.clone().unwrap_or_default(),
        ),
    };
    Ok(CudaReplayReport {
        schema: 1,
        device: info.clone(),
        mode: opts.mode,
        allocator,
        config,
        capacity_bytes: opts.capacity_bytes,
        balloon_free_bytes: balloon_free,
        events: dt.events,
        segment_events,
        reserved_agreement: agreement,
        oom,
        latency_us,
        verify_data: verifier.map(|v| v.report),
        first_refusal,
        driver_refusal,
        prediction,
        peaks,
        simulated_limit_bytes: sim_limit,
        ops: n,
        ops_replayed,
        stopped,
        free_bytes_at_end: free_end,
        leaked_bytes: info.free_bytes_at_start as i64 - free_end as i64,
        notes,
        timeline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fatal_oom_after_reproduced_ones_is_reported_and_stops() {
        let mut o = OomSeen::default();
        assert!(!o.note(5, false), "a reproduced OOM goes on");
        assert!(!o.note(7, false));
        assert_eq!(o.event_index, Some(5), "the first is reported");
        assert!(o.note(9, true), "a fatal one stops");
        assert_eq!(o.event_index, Some(9), "and replaces reproduced ones");
        let mut f = OomSeen::default();
        assert!(f.note(3, true));
        assert_eq!(f.event_index, Some(3));
    }

    #[test]
    fn the_driver_hands_out_whole_pages_less_one() {
        const MIB: u64 = 1 << 20;
        assert_eq!(driver_usable_bytes(101 * MIB + MIB / 8, 2 * MIB), 98 * MIB);
        assert_eq!(
            driver_usable_bytes(1025 * MIB + MIB / 8, 2 * MIB),
            1022 * MIB
        );
        assert_eq!(driver_usable_bytes(MIB, 2 * MIB), 0);
        assert_eq!(driver_usable_bytes(0, 0), 0);
    }

    #[test]
    fn patterns_differ_between_neighbours_and_are_never_zero() {
        let words: Vec<u32> = (0..10_000).map(pattern_word).collect();
        assert!(words.iter().all(|&w| w != 0));
        assert!(words.windows(2).all(|w| w[0] != w[1]));
    }

    #[test]
    fn spans_cover_small_blocks_whole_and_big_blocks_at_both_ends() {
        assert_eq!(sample_spans(0), vec![]);
        assert_eq!(sample_spans(100), vec![(0, 100)]);
        assert_eq!(sample_spans(4096), vec![(0, 4096)]);
        let s = sample_spans(1 << 20);
        assert_eq!(s.first(), Some(&(0, 256)));
        assert_eq!(s.last(), Some(&((1 << 20) - 256, 256)));
        assert!(s.iter().all(|&(o, l)| o + l <= 1 << 20));
    }
}
