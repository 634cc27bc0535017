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
// A file is read ahead in slices by a worker of the engine's own, this file again under
// the name "allocsim-reader", which runs no wasm and loads none of its glue
// (allocsimReadAhead); the engine's worker starts one once its wasm is ready and keeps it
// between files, so no open waits for a worker to start.

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
      // A new file (or none: the reading stopped); nothing read before is posted.
      file = m.file;
      slice = m.slice;
      gen = -1;
      credit = 0;
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

/// The engine's side of a reader worker: `take(file, slice, depth, done)` hands it
/// `file` (`slice` bytes a read, `depth` read ahead) and gives the handle
/// `allocsimReadAhead` returns. Each seek's slices carry a number of their own (`gen`,
/// never reused), so a slice of a file or seek before, still in flight, is dropped.
function startReader() {
  const worker = new Worker(new URL(import.meta.url), { type: "module", name: "allocsim-reader" });
  let gen = 0;
  let broken = false;
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
    broken = true;
    arrive({ gen, at: -1, error: event.message || "the reader stopped" });
  };
  return {
    get broken() {
      return broken;
    },
    take(file, slice, depth, done) {
      gen += 1;
      got.length = 0;
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
          gen += 1;
          got.length = 0;
          worker.postMessage({ file: null, slice: 0 });
          done();
        },
      };
    },
    terminate() {
      worker.terminate();
    },
  };
}

/// The reader kept between files (the engine's worker's; started once its wasm is ready).
let standing = null;

/// A reader of `file` (web/src/lib.rs, Window): `seek(at)` starts the slices at byte `at`
/// (`slice` bytes each, `depth` read ahead), `next()` gives the next as {at, bytes}
/// ({at, error} if it could not be read), `stop()` ends the reading (the standing reader
/// waits for the next file; another is terminated).
self.allocsimReadAhead = (file, slice, depth) => {
  let reader = standing;
  standing = null;
  if (reader === null || reader.broken) {
    if (reader !== null) reader.terminate();
    reader = startReader();
  }
  return reader.take(file, slice, depth, () => {
    if (standing === null && !reader.broken) standing = reader;
    else reader.terminate();
  });
};

const search = self.name === "allocsim-search";
/// The wasm's glue once loaded (allocsim_web.js).
let glue = null;
let chain = null;

function crashed(e, job) {
  console.error("allocsim engine:", e);
  self.postMessage({ crashed: String(e), job });
}

if (self.name === "allocsim-reader") reader();
else self.onmessage = (event) => {
  if (chain === null) {
    // The glue is imported here, not at the top: the reader runs none of it.
    chain = import("./allocsim_web.js").then(async (g) => {
      const wasm = await g.default({ module_or_path: event.data });
      // This worker's wasm memory in bytes (a high-water mark), for the benchmarks.
      self.allocsimWasmBytes = () => wasm.memory.buffer.byteLength;
      // Its heap: [bytes live, their highest mark].
      self.allocsimHeapBytes = () => Array.from(g.heap_bytes());
      g.worker_init();
      glue = g;
      // The engine's worker (no name) keeps a reader ready for the files dropped.
      if (self.name === "") standing = startReader();
    });
    return;
  }
  const msg = event.data;
  if (msg && msg.cancel !== undefined) {
    // Never queued behind the job it cancels.
    if (glue !== null) glue.worker_cancel(msg.cancel);
    else chain = chain.then(() => glue.worker_cancel(msg.cancel));
    return;
  }
  if (msg && msg.warm !== undefined) {
    // The warm-up worker (allocsim-warm): says how long it took when done.
    chain = chain
      .then(() => glue.warm_up())
      .then((ms) => self.postMessage({ warmed: ms }))
      .catch((e) => console.error("allocsim warm-up:", e));
    return;
  }
  if (msg && msg.open !== undefined) {
    chain = chain
      .then(() =>
        search
          ? glue.search_open(msg.open, msg.name, msg.file)
          : glue.worker_open(msg.open, msg.name, msg.file, msg.main, msg.big_read),
      )
      .catch((e) => crashed(e, msg.open));
    return;
  }
  chain = chain
    .then(() => (search ? glue.search_handle(msg) : glue.worker_handle(msg)))
    .catch((e) => console.error("allocsim engine:", e));
};
