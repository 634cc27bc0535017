//! Everything that differs between the desktop and the browser, in one place: where the
//! engine runs (a thread, or a Web Worker running the same wasm), opening and saving
//! files (rfd natively; rfd's async dialog and a download link on the web), fetching
//! `?trace=<url>`, and the first-frame marker the browser test waits for.

use std::sync::{Arc, Mutex};

use crate::engine::wire::{MainReplay, Request, Response};

/// A file the user chose or dropped, or a download that finished.
#[derive(Debug, Clone)]
pub struct Opened {
    pub name: String,
    pub bytes: Vec<u8>,
    /// A file the engine reads itself, in pieces (`bytes` then empty): its bytes are
    /// never all in memory. A path natively, a `File` (dropped) in the browser.
    pub file: Option<FileRef>,
}

/// A file the engine can read in pieces: a path natively.
#[cfg(not(target_arch = "wasm32"))]
pub type FileRef = std::path::PathBuf;
/// A file the engine can read in pieces: a dropped `File` in the browser, which the
/// engine's worker reads in slices.
#[cfg(target_arch = "wasm32")]
pub type FileRef = web_sys::File;

/// Results of asynchronous I/O (file dialogs, fetches), picked up by the UI each frame.
#[derive(Debug, Clone, Default)]
pub struct Inbox {
    arrived: Arc<Mutex<Vec<Result<Opened, String>>>>,
    /// Why a file dialog could not open (the app then offers a path field).
    dialog_failures: Arc<Mutex<Vec<String>>>,
}

impl Inbox {
    /// Adds a result and asks for a repaint.
    pub fn push(&self, ctx: &egui::Context, item: Result<Opened, String>) {
        self.put(item);
        ctx.request_repaint();
    }

    /// Adds a result that the frame at hand takes (a file dropped in it, its handle or
    /// bytes at hand), asking for no repaint: that frame already shows the open it
    /// starts, and egui's `request_repaint` would draw two more of the whole window (in
    /// the browser 40-90 ms of a software rasterizer's CPU each, beside the engine's
    /// worker decoding the file).
    pub fn put(&self, item: Result<Opened, String>) {
        if let Ok(mut v) = self.arrived.lock() {
            v.push(item);
        }
    }

    /// Takes everything that arrived.
    #[must_use]
    pub fn take(&self) -> Vec<Result<Opened, String>> {
        self.arrived
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }

    /// Says that the file dialog could not open, and why.
    pub fn dialog_failed(&self, ctx: &egui::Context, reason: String) {
        if let Ok(mut v) = self.dialog_failures.lock() {
            v.push(reason);
        }
        ctx.request_repaint();
    }

    /// Takes the reasons file dialogs could not open since the last call.
    #[must_use]
    pub fn take_dialog_failures(&self) -> Vec<String> {
        self.dialog_failures
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// The UI's end of the engine.
pub struct EngineHandle {
    inner: Inner,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineHandle")
    }
}

/// How many of its answers an inline engine hands out per poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// Every answer so far.
    All,
    /// One ([`EngineHandle::inline_paced`]): a frame is drawn between any two answers.
    One,
    /// None: they are kept until the pace changes.
    Hold,
}

enum Inner {
    /// Requests run when polled, on the caller's thread (tests, benchmarks).
    Inline {
        engine: Box<crate::engine::Engine>,
        queue: Vec<Request>,
        /// [`EngineHandle::send_background`]'s requests, run after the queue.
        background: Vec<Request>,
        /// Answers not handed out yet ([`EngineHandle::inline_paced`]).
        held: std::collections::VecDeque<Response>,
        /// How many answers a poll hands out.
        pace: Pace,
        /// In the browser, requests whose file is still being read (no worker to read
        /// it in slices).
        #[cfg(target_arch = "wasm32")]
        late: std::rc::Rc<std::cell::RefCell<Vec<Request>>>,
    },
    #[cfg(not(target_arch = "wasm32"))]
    Thread {
        tx: std::sync::mpsc::Sender<ToThread>,
        rx: std::sync::mpsc::Receiver<Response>,
        /// Cancels a job the engine thread is busy with (an open), not behind it.
        cancels: crate::engine::Cancels,
    },
    /// The engine's worker, and the workers beside it (ranks, searches).
    #[cfg(target_arch = "wasm32")]
    Worker(
        web::WorkerEngine,
        Box<crate::gui::workers::Host<crate::gui::workers::web::WebWorkers>>,
    ),
}

impl EngineHandle {
    /// An engine that runs each request when [`EngineHandle::poll`] is called.
    #[must_use]
    pub fn inline() -> EngineHandle {
        EngineHandle {
            inner: Inner::Inline {
                engine: Box::new(crate::engine::Engine::new()),
                queue: Vec::new(),
                background: Vec::new(),
                held: std::collections::VecDeque::new(),
                pace: Pace::All,
                #[cfg(target_arch = "wasm32")]
                late: std::rc::Rc::default(),
            },
        }
    }

