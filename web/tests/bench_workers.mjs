// The README's figures for the browser's workers (scripts/test-browser.sh --bench-workers),
// in Debian's headless Chromium, each run a fresh browser:
//
// - `recommend` in the browser: a snapshot opened by `?trace=` under `?capacity=` (a cap its
//   PyTorch defaults overrun, so "What would fit?" starts by itself) — the time from the
//   panel showing the sweep running to its trade-off table (the search worker starting,
//   decoding and validating the snapshot, then the sweep) — against CPython's
//   `pickle.loads` of the same snapshot's bytes (gunzip not counted), timed in the same run;
//   with `--allocsim BIN`, the CLI's `recommend --capacity` of the same file too.
// - a set of ranks (N copies of one snapshot dropped at once) replayed by the pool of
//   workers (`?workers=K` for each K of --workers) — drop to the Ranks table.
//
// node bench_workers.mjs --url URL --traces DIR --out DIR [--trace NAME] [--capacity SIZE]
//   [--extra PATH] [--extra-capacity SIZE] [--ranks N] [--workers 1,2] [--runs N]
//   [--allocsim BIN] [--chromium PATH] [--sweep-workers 1,2]
//
// --sweep-workers K,…: What would fit? with `?workers=K` (the search workers its replays
// run on) for each K, alternately within each run (same load for each); default: the
// page's own pool (navigator.hardwareConcurrency, at least 2).

import { writeFileSync, mkdirSync, readFileSync, readdirSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { join, basename, dirname } from "node:path";
import { arg, launch, waitFrame, markTime, threadCpu, cpuBetween } from "./lib.mjs";

const url = arg("--url");
const traces = arg("--traces");
const out = arg("--out", "/tmp/allocsim-artifacts");
const trace = arg("--trace", "big_gpt_long_stacks_s9.pickle.gz");
const capacity = arg("--capacity", "4.6GiB");
/// Another snapshot (any path) for the recommend figure, e.g. the 1 M-event kvcache pickle.
const extra = arg("--extra");
const extraCapacity = arg("--extra-capacity", capacity);
const nRanks = Number(arg("--ranks", "8"));
const poolSizes = arg("--workers", "1,2").split(",").map(Number);
const runs = Number(arg("--runs", "3"));
const sweepPools = (arg("--sweep-workers", "") || "").split(",").filter(Boolean).map(Number);
const allocsim = arg("--allocsim");
const chromiumPath = arg("--chromium", "/usr/bin/chromium");
mkdirSync(out, { recursive: true });
const log = (msg) => console.log(msg);
const loadavg = () => readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");

/// CPU seconds (user + system) the browser has used so far: every process under the one
/// started with `profile` (the renderer's page and workers, the GPU process). A figure
/// the machine's load inflates far less than wall time.
function browserCpu(profile) {
  const info = new Map();
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, "utf8");
      const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      const cmd = readFileSync(`/proc/${d}/cmdline`, "utf8");
      info.set(Number(d), { ppid: Number(f[1]), ticks: Number(f[11]) + Number(f[12]), cmd });
    } catch {
      // gone meanwhile
    }
  }
  const tree = new Set([...info].filter(([, v]) => v.cmd.includes(profile)).map(([pid]) => pid));
  for (let grew = true; grew; ) {
    grew = false;
    for (const [pid, v] of info) {
      if (!tree.has(pid) && tree.has(v.ppid)) {
        tree.add(pid);
        grew = true;
      }
    }
  }
  let ticks = 0;
  for (const pid of tree) ticks += info.get(pid).ticks;
  return ticks / 100; // USER_HZ
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/// CPython's `pickle.loads` of the snapshot's bytes, best of 3 (seconds).
function pickleLoads(path) {
  const py = `
import gzip, pickle, sys, time
raw = open(sys.argv[1], "rb").read()
if raw[:2] == b"\\x1f\\x8b":
    raw = gzip.decompress(raw)
best = min((lambda t: (pickle.loads(raw), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(3))
cpu = min((lambda t: (pickle.loads(raw), time.process_time() - t)[1])(time.process_time()) for _ in range(3))
print(best, cpu)`;
  const [wall, cpu] = execFileSync("python3", ["-c", py, path], { encoding: "utf8" }).trim().split(" ").map(Number);
  pickleCpu.set(path, cpu);
  return wall;
}
/// `pickle.loads`' CPU seconds (best of 3) by path.
const pickleCpu = new Map();

/// The CPU seconds (user + system, every thread) of the CLI's `recommend --capacity`.
function cliCpu(path, cap) {
  const py = `
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime)`;
  return Number(execFileSync("python3", ["-c", py, allocsim, "recommend", "--capacity", cap, path], { encoding: "utf8" }).trim());
}

/// The CLI's `recommend --capacity` of the same file, best of 3 (seconds).
function cliRecommend(path, cap) {
  let best = Infinity;
  for (let i = 0; i < 3; i++) {
    const t = process.hrtime.bigint();
    execFileSync(allocsim, ["recommend", "--capacity", cap, path], { stdio: "ignore" });
    best = Math.min(best, Number(process.hrtime.bigint() - t) / 1e9);
  }
  return best;
}

