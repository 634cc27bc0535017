// node open.mjs WASM FILE: the streamed decode in wasm (as probe.mjs), then the engine
// worker's open after it, stage by stage (`open()` in src/lib.rs): one JSON line per stage
// with the bytes live after it, their highest mark during it, the wasm memory's size after
// it (the high-water: wasm memory never shrinks) and the message it emitted.
import fs from 'node:fs';
const [wasmPath, file] = process.argv.slice(2);
const { instance } = await WebAssembly.instantiate(fs.readFileSync(wasmPath), {});
const x = instance.exports;
const total = fs.statSync(file).size;
const PIECE = 4 << 20;
const t0 = performance.now();
x.start(total);
let r = 0;
for (let pass = 0; pass < 2 && r !== 2; pass++) {
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
  r = x.end();
  if (r < 0) { console.log('decode error'); process.exit(1); }
}
console.log(JSON.stringify({ file, entries: x.entries(), seconds: +((performance.now() - t0) / 1000).toFixed(2) }));
x.open();
const report = new TextDecoder().decode(new Uint8Array(x.memory.buffer, x.report_ptr(), x.report_len()));
process.stdout.write(report);
console.log(JSON.stringify({ seconds: +((performance.now() - t0) / 1000).toFixed(2) }));
