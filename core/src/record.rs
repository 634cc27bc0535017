//! A trace recorded as PyTorch's memory recorder would have recorded it: its requests
//! stepped through the PyTorch model (PyTorch's default config, on the simulated device a
//! `replay` of the trace uses), and every event the model emits written down as the trace
//! entry `_record_memory_history` makes of it (`segment_alloc`/`segment_free`, `alloc`,
//! `free_requested`, `free_completed`, `oom`, with addresses, sizes and streams); the end
//! state is the model's segments and blocks as `torch.cuda.memory._snapshot()` lists them.
//!
//! So a synthetic workload ([`crate::workloads`]), which has no recording, becomes a
//! snapshot every front end opens (`gen_snapshot --workload SPEC OUT.pickle` writes it
//! with [`crate::snapshot::write`]), and `validate` of that snapshot is exact: the model
//! made every decision in it.
//!
//! What the recorder knows that a workload does not is left as a recording without stacks
//! has it (`_record_memory_history(stacks=None)`: no `frames`); times are the trace's own
//! clock (one microsecond per op), every entry of an op at the op's time.

use crate::models::pytorch::PyTorchConfig;
use crate::models::{Allocator, AllocatorKind, LayoutBlockState, ModelEvent, ModelSpec};
use crate::replay::{OpStepper, Step};
use crate::session;
use crate::snapshot::{
    BlockState, RawBlock, RawEvent, RawSegment, RawSettings, RawSnapshot, SegmentType, StackId,
};
use crate::trace::Trace;

/// Device `device` of `trace` recorded through PyTorch's default allocator: the snapshot
/// PyTorch would have written at the end of the program (or at its first out-of-memory
/// error, where an OOM observer dumps it; the entries stop there). The snapshot has one
/// device, numbered `device`, and PyTorch's default `allocator_settings`.
///
/// # Errors
/// A device the trace does not have.
pub fn record(trace: &Trace, device: usize) -> Result<RawSnapshot, crate::Error> {
    let dt = trace
        .devices
        .get(device)
        .ok_or(crate::Error::Query(crate::QueryError::NoDevice { device }))?;
    let device_index = u32::try_from(device)
        .ok()
        .filter(|&d| d <= crate::build::MAX_DEVICE)
        .ok_or_else(|| {
            crate::Error::Impossible(format!("device {device} is not a CUDA device index"))
        })?;
    // The start `replay` makes (the start state of a wrapped trace loaded, if any, is the
    // state the recording starts in: its blocks come back in the end state).
    let spec = ModelSpec::with_config(AllocatorKind::Pytorch, "");
    let (mut model, mut dev, preloaded) = session::start_model(trace, device, &spec, None)?;
    let mut stepper = OpStepper::new(dt, preloaded);
    let mut entries = Vec::with_capacity(dt.ops.len() * 3 / 2);
    let mut out: Vec<ModelEvent> = Vec::with_capacity(16);
    for (k, op) in dt.ops.iter().enumerate() {
        out.clear();
        let step = stepper.step(dt, k, model.as_mut(), &mut dev, &mut out);
        entries.extend(out.iter().map(|e| RawEvent {
            time_us: op.time_us,
            ..RawEvent::new(e.action, e.addr, e.size, e.stream)
        }));
        if matches!(step, Step::Oom { fatal: true, .. }) {
            break;
        }
    }
    let mut snap = RawSnapshot {
        segments: end_segments(model.as_ref(), device_index),
        settings: default_settings(),
        ..RawSnapshot::default()
    };
    snap.device_traces = vec![Vec::new(); device];
    snap.device_traces.push(entries);
    Ok(snap)
}

/// `allocator_settings` as PyTorch 2.11 writes them with `PYTORCH_CUDA_ALLOC_CONF` unset.
fn default_settings() -> RawSettings {
    let d = PyTorchConfig::default();
    RawSettings {
        conf: String::new(),
        max_split_size_bytes: (d.max_split_size_bytes != u64::MAX)
            .then_some(d.max_split_size_bytes),
        garbage_collection_threshold: d.garbage_collection_threshold,
        expandable_segments: d.expandable_segments,
        roundup_power2_divisions: Some(d.roundup_power2_divisions),
        present: true,
        ..RawSettings::default()
    }
}

