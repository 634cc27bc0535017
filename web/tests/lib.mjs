// What browser.mjs (the test) and bench.mjs (the figures) share: launching Debian's
// Chromium through playwright-core, the app's markers, dropping files on the canvas,
// looking at the canvas's pixels, frame gaps, and the memory of the tab.

import { chromium } from "playwright-core";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";

/// Command-line `--name value`, or `def`.
export function arg(name, def) {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : def;
}

/// Flags that work as root on a machine without a GPU: WebGL2 through SwiftShader, and
/// nothing that talks to the network on its own.
const FLAGS = [
  "--no-sandbox",
  "--enable-unsafe-swiftshader",
  "--use-angle=swiftshader",
  "--ignore-gpu-blocklist",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
  "--disable-quic",
];

/// A headless Chromium with a fresh profile (its own --user-data-dir) and one page, with
/// the console (page and workers) and the page's marker and frame records wired up.
export async function launch(executablePath, { width = 1400, height = 900 } = {}) {
  const profile = mkdtempSync(join(tmpdir(), "allocsim-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true,
    args: FLAGS,
    viewport: { width, height },
  });
  const page = context.pages()[0] ?? (await context.newPage());
  const session = {
    context,
    page,
    profile,
    console: [],
    errors: [],
    requests: [],
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
  const onConsole = (who) => (m) => {
    session.console.push(`[${who}${m.type()}] ${m.text()}`);
    if (m.type() === "error") session.errors.push(`${who}${m.text()}`);
  };
  page.on("console", onConsole(""));
  page.on("pageerror", (e) => session.errors.push("page error: " + e.message));
  page.on("worker", (w) => w.on("console", onConsole("worker ")));
  context.on("request", (r) => session.requests.push(r.url()));

  // Every change of the app's markers with its time, and every animation frame's time
  // (a long gap between two is a frozen page), recorded in the page (and in any other page
  // the context opens).
  await context.addInitScript(() => {
    window.__marks = [];
    window.__frames = [];
    const watch = () => {
      new MutationObserver((changes) => {
        // A marker set twice in one task gives two records: each value is the next
        // record's old value, the last one the attribute's value now.
        const t = performance.now();
        changes.forEach((c, i) => {
          const next = changes.slice(i + 1).find((d) => d.attributeName === c.attributeName);
          const value = next ? next.oldValue : document.body.getAttribute(c.attributeName);
          window.__marks.push({ t, name: c.attributeName, value });
        });
      }).observe(document.body, { attributes: true, attributeOldValue: true, attributeFilter: ["data-allocsim-frame", "data-allocsim-layout", "data-allocsim-progress", "data-allocsim-search", "data-allocsim-search-workers", "data-allocsim-repaint"] });
    };
    if (document.body) watch();
    else document.addEventListener("DOMContentLoaded", watch);
    // The frames the app drew (not only the browser's animation frames): the first WebGL
    // draw call after each animation frame marks one, with its time.
    window.__paints = [];
    let drew = true;
    for (const proto of [globalThis.WebGL2RenderingContext?.prototype, globalThis.WebGLRenderingContext?.prototype]) {
      if (!proto) continue;
      for (const name of ["drawElements", "drawArrays", "drawElementsInstanced", "drawArraysInstanced", "drawRangeElements", "clear"]) {
        const draw = proto[name];
        proto[name] = function (...args) {
          if (!drew) {
            drew = true;
            window.__paints.push(performance.now());
          }
          return draw.apply(this, args);
        };
      }
    }
    const tick = (t) => {
      window.__frames.push(t);
      drew = false;
      requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  });
  return session;
}

/// Waits until the first-full-frame marker starts with `prefix` (`ready:NAME`).
export async function waitFrame(page, prefix, timeout = 180000) {
  await page.waitForFunction((p) => (document.body.getAttribute("data-allocsim-frame") || "").startsWith(p), prefix, {
    timeout,
    polling: 20,
  });
}

/// The op whose layout is on screen (the shown event), from the app's marker.
export async function layoutMarker(page) {
  return page.evaluate(() => Number(document.body.getAttribute("data-allocsim-layout")));
}

/// Waits until the shown event is `op`.
export async function waitLayout(page, op, timeout = 60000) {
  await page.waitForFunction((o) => Number(document.body.getAttribute("data-allocsim-layout")) === o, op, {
    timeout,
    polling: 10,
  });
}

/// When (performance.now) the marker `name` first took a value satisfying `predSrc` (a JS
/// expression of `v`) at or after page time `after`; `null` if it has not.
export async function markTime(page, name, after, predSrc) {
  return page.evaluate(
    ([name, after, predSrc]) => {
      const pred = new Function("v", "return " + predSrc);
      const m = window.__marks.find((m) => m.name === name && m.t >= after && pred(m.value));
      return m ? m.t : null;
    },
    [name, after, predSrc],
  );
}

/// The animation frames between page times `from` and `to`: how many, the longest gap
/// between two (ms) — how long the page was frozen at worst — and every gap over 200 ms as
/// [start after `from`, length].
export async function frameGaps(page, from, to) {
  return page.evaluate(
    ([from, to]) => {
      const f = window.__frames.filter((t) => t >= from && t <= to);
      let longest = 0;
      const long = [];
      for (let i = 1; i < f.length; i++) {
        const gap = f[i] - f[i - 1];
        longest = Math.max(longest, gap);
        if (gap > 200) long.push([Math.round(f[i - 1] - from), Math.round(gap)]);
      }
      // What the app's markers said meanwhile, to place the gaps.
      const marks = window.__marks.filter((m) => m.t >= from && m.t <= to).map((m) => [Math.round(m.t - from), m.name, m.value]);
      return { frames: f.length, longest_gap_ms: Math.round(longest), gaps_over_200ms: long, marks };
    },
    [from, to],
  );
}

/// Screenshots the canvas into `file` and counts its distinct colours (sampled) and the
/// share of pixels that differ from the top-left one (the background).
export async function canvasStats(page, file) {
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

/// Drops `bytes` as a file named `name` on the canvas (or the element `selector` names), as
/// a user's drag-and-drop does; returns the page time of the drop.
export async function dropBytes(page, bytes, name, selector = "#allocsim_canvas") {
  return page.evaluate(
    ([b64, name, selector]) => {
      const bin = atob(b64);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      const dt = new DataTransfer();
      dt.items.add(new File([bytes], name));
      const target = document.querySelector(selector);
      const t = performance.now();
      for (const type of ["dragenter", "dragover", "drop"]) {
        target.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
      }
      return t;
    },
    [Buffer.from(bytes).toString("base64"), name, selector],
  );
}

/// Drops the file at `path` on the canvas or `selector` as a user's drag-and-drop does: the
/// page gets a `File` backed by the file on disk (set on a hidden `<input type=file>` through
/// the DevTools protocol, `DOM.setFileInputFiles`), so no copy of its bytes is made in the
/// page before the drop, as none is when a user drops it. Its name is the path's own; a
/// different `name` drops the bytes instead ([`dropBytes`]). Returns the page time of the drop.
/// Waits for the page's warm-up (`data-allocsim-warm`: web/src/lib.rs's `warm_up`) to end
/// (`done:MS`, `stopped` or `off`) and returns the marker: a user picks a file seconds after
/// the page shows its example, by which time the warm-up has ended.
export async function warmedUp(page, timeout = 60000) {
  await page.waitForFunction(() => /^(done|off|stopped)/.test(document.body.getAttribute("data-allocsim-warm") || ""), null, { timeout });
  return page.evaluate(() => document.body.getAttribute("data-allocsim-warm"));
}

/// File > Export timeline CSV… clicked where the 1400 × 900 window shows it; saves the
/// download at `path` and returns its suggested name.
export async function exportTimelineCsv(page, path, timeout) {
  const [download] = await Promise.all([
    page.waitForEvent("download", { timeout }),
    (async () => {
      await page.mouse.click(19, 12);
      await page.waitForTimeout(500);
      await page.mouse.click(80, 163);
    })(),
  ]);
  await download.saveAs(path);
  return download.suggestedFilename();
}

export async function dropFile(page, path, name, selector = "#allocsim_canvas") {
  const absolute = resolve(path);
  if (basename(absolute) !== name) return dropBytes(page, readFileSync(absolute), name, selector);
  await page.evaluate(() => {
    if (document.getElementById("__bench_drop")) return;
    const input = document.createElement("input");
    input.type = "file";
    input.id = "__bench_drop";
    input.style.display = "none";
    document.body.appendChild(input);
  });
  const input = page.locator("#__bench_drop");
  await input.setInputFiles(absolute);
  // The page is idle when a user drops a file: the frame the bench's own file input asks
  // for (its element added, its files set) is drawn and composited before the drop (on
  // a software rasterizer its composite is 60-100 ms of a core, which the open would
  // otherwise share).
  await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(done, 200)))));
  return input.evaluate((input, selector) => {
    const dt = new DataTransfer();
    dt.items.add(input.files[0]);
    const target = document.querySelector(selector);
    // The drop's place in a DevTools trace (profile.mjs --open).
    console.timeStamp("allocsim-drop");
    const t = performance.now();
    for (const type of ["dragenter", "dragover", "drop"]) {
      target.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
    }
    input.value = "";
    return t;
  }, selector);
}

