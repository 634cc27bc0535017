//! The cached meshes on eframe's glow painter (the browser's default: WebGL2 straight onto
//! the canvas). [`super::render`]'s wgpu pipeline draws a view's lines into a texture once
//! and copies it each frame; under glow the same lines went to egui as a mesh, re-uploaded
//! and re-rasterized every frame — on a software rasterizer most of a frame's cost. Here a
//! mesh (`render::MeshSet`) is drawn once per change into a texture of its rectangle's size (an egui
//! paint callback), and each frame copies that texture (one textured rectangle).
//!
//! Web only: the desktop app draws with wgpu.

// glow's calls are `unsafe fn`s (raw WebGL2 state); made only inside egui's paint callback.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::HashMap;

use eframe::egui_glow;
use eframe::glow::{self, HasContext};
use egui::Rect;

const MESH_VS: &str = "#version 300 es
uniform vec2 u_origin;
uniform vec2 u_scale;
uniform vec2 u_size;
in vec2 a_pos;
in vec4 a_color;
out vec4 v_color;
void main() {
    vec2 px = (a_pos - u_origin) * u_scale;
    gl_Position = vec4(px.x / u_size.x * 2.0 - 1.0, 1.0 - px.y / u_size.y * 2.0, 0.0, 1.0);
    v_color = a_color;
}";
const MESH_FS: &str = "#version 300 es
precision mediump float;
in vec4 v_color;
out vec4 o;
void main() { o = v_color; }";
/// One triangle covering the viewport, its texture read 1:1.
const COPY_VS: &str = "#version 300 es
out vec2 v_uv;
void main() {
    vec2 q = vec2(float((gl_VertexID << 1) & 2), float(gl_VertexID & 2));
    v_uv = q;
    gl_Position = vec4(q * 2.0 - 1.0, 0.0, 1.0);
}";
const COPY_FS: &str = "#version 300 es
precision mediump float;
uniform sampler2D u_tex;
in vec2 v_uv;
out vec4 o;
void main() { o = texture(u_tex, v_uv); }";

struct Programs {
    mesh: glow::Program,
    copy: glow::Program,
    vao: glow::VertexArray,
    /// Holds no attribute: the copy's triangle comes from `gl_VertexID`.
    copy_vao: glow::VertexArray,
    vbo: glow::Buffer,
    ibo: glow::Buffer,
}

/// One layer's texture and what it holds.
struct Cached {
    texture: glow::Texture,
    framebuffer: glow::Framebuffer,
    size: [i32; 2],
    /// What the texture holds: the caller's key, then the rectangle's size and place.
    key: Option<Vec<u8>>,
}

