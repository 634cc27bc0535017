// `allocsim serve FILE` in headless Chromium (scripts/test-python.sh): the page opened at
// the printed address — the bare `/`, as a user types it — shows FILE: the server's
// redirect to `?trace=/trace/NAME`, the app's fetch of it, its first full frame of that
// trace, a canvas that is not blank, no request leaving the server, no console error.
//
// node serve.mjs --url http://127.0.0.1:PORT/ --name NAME --out DIR [--chromium PATH]

import { writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { arg, launch, waitFrame, canvasStats } from "./lib.mjs";

const url = arg("--url");
const name = arg("--name");
const out = arg("--out", "/tmp/allocsim-artifacts");
const chromiumPath = arg("--chromium", "/usr/bin/chromium");
if (!url || !name) {
  console.error("usage: node serve.mjs --url URL --name NAME --out DIR [--chromium PATH]");
  process.exit(2);
}
mkdirSync(out, { recursive: true });
const origin = new URL(url).origin;
const failures = [];
const fail = (msg) => {
  console.error("FAIL: " + msg);
  failures.push(msg);
};

const s = await launch(chromiumPath);
const external = [];
await s.context.route("**/*", (route) => {
  const u = route.request().url();
  if (u.startsWith(origin + "/") || u.startsWith("data:") || u.startsWith("blob:")) return route.fallback();
  external.push(u);
  return route.abort();
});
try {
  const t0 = Date.now();
  await s.page.goto(url, { waitUntil: "load" });
  await waitFrame(s.page, `ready:${name}`);
  const opened = Date.now() - t0;
  const where = new URL(s.page.url());
  if (where.searchParams.get("trace") !== `/trace/${name}`) fail(`the page is at ${s.page.url()}, not ?trace=/trace/${name}`);
  const stats = await canvasStats(s.page, join(out, "serve.png"));
  if (stats.colours < 20 || stats.differing < 0.05) fail(`the canvas looks blank with ${name} open`);
  console.log(`served page: ${await s.page.evaluate(() => document.body.getAttribute("data-allocsim-frame"))} in ${opened} ms`);
} catch (e) {
  fail(String(e && e.stack ? e.stack : e));
  await s.page.screenshot({ path: join(out, "serve-failure.png") }).catch(() => {});
}
for (const u of external) fail(`a request left the local server: ${u}`);
for (const e of s.errors) fail("console error: " + e);
writeFileSync(join(out, "serve-console.log"), s.console.join("\n") + "\n");
await s.close();
if (failures.length > 0) {
  console.error(`serve test: ${failures.length} failure(s); artifacts in ${out}`);
  process.exit(1);
}
console.log(`serve test: ok (screenshot ${join(out, "serve.png")})`);
