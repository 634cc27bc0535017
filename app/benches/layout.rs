//! The cost of one layout (the memory map at an op) on a trace of over a million ops, at
//! several places in it: what the engine does when the cursor moves (`Request::Layout`:
//! the model rebuilt from the nearest checkpoint, each block linked to its allocation),
//! and the core's `replay::layout_at` alone. A layout should cost the window from its
//! checkpoint (at most `checkpoint_every` ops, or `ops / MAX_CHECKPOINTS` on a trace of
//! over a million) and the blocks it shows, not the trace.
//!
//! `cargo bench -p allocsim-app --bench layout [-- SPEC [REPEATS]]`
//! (default `kvcache:tokens=3000`, 15 repeats per place; seeded, so the same trace every run).

use std::time::{Duration, Instant};

use allocsim_app::engine::Engine;
use allocsim_app::engine::wire::{Request, Response};
use allocsim_core::models::ModelSpec;
use allocsim_core::replay::{self, ReplayOptions};
use allocsim_core::{session, workloads};

/// The configurations the app compares by default.
const SPECS: [&str; 2] = ["pytorch", "pytorch@expandable_segments:True"];

/// Where the layouts are taken, as shares of the trace's ops.
const PLACES: [f64; 5] = [0.001, 0.25, 0.5, 0.75, 0.999];

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let spec = args.next().unwrap_or_else(|| "kvcache:tokens=3000".into());
    let repeats: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(15);

    let mut engine = Engine::new();
    let mut ops = 0usize;
    let mut failed = |r: Response| match r {
        Response::Failed { message, .. } => panic!("{message}"),
        Response::Loaded { trace, .. } => ops = trace.ops.kind.len(),
        _ => {}
    };
    engine.handle(
        Request::Workload {
            job: 1,
            spec: spec.clone(),
        },
        &mut failed,
    );
    for (slot, s) in SPECS.iter().enumerate() {
        engine.handle(
            Request::Replay {
                job: 2,
                slot: slot as u32,
                spec: (*s).to_string(),
                capacity_bytes: None,
            },
            &mut failed,
        );
    }
    println!("{spec}: {ops} ops; {repeats} repeats per place (median, max)");

    // The core's layout_at alone, on a replay of its own of the same (seeded) trace.
    let trace = workloads::generate(&spec).expect("workload");
    let dt = &trace.devices[0];
    for (slot, s) in SPECS.iter().enumerate() {
        let parsed = ModelSpec::parse(s).expect("spec");
        let r = session::replay_device(&trace, 0, &parsed, None, ReplayOptions::default())
            .expect("replay");
        for place in PLACES {
            let op = ((ops as f64 * place) as u32).min(ops as u32 - 1);
            let engine_times = time(repeats, || {
                let mut blocks = 0;
                engine.handle(
                    Request::Layout {
                        job: 3,
                        slot: slot as u32,
                        op,
                    },
                    &mut |r| match r {
                        Response::Layout { layout, .. } => blocks = layout.blocks.len(),
                        Response::Failed { message, .. } => panic!("{message}"),
                        _ => {}
                    },
                );
                std::hint::black_box(blocks);
            });
            let core_times = time(repeats, || {
                let l = replay::layout_at(dt, &r, op as usize + 1).expect("layout");
                std::hint::black_box(l);
            });
            println!(
                "  {s} at op {op} ({:.1} %): engine layout {}, core layout_at {}",
                place * 100.0,
                summary(engine_times),
                summary(core_times),
            );
        }
    }
}

fn time(repeats: usize, mut f: impl FnMut()) -> Vec<Duration> {
    (0..repeats)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn summary(mut v: Vec<Duration>) -> String {
    v.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!("{:.3} / {:.3} ms", ms(v[v.len() / 2]), ms(v[v.len() - 1]))
}
