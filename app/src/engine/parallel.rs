//! Independent replays on every core: the [`whatif::Runner`] of the CLI and of the
//! desktop app's engine ([`Threads`]), and a runner that stops when asked ([`Cancellable`]).
//! The browser's engine runs in one Web Worker: it replays in order ([`local`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// `a` and `b`, natively on two threads (`b` on the calling one), in the browser (one
/// thread) one after the other: independent work whose answers are waited for together
/// (the app's first full frame: a trace's curves and tables made from its columns).
pub fn join<A: Send, B>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B) -> (A, B) {
    let (b, a) = allocsim_core::build::beside(b, a);
    (a, b)
}

impl whatif::Runner for Threads {
    fn run(
        &self,
        n: usize,
        job: &(dyn Fn(usize) -> Result<ReplayResult, Error> + Sync),
        done: &mut dyn FnMut(),
    ) -> Vec<Result<ReplayResult, Error>> {
        self.answers(n, job, &mut |_| done())
    }

    fn run_groups(
        &self,
        n: usize,
        job: &(dyn Fn(usize) -> Result<Vec<ReplayResult>, Error> + Sync),
        done: &mut dyn FnMut(usize),
    ) -> Vec<Result<Vec<ReplayResult>, Error>> {
        self.answers(n, job, done)
    }

    fn width(&self) -> usize {
        self.threads.max(1)
    }
}

impl Threads {
    /// [`Threads::spread`] of jobs that may fail; a job whose thread stopped fails.
    fn answers<T: Send>(
        self,
        n: usize,
        job: &(dyn Fn(usize) -> Result<T, Error> + Sync),
        done: &mut dyn FnMut(usize),
    ) -> Vec<Result<T, Error>> {
        self.spread(n, job, done)
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Query(QueryError::ThreadStopped))))
            .collect()
    }

    /// `job(i)` for every `i` in `0..n` on up to `threads` threads (each takes the next
    /// index as it finishes one), the results in index order: for work other than one
    /// replay, e.g. a whole rank (decode, replays) of `allocsim ranks`.
    pub fn map<T: Send>(&self, n: usize, job: &(dyn Fn(usize) -> T + Sync)) -> Vec<T> {
        // Every index was sent once: the scope joined every thread, and a thread that
        // panicked re-raises its panic there.
        self.spread(n, job, &mut |_| {})
            .into_iter()
            .flatten()
            .collect()
    }

    /// `job(i)` for every `i` in `0..n` on up to `threads` threads, each taking the next
    /// index as it finishes one (in order on this thread for one thread or one job); each
    /// result at its index, `done(i)` called on this thread after job `i` finishes.
    fn spread<T: Send>(
        self,
        n: usize,
        job: &(dyn Fn(usize) -> T + Sync),
        done: &mut dyn FnMut(usize),
    ) -> Vec<Option<T>> {
        if self.threads <= 1 || n <= 1 {
            return (0..n)
                .map(|i| {
                    let r = job(i);
                    done(i);
                    Some(r)
                })
                .collect();
        }
        let next = AtomicUsize::new(0);
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
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
                done(i);
            }
        });
        out
    }
}

/// The runner for this platform: every core natively, one replay after the other in wasm
/// (a Web Worker has no threads of its own).
#[must_use]
pub fn local() -> Box<dyn whatif::Runner + Sync> {
    if cfg!(target_arch = "wasm32") {
        Box::new(whatif::InOrder)
    } else {
        Box::new(Threads::all_cores())
    }
}

/// `job(i)` for every `i` in `0..n`, on every core natively, one after the other in wasm
/// (as [`local`]); the results in index order.
pub fn map_local<T: Send>(n: usize, job: &(dyn Fn(usize) -> T + Sync)) -> Vec<T> {
    if cfg!(target_arch = "wasm32") {
        (0..n).map(job).collect()
    } else {
        Threads::all_cores().map(n, job)
    }
}

/// The message of what a replay that was not run because of [`Cancellable`]'s flag
/// returns ([`QueryError::Cancelled`]).
pub const CANCELLED: &str = "cancelled";

/// A runner that looks at `cancel` before each replay: once it is set, the replays not
/// yet started return an error ([`CANCELLED`]) instead of running, so a sweep stops after
/// the replays in flight.
pub struct Cancellable<'a> {
    pub inner: &'a dyn whatif::Runner,
    pub cancel: &'a AtomicBool,
}

impl Cancellable<'_> {
    /// `job`, unless the flag is set when it would start.
    fn checked<'j, T>(
        &self,
        job: &'j (dyn Fn(usize) -> Result<T, Error> + Sync),
    ) -> impl Fn(usize) -> Result<T, Error> + Sync + 'j
    where
        Self: 'j,
    {
        let cancel = self.cancel;
        move |i: usize| {
            if cancel.load(Ordering::Relaxed) {
                Err(Error::Query(QueryError::Cancelled))
            } else {
                job(i)
            }
        }
    }
}

