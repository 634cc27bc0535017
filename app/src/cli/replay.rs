//! `allocsim replay FILE [--allocator NAME] [--config STR] [--capacity SIZE] [--trace-device D] [--json]`.

use allocsim_core::models::ModelSpec;
use allocsim_core::replay::{ReplayOptions, ReplayResult};
use allocsim_core::units::format_size;
use serde_json::{Value, json};

use super::whatif::{Source, load_source};
use super::{Failure, parse_size_arg, pick_device, print_json};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    input: Source,
    /// The allocator model
    #[arg(long, default_value = "pytorch")]
    allocator: String,
    /// The model's config in PyTorch's key:value,key:value syntax (pytorch: defaults plus STR; without it the snapshot's own settings)
    #[arg(long)]
    config: Option<String>,
    /// The memory the allocator may hold, e.g. 2.2GiB (default: unlimited)
    #[arg(long, value_parser = parse_size_arg)]
    capacity: Option<u64>,
    /// Which `device_traces[D]` to replay (default: the one with the most events)
    #[arg(long)]
    trace_device: Option<usize>,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
}

/// The replay object of DESIGN.md (also each entry of `compare`'s `results`).
#[must_use]
pub fn replay_json(r: &ReplayResult, events: usize) -> Value {
    json!({
        "schema": 1,
        "allocator": r.allocator,
        "config": r.config,
        "capacity_bytes": r.capacity_bytes,
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
        "oom": r.oom.as_ref().map(|o| json!({
            "event_index": o.event_index,
            "requested_bytes": o.requested_bytes,
            "reserved_bytes": o.reserved_bytes,
            "allocated_bytes": o.allocated_bytes,
            "free_bytes": o.free_bytes,
            "largest_free_bytes": o.largest_free_bytes,
            "free_holes": o.free_holes,
            "explanation": o.explanation,
        })),
    })
}

/// Readable text of one replay.
pub fn print_replay_text(label: &str, r: &ReplayResult) {
    println!(
        "{label}  (config: {})",
        if r.config.is_empty() {
            "defaults"
        } else {
            &r.config
        }
    );
    println!(
        "  capacity            {}",
        r.capacity_bytes
            .map_or_else(|| "unlimited".to_string(), format_size)
    );
    println!("  requests            {}", r.requests);
    println!(
        "  peak reserved       {}",
        format_size(r.peak_reserved_bytes)
    );
    println!(
        "  peak allocated      {}",
        format_size(r.peak_allocated_bytes)
    );
    println!(
        "  final reserved      {}",
        format_size(r.final_reserved_bytes)
    );
    println!(
        "  waste at peak       {}",
        format_size(r.internal_waste_bytes_at_peak)
    );
    println!(
        "  fragmentation       {:.1}% at peak, {:.1}% max",
        r.fragmentation_at_peak * 100.0,
        r.max_fragmentation * 100.0
    );
    println!("  segment ops         {}", r.segment_ops);
    match &r.oom {
        None => println!("  out of memory       never"),
        Some(o) => println!(
            "  OUT OF MEMORY at event {}: {}",
            o.event_index, o.explanation
        ),
    }
}

pub fn run(a: &Args) -> Result<u8, Failure> {
    let mut spec = ModelSpec::parse(&a.allocator).map_err(Failure::bad_input)?;
    if spec.config.is_none() {
        spec.config.clone_from(&a.config);
    }
    let v = load_source(&a.input, a.capacity)?;
    let d = pick_device(&v.trace, a.trace_device)?;
    let opts = ReplayOptions {
        checkpoint_every: 0,
        keep_timeline: false,
        ..ReplayOptions::default()
    };
    let r = allocsim_core::session::replay_device(&v.trace, d, &spec, a.capacity, opts)
        .map_err(|e| Failure::bad_input(format!("{}: {e}", v.name)))?;
    if a.json {
        print_json(&replay_json(&r, v.trace.devices[d].events));
    } else {
        print_replay_text(&format!("{} — {} on device {d}", v.name, r.allocator), &r);
    }
    Ok(0)
}
