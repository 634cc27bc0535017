//! Snapshot decoding benchmark: our pickle decoder against `CPython`'s `pickle.loads` on the
//! same uncompressed bytes, plus the decoded snapshot's heap size and the peak RSS.
//!
//! Usage: `bench_decode [FILE.pickle(.gz)] [--iters N] [--skip-python]` (release build). The default file
//! is `../shared/traces/big_gpt_long_stacks_s9.pickle.gz` next to the repository.

use std::process::Command;
use std::time::{Duration, Instant};

use allocsim_core::snapshot::import::{self, DecodeOptions};
use allocsim_core::snapshot::stream;

fn main() -> anyhow::Result<()> {
    let mut path = None;
    let mut iters = 7usize;
    let mut python = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--skip-python" {
            python = false;
        } else if a == "--iters" {
            iters = args
                .next()
                .ok_or_else(|| anyhow::anyhow!("--iters needs a number"))?
                .parse()?;
        } else {
            path = Some(a);
        }
    }
    let path = path.unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/traces/big_gpt_long_stacks_s9.pickle.gz"
        )
        .to_owned()
    });
    let file = std::fs::read(&path).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    let t = Instant::now();
    let plain = if import::is_gzip(&file) {
        import::gunzip(&file, DecodeOptions::default().max_decompressed_bytes)?
    } else {
        file.clone()
    };
    let gunzip_time = t.elapsed();
    let mb = plain.len() as f64 / 1e6;
    println!("file: {path}");
    println!(
        "size: {} bytes on disk, {} bytes uncompressed (gunzip {:.1} ms)",
        file.len(),
        plain.len(),
        ms(gunzip_time)
    );
    let rss_before = proc_status("VmHWM");

    // First run alone, so that the peak RSS reflects one decode.
    let snapshot = import::decode_plain(&plain)?;
    let rss_after = proc_status("VmHWM");
    let heap = snapshot.heap_bytes();
    let events: usize = snapshot.device_traces.iter().map(Vec::len).sum();
    drop(snapshot);

    let mut times = Vec::with_capacity(iters);
    let mut cpu_times = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let cpu = thread_cpu_ns();
        let t = Instant::now();
        let s = import::decode_plain(&plain)?;
        times.push(t.elapsed());
        if let (Some(a), Some(b)) = (cpu, thread_cpu_ns()) {
            cpu_times.push(Duration::from_nanos(b.saturating_sub(a)));
        }
        drop(s);
    }
    times.sort();
    cpu_times.sort();
    let best = times.first().copied().unwrap_or_default();
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    println!(
        "decode_snapshot: best {:.1} ms ({:.0} MB/s), median {:.1} ms ({:.0} MB/s) over {} runs; {events} events",
        ms(best),
        mb / best.as_secs_f64(),
        ms(median),
        mb / median.as_secs_f64(),
        times.len()
    );
    match (cpu_times.first(), cpu_times.get(cpu_times.len() / 2)) {
        (Some(best), Some(median)) => println!(
            "decode_snapshot on-CPU time (excludes waiting for a busy machine): best {:.1} ms ({:.0} MB/s), median {:.1} ms ({:.0} MB/s)",
            ms(*best),
            mb / best.as_secs_f64(),
            ms(*median),
            mb / median.as_secs_f64()
        ),
        _ => println!("decode_snapshot on-CPU time: n/a"),
    }
    // The streamed decode (what the app and the CLI run): the same bytes fed in 4 MiB
    // pieces, twice (pre-pass, then the machine over windows).
    let mut stream_cpu = Vec::with_capacity(iters);
    let mut stream_wall = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let cpu = thread_cpu_ns();
        let t = Instant::now();
        let s = stream::decode_from(
            &mut || Ok(std::io::Cursor::new(plain.as_slice())),
            plain.len() as u64,
            DecodeOptions::default(),
            4 << 20,
            &mut |_| true,
        )?;
        stream_wall.push(t.elapsed());
        if let (Some(a), Some(b)) = (cpu, thread_cpu_ns()) {
            stream_cpu.push(Duration::from_nanos(b.saturating_sub(a)));
        }
        drop(s);
    }
    stream_wall.sort();
    stream_cpu.sort();
    if let (Some(w), Some(c)) = (stream_wall.first(), stream_cpu.first()) {
        println!(
            "streamed decode (4 MiB pieces, two passes): best {:.1} ms wall, {:.1} ms on-CPU ({:.0} MB/s); median on-CPU {:.1} ms",
            ms(*w),
            ms(*c),
            mb / c.as_secs_f64(),
            ms(stream_cpu[stream_cpu.len() / 2])
        );
    }
    println!(
        "RawSnapshot heap: {heap} bytes = {:.2}x the uncompressed file",
        heap as f64 / plain.len() as f64
    );
    println!(
        "peak RSS (VmHWM): {} before decoding (file + uncompressed bytes), {} after the first decode",
        rss_before.as_deref().unwrap_or("n/a"),
        rss_after.as_deref().unwrap_or("n/a")
    );

    if !python {
        return Ok(());
    }
    // CPython reads the same file and times pickle.loads on the same uncompressed bytes.
    let script = r"
import gzip, pickle, sys, time
raw = open(sys.argv[1], 'rb').read()
data = gzip.decompress(raw) if raw[:2] == b'\x1f\x8b' else raw
best = None
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); obj = pickle.loads(data); dt = time.perf_counter() - t
    del obj
    best = dt if best is None or dt < best else best
print(best)
";
    let py_iters = iters.clamp(1, 3).to_string();
    match Command::new("python3")
        .args(["-c", script, &path, &py_iters])
        .output()
    {
        Ok(out) if out.status.success() => {
            let secs: f64 = String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .unwrap_or(f64::NAN);
            println!(
                "CPython pickle.loads: best {:.1} ms ({:.0} MB/s) over {py_iters} runs; ours is {:.2}x faster (best vs best)",
                secs * 1e3,
                mb / secs,
                secs / best.as_secs_f64()
            );
        }
        Ok(out) => println!(
            "CPython pickle.loads: n/a ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => println!("CPython pickle.loads: n/a (python3: {e})"),
    }
    Ok(())
}

/// Nanoseconds this thread has spent on a CPU (`/proc/thread-self/schedstat`), which,
/// unlike wall time, does not grow while other processes hold the CPUs.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A field of `/proc/self/status` (e.g. `VmHWM`), as written there ("123456 kB").
fn proc_status(key: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix(key)?
            .strip_prefix(':')
            .map(|v| v.trim().to_owned())
    })
}
