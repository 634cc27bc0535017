//! Benchmark: replay speed of the PyTorch model (events/s), and decode + replay of a
//! snapshot against `CPython`'s `pickle.loads` of the same bytes, in the same run.
//!
//! `cargo run --release -p allocsim-tests --bin bench_replay [-- FILE.pickle.gz]`

use std::io::Read;
use std::time::Instant;

use allocsim_core::models::ModelSpec;
use allocsim_core::replay::ReplayOptions;
use allocsim_core::session;

#[allow(clippy::many_single_char_names, clippy::similar_names)] // t, d, r, opts: time, device, result, options
fn main() -> anyhow::Result<()> {
    let path = allocsim_tests::bench_trace(std::env::args().nth(1).map(Into::into));
    let Some(path) = path else {
        println!("skipped: no trace (pass a FILE or provide ../shared/traces)");
        return Ok(());
    };
    let gz = std::fs::read(&path)?;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw)?;
    println!(
        "file: {} ({} bytes uncompressed)",
        path.display(),
        raw.len()
    );

    // Replay only (trace already built), several rounds, best and median.
    let v = session::load(&raw, None)?;
    let d = v.trace.busiest_device();
    let events = v.trace.devices[d].events;
    let ops = v.trace.devices[d].ops.len();
    let spec = ModelSpec::parse("pytorch").map_err(anyhow::Error::msg)?;
    let mut times = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let opts = ReplayOptions {
            checkpoint_every: 0,
            keep_timeline: false,
            ..ReplayOptions::default()
        };
        let r = session::replay_device(&v.trace, d, &spec, None, opts)?;
        times.push(t.elapsed().as_secs_f64());
        assert!(r.ops_done == ops);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "replay (pytorch, no timeline): {events} events / {ops} ops, best {:.1} ms = {:.1} M events/s, median {:.1} ms = {:.1} M events/s",
        times[0] * 1e3,
        events as f64 / times[0] / 1e6,
        times[3] * 1e3,
        events as f64 / times[3] / 1e6
    );
    let t = Instant::now();
    let opts = ReplayOptions::default();
    let _ = session::replay_device(&v.trace, d, &spec, None, opts)?;
    let full = t.elapsed().as_secs_f64();
    println!(
        "replay with timeline and checkpoints: {:.1} ms = {:.1} M events/s",
        full * 1e3,
        events as f64 / full / 1e6
    );

    // Decode + trace building (validation pass) + replay, vs CPython's pickle.loads.
    let mut ours = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let v = session::load(&raw, None)?;
        let opts = ReplayOptions {
            checkpoint_every: 0,
            keep_timeline: false,
            ..ReplayOptions::default()
        };
        let _ = session::replay_device(&v.trace, d, &spec, None, opts)?;
        ours.push(t.elapsed().as_secs_f64());
    }
    ours.sort_by(f64::total_cmp);
    let tmp = std::env::temp_dir().join("allocsim-bench-raw.pickle");
    std::fs::write(&tmp, &raw)?;
    let py = std::process::Command::new("python3")
        .arg("-c")
        .arg("import pickle,sys,time\nb=open(sys.argv[1],'rb').read()\nbest=9e9\nfor _ in range(3):\n t=time.perf_counter(); pickle.loads(b); best=min(best,time.perf_counter()-t)\nprint(best)")
        .arg(&tmp)
        .output();
    let _ = std::fs::remove_file(&tmp);
    match py {
        Ok(o) if o.status.success() => {
            let s: f64 = String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse()
                .unwrap_or(f64::NAN);
            println!(
                "decode + validate + replay: {:.1} ms; CPython pickle.loads alone: {:.1} ms ({:.1}x faster)",
                ours[0] * 1e3,
                s * 1e3,
                s / ours[0]
            );
        }
        _ => println!("CPython pickle.loads: n/a (python3 not available)"),
    }
    Ok(())
}
