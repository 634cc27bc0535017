//! Loading and replaying in one place: a snapshot file's bytes to a [`Trace`], and a
//! trace's device through any model on a simulated device that follows the recording.

use crate::QueryError;
use crate::capacity::{CapacityArg, CapacityChoice};
use crate::device::SimulatedDevice;
use crate::models::pytorch::config::H200_TOTAL_BYTES;
use crate::models::pytorch::{PyTorchConfig, PyTorchModel};
use crate::models::{Allocator, ConfigError, ModelSpec, ResolvedModel};
use crate::replay::{self, ReplayOptions, ReplayResult};
use crate::trace::{DeviceTrace, Trace};
use crate::validate::Validation;

/// Decodes a snapshot and builds its replayable trace (validating it on the way;
/// `capacity` is the memory cap the program ran under, if known).
pub fn load(bytes: &[u8], capacity: Option<u64>) -> Result<Validation, crate::Error> {
    let snap = crate::snapshot::decode_snapshot(bytes)?;
    crate::build::build(snap, capacity)
}

/// [`load`] of bytes it owns, dropped once decoded: a big file's bytes and its trace are
/// never in memory together (`allocsim validate` of a 1.12 GB snapshot: peak RSS 2.40 GB
/// with [`load`], 1.82 GB with this).
pub fn load_owned(bytes: Vec<u8>, capacity: Option<u64>) -> Result<Validation, crate::Error> {
    let snap = crate::snapshot::decode_snapshot(&bytes)?;
    drop(bytes);
    crate::build::build(snap, capacity)
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
        let mut m = PyTorchModel::new(cfg, capacity);
        if !dt.start.is_empty() {
            m.load_start(&dt.start);
            dev.preload(dt.start.iter().map(|s| s.size_bytes).sum());
            opts.preloaded = true;
        }
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
        let mut m = PyTorchModel::new(cfg.clone(), capacity);
        m.load_start(&dt.start);
        dev.preload(dt.start.iter().map(|s| s.size_bytes).sum());
        return Ok((Box::new(m), dev, true));
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
    // Expandable reservations are sized from the recording GPU's total (the model's
    // `device_total_bytes`), whatever device the replay runs on.
    let total = H200_TOTAL_BYTES;
    // The PyTorch model's large page; for the other models the recording's own.
    let large_page = match model.pytorch_config() {
        Some(c) => c.large_segment_size_bytes,
        None => PyTorchConfig::from_settings(&trace.snapshot.settings)
            .map_or(20 << 20, |c| c.large_segment_size_bytes),
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
    let follow = trace.devices.get(device).map_or_else(Vec::new, |d| {
        replay::recorded_segment_ops(&d.segment_events, reservation)
    });
    SimulatedDevice::new(total_bytes, capacity).following(follow)
}