    /// An inline engine that hands out one answer per [`EngineHandle::poll`], so that a
    /// frame is drawn between any two answers, as with a thread or a worker engine that
    /// answers slower than frames (tests of what is drawn before the replays answer).
    #[must_use]
    pub fn inline_paced() -> EngineHandle {
        let mut e = EngineHandle::inline();
        e.set_pace(Pace::One);
        e
    }

    /// How many answers an inline engine hands out per poll from now on (tests: holding
    /// them, then handing out several at once, stands for a machine fast enough to
    /// answer them between two frames).
    pub fn set_pace(&mut self, to: Pace) {
        if let Inner::Inline { pace, .. } = &mut self.inner {
            *pace = to;
        }
    }

    /// An engine off the UI thread: a thread natively, a Web Worker in the browser (or
    /// inline if the worker cannot start).
    #[must_use]
    pub fn spawn(ctx: &egui::Context) -> EngineHandle {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (tx, req_rx) = std::sync::mpsc::channel::<ToThread>();
            let (resp_tx, rx) = std::sync::mpsc::channel::<Response>();
            let ctx = ctx.clone();
            let mut engine = crate::engine::Engine::new();
            let cancels = engine.cancels();
            let started = std::thread::Builder::new()
                .name("allocsim-engine".into())
                .spawn(move || {
                    let mut background = std::collections::VecDeque::new();
                    loop {
                        // Requests first; a background one only when none waits, and its
                        // answer wakes no frame.
                        let first = match req_rx.try_recv() {
                            Ok(m) => m,
                            Err(std::sync::mpsc::TryRecvError::Empty) => {
                                if let Some(req) = background.pop_front() {
                                    engine.handle(req, &mut |r| {
                                        let _ = resp_tx.send(r);
                                    });
                                    continue;
                                }
                                match req_rx.recv() {
                                    Ok(m) => m,
                                    Err(_) => break,
                                }
                            }
                            Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                        };
                        let mut batch = Vec::new();
                        for m in std::iter::once(first).chain(req_rx.try_iter()) {
                            match m {
                                ToThread::Request(req) => batch.push(req),
                                ToThread::Background(reqs) => background = reqs.into(),
                            }
                        }
                        // Only the newest layout request per slot matters while scrubbing.
                        for req in coalesce(batch) {
                            let job = req.job();
                            let req = match engine.detached(req) {
                                Ok(work) => {
                                    // Beside the engine, so that layouts go on during the
                                    // search.
                                    let (tx, ctx) = (resp_tx.clone(), ctx.clone());
                                    let started = std::thread::Builder::new()
                                        .name("allocsim-search".into())
                                        .spawn(move || {
                                            work(&mut |r| {
                                                let _ = tx.send(r);
                                                ctx.request_repaint();
                                            });
                                        });
                                    if let Err(e) = started {
                                        let _ = resp_tx.send(Response::Failed {
                                            job,
                                            message: format!("cannot start the search: {e}"),
                                        });
                                    }
                                    continue;
                                }
                                Err(req) => req,
                            };
                            engine.handle(req, &mut |r| {
                                let _ = resp_tx.send(r);
                                ctx.request_repaint();
                            });
                        }
                    }
                });
            match started {
                Ok(_) => EngineHandle {
                    inner: Inner::Thread { tx, rx, cancels },
                },
                Err(e) => {
                    log::warn!("cannot start the engine thread ({e}); running it on the UI thread");
                    EngineHandle::inline()
                }
            }
        }
        #[cfg(target_arch = "wasm32")]
        {
            match web::WorkerEngine::start(ctx) {
                Ok(w) => EngineHandle {
                    inner: Inner::Worker(
                        w,
                        Box::new(crate::gui::workers::Host::new(
                            crate::gui::workers::web::WebWorkers::new(ctx),
                            web::pool_size(),
                        )),
                    ),
                },
                Err(e) => {
                    log::warn!(
                        "cannot start the engine worker ({e}); running it on the page's thread"
                    );
                    EngineHandle::inline()
                }
            }
        }
    }

    /// Sends a request.
    pub fn send(&mut self, req: Request) {
        match &mut self.inner {
            Inner::Inline { queue, .. } => queue.push(req),
            #[cfg(not(target_arch = "wasm32"))]
            Inner::Thread { tx, cancels, .. } => {
                if let Request::Cancel { job } = &req {
                    cancels.cancel(*job);
                }
                let _ = tx.send(ToThread::Request(req));
            }
            #[cfg(target_arch = "wasm32")]
            Inner::Worker(w, beside) => {
                if let Request::Cancel { job } = &req {
                    // At once: the worker may be busy reading a file (a request would wait).
                    w.cancel(*job);
                }
                if let Some(req) = beside.route(req) {
                    w.send(&req);
                }
            }
        }
    }

    /// Sends a request that may run beside the engine: in the browser [`Request::Bounds`]
    /// goes to the search worker (`workers::Host::beside`), so that the engine's worker,
    /// which answers in order, keeps answering layouts and opens meanwhile; elsewhere
    /// [`EngineHandle::send`] (natively the engine's thread runs it on a thread of its
    /// own).
    pub fn send_beside(&mut self, req: Request) {
        #[cfg(target_arch = "wasm32")]
        if let Inner::Worker(w, beside) = &mut self.inner {
            if let Some(req) = beside.beside(req) {
                w.send(&req);
            }
            return;
        }
        self.send(req);
    }

    /// In the browser, starts the warm-up worker once (`web::WorkerEngine::warm_up`): asked
    /// when the first document is on screen. Elsewhere nothing to do (native code is
    /// compiled ahead).
    pub fn warm_up(&mut self) {
        #[cfg(target_arch = "wasm32")]
        if let Inner::Worker(w, _) = &self.inner {
            w.warm_up();
        }
    }

    /// Gets the search workers ready for a sweep of the trace sent last: in the browser
    /// the engine's worker is asked to share its built trace with them
    /// ([`Request::ShareTrace`], once per trace), behind what was sent to it so far and
    /// ahead of what follows. Asked where a sweep is about to come (the main configuration
    /// ran out of memory), so that a file never swept pays for no copy of its trace; the
    /// search workers start then too, and take the trace as it is shared
    /// (`workers::Host::start_pool`, `Host::shared_trace`).
    /// Elsewhere the sweep runs beside the engine on its trace: nothing to do.
    pub fn prepare_search(&mut self) {
        #[cfg(target_arch = "wasm32")]
        if let Inner::Worker(w, beside) = &mut self.inner
            && let Some(share) = beside.share_request()
        {
            // The sweep's plan first (a few ms): in the page before the share, whose
            // arrival starts the sweep waiting for it.
            if let Some(plan) = beside.plan_request() {
                w.send(&plan);
            }
            w.send(&share);
            // The search workers start meanwhile (and decode the trace when it is shared).
            beside.start_pool();
        }
    }

    /// Replaces the background requests: cheap ones (layouts) that the engine answers one
    /// at a time after every request sent, whose answers wake no frame (the next frame
    /// polls them). Those of an earlier call not yet begun are dropped; an empty list
    /// only drops them.
    pub fn send_background(&mut self, reqs: Vec<Request>) {
        match &mut self.inner {
            Inner::Inline { background, .. } => *background = reqs,
            #[cfg(not(target_arch = "wasm32"))]
            Inner::Thread { tx, .. } => {
                let _ = tx.send(ToThread::Background(reqs));
            }
            #[cfg(target_arch = "wasm32")]
            Inner::Worker(w, _) => w.send_background(reqs),
        }
    }

    /// Opens the snapshot `file` for job `job`: the engine reads it in pieces (natively
    /// [`Request::Open`]; in the browser the worker reads the `File` in slices, and the
    /// search worker is given the same `File` for its next search).
    #[allow(clippy::needless_pass_by_value)] // moved into the future on the web
    /// `main`: the configuration the UI will replay first (natively replayed beside the
    /// trace's build).
    pub fn open_file(&mut self, job: u64, name: String, file: FileRef, main: MainReplay) {
        #[cfg(not(target_arch = "wasm32"))]
        self.send(Request::Open {
            job,
            name,
            path: file.to_string_lossy().into_owned(),
            main: Box::new(main),
        });
        #[cfg(target_arch = "wasm32")]
        match &mut self.inner {
            Inner::Worker(w, beside) => match web::open_message(job, &name, &file, &main) {
                Ok(msg) => {
                    w.stop_warm_up();
                    w.post(&msg);
                    beside.opening(msg);
                }
                Err(e) => log::error!("cannot post the file to the engine worker: {e:?}"),
            },
            Inner::Inline { late, .. } => {
                // No worker: the page reads the file whole, then the engine decodes it.
                let late = late.clone();
                spawn(async move {
                    let bytes =
                        match wasm_bindgen_futures::JsFuture::from(file.array_buffer()).await {
                            Ok(buf) => js_sys::Uint8Array::new(&buf).to_vec(),
                            Err(e) => {
                                log::error!("cannot read {name}: {e:?}");
                                Vec::new()
                            }
                        };
                    late.borrow_mut().push(Request::Load { job, name, bytes });
                });
            }
        }
    }

    /// The answers that arrived since the last call (inline: runs the queued requests).
    pub fn poll(&mut self) -> Vec<Response> {
        match &mut self.inner {
            Inner::Inline {
                engine,
                queue,
                background,
                held,
                pace,
                #[cfg(target_arch = "wasm32")]
                late,
            } => {
                #[cfg(target_arch = "wasm32")]
                queue.append(&mut late.borrow_mut());
                for req in coalesce(std::mem::take(queue)) {
                    engine.handle(req, &mut |r| held.push_back(r));
                }
                for req in std::mem::take(background) {
                    engine.handle(req, &mut |r| held.push_back(r));
                }
                match pace {
                    Pace::All => held.drain(..).collect(),
                    Pace::One => held.pop_front().into_iter().collect(),
                    Pace::Hold => Vec::new(),
                }
            }
            #[cfg(not(target_arch = "wasm32"))]
            Inner::Thread { rx, .. } => rx.try_iter().collect(),
            #[cfg(target_arch = "wasm32")]
            Inner::Worker(w, beside) => {
                // The plan first: a sweep the share starts takes it.
                let mut out = w.poll();
                out.retain(|r| !beside.take_plan(r));
                for (job, msg) in w.take_shared() {
                    beside.shared_trace(job, msg);
                }
                for r in &out {
                    if let Response::Failed { job, .. } = r {
                        beside.share_failed(*job);
                    }
                }
                out.extend(beside.poll());
                web::mark_workers(beside.counts());
                out
            }
        }
    }

    /// Whether each answer wakes the UI by itself (a thread or a worker asks for a repaint
    /// when it sends one); an inline engine only answers when a frame polls it.
    #[must_use]
    pub fn wakes_ui(&self) -> bool {
        !matches!(&self.inner, Inner::Inline { .. })
    }

    /// Whether work the engine hands out as detached ([`crate::engine::Engine::detached`])
    /// runs beside it (natively: a thread each), so that asking for it does not delay
    /// the answers queued after it; in the browser's worker and inline it runs in order.
    #[must_use]
    pub fn runs_beside(&self) -> bool {
        // Natively the engine that is not inline is a thread.
        cfg!(not(target_arch = "wasm32")) && !matches!(&self.inner, Inner::Inline { .. })
    }

    /// Whether requests wait in an inline queue (tests poll until this is false).
    #[must_use]
    pub fn has_queued(&self) -> bool {
        matches!(&self.inner, Inner::Inline { queue, background, held, .. }
            if !queue.is_empty() || !background.is_empty() || !held.is_empty())
    }
}

