//! Benchmark: the offline placement (`allocsim_core::offline::place`) on a snapshot or a
//! synthetic workload — trace already built, best and median of 5 rounds.
//!
//! `cargo run --release -p allocsim-tests --bin bench_offline [-- FILE.pickle.gz | --workload SPEC]`

use std::time::Instant;

use allocsim_core::{offline, session, workloads};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (name, trace) = match args.as_slice() {
        [flag, spec] if flag == "--workload" => (
            format!("workload {spec}"),
            workloads::generate(spec).map_err(|e| anyhow::anyhow!("{e}"))?,
        ),
        [file] => (
            file.clone(),
            session::load(&std::fs::read(file)?, None)?.trace,
        ),
        [] => {
            let Some(dir) = allocsim_tests::traces_dir() else {
                println!("skipped: no trace (pass a FILE or provide ../shared/traces)");
                return Ok(());
            };
            let path = dir.join("big_gpt_long_stacks_s9.pickle.gz");
            (
                path.display().to_string(),
                session::load(&std::fs::read(&path)?, None)?.trace,
            )
        }
        _ => anyhow::bail!("usage: bench_offline [FILE | --workload SPEC]"),
    };
    let d = trace.busiest_device();
    let dt = &trace.devices[d];
    let mut times = Vec::new();
    let mut placed = None;
    for _ in 0..5 {
        let t = Instant::now();
        let p = offline::place(dt);
        times.push(t.elapsed().as_secs_f64());
        placed = Some(p);
    }
    let p = placed.expect("five rounds");
    p.check()?;
    times.sort_by(f64::total_cmp);
    println!(
        "{name}: device {d}, {} events, {} ops, {} allocations; live peak {} B, offline peak {} B; place: best {:.3} s, median {:.3} s",
        dt.events,
        dt.ops.len(),
        p.lifetimes.len(),
        p.live_peak_bytes,
        p.peak_bytes,
        times[0],
        times[times.len() / 2]
    );
    Ok(())
}
