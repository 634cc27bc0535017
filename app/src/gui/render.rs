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

impl Transform {
    /// `px = (data − origin) × scale` into a viewport of `viewport` pixels, no smallest
    /// size, gap or alternative x.
    #[must_use]
    pub fn new(origin: [f32; 2], scale: [f32; 2], viewport: [f32; 2]) -> Transform {
        Transform {
            origin,
            scale,
            viewport,
            min_px: [0.0, 0.0],
            gap_px: 0.0,
            use_alt_x: 0.0,
            linear_target: 0.0,
            pad: 0.0,
        }
    }
}

/// Quads made on demand from a table they are a view of (the stacked view's, from the band
/// pieces: a held copy of 5.9 M quads was 189 MB of the browser tab's memory).
pub trait QuadSource: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Quad `i` (`i < len()`).
    fn quad(&self, i: usize) -> Quad;
}

/// Where a [`QuadSet`]'s quads are.
#[derive(Clone)]
enum Quads {
    Held(Arc<Vec<Quad>>),
    Made(Arc<dyn QuadSource>),
}

/// The instances of one view, shared with the callback without copying: held, or made
/// from their source as they are drawn or uploaded.
#[derive(Clone)]
pub struct QuadSet {
    /// Changes whenever the quads do (the GPU copy is refreshed then).
    pub generation: u64,
    quads: Quads,
}

impl Default for QuadSet {
    fn default() -> QuadSet {
        QuadSet {
            generation: 0,
            quads: Quads::Held(Arc::default()),
        }
    }
}

impl std::fmt::Debug for QuadSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuadSet")
            .field("generation", &self.generation)
            .field("len", &self.len())
            .field("held", &self.held().is_some())
            .finish_non_exhaustive()
    }
}

impl QuadSet {
    /// A set of `quads`, with a fresh generation number.
    #[must_use]
    pub fn new(quads: Vec<Quad>) -> QuadSet {
        QuadSet {
            generation: next_generation(),
            quads: Quads::Held(Arc::new(quads)),
        }
    }

    /// A set whose quads `source` makes when they are drawn, with a fresh generation.
    #[must_use]
    pub fn made(source: Arc<dyn QuadSource>) -> QuadSet {
        QuadSet {
            generation: next_generation(),
            quads: Quads::Made(source),
        }
    }

