struct Transform {
    origin: vec2<f32>,
    scale: vec2<f32>,
    viewport: vec2<f32>,
    min_px: vec2<f32>,
    gap_px: f32,
    use_alt_x: f32,
    linear_target: f32,
    pad: f32,
};

@group(0) @binding(0) var<uniform> t: Transform;

struct VsOut {
    @builtin(position) pos: vec4<f32>,
    @location(0) color: vec4<f32>,
};

fn widen(a: f32, b: f32, min_size: f32) -> vec2<f32> {
    var lo = min(a, b);
    var hi = max(a, b);
    if (hi - lo < min_size) {
        let c = 0.5 * (lo + hi);
        lo = c - 0.5 * min_size;
        hi = c + 0.5 * min_size;
    }
    return vec2<f32>(lo, hi);
}

@vertex
fn vs_main(@builtin(vertex_index) vi: u32, @location(0) rect: vec4<f32>, @location(1) alt_x: vec2<f32>, @location(2) color: vec4<f32>) -> VsOut {
    var x0 = rect.x;
    var x1 = rect.z;
    if (t.use_alt_x > 0.5) {
        x0 = alt_x.x;
        x1 = alt_x.y;
    }
    var xs = widen((x0 - t.origin.x) * t.scale.x, (x1 - t.origin.x) * t.scale.x, t.min_px.x);
    let ys = widen((rect.y - t.origin.y) * t.scale.y, (rect.w - t.origin.y) * t.scale.y, t.min_px.y);
    if (xs.y - xs.x > 3.0 * t.gap_px) {
        xs.y = xs.y - t.gap_px;
    }
    // Keep far-away corners finite: clamp to a margin around the viewport.
    let lo = vec2<f32>(-8.0, -8.0);
    let hi = t.viewport + vec2<f32>(8.0, 8.0);
    let corner = vec2<f32>(f32(vi & 1u), f32((vi >> 1u) & 1u));
    let p = clamp(mix(vec2<f32>(xs.x, ys.x), vec2<f32>(xs.y, ys.y), corner), lo, hi);
    return vertex_out(p, color);
}

@vertex
fn vs_mesh(@location(0) pos: vec2<f32>, @location(1) color: vec4<f32>) -> VsOut {
    return vertex_out((pos - t.origin) * t.scale, color);
}

// A vertex at `p` pixels of the viewport, of colour `color`. A quad or a mesh vertex is
// one colour: convert it here, once per corner, not per pixel (a software rasterizer runs
// both sides of a per-pixel branch, and `pow` is dear there).
fn vertex_out(p: vec2<f32>, color: vec4<f32>) -> VsOut {
    var out: VsOut;
    out.pos = vec4<f32>(p.x / t.viewport.x * 2.0 - 1.0, 1.0 - p.y / t.viewport.y * 2.0, 0.0, 1.0);
    var c = color;
    if (t.linear_target > 0.5) {
        c = vec4<f32>(to_linear(color.rgb), color.a);
    }
    out.color = c;
    return out;
}

fn to_linear(c: vec3<f32>) -> vec3<f32> {
    let cutoff = c < vec3<f32>(0.04045);
    let lower = c / vec3<f32>(12.92);
    let higher = pow((c + vec3<f32>(0.055)) / vec3<f32>(1.055), vec3<f32>(2.4));
    return select(higher, lower, cutoff);
}

@fragment
fn fs_main(in: VsOut) -> @location(0) vec4<f32> {
    return in.color;
}
