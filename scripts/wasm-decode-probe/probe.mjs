// node probe.mjs WASM FILE [open]: the streamed decode in wasm over FILE (pickle, gzip or
// JSON; 4 MiB pieces, two passes as the browser worker feeds it, or more where the decode
// asks: TWO_PASS=1 decodes a plain pickle in two passes whatever its size); prints the entries
// decoded, the wasm memory's size after it (its peak: wasm memory never shrinks) and the
// seconds. With `open`, then the engine worker's open after the decode, stage by stage
// (`open()` in src/lib.rs): one JSON line per stage with the bytes live after it, their
// highest mark during it, the wasm memory's size after it (the high-water) and the size
// of the message it emitted, and the milliseconds since the stage before (`ms`); before
// each message's line, the milliseconds to encode it as the worker posts it and to decode
// it as the page takes it (`encode_ms`, `decode_ms`, not counted in the stage's `ms`).
// Build: cargo build --release --target wasm32-unknown-unknown (in this directory); the
// module is target/wasm32-unknown-unknown/release/wasm_decode_probe.wasm.
import fs from 'node:fs';
const [wasmPath, file, then] = process.argv.slice(2);
const { instance } = await WebAssembly.instantiate(fs.readFileSync(wasmPath), { env: { now_ms: () => performance.now() } });
const x = instance.exports;
const total = fs.statSync(file).size;
const PIECE = 4 << 20;
const t0 = performance.now();
if (process.env.TWO_PASS) x.start_two_pass(total); else x.start(total);
let r = 0;
const passes = [];
let tPass = t0;
for (let pass = 0; pass < 4 && r !== 2; pass++) {
  const fd = fs.openSync(file, 'r');
  const tmp = Buffer.alloc(PIECE);
  for (;;) {
    const n = fs.readSync(fd, tmp, 0, PIECE, null);
    if (n === 0) break;
    const p = x.buf(n);
    new Uint8Array(x.memory.buffer, p, n).set(tmp.subarray(0, n));
    if (x.feed(n) !== 0) { console.log('feed error'); process.exit(1); }
  }
  fs.closeSync(fd);
  const fed = performance.now();
  r = x.end();
  passes.push({ pass: pass + 1, fed_ms: +(fed - tPass).toFixed(1), end_ms: +(performance.now() - fed).toFixed(1) });
  tPass = performance.now();
  if (r < 0) { console.log('decode error'); process.exit(1); }
}
console.log(JSON.stringify({ file, entries: x.entries(), wasm_memory_mib: +(x.memory.buffer.byteLength / 1048576).toFixed(1), seconds: +((performance.now() - t0) / 1000).toFixed(2), passes }));
if (then === 'open') {
  x.open();
  const report = new TextDecoder().decode(new Uint8Array(x.memory.buffer, x.report_ptr(), x.report_len()));
  process.stdout.write(report);
  console.log(JSON.stringify({ seconds: +((performance.now() - t0) / 1000).toFixed(2) }));
}
