// The README's browser figures (scripts/test-browser.sh --bench): in Debian's headless
// Chromium (WebGL2 through SwiftShader), for a real snapshot (kvcache_decode by default):
// the time from dropping it on the page to its first full frame (every configuration
// replayed and its layout at the cursor on screen), the time to show the layout at another
// event (keyboard steps, pages and jumps), the longest frame gap while it loads, and the
// tab's memory (renderer and GPU process RSS from /proc, the page's JS heap from the
// DevTools protocol). Each run is a fresh browser (cold); the figures are the minimum over
// the runs for times and the maximum for memory, as ../shared/docs/peers.md §E measured
// memory_viz.
//
// node bench.mjs --url URL --traces DIR --out DIR [--trace NAME] [--runs N] [--settle-ms MS]
//   [--view allocations] [--chromium PATH]

import { writeFileSync, mkdirSync, readFileSync, statSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import {
  arg,
  launch,
  waitFrame,
  layoutMarker,
  markTime,
  frameGaps,
  canvasStats,
  dropFile,
  warmedUp,
  processMemory,
  jsHeap,
  paintedAfter,
  wasmMemory,
  wasmHeaps,
  exportTimelineCsv,
  sampleMemory,
  threadCpu,
  cpuBetween,
} from "./lib.mjs";

const url = arg("--url");
const traces = arg("--traces");
const out = arg("--out", "/tmp/allocsim-artifacts");
const trace = arg("--trace", "kvcache_decode.pickle.gz");
const runs = Number(arg("--runs", "3"));
/// Milliseconds to wait after the first full frame before stepping (0: step at once, while
/// the worker may still run the what-if replays the compare table asks for).
const settle = Number(arg("--settle-ms", "0"));
const chromiumPath = arg("--chromium", "/usr/bin/chromium");
/// `--open-only 1`: the opening figures alone (a trace so big that the worker's what-if
/// replays after the first frame hold the key presses' layouts back for minutes).
const openOnly = arg("--open-only", "0") === "1";
/// `--view allocations`: step in the timeline's stacked Allocations view (its button clicked
/// where the 1400 × 900 window shows it) instead of the Metrics view the app opens in.
const view = arg("--view", "metrics");
/// `--view-wait-ms`: how long the stacked view is given to build its quads after the click.
const viewWait = Number(arg("--view-wait-ms", "1500"));
/// `--cold 1`: the file dropped 300 ms after the example is on screen, whether or not the
/// page's warm-up (which optimizes the code an open runs) has ended; by default the drop
/// waits for it, as a user's does.
const cold = arg("--cold", "0") === "1";
/// `--export-csv 1`: after the open, File > Export timeline CSV… (its menu item clicked
/// where the 1400 × 900 window shows it): the time to the download, its size, and the
/// whole run's peak with it.
const exportCsv = arg("--export-csv", "0") === "1";
mkdirSync(out, { recursive: true });
const log = (msg) => console.log(msg);

/// The keys pressed for "the layout at another event", in order.
const KEYS = ["ArrowRight", "ArrowRight", "PageDown", "PageDown", "End", "Home", "PageDown", "ArrowLeft", "End", "PageUp"];

/// Where the open's time and memory went: each stage the worker reported (the progress
/// marker's stage, without its fraction) and each frame marker, from the page time it first
/// showed, with the highest renderer RSS sampled while it lasted and the frames the app
/// drew meanwhile (`frames`: their page times from the drop).
function stages(marks, samples, frames) {
  const out = [];
  for (const [t, name, value] of marks) {
    const what = name === "data-allocsim-progress" ? value.replace(/:[0-9.]+$/, "") : `${name}=${value}`;
    if (out.length > 0 && out[out.length - 1].what === what) continue;
    out.push({ t_ms: t, what });
  }
  for (let i = 0; i < out.length; i++) {
    const end = i + 1 < out.length ? out[i + 1].t_ms : Infinity;
    const during = samples.filter(([t]) => t >= out[i].t_ms && t < end).map(([, mib]) => mib);
    out[i].ms = Number.isFinite(end) ? end - out[i].t_ms : null;
    out[i].renderer_max_mib = during.length > 0 ? Math.max(...during) : null;
    out[i].paints = frames.filter((t) => t >= out[i].t_ms && t < end).length;
  }
  return out;
}

/// The workers' timing lines (`allocsim worker NAME: WHAT took MS ms (NOTE), ended at
/// EPOCH_MS`, web/src/lib.rs) as `{t_ms, ms, what}`, `t_ms` from the drop (`dropEpoch`).
function workerStages(consoleLines, dropEpoch) {
  const out = [];
  // Playwright may report a worker's line twice (the worker and the page): once each.
  for (const line of new Set(consoleLines.map((l) => l.replace(/^\[[^\]]*\] /, "")))) {
    const m = line.match(/allocsim worker (.*) took (\d+) ms(.*), ended at (\d+)/);
    if (!m) continue;
    const ended = Number(m[4]) - dropEpoch;
    if (ended < 0) continue;
    out.push({ t_ms: Math.round(ended - Number(m[2])), ms: Number(m[2]), what: `${m[1]}${m[3]}` });
  }
  return out.sort((a, b) => a.t_ms - b.t_ms);
}

