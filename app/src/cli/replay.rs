//! `allocsim replay FILE [--allocator NAME] [--config STR] [--capacity SIZE] [--trace-device D] [--json]`.

use std::path::Path;

use allocsim_core::capacity::{CapacityArg, CapacityChoice};
use allocsim_core::models::ModelSpec;
use allocsim_core::replay::{ReplayOptions, ReplayResult};
use allocsim_core::snapshot::Action;
use allocsim_core::units::format_size;
use serde_json::{Value, json};

use super::source::{Source, load_device};
use super::{Failure, capacity_text, config_text, parse_capacity_arg, print_answer};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub(super) input: Source,
    /// The allocator model
    #[arg(long, default_value = "pytorch")]
    allocator: String,
    /// The model's config in PyTorch's key:value,key:value syntax (pytorch: defaults plus STR; without it the snapshot's own settings)
    #[arg(long)]
    config: Option<String>,
    /// The memory the allocator may hold, e.g. 2.2GiB, or `none` (default: as recorded — inferred where the recording ran out of memory, else unlimited)
    #[arg(long, value_parser = parse_capacity_arg, value_name = "SIZE|none", allow_hyphen_values = true)]
    capacity: Option<CapacityArg>,
    /// Which `device_traces[D]` to replay (default: the one with the most events)
    #[arg(long)]
    trace_device: Option<usize>,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
}

/// The replay object of DESIGN.md (also each entry of `compare`'s `results`); `capacity`
/// says where the replay's capacity came from.
#[must_use]
pub fn replay_json(r: &ReplayResult, events: usize, capacity: &CapacityChoice) -> Value {
    json!({
        "schema": 1,
        "allocator": r.allocator,
        "config": r.config,
        "capacity_bytes": r.capacity_bytes,
        "capacity_source": capacity.source,
        "capacity_inferred": capacity.inferred,
        "capacity_note": capacity.note,
        "events": events,
        "requests": r.requests,
        "peak_reserved_bytes": r.peak_reserved_bytes,
        "peak_allocated_bytes": r.peak_allocated_bytes,
        "peak_requested_bytes": r.peak_requested_bytes,
        "final_reserved_bytes": r.final_reserved_bytes,
        "internal_waste_bytes_at_peak": r.internal_waste_bytes_at_peak,
        "fragmentation_at_peak": r.fragmentation_at_peak,
        "max_fragmentation": r.max_fragmentation,
        "segment_ops": r.segment_ops,
        "driver_time_us": r.driver.driver_time_us,
        "driver": r.driver,
        "oom": r.oom,
        "ooms": r.ooms.iter().map(|o| json!({
            "event_index": o.event_index,
            "requested_bytes": o.requested_bytes,
            "recorded": o.recorded,
            "fatal": o.fatal,
        })).collect::<Vec<_>>(),
    })
}

/// The line that says where an inferred (or not inferable) capacity came from, if any.
pub fn print_capacity_note(capacity: &CapacityChoice) {
    if let Some(n) = &capacity.note {
        crate::say!("  {n}");
    }
}

/// Readable text of one replay under `capacity`.
pub fn print_replay_text(label: &str, r: &ReplayResult, capacity: &CapacityChoice) {
    crate::say!("{label}  (config: {})", config_text(&r.config, "defaults"));
    crate::say!("  capacity            {}", capacity_text(r.capacity_bytes));
    print_capacity_note(capacity);
    crate::say!("  requests            {}", r.requests);
    crate::say!(
        "  peak reserved       {}",
        format_size(r.peak_reserved_bytes)
    );
    crate::say!(
        "  peak allocated      {}",
        format_size(r.peak_allocated_bytes)
    );
    crate::say!(
        "  final reserved      {}",
        format_size(r.final_reserved_bytes)
    );
    crate::say!(
        "  waste at peak       {}",
        format_size(r.internal_waste_bytes_at_peak)
    );
    crate::say!(
        "  fragmentation       {:.1}% at peak, {:.1}% max",
        r.fragmentation_at_peak * 100.0,
        r.max_fragmentation * 100.0
    );
    crate::say!(
        "  segment ops         {} ({} cudaMalloc, {} cudaFree, {} pages mapped, {} unmapped; {} synchronize the device)",
        r.segment_ops,
        r.driver.mallocs,
        r.driver.frees,
        r.driver.pages_mapped,
        r.driver.pages_unmapped,
        r.driver.synchronizing
    );
    crate::say!(
        "  driver time         {:.2} ms predicted ({})",
        r.driver.driver_time_us / 1000.0,
        allocsim_core::cost::DEFAULT.measured_on
    );
    if r.ooms.is_empty() {
        crate::say!("  out of memory       never");
    }
    for o in &r.ooms {
        let status = if o.recorded {
            "as recorded: the program caught it and went on"
        } else {
            "the program would have died here"
        };
        crate::say!("  OUT OF MEMORY at event {} ({status})", o.event_index);
        if let Some(m) = &o.pytorch_message {
            crate::say!("    {m}");
        }
        crate::say!("    {}", o.explanation);
    }
}

