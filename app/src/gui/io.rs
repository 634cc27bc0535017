//! Everything that differs between the desktop and the browser, in one place: where the
//! engine runs (a thread, or a Web Worker running the same wasm), opening and saving
//! files (rfd natively; rfd's async dialog and a download link on the web), fetching
//! `?trace=<url>`, and the first-frame marker the browser test waits for.

use std::sync::{Arc, Mutex};

use crate::engine::wire::{Request, Response};

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
        if let Ok(mut v) = self.arrived.lock() {
            v.push(item);
        }
        ctx.request_repaint();
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

enum Inner {
    /// Requests run when polled, on the caller's thread (tests, benchmarks).
    Inline {
        engine: Box<crate::engine::Engine>,
        queue: Vec<Request>,
        /// Answers not handed out yet ([`EngineHandle::inline_paced`]).
        held: std::collections::VecDeque<Response>,
        /// One answer per poll.
        paced: bool,
        /// In the browser, requests whose file is still being read (no worker to read
        /// it in slices).
        #[cfg(target_arch = "wasm32")]
        late: std::rc::Rc<std::cell::RefCell<Vec<Request>>>,
    },
    #[cfg(not(target_arch = "wasm32"))]
    Thread {
        tx: std::sync::mpsc::Sender<Request>,
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
                held: std::collections::VecDeque::new(),
                paced: false,
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
        if let Inner::Inline { paced, .. } = &mut e.inner {
            *paced = true;
        }
        e
    }

