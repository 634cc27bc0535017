//! The `allocsim` binary: the desktop app (no subcommand, or `open FILE`) or a
//! command-line subcommand (`validate`, `replay`, …). Exit codes: 0 ran, 1 `validate`
//! found a divergence, 2 bad input or usage, 3 the machine lacks what the command needs.

use std::process::ExitCode;

use allocsim_app::cli::{self, Desktop};

fn main() -> ExitCode {
    #[cfg(feature = "gui")]
    let desktop: Option<Desktop> = Some(allocsim_app::gui::run_native);
    #[cfg(not(feature = "gui"))]
    let desktop: Option<Desktop> = None;
    cli::main(desktop)
}