/// Resident memory (MiB) of this Chromium's processes by kind, from /proc: the browser
/// process is the one started with our profile folder, the rest are its descendants (the
/// renderers: the tab's, which holds the page, its workers and their wasm memories, and
/// Chromium's own, which any tab has beside it: its top-chrome WebUI and a spare one; the
/// GPU process SwiftShader). `tab`: the biggest renderer, the tab's.
export function processMemory(profile) {
  const procs = new Map();
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      const rss = readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+) kB/);
      procs.set(Number(pid), { ppid, cmd, mib: rss ? Number(rss[1]) / 1024 : 0 });
    } catch {
      // The process ended while we looked.
    }
  }
  const root = [...procs.entries()].find(([, p]) => p.cmd.includes(profile) && !p.cmd.includes("--type="));
  const out = { renderer: 0, tab: 0, gpu: 0, browser: 0, other: 0 };
  if (!root) return out;
  const mine = new Set([root[0]]);
  for (let grew = true; grew; ) {
    grew = false;
    for (const [pid, p] of procs) {
      if (!mine.has(pid) && mine.has(p.ppid)) {
        mine.add(pid);
        grew = true;
      }
    }
  }
  for (const pid of mine) {
    const p = procs.get(pid);
    if (pid === root[0]) out.browser += p.mib;
    else if (p.cmd.includes("--type=renderer")) {
      out.renderer += p.mib;
      out.tab = Math.max(out.tab, p.mib);
    }
    else if (p.cmd.includes("--type=gpu-process")) out.gpu += p.mib;
    else out.other += p.mib;
  }
  for (const k of Object.keys(out)) out[k] = Math.round(out[k]);
  return out;
}

