//! The `allocsim` binary: the desktop app (no subcommand, or `open FILE`) or a
//! command-line subcommand (`validate`, `replay`, …). Exit codes: 0 ran, 1 `validate`
//! found a divergence, 2 bad input or usage, 3 the machine lacks what the command needs.

use std::process::ExitCode;

fn main() -> ExitCode {
    allocsim_app::cli::main()
}
