// Our web app and PyTorch's memory_viz measured side by side (scripts/test-browser.sh
// --memviz): the same headless Chromium, machine and session, runs alternating between the
// two (one cold browser a run), each given the same raw pickle (a `.pickle.gz` is
// gunzipped first: memory_viz reads raw pickles only); with `--tools ours,memviz,ours-gz`
// ours is also given the `.pickle.gz` itself in each round.
//
// Ours: web/tests/bench.mjs, one run at a time (the recorded-timeline frame, the first full
// frame, the layout at another event painted, the renderer's RSS).
// memory_viz: MemoryViz.js and d3 from web/tests/memviz/ (web/tests/memviz-setup.sh puts
// them there; without them this prints `skipped: <reason>` and measures nothing), served
// here with an import map from the cdn.skypack.dev addresses it imports to the npm files.
// Driven as a user does: the page opened, the snapshot dropped on it (its drop handler:
// FileReader, unpickle, the Active Memory Timeline), then its "Allocator State History"
// picked in the view menu, then events clicked in its list. Times are from the drop, the
// menu change or the mouse press to the page's second animation frame after the SVG is
// built (the frame that shows it on screen, as bench.mjs measures ours); memory is the
// renderer's RSS from /proc before the drop and after each step.
//
// node bench-memviz.mjs --url OUR_SITE_URL --traces DIR --out DIR [--runs 3]
//   [--trace NAME_OR_PATH,...] [--open-only NAME,...] [--clicks 5] [--timeout-s 300] [--settle-ms MS]
//   [--tools ours,memviz,ours-gz,ours-cold] [--chromium PATH]