    #[must_use]
    pub fn len(&self) -> usize {
        match &self.quads {
            Quads::Held(q) => q.len(),
            Quads::Made(s) => s.len(),
        }
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The quads when they are held (`None`: made from their source).
    #[must_use]
    pub fn held(&self) -> Option<&[Quad]> {
        match &self.quads {
            Quads::Held(q) => Some(q.as_slice()),
            Quads::Made(_) => None,
        }
    }

    /// The room of the held quads (tests: built in exactly their room).
    #[cfg(test)]
    #[must_use]
    pub fn held_capacity(&self) -> Option<usize> {
        match &self.quads {
            Quads::Held(q) => Some(q.capacity()),
            Quads::Made(_) => None,
        }
    }

    /// Calls `f` on quads `range` (clamped to the set), in order, while it returns true.
    pub fn for_each_while(&self, range: std::ops::Range<usize>, mut f: impl FnMut(&Quad) -> bool) {
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        match &self.quads {
            Quads::Held(q) => {
                for q in &q[start..end] {
                    if !f(q) {
                        return;
                    }
                }
            }
            Quads::Made(s) => {
                for i in start..end {
                    if !f(&s.quad(i)) {
                        return;
                    }
                }
            }
        }
    }

    /// Quads `range` (clamped to the set) copied out.
    #[must_use]
    pub fn to_vec(&self, range: std::ops::Range<usize>) -> Vec<Quad> {
        let mut v = Vec::with_capacity(range.len().min(self.len()));
        self.for_each_while(range, |q| {
            v.push(*q);
            true
        });
        v
    }
}

/// A number no set of instances or mesh had before (the GPU copy is refreshed when it
/// changes).
fn next_generation() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One vertex of a flat-coloured mesh: a position in points and a premultiplied colour.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MeshVertex {
    pub pos: [f32; 2],
    pub color: [u8; 4],
}

/// A tessellated egui mesh of untextured shapes (lines, outlines) kept for the GPU: drawn
/// by our pipeline, it is uploaded once per change instead of every frame, and shaded
/// without egui's texture lookup.
#[derive(Debug, Clone, Default)]
pub struct MeshSet {
    pub generation: u64,
    pub vertices: Arc<Vec<MeshVertex>>,
    pub indices: Arc<Vec<u32>>,
}

impl MeshSet {
    /// The triangles of `mesh` (its texture coordinates are dropped: the mesh must be of
    /// untextured shapes, whose coordinates all point at the font atlas's white texel).
    #[must_use]
    pub fn from_egui(mesh: &egui::Mesh) -> MeshSet {
        MeshSet {
            generation: next_generation(),
            vertices: Arc::new(
                mesh.vertices
                    .iter()
                    .map(|v| MeshVertex {
                        pos: [v.pos.x, v.pos.y],
                        color: v.color.to_array(),
                    })
                    .collect(),
            ),
            indices: Arc::new(mesh.indices.clone()),
        }
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

/// Draws `mesh` (positions in points) clipped to `rect` through the mesh pipeline, in
/// layer `layer`.
pub struct MeshCallback {
    pub layer: u64,
    pub mesh: MeshSet,
    pub transform: Transform,
    /// Drawn once into a texture of this size (pixels) and copied from it after, while
    /// the mesh and the transform stay.
    pub cached: Option<[u32; 2]>,
}

impl LayerDraw for MeshCallback {
    fn head(&self) -> Head {
        Head {
            layer: self.layer,
            generation: self.mesh.generation,
            transform: self.transform,
            cached: self.cached,
        }
    }
    fn upload(&self, device: &wgpu::Device, queue: &wgpu::Queue, layer: &mut Layer) {
        layer.upload_vertices(
            device,
            queue,
            bytemuck::cast_slice(self.mesh.vertices.as_slice()),
        );
        upload(
            device,
            queue,
            &mut layer.index_buffer,
            &mut layer.index_capacity,
            wgpu::BufferUsages::INDEX,
            bytemuck::cast_slice(self.mesh.indices.as_slice()),
        );
    }
    fn draw(&self, res: &Resources, layer: &Layer, pass: &mut wgpu::RenderPass<'_>) {
        let (Some(vb), Some(ib)) = (&layer.buffer, &layer.index_buffer) else {
            return;
        };
        if self.mesh.is_empty() {
            return;
        }
        layer.bind(pass, &res.mesh_pipeline, vb);
        pass.set_index_buffer(ib.slice(..), wgpu::IndexFormat::Uint32);
        pass.draw_indexed(0..self.mesh.indices.len() as u32, 0, 0..1);
    }
}

/// A [`LayerDraw`] as egui's paint callback: `prepare` and `paint` written once for
/// meshes and quads alike.
struct Drawn<T>(T);

impl<T: LayerDraw + Send + Sync + 'static> egui_wgpu::CallbackTrait for Drawn<T> {
    fn prepare(
        &self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        _screen: &egui_wgpu::ScreenDescriptor,
        encoder: &mut wgpu::CommandEncoder,
        resources: &mut egui_wgpu::CallbackResources,
    ) -> Vec<wgpu::CommandBuffer> {
        prepare_layer(&self.0, device, queue, encoder, resources)
    }

    fn paint(
        &self,
        _info: egui::PaintCallbackInfo,
        pass: &mut wgpu::RenderPass<'static>,
        resources: &egui_wgpu::CallbackResources,
    ) {
        paint_layer(&self.0, pass, resources);
    }
}

/// Where a [`LayerDraw`] draws and what it shows.
#[derive(Debug, Clone, Copy)]
struct Head {
    layer: u64,
    /// Changes whenever the data to upload changes.
    generation: u64,
    transform: Transform,
    /// Drawn once into a texture of this size and copied from it after (see the callbacks).
    cached: Option<[u32; 2]>,
}

/// A drawing into a layer of [`Resources`] (see [`Drawn`]).
trait LayerDraw {
    fn head(&self) -> Head;
    /// What else, beside the generation and the transform, makes a cached picture stale.
    fn cache_key(&self, key: &mut Vec<u8>) {
        let _ = key;
    }
    /// Uploads the data into the layer's buffers.
    fn upload(&self, device: &wgpu::Device, queue: &wgpu::Queue, layer: &mut Layer);
    fn draw(&self, res: &Resources, layer: &Layer, pass: &mut wgpu::RenderPass<'_>);
}

/// `prepare` of a [`LayerDraw`]: the layer (made on first use) takes new data when its
/// generation changed and the transform; a cached drawing is redrawn into its texture
/// when anything in its key changed.
fn prepare_layer(
    d: &impl LayerDraw,
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    encoder: &mut wgpu::CommandEncoder,
    resources: &mut egui_wgpu::CallbackResources,
) -> Vec<wgpu::CommandBuffer> {
    let Some(res) = resources.get_mut::<Resources>() else {
        return Vec::new();
    };
    let head = d.head();
    let linear = res.linear_target;
    let layout = &res.bind_group_layout;
    let layer = res
        .layers
        .entry(head.layer)
        .or_insert_with(|| Layer::new(device, layout));
    if layer.generation != head.generation {
        d.upload(device, queue, layer);
        layer.generation = head.generation;
    }
    let mut t = head.transform;
    t.linear_target = if linear { 1.0 } else { 0.0 };
    queue.write_buffer(&layer.uniforms, 0, bytemuck::bytes_of(&t));
    if let Some(size) = head.cached {
        let mut key = head.generation.to_le_bytes().to_vec();
        d.cache_key(&mut key);
        key.extend_from_slice(bytemuck::bytes_of(&t));
        if let Some(view) = layer.cache_target(device, &res.cache, size, key) {
            let layer = &res.layers[&head.layer];
            d.draw(res, layer, &mut cache_pass(encoder, &view));
        }
    }
    Vec::new()
}

/// `paint` of a [`LayerDraw`]: the cached texture copied, or the drawing itself.
fn paint_layer(
    d: &impl LayerDraw,
    pass: &mut wgpu::RenderPass<'static>,
    resources: &egui_wgpu::CallbackResources,
) {
    let Some(res) = resources.get::<Resources>() else {
        return;
    };
    let head = d.head();
    let Some(layer) = res.layers.get(&head.layer) else {
        return;
    };
    if head.cached.is_some() {
        layer.blit(res, pass);
    } else {
        d.draw(res, layer, pass);
    }
}

static GLOW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether eframe's glow painter draws the app (the browser's default): meshes then go
/// through `render_glow`'s texture cache instead of egui's per-frame upload.
pub fn glow() -> bool {
    GLOW.load(std::sync::atomic::Ordering::Relaxed)
}

/// Records whether eframe's glow painter draws the app (once, when it is created).
pub fn set_glow(on: bool) {
    GLOW.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Draws a mesh of untextured shapes in `rect`: `mesh` through the mesh pipeline when it is
/// installed (drawn once into a texture, then copied from it while the mesh and `rect`
/// stay), else `shape` (the same mesh as an egui shape).
pub fn paint_mesh(
    painter: &egui::Painter,
    rect: Rect,
    wgpu: bool,
    layer: u64,
    mesh: &MeshSet,
    shape: &egui::Shape,
) {
    if !wgpu {
        #[cfg(target_arch = "wasm32")]
        if glow() {
            let (vertices, indices) = (mesh.vertices.clone(), mesh.indices.clone());
            let key = mesh.generation.to_le_bytes().to_vec();
            crate::gui::render_glow::paint_cached(painter, rect, layer, key, move |draw| {
                draw(vertices.as_slice(), indices.as_slice());
            });
            return;
        }
        painter.add(shape.clone());
        return;
    }
    if mesh.is_empty() {
        return;
    }
    let ppp = painter.ctx().pixels_per_point();
    let transform = Transform::new(
        [rect.left(), rect.top()],
        [ppp, ppp],
        [rect.width() * ppp, rect.height() * ppp],
    );
    painter.add(egui::Shape::Callback(
        egui_wgpu::Callback::new_paint_callback(
            rect,
            Drawn(MeshCallback {
                layer,
                mesh: mesh.clone(),
                transform,
                cached: Some(viewport_px(rect, ppp)),
            }),
        ),
    ));
}

/// Whether the wgpu pipeline is installed (false in tests and with other renderers).
#[must_use]
pub fn available(frame: Option<&eframe::Frame>) -> bool {
    frame.and_then(eframe::Frame::wgpu_render_state).is_some()
}

/// A render pipeline of ours: `(module, vertex entry, fragment entry)`, at most one vertex
/// buffer, drawing with premultiplied alpha into `format`.
fn make_pipeline(
    device: &wgpu::Device,
    label: &str,
    layout: &wgpu::PipelineLayout,
    (module, vs, fs): (&wgpu::ShaderModule, &str, &str),
    buffer: Option<wgpu::VertexBufferLayout<'_>>,
    topology: wgpu::PrimitiveTopology,
    format: wgpu::TextureFormat,
) -> wgpu::RenderPipeline {
    let buffers = [buffer];
    device.create_render_pipeline(&wgpu::RenderPipelineDescriptor {
        label: Some(label),
        layout: Some(layout),
        vertex: wgpu::VertexState {
            module,
            entry_point: Some(vs),
            buffers: if buffers[0].is_some() { &buffers } else { &[] },
            compilation_options: wgpu::PipelineCompilationOptions::default(),
        },
        primitive: wgpu::PrimitiveState {
            topology,
            ..wgpu::PrimitiveState::default()
        },
        depth_stencil: None,
        multisample: wgpu::MultisampleState {
            count: 1,
            mask: !0,
            alpha_to_coverage_enabled: false,
        },
        fragment: Some(wgpu::FragmentState {
            module,
            entry_point: Some(fs),
            targets: &[Some(wgpu::ColorTargetState {
                format,
                blend: Some(wgpu::BlendState::PREMULTIPLIED_ALPHA_BLENDING),
                write_mask: wgpu::ColorWrites::ALL,
            })],
            compilation_options: wgpu::PipelineCompilationOptions::default(),
        }),
        multiview_mask: None,
        cache: None,
    })
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
    let format = render_state.target_format;
    let pipeline = make_pipeline(
        device,
        "allocsim_quads",
        &layout,
        (&shader, "vs_main", "fs_main"),
        Some(wgpu::VertexBufferLayout {
            array_stride: std::mem::size_of::<Quad>() as u64,
            step_mode: wgpu::VertexStepMode::Instance,
            attributes: &wgpu::vertex_attr_array![0 => Float32x4, 1 => Float32x2, 2 => Unorm8x4],
        }),
        wgpu::PrimitiveTopology::TriangleStrip,
        format,
    );
    let mesh_pipeline = make_pipeline(
        device,
        "allocsim_mesh",
        &layout,
        (&shader, "vs_mesh", "fs_main"),
        Some(wgpu::VertexBufferLayout {
            array_stride: std::mem::size_of::<MeshVertex>() as u64,
            step_mode: wgpu::VertexStepMode::Vertex,
            attributes: &wgpu::vertex_attr_array![0 => Float32x2, 1 => Unorm8x4],
        }),
        wgpu::PrimitiveTopology::TriangleList,
        format,
    );
    let blit_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("allocsim_blit"),
        entries: &[wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::FRAGMENT,
            ty: wgpu::BindingType::Texture {
                sample_type: wgpu::TextureSampleType::Float { filterable: false },
                view_dimension: wgpu::TextureViewDimension::D2,
                multisampled: false,
            },
            count: None,
        }],
    });
    let blit_pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("allocsim_blit"),
        bind_group_layouts: &[Some(&blit_layout)],
        immediate_size: 0,
    });
    let blit_shader = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("allocsim_blit"),
        source: wgpu::ShaderSource::Wgsl(BLIT_SHADER.into()),
    });
    let blit_pipeline = make_pipeline(
        device,
        "allocsim_blit",
        &blit_pipeline_layout,
        (&blit_shader, "vs_blit", "fs_blit"),
        None,
        wgpu::PrimitiveTopology::TriangleStrip,
        format,
    );
    let resources = Resources {
        pipeline,
        mesh_pipeline,
        cache: CacheResources {
            format,
            blit_layout,
            blit_pipeline,
        },
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
    /// Mesh layers: the triangles' indices.
    index_buffer: Option<wgpu::Buffer>,
    index_capacity: u64,
    uniforms: wgpu::Buffer,
    bind_group: wgpu::BindGroup,
    /// Cached layers: the view drawn into a texture, copied to the screen each frame.
    cached: Option<Cached>,
}

