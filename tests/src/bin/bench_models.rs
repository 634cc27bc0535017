//! Benchmark: `compare` of every model over one trace — replay speed per model in events/s
//! (recorded trace events divided by the replay's time, summary only: no timeline, no
//! checkpoints), best and median of several rounds, plus the whole `compare` call. Both the
//! wall time and the thread's on-CPU time (`/proc/thread-self/schedstat`, Linux) are
//! measured: on a busy machine the CPU time is the fair number.
//!
//! `cargo run --release -p allocsim-tests --bin bench_models [-- FILE | --workload SPEC] [--rounds N] [--only "SPEC;SPEC…"]`
//! (default: `../shared/traces/big_gpt_long_stacks_s9.pickle.gz`).

use std::time::Instant;

/// Nanoseconds this thread has run on a CPU (Linux `schedstat`; `None` elsewhere).
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

use allocsim_core::models::{ModelSpec, kind};
use allocsim_core::{session, whatif};

#[allow(clippy::many_single_char_names)] // d, t, r, … are the usual device, time and result
fn main() -> anyhow::Result<()> {
    let mut file = None;
    let mut workload = None;
    let mut rounds = 7usize;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--rounds needs a number"))?
                    .parse()?;
            }
            "--only" => {
                only = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--only needs a model spec"))?,
                );
            }
            "--workload" => {
                workload = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--workload needs a SPEC"))?,
                );
            }
            _ => file = Some(std::path::PathBuf::from(a)),
        }
    }
    let rounds = rounds.max(1);
    let (name, trace) = if let Some(spec) = workload {
        (
            format!("workload {spec}"),
            allocsim_core::workloads::generate(&spec)?,
        )
    } else {
        let Some(path) = allocsim_tests::bench_trace(file) else {
            println!("skipped: no trace (pass a FILE or provide ../shared/traces)");
            return Ok(());
        };
        let bytes = std::fs::read(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        (
            path.display().to_string(),
            session::load(&bytes, None)?.trace,
        )
    };
    let d = trace.busiest_device();
    let events = trace.devices[d].events;
    let ops = trace.devices[d].ops.len();
    println!("trace: {name}: {events} events, {ops} ops (device {d}), {rounds} rounds");
    println!(
        "{:34} {:>9} {:>9} {:>11} {:>11} {:>10} {:>11} {:>14}",
        "model",
        "wall best",
        "wall med",
        "wall Mev/s",
        "(median)",
        "cpu best",
        "cpu Mev/s",
        "peak reserved"
    );
    let specs: Vec<ModelSpec> = match &only {
        Some(list) => kind::parse_list(list).map_err(anyhow::Error::msg)?,
        None => kind::DEFAULT_COMPARE
            .iter()
            .map(|s| ModelSpec::parse(s))
            .collect::<Result<_, _>>()
            .map_err(anyhow::Error::msg)?,
    };
    let mut slowest = f64::INFINITY;
    // Rounds outside, models inside: a busy machine's slow spells hit every model alike.
    let n = specs.len();
    let mut times = vec![Vec::with_capacity(rounds); n];
    let mut cpu = vec![Vec::with_capacity(rounds); n];
    let mut peak = vec![0; n];
    for _ in 0..rounds {
        for (m, spec) in specs.iter().enumerate() {
            let (t, c) = (Instant::now(), cpu_ns());
            let r = session::replay_device(&trace, d, spec, None, whatif::summary_options())?;
            times[m].push(t.elapsed().as_secs_f64());
            if let (Some(a), Some(b)) = (c, cpu_ns()) {
                cpu[m].push((b - a) as f64 / 1e9);
            }
            anyhow::ensure!(
                r.ops_done == ops,
                "{}: stopped at op {} of {ops}",
                spec.label(),
                r.ops_done
            );
            peak[m] = r.peak_reserved_bytes;
        }
    }
    for (m, spec) in specs.iter().enumerate() {
        times[m].sort_by(f64::total_cmp);
        cpu[m].sort_by(f64::total_cmp);
        let (best, median) = (times[m][0], times[m][times[m].len() / 2]);
        let cpu_best = cpu[m].first().copied().unwrap_or(f64::NAN);
        let rate = |s: f64| events as f64 / s / 1e6;
        slowest = slowest.min(if cpu_best.is_nan() {
            rate(best)
        } else {
            rate(cpu_best)
        });
        println!(
            "{:34} {:>9.1} {:>9.1} {:>11.2} {:>11.2} {:>10.1} {:>11.2} {:>14}",
            spec.label(),
            best * 1e3,
            median * 1e3,
            rate(best),
            rate(median),
            cpu_best * 1e3,
            rate(cpu_best),
            allocsim_core::units::format_size(peak[m])
        );
    }
    let t = Instant::now();
    let results = whatif::compare(&trace, d, &specs, None, &mut |_, _| {})?;
    let all = t.elapsed().as_secs_f64();
    println!(
        "compare of {} configs: {:.1} ms wall ({:.2} M events/s over all replays); slowest model (best CPU time): {slowest:.2} M events/s",
        results.len(),
        all * 1e3,
        (events * results.len()) as f64 / all / 1e6
    );
    Ok(())
}
