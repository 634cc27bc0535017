//! Benchmark: `allocsim diff` of a snapshot against itself under another setting, against
//! one replay of it (decode + summary replay, what `allocsim replay` does); and
//! `allocsim ranks` of 8 copies of it against one rank. The two runs of a diff and the
//! ranks run on every core, as the CLI runs them (one job per thread, each taking the
//! next). In-process rounds reuse memory the first round got from the kernel; the CLI's
//! own wall times (a fresh process each) are in the README beside these.
//!
//! `cargo run --release -p allocsim-tests --bin bench_diff_ranks [-- FILE.pickle.gz]`
//! (default: `../shared/traces/big_gpt_long_stacks_s9.pickle.gz`). Targets: diff ≤ 2 × one
//! replay; 8 ranks ≤ 5 × one rank on a 2-core machine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use allocsim_core::diff::{self, Align};
use allocsim_core::models::ModelSpec;
use allocsim_core::ranks::{self, RankOptions};
use allocsim_core::{session, whatif};

/// `job(i)` for `i` in `0..n` on every core, results in order (the CLI's `Threads::map`).
fn par_map<T: Send>(n: usize, job: &(dyn Fn(usize) -> T + Sync)) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let slots: Vec<std::sync::Mutex<&mut Option<T>>> =
        out.iter_mut().map(std::sync::Mutex::new).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.min(n) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let r = job(i);
                    if let Ok(mut slot) = slots[i].lock() {
                        **slot = Some(r);
                    }
                }
            });
        }
    });
    drop(slots);
    out.into_iter().flatten().collect()
}

/// Best and median of `rounds` timings of `f`, in seconds.
fn time(rounds: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<(f64, f64)> {
    let mut t = Vec::new();
    for _ in 0..rounds {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok((t[0], t[t.len() / 2]))
}

fn main() -> anyhow::Result<()> {
    let path = allocsim_tests::bench_trace(std::env::args().nth(1).map(Into::into));
    let Some(path) = path else {
        println!("skipped: no trace (pass a FILE or provide ../shared/traces)");
        return Ok(());
    };
    let bytes = std::fs::read(&path)?;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    println!(
        "file: {} ({} bytes), {cores} cores",
        path.display(),
        bytes.len()
    );
    let own = ModelSpec::parse("pytorch").map_err(anyhow::Error::msg)?;
    let alt = ModelSpec::parse("pytorch@expandable_segments:True").map_err(anyhow::Error::msg)?;

    let (one_best, one_med) = time(5, || {
        let v = session::load(&bytes, None)?;
        let d = v.trace.busiest_device();
        let _ = session::replay_device(&v.trace, d, &own, None, whatif::summary_options())?;
        Ok(())
    })?;
    println!(
        "one replay (decode + replay): best {:.0} ms, median {:.0} ms",
        one_best * 1e3,
        one_med * 1e3
    );
    let specs = [&own, &alt];
    // As `allocsim diff F F --config-b …`: one file decoded once, its two runs in parallel.
    let (diff_best, diff_med) = time(5, || {
        let loaded = session::load(&bytes, None)?;
        let device = loaded.trace.busiest_device();
        let runs = par_map(2, &|i| {
            diff::run("f", &loaded.trace, device, specs[i], None, Align::Time)
        });
        let mut it = runs.into_iter();
        let (Some(before), Some(after)) = (it.next(), it.next()) else {
            anyhow::bail!("a run did not come back");
        };
        let report = diff::diff(before?, after?, Align::Time);
        assert!(!report.summary.is_empty());
        Ok(())
    })?;
    println!(
        "diff against itself under expandable_segments:True: best {:.0} ms, median {:.0} ms = {:.2} × one replay (best), {:.2} × (median); target ≤ 2",
        diff_best * 1e3,
        diff_med * 1e3,
        diff_best / one_best,
        diff_med / one_med
    );

    let opts = RankOptions::default();
    let (rank_best, rank_med) = time(3, || {
        let r = ranks::rank("f", 0, &bytes, &opts)?;
        assert!(r.min_capacity_bytes.is_some());
        Ok(())
    })?;
    println!(
        "one rank (decode, replay, smallest capacity, what-if): best {:.0} ms, median {:.0} ms",
        rank_best * 1e3,
        rank_med * 1e3
    );
    let (eight_best, eight_med) = time(3, || {
        let rows = par_map(8, &|i| ranks::rank("f", i as u32, &bytes, &opts));
        let rows = rows.into_iter().collect::<Result<Vec<_>, _>>()?;
        let rep = ranks::summarize(rows, &opts)?;
        assert_eq!(rep.ranks.len(), 8);
        Ok(())
    })?;
    println!(
        "8 ranks: best {:.0} ms, median {:.0} ms = {:.2} × one rank (best), {:.2} × (median); target ≤ 5 on 2 cores",
        eight_best * 1e3,
        eight_med * 1e3,
        eight_best / rank_best,
        eight_med / rank_med
    );
    Ok(())
}