/// A view drawn once into a texture: what it shows (`key`) and the texture.
struct Cached {
    key: Vec<u8>,
    size: [u32; 2],
    view: wgpu::TextureView,
    blit: wgpu::BindGroup,
}

impl Layer {
    fn new(device: &wgpu::Device, layout: &wgpu::BindGroupLayout) -> Layer {
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
            index_buffer: None,
            index_capacity: 0,
            uniforms,
            bind_group,
            cached: None,
        }
    }

    /// Writes `bytes` into the layer's vertex (or instance) buffer, grown as needed.
    fn upload_vertices(&mut self, device: &wgpu::Device, queue: &wgpu::Queue, bytes: &[u8]) {
        upload(
            device,
            queue,
            &mut self.buffer,
            &mut self.capacity,
            wgpu::BufferUsages::VERTEX,
            bytes,
        );
    }

    /// Sets `pipeline` with this layer's uniforms and `vertices` in `pass`.
    fn bind(
        &self,
        pass: &mut wgpu::RenderPass<'_>,
        pipeline: &wgpu::RenderPipeline,
        vertices: &wgpu::Buffer,
    ) {
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.set_vertex_buffer(0, vertices.slice(..));
    }

    /// Makes sure the layer's texture is `size` pixels and shows `key`: when it does not,
    /// returns the texture to draw into (cleared to transparent by the caller's pass).
    fn cache_target(
        &mut self,
        device: &wgpu::Device,
        res: &CacheResources,
        size: [u32; 2],
        key: Vec<u8>,
    ) -> Option<wgpu::TextureView> {
        if self.cached.as_ref().is_some_and(|c| c.key == key) {
            return None;
        }
        if self.cached.as_ref().is_none_or(|c| c.size != size) {
            let texture = device.create_texture(&wgpu::TextureDescriptor {
                label: Some("allocsim_cached_view"),
                size: wgpu::Extent3d {
                    width: size[0],
                    height: size[1],
                    depth_or_array_layers: 1,
                },
                mip_level_count: 1,
                sample_count: 1,
                dimension: wgpu::TextureDimension::D2,
                format: res.format,
                usage: wgpu::TextureUsages::RENDER_ATTACHMENT
                    | wgpu::TextureUsages::TEXTURE_BINDING,
                view_formats: &[],
            });
            let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
            let blit = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("allocsim_blit"),
                layout: &res.blit_layout,
                entries: &[wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::TextureView(&view),
                }],
            });
            self.cached = Some(Cached {
                key: Vec::new(),
                size,
                view,
                blit,
            });
        }
        let c = self.cached.as_mut()?;
        c.key = key;
        Some(c.view.clone())
    }

    /// Copies the cached texture to the callback's viewport.
    fn blit(&self, res: &Resources, pass: &mut wgpu::RenderPass<'static>) {
        if let Some(c) = &self.cached {
            pass.set_pipeline(&res.cache.blit_pipeline);
            pass.set_bind_group(0, &c.blit, &[]);
            pass.draw(0..4, 0..1);
        }
    }
}