/// What the UI hands the engine thread.
#[cfg(not(target_arch = "wasm32"))]
enum ToThread {
    Request(Request),
    /// [`EngineHandle::send_background`].
    Background(Vec<Request>),
}

/// Drops layout requests that a later one for the same slot makes moot.
fn coalesce(batch: Vec<Request>) -> Vec<Request> {
    let mut keep = vec![true; batch.len()];
    for (i, r) in batch.iter().enumerate() {
        if let Request::Layout { slot, .. } = r {
            keep[i] = !batch[i + 1..]
                .iter()
                .any(|l| matches!(l, Request::Layout { slot: s, .. } if s == slot));
        }
    }
    batch
        .into_iter()
        .zip(keep)
        .filter_map(|(r, k)| k.then_some(r))
        .collect()
}

/// Reads a file dropped on the window or the page; its bytes arrive in `inbox`: at once
/// for the caller's frame to take (a path, a browser `File`, bytes read natively), or, in
/// the browser without `by_path`, later with a repaint.
/// Natively, `by_path` hands the engine the file's path instead of its bytes.
// `file` is moved into the future on the web; natively every drop arrives at once, with
// no later repaint to ask of `ctx`.
#[allow(clippy::needless_pass_by_value)]
#[cfg_attr(not(target_arch = "wasm32"), allow(unused_variables))]
pub fn read_dropped(
    ctx: &egui::Context,
    inbox: &Inbox,
    file: egui::DroppedFileHandle,
    by_path: bool,
) {
    let name = file.path().file_name().map_or_else(
        || "dropped file".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    #[cfg(not(target_arch = "wasm32"))]
    if by_path {
        inbox.put(file_at(&file.path().to_string_lossy()));
        return;
    }
    #[cfg(target_arch = "wasm32")]
    if by_path && let Some(web_file) = file.web_file() {
        inbox.put(Ok(Opened {
            name,
            bytes: Vec::new(),
            file: Some(web_file.clone()),
        }));
        return;
    }
    #[cfg(not(target_arch = "wasm32"))]
    inbox.put(
        file.bytes()
            .map(|bytes| Opened {
                name: name.clone(),
                bytes,
                file: None,
            })
            .map_err(|e| format!("cannot read {name}: {e}")),
    );
    #[cfg(target_arch = "wasm32")]
    {
        let ctx = ctx.clone();
        let inbox = inbox.clone();
        spawn(async move {
            let r = file.bytes_async().await;
            inbox.push(
                &ctx,
                r.map(|bytes| Opened {
                    name: name.clone(),
                    bytes,
                    file: None,
                })
                .map_err(|e| format!("cannot read {name}: {e}")),
            );
        });
    }
}

/// Opens the file dialog; the chosen file arrives in `inbox`, or, where no dialog could
/// open (no xdg-desktop-portal and no zenity), the reason does
/// ([`Inbox::dialog_failed`]).
pub fn open_file_dialog(ctx: &egui::Context, inbox: &Inbox) {
    let dialog = snapshot_dialog("Open a PyTorch memory snapshot");
    let ctx = ctx.clone();
    let inbox = inbox.clone();
    spawn(async move {
        let _stale = take_dialog_errors();
        if let Some(handle) = dialog.pick_file().await {
            #[cfg(not(target_arch = "wasm32"))]
            inbox.push(&ctx, file_at(&handle.path().to_string_lossy()));
            #[cfg(target_arch = "wasm32")]
            inbox.push(&ctx, Ok(read_handle(&handle).await));
        } else if let Some(reason) = take_dialog_errors() {
            // rfd answers "nothing chosen" for a dialog that never opened: what it logged
            // on the way tells the two apart.
            inbox.dialog_failed(&ctx, reason);
        }
    });
}

/// A file dialog titled `title` for snapshots (PyTorch's endings first).
fn snapshot_dialog(title: &str) -> rfd::AsyncFileDialog {
    rfd::AsyncFileDialog::new()
        .set_title(title)
        .add_filter("PyTorch memory snapshot", &["pickle", "gz", "json", "pkl"])
        .add_filter("All files", &["*"])
}

/// A chosen file's name and bytes.
async fn read_handle(handle: &rfd::FileHandle) -> Opened {
    Opened {
        name: handle.file_name(),
        bytes: handle.read().await,
        file: None,
    }
}

/// Opens a file dialog that picks several snapshots (the Diff and Ranks views); each
/// chosen file arrives in `inbox` (a dialog that could not open: its reason, as
/// [`open_file_dialog`]).
pub fn open_files_dialog(ctx: &egui::Context, inbox: &Inbox) {
    let dialog = snapshot_dialog("Open PyTorch memory snapshots");
    let ctx = ctx.clone();
    let inbox = inbox.clone();
    spawn(async move {
        let _stale = take_dialog_errors();
        if let Some(handles) = dialog.pick_files().await {
            for handle in handles {
                inbox.push(&ctx, Ok(read_handle(&handle).await));
            }
        } else if let Some(reason) = take_dialog_errors() {
            inbox.dialog_failed(&ctx, reason);
        }
    });
}

/// A private runtime directory for a process whose `XDG_RUNTIME_DIR` (`current`) is
/// missing or not an absolute directory: `<tmp>/allocsim-runtime-<uid>`, created with mode
/// 0700 (or reused if it is already a private directory of this user). Without one,
/// libwayland, which the Vulkan driver loads, prints `XDG_RUNTIME_DIR is invalid` at
/// start. `None` where `current` is fine, or no private directory can be had.
#[cfg(target_os = "linux")]
#[must_use]
pub fn runtime_dir_fallback(
    current: Option<&std::ffi::OsStr>,
    tmp: &std::path::Path,
) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let valid = |p: &std::path::Path| p.is_absolute() && p.is_dir();
    if current.is_some_and(|c| valid(std::path::Path::new(c))) {
        return None;
    }
    let uid = std::fs::metadata("/proc/self").ok()?.uid();
    let dir = tmp.join(format!("allocsim-runtime-{uid}"));
    if let Err(e) = std::fs::DirBuilder::new().mode(0o700).create(&dir)
        && e.kind() != std::io::ErrorKind::AlreadyExists
    {
        return None;
    }
    // Not a link, this user's, private to them: else it is no runtime directory.
    let m = std::fs::symlink_metadata(&dir).ok()?;
    (m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o777 == 0o700 && valid(&dir))
        .then_some(dir)
}

