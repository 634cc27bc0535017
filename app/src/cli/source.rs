//! What a command runs on: FILE (a snapshot, decoded and validated) or a synthetic
//! workload in its place (`--workload SPEC`).

use std::path::PathBuf;

use allocsim_core::capacity::{CapacityArg, CapacityChoice};
use allocsim_core::trace::Trace;
use allocsim_core::workloads;

use super::{Failure, load_input, pick_device};

/// FILE, or a synthetic workload in its place.
#[derive(clap::Args, Debug, Clone)]
pub struct Source {
    /// A PyTorch snapshot (.pickle, .pickle.gz, .json, .json.gz; detected by content)
    #[arg(required_unless_present = "workload", conflicts_with = "workload")]
    pub file: Option<PathBuf>,
    /// A synthetic workload instead of FILE, e.g. `train:steps=50,batch=8..32,seq=128..2048,seed=1`,
    /// `kvcache:tokens=2000`, `oom-story`, `churn:events=1000000`
    #[arg(long, value_name = "SPEC")]
    pub workload: Option<String>,
    /// The snapshot already in memory (the Python package): FILE is then only its name.
    #[arg(skip)]
    pub memory: Option<super::InMemory>,
}

/// A trace to run, and what to call it in messages.
pub struct Loaded {
    pub trace: Trace,
    pub name: String,
}

/// Loads FILE (decoded and validated, `capacity` being the cap it ran under) or generates
/// the workload. Errors name the file or the SPEC.
pub fn load_source(src: &Source, capacity: Option<u64>) -> Result<Loaded, Failure> {
    match (&src.file, &src.workload) {
        (_, Some(spec)) => {
            let trace = workloads::generate(spec).map_err(|e| Failure::bad_input(e.to_string()))?;
            Ok(Loaded {
                trace,
                name: format!("workload {spec}"),
            })
        }
        (Some(path), None) => {
            let v = load_input(path, src.memory.as_ref(), capacity)?;
            Ok(Loaded {
                trace: v.trace,
                name: path.display().to_string(),
            })
        }
        (None, None) => Err(Failure::bad_input("give a FILE or --workload SPEC")),
    }
}

/// Loads the source under `--capacity` (default: as recorded), picks the device to replay
/// (`--trace-device`) and the capacity it runs under.
pub fn load_device(
    src: &Source,
    capacity: Option<CapacityArg>,
    trace_device: Option<usize>,
) -> Result<(Loaded, usize, CapacityChoice), Failure> {
    let arg = capacity.unwrap_or_default();
    let loaded = load_source(src, arg.given_bytes())?;
    let d = pick_device(&loaded.trace, trace_device)?;
    let choice = allocsim_core::session::capacity(&loaded.trace, d, arg);
    Ok((loaded, d, choice))
}
