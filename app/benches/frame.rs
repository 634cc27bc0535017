//! The CPU cost of one frame of the app while scrubbing a trace of over a million events:
//! the egui pass (every panel, the timeline's envelopes, the memory map's view model),
//! tessellation, and building the instance data of a newly arrived layout. The engine runs
//! on its own thread as in the app, so replays and layout rebuilds are not counted (their
//! latency is reported apart). The GPU work (instance upload, drawing) is not counted
//! either: the wgpu paint callbacks are emitted as in the app but no GPU runs them.
//!
//! `cargo bench -p allocsim-app --bench frame [-- SPEC [FRAMES]]`
//! (default `kvcache:tokens=3000`, 240 frames; seeded, so the same trace every run).

mod common;

use std::time::{Duration, Instant};

use allocsim_app::gui::io::EngineHandle;
use allocsim_app::gui::views::timeline::Mode;
use allocsim_app::gui::{AllocsimApp, Tab};

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let spec = args.next().unwrap_or_else(|| "kvcache:tokens=3000".into());
    let frames: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(240);

    let ctx = egui::Context::default();
    let mut app = AllocsimApp::with_engine(EngineHandle::spawn(&ctx), true);
    let t = Instant::now();
    app.open_workload(&spec, None);
    // One frame: (the whole frame, its tessellation alone); the area egui's own shader
    // covered is kept in `shaded`.
    let shaded = std::cell::Cell::new(0.0f64);
    let frame = |app: &mut AllocsimApp| -> (Duration, Duration) {
        let t = Instant::now();
        let out = ctx.run_ui(common::window_input(), |ui| app.ui(ui));
        let t_tess = Instant::now();
        let prims = ctx.tessellate(out.shapes, out.pixels_per_point);
        let took = (t.elapsed(), t_tess.elapsed());
        shaded.set(shaded_area(&prims));
        std::hint::black_box(prims);
        took
    };
    // Open: generate, replay both configurations, first layouts, the bands.
    while app.document().is_none_or(|d| {
        !d.bands_asked || d.bands_job.is_some() || d.slots.iter().any(|s| s.layout.is_none())
    }) {
        frame(&mut app);
        std::thread::sleep(Duration::from_millis(2));
        assert!(app.errors.is_empty(), "{:?}", app.errors);
    }
    let open = t.elapsed();
    let doc = app.document().expect("opened");
    let ops = doc.trace.ops.len();
    let events = doc.trace.devices.first().map_or(0, |d| d.0);
    let pieces = doc.trace.bands.pieces.len();
    println!(
        "{spec}: {events} events, {ops} ops, {pieces} band pieces; opened (generate, 2 replays, bands, first layouts) in {:.2} s",
        open.as_secs_f64()
    );

    for (mode, tab, label) in [
        (Mode::Metrics, Tab::Map, "metric lines + memory map"),
        (Mode::Bands, Tab::Map, "stacked allocations + memory map"),
        (Mode::Metrics, Tab::Compare, "compare: two maps"),
    ] {
        app.timeline.mode = mode;
        app.tab = tab;
        // The stacked view builds its quads over its first frames (a few ms each): those
        // frames are reported apart, the scrubbing below starts once they are built.
        let mut building = Vec::new();
        while app
            .document()
            .is_some_and(|d| mode == Mode::Bands && !d.bands_complete())
        {
            building.push(frame(&mut app).0);
        }
        report(
            &format!("{label}: frames building the band quads"),
            &mut building,
        );
        let mut all = Vec::new();
        let mut moved = Vec::new();
        let mut ingest = Vec::new();
        let mut tess = Vec::new();
        let mut latency = Vec::new();
        // Scrub across the whole trace, as a drag does: the cursor moves every frame.
        for i in 0..frames {
            let op = ((i as f64 + 0.5) / frames as f64 * ops as f64) as u32;
            app.set_cursor(op);
            let asked = Instant::now();
            let (d, t) = frame(&mut app);
            all.push(d);
            moved.push(d);
            tess.push(t);
            // Frames until the layout at the new cursor arrives (the engine works meanwhile).
            loop {
                let here = app.document().is_some_and(|d| {
                    d.slots
                        .iter()
                        .all(|s| s.layout.as_ref().is_some_and(|l| l.data.op == op))
                });
                if here {
                    latency.push(asked.elapsed());
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
                let (d, t) = frame(&mut app);
                all.push(d);
                ingest.push(d);
                tess.push(t);
            }
        }
        report(&format!("{label}: every frame"), &mut all);
        report(
            &format!("{label}: frames that moved the cursor"),
            &mut moved,
        );
        report(
            &format!("{label}: frames that waited for or took in a new layout"),
            &mut ingest,
        );
        report(&format!("{label}: tessellation alone"), &mut tess);
        println!(
            "  {label}: egui's shader covers {:.2}x the window's pixels (the last frame; the quad pipeline's pixels not counted)",
            shaded.get() / (1600.0 * 1000.0)
        );
        report(
            &format!("{label}: cursor move to its layout on screen"),
            &mut latency,
        );
    }
}

/// The pixels egui's own shader shades in a frame (every triangle of every mesh, cut to
/// its clip rectangle by the share of its bounding box inside it): what a frame costs on a
/// software rasterizer, where that shader is dear per pixel.
fn shaded_area(prims: &[egui::ClippedPrimitive]) -> f64 {
    let mut total = 0.0f64;
    for p in prims {
        let egui::epaint::Primitive::Mesh(mesh) = &p.primitive else {
            continue;
        };
        for tri in mesh.indices.chunks_exact(3) {
            let [a, b, c] = [0, 1, 2].map(|i| mesh.vertices[tri[i] as usize].pos);
            let area = f64::from(((b - a).x * (c - a).y - (b - a).y * (c - a).x).abs()) / 2.0;
            let bb = egui::Rect::from_points(&[a, b, c]);
            let inside = bb.intersect(p.clip_rect);
            if bb.area() > 0.0 && inside.is_positive() {
                total += area * f64::from(inside.area() / bb.area()).min(1.0);
            }
        }
    }
    total
}

fn report(what: &str, v: &mut [Duration]) {
    if v.is_empty() {
        return;
    }
    v.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    println!(
        "  {what}: n={} p50 {:.2} ms, p95 {:.2} ms, max {:.2} ms",
        v.len(),
        ms(p(0.5)),
        ms(p(0.95)),
        ms(v[v.len() - 1])
    );
}
