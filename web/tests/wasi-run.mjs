// Runs a wasm32-wasip1 program under node's WASI with the host's / mapped (the wasm-only
// sweep bench: core/examples/sweep_bench.rs). `node web/tests/wasi-run.mjs PROG.wasm ARGS…`
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv, env, exit } from 'node:process';

const [prog, ...args] = argv.slice(2);
if (!prog) {
  console.error('usage: node wasi-run.mjs PROG.wasm [ARGS...]');
  exit(2);
}
const wasi = new WASI({ version: 'preview1', args: [prog, ...args], env, preopens: { '/': '/' } });
const module = await WebAssembly.compile(await readFile(prog));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
exit(wasi.start(instance));
