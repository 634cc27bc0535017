// Where the page's time goes (a development tool, not a test): opens a trace in headless
// Chromium like bench.mjs, then records a DevTools trace and a JS/wasm CPU profile while
// the keyboard moves the cursor, and prints the frame gaps and the hottest functions.
//
// node profile.mjs --url URL --traces DIR --out DIR [--trace NAME] [--keys N] [--idle-ms MS]

import { writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { arg, launch, waitFrame, layoutMarker, markTime, dropFile, paintedAfter } from "./lib.mjs";

const url = arg("--url");
const traces = arg("--traces");
const out = arg("--out", "/tmp/allocsim-artifacts");
const trace = arg("--trace", "kvcache_decode.pickle.gz");
const keys = Number(arg("--keys", "6"));
const idle = Number(arg("--idle-ms", "3000"));
mkdirSync(out, { recursive: true });
const TRACE_CATEGORIES =
  "devtools.timeline,disabled-by-default-devtools.timeline,disabled-by-default-devtools.timeline.frame,gpu,viz,cc,benchmark";

/// The `n` functions with the most self time in a CPU profile of the page's thread.
function printHottest(profile, n) {
  const self = new Map();
  const byId = new Map(profile.nodes.map((x) => [x.id, x]));
  const dt = profile.timeDeltas;
  for (let i = 0; i < profile.samples.length; i++) {
    const x = byId.get(profile.samples[i]);
    const name = `${x.callFrame.functionName || "(anon)"} ${x.callFrame.url.split("/").pop()}`;
    self.set(name, (self.get(name) ?? 0) + (dt[i] ?? 0) / 1000);
  }
  const top = [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, n);
  for (const [name, ms] of top) console.log(`${ms.toFixed(0).padStart(7)} ms  ${name}`);
}

/// Each watched thread's tasks of 2 ms or more in the trace `chunks` from `t0` (µs) for
/// `span` µs, as `start+length` in ms after `t0`, and the animation frames.
function printTasks(chunks, t0, span) {
  const names = new Map();
  for (const e of chunks) if (e.ph === "M" && e.name === "thread_name") names.set(`${e.pid}:${e.tid}`, e.args.name);
  const watched = ["CrRendererMain", "DedicatedWorker thread", "CrGpuMain", "VizCompositorThread", "Compositor"];
  const t1 = t0 + span;
  const byThread = new Map();
  for (const e of chunks) {
    if (e.ph !== "X" || !["RunTask", "ThreadControllerImpl::RunTask"].includes(e.name) || e.dur < 2000) continue;
    const th = names.get(`${e.pid}:${e.tid}`);
    if (!watched.includes(th) || e.ts + e.dur < t0 || e.ts > t1) continue;
    const k = `${th} ${e.tid}`;
    if (!byThread.has(k)) byThread.set(k, []);
    byThread.get(k).push(e);
  }
  for (const [k, own] of byThread) {
    const busy = own.reduce((a, e) => a + e.dur, 0) / 1000;
    console.log(`  ${k.padEnd(30)} busy ${busy.toFixed(0).padStart(5)} ms: ${own.map((e) => `${Math.round((e.ts - t0) / 1000)}+${Math.round(e.dur / 1000)}`).join(" ")}`);
  }
  const raf = chunks.filter((e) => e.ph === "X" && e.name === "FireAnimationFrame" && e.dur >= 1000 && e.ts >= t0 && e.ts <= t1);
  console.log(`  animation frames of 1 ms or more: ${raf.map((e) => `${Math.round((e.ts - t0) / 1000)}+${Math.round(e.dur / 1000)}`).join(" ")}`);
}

const s = await launch(arg("--chromium", "/usr/bin/chromium"));
const { page } = s;
await page.goto(url, { waitUntil: "load" });
await waitFrame(page, "ready:oom_story");
// `--open 1`: a DevTools trace of the open itself (drop → the `ready:` frame), printed as
// each thread's tasks in ms after the drop, then exits.
const openOnly = arg("--open", "0") === "1";
let openCdp = null;
const openChunks = [];
if (openOnly) {
  await page.waitForTimeout(500);
  openCdp = await s.context.newCDPSession(page);
  openCdp.on("Tracing.dataCollected", (e) => openChunks.push(...e.value));
  await openCdp.send("Tracing.start", { categories: TRACE_CATEGORIES, transferMode: "ReportEvents" });
  await openCdp.send("Profiler.enable");
  await openCdp.send("Profiler.setSamplingInterval", { interval: 500 });
  await openCdp.send("Profiler.start");
}
const dropT = await dropFile(page, join(traces, trace), trace);
await waitFrame(page, `ready:${trace}`, 300000);
const readyT = await markTime(page, "data-allocsim-frame", dropT, `v.startsWith('ready:${trace}')`);
console.log(`ready after ${Math.round(readyT - dropT)} ms`);
if (openOnly) {
  await page.waitForTimeout(200);
  const done = new Promise((r) => openCdp.once("Tracing.tracingComplete", r));
  await openCdp.send("Tracing.end");
  await done;
  const { profile } = await openCdp.send("Profiler.stop");
  printHottest(profile, 25);
  const marks = await page.evaluate((from) => window.__marks.filter((m) => m.t >= from).map((m) => [Math.round(m.t - from), m.value]), dropT);
  console.log(`markers: ${JSON.stringify(marks)}`);
  const frames = await page.evaluate(([from, to]) => window.__frames.filter((t) => t >= from && t <= to + 200).map((t) => Math.round(t - from)), [dropT, readyT]);
  console.log(`animation frames at: ${JSON.stringify(frames)}`);
  for (const l of s.console.filter((l) => l.includes("allocsim:"))) console.log(`console: ${l}`);
  const stamp = openChunks.find((e) => e.name === "TimeStamp" && e.args?.data?.message === "allocsim-drop");
  printTasks(openChunks, stamp ? stamp.ts : openChunks[0].ts, (readyT - dropT + 200) * 1000);
  writeFileSync(join(out, "open-trace.json"), JSON.stringify({ traceEvents: openChunks }));
  // The page's CPU profile over the open, its times in µs of the trace's clock.
  writeFileSync(join(out, "open.cpuprofile"), JSON.stringify(profile));
  await s.close();
  process.exit(0);
}
await page.mouse.move(700, 890);
await page.waitForTimeout(idle);

// Frames while idle.
const gaps = (from, to) =>
  page.evaluate(([from, to]) => {
    const f = window.__frames.filter((t) => t >= from && t <= to);
    const g = [];
    for (let i = 1; i < f.length; i++) g.push(Math.round(f[i] - f[i - 1]));
    return g;
  }, [from, to]);
const t0 = await page.evaluate(() => performance.now());
await page.waitForTimeout(2000);
const t1 = await page.evaluate(() => performance.now());
const idleGaps = await gaps(t0, t1);
console.log(`idle 2 s: ${idleGaps.length} frames, gaps ${JSON.stringify(idleGaps.slice(0, 40))}`);

const cdp = await s.context.newCDPSession(page);
await cdp.send("Profiler.enable");
await cdp.send("Profiler.setSamplingInterval", { interval: 200 });
await cdp.send("Profiler.start");
const chunks = [];
cdp.on("Tracing.dataCollected", (e) => chunks.push(...e.value));
await cdp.send("Tracing.start", { categories: TRACE_CATEGORIES, transferMode: "ReportEvents" });
const seq = ["ArrowRight", "PageDown", "End", "Home", "PageDown", "ArrowLeft", "PageUp", "ArrowRight"];
const lat = [];
const k0 = await page.evaluate(() => performance.now());
for (let i = 0; i < keys; i++) {
  const key = seq[i % seq.length];
  const from = await layoutMarker(page);
  // A stamp in the DevTools trace at the page time `t`: the key's window in the trace.
  const t = await page.evaluate(() => {
    console.timeStamp("allocsim-key");
    return performance.now();
  });
  await page.keyboard.press(key);
  await page.waitForFunction((f) => Number(document.body.getAttribute("data-allocsim-layout")) !== f, from, { timeout: 60000, polling: 5 });
  const to = await layoutMarker(page);
  const shown = await markTime(page, "data-allocsim-layout", t, `Number(v) === ${to}`);
  const painted = await paintedAfter(page, shown);
  lat.push({ key, t, built: Math.round(shown - t), painted: Math.round(painted - t) });
  await page.waitForTimeout(300);
}
const k1 = await page.evaluate(() => performance.now());
const done = new Promise((r) => cdp.once("Tracing.tracingComplete", r));
await cdp.send("Tracing.end");
await done;
const { profile } = await cdp.send("Profiler.stop");
console.log(`layout latencies (built / painted ms) ${JSON.stringify(lat.map((l) => [l.key, l.built, l.painted]))}`);
console.log(`frame gaps while stepping: ${JSON.stringify(await gaps(k0, k1))}`);
writeFileSync(join(out, "profile.cpuprofile"), JSON.stringify(profile));
writeFileSync(join(out, "trace.json"), JSON.stringify({ traceEvents: chunks }));

printHottest(profile, 40);

// Trace: long tasks per thread name.
const names = new Map();
for (const e of chunks) if (e.ph === "M" && e.name === "thread_name") names.set(`${e.pid}:${e.tid}`, e.args.name);
const per = new Map();
for (const e of chunks) {
  if (e.ph !== "X" || !e.dur) continue;
  if (!["RunTask", "ThreadControllerImpl::RunTask"].includes(e.name)) continue;
  const k = names.get(`${e.pid}:${e.tid}`) ?? `${e.pid}:${e.tid}`;
  per.set(k, (per.get(k) ?? 0) + e.dur / 1000);
}
console.log("busy per thread (ms):", JSON.stringify([...per.entries()].sort((a, b) => b[1] - a[1]).slice(0, 12)));

// Each key's window, frame by frame: the tasks of 1 ms or more on the page's thread, the
// engine worker, the GPU process and the display compositor, from the key press to the
// layout painted, in ms after the key (start+length), so one sees how many frames a key
// costs and who draws them.
const stamps = chunks.filter((e) => e.name === "TimeStamp" && e.args?.data?.message === "allocsim-key").map((e) => e.ts);
const watched = ["CrRendererMain", "DedicatedWorker thread", "CrGpuMain", "VizCompositorThread", "Compositor"];
const tasks = chunks.filter(
  (e) => e.ph === "X" && ["RunTask", "ThreadControllerImpl::RunTask"].includes(e.name) && e.dur >= 1000 && watched.includes(names.get(`${e.pid}:${e.tid}`)),
);
const frames = chunks.filter((e) => e.ph === "X" && e.name === "FireAnimationFrame" && e.dur >= 1000);
lat.forEach((l, i) => {
  const t0 = stamps[i];
  if (t0 === undefined) return;
  const t1 = t0 + (l.painted + 20) * 1000;
  console.log(`key ${i} ${l.key}: built ${l.built} ms, painted ${l.painted} ms`);
  for (const th of watched) {
    const own = tasks.filter((e) => names.get(`${e.pid}:${e.tid}`) === th && e.ts + e.dur >= t0 && e.ts <= t1);
    if (own.length === 0) continue;
    const busy = own.reduce((a, e) => a + e.dur, 0) / 1000;
    const list = own.map((e) => `${Math.round((e.ts - t0) / 1000)}+${Math.round(e.dur / 1000)}`).join(" ");
    console.log(`  ${th.padEnd(22)} busy ${busy.toFixed(0).padStart(4)} ms: ${list}`);
  }
  const raf = frames.filter((e) => e.ts >= t0 && e.ts <= t1).map((e) => `${Math.round((e.ts - t0) / 1000)}+${Math.round(e.dur / 1000)}`);
  console.log(`  animation frames of 1 ms or more: ${raf.join(" ")}`);
});
await s.close();