/// The page's JS heap from the DevTools protocol (`Performance.getMetrics`), MiB.
export async function jsHeap(session) {
  const cdp = await session.context.newCDPSession(session.page);
  await cdp.send("Performance.enable");
  const { metrics } = await cdp.send("Performance.getMetrics");
  await cdp.detach();
  const m = Object.fromEntries(metrics.map((x) => [x.name, x.value]));
  return { used_mib: Math.round(m.JSHeapUsedSize / 2 ** 20), total_mib: Math.round(m.JSHeapTotalSize / 2 ** 20) };
}

/// The page time when the frame drawn after page time `after` was on screen: the start of
/// the page's second animation frame after it (a software rasterizer holds the next frame
/// back until the browser has taken the drawn one), from the frame records.
export async function paintedAfter(page, after) {
  return page.evaluate(
    (after) =>
      new Promise((resolve) => {
        const look = () => {
          const f = window.__frames.filter((t) => t > after);
          if (f.length >= 2) resolve(f[1]);
          else setTimeout(look, 5);
        };
        look();
      }),
    after,
  );
}

/// The wasm memories of the page and of each of its workers, in MiB (`allocsimWasmBytes`,
/// set by index.html and worker.js): high-water marks, as wasm memory never shrinks.
export async function wasmMemory(page) {
  const mib = (b) => (typeof b === "number" ? Math.round(b / 1048576) : null);
  const out = { page: mib(await page.evaluate(() => self.allocsimWasmBytes?.()).catch(() => null)), workers: [] };
  for (const w of page.workers()) {
    out.workers.push(mib(await w.evaluate(() => self.allocsimWasmBytes?.()).catch(() => null)));
  }
  return out;
}

/// The heaps in the page's and each worker's wasm, in MiB: `[live, highest mark]` each
/// (`allocsimHeapBytes`, web/src/lib.rs's counting allocator).
export async function wasmHeaps(page) {
  const mib = (v) => (Array.isArray(v) ? v.map((b) => Math.round(b / 1048576)) : null);
  const out = { page: mib(await page.evaluate(() => self.allocsimHeapBytes?.()).catch(() => null)), workers: [] };
  for (const w of page.workers()) {
    out.workers.push(mib(await w.evaluate(() => self.allocsimHeapBytes?.()).catch(() => null)));
  }
  return out;
}

/// CPU seconds used so far by each thread of this Chromium's browser process, renderers
/// and GPU process
/// (utime + stime from /proc/PID/task/TID/stat), keyed `kind:thread name` (threads of one
/// name summed): taken at two times, [`cpuBetween`] says where the CPU went between them
/// (the page's main thread, the workers, the compositor, SwiftShader's threads, the
/// browser process's reading of a dropped file).
export function threadCpu(profile) {
  const tick = 100; // USER_HZ on Linux
  const procs = new Map();
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      const kind = cmd.includes("--type=renderer")
        ? "renderer"
        : cmd.includes("--type=gpu-process")
          ? "gpu"
          : cmd.includes(profile) && !cmd.includes("--type=")
            ? "browser"
            : null;
      if (kind && ownedBy(Number(pid), profile)) procs.set(pid, kind);
    } catch {
      // The process ended while we looked.
    }
  }
  const out = {};
  for (const [pid, kind] of procs) {
    let tids = [];
    try {
      tids = readdirSync(`/proc/${pid}/task`);
    } catch {
      continue;
    }
    for (const tid of tids) {
      try {
        const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
        const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
        const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        const key = `${kind}:${name}`;
        out[key] = (out[key] ?? 0) + (Number(f[11]) + Number(f[12])) / tick;
      } catch {
        // The thread ended while we looked.
      }
    }
  }
  return out;
}