/// What drawing views into textures needs: their format, and the pipeline that copies a
/// texture to the screen.
struct CacheResources {
    format: wgpu::TextureFormat,
    blit_layout: wgpu::BindGroupLayout,
    blit_pipeline: wgpu::RenderPipeline,
}

/// A pass that clears `view` and draws into it.
fn cache_pass<'e>(
    encoder: &'e mut wgpu::CommandEncoder,
    view: &wgpu::TextureView,
) -> wgpu::RenderPass<'e> {
    encoder.begin_render_pass(&wgpu::RenderPassDescriptor {
        label: Some("allocsim_cached_view"),
        color_attachments: &[Some(wgpu::RenderPassColorAttachment {
            view,
            depth_slice: None,
            resolve_target: None,
            ops: wgpu::Operations {
                load: wgpu::LoadOp::Clear(wgpu::Color::TRANSPARENT),
                store: wgpu::StoreOp::Store,
            },
        })],
        depth_stencil_attachment: None,
        timestamp_writes: None,
        occlusion_query_set: None,
        multiview_mask: None,
    })
}

/// The size in pixels of the viewport egui gives a callback in `rect` (rounded as
/// `epaint::ViewportInPixels` rounds it).
fn viewport_px(rect: Rect, ppp: f32) -> [u32; 2] {
    let w = (rect.max.x * ppp).round() - (rect.min.x * ppp).round();
    let h = (rect.max.y * ppp).round() - (rect.min.y * ppp).round();
    [w.max(1.0) as u32, h.max(1.0) as u32]
}

