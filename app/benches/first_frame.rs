//! The desktop app's first frames of a real snapshot (issue 17), natively: from opening
//! the file (as File > Open and the command line do: the engine reads it in pieces, the
//! main configuration replayed beside the build; `--bytes`: its bytes handed to the app,
//! as a drop in the browser) to its first frame with the file's recorded timeline and
//! end state (decoded, nothing replayed), to its first full frame (the main configuration
//! replayed, its layout on screen: the "first full frame") and to every
//! configuration replayed with its layout at the cursor; then the layout at another event
//! (a cursor moved by 1/37 of the trace at a time: the frames until the frame that shows
//! its layout), and the process's resident memory grown by the open. The engine runs on
//! its own thread as in the app; frames are the egui pass and tessellation (no GPU: the
//! wgpu callbacks are emitted, nothing draws them). Each run is a fresh app (same
//! process: the allocator's pages of an earlier run may be reused, so RSS growth is given
//! for the first run).
//!
//! `cargo bench -p allocsim-app --bench first_frame [-- FILE… [--runs N] [--bytes]]`
//! (default `../shared/traces/kvcache_decode.pickle.gz`, 3 runs).

mod common;

use std::time::{Duration, Instant};

use allocsim_app::gui::io::EngineHandle;
use allocsim_app::gui::{AllocsimApp, Tab};
use allocsim_core::capacity::CapacityArg;

fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

/// A size field of `/proc/self/status` (`VmRSS:`, `VmHWM:`), in MiB (Linux; 0 elsewhere).
fn status_mib(key: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// "min / median ms (each run)".
fn spread(ms: impl Iterator<Item = f64>) -> String {
    let mut v: Vec<f64> = ms.collect();
    let runs: Vec<f64> = v.iter().map(|x| x.round()).collect();
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    format!("min {min:.0} / median {:.0} ms ({runs:?})", median(&mut v))
}

struct Run {
    recorded_ms: f64,
    main_ms: f64,
    full_ms: f64,
    layouts_ms: Vec<f64>,
    rss_growth_mib: f64,
}

fn one_run(name: &str, path: &str, bytes: Option<&[u8]>) -> Run {
    let ctx = egui::Context::default();
    let mut pacer = common::Pacer::new(&ctx);
    // A frame when one is due (as the app draws them), else false after a short sleep.
    let mut frame = |app: &mut AllocsimApp| {
        if !pacer.due() {
            std::thread::sleep(Duration::from_micros(200));
            return false;
        }
        let out = ctx.run_ui(common::window_input(), |ui| app.ui(ui));
        pacer.drawn(&out);
        std::hint::black_box(ctx.tessellate(out.shapes, out.pixels_per_point));
        true
    };
    let mut app = AllocsimApp::with_engine(EngineHandle::spawn(&ctx), true);
    app.tab = Tab::Map;
    frame(&mut app);
    let rss0 = rss_mib();
    let t = Instant::now();
    match bytes {
        Some(bytes) => app.open_bytes(
            name.to_string(),
            bytes.to_vec(),
            CapacityArg::AsRecorded,
            &[],
        ),
        None => app.open_path(path.into(), CapacityArg::AsRecorded, &[]),
    }
    let (mut recorded, mut main) = (None, None);
    while !app.first_frame_marked() {
        if !frame(&mut app) {
            continue;
        }
        if recorded.is_none() && app.recorded_frame_marked() {
            recorded = Some(t.elapsed());
        }
        if main.is_none() && app.full_frame_marked() {
            main = Some(t.elapsed());
        }
        assert!(app.errors.is_empty(), "{name}: {:?}", app.errors);
    }
    let full = t.elapsed();
    let rss_growth_mib = rss_mib() - rss0;
    let ops = app.document().map_or(0, |d| d.trace.ops.len()) as u32;
    let mut layouts_ms = Vec::new();
    for k in 1..=12u32 {
        let target = (u64::from(ops) * u64::from(k * 3 % 37) / 37) as u32;
        let t = Instant::now();
        app.set_cursor(target);
        // As the key that moves the cursor: a frame at once.
        ctx.request_repaint();
        let want = app.cursor;
        loop {
            frame(&mut app);
            let shown = app
                .document()
                .and_then(|d| d.slots.first())
                .and_then(|s| s.layout.as_ref())
                .is_some_and(|l| l.data.op == want);
            if shown {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        layouts_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Run {
        recorded_ms: recorded.unwrap_or(full).as_secs_f64() * 1e3,
        main_ms: main.unwrap_or(full).as_secs_f64() * 1e3,
        full_ms: full.as_secs_f64() * 1e3,
        layouts_ms,
        rss_growth_mib,
    }
}

fn main() {
    let mut files = Vec::new();
    let mut runs = 3usize;
    let mut in_memory = false;
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(a) = args.next() {
        if a == "--bytes" {
            in_memory = true;
        } else if a == "--runs" {
            runs = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
        } else {
            files.push(a);
        }
    }
    if files.is_empty() {
        files.push(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../shared/traces/kvcache_decode.pickle.gz"
            )
            .into(),
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average before: {}", load.trim());
    for path in files {
        let bytes =
            in_memory.then(|| std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}")));
        let name = std::path::Path::new(&path)
            .file_name()
            .map_or_else(|| path.clone(), |f| f.to_string_lossy().into_owned());
        let all: Vec<Run> = (0..runs)
            .map(|_| one_run(&name, &path, bytes.as_deref()))
            .collect();
        let mut lay: Vec<f64> = all.iter().flat_map(|r| r.layouts_ms.clone()).collect();
        let lay_max = lay.iter().copied().fold(0.0, f64::max);
        println!(
            "{name}: recorded timeline + end state: {}; \
             first full frame (main configuration): {}; \
             every configuration: {}; \
             layout at another event: median {:.1} ms, max {:.1} ms over {} moves; \
             RSS growth from opening (first run) {:.0} MiB; peak RSS of the process {:.0} MiB",
            spread(all.iter().map(|r| r.recorded_ms)),
            spread(all.iter().map(|r| r.main_ms)),
            spread(all.iter().map(|r| r.full_ms)),
            median(&mut lay),
            lay_max,
            lay.len(),
            all[0].rss_growth_mib,
            status_mib("VmHWM:"),
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average after: {}", load.trim());
}