async function oneRun(i) {
  const s = await launch(chromiumPath);
  const { page } = s;
  const r = { load_average: readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ") };
  await page.goto(url, { waitUntil: "load" });
  await waitFrame(page, "ready:oom_story");
  r.warm_up = cold ? "not waited for" : await warmedUp(page);
  r.renderer = (s.console.find((l) => l.includes("allocsim: renderer")) ?? "").replace(/^.*allocsim: renderer /, "");
  await page.waitForTimeout(300);
  r.memory_before_mib = { ...processMemory(s.profile), js_heap: await jsHeap(s) };

  const sampling = sampleMemory(s.profile);
  // The whole run's peak: the open, what the app does after it, the scrubbing.
  const wholeRun = sampleMemory(s.profile, 250);
  const cpuAtDrop = threadCpu(s.profile);
  const dropT = await dropFile(page, join(traces, trace), trace);
  await waitFrame(page, `ready:${trace}`, 300000);
  r.peak_while_opening_mib = sampling();
  // Where the CPU went from the drop to the full frame, by thread.
  r.cpu_s_while_opening = cpuBetween(cpuAtDrop, threadCpu(s.profile));
  const readyT = await markTime(page, "data-allocsim-frame", dropT, `v.startsWith('ready:${trace}')`);
  r.open_to_every_configuration_ms = Math.round(readyT - dropT);
  // The first full frame: the main configuration replayed, its layout on screen (the
  // whole trace's timeline and the memory map at an event).
  const fullT = await markTime(page, "data-allocsim-frame", dropT, `v.startsWith('full:${trace}:')`);
  r.open_to_first_full_frame_ms = fullT === null ? null : Math.round(fullT - dropT);
  // The first frame with the file's recorded timeline and end state (drawn once decoded).
  const recordedT = await markTime(page, "data-allocsim-frame", dropT, `v.startsWith('recorded:${trace}:')`);
  r.open_to_recorded_frame_ms = recordedT === null ? null : Math.round(recordedT - dropT);
  r.while_loading = await frameGaps(page, dropT, readyT);
  const paints = await page.evaluate(([from, to]) => window.__paints.filter((t) => t >= from && t <= to).map((t) => t - from), [dropT, readyT]);
  r.paints_while_opening = paints.length;
  r.stages = stages(r.while_loading.marks, r.peak_while_opening_mib.samples, paints);
  r.worker_stages = workerStages(s.console, (await page.evaluate(() => performance.timeOrigin)) + dropT);
  delete r.while_loading.marks;
  r.events = Number((await page.evaluate(() => document.body.getAttribute("data-allocsim-frame"))).split(":").pop());
  await page.waitForTimeout(500 + settle);
  r.memory_after_open_mib = { ...processMemory(s.profile), js_heap: await jsHeap(s) };
  r.wasm_memory_after_open_mib = await wasmMemory(page);
  await canvasStats(page, join(out, `bench-${i}-opened.png`));

  if (exportCsv) {
    const t = Date.now();
    const path = join(out, `bench-${i}-timeline.csv`);
    const name = await exportTimelineCsv(page, path, 600000);
    r.export_csv = { ms: Date.now() - t, bytes: statSync(path).size, name };
    unlinkSync(path);
    log(`exported ${r.export_csv.name}: ${r.export_csv.bytes} bytes in ${r.export_csv.ms} ms`);
  }
  if (view === "allocations") {
    await page.mouse.click(454, 43);
    await page.waitForTimeout(viewWait);
  }
  await page.mouse.move(700, 890);
  r.layout = [];
  r.keys_skipped = [];
  for (const key of openOnly ? [] : KEYS) {
    const from = await layoutMarker(page);
    // A key that cannot move the cursor changes no layout: on forward at the trace's last
    // op (the cursor starts at the OOM or the peak, which may be within a page of the
    // end), back at its first. Skipped, not waited on.
    const stuck = (from >= r.events - 1 && ["ArrowRight", "PageDown", "End"].includes(key)) || (from <= 0 && ["ArrowLeft", "PageUp", "Home"].includes(key));
    if (stuck) {
      r.keys_skipped.push(key);
      continue;
    }
    const t = await page.evaluate(() => performance.now());
    await page.keyboard.press(key);
    await page.waitForFunction((f) => Number(document.body.getAttribute("data-allocsim-layout")) !== f, from, {
      timeout: 60000,
      polling: 5,
    });
    const to = await layoutMarker(page);
    const shown = await markTime(page, "data-allocsim-layout", t, `Number(v) === ${to}`);
    // The marker is set while the app builds the frame that shows the layout; that frame
    // is drawn after: the layout on screen, painting included.
    const painted = await paintedAfter(page, shown);
    r.layout.push({ key, from, to, ms: Math.round(shown - t), painted_ms: Math.round(painted - t) });
  }
  await page.waitForTimeout(500);
  r.memory_after_scrub_mib = { ...processMemory(s.profile), js_heap: await jsHeap(s) };
  r.wasm_memory_after_scrub_mib = await wasmMemory(page);
  r.wasm_heaps_after_scrub_mib = await wasmHeaps(page);
  const whole = wholeRun();
  r.peak_in_run_mib = { renderer: whole.renderer, tab: whole.tab, gpu: whole.gpu };
  await canvasStats(page, join(out, `bench-${i}-scrubbed.png`));
  r.console_errors = s.errors;
  await s.close();
  return r;
}

const all = [];
for (let i = 1; i <= runs; i++) {
  const r = await oneRun(i);
  const ms = r.layout.map((l) => l.ms).sort((a, b) => a - b);
  const painted = r.layout.map((l) => l.painted_ms).sort((a, b) => a - b);
  log(
    `run ${i} (load ${r.load_average}): ${trace} (${r.events} events) recorded timeline and end state in ${r.open_to_recorded_frame_ms} ms, ` +
      `first full frame (main configuration, its layout) in ${r.open_to_first_full_frame_ms} ms, ` +
      `every configuration replayed with its layout in ${r.open_to_every_configuration_ms} ms ` +
      `(longest frame gap ${r.while_loading.longest_gap_ms} ms); layout at another event: median ${ms[ms.length >> 1]} ms, max ${ms[ms.length - 1]} ms ` +
      `(painted: median ${painted[painted.length >> 1]} ms, max ${painted[painted.length - 1]} ms; ${r.layout.length} keys, skipped where the cursor cannot move: ${r.keys_skipped.join(", ") || "none"}); ` +
      `renderer RSS ${r.memory_after_open_mib.renderer} MiB after open (peak ${r.peak_while_opening_mib.renderer} MiB while opening; ` +
      `wasm: page ${r.wasm_memory_after_open_mib.page} MiB, workers ${r.wasm_memory_after_open_mib.workers.join(", ")} MiB), ${r.memory_after_scrub_mib.renderer} MiB after scrubbing; ` +
      `the tab's renderer ${r.memory_after_open_mib.tab} MiB after open, peak ${r.peak_while_opening_mib.tab} MiB while opening, ${r.peak_in_run_mib.tab} MiB in the whole run (all renderers ${r.peak_in_run_mib.renderer}); ` +
      `GPU process ${r.memory_after_scrub_mib.gpu} MiB; JS heap ${r.memory_after_scrub_mib.js_heap.used_mib} MiB; warm-up ${r.warm_up}`,
  );
  for (const st of r.stages) log(`  +${st.t_ms} ms (${st.ms ?? "-"} ms, ${st.paints} frames drawn, renderer up to ${st.renderer_max_mib ?? "-"} MiB) ${st.what}`);
  for (const st of r.worker_stages) log(`  +${st.t_ms} ms (${st.ms} ms) worker ${st.what}`);
  log(`  CPU seconds from the drop to the full frame: ${r.cpu_s_while_opening.map(([k, v]) => `${k} ${v}`).join(", ")}`);
  const at = r.peak_while_opening_mib.at_peak;
  if (at) log(`  renderer at its peak (+${at.t_ms} ms, ${at.total_mib} MiB): ${at.top.map((m) => `${m.mib}/${m.size_mib} MiB ${m.perms} ${m.path}`).join("; ")}; rest ${at.rest_mib} MiB`);
  if (r.console_errors.length > 0) log(`run ${i}: console errors: ${r.console_errors.join(" | ")}`);
  all.push(r);
}

const min = (f) => Math.min(...all.map(f));
const max = (f) => Math.max(...all.map(f));
const layoutAll = all.flatMap((r) => r.layout.map((l) => l.ms)).sort((a, b) => a - b);
const paintedAll = all.flatMap((r) => r.layout.map((l) => l.painted_ms)).sort((a, b) => a - b);
const summary = {
  trace,
  events: all[0].events,
  renderer: all[0].renderer,
  runs,
  open_to_recorded_frame_ms_min: min((r) => r.open_to_recorded_frame_ms ?? Infinity),
  open_to_recorded_frame_ms_all: all.map((r) => r.open_to_recorded_frame_ms),
  open_to_first_full_frame_ms_min: min((r) => r.open_to_first_full_frame_ms ?? Infinity),
  open_to_first_full_frame_ms_all: all.map((r) => r.open_to_first_full_frame_ms),
  open_to_every_configuration_ms_min: min((r) => r.open_to_every_configuration_ms),
  open_to_every_configuration_ms_all: all.map((r) => r.open_to_every_configuration_ms),
  longest_frame_gap_while_loading_ms_max: max((r) => r.while_loading.longest_gap_ms),
  layout_at_another_event_ms_median: layoutAll[layoutAll.length >> 1],
  layout_at_another_event_ms_max: layoutAll[layoutAll.length - 1],
  layout_at_another_event_painted_ms_median: paintedAll[paintedAll.length >> 1],
  layout_at_another_event_painted_ms_max: paintedAll[paintedAll.length - 1],
  load_average: readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" "),
  renderer_rss_mib_before_open_max: max((r) => r.memory_before_mib.renderer),
  renderer_rss_mib_after_open_max: max((r) => r.memory_after_open_mib.renderer),
  renderer_rss_mib_peak_while_opening_max: max((r) => r.peak_while_opening_mib.renderer),
  page_wasm_mib_after_open_max: max((r) => r.wasm_memory_after_open_mib.page ?? 0),
  engine_worker_wasm_mib_after_open_max: max((r) => r.wasm_memory_after_open_mib.workers[0] ?? 0),
  page_wasm_mib_after_scrub_max: max((r) => r.wasm_memory_after_scrub_mib.page ?? 0),
  engine_worker_wasm_mib_after_scrub_max: max((r) => r.wasm_memory_after_scrub_mib.workers[0] ?? 0),
  renderer_rss_mib_after_scrub_max: max((r) => r.memory_after_scrub_mib.renderer),
  tab_renderer_rss_mib_after_open_max: max((r) => r.memory_after_open_mib.tab),
  tab_renderer_rss_mib_peak_while_opening_max: max((r) => r.peak_while_opening_mib.tab),
  tab_renderer_rss_mib_peak_in_run_max: max((r) => r.peak_in_run_mib.tab),
  renderer_rss_mib_peak_in_run_max: max((r) => r.peak_in_run_mib.renderer),
  gpu_process_rss_mib_after_scrub_max: max((r) => r.memory_after_scrub_mib.gpu),
  js_heap_used_mib_after_scrub_max: max((r) => r.memory_after_scrub_mib.js_heap.used_mib),
};
writeFileSync(join(out, "bench-results.json"), JSON.stringify({ summary, runs: all }, null, 2) + "\n");
log(JSON.stringify(summary, null, 2));
log(`figures in ${join(out, "bench-results.json")}`);
if (all.some((r) => r.console_errors.length > 0)) process.exit(1);