/// Writes `bytes` into `buffer`, (re)creating it with room to spare when it is too small.
fn upload(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    buffer: &mut Option<wgpu::Buffer>,
    capacity: &mut u64,
    usage: wgpu::BufferUsages,
    bytes: &[u8],
) {
    let b = reserve(device, buffer, capacity, usage, bytes.len() as u64);
    if !bytes.is_empty() {
        queue.write_buffer(b, 0, bytes);
    }
}

/// `buffer`, made anew (a power of two of bytes, at least `len`) when it holds less.
fn reserve<'a>(
    device: &wgpu::Device,
    buffer: &'a mut Option<wgpu::Buffer>,
    capacity: &mut u64,
    usage: wgpu::BufferUsages,
    len: u64,
) -> &'a wgpu::Buffer {
    let needed = len.max(16).next_multiple_of(4);
    if buffer.is_none() || *capacity < needed {
        *capacity = needed.next_power_of_two();
        *buffer = None;
    }
    buffer.get_or_insert_with(|| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("allocsim_view"),
            size: *capacity,
            usage: usage | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    })
}

/// Quads made as they are uploaded go in pieces of this many, each written at its place.
const UPLOAD_PIECE_QUADS: usize = 1 << 16;

struct Resources {
    pipeline: wgpu::RenderPipeline,
    mesh_pipeline: wgpu::RenderPipeline,
    cache: CacheResources,
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
    /// Drawn once into a texture of this size (pixels) and copied from it after, while
    /// the instances, the range and the transform stay.
    pub cached: Option<[u32; 2]>,
}

