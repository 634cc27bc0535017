//! [`Workers`] as Web Workers running the page's wasm (`worker.js`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

use crate::engine::wire::{Request, Response};
use crate::gui::workers::{RANK_WORKER, SEARCH_WORKER, WorkerId, Workers};

/// Answers as they arrived: outside wasm's memory until decoded
/// ([`crate::gui::chunked`]).
type Inbox = Rc<RefCell<Vec<(WorkerId, JsValue)>>>;
/// A worker and its message handler (kept alive as long as the worker).
type Live = (web_sys::Worker, Closure<dyn FnMut(web_sys::MessageEvent)>);

/// Web Workers, each with its message handler.
pub struct WebWorkers {
    ctx: egui::Context,
    live: BTreeMap<WorkerId, Live>,
    inbox: Inbox,
    next: WorkerId,
    awaited: Rc<Cell<crate::gui::workers::Awaited>>,
}

impl WebWorkers {
    #[must_use]
    pub fn new(ctx: &egui::Context) -> WebWorkers {
        WebWorkers {
            ctx: ctx.clone(),
            live: BTreeMap::new(),
            inbox: Rc::default(),
            next: 0,
            awaited: Rc::default(),
        }
    }
}

impl Workers for WebWorkers {
    /// Outside wasm's memory (a load's bytes are kept for the next search worker): an
    /// encoded request, or an open of a `File` (`io::web::open_message`).
    type Msg = JsValue;

    fn encode(&self, req: &Request) -> Result<JsValue, String> {
        crate::gui::chunked::encode_js(req).map(Into::into)
    }

    fn spawn(&mut self, search: bool) -> Result<WorkerId, String> {
        let opts = web_sys::WorkerOptions::new();
        opts.set_type(web_sys::WorkerType::Module);
        opts.set_name(if search { SEARCH_WORKER } else { RANK_WORKER });
        let worker = web_sys::Worker::new_with_options("./worker.js", &opts)
            .map_err(|e| format!("{e:?}"))?;
        self.next += 1;
        let id = self.next;
        let (sink, ctx, awaited) = (self.inbox.clone(), self.ctx.clone(), self.awaited.clone());
        let on_message =
            Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
                sink.borrow_mut().push((id, e.data()));
                let mut a = awaited.get();
                crate::gui::workers::wake(&ctx, a.arrived());
                awaited.set(a);
            });
        worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        worker
            .post_message(&wasm_bindgen::module())
            .map_err(|e| format!("{e:?}"))?;
        self.live.insert(id, (worker, on_message));
        Ok(id)
    }

    fn post(&mut self, w: WorkerId, msg: &JsValue) {
        if let Some((worker, _)) = self.live.get(&w)
            && let Err(e) = worker.post_message(msg)
        {
            log::error!("cannot post to a worker: {e:?}");
        }
    }

    fn bytes(&self, msg: &JsValue) -> u64 {
        msg.dyn_ref::<js_sys::Uint8Array>()
            .map_or(0, |a| u64::from(a.byte_length()))
    }

    fn terminate(&mut self, w: WorkerId) {
        if let Some((worker, _)) = self.live.remove(&w) {
            worker.terminate();
        }
        self.inbox.borrow_mut().retain(|(from, _)| *from != w);
    }

    fn awaiting(&mut self, answers: usize) {
        self.awaited.set(crate::gui::workers::Awaited::new(answers));
    }

    fn take(&mut self) -> Vec<(WorkerId, Response)> {
        let raw = std::mem::take(&mut *self.inbox.borrow_mut());
        raw.into_iter()
            // Anything but an encoded answer (worker.js's `{crashed}`) is left out, as before.
            .filter_map(
                |(w, data)| match crate::gui::chunked::decode_js::<Response>(&data)? {
                    Ok(r) => Some((w, r)),
                    Err(e) => {
                        log::error!("{e}");
                        None
                    }
                },
            )
            .collect()
    }
}
