//! A progress bar for long what-if runs, on stderr only (stdout stays one JSON object).
//! It draws nothing when stderr is not a terminal, and on the web build it is a no-op.

/// Drives one bar from core's `(done, total)` callbacks.
pub struct Progress {
    #[cfg(not(target_arch = "wasm32"))]
    bar: indicatif::ProgressBar,
}

impl Progress {
    /// A bar with a message, e.g. `compare`.
    #[must_use]
    pub fn new(message: &str) -> Progress {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(0),
                indicatif::ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {pos}/{len} replays, {elapsed}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(message.to_string());
            Progress { bar }
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = message;
            Progress {}
        }
    }

    /// Core's progress callback: `done` of `total` replays.
    pub fn update(&mut self, done: usize, total: usize) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.bar.set_length(total as u64);
            self.bar.set_position(done as u64);
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (done, total);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        #[cfg(not(target_arch = "wasm32"))]
        self.bar.finish_and_clear();
    }
}

/// Runs `search` on every core with a bar named `what` on stderr, cleared when it ends;
/// core's errors name `name` (bad input, exit 2).
pub fn search<T>(
    what: &str,
    name: &str,
    search: impl FnOnce(
        &crate::engine::parallel::Threads,
        &mut dyn FnMut(usize, usize),
    ) -> Result<T, allocsim_core::Error>,
) -> Result<T, super::Failure> {
    let mut bar = Progress::new(what);
    let found = search(
        &crate::engine::parallel::Threads::all_cores(),
        &mut |done, total| bar.update(done, total),
    );
    drop(bar);
    found.map_err(|e| super::Failure::bad_input(format!("{name}: {e}")))
}