impl QuadCallback {
    /// The paint callback shape for `rect`.
    pub fn shape(self, rect: Rect) -> egui::Shape {
        egui::Shape::Callback(egui_wgpu::Callback::new_paint_callback(rect, Drawn(self)))
    }
}

impl LayerDraw for QuadCallback {
    fn head(&self) -> Head {
        Head {
            layer: self.layer,
            generation: self.set.generation,
            transform: self.transform,
            cached: self.cached,
        }
    }
    fn cache_key(&self, key: &mut Vec<u8>) {
        key.extend_from_slice(&self.range.start.to_le_bytes());
        key.extend_from_slice(&self.range.end.to_le_bytes());
    }
    fn upload(&self, device: &wgpu::Device, queue: &wgpu::Queue, layer: &mut Layer) {
        if let Some(quads) = self.set.held() {
            layer.upload_vertices(device, queue, bytemuck::cast_slice(quads));
            return;
        }
        // Made from their source: written a piece at a time, never all held here.
        let n = self.set.len();
        let size = std::mem::size_of::<Quad>();
        let b = reserve(
            device,
            &mut layer.buffer,
            &mut layer.capacity,
            wgpu::BufferUsages::VERTEX,
            (n * size) as u64,
        );
        let mut piece = Vec::with_capacity(UPLOAD_PIECE_QUADS.min(n));
        for from in (0..n).step_by(UPLOAD_PIECE_QUADS) {
            piece.clear();
            self.set
                .for_each_while(from..from + UPLOAD_PIECE_QUADS, |q| {
                    piece.push(*q);
                    true
                });
            queue.write_buffer(b, (from * size) as u64, bytemuck::cast_slice(&piece));
        }
    }
    fn draw(&self, res: &Resources, layer: &Layer, pass: &mut wgpu::RenderPass<'_>) {
        let Some(buffer) = &layer.buffer else { return };
        let end = self.range.end.min(self.set.len() as u32);
        if self.range.start >= end {
            return;
        }
        layer.bind(pass, &res.pipeline, buffer);
        pass.draw(0..4, self.range.start..end);
    }
}

/// Copies a cached view's texture to the callback's viewport, pixel for pixel.
const BLIT_SHADER: &str = include_str!("shaders/blit.wgsl");

const SHADER: &str = include_str!("shaders/quads.wgsl");

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
    paint_quads_with(painter, rect, wgpu, layer, set, range, transform, false);
}

/// [`paint_quads`], drawn once into a texture and copied from it while `set`, `range` and
/// `transform` stay when `cached` (a view of many instances that changes only with zoom,
/// pan or data: each frame then costs one copy, not every instance).
#[allow(clippy::too_many_arguments)]
pub fn paint_quads_with(
    painter: &egui::Painter,
    rect: Rect,
    wgpu: bool,
    layer: u64,
    set: &QuadSet,
    range: std::ops::Range<u32>,
    transform: Transform,
    cached: bool,
) {
    if set.is_empty() || range.is_empty() {
        return;
    }
    if wgpu {
        let ppp = painter.ctx().pixels_per_point();
        painter.add(
            QuadCallback {
                layer,
                set: set.clone(),
                range,
                transform,
                cached: cached.then(|| viewport_px(rect, ppp)),
            }
            .shape(rect),
        );
        return;
    }
    let ppp = painter.ctx().pixels_per_point();
    #[cfg(target_arch = "wasm32")]
    if cached && glow() {
        // Under glow, a cached view is tessellated and drawn into a texture once per change
        // (`render_glow`), like the wgpu pipeline's, not re-rasterized every frame; in
        // batches, so that a view of millions of quads never holds their mesh whole.
        let mut key = bytemuck::bytes_of(&transform).to_vec();
        for v in [set.generation, u64::from(range.start), u64::from(range.end)] {
            key.extend(v.to_le_bytes());
        }
        for v in [rect.min.x, rect.min.y, rect.max.x, rect.max.y, ppp] {
            key.extend(v.to_bits().to_le_bytes());
        }
        let set = set.clone();
        crate::gui::render_glow::paint_cached(painter, rect, layer, key, move |draw| {
            quads_batches(
                rect,
                ppp,
                &set,
                range.clone(),
                transform,
                GLOW_BATCH_QUADS,
                draw,
            );
        });
        return;
    }
    let mesh = quads_mesh(rect, ppp, set, range, transform, CPU_QUAD_LIMIT);
    painter.add(egui::Shape::mesh(mesh));
}