/// Gives the process a valid `XDG_RUNTIME_DIR` where it lacks one
/// ([`runtime_dir_fallback`]). Call it before any thread starts.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // the one environment write of the app, before its threads start
pub fn ensure_runtime_dir() {
    let current = std::env::var_os("XDG_RUNTIME_DIR");
    if let Some(dir) = runtime_dir_fallback(current.as_deref(), &std::env::temp_dir()) {
        log::debug!("XDG_RUNTIME_DIR set to {}", dir.display());
        // SAFETY: `run_native` calls this on the main thread before the window, the
        // engine or any other thread starts: nothing reads the environment meanwhile.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", dir) };
    }
}

/// How the app names the file at `path`: its file name (the path if it has none).
#[must_use]
pub fn file_name(path: &std::path::Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Reads a file the user typed the path of (where no file dialog opens).
pub fn read_path(path: &str) -> Result<Opened, String> {
    let path = std::path::Path::new(path.trim());
    let name = file_name(path);
    std::fs::read(path)
        .map(|bytes| Opened {
            name,
            bytes,
            file: None,
        })
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// A file the user named (typed, chosen, dropped or on the command line) for the engine
/// to read in pieces: checked to be a readable file, not read.
#[cfg(not(target_arch = "wasm32"))]
pub fn file_at(path: &str) -> Result<Opened, String> {
    let path = std::path::Path::new(path.trim());
    let name = file_name(path);
    match std::fs::File::open(path).and_then(|f| f.metadata()) {
        Ok(m) if m.is_file() => Ok(Opened {
            name,
            bytes: Vec::new(),
            file: Some(path.to_path_buf()),
        }),
        Ok(_) => Err(format!("cannot read {}: not a file", path.display())),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// What rfd logged as errors since the last call, joined: rfd says why a dialog could
/// not open only in its log ([`DesktopLogger`] keeps those lines here).
static DIALOG_ERRORS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn take_dialog_errors() -> Option<String> {
    let errors = DIALOG_ERRORS
        .lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default();
    (!errors.is_empty()).then(|| errors.join("; "))
}

/// The log filter of the desktop app without `RUST_LOG`: warnings, less those a user can
/// do nothing about (winit on a virtual display: its size in millimetres, XSETTINGS).
pub const DEFAULT_LOG_FILTER: &str = "warn,winit::platform_impl::linux::x11::util::randr=error,\
winit::platform_impl::linux::x11::xdisplay=error";

/// The desktop app's logger: `env_logger` (`RUST_LOG`, else [`DEFAULT_LOG_FILTER`]) that
/// also keeps rfd's errors, the only word rfd gives of a file dialog that could not open.
#[cfg(not(target_arch = "wasm32"))]
pub struct DesktopLogger {
    inner: env_logger::Logger,
}

#[cfg(not(target_arch = "wasm32"))]
impl DesktopLogger {
    /// A logger filtering by `rust_log` (the `RUST_LOG` value) or [`DEFAULT_LOG_FILTER`].
    #[must_use]
    pub fn new(rust_log: Option<&str>) -> DesktopLogger {
        let mut b = env_logger::Builder::new();
        b.parse_filters(rust_log.unwrap_or(DEFAULT_LOG_FILTER));
        DesktopLogger { inner: b.build() }
    }

    /// Installs it as the process's logger (once; later calls do nothing).
    pub fn install(self) {
        let level = self.inner.filter().max(log::LevelFilter::Error);
        if log::set_boxed_logger(Box::new(self)).is_ok() {
            log::set_max_level(level);
        }
    }

    /// Whether `metadata` would be printed.
    #[must_use]
    pub fn prints(&self, metadata: &log::Metadata<'_>) -> bool {
        log::Log::enabled(&self.inner, metadata)
    }

    fn is_dialog_error(metadata: &log::Metadata<'_>) -> bool {
        metadata.level() == log::Level::Error && metadata.target().starts_with("rfd")
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl log::Log for DesktopLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        Self::is_dialog_error(metadata) || self.prints(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if Self::is_dialog_error(record.metadata())
            && let Ok(mut v) = DIALOG_ERRORS.lock()
        {
            v.push(record.args().to_string());
        }
        if self.inner.matches(record) {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Saves `bytes` as `file_name` (a save dialog natively, a download in the browser).
// Natively the bytes move into the dialog's future; the web build downloads a copy.
#[cfg_attr(target_arch = "wasm32", allow(clippy::needless_pass_by_value))]
pub fn save_file(file_name: &str, bytes: Vec<u8>) {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let dialog = rfd::AsyncFileDialog::new().set_file_name(file_name);
        spawn(async move {
            if let Some(handle) = dialog.save_file().await
                && let Err(e) = handle.write(&bytes).await
            {
                log::error!("cannot save: {e}");
            }
        });
    }
    #[cfg(target_arch = "wasm32")]
    web::download(file_name, &bytes);
}

/// A file saved a piece at a time (an export too big to hold whole): natively the pieces
/// go to a file in the temporary directory as they come, moved where the save dialog says
/// at the end (removed if it is cancelled); in the browser each piece becomes a `Blob`
/// (the browser's storage, not the page's memory), all of them downloaded as one file.
pub struct SaveInPieces {
    name: String,
    #[cfg(not(target_arch = "wasm32"))]
    file: Option<(std::path::PathBuf, std::io::BufWriter<std::fs::File>)>,
    #[cfg(target_arch = "wasm32")]
    parts: js_sys::Array,
    /// The job whose pieces the browser's engine worker posts as `Blob`s.
    #[cfg(target_arch = "wasm32")]
    job: u64,
}

/// A piece of a CSV export as the browser's engine worker posts it (the bytes made a
/// `Blob` there, so that they never pass through the page).
#[cfg(target_arch = "wasm32")]
pub fn csv_piece_message(
    job: u64,
    bytes: &[u8],
    done: bool,
) -> Result<wasm_bindgen::JsValue, wasm_bindgen::JsValue> {
    web::csv_piece_message(job, bytes, done)
}

impl SaveInPieces {
    /// A file to be saved as `file_name`, empty so far, for the pieces of job `job`.
    #[cfg_attr(not(target_arch = "wasm32"), allow(unused_variables))]
    pub fn new(file_name: &str, job: u64) -> Result<SaveInPieces, String> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            use std::sync::atomic::{AtomicU64, Ordering};
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let path = std::env::temp_dir().join(format!(
                "allocsim-{}-{}-{file_name}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let file =
                std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(SaveInPieces {
                name: file_name.to_string(),
                file: Some((path, std::io::BufWriter::new(file))),
            })
        }
        #[cfg(target_arch = "wasm32")]
        Ok(SaveInPieces {
            name: file_name.to_string(),
            parts: js_sys::Array::new(),
            job,
        })
    }

    /// Appends `bytes` (in the browser, then the `Blob`s the engine's worker posted for
    /// this job so far: its pieces come without bytes).
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), String> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            use std::io::Write;
            let Some((path, w)) = &mut self.file else {
                return Err("already saved".into());
            };
            w.write_all(bytes)
                .map_err(|e| format!("{}: {e}", path.display()))
        }
        #[cfg(target_arch = "wasm32")]
        {
            if !bytes.is_empty() {
                let blob = web::blob_of(bytes).map_err(|e| format!("{e:?}"))?;
                self.parts.push(&blob);
            }
            for blob in web::take_csv_blobs(self.job) {
                self.parts.push(&blob);
            }
            Ok(())
        }
    }

    /// Saves the pieces as one file: a save dialog natively, a download in the browser.
    #[cfg_attr(target_arch = "wasm32", allow(clippy::needless_pass_by_value))]
    pub fn finish(self) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let mut this = self;
            let Some((from, w)) = this.file.take() else {
                return;
            };
            let dialog = rfd::AsyncFileDialog::new().set_file_name(&this.name);
            spawn(async move {
                let done = match w.into_inner() {
                    Err(e) => Err(e.into_error().to_string()),
                    Ok(_) => match dialog.save_file().await {
                        Some(handle) => move_file(&from, handle.path()),
                        None => Ok(()),
                    },
                };
                if let Err(e) = done {
                    log::error!("cannot save: {e}");
                }
                let _ = std::fs::remove_file(&from);
            });
        }
        #[cfg(target_arch = "wasm32")]
        web::download_parts(&self.name, &self.parts);
    }

    /// Writes the pieces to `to` (the end of [`SaveInPieces::finish`] without its dialog).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn finish_to(mut self, to: &std::path::Path) -> Result<(), String> {
        let Some((from, w)) = self.file.take() else {
            return Err("already saved".into());
        };
        let done = w
            .into_inner()
            .map_err(|e| e.into_error().to_string())
            .and_then(|_| move_file(&from, to));
        let _ = std::fs::remove_file(&from);
        done
    }
}

impl Drop for SaveInPieces {
    /// An export given up (the engine failed, another began) leaves no file behind, nor
    /// in the browser a `Blob` its worker posted.
    fn drop(&mut self) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some((path, _)) = self.file.take() {
            let _ = std::fs::remove_file(path);
        }
        #[cfg(target_arch = "wasm32")]
        let _ = web::take_csv_blobs(self.job);
    }
}

