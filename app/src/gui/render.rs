//! Our own wgpu pipeline for the big views, run inside an egui paint callback: instanced
//! quads (one instance per band piece or block), uploaded once per replay or layout and
//! then only moved by a uniform (zoom and pan cost nothing but the draw). Works on every
//! wgpu backend eframe uses, WebGL2 included (vertex-buffer instancing, no storage
//! buffers).
//!
//! Levels of detail: instances come ordered by importance (largest first), so a view
//! draws a prefix; and a quad is widened to `min_px` so that a block far below a pixel
//! still shows.

use std::collections::HashMap;
use std::sync::Arc;

use eframe::egui_wgpu::{self, wgpu};
use egui::{Color32, Rect};

/// One quad: a rectangle in data units, an alternative x range (wall time for bands) and
/// a premultiplied colour.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Quad {
    /// x0, y0, x1, y1.
    pub rect: [f32; 4],
    /// x0, x1 used instead of `rect`'s when the view says so.
    pub alt_x: [f32; 2],
    /// RGBA, premultiplied (egui's `Color32` bytes).
    pub color: [u8; 4],
    /// Keeps the instance 32 bytes.
    pub pad: u32,
}

impl Quad {
    /// A quad from data-space corners and a colour.
    #[must_use]
    pub fn new(x0: f32, y0: f32, x1: f32, y1: f32, color: Color32) -> Quad {
        Quad {
            rect: [x0, y0, x1, y1],
            alt_x: [x0, x1],
            color: color.to_array(),
            pad: 0,
        }
    }
}

/// How data units map to the callback's pixels: `px = (data − origin) × scale`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Transform {
    pub origin: [f32; 2],
    /// Pixels per data unit (y may be negative: bytes grow upwards).
    pub scale: [f32; 2],
    /// Size of the callback's rectangle in pixels.
    pub viewport: [f32; 2],
    /// Smallest drawn size of a quad, in pixels.
    pub min_px: [f32; 2],
    /// Gap left at the right of quads wider than three gaps, in pixels.
    pub gap_px: f32,
    /// 1: use `alt_x`.
    pub use_alt_x: f32,
    /// 1: the target stores linear colour (an sRGB format): convert.
    pub linear_target: f32,
    /// Keeps the uniform 16-byte aligned.
    pub pad: f32,
}

/// The instances of one view, shared with the callback without copying.
#[derive(Debug, Clone, Default)]
pub struct QuadSet {
    /// Changes whenever `quads` does (the GPU copy is refreshed then).
    pub generation: u64,
    pub quads: Arc<Vec<Quad>>,
}

impl QuadSet {
    /// A set with a fresh generation number.
    #[must_use]
    pub fn new(quads: Vec<Quad>) -> QuadSet {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        QuadSet {
            generation: NEXT.fetch_add(1, Ordering::Relaxed),
            quads: Arc::new(quads),
        }
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.quads.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.quads.is_empty()
    }
}

/// Whether the wgpu pipeline is installed (false in tests and with other renderers).
#[must_use]
pub fn available(frame: Option<&eframe::Frame>) -> bool {
    frame.and_then(eframe::Frame::wgpu_render_state).is_some()
}

