// The allocsim engine in a Web Worker: the same wasm as the page (the page posts its
// compiled module first), answering the page's requests in order without blocking the
// page's frames.
import init, { worker_init, worker_handle } from "./allocsim_web.js";

let chain = null;

self.onmessage = (event) => {
  if (chain === null) {
    chain = init({ module_or_path: event.data }).then(() => worker_init());
    return;
  }
  const msg = event.data;
  chain = chain
    .then(() => worker_handle(msg))
    .catch((e) => console.error("allocsim engine:", e));
};
