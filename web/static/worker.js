// The allocsim engine in a Web Worker: the same wasm as the page (the page posts its
// compiled module first), answering the page's requests in order without blocking the
// page's frames. The page starts four kinds (app/src/gui/workers.rs, app/src/gui/io/web.rs):
// the engine's, the workers of the ranks' pool (the same handler), the search worker,
// named "allocsim-search", which keeps a trace for "What would fit?" and the capacity
// searches and which the page terminates to cancel one, and the warm-up worker,
// "allocsim-warm", which opens built-in examples once ({warm}) so that the code an open
// runs is optimized before the first file is dropped (web/src/lib.rs, warm_up), then says
// {warmed: ms}. A dropped file arrives as {open, name, file, main} (main: the
// configuration to replay once built, as the wire's bytes) and is read here in slices;
// {cancel} stops it at once (not queued behind it). If the wasm stops (an allocation past
// its memory runs no panic hook) while it opens a file, the page hears {crashed, job}.
import init, { worker_init, worker_handle, worker_open, worker_cancel, search_handle, search_open, warm_up, heap_bytes } from "./allocsim_web.js";

const search = self.name === "allocsim-search";
const handle = search ? search_handle : worker_handle;
const open = search ? search_open : worker_open;
let chain = null;

function crashed(e, job) {
  console.error("allocsim engine:", e);
  self.postMessage({ crashed: String(e), job });
}

self.onmessage = (event) => {
  if (chain === null) {
    chain = init({ module_or_path: event.data }).then((wasm) => {
      // This worker's wasm memory in bytes (a high-water mark), for the benchmarks.
      self.allocsimWasmBytes = () => wasm.memory.buffer.byteLength;
      // Its heap: [bytes live, their highest mark].
      self.allocsimHeapBytes = () => Array.from(heap_bytes());
      worker_init();
    });
    return;
  }
  const msg = event.data;
  if (msg && msg.cancel !== undefined) {
    // Initialised by now (a cancel follows a request); never queued behind the job.
    try {
      worker_cancel(msg.cancel);
    } catch (e) {
      chain = chain.then(() => worker_cancel(msg.cancel));
    }
    return;
  }
  if (msg && msg.warm !== undefined) {
    // The warm-up worker (allocsim-warm): says how long it took when done.
    chain = chain
      .then(() => warm_up())
      .then((ms) => self.postMessage({ warmed: ms }))
      .catch((e) => console.error("allocsim warm-up:", e));
    return;
  }
  if (msg && msg.open !== undefined) {
    chain = chain
      .then(() => open(msg.open, msg.name, msg.file, msg.main))
      .catch((e) => crashed(e, msg.open));
    return;
  }
  chain = chain
    .then(() => handle(msg))
    .catch((e) => console.error("allocsim engine:", e));
};
