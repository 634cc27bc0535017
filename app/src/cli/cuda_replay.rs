//! `allocsim cuda-replay FILE [--mode model|raw] [--allocator NAME] [--config STR]
//! [--capacity SIZE] [--balloon SIZE] [--verify-data] [--device N] [--trace-device D]
//! [--json]`: the replay on a real GPU (crate allocsim-native), with the validation report
//! of DESIGN.md. Exit 3 where there is no CUDA driver or GPU, or in a build without the
//! `cuda` feature.

use std::path::PathBuf;

use super::{Failure, Input, parse_size_arg};

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeArg {
    /// The model on real memory: only its segment operations reach the driver
    Model,
    /// Every request a cuMemAlloc, every free a cuMemFree
    Raw,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    input: Input,
    /// What reaches the driver
    #[arg(long, value_enum, default_value = "model")]
    mode: ModeArg,
    /// The allocator model (raw mode: the model whose prediction is checked; default pytorch, raw mode cuda-malloc)
    #[arg(long)]
    allocator: Option<String>,
    /// The model's config in PyTorch's key:value,key:value syntax
    #[arg(long)]
    config: Option<String>,
    /// The memory the allocator may hold, e.g. 2.2GiB (default: unlimited)
    #[arg(long, value_parser = parse_size_arg, allow_hyphen_values = true)]
    capacity: Option<u64>,
    /// First fill the GPU so that only SIZE stays free: the driver itself refuses beyond it
    #[arg(long, value_parser = parse_size_arg, allow_hyphen_values = true)]
    balloon: Option<u64>,
    /// Write a pattern into every live block and check it before its free
    #[arg(long)]
    verify_data: bool,
    /// The CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Which `device_traces[D]` to replay (default: the one with the most events)
    #[arg(long)]
    trace_device: Option<usize>,
    /// One JSON object on stdout
    #[arg(long)]
    json: bool,
    /// Also write the real-vs-simulated curves as CSV to FILE
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
}

/// The checked request: the model, the loaded trace and the device of it to replay. Bad
/// input is exit 2 whether or not this build or machine has CUDA.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct Request {
    spec: allocsim_core::models::ModelSpec,
    validation: allocsim_core::validate::Validation,
    trace_device: usize,
}

fn check(a: &Args) -> Result<Request, Failure> {
    use allocsim_core::models::{AllocatorKind, ModelSpec};
    let spec = match (&a.allocator, a.mode) {
        (Some(name), _) => super::model_spec(name, a.config.as_deref())?,
        (None, ModeArg::Model) => ModelSpec {
            kind: AllocatorKind::Pytorch,
            config: a.config.clone(),
        },
        // Raw mode checks the cuda-malloc model's prediction (the report says so if this
        // build has no such model).
        (None, ModeArg::Raw) => ModelSpec {
            kind: AllocatorKind::CudaMalloc,
            config: a.config.clone(),
        },
    };
    let validation = super::load_file(&a.input.file, a.capacity)?;
    let trace_device = super::pick_device(&validation.trace, a.trace_device)?;
    Ok(Request {
        spec,
        validation,
        trace_device,
    })
}

#[cfg(not(feature = "cuda"))]
pub fn run(a: &Args) -> Result<u8, Failure> {
    let _ = check(a)?;
    let _ = (a.balloon, a.verify_data, a.device, a.json, &a.timeline);
    Err(Failure::unavailable(
        "cuda-replay: this build of allocsim has no CUDA support (cargo feature `cuda`)",
    ))
}