/// One browser: `name` (served from `dir`) opened under `cap`; the sweep's time (ms).
async function recommendOnce(dir, name, cap, workers) {
  const s = await launch(chromiumPath);
  const { page, context } = s;
  await context.route(`${new URL(url).origin}/bench-traces/*`, (route) =>
    route.fulfill({ status: 200, contentType: "application/octet-stream", body: readFileSync(join(dir, name)) }),
  );
  const r = { load_average: loadavg() };
  const pool = workers ? `&workers=${workers}` : "";
  r.workers = workers || "default";
  await page.goto(`${url}?trace=${encodeURIComponent(`${new URL(url).origin}/bench-traces/${name}`)}&capacity=${cap}${pool}`, {
    waitUntil: "load",
  });
  await waitFrame(page, `ready:${name}`, 600000);
  // The browser's CPU time from the sweep shown running to its table (sampled here, every
  // 20 ms of polling).
  const search = () => page.evaluate(() => document.body.getAttribute("data-allocsim-search"));
  let cpuStart = null;
  let threadsStart = null;
  for (let t = 0; t < 600000 && !["done", "failed"].includes(await search()); t += 20) {
    if (cpuStart === null && (await search()) === "running") {
      cpuStart = browserCpu(s.profile);
      threadsStart = threadCpu(s.profile);
    }
    await sleep(20);
  }
  if (cpuStart !== null) r.cpu_s = Number((browserCpu(s.profile) - cpuStart).toFixed(2));
  // Where that CPU went: the page's thread, the workers (the engine's and the search
  // workers: one name), SwiftShader's and the compositor's threads.
  if (threadsStart !== null) r.cpu_by_thread = cpuBetween(threadsStart, threadCpu(s.profile));
  const state = await page.evaluate(() => document.body.getAttribute("data-allocsim-search"));
  if (state !== "done") throw new Error(`What would fit? on ${name} ended ${state}`);
  const running = await markTime(page, "data-allocsim-search", 0, "v === 'running'");
  const done = await markTime(page, "data-allocsim-search", running, "v === 'done'");
  r.sweep_ms = Math.round(done - running);
  // The frames the app drew while the sweep ran (the first WebGL call after each animation
  // frame, lib.mjs), and the gaps between them (ms).
  const paints = await page.evaluate(([a, b]) => window.__paints.filter((t) => t > a && t <= b), [running, done]);
  r.frames = paints.length;
  r.frame_gaps_ms = paints.slice(1).map((t, i) => Math.round(t - paints[i]));
  // What asked for each frame the sweep's panel drew (`data-allocsim-repaint`), counted.
  const causes = await page.evaluate(
    ([a, b]) => window.__marks.filter((m) => m.name === "data-allocsim-repaint" && m.t > a && m.t <= b).map((m) => m.value),
    [running, done],
  );
  r.repaint_causes = {};
  for (const c of causes) {
    // Each cause once (every answer woke it: one cause per answer), egui's files by crate.
    const each = c.replace(/^\d+ ?/, "").split("; ").map((x) => x.trim().replace(/^.*\/(egui-[^/]+\/)/, "$1"));
    const what = [...new Set(each)].filter(Boolean).join(" + ") || "(none)";
    r.repaint_causes[what] = (r.repaint_causes[what] ?? 0) + 1;
  }
  // The first search worker read the trace and sent its sizes: the replays start.
  const planned = await markTime(page, "data-allocsim-search-workers", running, "/planned=1/.test(v)");
  r.read_ms = planned === null ? null : Math.round(planned - running);
  r.search_workers = await page.evaluate(() => document.body.getAttribute("data-allocsim-search-workers"));
  // The search workers' counts as they changed, from the page's start to the table (ms
  // after "running"; negative: before it): when the pool started, the trace was shared, the
  // plan came.
  r.worker_marks = await page.evaluate(
    ([a, b]) =>
      window.__marks
        .filter((m) => m.name === "data-allocsim-search-workers" && m.t <= b)
        .map((m) => [Math.round(m.t - a), m.value.replace(/ terminated=\d+| sweep=\d+/g, "")]),
    [running, done],
  );
  r.load_average_after = loadavg();
  await s.close();
  return r;
}

