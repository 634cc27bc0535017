//! The WebAssembly entry points of the allocsim app. Thin: the page (`static/index.html`)
//! calls [`start`] with its canvas; the engine's Web Worker (`static/worker.js`, the same
//! wasm) calls [`worker_handle`] with each request, as do the workers of the ranks' pool;
//! the search worker calls [`search_handle`]. All app logic lives in `allocsim-app`.
//! The site is built by `cargo run -p allocsim-web --bin build-web` and served locally by
//! `cargo run -p allocsim-web --bin serve-web`.

#[cfg(target_arch = "wasm32")]
mod entry {
    use std::cell::RefCell;

    use allocsim_app::engine::{Engine, examples, wire};
    use allocsim_app::gui::{AllocsimApp, Startup};
    use allocsim_app::gui::{chunked, state};
    use wasm_bindgen::JsCast;
    use wasm_bindgen::prelude::*;

    #[global_allocator]
    static ALLOC: allocsim_app::heap::Counting = allocsim_app::heap::Counting;

    /// `[live, peak]`: the heap bytes live now and their highest mark so far (the page's
    /// or the worker's own: each has its wasm memory), so that the benchmarks can tell the
    /// heap the app holds from the wasm memory it has grown to, which never shrinks.
    #[wasm_bindgen]
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn heap_bytes() -> Vec<f64> {
        use allocsim_app::heap;
        vec![heap::live() as f64, heap::peak() as f64]
    }

    /// Starts the app in the canvas with id `canvas_id`.
    #[wasm_bindgen]
    pub async fn start(canvas_id: String) -> Result<(), JsValue> {
        let _ = eframe::WebLogger::init(log::LevelFilter::Info);
        let document = web_sys::window()
            .and_then(|w| w.document())
            .ok_or("no document")?;
        let canvas = document
            .get_element_by_id(&canvas_id)
            .ok_or_else(|| format!("no element #{canvas_id}"))?
            .dyn_into::<web_sys::HtmlCanvasElement>()
            .map_err(|_| format!("#{canvas_id} is not a canvas"))?;
        // glow unless `?renderer=wgpu`: glow draws straight into the canvas's framebuffer,
        // where wgpu's WebGL2 backend draws into a texture and copies it to the canvas at
        // every present — a whole canvas of pixels more per frame on a software rasterizer.
        let renderer = match allocsim_app::gui::io::renderer_url_parameter().as_deref() {
            Some("wgpu") => eframe::Renderer::Wgpu,
            _ => eframe::Renderer::Glow,
        };
        if renderer == eframe::Renderer::Glow {
            // WebGL's defaults are a multisampled canvas with depth and stencil buffers, and
            // an alpha channel the compositor blends: eframe asks for `webgl2` without
            // attributes, and gets the context made here, which has none of them (egui
            // draws flat, opaque pixels; its window is cleared to an opaque colour).
            let attributes = js_sys::Object::new();
            for key in ["antialias", "depth", "stencil", "alpha"] {
                js_sys::Reflect::set(&attributes, &key.into(), &false.into())?;
            }
            canvas.get_context_with_context_options("webgl2", &attributes)?;
        }
        eframe::WebRunner::new()
            .start(
                canvas,
                // No dithering: the app draws flat colours, and a software rasterizer pays
                // for the dithering step on every pixel.
                eframe::WebOptions {
                    dithering: false,
                    renderer,
                    ..eframe::WebOptions::default()
                },
                Box::new(|cc| {
                    Ok(Box::new(AllocsimApp::new(
                        cc,
                        Startup::Example(&examples::OOM_STORY),
                    )))
                }),
            )
            .await
    }

    thread_local! {
        static ENGINE: RefCell<Engine> = RefCell::new(Engine::new());
        static JOB: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        /// Opens asked to stop ([`worker_cancel`]), checked between slices.
        static CANCELLED: RefCell<std::collections::BTreeSet<u64>> = RefCell::default();
    }