impl whatif::Runner for Cancellable<'_> {
    fn run(
        &self,
        n: usize,
        job: &(dyn Fn(usize) -> Result<ReplayResult, Error> + Sync),
        done: &mut dyn FnMut(),
    ) -> Vec<Result<ReplayResult, Error>> {
        self.inner.run(n, &self.checked(job), done)
    }

    fn run_groups(
        &self,
        n: usize,
        job: &(dyn Fn(usize) -> Result<Vec<ReplayResult>, Error> + Sync),
        done: &mut dyn FnMut(usize),
    ) -> Vec<Result<Vec<ReplayResult>, Error>> {
        self.inner.run_groups(n, &self.checked(job), done)
    }

    fn width(&self) -> usize {
        self.inner.width()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use allocsim_core::workloads;

    /// In order, counting the replays that ran and those the flag stopped.
    struct Counting {
        ran: Cell<usize>,
        stopped: Cell<usize>,
    }

    impl whatif::Runner for Counting {
        fn run(
            &self,
            n: usize,
            job: &(dyn Fn(usize) -> Result<ReplayResult, Error> + Sync),
            done: &mut dyn FnMut(),
        ) -> Vec<Result<ReplayResult, Error>> {
            whatif::InOrder
                .run(n, job, done)
                .into_iter()
                .inspect(|r| match r {
                    Err(e) if e.to_string().contains(CANCELLED) => {
                        self.stopped.set(self.stopped.get() + 1);
                    }
                    _ => self.ran.set(self.ran.get() + 1),
                })
                .collect()
        }

        fn run_groups(
            &self,
            n: usize,
            job: &(dyn Fn(usize) -> Result<Vec<ReplayResult>, Error> + Sync),
            done: &mut dyn FnMut(usize),
        ) -> Vec<Result<Vec<ReplayResult>, Error>> {
            let out = whatif::InOrder.run_groups(n, job, done);
            for r in &out {
                match r {
                    Err(e) if e.to_string().contains(CANCELLED) => {
                        self.stopped.set(self.stopped.get() + 1);
                    }
                    Err(_) => {}
                    Ok(v) => self.ran.set(self.ran.get() + v.len()),
                }
            }
            out
        }
    }

    #[test]
    fn threads_answer_in_index_order_and_count_each_job_done() {
        let trace = workloads::generate("oom-story").expect("workload");
        let spec = allocsim_core::models::ModelSpec::parse("pytorch").expect("spec");
        let caps = [
            None,
            Some(1u64 << 30),
            Some(2u64 << 30),
            Some(3u64 << 30),
            Some(4u64 << 30),
        ];
        for threads in [1, 3] {
            let t = Threads { threads };
            let squares = t.map(50, &|i| i * i);
            assert_eq!(squares, (0..50).map(|i| i * i).collect::<Vec<_>>());
            let mut done = 0;
            let runs = whatif::Runner::run(
                &t,
                caps.len(),
                &|i| {
                    let opts = allocsim_core::replay::ReplayOptions::default();
                    allocsim_core::session::replay_device(&trace, 0, &spec, caps[i], opts)
                },
                &mut || done += 1,
            );
            assert_eq!(done, caps.len());
            let got: Vec<_> = runs
                .into_iter()
                .map(|r| r.expect("replay").capacity_bytes)
                .collect();
            assert_eq!(got, caps);
        }
    }

    #[test]
    fn a_cancelled_sweep_stops_before_its_next_replay() {
        let trace = workloads::generate("oom-story").expect("workload");
        let cancel = AtomicBool::new(false);
        let counting = Counting {
            ran: Cell::new(0),
            stopped: Cell::new(0),
        };
        let runner = Cancellable {
            inner: &counting,
            cancel: &cancel,
        };
        let at_cancel = Cell::new(0);
        let r = whatif::recommend_with(&trace, 0, Some(2_362_232_013), &runner, &mut |d, _| {
            // Cancelled once the default and two more replays of the sweep are done (the
            // replays that share a prefix run as one job: the first group's).
            if d >= 3 && at_cancel.get() == 0 {
                at_cancel.set(d);
                cancel.store(true, Ordering::Relaxed);
            }
        });
        let e = r.expect_err("cancelled");
        assert!(e.to_string().contains(CANCELLED), "{e}");
        assert!(at_cancel.get() >= 3);
        assert_eq!(
            counting.ran.get(),
            at_cancel.get(),
            "replays after the cancel"
        );
        assert!(counting.stopped.get() >= 4, "{}", counting.stopped.get());
    }

    #[test]
    fn join_runs_both_on_two_threads_and_gives_each_its_answer() {
        let caller = std::thread::current().id();
        // Each waits for the other to start: one after the other, this would never end.
        let (a_tx, a_rx) = mpsc::channel();
        let (b_tx, b_rx) = mpsc::channel();
        let (a, b) = join(
            move || {
                a_tx.send(()).expect("b waits");
                b_rx.recv().expect("b started");
                (std::thread::current().id(), 6 * 7)
            },
            move || {
                b_tx.send(()).expect("a waits");
                a_rx.recv().expect("a started");
                (std::thread::current().id(), "b")
            },
        );
        assert_eq!((a.1, b.1), (42, "b"));
        assert_eq!(b.0, caller, "b runs on the calling thread");
        assert_ne!(a.0, caller, "a on another");
    }

    #[test]
    #[should_panic(expected = "a failed")]
    fn a_panic_in_join_reaches_the_caller() {
        let failing = |fail: bool| {
            assert!(!fail, "a failed");
            0
        };
        let _ = join(|| failing(true), || failing(false));
    }
}
