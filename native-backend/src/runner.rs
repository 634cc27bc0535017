//! The live CUDA replay of the desktop app: a [`cuda_replay`] on a background thread that
//! streams [`Message`]s — the device, progress, real used bytes next to the simulated
//! reserved bytes, the final report or why it could not run — and stops when asked.
//! [`LiveState`] folds the stream into what a panel draws; both are plain data, so a
//! panel can be tested against a recorded stream (the messages are serde types).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use allocsim_core::trace::Trace;

use crate::Unavailable;
use crate::gpu::{DeviceInfo, Gpu};
use crate::replay::{CudaReplayOptions, CudaReplayReport, Observer, Sample, cuda_replay};

/// What the runner tells its owner, in order: `Started`, then `Progress` and `Sample`s,
/// then exactly one of `Done`, `Unavailable`, `Failed` (the last message).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Message {
    /// The GPU is open and ready (after the balloon).
    Started {
        device: DeviceInfo,
        balloon_free_bytes: Option<u64>,
        ops_total: usize,
    },
    /// Ops replayed so far (at most every [`PROGRESS_INTERVAL`]).
    Progress { ops_done: usize, ops_total: usize },
    /// A point of the real-vs-simulated curves (thinned to about [`MAX_SAMPLES`] a run,
    /// every new peak of real usage kept).
    Sample(Sample),
    /// The replay finished (or was stopped: `report.stopped`).
    Done(Box<CudaReplayReport>),
    /// There is no CUDA here; the reason says what is missing.
    Unavailable { reason: String },
    /// The replay failed (a driver error, a bad option, a panic); memory was given back.
    Failed { message: String },
}

impl Message {
    /// Whether this is the last message of a run.
    #[must_use]
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Message::Done(_) | Message::Unavailable { .. } | Message::Failed { .. }
        )
    }
}

/// Samples a run sends at most (plus every new peak of real usage).
pub const MAX_SAMPLES: usize = 4000;
/// Progress messages are at least this far apart.
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(50);

/// The observer on the runner thread: forwards thinned samples and progress, and checks
/// the stop flag.
struct Forward {
    tx: Sender<Message>,
    stop: Arc<AtomicBool>,
    ops_total: usize,
    next_sample_op: u64,
    peak_real_bytes: u64,
    last_progress: Option<Instant>,
}

impl Observer for Forward {
    fn started(&mut self, device: &DeviceInfo, balloon_free_bytes: Option<u64>, ops_total: usize) {
        self.ops_total = ops_total;
        let _ = self.tx.send(Message::Started {
            device: device.clone(),
            balloon_free_bytes,
            ops_total,
        });
    }

    fn sample(&mut self, s: &Sample) {
        let new_peak = s.real_used_bytes > self.peak_real_bytes;
        if s.op >= self.next_sample_op || new_peak {
            self.peak_real_bytes = self.peak_real_bytes.max(s.real_used_bytes);
            let step = (self.ops_total / MAX_SAMPLES).max(1) as u64;
            self.next_sample_op = s.op + step;
            let _ = self.tx.send(Message::Sample(*s));
        }
    }

    fn progress(&mut self, ops_done: usize, ops_total: usize) -> bool {
        let due = self
            .last_progress
            .is_none_or(|t| t.elapsed() >= PROGRESS_INTERVAL)
            || ops_done == ops_total;
        if due {
            self.last_progress = Some(Instant::now());
            // A closed channel means nobody listens any more: stop too.
            if self
                .tx
                .send(Message::Progress {
                    ops_done,
                    ops_total,
                })
                .is_err()
            {
                return false;
            }
        }
        !self.stop.load(Ordering::Relaxed)
    }
}