    fn post(r: &wire::Response) {
        let Ok(scope) = js_sys::global().dyn_into::<web_sys::DedicatedWorkerGlobalScope>() else {
            return;
        };
        if let wire::Response::CsvPiece { job, bytes, done } = r {
            // A `Blob` made here, posted as a handle: the CSV never passes through the page.
            let posted = allocsim_app::gui::io::csv_piece_message(*job, bytes, *done)
                .and_then(|msg| scope.post_message(&msg));
            if let Err(e) = posted {
                web_sys::console::error_1(&e);
            }
            return;
        }
        // Encoded straight into JS memory, in chunks posted as they are (their buffers
        // moved, not copied): the worker's wasm memory (never given back) does not hold the
        // message whole beside the trace, nor its JS memory a joined copy.
        match chunked::encode_chunks(r) {
            Ok((chunks, buffers)) => {
                let _ = scope.post_message_with_transfer(&chunks, &buffers);
            }
            Err(e) => web_sys::console::error_1(&e.into()),
        }
    }

    /// Prepares the worker: a bug in the engine is reported to the page as the failure of
    /// the job it was running (a wasm panic cannot be caught).
    #[wasm_bindgen]
    pub fn worker_init() {
        std::panic::set_hook(Box::new(|info| {
            let message = format!("{}: {info}", wire::CRASHED);
            web_sys::console::error_1(&message.clone().into());
            post(&wire::Response::Failed {
                job: JOB.with(std::cell::Cell::get),
                message,
            });
        }));
    }

    /// Handles one engine request in the worker; every answer is posted back as bytes.
    #[wasm_bindgen]
    pub fn worker_handle(msg: &[u8]) {
        handle_with(msg, Engine::handle);
    }

    /// Handles one request in the search worker (`allocsim-search`: a load only sets the
    /// trace, [`Engine::handle_search`]), which the page terminates to cancel a search.
    #[wasm_bindgen]
    pub fn search_handle(msg: &[u8]) {
        handle_with(msg, Engine::handle_search);
    }

    /// A shared trace ([`wire::Response::SharedTrace`]) as `{trace, job}`: `trace` the
    /// [`wire::Request::SearchTrace`] the page hands its search workers as it is, written
    /// straight into one JS array ([`chunked::search_trace_js`]: the trace's bytes never
    /// all in the worker's wasm memory), whose buffer is moved, not copied.
    fn post_shared(job: u64) {
        let Ok(scope) = js_sys::global().dyn_into::<web_sys::DedicatedWorkerGlobalScope>() else {
            return;
        };
        let arr = ENGINE
            .with(|e| e.borrow().shared())
            .and_then(|(device, trace)| chunked::search_trace_js(job, device, &trace));
        let arr = match arr {
            Ok(arr) => arr,
            Err(message) => return post(&wire::Response::Failed { job, message }),
        };
        let msg = js_sys::Object::new();
        let set = |k: &str, v: &JsValue| js_sys::Reflect::set(&msg, &k.into(), v);
        let posted = set("trace", &arr)
            .and_then(|_| set("job", &JsValue::from_f64(job as f64)))
            .and_then(|_| {
                scope.post_message_with_transfer(&msg, &js_sys::Array::of1(&arr.buffer()))
            });
        if let Err(e) = posted {
            web_sys::console::error_1(&e);
        }
    }

    fn handle_with(
        msg: &[u8],
        handle: fn(&mut Engine, wire::Request, &mut dyn FnMut(wire::Response)),
    ) {
        let started = now_ms();
        match wire::decode::<wire::Request>(msg) {
            Ok(req) => {
                let kind = req.kind();
                JOB.with(|j| j.set(req.job()));
                let _timed = Timed::new(kind, started);
                if let wire::Request::ShareTrace { job } = req {
                    // Written where it goes, not asked of the engine as bytes.
                    return post_shared(job);
                }
                ENGINE.with(|e| handle(&mut e.borrow_mut(), req, &mut |r| post(&r)));
            }
            Err(message) => post(&wire::Response::Failed { job: 0, message }),
        }
    }

    /// Stops the open of job `job` (worker.js calls it as the message arrives, beside
    /// the open it stops).
    #[wasm_bindgen]
    pub fn worker_cancel(job: f64) {
        CANCELLED.with(|c| c.borrow_mut().insert(job as u64));
    }