#[derive(Default)]
struct State {
    programs: Option<Programs>,
    layers: HashMap<u64, Cached>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

unsafe fn program(gl: &glow::Context, vs: &str, fs: &str) -> Result<glow::Program, String> {
    unsafe {
        let p = gl.create_program()?;
        let mut shaders = Vec::new();
        for (kind, src) in [(glow::VERTEX_SHADER, vs), (glow::FRAGMENT_SHADER, fs)] {
            let s = gl.create_shader(kind)?;
            gl.shader_source(s, src);
            gl.compile_shader(s);
            if !gl.get_shader_compile_status(s) {
                return Err(gl.get_shader_info_log(s));
            }
            gl.attach_shader(p, s);
            shaders.push(s);
        }
        gl.link_program(p);
        for s in shaders {
            gl.detach_shader(p, s);
            gl.delete_shader(s);
        }
        if !gl.get_program_link_status(p) {
            return Err(gl.get_program_info_log(p));
        }
        Ok(p)
    }
}

unsafe fn programs(gl: &glow::Context) -> Result<Programs, String> {
    unsafe {
        Ok(Programs {
            mesh: program(gl, MESH_VS, MESH_FS)?,
            copy: program(gl, COPY_VS, COPY_FS)?,
            vao: gl.create_vertex_array()?,
            copy_vao: gl.create_vertex_array()?,
            vbo: gl.create_buffer()?,
            ibo: gl.create_buffer()?,
        })
    }
}

unsafe fn cached(gl: &glow::Context) -> Result<Cached, String> {
    unsafe {
        Ok(Cached {
            texture: gl.create_texture()?,
            framebuffer: gl.create_framebuffer()?,
            size: [0, 0],
            key: None,
        })
    }
}

/// What makes a cached view's triangles: it hands them, a batch at a time, to the function
/// it is given (vertices, then indices into them).
type Build<'a, V> = dyn Fn(&mut dyn FnMut(&[V], &[u32])) + 'a;

/// Draws the triangles `build` hands over (positions in points; a batch at a time, each
/// drawn as it comes) into `c`'s texture, `size` pixels for the rectangle whose top left is
/// `origin` (points) at `ppp` pixels per point.
unsafe fn draw_into<V: bytemuck::Pod>(
    gl: &glow::Context,
    p: &Programs,
    c: &mut Cached,
    build: &Build<'_, V>,
    origin: [f32; 2],
    ppp: f32,
    size: [i32; 2],
) {
    unsafe {
        gl.bind_texture(glow::TEXTURE_2D, Some(c.texture));
        if c.size != size {
            gl.tex_image_2d(
                glow::TEXTURE_2D,
                0,
                glow::RGBA8 as i32,
                size[0],
                size[1],
                0,
                glow::RGBA,
                glow::UNSIGNED_BYTE,
                glow::PixelUnpackData::Slice(None),
            );
            for (k, v) in [
                (glow::TEXTURE_MIN_FILTER, glow::NEAREST),
                (glow::TEXTURE_MAG_FILTER, glow::NEAREST),
                (glow::TEXTURE_WRAP_S, glow::CLAMP_TO_EDGE),
                (glow::TEXTURE_WRAP_T, glow::CLAMP_TO_EDGE),
            ] {
                gl.tex_parameter_i32(glow::TEXTURE_2D, k, v as i32);
            }
            gl.bind_framebuffer(glow::FRAMEBUFFER, Some(c.framebuffer));
            gl.framebuffer_texture_2d(
                glow::FRAMEBUFFER,
                glow::COLOR_ATTACHMENT0,
                glow::TEXTURE_2D,
                Some(c.texture),
                0,
            );
            c.size = size;
        }
        gl.bind_framebuffer(glow::FRAMEBUFFER, Some(c.framebuffer));
        gl.disable(glow::SCISSOR_TEST);
        gl.viewport(0, 0, size[0], size[1]);
        gl.clear_color(0.0, 0.0, 0.0, 0.0);
        gl.clear(glow::COLOR_BUFFER_BIT);
        gl.use_program(Some(p.mesh));
        let at = |name| gl.get_uniform_location(p.mesh, name);
        gl.uniform_2_f32(at("u_origin").as_ref(), origin[0], origin[1]);
        gl.uniform_2_f32(at("u_scale").as_ref(), ppp, ppp);
        #[allow(clippy::cast_precision_loss)]
        gl.uniform_2_f32(at("u_size").as_ref(), size[0] as f32, size[1] as f32);
        gl.bind_vertex_array(Some(p.vao));
        gl.bind_buffer(glow::ARRAY_BUFFER, Some(p.vbo));
        gl.bind_buffer(glow::ELEMENT_ARRAY_BUFFER, Some(p.ibo));
        let stride = i32::try_from(std::mem::size_of::<V>()).unwrap_or(12);
        if let Some(pos) = gl.get_attrib_location(p.mesh, "a_pos") {
            gl.enable_vertex_attrib_array(pos);
            gl.vertex_attrib_pointer_f32(pos, 2, glow::FLOAT, false, stride, 0);
        }
        if let Some(color) = gl.get_attrib_location(p.mesh, "a_color") {
            gl.enable_vertex_attrib_array(color);
            gl.vertex_attrib_pointer_f32(color, 4, glow::UNSIGNED_BYTE, true, stride, 8);
        }
        // Premultiplied colours, as egui blends them.
        gl.enable(glow::BLEND);
        gl.blend_func(glow::ONE, glow::ONE_MINUS_SRC_ALPHA);
        build(&mut |vertices: &[V], indices: &[u32]| {
            if vertices.is_empty() || indices.is_empty() {
                return;
            }
            gl.buffer_data_u8_slice(
                glow::ARRAY_BUFFER,
                bytemuck::cast_slice(vertices),
                glow::STREAM_DRAW,
            );
            gl.buffer_data_u8_slice(
                glow::ELEMENT_ARRAY_BUFFER,
                bytemuck::cast_slice(indices),
                glow::STREAM_DRAW,
            );
            let count = i32::try_from(indices.len()).unwrap_or(i32::MAX);
            gl.draw_elements(glow::TRIANGLES, count, glow::UNSIGNED_INT, 0);
        });
        gl.bind_vertex_array(None);
        gl.bind_framebuffer(glow::FRAMEBUFFER, None);
    }
}

/// Paints the triangles `build` makes, clipped to `rect`, through `layer`'s texture:
/// `build` is called — handing its triangles (vertices: a position in points, two `f32`,
/// then a premultiplied colour, four `u8`, as `render::MeshVertex`; indices into them) to
/// the function it is given, in as many batches as it likes — and they are drawn into the
/// texture only when `key` (what they are made from), the rectangle's pixel size or its
/// place changed; otherwise the texture is copied.
pub fn paint_cached<V: bytemuck::Pod>(
    painter: &egui::Painter,
    rect: Rect,
    layer: u64,
    key: Vec<u8>,
    build: impl Fn(&mut dyn FnMut(&[V], &[u32])) + Send + Sync + 'static,
) {
    let callback = egui_glow::CallbackFn::new(move |info, painter| {
        let gl = painter.gl();
        let vp = info.viewport_in_pixels();
        let size = [vp.width_px, vp.height_px];
        if size[0] <= 0 || size[1] <= 0 {
            return;
        }
        let origin = [info.viewport.left(), info.viewport.top()];
        let mut key = key.clone();
        for v in [size[0].to_le_bytes(), size[1].to_le_bytes()] {
            key.extend(v);
        }
        for v in origin {
            key.extend(v.to_bits().to_le_bytes());
        }
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let State {
                programs: ps,
                layers,
            } = &mut *s;
            // SAFETY: the calls below are plain WebGL2 calls on egui's context, made inside
            // its paint callback; egui restores its own state after the callback.
            unsafe {
                if ps.is_none() {
                    match programs(gl) {
                        Ok(p) => *ps = Some(p),
                        Err(e) => {
                            log::error!("glow mesh cache: {e}");
                            return;
                        }
                    }
                }
                let Some(p) = ps.as_ref() else { return };
                let c = match layers.entry(layer) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => match cached(gl) {
                        Ok(c) => v.insert(c),
                        Err(e) => {
                            log::error!("glow mesh cache: {e}");
                            return;
                        }
                    },
                };
                if c.key.as_ref() != Some(&key) {
                    draw_into(gl, p, c, &build, origin, info.pixels_per_point, size);
                    c.key = Some(key);
                    gl.viewport(vp.left_px, vp.from_bottom_px, vp.width_px, vp.height_px);
                    gl.enable(glow::SCISSOR_TEST);
                }
                gl.use_program(Some(p.copy));
                gl.active_texture(glow::TEXTURE0);
                gl.bind_texture(glow::TEXTURE_2D, Some(c.texture));
                gl.uniform_1_i32(gl.get_uniform_location(p.copy, "u_tex").as_ref(), 0);
                gl.enable(glow::BLEND);
                gl.blend_func(glow::ONE, glow::ONE_MINUS_SRC_ALPHA);
                gl.bind_vertex_array(Some(p.copy_vao));
                gl.draw_arrays(glow::TRIANGLES, 0, 3);
                gl.bind_vertex_array(None);
            }
        });
    });
    painter.add(egui::PaintCallback {
        rect,
        callback: std::sync::Arc::new(callback),
    });
}
