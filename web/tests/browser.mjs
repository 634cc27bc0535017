// The allocsim web app in a real browser: Debian's headless Chromium driven by
// playwright-core. Opens the locally served page, waits for the app's first-frame marker,
// checks the canvas is not blank, drops real snapshots on it, steps the cursor with the
// keyboard, and fails on any console error. Also measures (the README's browser numbers):
// choosing kvcache_decode to its first full frame, showing the layout at another event,
// and the tab's memory. Screenshots and timings go to the artifacts folder.
//
// node browser.mjs --url http://127.0.0.1:PORT/ --traces DIR --out DIR [--chromium PATH]

import { chromium } from "playwright-core";
import { readFileSync, writeFileSync, mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";

const arg = (name, def) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : def;
};
const url = arg("--url");
const traces = arg("--traces");
const out = arg("--out", "artifacts");
const executablePath = arg("--chromium", "/usr/bin/chromium");
mkdirSync(out, { recursive: true });

const failures = [];
const fail = (msg) => {
  console.error("FAIL: " + msg);
  failures.push(msg);
};
const log = (msg) => console.log(msg);

const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: [
    "--no-sandbox",
    "--enable-unsafe-swiftshader",
    "--use-angle=swiftshader",
    "--ignore-gpu-blocklist",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
  ],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
const page = await context.newPage();
const consoleErrors = [];
const consoleLines = [];
page.on("console", (m) => {
  consoleLines.push(`[${m.type()}] ${m.text()}`);
  if (m.type() === "error") consoleErrors.push(m.text());
});
page.on("pageerror", (e) => consoleErrors.push("page error: " + e.message));
page.on("worker", (w) => {
  w.on("console", (m) => {
    consoleLines.push(`[worker ${m.type()}] ${m.text()}`);
    if (m.type() === "error") consoleErrors.push("worker: " + m.text());
  });
});

// Timestamps (performance.now) of every change of the app's markers, recorded in the page.
await page.addInitScript(() => {
  window.__marks = [];
  const watch = () => {
    new MutationObserver((changes) => {
      for (const c of changes) {
        window.__marks.push({ t: performance.now(), name: c.attributeName, value: document.body.getAttribute(c.attributeName) });
      }
    }).observe(document.body, { attributes: true, attributeFilter: ["data-allocsim-frame", "data-allocsim-layout"] });
  };
  if (document.body) watch();
  else document.addEventListener("DOMContentLoaded", watch);
});

const frameMarker = () => page.evaluate(() => document.body.getAttribute("data-allocsim-frame"));
const layoutMarker = () => page.evaluate(() => Number(document.body.getAttribute("data-allocsim-layout")));
async function waitFrame(prefix, timeout = 180000) {
  await page.waitForFunction((p) => (document.body.getAttribute("data-allocsim-frame") || "").startsWith(p), prefix, { timeout, polling: 20 });
}
async function waitLayout(op, timeout = 60000) {
  await page.waitForFunction((o) => Number(document.body.getAttribute("data-allocsim-layout")) === o, op, { timeout, polling: 10 });
}
/// When (performance.now) the marker first took a value matching `pred` after time `after`.
async function markTime(name, after, predSrc) {
  return page.evaluate(
    ([name, after, predSrc]) => {
      const pred = new Function("v", "return " + predSrc);
      const m = window.__marks.find((m) => m.name === name && m.t >= after && pred(m.value));
      return m ? m.t : null;
    },
    [name, after, predSrc],
  );
}

/// Counts distinct colours and non-background pixels of a screenshot of the canvas.
async function canvasStats(file) {
  const png = await page.locator("#allocsim_canvas").screenshot({ path: file });
  return page.evaluate(async (b64) => {
    const img = new Image();
    img.src = "data:image/png;base64," + b64;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = img.width;
    c.height = img.height;
    const g = c.getContext("2d");
    g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    const colours = new Set();
    const bg = [d[0], d[1], d[2]];
    let differ = 0;
    for (let i = 0; i < d.length; i += 4 * 7) {
      colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
      if (Math.abs(d[i] - bg[0]) + Math.abs(d[i + 1] - bg[1]) + Math.abs(d[i + 2] - bg[2]) > 24) differ++;
    }
    return { width: c.width, height: c.height, colours: colours.size, differing: differ / (d.length / (4 * 7)) };
  }, png.toString("base64"));
}

/// Drops a file on the canvas the way a user's drag-and-drop does; returns the page time
/// of the drop.
async function dropFile(path, name) {
  const b64 = readFileSync(path).toString("base64");
  return page.evaluate(
    ([b64, name]) => {
      const bin = atob(b64);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      const dt = new DataTransfer();
      dt.items.add(new File([bytes], name));
      const canvas = document.getElementById("allocsim_canvas");
      const t = performance.now();
      for (const type of ["dragenter", "dragover", "drop"]) {
        canvas.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
      }
      return t;
    },
    [b64, name],
  );
}

/// Resident memory (MiB) of the renderer and GPU processes of this browser, from /proc.
function processMemory() {
  const out = { renderer: 0, gpu: 0, browser: 0 };
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    let cmd = "";
    let status = "";
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      status = readFileSync(`/proc/${pid}/status`, "utf8");
    } catch {
      continue;
    }
    if (!cmd.includes("chromium") && !cmd.includes("chrome")) continue;
    const m = status.match(/VmRSS:\s+(\d+) kB/);
    if (!m) continue;
    const mib = Number(m[1]) / 1024;
    if (cmd.includes("--type=renderer")) out.renderer += mib;
    else if (cmd.includes("--type=gpu-process")) out.gpu += mib;
    else if (!cmd.includes("--type=")) out.browser += mib;
  }
  return out;
}