/// Calls `f` with the rectangle (points) and colour of each quad of `range` of `set` that
/// falls in `rect`, clipped to it, in order, while `f` returns true.
fn quad_rects(
    rect: Rect,
    ppp: f32,
    set: &QuadSet,
    range: std::ops::Range<u32>,
    transform: Transform,
    mut f: impl FnMut(Rect, Color32) -> bool,
) {
    let px = |v: f32, o: f32, s: f32| (v - o) * s / ppp;
    let min_w = transform.min_px[0] / ppp;
    set.for_each_while(range.start as usize..range.end as usize, |q| {
        let (x0, x1) = if transform.use_alt_x > 0.5 {
            (q.alt_x[0], q.alt_x[1])
        } else {
            (q.rect[0], q.rect[2])
        };
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
            return true;
        }
        let [cr, cg, cb, ca] = q.color;
        f(
            r.intersect(rect),
            Color32::from_rgba_premultiplied(cr, cg, cb, ca),
        )
    });
}

/// The quads `range` of `set` as an egui mesh in `rect`, at most `limit` of them (the CPU
/// fallback draws [`CPU_QUAD_LIMIT`] per frame).
fn quads_mesh(
    rect: Rect,
    ppp: f32,
    set: &QuadSet,
    range: std::ops::Range<u32>,
    transform: Transform,
    limit: usize,
) -> egui::Mesh {
    let mut mesh = egui::Mesh::default();
    let mut drawn = 0usize;
    quad_rects(rect, ppp, set, range, transform, |r, color| {
        mesh.add_colored_rect(r, color);
        drawn += 1;
        drawn < limit
    });
    mesh
}

/// Quads a glow view tessellates per draw call: 64 Ki quads are 3 MiB of vertices and
/// 1.5 MiB of indices (the 1.12 GB snapshot's stacked view drew millions in one mesh, some
/// hundred MB of the tab's memory while it was made).
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
const GLOW_BATCH_QUADS: usize = 1 << 16;

/// The quads `range` of `set` in `rect` as flat-coloured triangles (points), handed to
/// `draw` at most `batch` quads at a time: the triangles of [`quads_mesh`], in its order.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
fn quads_batches(
    rect: Rect,
    ppp: f32,
    set: &QuadSet,
    range: std::ops::Range<u32>,
    transform: Transform,
    batch: usize,
    draw: &mut dyn FnMut(&[MeshVertex], &[u32]),
) {
    let room = batch.min(set.len()).max(1);
    let mut vertices: Vec<MeshVertex> = Vec::with_capacity(4 * room);
    let mut indices: Vec<u32> = Vec::with_capacity(6 * room);
    quad_rects(rect, ppp, set, range, transform, |r, color| {
        let base = vertices.len() as u32;
        let color = color.to_array();
        for p in [
            r.left_top(),
            r.right_top(),
            r.left_bottom(),
            r.right_bottom(),
        ] {
            vertices.push(MeshVertex {
                pos: [p.x, p.y],
                color,
            });
        }
        indices.extend([base, base + 1, base + 2, base + 2, base + 1, base + 3]);
        if vertices.len() >= 4 * batch {
            draw(&vertices, &indices);
            vertices.clear();
            indices.clear();
        }
        true
    });
    if !indices.is_empty() {
        draw(&vertices, &indices);
    }
}

/// Most quads the CPU fallback draws per view.
pub const CPU_QUAD_LIMIT: usize = 100_000;

/// Fills `rect` with `color`: through the quad pipeline when it is installed (layer
/// `layer`), else as an egui rectangle. Big flat backgrounds go this way because egui's own
/// fragment shader is far dearer per pixel on a software rasterizer (`SwiftShader` runs both
/// sides of its texture-filtering branch for every pixel), and a plot background covers a
/// large part of the window.
pub fn fill_rect(painter: &egui::Painter, rect: Rect, color: Color32, wgpu: bool, layer: u64) {
    if !wgpu {
        painter.rect_filled(rect, 0.0, color);
        return;
    }
    let ppp = painter.ctx().pixels_per_point();
    let size_px = [rect.width() * ppp, rect.height() * ppp];
    let t = Transform::new([0.0, 0.0], size_px, size_px);
    FILLS.with(|f| {
        let mut f = f.borrow_mut();
        let set = f
            .entry(color.to_array())
            .or_insert_with(|| QuadSet::new(vec![Quad::new(0.0, 0.0, 1.0, 1.0, color)]));
        paint_quads(painter, rect, true, layer, set, 0..1, t);
    });
}

