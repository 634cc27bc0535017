//! Loading and replaying in one place: a snapshot file's bytes to a [`Trace`], and a
//! trace's device through any model on a simulated device that follows the recording.

use crate::QueryError;
use crate::capacity::{CapacityArg, CapacityChoice};
use crate::device::SimulatedDevice;
use crate::models::pytorch::config::H200_TOTAL_BYTES;
use crate::models::pytorch::{PyTorchConfig, PyTorchModel};
use crate::models::{Allocator, ConfigError, ModelSpec, ResolvedModel};
use crate::replay::{self, ReplayOptions, ReplayResult, ReplayRun};
use crate::snapshot::{RawEvent, RawSettings};
use crate::trace::{DeviceTrace, OpsPiece, StartSegment, Trace};
use crate::validate::Validation;

/// Decodes a snapshot and builds its replayable trace (validating it on the way;
/// `capacity` is the memory cap the program ran under, if known).
pub fn load(bytes: &[u8], capacity: Option<u64>) -> Result<Validation, crate::Error> {
    let snap = crate::snapshot::decode_snapshot(bytes)?;
    crate::build::build(snap, capacity)
}

/// [`load`]'s build of a decoded snapshot (under `capacity`) with the replay of its device
/// `device` through `spec` under the same capacity, where the build's first pass is that
/// replay ([`crate::build::build_replaying`]: the replay [`replay_device`] makes of the
/// built trace, its checkpoints spaced from the ops expected); else `None`, for the
/// caller to replay the built trace. The browser's worker, on one thread, opens so.
pub fn build_replaying(
    snap: crate::snapshot::RawSnapshot,
    capacity: Option<u64>,
    device: u32,
    spec: &ModelSpec,
    opts: ReplayOptions,
) -> Result<(Validation, Option<ReplayResult>), crate::Error> {
    let ride = spec.resolve(&snap.settings).ok().and_then(|resolved| {
        let cfg = resolved.pytorch_config()?.clone();
        let events = snap
            .device_traces
            .get(device as usize)
            .map_or(&[][..], Vec::as_slice);
        let segment_events = crate::build::segment_events(events);
        let sim = simulated_device_from(
            &snap.settings,
            &segment_events,
            &resolved,
            H200_TOTAL_BYTES,
            capacity,
        );
        Some((
            device,
            crate::build::PassReplay {
                device: sim,
                segment_events,
                opts,
                cfg,
            },
        ))
    });
    let mut built = match ride {
        Some(ride) => crate::build::build_replaying(&snap, capacity, ride)?,
        None => crate::build::build_devices(&snap, capacity, None)?,
    };
    let replayed = built.replayed.take();
    let read = crate::trace::SnapshotInfo::read(&snap);
    Ok((built.validation(snap, read).0, replayed))
}

/// The capacity a replay of `trace`'s device `device` runs under when the caller asks for
/// `arg`: a given one, unlimited, or as recorded (inferred from the recording's refusals).
#[must_use]
pub fn capacity(trace: &Trace, device: usize, arg: CapacityArg) -> CapacityChoice {
    let evidence = trace
        .devices
        .get(device)
        .map(|d| d.capacity)
        .unwrap_or_default();
    CapacityChoice::choose(arg, &evidence)
}

/// Device `device` of `trace`, or the error that names it.
fn device_trace(trace: &Trace, device: usize) -> Result<&DeviceTrace, crate::Error> {
    trace
        .devices
        .get(device)
        .ok_or(crate::Error::Query(QueryError::NoDevice { device }))
}

