//! Opening a snapshot file in the app, headless (an egui context, no GPU: the wgpu paint
//! callbacks are emitted, nothing draws them), as File > Open does: the engine thread
//! reads the file in pieces, decodes it, builds the trace, replays it, and the first
//! full frame shows the timeline of the whole trace and the memory map at an event.
//! Prints when the recorded timeline is drawn, the first full frame (the main
//! configuration's replay and its layout), the bands stacked, every configuration
//! replayed, the RSS as each stage begins, the longest frame, and the process's peak RSS.
//!
//! `cargo bench -p allocsim-app --bench open -- FILE` (release build; on the GPU machine:
//! `cargo build --release -p allocsim-app --benches` and run the `open-*` binary under
//! `target/release/deps/` with FILE).

mod common;

use std::time::{Duration, Instant};

use allocsim_app::gui::AllocsimApp;
use allocsim_app::gui::io::EngineHandle;
use allocsim_core::capacity::CapacityArg;

/// The process's peak resident set (`VmHWM`), in bytes (Linux; 0 elsewhere).
fn peak_rss() -> u64 {
    status_bytes("VmHWM:")
}

/// A size field of `/proc/self/status` (`VmHWM:`, `VmRSS:`), in bytes.
fn status_bytes(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// CPU time of the whole process so far (user + system, every thread), in seconds:
/// on a loaded machine it tells the work from the waiting (Linux; 0 elsewhere).
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0)
}