/// The model's segments as `snapshot()` lists them: by address; a block's `state` from
/// whether it is allocated or waits for other streams; a segment's `allocated_size` the
/// bytes of its allocated blocks, `active_size` and `requested_size` those of its active
/// (allocated or pending) blocks.
fn end_segments(model: &dyn Allocator, device: u32) -> Vec<RawSegment> {
    let mut segments: Vec<RawSegment> = model
        .layout()
        .segments
        .into_iter()
        .map(|s| {
            let blocks: Vec<RawBlock> = s
                .blocks
                .iter()
                .filter_map(|b| {
                    let state = match b.state {
                        LayoutBlockState::Allocated => BlockState::ActiveAllocated,
                        LayoutBlockState::PendingFree => BlockState::ActivePendingFree,
                        LayoutBlockState::Free => BlockState::Inactive,
                        // Reserved, unmapped address space is no block of a snapshot.
                        LayoutBlockState::Unmapped => return None,
                    };
                    Some(RawBlock {
                        address: b.addr,
                        size: b.size_bytes,
                        requested_size: b.requested_bytes,
                        state,
                        stack: StackId::EMPTY,
                    })
                })
                .collect();
            let sum = |f: &dyn Fn(&RawBlock) -> bool, size: &dyn Fn(&RawBlock) -> u64| {
                blocks.iter().filter(|b| f(b)).map(size).sum::<u64>()
            };
            let allocated = |b: &RawBlock| b.state == BlockState::ActiveAllocated;
            let active = |b: &RawBlock| b.state != BlockState::Inactive;
            RawSegment {
                device,
                address: s.addr,
                total_size: s.size_bytes,
                allocated_size: sum(&allocated, &|b| b.size),
                active_size: sum(&active, &|b| b.size),
                requested_size: sum(&active, &|b| b.requested_size),
                stream: s.stream,
                segment_type: if s.small {
                    SegmentType::Small
                } else {
                    SegmentType::Large
                },
                segment_pool_id: (s.pool.0, s.pool.1),
                is_expandable: s.expandable,
                stack: StackId::EMPTY,
                blocks,
            }
        })
        .collect();
    segments.sort_by_key(|s| s.address);
    segments
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::ReplayOptions;
    use crate::snapshot::Action;
    use crate::snapshot::write::snapshot_bytes;

    /// A workload written as a snapshot decodes, validates exactly (every decision of the
    /// model is the recording's) and replays as the workload itself does.
    #[test]
    fn a_recorded_workload_validates_exactly_and_replays_as_the_workload() {
        for spec in [
            "kvcache:tokens=40,layers=4,requests=2,prompt=10..300",
            "train:steps=4,layers=2,hidden=256,vocab=1000,comm=1",
            "churn:events=20000,live=300,streams=2",
        ] {
            let workload = crate::workloads::generate(spec).unwrap();
            let snap = record(&workload, 0).unwrap();
            let decided = snap.device_traces[0]
                .iter()
                .filter(|e| e.action != Action::FreeRequested && e.action != Action::FreeCompleted)
                .count();
            let bytes = snapshot_bytes(&snap);
            let v = session::load(&bytes, None).unwrap();
            let report = &v.devices[0];
            assert!(
                report.exact && report.end_state_matches,
                "{spec}: {report:?}"
            );
            assert_eq!(report.events_compared as usize, decided, "{spec}");
            let opts = ReplayOptions {
                keep_timeline: false,
                checkpoint_every: 0,
                ..ReplayOptions::default()
            };
            let own = ModelSpec::new(AllocatorKind::Pytorch);
            let ours = session::replay_device(&workload, 0, &own, None, opts).unwrap();
            let theirs = session::replay_device(&v.trace, 0, &own, None, opts).unwrap();
            assert!(ours.oom.is_none() && theirs.oom.is_none(), "{spec}");
            assert_eq!(
                (
                    ours.peak_reserved_bytes,
                    ours.peak_allocated_bytes,
                    ours.segment_ops
                ),
                (
                    theirs.peak_reserved_bytes,
                    theirs.peak_allocated_bytes,
                    theirs.segment_ops
                ),
                "{spec}"
            );
            assert_eq!(ours.requests, theirs.requests, "{spec}");
            assert_eq!(
                ours.final_reserved_bytes, theirs.final_reserved_bytes,
                "{spec}"
            );
        }
    }

    /// The recorded snapshot replayed under other settings (its device follows the
    /// recording's addresses, which lie in the simulated device's synthetic range, until
    /// the setting decides otherwise): every invariant holds after every op, and the peaks
    /// and segment operations are the workload's own under that setting.
    #[test]
    fn a_recorded_workload_replays_under_other_settings_as_the_workload() {
        let w = crate::workloads::generate("kvcache:tokens=500,layers=6").unwrap();
        let v = session::load(&snapshot_bytes(&record(&w, 0).unwrap()), None).unwrap();
        assert!(v.exact());
        for config in [
            "roundup_power2_divisions:8",
            "max_split_size_mb:20",
            "expandable_segments:True",
            "garbage_collection_threshold:0.5",
        ] {
            let spec = ModelSpec::with_config(AllocatorKind::Pytorch, config);
            let opts = ReplayOptions {
                keep_timeline: false,
                checkpoint_every: 0,
                check_every: 1,
                ..ReplayOptions::default()
            };
            let a = session::replay_device(&w, 0, &spec, None, opts).unwrap();
            let b = session::replay_device(&v.trace, 0, &spec, None, opts).unwrap();
            assert_eq!(b.invariant_error, None, "{config}");
            assert_eq!(
                (a.peak_reserved_bytes, a.peak_allocated_bytes, a.segment_ops),
                (b.peak_reserved_bytes, b.peak_allocated_bytes, b.segment_ops),
                "{config}"
            );
        }
    }
}
