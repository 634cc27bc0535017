//! The whole-file pickle decode serially against on several threads
//! (`allocsim_core::snapshot::pickle::decode_with_threads`): wall and process on-CPU time
//! of each, and whether the two snapshots are the same (a digest of their `Debug` text,
//! which holds every table in its numbering).
//!
//! Usage: `bench_parallel FILE [THREADS...]` (release build; an uncompressed pickle; the
//! whole file is read into memory first). Default threads: 1, 2, 4, 8.

use std::hash::{DefaultHasher, Hasher};
use std::time::Instant;

use allocsim_core::snapshot::pickle::decode_with_threads;

/// Formats into a hash, never holding the text.
struct Digest(DefaultHasher);

impl std::fmt::Write for Digest {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

fn process_cpu_s() -> f64 {
    // utime and stime, fields 14 and 15 of /proc/self/stat, in clock ticks (100 a second).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let u: f64 = f.get(11)?.parse().ok()?;
            let k: f64 = f.get(12)?.parse().ok()?;
            Some((u + k) / 100.0)
        })
        .unwrap_or(0.0)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: bench_parallel FILE [THREADS...]"))?;
    let mut threads: Vec<usize> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if threads.is_empty() {
        threads = vec![1, 2, 4, 8];
    }
    let data = std::fs::read(&path)?;
    println!("{path}: {} bytes", data.len());
    let mut serial_digest = None;
    for t in std::iter::once(0).chain(threads) {
        let (cpu, wall) = (process_cpu_s(), Instant::now());
        let (snap, chunks) = decode_with_threads(&data, t);
        let snap = snap?;
        let (wall, cpu) = (wall.elapsed().as_secs_f64(), process_cpu_s() - cpu);
        let mut d = Digest(DefaultHasher::new());
        std::fmt::write(&mut d, format_args!("{snap:?}"))?;
        let digest = d.0.finish();
        let entries: usize = snap.device_traces.iter().map(Vec::len).sum();
        drop(snap);
        let same = *serial_digest.get_or_insert(digest) == digest;
        let name = if t == 0 {
            "serial".to_owned()
        } else {
            format!("{t} thread(s)")
        };
        println!(
            "{name:<12} wall {wall:7.3} s  on-CPU {cpu:7.3} s  {chunks:4} chunks  {entries} entries  \
             digest {digest:016x} {}",
            if same { "same" } else { "DIFFERENT" }
        );
        anyhow::ensure!(same, "the snapshot differs from the serial decode's");
    }
    if let Ok(l) = std::fs::read_to_string("/proc/loadavg") {
        println!("load average: {}", l.trim());
    }
    Ok(())
}