/// Installs the pipeline into the renderer's callback resources.
pub fn install(render_state: &egui_wgpu::RenderState) {
    let device = &render_state.device;
    let shader = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("allocsim_quads"),
        source: wgpu::ShaderSource::Wgsl(SHADER.into()),
    });
    let bind_group_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("allocsim_quads_uniforms"),
        entries: &[wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::VERTEX | wgpu::ShaderStages::FRAGMENT,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        }],
    });
    let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("allocsim_quads"),
        bind_group_layouts: &[Some(&bind_group_layout)],
        immediate_size: 0,
    });
    let pipeline = device.create_render_pipeline(&wgpu::RenderPipelineDescriptor {
        label: Some("allocsim_quads"),
        layout: Some(&layout),
        vertex: wgpu::VertexState {
            module: &shader,
            entry_point: Some("vs_main"),
            buffers: &[Some(wgpu::VertexBufferLayout {
                array_stride: std::mem::size_of::<Quad>() as u64,
                step_mode: wgpu::VertexStepMode::Instance,
                attributes: &wgpu::vertex_attr_array![0 => Float32x4, 1 => Float32x2, 2 => Unorm8x4],
            })],
            compilation_options: wgpu::PipelineCompilationOptions::default(),
        },
        primitive: wgpu::PrimitiveState { topology: wgpu::PrimitiveTopology::TriangleStrip, ..wgpu::PrimitiveState::default() },
        depth_stencil: None,
        multisample: wgpu::MultisampleState { count: 1, mask: !0, alpha_to_coverage_enabled: false },
        fragment: Some(wgpu::FragmentState {
            module: &shader,
            entry_point: Some("fs_main"),
            targets: &[Some(wgpu::ColorTargetState {
                format: render_state.target_format,
                blend: Some(wgpu::BlendState::PREMULTIPLIED_ALPHA_BLENDING),
                write_mask: wgpu::ColorWrites::ALL,
            })],
            compilation_options: wgpu::PipelineCompilationOptions::default(),
        }),
        multiview_mask: None,
        cache: None,
    });
    let resources = Resources {
        pipeline,
        bind_group_layout,
        layers: HashMap::new(),
        linear_target: render_state.target_format.is_srgb(),
    };
    render_state
        .renderer
        .write()
        .callback_resources
        .insert(resources);
}

struct Layer {
    generation: u64,
    buffer: Option<wgpu::Buffer>,
    capacity: u64,
    uniforms: wgpu::Buffer,
    bind_group: wgpu::BindGroup,
}

struct Resources {
    pipeline: wgpu::RenderPipeline,
    bind_group_layout: wgpu::BindGroupLayout,
    layers: HashMap<u64, Layer>,
    linear_target: bool,
}

/// One draw: instances `range` of `set` under `transform`, into layer `layer` (a stable
/// id per view, so each view keeps its own GPU buffer).
pub struct QuadCallback {
    pub layer: u64,
    pub set: QuadSet,
    pub range: std::ops::Range<u32>,
    pub transform: Transform,
}

impl QuadCallback {
    /// The paint callback shape for `rect`.
    pub fn shape(self, rect: Rect) -> egui::Shape {
        egui::Shape::Callback(egui_wgpu::Callback::new_paint_callback(rect, self))
    }
}

impl egui_wgpu::CallbackTrait for QuadCallback {
    fn prepare(
        &self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        _screen: &egui_wgpu::ScreenDescriptor,
        _encoder: &mut wgpu::CommandEncoder,
        resources: &mut egui_wgpu::CallbackResources,
    ) -> Vec<wgpu::CommandBuffer> {
        let Some(res) = resources.get_mut::<Resources>() else {
            return Vec::new();
        };
        let linear = res.linear_target;
        let layout = &res.bind_group_layout;
        let layer = res.layers.entry(self.layer).or_insert_with(|| {
            let uniforms = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("allocsim_quads_uniforms"),
                size: std::mem::size_of::<Transform>() as u64,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("allocsim_quads_uniforms"),
                layout,
                entries: &[wgpu::BindGroupEntry {
                    binding: 0,
                    resource: uniforms.as_entire_binding(),
                }],
            });
            Layer {
                generation: 0,
                buffer: None,
                capacity: 0,
                uniforms,
                bind_group,
            }
        });
        if layer.generation != self.set.generation {
            let bytes: &[u8] = bytemuck::cast_slice(self.set.quads.as_slice());
            let needed = (bytes.len() as u64).max(std::mem::size_of::<Quad>() as u64);
            if layer.buffer.is_none() || layer.capacity < needed {
                layer.buffer = Some(device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("allocsim_quads"),
                    size: needed.next_power_of_two(),
                    usage: wgpu::BufferUsages::VERTEX | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
                layer.capacity = needed.next_power_of_two();
            }
            if let Some(b) = &layer.buffer
                && !bytes.is_empty()
            {
                queue.write_buffer(b, 0, bytes);
            }
            layer.generation = self.set.generation;
        }
        let mut t = self.transform;
        t.linear_target = if linear { 1.0 } else { 0.0 };
        queue.write_buffer(&layer.uniforms, 0, bytemuck::bytes_of(&t));
        Vec::new()
    }

    fn paint(
        &self,
        _info: egui::PaintCallbackInfo,
        pass: &mut wgpu::RenderPass<'static>,
        resources: &egui_wgpu::CallbackResources,
    ) {
        let Some(res) = resources.get::<Resources>() else {
            return;
        };
        let Some(layer) = res.layers.get(&self.layer) else {
            return;
        };
        let Some(buffer) = &layer.buffer else { return };
        let end = self.range.end.min(self.set.len() as u32);
        if self.range.start >= end {
            return;
        }
        pass.set_pipeline(&res.pipeline);
        pass.set_bind_group(0, &layer.bind_group, &[]);
        pass.set_vertex_buffer(0, buffer.slice(..));
        pass.draw(0..4, self.range.start..end);
    }
}