/// Replays device `device` of `trace` through the model `spec` names, under `capacity`.
pub fn replay_device(
    trace: &Trace,
    device: usize,
    spec: &ModelSpec,
    capacity: Option<u64>,
    mut opts: ReplayOptions,
) -> Result<ReplayResult, crate::Error> {
    let dt = device_trace(trace, device)?;
    // The config is parsed once: the model and the device's page size both come from it.
    let resolved = spec.resolve(&trace.snapshot.settings)?;
    let mut dev = simulated_device_for(trace, device, &resolved, H200_TOTAL_BYTES, capacity);
    if let ResolvedModel::Pytorch(cfg) = resolved {
        // Its own type, not a trait object: the per-op calls are direct.
        let (m, preloaded) = pytorch_at_start(cfg, capacity, &dt.start, &mut dev);
        opts.preloaded |= preloaded;
        return Ok(replay::replay_model(dt, m, dev, capacity, opts));
    }
    Ok(replay::replay(
        dt,
        resolved.build(capacity),
        dev,
        capacity,
        opts,
    ))
}

/// The PyTorch model under `cfg` for device `device` of `trace` and its simulated device,
/// as [`replay_device`] starts them for that setting (the flag: the start state was
/// loaded; pass it on as [`ReplayOptions::preloaded`]).
#[must_use]
pub fn pytorch_start(
    trace: &Trace,
    device: usize,
    cfg: &PyTorchConfig,
    capacity: Option<u64>,
) -> (PyTorchModel, SimulatedDevice, bool) {
    let resolved = ResolvedModel::Pytorch(cfg.clone());
    let mut dev = simulated_device_for(trace, device, &resolved, H200_TOTAL_BYTES, capacity);
    let start = trace.devices.get(device).map_or(&[][..], |d| &d.start[..]);
    let (m, preloaded) = pytorch_at_start(cfg.clone(), capacity, start, &mut dev);
    (m, dev, preloaded)
}

/// The PyTorch model under `cfg` with the start state `start` loaded (and its segments
/// preloaded on `dev`) where there is one; the flag says there was.
fn pytorch_at_start(
    cfg: PyTorchConfig,
    capacity: Option<u64>,
    start: &[StartSegment],
    dev: &mut SimulatedDevice,
) -> (PyTorchModel, bool) {
    let mut m = PyTorchModel::new(cfg, capacity);
    if start.is_empty() {
        return (m, false);
    }
    m.load_start(start);
    dev.preload(start.iter().map(|s| s.size_bytes).sum());
    (m, true)
}

/// [`replay_device`] of a device whose trace is being built: its start state, and its
/// ops in pieces as they come (`build::build_streaming`); `settings` and
/// `segment_events` are the snapshot's and the device's recorded segment events. The
/// same result as [`replay_device`] on the built trace, but its checkpoints spaced as for
/// `expected_ops` ops (the number of ops, which spaces them, is not known before the
/// last; `None`: no checkpoints).
#[allow(clippy::too_many_arguments)]
pub fn replay_streamed(
    settings: &RawSettings,
    segment_events: &[RawEvent],
    spec: &ModelSpec,
    capacity: Option<u64>,
    mut opts: ReplayOptions,
    start: &[StartSegment],
    expected_ops: Option<usize>,
    pieces: &mut dyn Iterator<Item = OpsPiece>,
) -> Result<ReplayResult, crate::Error> {
    let resolved = spec.resolve(settings)?;
    let mut dev = simulated_device_from(
        settings,
        segment_events,
        &resolved,
        H200_TOTAL_BYTES,
        capacity,
    );
    let initial_ops = start.iter().map(|s| s.blocks.len()).sum();
    if expected_ops.is_none() {
        opts.checkpoint_every = 0;
    }
    if let ResolvedModel::Pytorch(cfg) = resolved {
        let (mut m, preloaded) = pytorch_at_start(cfg, capacity, start, &mut dev);
        opts.preloaded |= preloaded;
        return Ok(feed(
            ReplayRun::new(&mut m, dev, capacity, opts, initial_ops, None),
            expected_ops,
            pieces,
        ));
    }
    let mut m = resolved.build(capacity);
    Ok(feed(
        ReplayRun::new(m.as_mut(), dev, capacity, opts, initial_ops, None),
        expected_ops,
        pieces,
    ))
}