thread_local! {
    /// One unit quad per fill colour, so a fill's GPU buffer is written once.
    static FILLS: std::cell::RefCell<HashMap<[u8; 4], QuadSet>> = std::cell::RefCell::new(HashMap::new());
}

/// Layer ids of the flat fills (plot backgrounds), apart from every view's quad layers.
pub const LAYER_FILLS: u64 = 1 << 40;

#[cfg(test)]
mod tests {
    use super::wgpu::naga;
    use super::{MeshVertex, Quad, QuadSet, QuadSource, Transform};
    use egui::{Color32, Rect, pos2};

    /// Quads made on demand: quad `i` a bar at `i` of height `i % 7`, some off the view.
    struct Bars(usize);

    impl QuadSource for Bars {
        fn len(&self) -> usize {
            self.0
        }
        fn quad(&self, i: usize) -> Quad {
            let x = i as f32 * 0.37 - 3.0;
            Quad::new(
                x,
                0.0,
                x + 0.2,
                (i % 7) as f32,
                Color32::from_rgb(i as u8, 7, (i >> 8) as u8),
            )
        }
    }

    /// Glow's batches are the CPU fallback's mesh, cut at batch boundaries, for quads held
    /// or made: the same triangles in the same order, never more than a batch at a time.
    #[test]
    fn glow_batches_are_the_cpu_mesh_in_pieces_held_or_made() {
        let made = QuadSet::made(std::sync::Arc::new(Bars(1000)));
        let held = QuadSet::new(made.to_vec(0..1000));
        assert_eq!(held.held().map(<[Quad]>::len), Some(1000));
        assert!(made.held().is_none());
        let rect = Rect::from_min_max(pos2(10.0, 20.0), pos2(210.0, 120.0));
        let mut t = Transform::new([0.0, 6.0], [2.5, -12.0], [400.0, 200.0]);
        t.min_px = [1.5, 0.0];
        for (set, range) in [(&made, 0..1000), (&held, 0..1000), (&made, 17..513)] {
            let mesh = super::quads_mesh(rect, 2.0, set, range.clone(), t, usize::MAX);
            assert!(mesh.vertices.len() > 400, "most bars in view");
            for batch in [1, 7, 64, 4096] {
                let (mut vertices, mut indices) = (Vec::<MeshVertex>::new(), Vec::new());
                let mut calls = 0;
                super::quads_batches(rect, 2.0, set, range.clone(), t, batch, &mut |v, i| {
                    assert!(v.len() <= 4 * batch && i.len() == v.len() / 4 * 6);
                    let base = vertices.len() as u32;
                    indices.extend(i.iter().map(|k| k + base));
                    vertices.extend_from_slice(v);
                    calls += 1;
                });
                assert_eq!(calls, mesh.vertices.len().div_ceil(4 * batch));
                assert_eq!(indices, mesh.indices);
                let want: Vec<MeshVertex> = mesh
                    .vertices
                    .iter()
                    .map(|v| MeshVertex {
                        pos: [v.pos.x, v.pos.y],
                        color: v.color.to_array(),
                    })
                    .collect();
                assert_eq!(vertices, want);
            }
        }
        // The CPU fallback's limit stops early, made or held alike.
        let capped = super::quads_mesh(rect, 2.0, &made, 0..1000, t, 10);
        assert_eq!(capped.vertices.len(), 40);
        assert_eq!(
            super::quads_mesh(rect, 2.0, &held, 0..1000, t, 10).vertices,
            capped.vertices
        );
    }

    /// Both shaders parse and validate as the GPU's WGSL front end does (a broken shader
    /// would otherwise show only when a window or the browser creates the pipeline).
    #[test]
    fn the_shaders_are_valid_wgsl_with_their_entry_points() {
        for (source, entries) in [
            (super::SHADER, &["vs_main", "vs_mesh", "fs_main"][..]),
            (super::BLIT_SHADER, &["vs_blit", "fs_blit"][..]),
        ] {
            let module = naga::front::wgsl::parse_str(source).expect("parses");
            naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::empty(),
            )
            .validate(&module)
            .expect("validates");
            let names: Vec<&str> = module
                .entry_points
                .iter()
                .map(|e| e.name.as_str())
                .collect();
            assert_eq!(names, entries);
        }
    }
}