const SHADER: &str = r"
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
    var out: VsOut;
    out.pos = vec4<f32>(p.x / t.viewport.x * 2.0 - 1.0, 1.0 - p.y / t.viewport.y * 2.0, 0.0, 1.0);
    out.color = color;
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
    if (t.linear_target > 0.5) {
        return vec4<f32>(to_linear(in.color.rgb), in.color.a);
    }
    return in.color;
}
";

/// Draws `range` of `set` into `rect`: through the wgpu pipeline when it is installed,
/// else as an egui mesh of the quads that fall inside (at most `CPU_QUAD_LIMIT`), so the
/// views still draw with another renderer and in headless tests.
pub fn paint_quads(
    painter: &egui::Painter,
    rect: Rect,
    wgpu: bool,
    layer: u64,
    set: &QuadSet,
    range: std::ops::Range<u32>,
    transform: Transform,
) {
    if set.is_empty() || range.is_empty() {
        return;
    }
    if wgpu {
        painter.add(
            QuadCallback {
                layer,
                set: set.clone(),
                range,
                transform,
            }
            .shape(rect),
        );
        return;
    }
    let ppp = painter.ctx().pixels_per_point();
    let mut mesh = egui::Mesh::default();
    let end = (range.end as usize).min(set.len());
    let mut drawn = 0usize;
    for q in &set.quads[range.start as usize..end] {
        let (x0, x1) = if transform.use_alt_x > 0.5 {
            (q.alt_x[0], q.alt_x[1])
        } else {
            (q.rect[0], q.rect[2])
        };
        let px = |v: f32, o: f32, s: f32| (v - o) * s / ppp;
        let (mut ax, mut bx) = (
            px(x0, transform.origin[0], transform.scale[0]),
            px(x1, transform.origin[0], transform.scale[0]),
        );
        let (mut ay, mut by) = (
            px(q.rect[1], transform.origin[1], transform.scale[1]),
            px(q.rect[3], transform.origin[1], transform.scale[1]),
        );
        if ax > bx {
            std::mem::swap(&mut ax, &mut bx);
        }
        if ay > by {
            std::mem::swap(&mut ay, &mut by);
        }
        let min_w = transform.min_px[0] / ppp;
        if bx - ax < min_w {
            let c = 0.5 * (ax + bx);
            ax = c - 0.5 * min_w;
            bx = c + 0.5 * min_w;
        }
        let r = Rect::from_min_max(
            egui::pos2(rect.left() + ax, rect.top() + ay),
            egui::pos2(rect.left() + bx, rect.top() + by),
        );
        if !r.intersects(rect) {
            continue;
        }
        let [cr, cg, cb, ca] = q.color;
        mesh.add_colored_rect(
            r.intersect(rect),
            Color32::from_rgba_premultiplied(cr, cg, cb, ca),
        );
        drawn += 1;
        if drawn >= CPU_QUAD_LIMIT {
            break;
        }
    }
    painter.add(egui::Shape::mesh(mesh));
}

/// Most quads the CPU fallback draws per view.
pub const CPU_QUAD_LIMIT: usize = 100_000;
