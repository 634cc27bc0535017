//! The browser's side of the engine host: the engine's Web Worker, fetching, downloads and
//! the page markers the browser tests read.

use std::cell::RefCell;
use std::rc::Rc;

use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

use crate::engine::wire::{MainReplay, Request, Response};
use crate::gui::chunked;

/// The longest a progress message waits for the frame that shows it. Each message used to
/// draw a frame at once: opening the 1.12 GB snapshot posts one per 0.5 % of its decode,
/// 5–6 a second, and a frame of the window costs the GPU process (`SwiftShader`) some
/// 100 ms of CPU, which the engine's worker needs.
const PROGRESS_FRAME_MS: u64 = 500;

/// The engine in a Web Worker (`worker.js` beside the page, same wasm).
pub struct WorkerEngine {
    worker: web_sys::Worker,
    /// Answers decoded as they arrive, straight from the JS array each came in
    /// ([`chunked::decode_js`]): the page's wasm memory never holds one encoded.
    inbox: Rc<RefCell<Vec<Response>>>,
    /// Traces the worker shared for the search workers ([`Response::SharedTrace`],
    /// posted as `{trace, job}`: the [`Request::SearchTrace`] they take, left in JS
    /// memory): each with its job.
    shared: Rc<RefCell<Vec<(u64, JsValue)>>>,
    background: Rc<RefCell<Background>>,
    _on_message: Closure<dyn FnMut(web_sys::MessageEvent)>,
    /// The warm-up worker, once started ([`WorkerEngine::warm_up`]).
    warm: RefCell<Option<WarmUp>>,
}

/// The warm-up worker (`allocsim-warm`, web/src/lib.rs's `warm_up`): built-in examples
/// opened once, so that V8 optimizes the code an open runs before the first file is
/// dropped (the page and every worker share the module). It ends itself when done and is
/// ended at the first file dropped; `data-allocsim-warm` says `running`, `done:MS`,
/// `stopped` (a file came first) or `off` (`?warm=0`).
struct WarmUp {
    worker: web_sys::Worker,
    /// Set once it is done or stopped.
    ended: Rc<std::cell::Cell<bool>>,
    _on_message: Closure<dyn FnMut(web_sys::MessageEvent)>,
}

/// The page's marker of the warm-up ([`WarmUp`]).
const WARM_MARK: &str = "data-allocsim-warm";

/// [`WorkerEngine::send_background`]'s requests: one posted at a time, the next when its
/// answer arrives, which wakes no frame.
#[derive(Default)]
struct Background {
    waiting: std::collections::VecDeque<Request>,
    in_flight: Option<u64>,
}

impl Background {
    /// Posts the next waiting request if none is in flight.
    fn next(&mut self, worker: &web_sys::Worker) {
        if self.in_flight.is_none()
            && let Some(req) = self.waiting.pop_front()
        {
            self.in_flight = Some(req.job());
            post_request(worker, &req);
        }
    }
}

/// Posts `req` to `worker` as the wire's bytes, encoded straight into JS memory
/// ([`chunked::encode_js`]; their buffer transferred).
fn post_request(worker: &web_sys::Worker, req: &Request) {
    match chunked::encode_js(req) {
        Ok(arr) => {
            let transfer = js_sys::Array::of1(&arr.buffer());
            if let Err(e) = worker.post_message_with_transfer(&arr, &transfer) {
                log::error!("cannot post to the engine worker: {e:?}");
            }
        }
        Err(e) => log::error!("{e}"),
    }
}

