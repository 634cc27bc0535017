// The allocsim engine in a Web Worker: the same wasm as the page (the page posts its
// compiled module first), answering the page's requests in order without blocking the
// page's frames. The page starts three kinds (app/src/gui/workers.rs): the engine's, the
// workers of the ranks' pool (the same handler), and the search worker, named
// "allocsim-search", which keeps a trace for "What would fit?" and the capacity searches
// and which the page terminates to cancel one.
import init, { worker_init, worker_handle, search_handle } from "./allocsim_web.js";

const handle = self.name === "allocsim-search" ? search_handle : worker_handle;
let chain = null;

self.onmessage = (event) => {
  if (chain === null) {
    chain = init({ module_or_path: event.data }).then(() => worker_init());
    return;
  }
  const msg = event.data;
  chain = chain
    .then(() => handle(msg))
    .catch((e) => console.error("allocsim engine:", e));
};
