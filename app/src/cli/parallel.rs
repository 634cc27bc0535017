//! Independent replays on every core: the CLI's [`whatif::Runner`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use allocsim_core::replay::ReplayResult;
use allocsim_core::whatif;
use allocsim_core::{Error, QueryError};

/// Runs jobs on up to `threads` threads (each takes the next job as it finishes one); the
/// results come back in job order, `done` is called on the calling thread.
#[derive(Debug, Clone, Copy)]
pub struct Threads {
    pub threads: usize,
}

impl Threads {
    /// As many threads as the machine has cores.
    #[must_use]
    pub fn all_cores() -> Threads {
        Threads {
            threads: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        }
    }
}

impl whatif::Runner for Threads {
    fn run(
        &self,
        n: usize,
        job: &(dyn Fn(usize) -> Result<ReplayResult, Error> + Sync),
        done: &mut dyn FnMut(),
    ) -> Vec<Result<ReplayResult, Error>> {
        if self.threads <= 1 || n <= 1 {
            return whatif::InOrder.run(n, job, done);
        }
        let next = AtomicUsize::new(0);
        let mut out: Vec<Option<Result<ReplayResult, Error>>> = (0..n).map(|_| None).collect();
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            for _ in 0..self.threads.min(n) {
                let tx = tx.clone();
                let next = &next;
                s.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n || tx.send((i, job(i))).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            for (i, r) in rx {
                out[i] = Some(r);
                done();
            }
        });
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Query(QueryError::ThreadStopped))))
            .collect()
    }
}
