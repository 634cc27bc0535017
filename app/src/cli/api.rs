//! The command line as a library (the Python package's API): a command's `--json` object,
//! built by the very function the CLI prints it from, for a snapshot on disk or in memory.
//! The arguments are the CLI's own, parsed by the CLI's own parser, so every option, its
//! default and its one-line error are the same in both.

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::{Cli, Command, Failure, InMemory, usage_line};

/// Decodes a snapshot held in memory once (named `name` in messages), ready for
/// [`json`]: a bad snapshot is the same one-line error the CLI gives for a file.
pub fn decode(bytes: Vec<u8>, name: &str) -> Result<InMemory, Failure> {
    let v = allocsim_core::session::load(&bytes, None)
        .map_err(|e| Failure::bad_input(format!("{name}: {e}")))?;
    Ok(InMemory {
        bytes: Arc::from(bytes),
        decoded: Some(Arc::new(v)),
    })
}

/// The commands [`json`] runs.
pub const COMMANDS: [&str; 8] = [
    "validate",
    "replay",
    "compare",
    "min-capacity",
    "recommend",
    "explain",
    "diff",
    "ranks",
];

/// Runs `args` (a command of [`COMMANDS`], then FILE and the options as on the command line)
/// and returns the object `--json` would print. With `memory`, FILE only names that
/// snapshot. Nothing is written to stdout.
pub fn json<S: AsRef<str>>(args: &[S], memory: Option<&InMemory>) -> Result<Value, Failure> {
    json_many(args, &[memory])
}

/// [`json`] for commands of several snapshots (`diff A B`, `ranks FILE…`): `memory[i]`,
/// when given, is the snapshot the i-th FILE argument names (a command of one FILE takes
/// `memory[0]`); the others are read.
pub fn json_many<S: AsRef<str>>(
    args: &[S],
    memory: &[Option<&InMemory>],
) -> Result<Value, Failure> {
    // `--json` right after the command: FILE may follow a `--`.
    let mut line: Vec<OsString> = vec!["allocsim".into()];
    if let Some((command, rest)) = args.split_first() {
        line.push(command.as_ref().into());
        line.push("--json".into());
        line.extend(rest.iter().map(|a| OsString::from(a.as_ref())));
    }
    let cli = Cli::try_parse_from_args(line)?;
    let many: Vec<Option<InMemory>> = memory.iter().map(|m| m.cloned()).collect();
    let memory = many.first().cloned().flatten();
    match cli.command {
        Some(Command::Validate(mut a)) => {
            a.input.memory = memory;
            let v = super::validate::outcome(&a)?;
            Ok(super::validate::json_of(&display(&a.input.file), &v))
        }
        Some(Command::Replay(mut a)) => {
            a.input.memory = memory;
            Ok(super::replay::outcome(&a)?.json())
        }
        Some(Command::Compare(mut a)) => {
            a.source.memory = memory;
            Ok(super::whatif::compare_outcome(&a)?.json())
        }
        Some(Command::MinCapacity(mut a)) => {
            a.source.memory = memory;
            Ok(super::whatif::min_capacity_outcome(&a)?.json())
        }
        Some(Command::Recommend(mut a)) => {
            a.source.memory = memory;
            Ok(super::whatif::recommend_outcome(&a)?.json())
        }
        Some(Command::Explain(mut a)) => {
            a.input.memory = memory;
            Ok(super::explain::outcome(&a)?.json())
        }
        Some(Command::Diff(mut a)) => {
            a.memory = many;
            Ok(super::diff::json(&super::diff::outcome(&a)?))
        }
        Some(Command::Ranks(mut a)) => {
            a.memory = many;
            Ok(super::ranks::json(&super::ranks::outcome(&a)?))
        }
        _ => Err(Failure::bad_input(format!(
            "{}: not one of the commands that return JSON ({})",
            args.first().map_or("", AsRef::as_ref),
            COMMANDS.join(", ")
        ))),
    }
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

impl Cli {
    /// Parses `argv`; a usage error is the CLI's one line (help and version included).
    fn try_parse_from_args(argv: impl IntoIterator<Item = OsString>) -> Result<Cli, Failure> {
        <Cli as clap::Parser>::try_parse_from(argv).map_err(|e| Failure::bad_input(usage_line(&e)))
    }
}