impl WorkerEngine {
    pub fn start(ctx: &egui::Context) -> Result<WorkerEngine, String> {
        let opts = web_sys::WorkerOptions::new();
        opts.set_type(web_sys::WorkerType::Module);
        let worker = web_sys::Worker::new_with_options("./worker.js", &opts)
            .map_err(|e| format!("{e:?}"))?;
        let inbox: Rc<RefCell<Vec<Response>>> = Rc::default();
        let shared: Rc<RefCell<Vec<(u64, JsValue)>>> = Rc::default();
        let background: Rc<RefCell<Background>> = Rc::default();
        let (sink, bg, to) = (inbox.clone(), background.clone(), worker.clone());
        let traces = shared.clone();
        let ctx = ctx.clone();
        let on_message =
            Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
                let data = e.data();
                if let Some(shared) = shared_trace(&data) {
                    // Handed to the search workers as it is: never decoded here.
                    traces.borrow_mut().push(shared);
                    crate::gui::workers::wake(&ctx, 0);
                    return;
                }
                let answer = if let Some(piece) = csv_piece(&data) {
                    Some(piece)
                } else if let Some(decoded) = chunked::decode_js::<Response>(&data) {
                    // Decoded as it arrives, straight from the JS array it came in
                    // ([`chunked::decode_js`]): the page's wasm memory never holds it encoded.
                    match decoded {
                        Ok(r) => Some(r),
                        Err(e) => {
                            log::error!("{e}");
                            None
                        }
                    }
                } else {
                    // The worker's wasm stopped (an allocation past its memory: no
                    // panic hook runs): the job it ran fails with a message.
                    crashed(&data)
                };
                let Some(answer) = answer else { return };
                let mut bg = bg.borrow_mut();
                let background = bg.in_flight == Some(answer.job());
                // A background answer wakes no frame (the next one takes it), unless it
                // is a failure (the worker may have stopped).
                let quiet = background && !matches!(answer, Response::Failed { .. });
                let progress = matches!(answer, Response::Progress { .. });
                sink.borrow_mut().push(answer);
                if background {
                    bg.in_flight = None;
                    bg.next(&to);
                }
                if progress {
                    // Shown within PROGRESS_FRAME_MS, with whatever else came meanwhile.
                    crate::gui::workers::wake(&ctx, PROGRESS_FRAME_MS);
                } else if !quiet {
                    crate::gui::workers::wake(&ctx, 0);
                }
            });
        worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        // The worker instantiates the module this page already compiled.
        worker
            .post_message(&wasm_bindgen::module())
            .map_err(|e| format!("{e:?}"))?;
        Ok(WorkerEngine {
            worker,
            inbox,
            shared,
            background,
            _on_message: on_message,
            warm: RefCell::new(None),
        })
    }

    /// Starts the warm-up worker ([`WarmUp`]), once; not where the page's `?warm=0`
    /// says so.
    pub fn warm_up(&self) {
        let mut warm = self.warm.borrow_mut();
        if warm.is_some() {
            return;
        }
        if query_parameter("warm").as_deref() == Some("0") {
            mark(WARM_MARK, "off");
            return;
        }
        let opts = web_sys::WorkerOptions::new();
        opts.set_type(web_sys::WorkerType::Module);
        opts.set_name("allocsim-warm");
        let worker = match web_sys::Worker::new_with_options("./worker.js", &opts) {
            Ok(w) => w,
            Err(e) => return log::warn!("cannot start the warm-up worker: {e:?}"),
        };
        let ended: Rc<std::cell::Cell<bool>> = Rc::default();
        let (me, done) = (worker.clone(), ended.clone());
        let on_message =
            Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
                let ms = js_sys::Reflect::get(&e.data(), &"warmed".into())
                    .ok()
                    .and_then(|v| v.as_f64());
                if let Some(ms) = ms {
                    me.terminate();
                    done.set(true);
                    log::info!("allocsim: warm-up done in {ms:.0} ms");
                    mark(WARM_MARK, &format!("done:{ms:.0}"));
                }
            });
        worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        let warm_msg = js_sys::Object::new();
        let started = worker
            .post_message(&wasm_bindgen::module())
            .and_then(|()| {
                js_sys::Reflect::set(&warm_msg, &"warm".into(), &JsValue::TRUE).map(drop)
            })
            .and_then(|()| worker.post_message(&warm_msg));
        if let Err(e) = started {
            worker.terminate();
            return log::warn!("cannot start the warm-up: {e:?}");
        }
        mark(WARM_MARK, "running");
        *warm = Some(WarmUp {
            worker,
            ended,
            _on_message: on_message,
        });
    }

    /// Ends the warm-up if it still runs (a file is being opened: its core is the
    /// open's).
    pub fn stop_warm_up(&self) {
        if let Some(w) = self.warm.borrow().as_ref()
            && !w.ended.replace(true)
        {
            w.worker.terminate();
            mark(WARM_MARK, "stopped");
        }
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
        let posted = js_sys::Reflect::set(&msg, &"cancel".into(), &JsValue::from_f64(job as f64))
            .and_then(|_| self.worker.post_message(&msg));
        if let Err(e) = posted {
            log::error!("cannot post to the engine worker: {e:?}");
        }
    }

    pub fn send(&self, req: &Request) {
        post_request(&self.worker, req);
    }

    /// Replaces the background requests ([`super::EngineHandle::send_background`]).
    pub fn send_background(&self, reqs: Vec<Request>) {
        let mut bg = self.background.borrow_mut();
        bg.waiting = reqs.into();
        bg.next(&self.worker);
    }

    pub fn poll(&self) -> Vec<Response> {
        std::mem::take(&mut *self.inbox.borrow_mut())
    }

    /// The traces shared since the last call ([`WorkerEngine::shared`]).
    pub fn take_shared(&self) -> Vec<(u64, JsValue)> {
        std::mem::take(&mut *self.shared.borrow_mut())
    }
}