    /// An engine off the UI thread: a thread natively, a Web Worker in the browser (or
    /// inline if the worker cannot start).
    #[must_use]
    pub fn spawn(ctx: &egui::Context) -> EngineHandle {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let (tx, req_rx) = std::sync::mpsc::channel::<Request>();
            let (resp_tx, rx) = std::sync::mpsc::channel::<Response>();
            let ctx = ctx.clone();
            let mut engine = crate::engine::Engine::new();
            let cancels = engine.cancels();
            let started = std::thread::Builder::new()
                .name("allocsim-engine".into())
                .spawn(move || {
                    while let Ok(req) = req_rx.recv() {
                        // Only the newest layout request per slot matters while scrubbing.
                        let mut batch = vec![req];
                        batch.extend(req_rx.try_iter());
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
                let _ = tx.send(req);
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

    /// Opens the snapshot `file` for job `job`: the engine reads it in pieces (natively
    /// [`Request::Open`]; in the browser the worker reads the `File` in slices, and the
    /// search worker is given the same `File` for its next search).
    #[allow(clippy::needless_pass_by_value)] // moved into the future on the web
    pub fn open_file(&mut self, job: u64, name: String, file: FileRef) {
        #[cfg(not(target_arch = "wasm32"))]
        self.send(Request::Open {
            job,
            name,
            path: file.to_string_lossy().into_owned(),
        });
        #[cfg(target_arch = "wasm32")]
        match &mut self.inner {
            Inner::Worker(w, beside) => match web::open_message(job, &name, &file) {
                Ok(msg) => {
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
                held,
                paced,
                #[cfg(target_arch = "wasm32")]
                late,
            } => {
                #[cfg(target_arch = "wasm32")]
                queue.append(&mut late.borrow_mut());
                for req in coalesce(std::mem::take(queue)) {
                    engine.handle(req, &mut |r| held.push_back(r));
                }
                if *paced {
                    held.pop_front().into_iter().collect()
                } else {
                    held.drain(..).collect()
                }
            }
            #[cfg(not(target_arch = "wasm32"))]
            Inner::Thread { rx, .. } => rx.try_iter().collect(),
            #[cfg(target_arch = "wasm32")]
            Inner::Worker(w, beside) => {
                let mut out = w.poll();
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

    /// Whether requests wait in an inline queue (tests poll until this is false).
    #[must_use]
    pub fn has_queued(&self) -> bool {
        matches!(&self.inner, Inner::Inline { queue, held, .. } if !queue.is_empty() || !held.is_empty())
    }
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

/// Reads a file dropped on the window or the page; its bytes arrive in `inbox`.
/// Natively, `by_path` hands the engine the file's path instead of its bytes.
#[allow(clippy::needless_pass_by_value)] // moved into the future on the web
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
        inbox.push(ctx, file_at(&file.path().to_string_lossy()));
        return;
    }
    #[cfg(target_arch = "wasm32")]
    if by_path && let Some(web_file) = file.web_file() {
        inbox.push(
            ctx,
            Ok(Opened {
                name,
                bytes: Vec::new(),
                file: Some(web_file.clone()),
            }),
        );
        return;
    }
    #[cfg(not(target_arch = "wasm32"))]
    inbox.push(
        ctx,
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
    let dialog = rfd::AsyncFileDialog::new()
        .set_title("Open a PyTorch memory snapshot")
        .add_filter("PyTorch memory snapshot", &["pickle", "gz", "json", "pkl"])
        .add_filter("All files", &["*"]);
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
    let dialog = rfd::AsyncFileDialog::new()
        .set_title("Open PyTorch memory snapshots")
        .add_filter("PyTorch memory snapshot", &["pickle", "gz", "json", "pkl"])
        .add_filter("All files", &["*"]);
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
mod web {
    use std::cell::RefCell;
    use std::rc::Rc;

    use wasm_bindgen::JsCast;
    use wasm_bindgen::prelude::*;

    use crate::engine::wire::{self, Request, Response};

    /// The engine in a Web Worker (`worker.js` beside the page, same wasm).
    pub struct WorkerEngine {
        worker: web_sys::Worker,
        inbox: Rc<RefCell<Vec<Vec<u8>>>>,
        _on_message: Closure<dyn FnMut(web_sys::MessageEvent)>,
    }

    impl WorkerEngine {
        pub fn start(ctx: &egui::Context) -> Result<WorkerEngine, String> {
            let opts = web_sys::WorkerOptions::new();
            opts.set_type(web_sys::WorkerType::Module);
            let worker = web_sys::Worker::new_with_options("./worker.js", &opts)
                .map_err(|e| format!("{e:?}"))?;
            let inbox: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
            let sink = inbox.clone();
            let ctx = ctx.clone();
            let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(
                move |e: web_sys::MessageEvent| {
                    let data = e.data();
                    if let Some(a) = data.dyn_ref::<js_sys::Uint8Array>() {
                        sink.borrow_mut().push(a.to_vec());
                    } else if let Some(b) = data.dyn_ref::<js_sys::ArrayBuffer>() {
                        sink.borrow_mut().push(js_sys::Uint8Array::new(b).to_vec());
                    } else if let Some(failed) = crashed(&data) {
                        // The worker's wasm stopped (an allocation past its memory: no
                        // panic hook runs): the job it ran fails with a message.
                        if let Ok(bytes) = wire::encode(&failed) {
                            sink.borrow_mut().push(bytes);
                        }
                    }
                    ctx.request_repaint();
                },
            );
            worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
            // The worker instantiates the module this page already compiled.
            worker
                .post_message(&wasm_bindgen::module())
                .map_err(|e| format!("{e:?}"))?;
            Ok(WorkerEngine {
                worker,
                inbox,
                _on_message: on_message,
            })
        }

        /// Hands the worker a dropped file to read in slices (a `File` crosses to a
        /// worker as a reference; its bytes are read there).
        /// Posts `msg` as it is (an open: [`open_message`]).
        pub fn post(&self, msg: &JsValue) {
            if let Err(e) = self.worker.post_message(msg) {
                log::error!("cannot post to the engine worker: {e:?}");
            }
        }

        /// Cancels job `job` at once (the worker handles it beside the job it runs).
        pub fn cancel(&self, job: u64) {
            let msg = js_sys::Object::new();
            let posted =
                js_sys::Reflect::set(&msg, &"cancel".into(), &JsValue::from_f64(job as f64))
                    .and_then(|_| self.worker.post_message(&msg));
            if let Err(e) = posted {
                log::error!("cannot post to the engine worker: {e:?}");
            }
        }

        pub fn send(&self, req: &Request) {
            match wire::encode(req) {
                Ok(bytes) => {
                    let arr = js_sys::Uint8Array::from(bytes.as_slice());
                    let transfer = js_sys::Array::of1(&arr.buffer());
                    if let Err(e) = self.worker.post_message_with_transfer(&arr, &transfer) {
                        log::error!("cannot post to the engine worker: {e:?}");
                    }
                }
                Err(e) => log::error!("{e}"),
            }
        }

        pub fn poll(&self) -> Vec<Response> {
            let raw = std::mem::take(&mut *self.inbox.borrow_mut());
            raw.iter()
                .filter_map(|b| match wire::decode::<Response>(b) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        log::error!("{e}");
                        None
                    }
                })
                .collect()
        }
    }

    /// `{open: job, name, file}`: what worker.js reads a dropped `File` from (the engine's
    /// worker, and the search worker for its copy of the trace).
    pub fn open_message(job: u64, name: &str, file: &web_sys::File) -> Result<JsValue, JsValue> {
        let msg = js_sys::Object::new();
        let set = |k: &str, v: &JsValue| js_sys::Reflect::set(&msg, &k.into(), v);
        set("open", &JsValue::from_f64(job as f64))?;
        set("name", &name.into())?;
        set("file", file)?;
        Ok(msg.into())
    }

    /// The worker's `{crashed, job}` message as the failure of that job.
    fn crashed(data: &JsValue) -> Option<Response> {
        let what = js_sys::Reflect::get(data, &"crashed".into())
            .ok()?
            .as_string()?;
        let job = js_sys::Reflect::get(data, &"job".into())
            .ok()
            .and_then(|j| j.as_f64())
            .map_or(0, |j| j as u64);
        Some(Response::Failed {
            job,
            message: format!(
                "the engine stopped ({what}): out of memory? WebAssembly has at most 4 GiB; \
                 reload the page, and open big snapshots in the desktop app"
            ),
        })
    }

    /// The size of the ranks' pool: the page's `?workers=N`, else the browser's
    /// `navigator.hardwareConcurrency` ([`crate::gui::workers::pool_size`]).
    pub fn pool_size() -> usize {
        let hardware = web_sys::window().map(|w| w.navigator().hardware_concurrency() as usize);
        let asked = query_parameter("workers").and_then(|v| v.trim().parse().ok());
        crate::gui::workers::pool_size(hardware.filter(|&n| n > 0), asked)
    }

    pub fn query_parameter(key: &str) -> Option<String> {
        let search = web_sys::window()?.location().search().ok()?;
        web_sys::UrlSearchParams::new_with_str(&search)
            .ok()?
            .get(key)
    }

    pub async fn fetch_bytes(url: &str) -> Result<Vec<u8>, String> {
        let window = web_sys::window().ok_or("no window")?;
        let resp = wasm_bindgen_futures::JsFuture::from(window.fetch_with_str(url))
            .await
            .map_err(|e| format!("{e:?}"))?;
        let resp: web_sys::Response = resp.dyn_into().map_err(|e| format!("{e:?}"))?;
        if !resp.ok() {
            return Err(format!("HTTP {}", resp.status()));
        }
        let buf = wasm_bindgen_futures::JsFuture::from(
            resp.array_buffer().map_err(|e| format!("{e:?}"))?,
        )
        .await
        .map_err(|e| format!("{e:?}"))?;
        Ok(js_sys::Uint8Array::new(&buf).to_vec())
    }

    pub fn download(file_name: &str, bytes: &[u8]) {
        let result = (|| -> Result<(), JsValue> {
            let document = web_sys::window()
                .ok_or("no window")?
                .document()
                .ok_or("no document")?;
            let parts = js_sys::Array::of1(&js_sys::Uint8Array::from(bytes));
            let blob = web_sys::Blob::new_with_u8_array_sequence(&parts)?;
            let url = web_sys::Url::create_object_url_with_blob(&blob)?;
            let a: web_sys::HtmlAnchorElement = document.create_element("a")?.dyn_into()?;
            a.set_href(&url);
            a.set_download(file_name);
            a.click();
            web_sys::Url::revoke_object_url(&url)?;
            Ok(())
        })();
        if let Err(e) = result {
            log::error!("cannot download {file_name}: {e:?}");
        }
    }

    fn body() -> Option<web_sys::HtmlElement> {
        web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.body())
    }

    /// Sets `name` on the page's body to `value` where it differs (a marker set each
    /// frame).
    pub fn mark(name: &str, value: &str) {
        if let Some(body) = body()
            && body.get_attribute(name).as_deref() != Some(value)
        {
            let _ = body.set_attribute(name, value);
        }
    }

    pub fn mark_layout(op: u32) {
        if let Some(body) = body() {
            let _ = body.set_attribute("data-allocsim-layout", &op.to_string());
        }
    }

    /// `data-allocsim-rank-workers`: the workers that answered ranks of the last set;
    /// `data-allocsim-search-workers`: `started=S terminated=T` search workers.
    pub fn mark_workers(c: crate::gui::workers::Counts) {
        mark("data-allocsim-rank-workers", &c.rank_workers.to_string());
        mark(
            "data-allocsim-search-workers",
            &format!(
                "started={} terminated={}",
                c.search_started, c.search_terminated
            ),
        );
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::{DesktopLogger, EngineHandle, Request, Response};

    #[test]
    fn rfd_errors_are_kept_as_the_reason_a_dialog_failed_and_winit_noise_is_filtered() {
        use log::Log;
        let logger = DesktopLogger::new(None);
        let meta = |target: &'static str, level| {
            log::Metadata::builder().target(target).level(level).build()
        };
        let portal = "rfd::backend::xdg_desktop_portal";
        assert!(logger.enabled(&meta(portal, log::Level::Error)));
        logger.log(
            &log::Record::builder()
                .metadata(meta(portal, log::Level::Error))
                .args(format_args!(
                    "Failed to pick file with zenity: No such file"
                ))
                .build(),
        );
        // Only rfd's errors are kept; other lines only go to the terminal.
        logger.log(
            &log::Record::builder()
                .metadata(meta("allocsim", log::Level::Error))
                .args(format_args!("cannot save"))
                .build(),
        );
        assert_eq!(
            super::take_dialog_errors().as_deref(),
            Some("Failed to pick file with zenity: No such file")
        );
        assert_eq!(super::take_dialog_errors(), None, "taken once");
        // XRandR's "certifiably insane" line and the XSETTINGS one are not printed;
        // other warnings are.
        let randr = "winit::platform_impl::linux::x11::util::randr";
        assert!(!logger.prints(&meta(randr, log::Level::Warn)));
        assert!(!logger.prints(&meta(
            "winit::platform_impl::linux::x11::xdisplay",
            log::Level::Warn
        )));
        assert!(logger.prints(&meta("egui_wgpu", log::Level::Warn)));
        assert!(!logger.prints(&meta("egui_wgpu", log::Level::Info)));
        // RUST_LOG still shows everything asked for.
        assert!(DesktopLogger::new(Some("debug")).prints(&meta(randr, log::Level::Warn)));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_missing_or_relative_runtime_dir_gets_a_private_one_in_tmp() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = std::env::temp_dir().join(format!("allocsim-rt-test-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).expect("tmp");
        let good = tmp.join("good");
        std::fs::create_dir_all(&good).expect("dir");
        // A valid one is kept.
        assert_eq!(
            super::runtime_dir_fallback(Some(good.as_os_str()), &tmp),
            None
        );
        // Unset, relative, or not there: a private directory under tmp.
        for current in [None, Some("run/user"), Some("/no/such/runtime/dir")] {
            let dir = super::runtime_dir_fallback(current.map(std::ffi::OsStr::new), &tmp)
                .expect("a fallback");
            assert!(
                dir.starts_with(&tmp) && dir.is_absolute() && dir.is_dir(),
                "{dir:?}"
            );
            let mode = std::fs::metadata(&dir).expect("made").permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{current:?}");
        }
        // One that others can read is not a runtime directory.
        let dir = super::runtime_dir_fallback(None, &tmp).expect("a fallback");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(super::runtime_dir_fallback(None, &tmp), None);
        std::fs::remove_dir_all(&tmp).expect("clean up");
    }

    #[test]
    fn a_typed_path_is_read_and_a_bad_one_says_why() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/traces/oom_story.pickle.gz"
        );
        let f = super::read_path(&format!("  {path} ")).expect("readable");
        assert_eq!(f.name, "oom_story.pickle.gz");
        assert!(!f.bytes.is_empty());
        let e = super::read_path("/no/such/file.pickle").expect_err("missing");
        assert!(e.starts_with("cannot read /no/such/file.pickle: "), "{e}");
    }

    #[test]
    fn layouts_are_answered_while_a_min_capacity_search_runs() {
        let ctx = egui::Context::default();
        let mut e = EngineHandle::spawn(&ctx);
        e.send(Request::Workload {
            job: 1,
            spec: "kvcache:tokens=500".into(),
        });
        e.send(Request::Replay {
            job: 2,
            slot: 0,
            spec: "pytorch".into(),
            capacity_bytes: None,
        });
        // The search replays the trace a dozen times beside the engine; the layout asked
        // after it is answered first.
        e.send(Request::MinCapacity {
            job: 3,
            slot: 0,
            spec: "pytorch".into(),
        });
        e.send(Request::Layout {
            job: 4,
            slot: 0,
            op: 10,
        });
        let mut order = Vec::new();
        let start = std::time::Instant::now();
        while order.len() < 2 {
            assert!(start.elapsed().as_secs() < 120, "no answer: {order:?}");
            for r in e.poll() {
                match r {
                    Response::Layout { job: 4, layout, .. } => {
                        assert_eq!(layout.op, 10);
                        order.push(4);
                    }
                    Response::MinCapacity {
                        job: 3,
                        bytes,
                        slot,
                    } => {
                        assert_eq!(slot, 0);
                        assert!(bytes > 0);
                        order.push(3);
                    }
                    Response::Failed { job, message } => panic!("job {job}: {message}"),
                    _ => {}
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(order, [4, 3]);
    }

    #[test]
    fn layouts_are_answered_while_a_what_if_runs() {
        let ctx = egui::Context::default();
        let mut e = EngineHandle::spawn(&ctx);
        e.send(Request::Workload {
            job: 1,
            spec: "kvcache:tokens=500".into(),
        });
        e.send(Request::Replay {
            job: 2,
            slot: 0,
            spec: "pytorch".into(),
            capacity_bytes: None,
        });
        // The what-if sweeps PyTorch's settings beside the engine.
        e.send(Request::WhatIf {
            job: 3,
            capacity_bytes: None,
        });
        e.send(Request::Layout {
            job: 4,
            slot: 0,
            op: 10,
        });
        let mut order = Vec::new();
        let start = std::time::Instant::now();
        while order.len() < 2 {
            assert!(start.elapsed().as_secs() < 120, "no answer: {order:?}");
            for r in e.poll() {
                match r {
                    Response::Layout { job: 4, .. } => order.push(4),
                    Response::WhatIf { job: 3, answer } => {
                        assert!(answer.candidates_tried > 100, "{answer:?}");
                        assert!(answer.tradeoffs.iter().all(|r| r.fits), "no capacity");
                        order.push(3);
                    }
                    Response::Failed { job, message } => panic!("job {job}: {message}"),
                    _ => {}
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(order, [4, 3]);
    }
}