    /// Opens a dropped `File`: a file its decode reads once (a plain pickle of up to 64
    /// MiB, decoded in a single pass) in slices of [`ONCE_SLICE_BYTES`], a bigger one up
    /// to [`WHOLE_READ_BYTES`] here whole as a stream (its first pass decoded as it
    /// arrives), a bigger one still in slices of [`SLICE_BYTES`]; the slices read by a
    /// reader worker of this one's (`Blob.slice(..).arrayBuffer()`, [`READ_AHEAD`] ahead
    /// of the decode). The bytes are fed to the streamed decoder with progress; never the
    /// whole file in wasm's memory. A file too big for
    /// wasm's 4 GiB is refused before it is read.
    /// `main` (the wire's bytes of a [`wire::MainReplay`]) is replayed once the trace is
    /// built, before the page asks ([`Engine::open_decoded_replaying`]).
    /// `big_read` (KiB, the page's `?big_read=`): the file read as a big one is whatever
    /// its size, in slices of that many KiB, a plain pickle in two passes (the browser
    /// test's way through [`Window::copy_sliced`] with small files).
    #[wasm_bindgen]
    pub async fn worker_open(
        job: f64,
        name: String,
        file: web_sys::File,
        main: Option<Vec<u8>>,
        big_read: Option<u32>,
    ) {
        let job = job as u64;
        let main = main.and_then(|m| wire::decode::<wire::MainReplay>(&m).ok());
        let decoded = read_job(job, &name, &file, Reading::new(true, big_read)).await;
        let _timed = Timed::new("the build, the ops table and the main replay", now_ms());
        ENGINE.with(|e| {
            e.borrow_mut()
                .open_decoded_replaying(job, name, decoded, main.as_ref(), &mut |r| post(&r));
        });
    }

    /// The search worker's open of a dropped `File` (the same slices as [`worker_open`]):
    /// only its trace is set ([`Engine::search_adopt`]), for the searches that follow. Its
    /// decode is off the path to the first frame: a plain pickle in two passes, which hold
    /// less than the single pass (`big_gpt_long_stacks_s9`: 26 MB less resident).
    #[wasm_bindgen]
    pub async fn search_open(job: f64, name: String, file: web_sys::File) {
        let decoded = read_job(job as u64, &name, &file, Reading::new(false, None)).await;
        ENGINE.with(|e| e.borrow_mut().search_adopt(name, decoded));
    }

    /// The built-in examples the warm-up opens ([`warm_up`]), in turn: real snapshots with
    /// stack frames, one of them a wrapped ring buffer; none of the benchmarks' traces.
    const WARM_UP: &[&str] = &[
        "wrapped_history_pub.pickle.gz",
        "resnet_bs_change.pickle.gz",
    ];
    /// How many times the warm-up opens each of them.
    const WARM_UP_ROUNDS: usize = 8;