thread_local! {
    /// The `Blob`s of CSV exports the engine's worker posted ([`csv_piece`]), in order,
    /// until their export takes them ([`take_csv_blobs`]).
    static CSV_BLOBS: RefCell<Vec<(u64, web_sys::Blob)>> = const { RefCell::new(Vec::new()) };
}

/// A piece of a CSV export as the engine's worker posts it: `{csv, job, done}`, `csv` a
/// `Blob` of the bytes made in the worker, so that the piece crosses as a handle: the
/// bytes go to the browser's blob storage, never through the page (posted as a message,
/// the 1.12 GB snapshot's 861 MB of CSV were garbage in the tab's JS heap until collected).
pub fn csv_piece_message(job: u64, bytes: &[u8], done: bool) -> Result<JsValue, JsValue> {
    let msg = js_sys::Object::new();
    let set = |k: &str, v: &JsValue| js_sys::Reflect::set(&msg, &k.into(), v);
    set("csv", &blob_of(bytes)?.into())?;
    set("job", &JsValue::from_f64(job as f64))?;
    set("done", &JsValue::from_bool(done))?;
    Ok(msg.into())
}

/// `{csv, job, done}` ([`csv_piece_message`]): its `Blob` kept for the export of `job`,
/// and the answer the app takes, a [`Response::CsvPiece`] without bytes.
fn csv_piece(data: &JsValue) -> Option<Response> {
    let csv = js_sys::Reflect::get(data, &"csv".into()).ok()?;
    let blob: web_sys::Blob = csv.dyn_into().ok()?;
    let job = js_sys::Reflect::get(data, &"job".into()).ok()?.as_f64()? as u64;
    let done = js_sys::Reflect::get(data, &"done".into()).ok()?.as_bool()?;
    CSV_BLOBS.with(|b| b.borrow_mut().push((job, blob)));
    Some(Response::CsvPiece {
        job,
        bytes: Vec::new(),
        done,
    })
}

/// The `Blob`s the engine's worker posted for the CSV export of `job`, in order.
pub fn take_csv_blobs(job: u64) -> Vec<web_sys::Blob> {
    CSV_BLOBS.with(|b| {
        let mut b = b.borrow_mut();
        let (mine, rest) = std::mem::take(&mut *b)
            .into_iter()
            .partition(|(j, _)| *j == job);
        *b = rest;
        mine.into_iter().map(|(_, blob)| blob).collect::<Vec<_>>()
    })
}

/// The worker's `{trace, job}` message (a shared trace): its job and its request.
fn shared_trace(data: &JsValue) -> Option<(u64, JsValue)> {
    let trace = js_sys::Reflect::get(data, &"trace".into()).ok()?;
    if trace.is_undefined() {
        return None;
    }
    let job = js_sys::Reflect::get(data, &"job".into()).ok()?.as_f64()?;
    Some((job as u64, trace))
}