fn feed<M: Allocator + ?Sized>(
    run: ReplayRun<'_, M>,
    expected_ops: Option<usize>,
    pieces: &mut dyn Iterator<Item = OpsPiece>,
) -> ReplayResult {
    let mut run = match expected_ops {
        Some(n) => run.expecting(n),
        None => run,
    };
    for piece in pieces {
        run.set_pools(&piece.pools);
        for op in &piece.ops {
            run.push(op);
        }
    }
    run.finish()
}

/// The model `spec` names and its simulated device, before the first op of device
/// `device` of `trace`, exactly as [`replay_device`] starts them (the trace's start state
/// loaded where the model can take it); the flag says it was (pass it to
/// [`crate::replay::OpStepper::new`]). For callers that step the ops themselves and look
/// at the state between them.
pub fn start_model(
    trace: &Trace,
    device: usize,
    spec: &ModelSpec,
    capacity: Option<u64>,
) -> Result<(Box<dyn Allocator>, SimulatedDevice, bool), crate::Error> {
    let dt = device_trace(trace, device)?;
    let resolved = spec.resolve(&trace.snapshot.settings)?;
    let mut dev = simulated_device_for(trace, device, &resolved, H200_TOTAL_BYTES, capacity);
    if let ResolvedModel::Pytorch(cfg) = &resolved
        && !dt.start.is_empty()
    {
        let (m, preloaded) = pytorch_at_start(cfg.clone(), capacity, &dt.start, &mut dev);
        return Ok((Box::new(m), dev, preloaded));
    }
    Ok((resolved.build(capacity), dev, false))
}

/// The simulated device a replay of `trace`'s device `device` through `spec` runs on:
/// `total_bytes` of memory, refusing beyond `capacity`, handing out the recording's segment
/// addresses while the model asks for exactly what was recorded. (`replay_device` uses it;
/// so does the CUDA replay for the simulation it compares the GPU with, e.g. with the free
/// memory a balloon left.)
pub fn simulated_device(
    trace: &Trace,
    device: usize,
    spec: &ModelSpec,
    total_bytes: u64,
    capacity: Option<u64>,
) -> Result<SimulatedDevice, ConfigError> {
    let resolved = spec.resolve(&trace.snapshot.settings)?;
    Ok(simulated_device_for(
        trace,
        device,
        &resolved,
        total_bytes,
        capacity,
    ))
}

/// [`simulated_device`] for a spec already resolved.
#[must_use]
pub fn simulated_device_for(
    trace: &Trace,
    device: usize,
    model: &ResolvedModel,
    total_bytes: u64,
    capacity: Option<u64>,
) -> SimulatedDevice {
    let events = trace
        .devices
        .get(device)
        .map_or(&[][..], |d| d.segment_events.as_slice());
    simulated_device_from(
        &trace.snapshot.settings,
        events,
        model,
        total_bytes,
        capacity,
    )
}

/// [`simulated_device_for`] from the snapshot's settings and the device's recorded
/// segment events (what the device's trace keeps of them), before its trace is built.
#[must_use]
pub fn simulated_device_from(
    settings: &RawSettings,
    segment_events: &[RawEvent],
    model: &ResolvedModel,
    total_bytes: u64,
    capacity: Option<u64>,
) -> SimulatedDevice {
    // Expandable reservations are sized from the recording GPU's total (the model's
    // `device_total_bytes`), whatever device the replay runs on.
    let total = H200_TOTAL_BYTES;
    // The PyTorch model's large page; for the other models the recording's own.
    let large_page = match model.pytorch_config() {
        Some(c) => c.large_segment_size_bytes,
        None => {
            PyTorchConfig::from_settings(settings).map_or(20 << 20, |c| c.large_segment_size_bytes)
        }
    };
    // A recorded map's page size: large-pool maps are whole large pages, small-pool maps
    // single 2 MiB pages; the reservation is 9/8 of the device rounded to the page.
    let reservation = move |map_size: u64| {
        let page = if map_size.is_multiple_of(large_page) {
            large_page
        } else {
            2 << 20
        };
        (total + total / 8).div_ceil(page) * page
    };
    let follow = replay::recorded_segment_ops(segment_events, reservation);
    SimulatedDevice::new(total_bytes, capacity).following(follow)
}