/// One browser: `n` copies of the trace dropped at once as ranks, replayed by a pool of
/// `workers`; drop to the Ranks table (ms).
async function ranksOnce(workers, n) {
  const s = await launch(chromiumPath);
  const { page } = s;
  const r = { workers, load_average: loadavg() };
  await page.goto(`${url}?workers=${workers}`, { waitUntil: "load" });
  await waitFrame(page, "ready:oom_story");
  const b64 = readFileSync(join(traces, trace)).toString("base64");
  const t0 = await page.evaluate(
    ([b64, n]) => {
      const bin = atob(b64);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      const dt = new DataTransfer();
      for (let i = 0; i < n; i++) dt.items.add(new File([bytes], `copy_rank${i}.pickle.gz`));
      const canvas = document.getElementById("allocsim_canvas");
      const t = performance.now();
      for (const type of ["dragenter", "dragover", "drop"]) {
        canvas.dispatchEvent(new DragEvent(type, { dataTransfer: dt, bubbles: true, cancelable: true }));
      }
      return t;
    },
    [b64, n],
  );
  await waitFrame(page, `ranks:${n}:`, 900000);
  const t1 = await markTime(page, "data-allocsim-frame", t0, `v.startsWith('ranks:${n}:')`);
  r.drop_to_table_ms = Math.round(t1 - t0);
  r.rank_workers = Number(await page.evaluate(() => document.body.getAttribute("data-allocsim-rank-workers")));
  r.load_average_after = loadavg();
  await s.close();
  return r;
}

const results = { url, trace, capacity, started: new Date().toISOString() };
const targets = [[traces, trace, capacity]];
if (extra) targets.push([dirname(extra), basename(extra), extraCapacity]);
results.recommend = [];
for (const [dir, name, cap] of targets) {
  const path = join(dir, name);
  const row = { trace: name, capacity: cap, runs: [] };
  row.pickle_loads_s = pickleLoads(path);
  row.pickle_loads_cpu_s = pickleCpu.get(path);
  log(`${name}: CPython pickle.loads ${row.pickle_loads_s.toFixed(3)} s, ${row.pickle_loads_cpu_s.toFixed(3)} CPU s (best of 3; load ${loadavg()})`);
  if (allocsim) {
    row.cli_recommend_s = cliRecommend(path, cap);
    row.cli_recommend_cpu_s = cliCpu(path, cap);
    log(`${name}: allocsim recommend --capacity ${cap} ${row.cli_recommend_s.toFixed(3)} s (best of 3), ${row.cli_recommend_cpu_s.toFixed(2)} CPU s`);
  }
  for (let i = 0; i < runs; i++) {
    for (const k of sweepPools.length > 0 ? sweepPools : [null]) {
      const r = await recommendOnce(dir, name, cap, k);
      row.runs.push(r);
      log(`${name} under ${cap}, ?workers=${r.workers}, run ${i + 1}: What would fit? ${r.sweep_ms} ms in the browser, of which ${r.read_ms} ms before the replays (the search workers reading the trace), ${r.cpu_s} CPU s in the browser, search workers ${r.search_workers}, ${r.frames} frames drawn (gaps ${JSON.stringify(r.frame_gaps_ms)} ms; asked by ${JSON.stringify(r.repaint_causes)}), CPU s by thread ${JSON.stringify(r.cpu_by_thread)}, search workers' counts ${JSON.stringify(r.worker_marks)} (load ${r.load_average} → ${r.load_average_after})`);
    }
  }
  row.best_by_workers = {};
  for (const r of row.runs) row.best_by_workers[r.workers] = Math.min(row.best_by_workers[r.workers] ?? Infinity, r.sweep_ms);
  if (sweepPools.length > 1) log(`${name}: best by search workers ${JSON.stringify(row.best_by_workers)} ms`);
  row.best_cpu_by_workers = {};
  for (const r of row.runs) row.best_cpu_by_workers[r.workers] = Math.min(row.best_cpu_by_workers[r.workers] ?? Infinity, r.cpu_s ?? Infinity);
  log(`${name}: the browser's CPU s by search workers ${JSON.stringify(row.best_cpu_by_workers)} (pickle.loads ${row.pickle_loads_cpu_s.toFixed(3)} CPU s)`);
  row.best_sweep_ms = Math.min(...row.runs.map((r) => r.sweep_ms));
  row.ratio_to_pickle_loads = row.best_sweep_ms / 1000 / row.pickle_loads_s;
  log(`${name}: best ${row.best_sweep_ms} ms = ${row.ratio_to_pickle_loads.toFixed(2)} × pickle.loads (target ≤ 5×)`);
  results.recommend.push(row);
}

results.ranks = [];
if (nRanks > 0) {
  for (const k of poolSizes) {
    const row = { workers: k, ranks: nRanks, runs: [] };
    for (let i = 0; i < runs; i++) {
      const r = await ranksOnce(k, nRanks);
      row.runs.push(r);
      log(`${nRanks} ranks of ${trace}, ?workers=${k}, run ${i + 1}: ${r.drop_to_table_ms} ms, ${r.rank_workers} workers answered (load ${r.load_average} → ${r.load_average_after})`);
    }
    row.best_ms = Math.min(...row.runs.map((r) => r.drop_to_table_ms));
    results.ranks.push(row);
  }
  log(`ranks: ${results.ranks.map((r) => `${r.workers} worker(s) ${r.best_ms} ms`).join(", ")}`);
}
writeFileSync(join(out, "bench-workers.json"), JSON.stringify(results, null, 2) + "\n");
log(`figures in ${join(out, "bench-workers.json")}`);