/// The CPU seconds each thread kind used between two [`threadCpu`] readings, largest
/// first (those over 0.05 s).
export function cpuBetween(before, after) {
  return Object.entries(after)
    .map(([k, v]) => [k, Math.round((v - (before[k] ?? 0)) * 100) / 100])
    .filter(([, v]) => v >= 0.05)
    .sort((a, b) => b[1] - a[1]);
}

/// The renderer's resident memory by mapping (/proc/PID/smaps of the tab's biggest renderer):
/// the `top` largest writable mappings by RSS, each `{mib, size_mib}` (a wasm memory is one
/// mapping of exactly its `byteLength` between guard regions; JS `ArrayBuffer`s, V8's heap
/// and malloc's arenas are others), and the RSS of the rest.
export function rendererMappings(profile, top = 12) {
  const pid = rendererPid(profile);
  if (pid === null) return null;
  let text;
  try {
    text = readFileSync(`/proc/${pid}/smaps`, "utf8");
  } catch {
    return null;
  }
  const maps = [];
  let cur = null;
  for (const line of text.split("\n")) {
    const head = line.match(/^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$/);
    if (head) {
      cur = { size_mib: 0, mib: 0, perms: head[3], path: head[4] };
      maps.push(cur);
    } else if (cur && line.startsWith("Size:")) cur.size_mib = Number(line.match(/(\d+)/)[1]) / 1024;
    else if (cur && line.startsWith("Rss:")) cur.mib = Number(line.match(/(\d+)/)[1]) / 1024;
  }
  maps.sort((a, b) => b.mib - a.mib);
  const round = (m) => ({ mib: Math.round(m.mib), size_mib: Math.round(m.size_mib), perms: m.perms, path: m.path });
  const total = maps.reduce((s, m) => s + m.mib, 0);
  const shown = maps.slice(0, top);
  return {
    pid,
    total_mib: Math.round(total),
    top: shown.map(round),
    rest_mib: Math.round(total - shown.reduce((s, m) => s + m.mib, 0)),
  };
}

/// The pid of the tab's biggest renderer (by RSS), or null.
function rendererPid(profile) {
  let best = null;
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      if (!cmd.includes("--type=renderer")) continue;
      const rss = Number(readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+) kB/)?.[1] ?? 0);
      // Only this browser's renderers: their parent chain leads to our profile's browser.
      if (!ownedBy(Number(pid), profile)) continue;
      if (best === null || rss > best.rss) best = { pid: Number(pid), rss };
    } catch {
      // The process ended while we looked.
    }
  }
  return best?.pid ?? null;
}

function ownedBy(pid, profile) {
  for (let p = pid, hops = 0; p > 1 && hops < 8; hops++) {
    const cmd = readFileSync(`/proc/${p}/cmdline`, "utf8");
    if (cmd.includes(profile) && !cmd.includes("--type=")) return true;
    const stat = readFileSync(`/proc/${p}/stat`, "utf8");
    p = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
  }
  return false;
}

/// Samples the tab's processes' RSS every `ms` until `stop()`; `stop()` returns the peak
/// of each (renderer, GPU process) in MiB, with `at_peak`: the renderer's mappings
/// ([`rendererMappings`]) read at the renderer's highest sample (read again only when a
/// sample passes the last by 64 MiB), and `samples`: `[ms since the start, renderer MiB]`.
export function sampleMemory(profile, ms = 200) {
  const peak = { renderer: 0, tab: 0, gpu: 0, at_peak: null, samples: [] };
  const t0 = Date.now();
  let mapped = 0;
  const take = () => {
    const m = processMemory(profile);
    peak.renderer = Math.max(peak.renderer, m.renderer);
    peak.tab = Math.max(peak.tab, m.tab);
    peak.gpu = Math.max(peak.gpu, m.gpu);
    peak.samples.push([Date.now() - t0, m.renderer]);
    if (m.renderer > mapped + 64) {
      mapped = m.renderer;
      peak.at_peak = { t_ms: Date.now() - t0, ...rendererMappings(profile) };
    }
  };
  take();
  const timer = setInterval(take, ms);
  return () => {
    clearInterval(timer);
    take();
    return peak;
  };
}