    /// Warms the code a dropped file's open runs, in the warm-up worker (`allocsim-warm`),
    /// which the page starts once its example is on screen and ends at the first file
    /// dropped. V8 runs a module's functions first as its baseline compiler (Liftoff)
    /// made them and compiles those that run hot with its optimizing one (`TurboFan`), on
    /// background threads, as they run; the page, the engine's worker and this one share
    /// the module (the page posts it), so what runs hot here is optimized for all, and the
    /// first file opened does not pay for it (`kvcache_decode`'s build, ops table and main
    /// replay took 343–412 ms in the engine's worker on the first open of a page, 147–197
    /// on a second). Opens built-in examples as a dropped file is opened — the streamed
    /// decode in pieces, the build, the main replay and its layout, the other
    /// configuration's replay, every answer encoded as the worker posts it, decoded as the
    /// page takes it and made into the page's views of it (the recorded timeline, the
    /// document, the replay) — and drops them. Returns the milliseconds it took. What only
    /// the page's frames run (egui's text and shapes) and what the examples do not make
    /// hot stays to be optimized on the first open
    /// (0.23–0.30 CPU s of V8's background compiles on `kvcache_decode`, 0.44–0.53 s
    /// without the warm-up).
    #[wasm_bindgen]
    pub async fn warm_up() -> f64 {
        let started = now_ms();
        for round in 0..WARM_UP_ROUNDS {
            for file in WARM_UP {
                let Some(example) = examples::by_file(file) else {
                    continue;
                };
                // As dropped: every other round its plain pickle (the single pass), else
                // the gzip file (the two passes).
                let plain = (round % 2 == 1)
                    .then(|| allocsim_core::snapshot::import::gunzip(example.bytes, u64::MAX).ok())
                    .flatten();
                let decoded = decode_bytes(plain.as_deref().unwrap_or(example.bytes))
                    .map_err(|e| format!("{file}: {e}"));
                let main = wire::MainReplay {
                    spec: "pytorch".into(),
                    capacity_bytes: None,
                    as_recorded: true,
                    answer: Some((2, 3)),
                };
                let mut engine = Engine::new();
                // Encoded as the worker posts it, decoded as the page takes it, and made into
                // the page's views of it.
                let mut recorded = None;
                let mut drop_answer = |r: wire::Response| {
                    let Ok((chunks, _)) = chunked::encode_chunks(&r) else {
                        return;
                    };
                    match chunked::decode_js::<wire::Response>(&chunks.into()) {
                        Some(Ok(wire::Response::Recorded { job, recorded: r })) => {
                            recorded = Some(state::RecordedView::new(job, *r));
                        }
                        Some(Ok(wire::Response::Loaded { trace, .. })) => {
                            let trace = std::sync::Arc::new(*trace);
                            drop(recorded.take().and_then(|r| r.per_op(&trace)));
                            drop(state::Document::new(trace));
                        }
                        Some(Ok(wire::Response::Replayed { replay, .. })) => {
                            drop(state::ReplayView::new(*replay));
                        }
                        _ => {}
                    }
                };
                engine.open_decoded_replaying(
                    1,
                    (*file).to_string(),
                    decoded,
                    Some(&main),
                    &mut drop_answer,
                );
                for spec in example.compare_with {
                    let replay = wire::Request::Replay {
                        job: 4,
                        slot: 1,
                        spec: (*spec).to_string(),
                        capacity_bytes: None,
                    };
                    engine.handle(replay, &mut drop_answer);
                }
                let_messages_in().await;
            }
        }
        now_ms() - started
    }

    /// A whole file's bytes decoded as a dropped file's are ([`decode`]): fed to the
    /// streamed decoder in [`STREAMED_PIECE_BYTES`] pieces, each pass.
    fn decode_bytes(
        bytes: &[u8],
    ) -> Result<allocsim_core::snapshot::RawSnapshot, allocsim_core::snapshot::import::ImportError>
    {
        use allocsim_core::snapshot::import::DecodeOptions;
        use allocsim_core::snapshot::stream::StreamDecoder;
        let mut dec = StreamDecoder::new(bytes.len() as u64, DecodeOptions::default());
        loop {
            for piece in bytes.chunks(STREAMED_PIECE_BYTES as usize) {
                dec.feed(piece)?;
            }
            if let Some(snap) = dec.end_of_input_with(&mut |_| true)? {
                return Ok(snap);
            }
        }
    }

    /// How a file is read: `single`, a plain pickle in a single pass where it can be
    /// ([`StreamDecoder::with_single_pass_max`]), else in two; in slices of `slice_bytes`
    /// where it is not read whole, and never whole where `big`.
    ///
    /// [`StreamDecoder::with_single_pass_max`]: allocsim_core::snapshot::stream::StreamDecoder::with_single_pass_max
    #[derive(Clone, Copy)]
    struct Reading {
        single: bool,
        big: bool,
        slice_bytes: u64,
    }

    impl Reading {
        /// `big_read`: KiB a slice, every file read as a big one.
        fn new(single: bool, big_read: Option<u32>) -> Reading {
            match big_read.filter(|&k| k > 0) {
                Some(kib) => Reading {
                    single: false,
                    big: true,
                    slice_bytes: u64::from(kib) << 10,
                },
                None => Reading {
                    single,
                    big: false,
                    slice_bytes: SLICE_BYTES,
                },
            }
        }
    }

    /// Reads and decodes `file` as job `job` ([`read_file`]); its cancel flag is spent.
    async fn read_job(
        job: u64,
        name: &str,
        file: &web_sys::File,
        how: Reading,
    ) -> Result<allocsim_core::snapshot::RawSnapshot, String> {
        JOB.with(|j| j.set(job));
        let decoded = read_file(job, name, file, how).await;
        CANCELLED.with(|c| c.borrow_mut().remove(&job));
        decoded
    }

