//! Benchmark: what a replayed trace keeps in memory (issue 17), by part, counted exactly
//! by a counting global allocator (live heap bytes, not RSS): the decoded snapshot, the
//! trace built from it (what it keeps of the snapshot, its ops), and one PyTorch replay as
//! the app makes it (outcomes, timeline, checkpoints), with the checkpoints bounded and
//! not; and the time of one `layout_at` at 50 % and 99.9 % of the trace in each.
//!
//! `cargo run --release -p allocsim-tests --bin bench_memory [-- FILE [REPEATS]]`
//! (default `big_gpt_long_stacks_s9`; the file is read in pieces, as the app reads it).
//! On `/tmp/big.pickle` run it under `flock /tmp/allocsim-big.lock`.

use std::time::Instant;

use allocsim_core::models::ModelSpec;
use allocsim_core::replay::{self, ReplayOptions};
use allocsim_core::session;
use allocsim_core::snapshot::import::DecodeOptions;
use allocsim_core::snapshot::stream::decode_from;

#[global_allocator]
static GLOBAL: allocsim_app::heap::Counting = allocsim_app::heap::Counting;

fn live() -> usize {
    allocsim_app::heap::live()
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1e6
}

/// Bytes per op, one decimal.
fn per_op(bytes: usize, ops: usize) -> f64 {
    bytes as f64 / ops.max(1) as f64
}

#[allow(clippy::many_single_char_names, clippy::similar_names)] // t, v, d, r, k: time, validation, device, result, op
fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let path = allocsim_tests::bench_trace(args.next().map(Into::into));
    let Some(path) = path else {
        println!("skipped: no trace (pass a FILE or provide ../shared/traces)");
        return Ok(());
    };
    let repeats: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(15);
    let len = std::fs::metadata(&path)?.len();
    println!("file: {} ({len} bytes)", path.display());

    let base = live();
    let t = Instant::now();
    let snap = decode_from(
        &mut || std::fs::File::open(&path),
        len,
        DecodeOptions::default(),
        4 << 20,
        &mut |_| true,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let decoded = live() - base;
    let entries: usize = snap.device_traces.iter().map(Vec::len).sum();
    println!(
        "decoded in {:.2} s: RawSnapshot {:.1} MB ({entries} entries, {:.1} bytes an entry)",
        t.elapsed().as_secs_f64(),
        mb(decoded),
        per_op(decoded, entries)
    );
    let t = Instant::now();
    let _ = allocsim_app::heap::restart_peak();
    let v = allocsim_core::build::build(snap, None)?;
    let built = live() - base;
    let d = v.trace.busiest_device();
    let dt = &v.trace.devices[d];
    let ops = dt.ops.len();
    let ops_bytes = dt.ops.capacity() * std::mem::size_of::<allocsim_core::trace::Op>();
    println!(
        "built in {:.2} s (peak {:.1} MB while building): the trace and its report {:.1} MB; its ops {:.1} MB ({ops} ops, {} bytes an op); the rest (what it keeps of the snapshot, segment events, start state) {:.1} MB",
        t.elapsed().as_secs_f64(),
        mb(allocsim_app::heap::peak() - base),
        mb(built),
        mb(ops_bytes),
        std::mem::size_of::<allocsim_core::trace::Op>(),
        mb(built - ops_bytes),
    );

    let spec = ModelSpec::parse("pytorch").map_err(anyhow::Error::msg)?;
    // What keeping the outcomes and the timeline costs in time: best of 5 each.
    for (what, keep_timeline) in [("summary only", false), ("outcomes and timeline", true)] {
        let opts = ReplayOptions {
            checkpoint_every: 0,
            keep_timeline,
            ..ReplayOptions::default()
        };
        let best = (0..5)
            .map(|_| {
                let t = Instant::now();
                let r = session::replay_device(&v.trace, d, &spec, None, opts);
                std::hint::black_box(r.map_or(0, |r| r.ops_done));
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        println!(
            "replay, {what}, no checkpoints: best of 5 {:.1} ms",
            best * 1e3
        );
    }
    for (what, max_checkpoints) in [
        (
            "at most MAX_CHECKPOINTS checkpoints",
            replay::MAX_CHECKPOINTS,
        ),
        ("a checkpoint every 4,096 ops, no limit", 0),
    ] {
        let opts = ReplayOptions {
            max_checkpoints,
            ..ReplayOptions::default()
        };
        let before = live();
        let t = Instant::now();
        let r = session::replay_device(&v.trace, d, &spec, None, opts)?;
        let secs = t.elapsed().as_secs_f64();
        let whole = live() - before;
        let outcomes = r.outcomes.capacity_bytes();
        let timeline = r.timeline.capacity_bytes();
        let checkpoints = whole - outcomes - timeline;
        println!(
            "replay (pytorch, {what}) in {secs:.2} s: {:.1} MB = {:.1} bytes an op: outcomes {:.1} MB ({:.1} B/op), timeline {:.1} MB ({:.1} B/op), {} checkpoints and the rest {:.1} MB ({:.1} KB a checkpoint)",
            mb(whole),
            per_op(whole, ops),
            mb(outcomes),
            per_op(outcomes, ops),
            mb(timeline),
            per_op(timeline, ops),
            r.checkpoints.len(),
            mb(checkpoints),
            checkpoints as f64 / r.checkpoints.len().max(1) as f64 / 1e3,
        );
        for place in [0.5, 0.999] {
            let k = ((ops as f64 * place) as usize).min(ops);
            let mut times: Vec<f64> = (0..repeats)
                .map(|_| {
                    let t = Instant::now();
                    let l = replay::layout_at(dt, &r, k).expect("a checkpoint at op 0");
                    std::hint::black_box(l);
                    t.elapsed().as_secs_f64()
                })
                .collect();
            times.sort_by(f64::total_cmp);
            println!(
                "  layout_at {:.1} % (op {k}): median {:.2} ms, max {:.2} ms",
                place * 100.0,
                times[times.len() / 2] * 1e3,
                times[times.len() - 1] * 1e3
            );
        }
    }
    Ok(())
}