/// Moves `from` to `to` (copied where a rename cannot: another file system).
#[cfg(not(target_arch = "wasm32"))]
fn move_file(from: &std::path::Path, to: &std::path::Path) -> Result<(), String> {
    if std::fs::rename(from, to).is_ok() {
        return Ok(());
    }
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("{}: {e}", to.display()))
}

#[cfg(not(target_arch = "wasm32"))]
fn spawn(fut: impl std::future::Future<Output = ()> + Send + 'static) {
    // rfd's dialogs block their thread natively; keep them off the UI thread.
    let _ = std::thread::Builder::new()
        .name("allocsim-dialog".into())
        .spawn(move || pollster_block_on(fut));
}

#[cfg(target_arch = "wasm32")]
fn spawn(fut: impl std::future::Future<Output = ()> + 'static) {
    wasm_bindgen_futures::spawn_local(fut);
}

/// A minimal executor for rfd's futures on a thread of their own.
#[cfg(not(target_arch = "wasm32"))]
fn pollster_block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// The `?trace=<url>` of the page (web only; `None` natively).
#[must_use]
pub fn trace_url_parameter() -> Option<String> {
    #[cfg(target_arch = "wasm32")]
    {
        web::query_parameter("trace")
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        None
    }
}

/// The `?renderer=wgpu|glow` of the page (web only; `None` natively): which of eframe's
/// painters draws the canvas (the web build has both; `allocsim-web` picks glow without it).
#[must_use]
pub fn renderer_url_parameter() -> Option<String> {
    #[cfg(target_arch = "wasm32")]
    {
        web::query_parameter("renderer")
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        None
    }
}