/// A live replay on its own thread (see the module docs). Dropping it stops the replay
/// and waits for the thread, which gives all device memory back first.
#[derive(Debug)]
pub struct Runner {
    rx: Receiver<Message>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Runner {
    /// Starts a replay of `trace` on the GPU that `open` opens — on the new thread, since
    /// a CUDA context is current per thread.
    pub fn spawn<G, F>(
        open: F,
        trace: Arc<Trace>,
        opts: CudaReplayOptions,
    ) -> std::io::Result<Runner>
    where
        G: Gpu,
        F: FnOnce() -> Result<G, Unavailable> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("allocsim-cuda-replay".into())
            .spawn(move || {
                let fail_tx = tx.clone();
                // A panic unwinds through the replay, whose device frees everything on the
                // way; the owner hears about it instead of a silently dead thread.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                    let gpu = match open() {
                        Ok(g) => g,
                        Err(u) => {
                            let _ = tx.send(Message::Unavailable { reason: u.reason });
                            return;
                        }
                    };
                    let mut fwd = Forward {
                        tx: tx.clone(),
                        stop: flag,
                        ops_total: 0,
                        next_sample_op: 0,
                        peak_real_bytes: 0,
                        last_progress: None,
                    };
                    let msg = match cuda_replay(gpu, &trace, &opts, &mut fwd) {
                        Ok(report) => Message::Done(Box::new(report)),
                        Err(crate::NativeError::Unavailable(u)) => {
                            Message::Unavailable { reason: u.reason }
                        }
                        Err(e) => Message::Failed {
                            message: e.to_string(),
                        },
                    };
                    let _ = tx.send(msg);
                }));
                if let Err(panic) = run {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    let _ = fail_tx.send(Message::Failed {
                        message: format!("the replay panicked: {what}"),
                    });
                }
            })?;
        Ok(Runner {
            rx,
            stop,
            thread: Some(thread),
        })
    }

    /// Asks the replay to stop (within a few hundred ops); a `Done` with `stopped` follows.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// The messages that arrived so far, without waiting (for a UI frame).
    #[must_use]
    pub fn drain(&self) -> Vec<Message> {
        self.rx.try_iter().collect()
    }

    /// The next message, waiting at most `timeout`; None on timeout or once the thread
    /// has ended and every message was taken.
    #[must_use]
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Message> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Whether the replay thread has ended (its last messages may still wait in
    /// [`Runner::drain`]), so that a relay can tell a quiet moment from the end.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the run to end and returns the messages not taken yet.
    #[must_use]
    pub fn wait(mut self) -> Vec<Message> {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.rx.try_iter().collect()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a live run stands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LiveStatus {
    /// Opening the GPU, inflating the balloon.
    #[default]
    Starting,
    Running,
    Finished,
    /// Stopped by the user before the end.
    Stopped,
    /// No CUDA here, with the reason (the panel shows it and stays disabled).
    Unavailable(String),
    Failed(String),
}

/// A live run folded from its messages: what a panel draws.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveState {
    pub status: LiveStatus,
    pub device: Option<DeviceInfo>,
    pub balloon_free_bytes: Option<u64>,
    pub ops_done: usize,
    pub ops_total: usize,
    /// The curves: real used, model reserved and simulated reserved bytes by op.
    pub samples: Vec<Sample>,
    pub report: Option<Box<CudaReplayReport>>,
}

impl LiveState {
    /// Takes one message into account.
    pub fn apply(&mut self, m: Message) {
        match m {
            Message::Started {
                device,
                balloon_free_bytes,
                ops_total,
            } => {
                self.device = Some(device);
                self.balloon_free_bytes = balloon_free_bytes;
                self.ops_total = ops_total;
                self.status = LiveStatus::Running;
            }
            Message::Progress {
                ops_done,
                ops_total,
            } => {
                self.ops_done = ops_done;
                self.ops_total = ops_total;
            }
            Message::Sample(s) => self.samples.push(s),
            Message::Done(report) => {
                self.ops_done = report.ops_replayed;
                self.status = if report.stopped {
                    LiveStatus::Stopped
                } else {
                    LiveStatus::Finished
                };
                self.report = Some(report);
            }
            Message::Unavailable { reason } => self.status = LiveStatus::Unavailable(reason),
            Message::Failed { message } => self.status = LiveStatus::Failed(message),
        }
    }

    /// Fraction of the ops replayed, 0 to 1.
    #[must_use]
    pub fn fraction_done(&self) -> f32 {
        if self.ops_total == 0 {
            0.0
        } else {
            (self.ops_done as f64 / self.ops_total as f64).min(1.0) as f32
        }
    }

    /// Whether the run has ended (one way or another).
    #[must_use]
    pub fn is_over(&self) -> bool {
        !matches!(self.status, LiveStatus::Starting | LiveStatus::Running)
    }
}
