//! The CLI's stdout, written so that a reader who goes away early is not an error: a
//! closed pipe (`allocsim replay F --json | head -1`) ends the output quietly, as Unix
//! tools do, and any other write error (`> /dev/full`) becomes one line on stderr and a
//! non-zero exit — never a panic, which is what `println!` does on both.

use std::fmt;
use std::io::{self, Write};
use std::sync::Mutex;

/// The first error writing stdout hit; later output is dropped.
static FAILED: Mutex<Option<io::ErrorKind>> = Mutex::new(None);

/// Writes `args` and a newline to stdout (see [`say!`](crate::say)).
pub fn line(args: fmt::Arguments<'_>) {
    let mut failed = FAILED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if failed.is_some() {
        return;
    }
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        *failed = Some(e.kind());
    }
}

/// Flushes stdout at the end of a command: `None` when everything was written or the
/// reader closed the pipe (nothing left to say), else the one-line reason.
pub fn finish() -> Option<String> {
    let mut failed = FAILED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if failed.is_none()
        && let Err(e) = io::stdout().lock().flush()
    {
        *failed = Some(e.kind());
    }
    match *failed {
        None | Some(io::ErrorKind::BrokenPipe) => None,
        Some(kind) => Some(format!(
            "cannot write the output: {}",
            io::Error::from(kind)
        )),
    }
}

/// `println!` for the CLI's stdout: never panics (see the module).
#[macro_export]
macro_rules! say {
    () => { $crate::cli::output::line(format_args!("")) };
    ($($t:tt)*) => { $crate::cli::output::line(format_args!($($t)*)) };
}