/// The `?capacity=SIZE` of the page (`none` for the whole GPU; web only): the memory cap
/// the first file opened (`?trace=`'s) opens under in place of the capacity as recorded,
/// so that a link opens a trace under the cap it ran out of memory at (the what-if then
/// starts at once).
#[must_use]
pub fn capacity_url_parameter() -> Option<allocsim_core::capacity::CapacityArg> {
    #[cfg(target_arch = "wasm32")]
    {
        let text = web::query_parameter("capacity")?;
        match allocsim_core::capacity::CapacityArg::parse(text.trim()) {
            Ok(arg) => Some(arg),
            Err(e) => {
                log::warn!("?capacity={text}: {e}");
                None
            }
        }
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        None
    }
}

/// Fetches `url`; the bytes arrive in `inbox` (web only).
pub fn fetch(ctx: &egui::Context, inbox: &Inbox, url: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        let ctx = ctx.clone();
        let inbox = inbox.clone();
        let url = url.to_string();
        spawn(async move {
            let r = web::fetch_bytes(&url).await.map(|bytes| Opened {
                file: None,
                name: url.rsplit('/').next().unwrap_or(&url).to_string(),
                bytes,
            });
            inbox.push(&ctx, r.map_err(|e| format!("cannot fetch {url}: {e}")));
        });
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        inbox.push(
            ctx,
            Err(format!(
                "cannot fetch {url}: only the web build fetches URLs"
            )),
        );
    }
}

