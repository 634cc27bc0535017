//! Big snapshots from a real one's pattern, and synthetic workloads as snapshot files
//! (`gen_snapshot`, `bench_cli`, the write tests).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use allocsim_core::snapshot::{Action, RawEvent};

/// Entry `i` of `events` with the stretch `a..b` repeated `repeats` more times after its
/// first pass (times shifted by the stretch's length each time, so they keep growing).
#[must_use]
pub fn repeated_entry(
    events: &[RawEvent],
    (a, b): (usize, usize),
    repeats: usize,
    i: usize,
) -> RawEvent {
    if i < b {
        return events[i];
    }
    let dt = events[b - 1].time_us - events[a].time_us + 1;
    let i = i - b;
    let (e, shift) = if i < repeats * (b - a) {
        (events[a + i % (b - a)], (i / (b - a) + 1) as i64 * dt)
    } else {
        (events[b + i - repeats * (b - a)], repeats as i64 * dt)
    };
    RawEvent {
        time_us: e.time_us + shift,
        ..e
    }
}

/// The longest stretch `a..b` of `events` after which the allocator's state (live blocks,
/// pending frees, segments and mapped ranges: a hash of the set) is what it was before it.
#[must_use]
pub fn steady_window(events: &[RawEvent]) -> Option<(usize, usize)> {
    let hasher = BuildHasherDefault::<DefaultHasher>::default();
    let key = |tag: u8, e: &RawEvent| hasher.hash_one((tag, e.addr, e.size, e.stream));
    let mut state = 0u64;
    let mut first: HashMap<u64, usize> = HashMap::new();
    first.insert(0, 0);
    let mut best: Option<(usize, usize)> = None;
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => state ^= key(b'a', e),
            Action::FreeRequested => state ^= key(b'a', e) ^ key(b'p', e),
            Action::FreeCompleted => state ^= key(b'p', e),
            Action::SegmentAlloc | Action::SegmentFree => state ^= key(b's', e),
            Action::SegmentMap | Action::SegmentUnmap => state ^= key(b'm', e),
            _ => {}
        }
        let start = *first.entry(state).or_insert(i + 1);
        if i + 1 > start && best.is_none_or(|(a, b)| i + 1 - start > b - a) {
            best = Some((start, i + 1));
        }
    }
    best
}

/// What [`write_workload`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub bytes: u64,
    pub entries: usize,
    pub segments: usize,
}

/// Writes the workload `spec` (`allocsim_core::workloads`) at `out` as the snapshot pickle
/// PyTorch's recorder would have written of it (`allocsim_core::record`).
///
/// # Errors
/// A bad SPEC; a file that cannot be written (named).
pub fn write_workload(spec: &str, out: &std::path::Path) -> anyhow::Result<Written> {
    let trace = allocsim_core::workloads::generate(spec)?;
    let snap = allocsim_core::record::record(&trace, 0)?;
    drop(trace);
    let name = out.display();
    let f = std::fs::File::create(out).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    allocsim_core::snapshot::write::write_snapshot(&snap, &mut w)
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    drop(w);
    Ok(Written {
        bytes: std::fs::metadata(out)?.len(),
        entries: snap.device_traces.iter().map(Vec::len).sum(),
        segments: snap.segments.len(),
    })
}
