// The floor of bench.mjs's "painted" measure, and what one full-canvas pass costs on the
// software rasterizer (a development tool, not a test): a bare 1400 × 900 WebGL2 canvas
// (no egui, no wgpu) redrawn on each key — cleared, then PASSES copies of MODE over the
// whole canvas: `clear` (nothing more), `blit` (a y-flipped blitFramebuffer from a texture,
// what wgpu's WebGL backend does at every present), `blitnf` (the same, not flipped),
// `quad` (a textured full-canvas triangle), `alpha` (the same, blended). Prints the median
// key → drawn ("built") and key → the page's second animation frame after it ("painted",
// as bench.mjs measures a layout). A pass costs (painted(MODE, N) − painted(clear, 1)) / N.
//
// node canvas-floor.mjs [MODE] [PASSES] [--keys N] [--chromium PATH]

import { arg, launch, paintedAfter } from "./lib.mjs";

const W = 1400, H = 900;
const positional = process.argv.slice(2).filter((a, i, all) => !a.startsWith("--") && !(all[i - 1] ?? "").startsWith("--"));
const mode = positional[0] ?? "clear", K = Number(positional[1] ?? 1);
const keys = Number(arg("--keys", "12"));
const s = await launch(arg("--chromium", "/usr/bin/chromium"), { width: W, height: H });
const { page } = s;
await page.setContent(`<html><body style="margin:0"><canvas id=c width=${W} height=${H} style="width:${W}px;height:${H}px"></canvas><script>
// setContent runs no init script: the frame records here.
window.__frames=[]; const tick=(t)=>{window.__frames.push(t); requestAnimationFrame(tick)}; requestAnimationFrame(tick);
const gl = document.getElementById('c').getContext('webgl2', {antialias:false});
const tex = gl.createTexture(); gl.bindTexture(gl.TEXTURE_2D, tex); gl.texStorage2D(gl.TEXTURE_2D, 1, gl.RGBA8, ${W}, ${H});
gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MIN_FILTER, gl.NEAREST); gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MAG_FILTER, gl.NEAREST);
const fb = gl.createFramebuffer(); gl.bindFramebuffer(gl.FRAMEBUFFER, fb); gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, tex, 0);
gl.clearColor(0.2,0.5,0.3,1); gl.clear(gl.COLOR_BUFFER_BIT); gl.bindFramebuffer(gl.FRAMEBUFFER, null);
const sh=(t,src)=>{const x=gl.createShader(t); gl.shaderSource(x,src); gl.compileShader(x); return x};
const p=gl.createProgram(); gl.attachShader(p, sh(gl.VERTEX_SHADER, '#version 300 es\\nout vec2 uv; void main(){ vec2 q=vec2(float((gl_VertexID<<1)&2), float(gl_VertexID&2)); uv=q; gl_Position=vec4(q*2.0-1.0,0,1);}'));
gl.attachShader(p, sh(gl.FRAGMENT_SHADER, '#version 300 es\\nprecision mediump float; in vec2 uv; uniform sampler2D t; out vec4 o; void main(){ o = texture(t, uv) * 0.9; }'));
gl.linkProgram(p);
let n=0; window.__drawn=[];
function draw(){ n++; gl.bindFramebuffer(gl.FRAMEBUFFER, null); gl.clearColor((n%7)/7,0.3,0.4,1); gl.clear(gl.COLOR_BUFFER_BIT);
  for (let k=0;k<${K};k++){
    if ('${mode}'==='blit'){ gl.bindFramebuffer(gl.READ_FRAMEBUFFER, fb); gl.bindFramebuffer(gl.DRAW_FRAMEBUFFER, null); gl.blitFramebuffer(0,${H},${W},0,0,0,${W},${H},gl.COLOR_BUFFER_BIT,gl.NEAREST); }
    if ('${mode}'==='blitnf'){ gl.bindFramebuffer(gl.READ_FRAMEBUFFER, fb); gl.bindFramebuffer(gl.DRAW_FRAMEBUFFER, null); gl.blitFramebuffer(0,0,${W},${H},0,0,${W},${H},gl.COLOR_BUFFER_BIT,gl.NEAREST); }
    if ('${mode}'==='clearfb'){ gl.bindFramebuffer(gl.FRAMEBUFFER, fb); gl.clear(gl.COLOR_BUFFER_BIT); gl.bindFramebuffer(gl.FRAMEBUFFER, null); }
    if ('${mode}'==='quad' || '${mode}'==='alpha'){ gl.useProgram(p); gl.bindTexture(gl.TEXTURE_2D, tex); if('${mode}'==='alpha'){gl.enable(gl.BLEND); gl.blendFunc(gl.ONE, gl.ONE_MINUS_SRC_ALPHA);} gl.drawArrays(gl.TRIANGLES,0,3); gl.disable(gl.BLEND);}
  }
  window.__drawn.push(performance.now()); }
document.addEventListener('keydown', () => requestAnimationFrame(draw));
</script></body></html>`);
await page.waitForTimeout(800);
const res = [];
for (let i = 0; i < keys; i++) {
  const t = await page.evaluate(() => performance.now());
  await page.keyboard.press("ArrowRight");
  await page.waitForFunction((n) => window.__drawn.length > n, i, { polling: 5 });
  const shown = await page.evaluate(() => window.__drawn[window.__drawn.length - 1]);
  const painted = await paintedAfter(page, shown);
  // frames gaps after shown: the GPU time shows as a long gap
  const g = await page.evaluate((sh) => { const f = window.__frames.filter((t) => t > sh - 20); return Math.round(f[2] - f[1]); }, shown);
  res.push([Math.round(shown - t), Math.round(painted - t), g]);
  await page.waitForTimeout(150);
}
const med = (a) => a.sort((x, y) => x - y)[a.length >> 1];
console.log(`${mode} × ${K}: built median ${med(res.map((r) => r[0]))} ms, painted median ${med(res.map((r) => r[1]))} ms (${keys} keys)`);
await s.close();
