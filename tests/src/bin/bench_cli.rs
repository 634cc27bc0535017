//! The CLI against `CPython`'s `pickle.loads` on the same snapshot, in the same run:
//! `allocsim replay FILE` (read, decode, trace build and validation, PyTorch replay) and
//! `allocsim recommend FILE`, whole processes timed by wall clock, with their peak RSS
//! (`VmHWM`, sampled every 5 ms until the process ends); `pickle.loads` timed inside
//! Python on the uncompressed bytes (reading and gunzip excluded).
//!
//! Usage: `bench_cli ALLOCSIM FILE... [--workload SPEC]... [--runs N] [--no-recommend]`
//! (release builds). `--workload SPEC` benchmarks the synthetic workload written as the
//! snapshot PyTorch's recorder would have made of it (`gen_snapshot --workload`), in the
//! temporary directory.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let allocsim = args.next().ok_or_else(|| {
        anyhow::anyhow!("usage: bench_cli ALLOCSIM FILE... [--workload SPEC]... [--runs N]")
    })?;
    let (mut files, mut runs, mut recommend) = (Vec::new(), 3usize, true);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => {
                runs = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--runs needs a count"))?
                    .parse()?;
            }
            "--no-recommend" => recommend = false,
            "--workload" => {
                let spec = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--workload needs a SPEC"))?;
                let file: String = spec
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect();
                let path = std::env::temp_dir().join(format!("bench_cli_{file}.pickle"));
                let w = allocsim_tests::generate::write_workload(&spec, &path)?;
                println!(
                    "workload {spec}: {} entries, written to {}",
                    w.entries,
                    path.display()
                );
                files.push(path.display().to_string());
            }
            _ => files.push(a),
        }
    }
    println!(
        "machine: {} cores, load average {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    for f in &files {
        let size = std::fs::metadata(f)
            .map_err(|e| anyhow::anyhow!("{f}: {e}"))?
            .len();
        println!("{f}: {size} bytes on disk");
        let (py, py_rss) = pickle_loads(f, runs)?;
        println!(
            "  CPython pickle.loads: best {:.2} s of {runs}, peak RSS {:.0} MB",
            py.as_secs_f64(),
            mb(py_rss)
        );
        let (t, rss) = best_of(runs, &allocsim, &["replay", f])?;
        println!(
            "  allocsim replay: best {:.2} s of {runs}, peak RSS {:.0} MB = {:.2}x pickle.loads (target <= 0.5x)",
            t.as_secs_f64(),
            mb(rss),
            t.as_secs_f64() / py.as_secs_f64()
        );
        if recommend {
            let (t, rss) = best_of(runs, &allocsim, &["recommend", f])?;
            println!(
                "  allocsim recommend: best {:.2} s of {runs}, peak RSS {:.0} MB = {:.2}x pickle.loads (target <= 5x)",
                t.as_secs_f64(),
                mb(rss),
                t.as_secs_f64() / py.as_secs_f64()
            );
        }
    }
    Ok(())
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Best wall time of `runs` runs of the command, and the largest peak RSS seen.
fn best_of(runs: usize, program: &str, args: &[&str]) -> anyhow::Result<(Duration, u64)> {
    let (mut best, mut rss) = (Duration::MAX, 0u64);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("{program}: {e}"))?;
        let mut peak = 0u64;
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            peak = peak.max(vm_hwm(child.id()).unwrap_or(0));
            std::thread::sleep(Duration::from_millis(5));
        };
        let dt = t.elapsed();
        // Exit 1 is a verdict (an OOM, a divergence), not a failure to run.
        if !matches!(status.code(), Some(0 | 1)) {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                std::io::Read::read_to_string(&mut e, &mut err)?;
            }
            anyhow::bail!("{program} {}: {status}: {err}", args.join(" "));
        }
        best = best.min(dt);
        rss = rss.max(peak);
    }
    Ok((best, rss))
}

/// `VmHWM` of a process, in bytes.
fn vm_hwm(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Best time of `pickle.loads` over `runs` runs in one Python process, and its peak RSS.
fn pickle_loads(file: &str, runs: usize) -> anyhow::Result<(Duration, u64)> {
    let script = r"
import gzip, pickle, resource, sys, time
raw = open(sys.argv[1], 'rb').read()
data = gzip.decompress(raw) if raw[:2] == b'\x1f\x8b' else raw
del raw
best = None
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); obj = pickle.loads(data); dt = time.perf_counter() - t
    del obj
    best = dt if best is None or dt < best else best
print(best, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
";
    let out = Command::new("python3")
        .args(["-c", script, file, &runs.max(1).to_string()])
        .output()
        .map_err(|e| anyhow::anyhow!("python3: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    let secs: f64 = it.next().unwrap_or("nan").parse()?;
    let rss: u64 = it.next().unwrap_or("0").parse()?;
    Ok((Duration::from_secs_f64(secs), rss))
}
