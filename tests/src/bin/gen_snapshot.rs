//! Writes a big snapshot in PyTorch's exact pickle format from a real one's pattern: the
//! longest stretch of its trace that starts and ends in the same allocator state (the same
//! live blocks, pending frees and segments: a training step) is repeated until the file
//! reaches the size asked for, with times shifted so they keep growing; the end state is
//! the real one's (the stretch leaves the state as it found it). `--max-entries M` keeps
//! only the last M entries, as PyTorch's ring buffer does once it wraps.
//!
//! Usage: `gen_snapshot FROM.pickle(.gz) OUT.pickle [--bytes N] [--max-entries M]`
//! (`N` like `1.2GB`; default: the source size). Prints what it wrote.
//!
//! `gen_snapshot --workload SPEC OUT.pickle` writes a synthetic workload
//! (`allocsim_core::workloads`, e.g. `kvcache:tokens=3000`: over a million entries) as the
//! snapshot PyTorch's recorder would have written of it (`allocsim_core::record`: the
//! PyTorch model's decisions under its default config, the end state, the settings).

use std::io::BufWriter;

use allocsim_core::snapshot::write::write_snapshot_streamed;
use allocsim_core::snapshot::{RawEvent, import};
use allocsim_tests::generate::{repeated_entry, steady_window, write_workload};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut from, mut out, mut bytes, mut max_entries) = (None, None, None, None);
    let mut workload = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--workload" => {
                workload = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--workload needs a SPEC"))?,
                );
            }
            "--bytes" => {
                let v = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--bytes needs a size"))?;
                bytes = Some(allocsim_core::units::parse_size(&v).map_err(anyhow::Error::msg)?);
            }
            "--max-entries" => {
                max_entries = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--max-entries needs a count"))?
                        .parse::<usize>()?,
                );
            }
            _ if from.is_none() => from = Some(a),
            _ if out.is_none() => out = Some(a),
            _ => anyhow::bail!("unexpected argument '{a}'"),
        }
    }
    if let Some(spec) = workload {
        // The one file argument is OUT.
        let (Some(out), None) = (from, out) else {
            anyhow::bail!("usage: gen_snapshot --workload SPEC OUT.pickle");
        };
        anyhow::ensure!(
            bytes.is_none() && max_entries.is_none(),
            "--bytes and --max-entries take a FROM snapshot, not --workload"
        );
        let w = write_workload(&spec, std::path::Path::new(&out))?;
        println!(
            "{out}: {} bytes, {} entries on device 0 and {} segments at the end (workload \
             {spec} recorded through PyTorch's default allocator)",
            w.bytes, w.entries, w.segments
        );
        return Ok(());
    }
    let (Some(from), Some(out)) = (from, out) else {
        anyhow::bail!(
            "usage: gen_snapshot FROM.pickle(.gz) OUT.pickle [--bytes N] [--max-entries M]"
        );
    };
    let file = std::fs::read(&from).map_err(|e| anyhow::anyhow!("{from}: {e}"))?;
    let plain = if import::is_gzip(&file) {
        import::gunzip(
            &file,
            import::DecodeOptions::default().max_decompressed_bytes,
        )?
    } else {
        file
    };
    let snap = import::decode_plain(&plain).map_err(|e| anyhow::anyhow!("{from}: {e}"))?;
    let device = (0..snap.device_traces.len())
        .max_by_key(|&d| snap.device_traces[d].len())
        .ok_or_else(|| anyhow::anyhow!("{from}: no device trace"))?;
    let events = &snap.device_traces[device];
    let (a, b) = steady_window(events)
        .ok_or_else(|| anyhow::anyhow!("{from}: no stretch that returns to its start state"))?;
    let per_event = plain.len() as f64 / events.len().max(1) as f64;
    let target = bytes.unwrap_or(plain.len() as u64) as f64;
    let repeats = ((target - plain.len() as f64) / (per_event * (b - a) as f64))
        .ceil()
        .max(0.0) as usize;
    let total = events.len() + repeats * (b - a);
    let keep = max_entries.unwrap_or(total).min(total);
    // Entry i of the long trace: the prefix up to b, the window `repeats` times, the rest.
    let at = move |i: usize| repeated_entry(events, (a, b), repeats, i);
    let mut traces = Vec::new();
    for d in 0..snap.device_traces.len() {
        let t = &snap.device_traces[d];
        traces.push(if d == device {
            let it: Box<dyn Iterator<Item = RawEvent>> = Box::new((total - keep..total).map(at));
            (keep, it)
        } else {
            let it: Box<dyn Iterator<Item = RawEvent>> = Box::new(t.iter().copied());
            (t.len(), it)
        });
    }
    let f = std::fs::File::create(&out).map_err(|e| anyhow::anyhow!("{out}: {e}"))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    write_snapshot_streamed(&snap, traces, &mut w).map_err(|e| anyhow::anyhow!("{out}: {e}"))?;
    drop(w);
    let written = std::fs::metadata(&out)?.len();
    println!(
        "{out}: {written} bytes, {keep} entries on device {device} (of {total}: {} from {from}, \
         entries {a}..{b} repeated {repeats} times)",
        events.len()
    );
    Ok(())
}
