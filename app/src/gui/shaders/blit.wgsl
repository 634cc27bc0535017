@group(0) @binding(0) var tex: texture_2d<f32>;

struct BlitOut {
    @builtin(position) pos: vec4<f32>,
    @location(0) uv: vec2<f32>,
};

@vertex
fn vs_blit(@builtin(vertex_index) vi: u32) -> BlitOut {
    let corner = vec2<f32>(f32(vi & 1u), f32((vi >> 1u) & 1u));
    var out: BlitOut;
    out.pos = vec4<f32>(corner.x * 2.0 - 1.0, 1.0 - corner.y * 2.0, 0.0, 1.0);
    out.uv = corner;
    return out;
}

@fragment
fn fs_blit(in: BlitOut) -> @location(0) vec4<f32> {
    let size = vec2<i32>(textureDimensions(tex));
    let texel = min(vec2<i32>(in.uv * vec2<f32>(size)), size - vec2<i32>(1, 1));
    return textureLoad(tex, texel, 0);
}