    /// A file its decode reads twice, up to this size, is read whole, once, into a JS
    /// `Uint8Array` (outside wasm's memory, which is never given back; garbage once the
    /// read ends: JS memory the tab may reuse, though its RSS keeps it), and both passes
    /// of a plain pickle are fed from it; a bigger one is read in slices of
    /// [`SLICE_BYTES`], in each pass. Reading a
    /// `File` costs per slice in Chromium: a 32 MB pickle's two passes in 4 MiB slices took
    /// 0.2–0.6 s in a worker, the whole file read once 0.04–0.05 s (74 MB: 0.35–1.6 s against
    /// 0.08–0.09 s). The whole file is read as a stream (`File.stream()`), its first pass
    /// fed [`STREAMED_PIECE_BYTES`] at a time as they arrive: the read and the pre-pass
    /// overlap, not one after the other.
    const WHOLE_READ_BYTES: u64 = 256 << 20;
    /// The pieces the first pass over a file read as a stream is fed in (the bytes arrive
    /// in the stream's chunks, 64 KiB to a few MiB in Chromium): small enough that the
    /// decode starts soon after the read, big enough that the decoder's per-feed work is
    /// nothing beside the bytes.
    const STREAMED_PIECE_BYTES: u64 = 1 << 20;
    /// The slices a file read once is read in (a plain pickle decoded in a single pass,
    /// or gzip's kept): its decode starts as soon as the first is read, and the reader,
    /// several times faster than the decode, is rarely behind it after that. Read as a
    /// stream in this worker instead, its chunks came only while the decode let them in
    /// (`big_gpt_long_stacks_s9`'s pass waited 41 ms of its 267 for them, median of 12
    /// opens; 16 of 244 from the reader, which the engine's worker keeps started).
    const ONCE_SLICE_BYTES: u64 = STREAMED_PIECE_BYTES;
    /// The slices a bigger file is read in (fed to the decoder [`open::PIECE_BYTES`] at a
    /// time from each).
    const SLICE_BYTES: u64 = 16 << 20;
    /// How many slices the reader reads ahead of the one the decode is on.
    const READ_AHEAD: u32 = 3;
    /// The longest the worker decodes without letting a message in (a Cancel).
    const YIELD_MS: f64 = 50.0;

    /// A reader of `file`'s bytes as a stream (`file.stream().getReader()`): the browser
    /// hands them on in chunks as it reads them.
    fn stream_reader(file: &web_sys::File) -> Result<JsValue, String> {
        call(&call(file, "stream", &[])?, "getReader", &[])
    }

    /// The next chunk `reader` ([`stream_reader`]) gives, or `None` at the stream's end.
    async fn next_chunk(reader: &JsValue) -> Result<Option<js_sys::Uint8Array>, String> {
        let text = |e: JsValue| format!("{e:?}");
        let read = call(reader, "read", &[])?
            .dyn_into::<js_sys::Promise>()
            .map_err(text)?;
        let result = wasm_bindgen_futures::JsFuture::from(read)
            .await
            .map_err(text)?;
        let field = |k: &str| js_sys::Reflect::get(&result, &k.into()).map_err(text);
        if field("done")?.as_bool() == Some(true) {
            return Ok(None);
        }
        field("value")?
            .dyn_into::<js_sys::Uint8Array>()
            .map(Some)
            .map_err(text)
    }

    /// Lets the worker's pending messages in (a Cancel): a message to itself through a
    /// `MessageChannel` (a timer would wait at least 4 ms).
    async fn let_messages_in() {
        let Ok(channel) = web_sys::MessageChannel::new() else {
            return;
        };
        let wake = js_sys::Promise::new(&mut |resolve, _| {
            channel.port2().set_onmessage(Some(&resolve));
        });
        if channel.port1().post_message(&JsValue::NULL).is_ok() {
            let _ = wasm_bindgen_futures::JsFuture::from(wake).await;
        }
    }

    /// A stage of the worker's work that says how long it took when dropped, on the
    /// console (`debug`: the benchmark's timeline of the open reads these lines), where it
    /// took [`TIMED_MS`] or more.
    struct Timed {
        what: &'static str,
        started: f64,
    }

    /// The shortest stage [`Timed`] reports.
    const TIMED_MS: f64 = 50.0;

