// Diagnostic (README, session 22): the page's and each worker's wasm memory and heap
// (`allocsimHeapBytes`: live, highest mark) and the tab's renderer RSS, sampled every
// 300 ms (when the page and the workers answer) from a drop to 6 s after the open (26 s
// with `allocations`: the stacked view shown), one line per change.
//
// node wasm-trace.mjs URL FILE NAME [allocations]
import { launch, waitFrame, dropFile, warmedUp, wasmMemory, wasmHeaps, processMemory } from "./lib.mjs";
const [url, file, name, view] = process.argv.slice(2);
const s = await launch("/usr/bin/chromium");
const { page } = s;
await page.goto(url, { waitUntil: "load" });
await waitFrame(page, "ready:oom_story");
await warmedUp(page);
const t0 = Date.now();
let stop = false;
const samples = [];
(async () => {
  while (!stop) {
    const w = await wasmMemory(page).catch(() => null);
    const h = await wasmHeaps(page).catch(() => null);
    const stage = await page.evaluate(() => [document.body.getAttribute("data-allocsim-progress"), document.body.getAttribute("data-allocsim-frame")]).catch(() => null);
    const m = processMemory(s.profile);
    samples.push({ t: Date.now() - t0, page: w?.page, worker: w?.workers?.[0], heaps: h, tab: m.tab, stage });
    await new Promise((r) => setTimeout(r, 300));
  }
})();
await dropFile(page, file, name);
await waitFrame(page, `ready:${name}`, 300000);
await page.waitForTimeout(4000);
if (view === "allocations") {
  await page.mouse.click(454, 43);
  await page.waitForTimeout(20000);
}
await page.waitForTimeout(2000);
stop = true;
await page.waitForTimeout(500);
let last = null;
for (const x of samples) {
  const key = JSON.stringify([x.page, x.worker, x.heaps, x.stage]);
  if (key !== last) console.log(JSON.stringify(x));
  last = key;
}
console.log(JSON.stringify(samples[samples.length - 1]));
await s.close();