/// Tells the page (and the browser test) that a frame showing `what` was drawn.
pub fn mark_frame(what: &str) {
    #[cfg(target_arch = "wasm32")]
    web::mark("data-allocsim-frame", what);
    #[cfg(not(target_arch = "wasm32"))]
    log::debug!("frame: {what}");
}

/// Marks how far the open in flight is (`stage:fraction`) for the browser test (the
/// page's `data-allocsim-progress`).
pub fn mark_progress(stage: &str, fraction: f32) {
    #[cfg(target_arch = "wasm32")]
    web::mark("data-allocsim-progress", &format!("{stage}:{fraction:.3}"));
    #[cfg(not(target_arch = "wasm32"))]
    log::trace!("progress: {stage} {fraction:.3}");
}

/// Tells the page what "What would fit?" shows (`running`, `cancelled`, `done`,
/// `failed`): the browser test and benchmark wait for it.
pub fn mark_search(what: &str) {
    #[cfg(target_arch = "wasm32")]
    web::mark("data-allocsim-search", what);
    #[cfg(not(target_arch = "wasm32"))]
    log::trace!("what would fit: {what}");
}

/// Tells the page what asked for this frame while a sweep runs (`data-allocsim-repaint`:
/// the pass number, then egui's repaint causes as `file:line reason`, `; ` apart): the
/// browser benchmark counts a sweep's frames by what woke them.
pub fn mark_repaint(ctx: &egui::Context) {
    #[cfg(target_arch = "wasm32")]
    {
        let causes: Vec<String> = ctx
            .repaint_causes()
            .iter()
            .map(ToString::to_string)
            .collect();
        let pass = ctx.cumulative_pass_nr();
        web::mark(
            "data-allocsim-repaint",
            &format!("{pass} {}", causes.join("; ")),
        );
    }
    #[cfg(not(target_arch = "wasm32"))]
    let _ = ctx;
}

/// Gives the page the Ranks view's table as `allocsim ranks --json` writes it, without
/// `"schema"` (`data-allocsim-ranks`: the browser test compares it with the CLI's).
pub fn mark_ranks(report: &allocsim_core::ranks::RanksReport) {
    #[cfg(target_arch = "wasm32")]
    match serde_json::to_string(report) {
        Ok(json) => web::mark("data-allocsim-ranks", &json),
        Err(e) => log::error!("cannot write the ranks as JSON: {e}"),
    }
    #[cfg(not(target_arch = "wasm32"))]
    log::trace!("ranks: {}", report.summary);
}

/// Tells the page which op's layout is on screen (the browser benchmark waits for it).
pub fn mark_layout(op: u32) {
    #[cfg(target_arch = "wasm32")]
    web::mark_layout(op);
    #[cfg(not(target_arch = "wasm32"))]
    log::debug!("layout on screen: op {op}");
}

/// Milliseconds since an arbitrary start (for timings shown in the app).
#[must_use]
pub fn now_ms() -> f64 {
    use web_time::Instant;
    thread_local! { static START: Instant = Instant::now(); }
    START.with(|s| s.elapsed().as_secs_f64() * 1000.0)
}

#[cfg(target_arch = "wasm32")]
mod web;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
