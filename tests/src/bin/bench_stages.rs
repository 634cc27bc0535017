//! Where `allocsim replay FILE`'s time goes, stage by stage, one thread: the streamed
//! decode's two passes (read in 4 MiB pieces as the CLI reads), `impossible::check`, the
//! backward rebuild of the start state, the forward build (the whole `build::build`, which
//! does the two before again, minus them), and the PyTorch replay as the CLI runs it. Each
//! stage's wall and on-CPU time (this thread's), so a loaded machine can be told apart.
//!
//! Usage: `bench_stages FILE` (release build).

use std::time::Instant;

use allocsim_core::models::pytorch::{PyTorchConfig, PyTorchModel};
use allocsim_core::replay::ReplayOptions;
use allocsim_core::snapshot::import::DecodeOptions;
use allocsim_core::snapshot::stream::{Progress, decode_from};

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: bench_stages FILE"))?;
    let len = std::fs::metadata(&path)?.len();
    let mut stages = Stages::default();
    let mut pass1_end = None;
    let t = Stage::start();
    let mut open = || std::fs::File::open(&path);
    let snap = decode_from(
        &mut open,
        len,
        DecodeOptions::default(),
        4 << 20,
        &mut |p: Progress| {
            if p.pass == 2 && pass1_end.is_none() {
                pass1_end = Some(Stage::start());
            }
            true
        },
    )?;
    match pass1_end {
        Some(mid) => {
            stages.push("read + pre-pass (pass 1)", t.wall_to(&mid), t.cpu_to(&mid));
            let end = Stage::start();
            stages.push(
                "read + machine (pass 2)",
                mid.wall_to(&end),
                mid.cpu_to(&end),
            );
        }
        None => {
            stages.end("decode", &t);
        }
    }
    let entries: usize = snap.device_traces.iter().map(Vec::len).sum();
    let cfg = PyTorchConfig::from_settings(&snap.settings)?;
    let t = Stage::start();
    allocsim_core::impossible::check(&snap)?;
    let check = stages.end("impossible::check", &t);
    let t = Stage::start();
    let busiest = (0..snap.device_traces.len())
        .max_by_key(|&d| snap.device_traces[d].len())
        .unwrap_or(0) as u32;
    allocsim_core::start::rebuild_start(&snap, busiest, &PyTorchModel::new(cfg, None))?;
    let rebuild = stages.end("rebuild_start (backward)", &t);
    let t = Stage::start();
    let v = allocsim_core::build::build(snap, None)?;
    let end = Stage::start();
    stages.push(
        "forward build (build::build minus the two above)",
        t.wall_to(&end) - check.0 - rebuild.0,
        t.cpu_to(&end) - check.1 - rebuild.1,
    );
    let d = v.trace.busiest_device();
    let choice = allocsim_core::session::capacity(
        &v.trace,
        d,
        allocsim_core::capacity::CapacityArg::AsRecorded,
    );
    let t = Stage::start();
    let opts = ReplayOptions {
        checkpoint_every: 0,
        keep_timeline: false,
        ..ReplayOptions::default()
    };
    let spec = allocsim_core::models::ModelSpec::parse("pytorch")?;
    let r = allocsim_core::session::replay_device(&v.trace, d, &spec, choice.bytes, opts)?;
    stages.end("PyTorch replay", &t);
    println!(
        "{path}: {len} bytes, {entries} entries, {} ops, peak reserved {}",
        v.trace.devices[d].ops.len(),
        r.peak_reserved_bytes
    );
    stages.print();
    Ok(())
}

/// A point in time: wall and this thread's CPU.
struct Stage {
    wall: Instant,
    cpu_ns: u64,
}

impl Stage {
    fn start() -> Stage {
        Stage {
            wall: Instant::now(),
            cpu_ns: thread_cpu_ns(),
        }
    }
    fn wall_to(&self, end: &Stage) -> f64 {
        (end.wall - self.wall).as_secs_f64()
    }
    fn cpu_to(&self, end: &Stage) -> f64 {
        end.cpu_ns.saturating_sub(self.cpu_ns) as f64 / 1e9
    }
}

#[derive(Default)]
struct Stages(Vec<(&'static str, f64, f64)>);

impl Stages {
    fn push(&mut self, name: &'static str, wall: f64, cpu: f64) {
        self.0.push((name, wall, cpu));
    }
    /// The stage begun at `t` ends now: its (wall, CPU) seconds.
    fn end(&mut self, name: &'static str, t: &Stage) -> (f64, f64) {
        let end = Stage::start();
        let w = (t.wall_to(&end), t.cpu_to(&end));
        self.push(name, w.0, w.1);
        w
    }
    fn print(&self) {
        let (mut wall, mut cpu) = (0.0, 0.0);
        for (name, w, c) in &self.0 {
            println!("{name:<52} wall {w:7.3} s  on-CPU {c:7.3} s");
            wall += w;
            cpu += c;
        }
        println!("{:<52} wall {wall:7.3} s  on-CPU {cpu:7.3} s", "total");
        if let Ok(l) = std::fs::read_to_string("/proc/loadavg") {
            println!("load average: {}", l.trim());
        }
    }
}

/// This thread's on-CPU time in nanoseconds (0 where /proc does not say).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
