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
    use wasm_bindgen::JsCast;
    use wasm_bindgen::prelude::*;

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
        eframe::WebRunner::new()
            .start(
                canvas,
                // No dithering: the app draws flat colours, and a software rasterizer pays
                // for the dithering step on every pixel.
                eframe::WebOptions {
                    dithering: false,
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
    }

    fn post(r: &wire::Response) {
        let Ok(scope) = js_sys::global().dyn_into::<web_sys::DedicatedWorkerGlobalScope>() else {
            return;
        };
        match wire::encode(r) {
            Ok(bytes) => {
                let arr = js_sys::Uint8Array::from(bytes.as_slice());
                let _ = scope.post_message_with_transfer(&arr, &js_sys::Array::of1(&arr.buffer()));
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

    fn handle_with(
        msg: &[u8],
        handle: fn(&mut Engine, wire::Request, &mut dyn FnMut(wire::Response)),
    ) {
        match wire::decode::<wire::Request>(msg) {
            Ok(req) => {
                JOB.with(|j| j.set(req.job()));
                ENGINE.with(|e| handle(&mut e.borrow_mut(), req, &mut |r| post(&r)));
            }
            Err(message) => post(&wire::Response::Failed { job: 0, message }),
        }
    }
}