    impl Timed {
        fn new(what: &'static str, started: f64) -> Timed {
            Timed { what, started }
        }
    }

    impl Drop for Timed {
        fn drop(&mut self) {
            timed(self.what, now_ms() - self.started, "");
        }
    }

    /// `allocsim worker NAME: WHAT took MS ms (NOTE), ended at EPOCH_MS` on the console.
    fn timed(what: &str, ms: f64, note: &str) {
        if ms < TIMED_MS {
            return;
        }
        let name = js_sys::global()
            .dyn_into::<web_sys::DedicatedWorkerGlobalScope>()
            .map(|g| g.name())
            .unwrap_or_default();
        let name = if name.is_empty() { "engine" } else { &name };
        web_sys::console::debug_1(
            &format!(
                "allocsim worker {name}: {what} took {ms:.0} ms{note}, ended at {:.0}",
                js_sys::Date::now()
            )
            .into(),
        );
    }

    fn now_ms() -> f64 {
        js_sys::global()
            .dyn_into::<web_sys::WorkerGlobalScope>()
            .ok()
            .and_then(|g| g.performance())
            .map_or(0.0, |p| p.now())
    }

    /// The bytes of `file` the decoder reads from: the whole file (filled as its stream
    /// reads it), or the slice holding the bytes it needs next, the slices after it read
    /// meanwhile by the reader.
    struct Window {
        from: u64,
        bytes: js_sys::Uint8Array,
        /// While the whole file is read as a stream into `bytes`: the stream's reader and
        /// the bytes of the file in `bytes` so far.
        filling: Option<(JsValue, u64)>,
        /// The reader of the file's slices (worker.js's `allocsimReadAhead`, a worker of
        /// its own reading [`READ_AHEAD`] slices ahead while this one decodes) and the
        /// byte its next slice starts at, once told where to start.
        reader: Option<(JsValue, Option<u64>)>,
        /// The bytes of a slice the reader reads ([`SLICE_BYTES`]).
        slice_bytes: u64,
        /// Milliseconds spent waiting for slices, for the timing lines.
        waited_ms: f64,
    }

    impl Window {
        fn to(&self) -> u64 {
            match &self.filling {
                Some((_, filled)) => self.from + filled,
                None => self.from + u64::from(self.bytes.length()),
            }
        }

        /// Reads the file's stream into `bytes` until its first `to` bytes are there (or
        /// to its end: the stream then ends, and the reader is let go).
        async fn fill(&mut self, to: u64, size: u64) -> Result<(), String> {
            let started = now_ms();
            while let Some((reader, filled)) = &mut self.filling {
                if *filled >= to && *filled < size {
                    break;
                }
                let Some(chunk) = next_chunk(reader).await? else {
                    if *filled < size {
                        return Err(format!("the file ended at byte {filled}"));
                    }
                    self.filling = None;
                    break;
                };
                let end = *filled + u64::from(chunk.length());
                if end > size {
                    return Err(format!("the file grew past its {size} bytes"));
                }
                let at = u32::try_from(*filled).map_err(|e| e.to_string())?;
                self.bytes.set(&chunk, at);
                *filled = end;
            }
            self.waited_ms += now_ms() - started;
            Ok(())
        }

        /// Copies bytes `at..to` of the file into `piece`, reading the slice that holds
        /// them first where this window does not.
        async fn copy(
            &mut self,
            file: &web_sys::File,
            at: u64,
            to: u64,
            piece: &mut Vec<u8>,
        ) -> Result<(), String> {
            if self.filling.is_some() {
                self.fill(to, file.size() as u64).await?;
            }
            if at < self.from || to > self.to() {
                return self.copy_sliced(file, at, to, piece).await;
            }
            piece.clear();
            self.append(at, to, piece);
            Ok(())
        }

        /// Appends bytes `at..hi` of the file, which `bytes` holds, to `piece`.
        fn append(&self, at: u64, hi: u64, piece: &mut Vec<u8>) {
            let offset = |x: u64| u32::try_from(x - self.from).unwrap_or(u32::MAX);
            let old = piece.len();
            piece.resize(old + usize::try_from(hi - at).unwrap_or(0), 0);
            self.bytes
                .subarray(offset(at), offset(hi))
                .copy_to(piece.get_mut(old..).unwrap_or(&mut []));
        }

