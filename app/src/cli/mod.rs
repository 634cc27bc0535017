//! The `allocsim` command line: a contract (DESIGN.md) — tests outside the team call it
//! and parse its JSON. `--json` prints one object with `"schema": 1` first and nothing
//! else on stdout.

pub mod api;
mod cuda_cost;
mod cuda_replay;
mod diff;
mod explain;
pub mod output;
mod progress;
mod ranks;
mod replay;
mod serve;
mod site;
pub mod source;
mod validate;
mod whatif;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use allocsim_core::models::ModelSpec;
use allocsim_core::trace::Trace;
use allocsim_core::validate::Validation;
use clap::{Parser, Subcommand};

/// Exit code: a divergence (`validate`).
pub const EXIT_DIVERGED: u8 = 1;
/// Exit code: bad input or usage.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code: the machine lacks what the command needs.
pub const EXIT_UNAVAILABLE: u8 = 3;

/// A failure with its exit code and one line for stderr.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// Bad input or usage (exit 2).
    pub fn bad_input(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_BAD_INPUT,
            message: message.into(),
        }
    }

    /// The machine lacks what the command needs (exit 3).
    pub fn unavailable(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_UNAVAILABLE,
            message: message.into(),
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "allocsim",
    version,
    about = "A visual simulator of GPU memory allocators: replay PyTorch memory snapshots through exact allocator models"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Open the desktop app on FILE (two files: their Diff; more: one per rank, the Ranks view)
    Open {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Replay a snapshot through the PyTorch model on the recorded device and compare every event
    Validate(validate::Args),
    /// Replay the requests of FILE through a model on the simulated device
    Replay(replay::Args),
    /// Replay FILE on a real GPU (CUDA) and validate the simulation against it
    CudaReplay(cuda_replay::Args),
    /// Measure the driver latencies the predicted driver time comes from (CUDA)
    CudaCostTable(cuda_cost::Args),
    /// Replay FILE through several allocators or configs side by side
    Compare(whatif::CompareArgs),
    /// The smallest capacity (2 MiB grid) that runs FILE without running out of memory
    MinCapacity(whatif::MinCapacityArgs),
    /// Sweep PyTorch's allocator settings at a capacity and pick the best
    Recommend(whatif::RecommendArgs),
    /// Why a request did not fit: the holes, the blocks that pin them, what would have fit
    Explain(explain::Args),
    /// Two runs on a common axis: the peaks, what changed at the peak by allocation site, the settings that differ
    Diff(diff::Args),
    /// One snapshot per rank: a row each, the outlier, a what-if setting on every rank
    Ranks(ranks::Args),
    /// Serve the web viewer on 127.0.0.1 with FILE open (for a remote machine: ssh -L)
    Serve(serve::Args),
}

/// The arguments every trace-reading command shares.
#[derive(clap::Args, Debug, Clone)]
pub struct Input {
    /// A PyTorch snapshot (.pickle, .pickle.gz, .json, .json.gz; detected by content)
    pub file: PathBuf,
    /// The snapshot already in memory (the Python package): FILE is then only its name.
    #[arg(skip)]
    pub memory: Option<InMemory>,
}

/// A snapshot held in memory rather than read from FILE (`allocsim.load` in Python), and
/// its trace once decoded as recorded (no `--capacity` given), so that several commands
/// on one loaded snapshot decode it once.
#[derive(Debug, Clone)]
pub struct InMemory {
    pub bytes: Arc<[u8]>,
    pub decoded: Option<Arc<Validation>>,
}

/// Parses a `SIZE` argument.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    allocsim_core::units::parse_size(s)
}

/// Parses a `--capacity SIZE|none` argument.
pub fn parse_capacity_arg(s: &str) -> Result<allocsim_core::capacity::CapacityArg, String> {
    allocsim_core::capacity::CapacityArg::parse(s)
}

/// Reads FILE in pieces and decodes it (its bytes are never all in memory), building its
/// replayable trace; errors name the file.
pub fn load_file(path: &Path, capacity: Option<u64>) -> Result<Validation, Failure> {
    allocsim_core::build::build(decode_path(path)?, capacity)
        .map_err(|e| Failure::bad_input(format!("{}: {e}", path.display())))
}

/// Reads FILE in pieces and decodes it; errors name the file.
pub fn decode_path(path: &Path) -> Result<allocsim_core::snapshot::RawSnapshot, Failure> {
    crate::engine::open::decode_file(path, &mut |_| true).map_err(|e| match e {
        crate::engine::open::OpenError::Failed(m) => Failure::bad_input(m),
        crate::engine::open::OpenError::Cancelled => {
            Failure::bad_input(format!("{}: cancelled", path.display()))
        }
    })
}

/// The model `--allocator NAME[@CONF]` and `--config CONF` name together. A config given
/// both ways is a usage error rather than a merge: neither obviously wins, and PyTorch's
/// own parser resets some keys on every parse, so a combination would not mean what it
/// reads as.
pub fn model_spec(allocator: &str, config: Option<&str>) -> Result<ModelSpec, Failure> {
    let mut spec = ModelSpec::parse(allocator).map_err(|e| Failure::bad_input(e.to_string()))?;
    if let Some(c) = config {
        if spec.config.is_some() {
            return Err(Failure::bad_input(format!(
                "--allocator {allocator} and --config {c} both give a config: give it once"
            )));
        }
        spec.config = Some(c.to_string());
    }
    Ok(spec)
}

/// FILE's trace, or that of the snapshot in memory named FILE (decoded once when no
/// capacity is given); errors name it.
pub fn load_input(
    path: &Path,
    memory: Option<&InMemory>,
    capacity: Option<u64>,
) -> Result<Validation, Failure> {
    match memory {
        None => load_file(path, capacity),
        Some(InMemory {
            decoded: Some(v), ..
        }) if capacity.is_none() => Ok(Validation::clone(v)),
        Some(m) => allocsim_core::session::load(&m.bytes, capacity)
            .map_err(|e| Failure::bad_input(format!("{}: {e}", path.display()))),
    }
}