fn main() {
    let Some(path) = std::env::args().skip(1).find(|a| a != "--bench") else {
        eprintln!("usage: open FILE (a PyTorch memory snapshot)");
        std::process::exit(2);
    };
    let path = std::path::PathBuf::from(path);
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    let ctx = egui::Context::default();
    let mut app = AllocsimApp::with_engine(EngineHandle::spawn(&ctx), true);
    let before = peak_rss();
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    // When the resident set is highest: sampled every 5 ms beside the frames (`VmHWM`
    // says how high, not when), so the stage that holds the peak can be told.
    let sampler_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = sampler_done.clone();
        std::thread::spawn(move || {
            let mut top = (0u64, 0.0f64);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let rss = status_bytes("VmRSS:");
                if rss > top.0 {
                    top = (rss, t.elapsed().as_secs_f64());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            top
        })
    };
    app.open_path(path.clone(), CapacityArg::AsRecorded, &[]);
    // The resident set as each stage begins (the status line's text changes).
    let mut stages: Vec<(String, f64, u64)> = Vec::new();
    let mark = |what: &str, stages: &mut Vec<(String, f64, u64)>| {
        stages.push((
            what.to_string(),
            t.elapsed().as_secs_f64(),
            status_bytes("VmRSS:"),
        ));
    };
    let (mut recorded, mut full, mut bands, mut all) = (None, None, None, None);
    let mut pacer = common::Pacer::new(&ctx);
    let mut frames = 0u32;
    // Frames drawn before the first full frame, and their time (the UI's share of the
    // CPU while the engine opens the file).
    let mut before_full = (0u32, Duration::ZERO);
    // The longest frame and when it began.
    let mut longest = (Duration::ZERO, 0.0);
    // Until every configuration is replayed and the bands are stacked.
    while all.is_none() || bands.is_none() {
        // As eframe does: a frame when one is due (`common::Pacer`), at most one per
        // display refresh (60 Hz), else the window sleeps.
        if !pacer.due() {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let f = Instant::now();
        let began = t.elapsed().as_secs_f64();
        let out = ctx.run_ui(common::window_input(), |ui| app.ui(ui));
        pacer.drawn(&out);
        std::hint::black_box(ctx.tessellate(out.shapes, out.pixels_per_point));
        if f.elapsed() > longest.0 {
            longest = (f.elapsed(), began);
        }
        frames += 1;
        if full.is_none() {
            before_full.0 += 1;
            before_full.1 += f.elapsed();
        }
        let stage = app
            .progress()
            .map(|(s, _)| s.split(" (").next().unwrap_or(s).to_string());
        if let Some(stage) = stage
            && stages.last().is_none_or(|l| l.0 != stage)
        {
            mark(&stage, &mut stages);
        }
        if recorded.is_none() && app.recorded_frame_marked() {
            recorded = Some(t.elapsed());
            mark("the recorded timeline and end state drawn", &mut stages);
        }
        // Asked for once every configuration is on screen, then answered.
        if bands.is_none()
            && app
                .document()
                .is_some_and(|d| d.bands_asked && d.bands_job.is_none())
        {
            bands = Some(t.elapsed());
            mark("the bands stacked", &mut stages);
        }
        if full.is_none() && app.full_frame_marked() {
            full = Some((t.elapsed(), cpu_seconds() - cpu0));
            mark("first full frame (main replay + its layout)", &mut stages);
        }
        if all.is_none() && app.first_frame_marked() {
            all = Some((t.elapsed(), cpu_seconds() - cpu0));
            mark("every configuration's layout drawn", &mut stages);
        }
        if !app.errors.is_empty() {
            eprintln!("{}: {}", path.display(), app.errors.join("; "));
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_secs_f64(1.0 / 60.0).saturating_sub(f.elapsed()));
    }
    let (all, cpu) = all.unwrap_or_default();
    sampler_done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (top_rss, top_at) = sampler.join().unwrap_or_default();
    let end_rss = status_bytes("VmRSS:");
    let doc = app.document().expect("opened");
    println!(
        "{}: {size} bytes, {} events in all, {} ops on device {}",
        path.display(),
        doc.trace
            .devices
            .iter()
            .map(|d| u64::from(d.0))
            .sum::<u64>(),
        doc.trace.ops.len(),
        doc.trace.device,
    );
    let secs = |d: Option<Duration>| {
        d.map_or("not seen".to_string(), |d| {
            format!("{:.2} s", d.as_secs_f64())
        })
    };
    println!("recorded timeline + end state drawn: {}", secs(recorded));
    // What the UI holds at the end, by owner (heap bytes, exact; the engine's trace,
    // outcomes and checkpoints are `bench_memory`'s).
    let mb = |b: usize| b as f64 / 1e6;
    println!(
        "the UI holds: ops table {:.0} MB (shared with the engine), stack's top {:.0} MB (made once the stacked view is shown), bands {:.0} MB ({} pieces), replays {}",
        mb(doc.trace.ops.heap_bytes()),
        mb(doc
            .stack_top_made()
            .map_or(0, allocsim_app::gui::envelope::Envelope::heap_bytes)),
        mb(doc.trace.bands.pieces.capacity()
            * std::mem::size_of::<allocsim_app::engine::wire::BandPiece>()),
        doc.trace.bands.pieces.len(),
        doc.slots
            .iter()
            .filter_map(|s| Some(format!(
                "{} {:.0} MB",
                s.spec,
                mb(s.replay.as_ref()?.heap_bytes())
            )))
            .collect::<Vec<_>>()
            .join(", "),
    );
    match full {
        Some((d, c)) => println!(
            "first full frame (the whole trace's timeline + the memory map at an event, main replay): {:.2} s, CPU {c:.2} s in all threads; {} frames before it, {:.2} s of frame time",
            d.as_secs_f64(),
            before_full.0,
            before_full.1.as_secs_f64()
        ),
        None => println!("first full frame: not seen"),
    }
    println!("bands stacked: {}", secs(bands));
    println!(
        "every configuration replayed, its layout drawn: {:.2} s, CPU {cpu:.2} s in all threads ({frames} frames, the longest {:.0} ms from {:.2} s)",
        all.as_secs_f64(),
        longest.0.as_secs_f64() * 1e3,
        longest.1
    );
    for (stage, at, rss) in &stages {
        println!("  at {at:6.2} s, RSS {:.2} GB: {stage}", *rss as f64 / 1e9);
    }
    // The stage the sampled peak fell in: the last one begun before it.
    let during = stages
        .iter()
        .rev()
        .find(|s| s.1 <= top_at)
        .map_or("opening", |s| s.0.as_str());
    println!(
        "peak RSS: {:.2} GB (before opening: {:.2} GB); sampled every 5 ms: {:.2} GB at {top_at:.2} s, during \"{during}\"; at the end {:.2} GB",
        peak_rss() as f64 / 1e9,
        before as f64 / 1e9,
        top_rss as f64 / 1e9,
        end_rss as f64 / 1e9,
    );
}