        /// [`Window::copy`] of bytes `at..to` that `bytes` does not hold all of: from the
        /// reader's slices, the reader told to start at `at` unless its next slice does.
        async fn copy_sliced(
            &mut self,
            file: &web_sys::File,
            mut at: u64,
            to: u64,
            piece: &mut Vec<u8>,
        ) -> Result<(), String> {
            piece.clear();
            while at < to {
                if at >= self.from && at < self.to() {
                    let hi = to.min(self.to());
                    self.append(at, hi, piece);
                    at = hi;
                    continue;
                }
                let started = now_ms();
                // The slice before is garbage from here (JS memory, freed by its collector).
                self.bytes = js_sys::Uint8Array::new_with_length(0);
                let (reader, next) = match &mut self.reader {
                    Some(r) => r,
                    None => self
                        .reader
                        .insert((read_ahead(file, self.slice_bytes)?, None)),
                };
                if *next != Some(at) {
                    call(reader, "seek", &[JsValue::from_f64(at as f64)])?;
                }
                let (from, bytes) = next_slice(reader).await?;
                if from != at || bytes.length() == 0 {
                    return Err(format!("the reader gave byte {from}, not {at}"));
                }
                *next = Some(at + u64::from(bytes.length()));
                self.from = at;
                self.bytes = bytes;
                self.waited_ms += now_ms() - started;
            }
            Ok(())
        }
    }

    impl Drop for Window {
        fn drop(&mut self) {
            if let Some((reader, _)) = &self.reader {
                let _ = call(reader, "stop", &[]);
            }
        }
    }

    /// A reader of `file`'s slices (worker.js's `allocsimReadAhead`: `slice_bytes` each,
    /// [`READ_AHEAD`] read ahead), not yet told where to start.
    fn read_ahead(file: &web_sys::File, slice_bytes: u64) -> Result<JsValue, String> {
        let make = js_sys::Reflect::get(&js_sys::global(), &"allocsimReadAhead".into())
            .and_then(JsCast::dyn_into::<js_sys::Function>)
            .map_err(|_| "this worker has no reader (worker.js's allocsimReadAhead)".to_string())?;
        make.call3(
            &JsValue::NULL,
            file,
            &JsValue::from_f64(slice_bytes as f64),
            &JsValue::from_f64(f64::from(READ_AHEAD)),
        )
        .map_err(|e| format!("{e:?}"))
    }

    /// Calls `method` of `on` with `args`.
    fn call(on: &JsValue, method: &str, args: &[JsValue]) -> Result<JsValue, String> {
        let f = js_sys::Reflect::get(on, &method.into())
            .and_then(JsCast::dyn_into::<js_sys::Function>)
            .map_err(|e| format!("{method}: {e:?}"))?;
        f.apply(on, &args.iter().collect::<js_sys::Array>())
            .map_err(|e| format!("{method}: {e:?}"))
    }

    /// The next slice a reader ([`read_ahead`]) gives: where it starts and its bytes.
    async fn next_slice(reader: &JsValue) -> Result<(u64, js_sys::Uint8Array), String> {
        let text = |e: JsValue| format!("{e:?}");
        let next = call(reader, "next", &[])?
            .dyn_into::<js_sys::Promise>()
            .map_err(text)?;
        let got = wasm_bindgen_futures::JsFuture::from(next)
            .await
            .map_err(text)?;
        let field = |k: &str| js_sys::Reflect::get(&got, &k.into()).map_err(text);
        if let Some(error) = field("error")?.as_string() {
            return Err(error);
        }
        let at = field("at")?.as_f64().unwrap_or(-1.0);
        let bytes = js_sys::Uint8Array::new(&field("bytes")?);
        Ok((at as u64, bytes))
    }