/// `{open: job, name, file, main, big_read}`: what worker.js reads a dropped `File` from
/// (the engine's worker, and the search worker for its copy of the trace); `main`, the
/// main configuration the engine's worker replays once the trace is built, as the wire's
/// bytes ([`crate::engine::Engine::open_decoded_replaying`]); `big_read`, the page's
/// `?big_read=KIB` (the browser test's): every file read as a big one is, in slices of that
/// many KiB through the worker's reader, a plain pickle in two passes.
pub fn open_message(
    job: u64,
    name: &str,
    file: &web_sys::File,
    main: &MainReplay,
) -> Result<JsValue, JsValue> {
    let msg = js_sys::Object::new();
    let set = |k: &str, v: &JsValue| js_sys::Reflect::set(&msg, &k.into(), v);
    set("open", &JsValue::from_f64(job as f64))?;
    set("name", &name.into())?;
    set("file", file)?;
    let main: JsValue = chunked::encode_js(main).map_err(JsValue::from)?.into();
    set("main", &main)?;
    if let Some(kib) = query_parameter("big_read").and_then(|v| v.trim().parse::<u32>().ok())
        && kib > 0
    {
        set("big_read", &JsValue::from_f64(f64::from(kib)))?;
    }
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
    let buf =
        wasm_bindgen_futures::JsFuture::from(resp.array_buffer().map_err(|e| format!("{e:?}"))?)
            .await
            .map_err(|e| format!("{e:?}"))?;
    Ok(js_sys::Uint8Array::new(&buf).to_vec())
}

/// `bytes` as a `Blob` (copied out of the page's memory into the browser's), through a
/// view of the wasm memory rather than a JS copy: a CSV export of a gigabyte made a JS
/// copy of each piece, garbage until collected, hundreds of MB of the tab's at its peak.
#[allow(unsafe_code)]
pub fn blob_of(bytes: &[u8]) -> Result<web_sys::Blob, JsValue> {
    // SAFETY: the view is read only by the `Blob` constructor below, which copies it,
    // before anything can allocate (and so grow, and detach, the wasm memory) or free
    // `bytes`.
    let view = unsafe { js_sys::Uint8Array::view(bytes) };
    let parts = js_sys::Array::of1(&view);
    web_sys::Blob::new_with_u8_array_sequence(&parts)
}

/// Downloads the `Blob`s `parts`, one after the other, as one file `file_name`.
pub fn download_parts(file_name: &str, parts: &js_sys::Array) {
    match web_sys::Blob::new_with_blob_sequence(parts) {
        Ok(blob) => download_blob(file_name, &blob),
        Err(e) => log::error!("cannot download {file_name}: {e:?}"),
    }
}

pub fn download(file_name: &str, bytes: &[u8]) {
    match blob_of(bytes) {
        Ok(blob) => download_blob(file_name, &blob),
        Err(e) => log::error!("cannot download {file_name}: {e:?}"),
    }
}

fn download_blob(file_name: &str, blob: &web_sys::Blob) {
    let result = (|| -> Result<(), JsValue> {
        let document = web_sys::window()
            .ok_or("no window")?
            .document()
            .ok_or("no document")?;
        let url = web_sys::Url::create_object_url_with_blob(blob)?;
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
/// `data-allocsim-search-workers`: `started=S terminated=T live=L sweep=W planned=P
/// shared=X` search workers (W: those that answered replays of the last finished sweep;
/// P: sweeps whose replays started, the trace read; X: traces the engine's worker shared
/// with them).
pub fn mark_workers(c: crate::gui::workers::Counts) {
    mark("data-allocsim-rank-workers", &c.rank_workers.to_string());
    mark(
        "data-allocsim-search-workers",
        &format!(
            "started={} terminated={} live={} sweep={} planned={} shared={}",
            c.search_started,
            c.search_terminated,
            c.search_live,
            c.sweep_workers,
            c.sweeps_planned,
            c.traces_shared
        ),
    );
}