import { createServer } from "node:http";
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { basename, dirname, extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { gunzipSync } from "node:zlib";
import { arg, launch, dropFile, processMemory, jsHeap, paintedAfter } from "./lib.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const ourUrl = arg("--url");
const traces = arg("--traces");
const out = arg("--out", "/tmp/allocsim-artifacts/memviz");
const runs = Number(arg("--runs", "3"));
const traceArgs = arg("--trace", "kvcache_decode.pickle.gz,big_gpt_long_stacks_s9.pickle.gz").split(",");
/// Traces for which ours is measured to its first full frame only (bench.mjs --open-only).
const openOnly = new Set(arg("--open-only", "").split(",").filter((x) => x));
const clicks = Number(arg("--clicks", "5"));
/// Passed to bench.mjs: milliseconds ours waits after its first full frame before its
/// memory is read (the browser's worker stacks the bands after every configuration is on
/// screen: a settle of a few seconds counts them in).
const settleMs = arg("--settle-ms", "0");
const timeoutMs = Number(arg("--timeout-s", "300")) * 1000;
const chromiumPath = arg("--chromium", "/usr/bin/chromium");
/// Which runs make a round: `ours` and `memviz` on the raw pickle, `ours-gz`, ours given
/// the `.pickle.gz` itself (what a user drops; memory_viz cannot read it) for a gzipped trace,
/// and `ours-cold`, ours on the raw pickle dropped without waiting for the page's warm-up
/// (bench.mjs --cold 1).
const tools = arg("--tools", "ours,memviz").split(",");
const memvizDir = join(here, "memviz");
const log = (msg) => console.log(msg);
const loadavg = () => readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");

if (!existsSync(join(memvizDir, "MemoryViz.js")) || !existsSync(join(memvizDir, "node_modules/d3/package.json"))) {
  log("skipped: no memory_viz in web/tests/memviz (run web/tests/memviz-setup.sh)");
  process.exit(0);
}
if ((!ourUrl && tools.includes("ours")) || !traces) {
  console.error("usage: node bench-memviz.mjs --url OUR_SITE_URL --traces DIR --out DIR [--runs N] [--trace A,B]");
  process.exit(2);
}
mkdirSync(out, { recursive: true });

// ---- memory_viz's page: MemoryViz.js, with the CDN modules it imports mapped to npm's.

/// A package's ES module entry (its `module` field), as a path under the served root.
function moduleEntry(pkgDir) {
  const pkg = JSON.parse(readFileSync(join(memvizDir, pkgDir, "package.json"), "utf8"));
  return pkg.module ? `/${pkgDir}/${pkg.module}` : null;
}

/// The import map: the five cdn.skypack.dev addresses, every installed package's bare name
/// (d3's own sources import `d3-array` etc.), and d3's nested d3-scale 2 for d3 alone (the
/// file imports d3-scale 1 by itself, as skypack serves the two).
function importMap() {
  const imports = {};
  const nm = join(memvizDir, "node_modules");
  for (const name of readdirSync(nm)) {
    const entry = existsSync(join(nm, name, "package.json")) ? moduleEntry(`node_modules/${name}`) : null;
    if (entry) imports[name] = entry;
  }
  for (const [cdn, name] of [
    ["d3@5", "d3"],
    ["d3-axis@1", "d3-axis"],
    ["d3-scale@1", "d3-scale"],
    ["d3-zoom@1", "d3-zoom"],
    ["d3-brush@1", "d3-brush"],
  ]) {
    imports[`https://cdn.skypack.dev/${cdn}`] = imports[name];
  }
  const scopes = {};
  const nested = join(nm, "d3/node_modules");
  if (existsSync(nested)) {
    scopes["/node_modules/d3/"] = {};
    for (const name of readdirSync(nested)) {
      scopes["/node_modules/d3/"][name] = moduleEntry(`node_modules/d3/node_modules/${name}`);
    }
  }
  return { imports, scopes };
}

const page = `<!DOCTYPE html>
<html>
<head><meta charset="utf-8"><title>memory_viz (offline)</title>
<script type="importmap">${JSON.stringify(importMap())}</script>
</head>
<body>
<script type="module" src="/MemoryViz.js"></script>
</body>
</html>
`;

/// Serves the page, MemoryViz.js and node_modules; d3's sources import `./bisect` without
/// the extension, so a missing path is tried with `.js` (and `/index.js`).
const server = createServer((req, res) => {
  const path = normalize(decodeURIComponent(new URL(req.url, "http://x").pathname));
  if (path === "/" || path === "/index.html") {
    res.writeHead(200, { "content-type": "text/html; charset=utf-8" }).end(page);
    return;
  }
  for (const p of [path, `${path}.js`, `${path}/index.js`]) {
    const file = join(memvizDir, p);
    if (file.startsWith(memvizDir) && existsSync(file) && statSync(file).isFile()) {
      const type = extname(file) === ".js" ? "text/javascript" : "application/octet-stream";
      res.writeHead(200, { "content-type": type }).end(readFileSync(file));
      return;
    }
  }
  res.writeHead(404).end();
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const memvizUrl = `http://127.0.0.1:${server.address().port}/`;

/// Records in the page when memory_viz's views are built: `trace` when the timeline's first
/// polygon is in the document, `state` when the state view's memory map has a block, and
/// the mouse press and the end of its handlers (a listener on `window` after d3's).
function watchMemviz() {
  window.__memviz = { trace: null, state: null, down: null, handled: null };
  new MutationObserver(() => {
    const m = window.__memviz;
    if (m.trace === null && document.querySelector("svg polygon")) m.trace = performance.now();
    if (m.state === null && document.querySelector('svg[viewBox="0 0 200 100"] rect')) m.state = performance.now();
  }).observe(document.body, { childList: true, subtree: true });
  window.addEventListener("mousedown", (e) => (window.__memviz.down = e.timeStamp), true);
  window.addEventListener("mousedown", () => (window.__memviz.handled = performance.now()));
}

const memory = async (s) => ({ ...processMemory(s.profile), js_heap: await jsHeap(s) });

async function memvizRun(file, name, i) {
  const s = await launch(chromiumPath);
  const { page } = s;
  const r = { tool: "memory_viz", load_average: loadavg() };
  let crashed = false;
  page.on("crash", () => (crashed = true));
  const external = [];
  await s.context.route("**/*", (route) => {
    const u = route.request().url();
    if (u.startsWith(memvizUrl) || u.startsWith("data:") || u.startsWith("blob:")) return route.fallback();
    external.push(u);
    return route.abort();
  });
  try {
    await page.goto(memvizUrl, { waitUntil: "load" });
    await page.waitForFunction(() => document.querySelectorAll("select").length === 3, null, { timeout: 60000 });
    await page.evaluate(watchMemviz);
    await page.waitForTimeout(300);
    r.memory_before_mib = await memory(s);

    const dropT = await dropFile(page, file, name, "body");
    await page.waitForFunction(() => window.__memviz.trace !== null, null, { timeout: timeoutMs, polling: 50 });
    const built = await page.evaluate(() => window.__memviz.trace);
    r.open_to_first_render_ms = Math.round((await paintedAfter(page, built)) - dropT);
    r.open_to_built_ms = Math.round(built - dropT);
    r.timeline_polygons = await page.evaluate(() => document.querySelectorAll("svg polygon").length);
    await page.waitForTimeout(500);
    r.memory_after_open_mib = await memory(s);
    await page.screenshot({ path: join(out, `memviz-${name}-${i}-opened.png`) });

    // Its "Allocator State History": picked in the second menu, as a user does.
    const viewT = await page.evaluate(() => {
      const menu = document.querySelectorAll("select")[1];
      const t = performance.now();
      setTimeout(() => {
        menu.value = "Allocator State History";
        menu.dispatchEvent(new Event("change"));
      }, 0);
      return t;
    });
    await page.waitForFunction(() => window.__memviz.state !== null, null, { timeout: timeoutMs, polling: 50 });
    const stateBuilt = await page.evaluate(() => window.__memviz.state);
    r.state_view_ms = Math.round((await paintedAfter(page, stateBuilt)) - viewT);
    r.state_view_events = await page.evaluate(
      () => document.querySelector('div[style*="font-family: monospace"]').children.length,
    );
    await page.waitForTimeout(500);
    r.memory_after_state_view_mib = await memory(s);
    await page.screenshot({ path: join(out, `memviz-${name}-${i}-state.png`) });

    // Events clicked in its list, spread over the trace (an event's map is replayed back from
    // the end state, so an early one costs more).
    r.clicks = [];
    for (let k = 0; k < clicks; k++) {
      const idx = Math.floor(((k + 0.5) / clicks) * r.state_view_events);
      const box = await page.evaluate((idx) => {
        const el = document.querySelector('div[style*="font-family: monospace"]').children[idx];
        el.scrollIntoView({ block: "center" });
        const b = el.getBoundingClientRect();
        return { x: b.left + 30, y: b.top + b.height / 2 };
      }, idx);
      await page.mouse.move(box.x, box.y);
      await page.waitForTimeout(300);
      await page.evaluate(() => {
        window.__memviz.down = null;
        window.__memviz.handled = null;
      });
      await page.mouse.down();
      await page.mouse.up();
      await page.waitForFunction(() => window.__memviz.handled !== null, null, { timeout: timeoutMs, polling: 20 });
      const { down, handled } = await page.evaluate(() => window.__memviz);
      const painted = await paintedAfter(page, handled);
      const selected = await page.evaluate(
        (idx) =>
          (document.querySelector('div[style*="font-family: monospace"]').children[idx].getAttribute("style") || "").includes(
            "background-color",
          ),
        idx,
      );
      if (!selected) throw new Error(`clicking event ${idx} did not select it`);
      r.clicks.push({ event: idx, built_ms: Math.round(handled - down), painted_ms: Math.round(painted - down) });
    }
    await page.waitForTimeout(500);
    r.memory_after_clicks_mib = await memory(s);
  } catch (e) {
    r.did_not_finish = crashed ? "the tab crashed" : String(e.message || e).split("\n")[0];
  }
  if (external.length > 0) r.did_not_finish = `a request left the machine: ${external[0]}`;
  r.console_errors = s.errors;
  await s.close().catch(() => {});
  return r;
}

function oursRun(dir, name, i, cold = false) {
  const runOut = join(out, `ours${cold ? "-cold" : ""}-${name}-${i}`);
  mkdirSync(runOut, { recursive: true });
  const args = [join(here, "bench.mjs"), "--url", ourUrl, "--traces", dir, "--trace", name, "--runs", "1", "--out", runOut];
  if (openOnly.has(name)) args.push("--open-only", "1");
  if (settleMs !== "0") args.push("--settle-ms", settleMs);
  if (cold) args.push("--cold", "1");
  args.push("--chromium", chromiumPath);
  const p = spawnSync("node", args, { encoding: "utf8", timeout: 30 * 60 * 1000 });
  if (p.status !== 0) return { tool: "allocsim", did_not_finish: `bench.mjs exited ${p.status}: ${(p.stderr || p.stdout).slice(-400)}` };
  const { runs } = JSON.parse(readFileSync(join(runOut, "bench-results.json"), "utf8"));
  return { tool: "allocsim", ...runs[0] };
}

/// The raw pickle both tools are given: the file itself, or it gunzipped into `out`.
function rawPickle(t) {
  const src = t.includes("/") ? t : join(traces, t);
  if (!src.endsWith(".gz")) return { dir: dirname(src), name: basename(src), bytes: statSync(src).size };
  const name = basename(src, ".gz");
  const bytes = gunzipSync(readFileSync(src));
  const dir = join(out, "pickles");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, name), bytes);
  return { dir, name, bytes: bytes.length };
}

const sorted = (xs) => xs.filter((x) => typeof x === "number").sort((a, b) => a - b);
const median = (xs) => sorted(xs)[sorted(xs).length >> 1] ?? null;
const minOf = (xs) => sorted(xs)[0] ?? null;
const range = (xs) => (sorted(xs).length ? [sorted(xs)[0], sorted(xs).at(-1)] : null);
const grow = (r, after) => (r[after] && r.memory_before_mib ? r[after].renderer - r.memory_before_mib.renderer : null);

const results = [];
for (const t of traceArgs) {
  const { dir, name, bytes } = rawPickle(t);
  const file = join(dir, name);
  const gz = t.endsWith(".gz") ? (t.includes("/") ? t : join(traces, t)) : null;
  const ours = [];
  const oursGz = [];
  const oursCold = [];
  const theirs = [];
  for (let i = 1; i <= runs; i++) {
    // Alternating, and each tool first in every other round.
    const order = i % 2 === 1 ? ["ours", "memviz", "ours-gz", "ours-cold"] : ["ours-cold", "ours-gz", "memviz", "ours"];
    for (const who of order.filter((w) => tools.includes(w) && (w !== "ours-gz" || gz))) {
      if (who.startsWith("ours")) {
        const r = who === "ours-gz" ? oursRun(dirname(gz), basename(gz), i) : oursRun(dir, name, i, who === "ours-cold");
        ({ ours, "ours-gz": oursGz, "ours-cold": oursCold })[who].push(r);
        log(
          `${name} run ${i} ${who} (load ${r.load_average}): recorded ${r.open_to_recorded_frame_ms} ms, full ${r.open_to_first_full_frame_ms} ms, every configuration ${r.open_to_every_configuration_ms} ms, ` +
            `layout painted median ${median((r.layout || []).map((l) => l.painted_ms))} ms, renderer RSS ` +
            `${r.memory_before_mib?.renderer} → ${r.memory_after_open_mib?.renderer} MiB${r.did_not_finish ? "; DID NOT FINISH: " + r.did_not_finish : ""}`,
        );
      } else {
        const r = await memvizRun(file, name, i);
        theirs.push(r);
        log(
          `${name} run ${i} memory_viz (load ${r.load_average}): first render ${r.open_to_first_render_ms} ms, state view ${r.state_view_ms} ms, ` +
            `clicks painted ${(r.clicks || []).map((c) => c.painted_ms).join("/")} ms, renderer RSS ${r.memory_before_mib?.renderer} → ` +
            `${r.memory_after_open_mib?.renderer} → ${r.memory_after_state_view_mib?.renderer} MiB` +
            `${r.did_not_finish ? "; DID NOT FINISH: " + r.did_not_finish : ""}`,
        );
      }
    }
  }
  const oursSummary = (rs) => ({
    recorded_frame_ms_min: minOf(rs.map((r) => r.open_to_recorded_frame_ms)),
    recorded_frame_ms_all: rs.map((r) => r.open_to_recorded_frame_ms ?? null),
    first_full_frame_ms_min: minOf(rs.map((r) => r.open_to_first_full_frame_ms)),
    first_full_frame_ms_all: rs.map((r) => r.open_to_first_full_frame_ms ?? null),
    every_configuration_ms_min: minOf(rs.map((r) => r.open_to_every_configuration_ms)),
    every_configuration_ms_all: rs.map((r) => r.open_to_every_configuration_ms ?? null),
    layout_painted_ms_median: median(rs.flatMap((r) => (r.layout || []).map((l) => l.painted_ms))),
    layout_built_ms_median: median(rs.flatMap((r) => (r.layout || []).map((l) => l.ms))),
    renderer_rss_growth_open_mib: range(rs.map((r) => grow(r, "memory_after_open_mib"))),
    did_not_finish: rs.map((r) => r.did_not_finish).filter((x) => x),
  });
  const summary = {
    trace: name,
    pickle_bytes: bytes,
    runs,
    load_average_during: [...ours, ...oursGz, ...oursCold, ...theirs].map((r) => r.load_average).filter((x) => x),
    ours: oursSummary(ours),
    ours_gz: oursGz.length ? oursSummary(oursGz) : null,
    ours_cold: oursCold.length ? oursSummary(oursCold) : null,
    memory_viz: {
      first_render_ms_min: minOf(theirs.map((r) => r.open_to_first_render_ms)),
      first_render_ms_all: theirs.map((r) => r.open_to_first_render_ms ?? null),
      state_view_ms_min: minOf(theirs.map((r) => r.state_view_ms)),
      state_view_ms_all: theirs.map((r) => r.state_view_ms ?? null),
      click_painted_ms_median: median(theirs.flatMap((r) => (r.clicks || []).map((c) => c.painted_ms))),
      click_painted_ms_min: minOf(theirs.flatMap((r) => (r.clicks || []).map((c) => c.painted_ms))),
      click_built_ms_median: median(theirs.flatMap((r) => (r.clicks || []).map((c) => c.built_ms))),
      renderer_rss_growth_open_mib: range(theirs.map((r) => grow(r, "memory_after_open_mib"))),
      renderer_rss_growth_state_view_mib: range(theirs.map((r) => grow(r, "memory_after_state_view_mib"))),
      did_not_finish: theirs.map((r) => r.did_not_finish).filter((x) => x),
    },
  };
  results.push({ summary, ours, ours_gz: oursGz, ours_cold: oursCold, memory_viz: theirs });
  log(JSON.stringify(summary, null, 2));
  writeFileSync(join(out, "memviz-results.json"), JSON.stringify(results, null, 2) + "\n");
}
server.close();
log(`figures in ${join(out, "memviz-results.json")}`);