const results = { url, chromium: browser.version() };
try {
  // 1. The page opens on the built-in example and draws.
  const t0 = Date.now();
  await page.goto(url, { waitUntil: "load" });
  await waitFrame("ready:oom_story");
  results.open_to_first_full_frame_ms = Date.now() - t0;
  log(`first full frame of the built-in example after ${results.open_to_first_full_frame_ms} ms (from navigation)`);
  const renderer = consoleLines.find((l) => l.includes("allocsim: renderer"));
  results.renderer = renderer ? renderer.replace(/^.*allocsim: renderer /, "") : "unknown";
  log("renderer: " + results.renderer);
  const s1 = await canvasStats(join(out, "1-oom_story.png"));
  log(`canvas ${s1.width}x${s1.height}: ${s1.colours} colours, ${(s1.differing * 100).toFixed(1)}% not background`);
  if (s1.colours < 20 || s1.differing < 0.05) fail(`the canvas looks blank (${JSON.stringify(s1)})`);

  // 2. A real snapshot from the corpus, dropped on the canvas.
  await dropFile(join(traces, "multistream_pub.pickle.gz"), "multistream_pub.pickle.gz");
  await waitFrame("ready:multistream_pub.pickle.gz");
  const s2 = await canvasStats(join(out, "2-multistream_pub.png"));
  if (s2.colours < 20) fail("the canvas looks blank after dropping multistream_pub");
  log("dropped multistream_pub.pickle.gz: drawn");

  // 3. Step the cursor with the keyboard (focus the canvas without clicking a view).
  await page.mouse.move(700, 890);
  const before = await layoutMarker();
  await page.keyboard.press("ArrowRight");
  await waitLayout(before + 1);
  await page.keyboard.press("ArrowRight");
  await waitLayout(before + 2);
  await page.keyboard.press("ArrowLeft");
  await waitLayout(before + 1);
  log(`arrow keys moved the layout from op ${before} to ${before + 2} and back`);
  await canvasStats(join(out, "3-stepped.png"));

  // 4. Benchmark: choose kvcache_decode (drop it) until its first full frame.
  const memBefore = processMemory();
  const dropT = await dropFile(join(traces, "kvcache_decode.pickle.gz"), "kvcache_decode.pickle.gz");
  await waitFrame("ready:kvcache_decode.pickle.gz", 300000);
  const readyT = await markTime("data-allocsim-frame", dropT, "v.startsWith('ready:kvcache_decode')");
  results.kvcache_choose_to_first_full_frame_ms = Math.round(readyT - dropT);
  log(`kvcache_decode: dropped to first full frame in ${results.kvcache_choose_to_first_full_frame_ms} ms`);
  await page.waitForTimeout(500);
  results.memory_after_open_mib = processMemory();
  results.memory_before_open_mib = memBefore;
  const s4 = await canvasStats(join(out, "4-kvcache_decode.png"));
  if (s4.colours < 20) fail("the canvas looks blank after kvcache_decode");

  // 5. Benchmark: the layout at another event (keys: one step, a page, the end, the start).
  await page.mouse.move(700, 890);
  const layoutTimes = [];
  for (const key of ["ArrowRight", "PageDown", "PageDown", "End", "Home", "PageDown", "ArrowLeft", "End"]) {
    const from = await layoutMarker();
    const t = await page.evaluate(() => performance.now());
    await page.keyboard.press(key);
    await page.waitForFunction((f) => Number(document.body.getAttribute("data-allocsim-layout")) !== f, from, { timeout: 60000, polling: 5 });
    const to = await layoutMarker();
    const shown = await markTime("data-allocsim-layout", t, `Number(v) === ${to}`);
    layoutTimes.push({ key, from, to, ms: Math.round(shown - t) });
  }
  results.layout_at_another_event = layoutTimes;
  const ms = layoutTimes.map((l) => l.ms).sort((a, b) => a - b);
  results.layout_at_another_event_median_ms = ms[Math.floor(ms.length / 2)];
  results.layout_at_another_event_max_ms = ms[ms.length - 1];
  log(`layout at another event: median ${results.layout_at_another_event_median_ms} ms, max ${results.layout_at_another_event_max_ms} ms ${JSON.stringify(layoutTimes.map((l) => l.key + ":" + l.ms))}`);
  results.memory_after_scrub_mib = processMemory();
  await canvasStats(join(out, "5-kvcache_scrubbed.png"));
  log(`memory (RSS MiB) after open: ${JSON.stringify(results.memory_after_open_mib)}`);

  // 6. A bad file shows an error in the app, not in the console, and the app keeps working.
  await page.evaluate(() => {
    const dt = new DataTransfer();
    dt.items.add(new File([new Uint8Array([0x80, 0x04, 1, 2, 3])], "broken.pickle"));
    const canvas = document.getElementById("allocsim_canvas");
    for (const type of ["dragenter", "dragover", "drop"]) canvas.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
  });
  await page.waitForTimeout(1500);
  await canvasStats(join(out, "6-bad-file.png"));
  const from = await layoutMarker();
  await page.keyboard.press("ArrowRight");
  await waitLayout(from + 1);
  log("a broken file left the app working");
} catch (e) {
  fail(String(e && e.stack ? e.stack : e));
  await page.screenshot({ path: join(out, "failure.png") }).catch(() => {});
}

for (const e of consoleErrors) fail("console error: " + e);
writeFileSync(join(out, "console.log"), consoleLines.join("\n") + "\n");
results.failures = failures;
writeFileSync(join(out, "browser-results.json"), JSON.stringify(results, null, 2) + "\n");
await browser.close();
if (failures.length > 0) {
  console.error(`browser test: ${failures.length} failure(s); see ${out}`);
  process.exit(1);
}
console.log(`browser test: ok (artifacts in ${out})`);