/// A replay `a` asks for, and what its output shows.
pub struct Outcome {
    name: String,
    device: usize,
    events: usize,
    capacity: CapacityChoice,
    result: ReplayResult,
}

impl Outcome {
    /// The `--json` object.
    #[must_use]
    pub fn json(&self) -> Value {
        replay_json(&self.result, self.events, &self.capacity)
    }
}

/// Runs the replay `a` asks for.
pub fn outcome(a: &Args) -> Result<Outcome, Failure> {
    let spec = super::model_spec(&a.allocator, a.config.as_deref())?;
    let opts = ReplayOptions {
        checkpoint_every: 0,
        keep_timeline: false,
        ..ReplayOptions::default()
    };
    if let (Some(path), None, None) = (&a.input.file, &a.input.workload, &a.input.memory) {
        return streamed(a, &spec, path, opts);
    }
    let (v, d, capacity) = load_device(&a.input, a.capacity, a.trace_device)?;
    let r = allocsim_core::session::replay_device(&v.trace, d, &spec, capacity.bytes, opts)
        .map_err(|e| Failure::bad_input(format!("{}: {e}", v.name)))?;
    Ok(Outcome {
        name: v.name,
        device: d,
        events: v.trace.devices[d].events,
        capacity,
        result: r,
    })
}

/// The replay of FILE, run on a thread of its own while the trace is built: the build
/// hands the replayed device's start state and ops on as it makes them
/// (`build::build_streaming`). The replay runs under the capacity it will have — given,
/// or as recorded: then unlimited is assumed, what a recording without a refusal gets —
/// and is kept only if the build says its ops are the trace's and the capacity is the one
/// chosen from the built trace; else the device is replayed again on the trace. Either
/// way the answer is that of the replay after the build.
fn streamed(
    a: &Args,
    spec: &ModelSpec,
    path: &Path,
    opts: ReplayOptions,
) -> Result<Outcome, Failure> {
    let name = path.display().to_string();
    let snap = super::decode_path(path)?;
    let arg = a.capacity.unwrap_or_default();
    let devices = snap.device_traces.len();
    // `Trace::busiest_device`: the most events, the first of equals.
    let d = a.trace_device.unwrap_or_else(|| {
        (0..devices)
            .max_by_key(|&i| (snap.device_traces[i].len(), std::cmp::Reverse(i)))
            .unwrap_or(0)
    });
    let events = snap.device_traces.get(d).map_or(&[][..], Vec::as_slice);
    let assumed = match arg {
        CapacityArg::Bytes(b) => Some(b),
        CapacityArg::Unlimited | CapacityArg::AsRecorded => None,
    };
    // A recorded refusal makes an inferred capacity likely: no replay beside the build.
    let stream =
        !(arg == CapacityArg::AsRecorded && events.iter().any(|e| e.action == Action::Oom));
    let settings = snap.settings.clone();
    let segment_events = allocsim_core::build::segment_events(events);
    let device = u32::try_from(d).ok().filter(|_| stream);
    let (built, beside) =
        crate::engine::open::build_replaying(snap, arg.given_bytes(), device, |start, pieces| {
            allocsim_core::session::replay_streamed(
                &settings,
                &segment_events,
                spec,
                assumed,
                opts,
                start,
                None,
                pieces,
            )
            .ok()
        });
    let (v, exact) = built.map_err(|e| Failure::bad_input(format!("{name}: {e}")))?;
    let streamed_device = d;
    let d = super::pick_device(&v.trace, a.trace_device)?;
    let capacity = allocsim_core::session::capacity(&v.trace, d, arg);
    let result = match beside {
        Some(r) if exact && d == streamed_device && capacity.bytes == assumed => r,
        _ => allocsim_core::session::replay_device(&v.trace, d, spec, capacity.bytes, opts)
            .map_err(|e| Failure::bad_input(format!("{name}: {e}")))?,
    };
    Ok(Outcome {
        name,
        device: d,
        events: v.trace.devices[d].events,
        capacity,
        result,
    })
}

pub fn run(a: &Args) -> Result<u8, Failure> {
    let o = outcome(a)?;
    print_answer(
        a.json,
        || o.json(),
        || {
            print_replay_text(
                &format!("{} — {} on device {}", o.name, o.result.allocator, o.device),
                &o.result,
                &o.capacity,
            );
        },
    )
}