/// Which device of `trace` to replay: `--trace-device D` or the busiest one.
pub fn pick_device(trace: &Trace, requested: Option<usize>) -> Result<usize, Failure> {
    match requested {
        None => Ok(trace.busiest_device()),
        Some(d) if d < trace.devices.len() => Ok(d),
        Some(d) => Err(Failure::bad_input(format!(
            "--trace-device {d}: the trace has {} device(s)",
            trace.devices.len()
        ))),
    }
}

/// Prints a JSON object on stdout (pretty, one object).
pub fn print_json(v: &serde_json::Value) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => crate::say!("{s}"),
        Err(e) => eprintln!("allocsim: cannot print JSON: {e}"),
    }
}

/// A command's answer on stdout: its `--json` object (`json`) when `--json` is given, else
/// its text; exit 0.
pub fn print_answer(
    as_json: bool,
    json: impl FnOnce() -> serde_json::Value,
    text: impl FnOnce(),
) -> Result<u8, Failure> {
    if as_json {
        print_json(&json());
    } else {
        text();
    }
    Ok(0)
}

/// The `--json` object of a serialisable answer: `"schema": 1`, then the answer's fields.
pub fn schema_json<T: serde::Serialize>(answer: &T) -> serde_json::Value {
    let mut v = serde_json::json!({"schema": 1});
    if let (serde_json::Value::Object(m), Ok(serde_json::Value::Object(body))) =
        (&mut v, serde_json::to_value(answer))
    {
        m.extend(body);
    }
    v
}

/// A model's config as the text shows it: `empty` when it has none (PyTorch's defaults).
#[must_use]
pub fn config_text<'a>(config: &'a str, empty: &'a str) -> &'a str {
    if config.is_empty() { empty } else { config }
}

/// A capacity as the text shows it.
#[must_use]
pub fn capacity_text(capacity: Option<u64>) -> String {
    capacity.map_or_else(
        || "unlimited".to_string(),
        allocsim_core::units::format_size,
    )
}

fn run(cli: Cli, desktop: Option<Desktop>) -> Result<u8, Failure> {
    match cli.command {
        None => open_app(Vec::new(), desktop),
        Some(Command::Open { files }) => open_app(files, desktop),
        Some(Command::Validate(a)) => validate::run(&a),
        Some(Command::Replay(a)) => replay::run(&a),
        Some(Command::CudaReplay(a)) => cuda_replay::run(&a),
        Some(Command::CudaCostTable(a)) => cuda_cost::run(&a),
        Some(Command::Compare(a)) => whatif::compare(&a),
        Some(Command::MinCapacity(a)) => whatif::min_capacity(&a),
        Some(Command::Recommend(a)) => whatif::recommend(&a),
        Some(Command::Explain(a)) => explain::run(&a),
        Some(Command::Diff(a)) => diff::run(&a),
        Some(Command::Ranks(a)) => ranks::run(&a),
        Some(Command::Serve(a)) => serve::run(&a),
    }
}

/// The desktop app, when the binary has one: `allocsim` with no subcommand or `open FILE`
/// runs it (two or more files: their Diff or Ranks view). The binary passes `gui::run_native`; the command line itself never names the
/// GUI (the layers in ARCHITECTURE.md), and the Python package passes none.
pub type Desktop = fn(Vec<PathBuf>) -> Result<(), String>;

fn open_app(files: Vec<PathBuf>, desktop: Option<Desktop>) -> Result<u8, Failure> {
    let Some(run_desktop) = desktop else {
        return Err(Failure::unavailable(
            "this build of allocsim has no desktop app (the Python wheel has none): `allocsim serve FILE` opens the web viewer in a browser, or build the allocsim-app crate with its `gui` feature",
        ));
    };
    for f in &files {
        // A file that cannot be read is bad input, before any window opens.
        std::fs::metadata(f)
            .map_err(|e| Failure::bad_input(format!("{}: cannot read: {e}", f.display())))?;
    }
    run_desktop(files).map(|()| 0).map_err(Failure::unavailable)
}

/// Entry point of the binary: the command line on the process's arguments, `desktop` for
/// the commands that open the app.
#[must_use]
pub fn main(desktop: Option<Desktop>) -> ExitCode {
    ExitCode::from(main_with(std::env::args_os(), desktop))
}

/// The command line run on `args` (the program's name first), in this process, without a
/// desktop app, returning its exit code (the Python package's `allocsim` command).
pub fn main_from<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    main_with(args, None)
}

/// [`main_from`] with the desktop app `desktop` for `open`.
pub fn main_with<I, T>(args: I, desktop: Option<Desktop>) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp
                    | clap::error::ErrorKind::DisplayVersion
                    | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.use_stderr() { EXIT_BAD_INPUT } else { 0 };
            }
            eprintln!("allocsim: {}", usage_line(&e));
            return EXIT_BAD_INPUT;
        }
    };
    let code = match run(cli, desktop) {
        Ok(code) => code,
        Err(f) => {
            eprintln!("allocsim: {}", f.message);
            f.code
        }
    };
    match output::finish() {
        None => code,
        Some(why) => {
            eprintln!("allocsim: {why}");
            EXIT_BAD_INPUT
        }
    }
}

/// A usage error in one line, like every other error (`--help` has the rest).
fn usage_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let message: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
        .collect();
    let message = message.join(" ");
    let message = message.strip_prefix("error: ").unwrap_or(&message);
    format!("{message} (see --help)")
}
