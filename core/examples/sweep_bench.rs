//! `recommend`'s sweep on one thread, the same code natively and in wasm: how much slower
//! a replay is in wasm (the browser's search workers) than natively, and how the parts
//! the browser deals to its two search workers ([`prefix::share`]) weigh.
//!
//! Natively: `cargo run --release -p allocsim-core --example sweep_bench -- FILE
//! CAPACITY_BYTES [ROUNDS] [--parts | --stages]`. In wasm: `cargo build --release -p allocsim-core
//! --example sweep_bench --target wasm32-wasip1`, then `node web/tests/wasi-run.mjs
//! $CARGO_TARGET_DIR/wasm32-wasip1/release/examples/sweep_bench.wasm FILE CAPACITY_BYTES`
//! (V8, as Chromium runs the page's wasm). Prints the decode and each sweep's time; with
//! `--parts`, the first batch's parts for two workers, each timed.

use std::time::Instant;

use allocsim_core::models::ModelSpec;
use allocsim_core::prefix;
use allocsim_core::replay::ReplayResult;
use allocsim_core::trace::Trace;
use allocsim_core::whatif::{InOrder, Sweep, SweptReplay, recommend_with, summary_options};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(file), Some(cap)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: sweep_bench FILE CAPACITY_BYTES [ROUNDS] [--parts]");
        std::process::exit(2);
    };
    let cap: u64 = cap.parse().expect("CAPACITY_BYTES: a number of bytes");
    let rounds: usize = args
        .get(3)
        .filter(|a| !a.starts_with("--"))
        .map_or(1, |r| r.parse().expect("ROUNDS: a number"));
    let bytes = std::fs::read(file).expect("cannot read FILE");
    let t = Instant::now();
    let v = allocsim_core::session::load(&bytes, Some(cap)).expect("cannot load FILE");
    drop(bytes);
    println!("decode and build {:.3} s", t.elapsed().as_secs_f64());
    if args.iter().any(|a| a == "--parts") {
        let mut sweep: Sweep = Sweep::new(&v.trace, 0, Some(cap)).expect("a sweep");
        let specs = sweep.next_batch();
        let (per_worker, _) = replay_dealt(&v.trace, cap, &specs, &mut |k, part, s| {
            let root = part.first().and_then(|&i| specs[i].config.clone());
            println!("part {k}: {} settings, {s:.3} s ({root:?})", part.len());
        });
        println!(
            "dealt in turn, per worker: {:.3} / {:.3} s",
            per_worker[0], per_worker[1]
        );
        return;
    }
    if args.iter().any(|a| a == "--stages") {
        // Each batch of the sweep (the first: every effect; then the named rows whose own
        // replay is not held), its parts for two workers as the page deals them, timed.
        let mut sweep: Sweep = Sweep::new(&v.trace, 0, Some(cap)).expect("a sweep");
        let mut b = 0;
        loop {
            let specs = sweep.next_batch();
            if specs.is_empty() {
                break;
            }
            let (per_worker, results) = replay_dealt(&v.trace, cap, &specs, &mut |_, _, _| {});
            println!(
                "batch {b}: {} settings, per worker {:.3} / {:.3} s",
                specs.len(),
                per_worker[0],
                per_worker[1]
            );
            sweep.give(results).expect("the batch");
            b += 1;
        }
        // The browser's sweep keeps `SweptReplay`s: its answer from the first batch alone.
        let full = sweep.finish().expect("the answer");
        let mut kept: Sweep<SweptReplay> = Sweep::new(&v.trace, 0, Some(cap)).expect("a sweep");
        let mut batches = 0;
        loop {
            let specs = kept.next_batch();
            if specs.is_empty() {
                break;
            }
            if batches > 0 {
                let names: Vec<_> = specs.iter().map(ToString::to_string).collect();
                println!("kept as SweptReplay: batch {batches}: {names:?}");
            }
            let mut results = vec![None; specs.len()];
            prefix::replay_sharing(
                &v.trace,
                0,
                &specs,
                Some(cap),
                summary_options(),
                &mut |i, _, r| results[i] = Some(SweptReplay::from(&r.expect("a replay"))),
            )
            .expect("the replays");
            kept.give(
                results
                    .into_iter()
                    .map(|r| r.expect("every result"))
                    .collect(),
            )
            .expect("the batch");
            batches += 1;
        }
        let kept = kept.finish().expect("the answer");
        let same = kept.tradeoffs
            == full
                .tradeoffs
                .iter()
                .map(SweptReplay::from)
                .collect::<Vec<_>>()
            && kept.default == SweptReplay::from(&full.default);
        println!("kept as SweptReplay: {batches} batch(es), the same trade-off table: {same}");
        return;
    }
    for _ in 0..rounds {
        let t = Instant::now();
        let r = recommend_with(&v.trace, 0, Some(cap), &InOrder, &mut |_, _| {})
            .expect("the sweep failed");
        println!(
            "sweep {:.3} s: best {:?}, {} replayed",
            t.elapsed().as_secs_f64(),
            r.best.config,
            r.candidates_replayed
        );
    }
}

/// `specs` replayed in the parts the page deals its two search workers
/// ([`prefix::share`], in turn: app/src/gui/workers.rs), each part timed and handed to
/// `each(k, part, seconds)`: the seconds per worker, and the results in `specs`' order.
fn replay_dealt(
    trace: &Trace,
    cap: u64,
    specs: &[ModelSpec],
    each: &mut dyn FnMut(usize, &[usize], f64),
) -> ([f64; 2], Vec<ReplayResult>) {
    let mut results = vec![None; specs.len()];
    let mut per_worker = [0.0f64; 2];
    for (k, part) in prefix::share(specs, 2).iter().enumerate() {
        let mine: Vec<_> = part.iter().map(|&i| specs[i].clone()).collect();
        let t = Instant::now();
        prefix::replay_sharing(
            trace,
            0,
            &mine,
            Some(cap),
            summary_options(),
            &mut |i, _, r| results[part[i]] = Some(r.expect("a replay")),
        )
        .expect("the replays");
        let s = t.elapsed().as_secs_f64();
        per_worker[k % 2] += s;
        each(k, part, s);
    }
    let results = results
        .into_iter()
        .map(|r| r.expect("every result"))
        .collect();
    (per_worker, results)
}
