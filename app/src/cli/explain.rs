//! `allocsim explain FILE [--allocator NAME] [--config STR] [--capacity SIZE|none] [--at EVENT] [--trace-device D] [--json]`:
//! why a request did not fit (`allocsim_core::explain`), with what would have.

use allocsim_core::capacity::{CapacityArg, CapacityChoice};
use allocsim_core::explain::{self, BlockerKind, ExplainOptions, Explanation, Moment};
use allocsim_core::units::format_size;
use serde_json::{Value, json};

use super::progress;
use super::replay::print_capacity_note;
use super::source::{Source, load_device};
use super::{Failure, parse_capacity_arg, print_answer, schema_json};

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
    /// Explain the first request at or after this event (an index into `device_traces[D]`) instead of the OOM or the peak
    #[arg(long, value_name = "EVENT")]
    at: Option<u64>,
    /// Which `device_traces[D]` to replay (default: the one with the most events)
    #[arg(long)]
    trace_device: Option<usize>,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
}

/// An explanation `a` asks for, and what its output shows.
pub struct Outcome {
    name: String,
    device: usize,
    allocator: String,
    config: Option<String>,
    capacity: CapacityChoice,
    explanation: Explanation,
}

impl Outcome {
    /// The `--json` object.
    #[must_use]
    pub fn json(&self) -> Value {
        let mut v = schema_json(&self.explanation);
        if let Value::Object(m) = &mut v {
            m.insert("device".into(), json!(self.device));
            m.insert("allocator".into(), json!(self.allocator));
            m.insert("config".into(), json!(self.config));
            m.insert("capacity_source".into(), json!(self.capacity.source));
            m.insert("capacity_inferred".into(), json!(self.capacity.inferred));
            m.insert("capacity_note".into(), json!(self.capacity.note));
        }
        v
    }
}

/// Runs the search `a` asks for.
pub fn outcome(a: &Args) -> Result<Outcome, Failure> {
    let spec = super::model_spec(&a.allocator, a.config.as_deref())?;
    let (src, d, capacity) = load_device(&a.input, a.capacity, a.trace_device)?;
    let opts = ExplainOptions {
        at_event: a.at,
        what_if: true,
        without_bounds: false,
    };
    let e = progress::search("explain", &src.name, |threads, bar| {
        explain::explain(&src.trace, d, &spec, capacity.bytes, opts, threads, bar)
    })?;
    Ok(Outcome {
        name: src.name,
        device: d,
        allocator: spec.kind.name().to_string(),
        config: spec.config,
        capacity,
        explanation: e,
    })
}

pub fn run(a: &Args) -> Result<u8, Failure> {
    let o = outcome(a)?;
    print_answer(
        a.json,
        || o.json(),
        || {
            print_text(&o.name, o.device, &o.explanation);
            print_capacity_note(&o.capacity);
        },
    )
}

fn print_text(name: &str, d: usize, e: &Explanation) {
    if let Some(m) = &e.pytorch_message {
        crate::say!("{m}");
    }
    crate::say!("{}.", e.sentence);
    crate::say!();
    let what = match e.moment {
        Moment::Oom => "out of memory",
        Moment::Event => "chosen event",
        Moment::Peak => "peak reserved",
    };
    crate::say!(
        "{name} — device {d}, {what} at event {}: reserved {}, allocated {}, capacity {}",
        e.at_event,
        format_size(e.reserved_bytes),
        format_size(e.allocated_bytes),
        e.capacity_bytes
            .map_or_else(|| "unlimited".to_string(), format_size)
    );
    crate::say!(
        "  request             {} → {} block (segment {}), stream {}, at {}",
        format_size(e.request.requested_bytes),
        format_size(e.request.rounded_bytes),
        format_size(e.request.segment_bytes),
        e.request.stream,
        e.request.site
    );
    crate::say!();
    crate::say!(
        "Holes of its pool and stream: {} holes, {} free, the largest {}",
        e.holes_count,
        format_size(e.holes_bytes),
        format_size(e.largest_hole_bytes)
    );
    for h in e.holes.iter().take(10) {
        let opened = h.opened_at_event.map_or_else(
            || "never freed into since its segment was created".to_string(),
            |ev| {
                format!(
                    "opened by the free at event {ev}{}{}",
                    h.freed_block_site
                        .as_ref()
                        .map_or_else(String::new, |s| format!(" of a block from {s}")),
                    h.frames
                        .first()
                        .map_or_else(String::new, |f| format!(" ({f})"))
                )
            },
        );
        crate::say!("  {:>12} at {:#x}  {opened}", format_size(h.bytes), h.addr);
        for (side, n) in [("before", &h.before), ("after", &h.after)] {
            if let Some(n) = n {
                crate::say!(
                    "  {:>12}   {side}: {} live at {:#x}{}{}",
                    "",
                    format_size(n.bytes),
                    n.addr,
                    n.site
                        .as_ref()
                        .map_or_else(String::new, |s| format!(" from {s}")),
                    n.allocated_at_event
                        .map_or_else(String::new, |ev| format!(" (event {ev})"))
                );
            }
        }
    }
    if e.holes_count > 10 {
        crate::say!("  … and {} more", e.holes_count - 10);
    }
    crate::say!();
    match &e.blocker_set {
        None if e.fits_without_blockers && e.releasable_cached_bytes > 0 => crate::say!(
            "Blockers: none — the request fits once the {} of cached segments without live blocks are released (the allocator releases them and retries)",
            format_size(e.releasable_cached_bytes)
        ),
        None if e.fits_without_blockers => {
            crate::say!("Blockers: none — a free run of its pool and stream holds the request");
        }
        None => {
            crate::say!("Blockers: none — no set of live blocks in one segment would make room");
        }
        Some(s) => {
            let how = match s.kind {
                BlockerKind::Window => format!(
                    "removing them would leave a free run of {} in the {} segment at {:#x}",
                    format_size(s.would_free_contiguous_bytes),
                    format_size(s.segment_bytes),
                    s.segment_addr
                ),
                BlockerKind::Release => format!(
                    "removing them would let the {} segment at {:#x} be released, leaving room for {}",
                    format_size(s.segment_bytes),
                    s.segment_addr,
                    format_size(s.would_free_contiguous_bytes)
                ),
            };
            crate::say!(
                "Blockers: {} live block{} ({}); {how}",
                s.blocks,
                if s.blocks == 1 { "" } else { "s" },
                format_size(s.bytes)
            );
            for b in &e.blockers {
                crate::say!("  {}", b.sentence);
            }
        }
    }
    crate::say!();
    if let Some(w) = &e.would_fit {
        crate::say!("{}.", w.best_sentence);
        crate::say!("{}.", w.min_capacity_sentence);
    }
    crate::say!(
        "The best any allocator could do: {} live at the peak (lower bound), {} with an offline placement that knows every lifetime.",
        format_size(e.live_peak_bytes),
        format_size(e.offline_peak_bytes)
    );
}