    async fn read_file(
        job: u64,
        name: &str,
        file: &web_sys::File,
        how: Reading,
    ) -> Result<allocsim_core::snapshot::RawSnapshot, String> {
        let size = file.size() as u64;
        let single = how.single;
        // A file its decode reads once (a single pass, or gzip's pass 1 with its inflated
        // bytes kept in wasm) is read by the reader in small slices and not kept; a plain
        // pickle its decode reads twice, whole into a JS array once.
        let once =
            single && !how.big && size <= allocsim_core::snapshot::pickle::SINGLE_PASS_MAX_BYTES;
        let whole = !once && !how.big && size <= WHOLE_READ_BYTES;
        let mut window = Window {
            from: 0,
            bytes: js_sys::Uint8Array::new_with_length(if whole {
                u32::try_from(size).unwrap_or(0)
            } else {
                0
            }),
            filling: if whole {
                Some((
                    stream_reader(file).map_err(|e| format!("{name}: cannot read byte 0: {e}"))?,
                    0,
                ))
            } else {
                None
            },
            reader: None,
            slice_bytes: if once {
                ONCE_SLICE_BYTES
            } else {
                how.slice_bytes
            },
            waited_ms: 0.0,
        };
        decode(job, name, file, &mut window, single).await
    }

    async fn decode(
        job: u64,
        name: &str,
        file: &web_sys::File,
        window: &mut Window,
        single: bool,
    ) -> Result<allocsim_core::snapshot::RawSnapshot, String> {
        use allocsim_app::engine::open::{self, ProgressReport};
        use allocsim_core::snapshot::import::{DecodeOptions, ImportError, is_gzip};
        use allocsim_core::snapshot::stream::StreamDecoder;
        let size = file.size() as u64;
        let read = |at: u64, e: String| format!("{name}: cannot read byte {at}: {e}");
        let mut piece = Vec::new();
        // What it inflates to: a gzip trailer's size (mod 4 GiB), at least 8 times the
        // file (PyTorch's pickles compress 10-13:1).
        window
            .copy(file, 0, size.min(2), &mut piece)
            .await
            .map_err(|e| read(0, e))?;
        let plain = if is_gzip(&piece) && size >= 4 {
            window
                .copy(file, size - 4, size, &mut piece)
                .await
                .map_err(|e| read(size - 4, e))?;
            let stated = <[u8; 4]>::try_from(piece.as_slice()).map_or(0, u32::from_le_bytes);
            u64::from(stated).max(size.saturating_mul(8))
        } else {
            size
        };
        if let Some(message) = open::too_big_for_wasm(name, plain) {
            return Err(message);
        }
        let mut report = ProgressReport::new(job, name);
        let cancelled = || CANCELLED.with(|c| c.borrow().contains(&job));
        let fail = |e: ImportError| match e {
            ImportError::Cancelled => format!("opening {name}: cancelled"),
            e => format!("{name}: {e}"),
        };
        let mut dec = StreamDecoder::new(size, DecodeOptions::default());
        if !single {
            dec = dec.with_single_pass_max(0);
        }
        let mut yielded = now_ms();
        let mut pass = 0;
        loop {
            let mut at = 0u64;
            pass += 1;
            let pass_started = now_ms();
            window.waited_ms = 0.0;
            // While the file is still being read, its pre-pass is fed in smaller pieces as
            // they arrive; the progress is reported as often as before.
            let step = if window.filling.is_some() || window.slice_bytes <= STREAMED_PIECE_BYTES {
                STREAMED_PIECE_BYTES
            } else {
                open::PIECE_BYTES as u64
            };
            while at < size {
                let to = (at + step).min(size);
                window
                    .copy(file, at, to, &mut piece)
                    .await
                    .map_err(|e| read(at, e))?;
                dec.feed(&piece).map_err(fail)?;
                at = to;
                if to.is_multiple_of(open::PIECE_BYTES as u64) || to == size {
                    report.report(dec.progress(), &mut |r| post(&r));
                }
                if now_ms() - yielded >= YIELD_MS {
                    let_messages_in().await;
                    yielded = now_ms();
                }
                if cancelled() {
                    return Err(fail(ImportError::Cancelled));
                }
            }
            timed(
                "a pass over the file",
                now_ms() - pass_started,
                &format!(
                    " (pass {pass}; {:.0} ms of it waiting for slices)",
                    window.waited_ms
                ),
            );
            let _timed = Timed::new("the decode's end of input", now_ms());
            let done = dec
                .end_of_input_with(&mut |p| {
                    report.report(p, &mut |r| post(&r));
                    !cancelled()
                })
                .map_err(fail)?;
            if let Some(snap) = done {
                return Ok(snap);
            }
        }
    }
}
