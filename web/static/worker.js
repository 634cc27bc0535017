// The allocsim engine in a Web Worker: the same wasm as the page (the page posts its
// compiled module first), answering the page's requests in order without blocking the
// page's frames. The page starts four kinds (app/src/gui/workers.rs, app/src/gui/io/web.rs):
// the engine's, the workers of the ranks' pool (the same handler), the search worker,
// named "allocsim-search", which keeps a trace for "What would fit?" and the capacity
// searches and which the page terminates to cancel one, and the warm-up worker,
// "allocsim-warm", which opens built-in examples once ({warm}) so that the code an open
// runs is optimized before the first file is dropped (web/src/lib.rs, warm_up), then says
// {warmed: ms}. A dropped file arrives as {open, name, file, main, big_read} (main: the
// configuration to replay once built, as the wire's bytes; big_read: the page's
// ?big_read=KIB, every file read as a big one is) and is read here;
// {cancel} stops it at once (not queued behind it). If the wasm stops (an allocation past
// its memory runs no panic hook) while it opens a file, the page hears {crashed, job}.
// A file too big to read whole is read ahead in slices by a worker of the engine's own,
// this file again under the name "allocsim-reader", which runs no wasm (allocsimReadAhead).
import init, { worker_init, worker_handle, worker_open, worker_cancel, search_handle, search_open, warm_up, heap_bytes } from "./allocsim_web.js";

/// The reader (allocsim-reader): reads slices of a File from where it is told to seek,
/// up to as many ahead as it is given credit for, two at a time, each posted
/// (transferred) in order as it is read, with the number of the seek it belongs to. A
/// worker of its own: a slice read by the engine's worker arrives only while that worker's
/// thread is idle, so its reads and its decode took turns (1.12 GB: 2 s of 3.2 s in the
/// first pass spent waiting). Two reads at once read a file about a third faster than
/// one (Chromium, this VM: 0.92-0.97 GB/s against 0.71).
function reader() {
  let file = null;
  let slice = 0;
  let gen = 0;
  let pos = 0;
  let credit = 0;
  let running = false;
  const reads = [];
  const pump = async () => {
    if (running) return;
    running = true;
    for (;;) {
      while (file !== null && credit > 0 && pos < file.size && reads.length < 2) {
        const at = pos;
        const end = Math.min(at + slice, file.size);
        credit -= 1;
        pos = end;
        const read = file.slice(at, end).arrayBuffer();
        // A failed read is posted in its turn, below.
        read.catch(() => {});
        reads.push({ g: gen, at, read });
      }
      if (reads.length === 0) break;
      const { g, at, read } = reads.shift();
      try {
        const bytes = await read;
        if (g === gen) self.postMessage({ gen: g, at, bytes }, [bytes]);
      } catch (e) {
        if (g === gen) self.postMessage({ gen: g, at, error: String(e) });
      }
    }
    running = false;
  };
  self.onmessage = (event) => {
    const m = event.data;
    if (m.file !== undefined) {
      file = m.file;
      slice = m.slice;
    } else if (m.seek !== undefined) {
      gen = m.gen;
      pos = m.seek;
      credit = m.depth;
    } else if (m.more === gen) {
      credit += 1;
    }
    pump();
  };
}

/// The engine's side of a reader of `file` (web/src/lib.rs, Window): `seek(at)` starts
/// the slices at byte `at` (`slice` bytes each, `depth` read ahead), `next()` gives the
/// next as {at, bytes} ({at, error} if it could not be read), `stop()` ends the reader.
self.allocsimReadAhead = (file, slice, depth) => {
  const worker = new Worker(new URL(import.meta.url), { type: "module", name: "allocsim-reader" });
  let gen = 0;
  const got = [];
  let wake = null;
  const arrive = (m) => {
    got.push(m);
    if (wake !== null) {
      const w = wake;
      wake = null;
      w();
    }
  };
  worker.onmessage = (event) => {
    if (event.data.gen === gen) arrive(event.data);
  };
  worker.onerror = (event) => {
    event.preventDefault();
    arrive({ gen, at: -1, error: event.message || "the reader stopped" });
  };
  worker.postMessage({ file, slice });
  return {
    seek(at) {
      gen += 1;
      got.length = 0;
      worker.postMessage({ seek: at, gen, depth });
    },
    async next() {
      while (got.length === 0) await new Promise((resolve) => (wake = resolve));
      const m = got.shift();
      if (m.bytes !== undefined) worker.postMessage({ more: gen });
      return m;
    },
    stop() {
      worker.terminate();
    },
  };
};

const search = self.name === "allocsim-search";
const handle = search ? search_handle : worker_handle;
const open = search ? search_open : worker_open;
let chain = null;

function crashed(e, job) {
  console.error("allocsim engine:", e);
  self.postMessage({ crashed: String(e), job });
}

if (self.name === "allocsim-reader") reader();
else self.onmessage = (event) => {
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
      .then(() => open(msg.open, msg.name, msg.file, msg.main, msg.big_read))
      .catch((e) => crashed(e, msg.open));
    return;
  }
  chain = chain
    .then(() => handle(msg))
    .catch((e) => console.error("allocsim engine:", e));
};