#[cfg(feature = "cuda")]
pub fn run(a: &Args) -> Result<u8, Failure> {
    use allocsim_native::replay::NoObserver;
    use allocsim_native::{CudaReplayOptions, Mode, NativeError};

    let Request {
        spec,
        validation: v,
        trace_device: d,
    } = check(a)?;
    let mode = match a.mode {
        ModeArg::Model => Mode::Model,
        ModeArg::Raw => Mode::Raw,
    };
    let opts = CudaReplayOptions {
        mode,
        spec,
        capacity_bytes: a.capacity,
        balloon_free_bytes: a.balloon,
        verify_data: a.verify_data,
        trace_device: d,
    };
    let report = allocsim_native::cuda_replay_on(a.device, &v.trace, &opts, &mut NoObserver)
        .map_err(|e| match e {
            NativeError::Unavailable(u) => {
                Failure::unavailable(format!("cuda-replay: {}", u.reason))
            }
            NativeError::Config(m) => {
                Failure::bad_input(format!("{}: {m}", a.input.file.display()))
            }
            NativeError::Model(m) => Failure::bad_input(format!("{}: {m}", a.input.file.display())),
            NativeError::Driver { .. } => Failure::unavailable(format!(
                "{}: CUDA driver failure at {e} (all device memory was given back)",
                a.input.file.display()
            )),
        })?;
    if let Some(path) = &a.timeline {
        std::fs::write(path, timeline_csv(&report))
            .map_err(|e| Failure::bad_input(format!("{}: cannot write: {e}", path.display())))?;
    }
    if a.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => crate::say!("{s}"),
            Err(e) => return Err(Failure::bad_input(format!("cannot print JSON: {e}"))),
        }
    } else {
        print_text(&a.input.file, &report);
    }
    Ok(0)
}

/// The samples as CSV: one row per sampled op.
#[cfg(feature = "cuda")]
fn timeline_csv(r: &allocsim_native::CudaReplayReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::from(
        "op,event_index,real_used_bytes,model_reserved_bytes,sim_reserved_bytes,segment_event\n",
    );
    for x in &r.timeline {
        let sim = x
            .sim_reserved_bytes
            .map_or_else(String::new, |b| b.to_string());
        let _ = writeln!(
            s,
            "{},{},{},{},{sim},{}",
            x.op,
            x.event_index,
            x.real_used_bytes,
            x.model_reserved_bytes,
            u8::from(x.segment_event)
        );
    }
    s
}

#[cfg(feature = "cuda")]
fn print_text(file: &std::path::Path, r: &allocsim_native::CudaReplayReport) {
    use allocsim_core::units::format_size;
    let idx = |i: Option<u64>| i.map_or_else(|| "none".to_string(), |i| format!("event {i}"));
    crate::say!(
        "{} — {} on {} ({} free of {})",
        file.display(),
        r.allocator,
        r.device.name,
        format_size(r.device.free_bytes_at_start),
        format_size(r.device.total_bytes)
    );
    crate::say!(
        "  mode                {}",
        if r.mode == allocsim_native::Mode::Model {
            "model"
        } else {
            "raw"
        }
    );
    crate::say!(
        "  config              {}",
        super::config_text(&r.config, "defaults")
    );
    crate::say!(
        "  capacity            {}",
        super::capacity_text(r.capacity_bytes)
    );
    if let Some(b) = r.balloon_free_bytes {
        crate::say!("  balloon             {} left free", format_size(b));
    }
    crate::say!(
        "  ops                 {} of {} replayed, {} segment events",
        r.ops_replayed,
        r.ops,
        r.segment_events
    );
    let a = &r.reserved_agreement;
    crate::say!(
        "  reserved agreement  {} of {} segment events equal (max difference {})",
        a.events_equal,
        a.events_compared,
        format_size(a.max_abs_diff_bytes)
    );
    crate::say!(
        "  out of memory       real {}, simulated {}",
        idx(r.oom.real_event_index),
        idx(r.oom.simulated_event_index)
    );
    crate::say!(
        "  first refusal       real {}, simulated {}",
        idx(r.first_refusal.real_event_index),
        idx(r.first_refusal.simulated_event_index)
    );
    for (k, l) in &r.latency_us {
        if l.count > 0 {
            crate::say!(
                "  latency {k:<11} {} calls, p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
                l.count,
                l.p50,
                l.p99,
                l.max
            );
        }
    }
    if let Some(p) = &r.prediction {
        crate::say!(
            "  prediction ({})    peak {} vs real {} ({:+.2}%), mean error {}",
            p.model,
            format_size(p.peak_predicted_bytes),
            format_size(p.peak_real_bytes),
            p.peak_relative_error * 100.0,
            format_size(p.mean_abs_error_bytes as u64)
        );
    }
    if let Some(v) = &r.verify_data {
        crate::say!(
            "  data check          {} blocks checked, {} mismatches",
            v.blocks_checked,
            v.mismatches
        );
    }
    crate::say!(
        "  given back          {} bytes not returned",
        r.leaked_bytes
    );
    for n in &r.notes {
        crate::say!("  note: {n}");
    }
}
