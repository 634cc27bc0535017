//! The snapshot writer: what it writes decodes to what it was given (every trace of the
//! repository and of the shared corpus), `CPython`'s pickler writes the very same bytes for
//! the object `pickle.loads` makes of it, and that object equals the real file's; a big
//! snapshot generated from a real one's step pattern, cut to a wrapped ring buffer,
//! replays exactly through the PyTorch model; a synthetic workload written as a snapshot
//! is one `CPython` pickles back byte for byte.

use std::io::Write as _;
use std::process::{Command, Stdio};

use allocsim_core::session;
use allocsim_core::snapshot::write::{snapshot_bytes, write_snapshot_streamed};
use allocsim_core::snapshot::{RawEvent, RawSnapshot, import};
use allocsim_tests::generate::{repeated_entry, steady_window};
use allocsim_tests::{CorpusTrace, corpus, repo_traces};

fn plain(t: &CorpusTrace) -> Vec<u8> {
    let file = std::fs::read(&t.path).unwrap();
    if import::is_gzip(&file) {
        import::gunzip(
            &file,
            import::DecodeOptions::default().max_decompressed_bytes,
        )
        .unwrap()
    } else {
        file
    }
}

/// Every entry, segment and block as text with its stack spelled out (stack ids are the
/// decoder's own numbering).
fn described(s: &RawSnapshot) -> Vec<String> {
    let ev = |e: &RawEvent| {
        format!(
            "{:?} {:?} {} {} {} {} {:?} {} {:?}",
            e.action,
            e.other,
            e.addr,
            e.size,
            e.stream,
            e.time_us,
            s.pool_id(e),
            s.frames.str(e.user_metadata),
            s.frames.format_stack(e.stack)
        )
    };
    let mut out: Vec<String> = s
        .device_traces
        .iter()
        .enumerate()
        .flat_map(|(d, t)| t.iter().map(move |e| (d, e)))
        .map(|(d, e)| format!("device {d}: {}", ev(e)))
        .collect();
    for g in &s.segments {
        out.push(format!(
            "segment {} {} {} {} {} {} {} {:?} {:?} {} {:?}",
            g.device,
            g.address,
            g.total_size,
            g.allocated_size,
            g.active_size,
            g.requested_size,
            g.stream,
            g.segment_type,
            g.segment_pool_id,
            g.is_expandable,
            s.frames.format_stack(g.stack)
        ));
        for b in &g.blocks {
            out.push(format!(
                "block {} {} {} {:?} {:?}",
                b.address,
                b.size,
                b.requested_size,
                b.state,
                s.frames.format_stack(b.stack)
            ));
        }
    }
    let st = &s.settings;
    out.push(format!(
        "settings {:?} {:?} {} {} {:?}",
        st.conf,
        st.max_split_size_bytes,
        st.garbage_collection_threshold,
        st.expandable_segments,
        st.roundup_power2_divisions
    ));
    out
}

#[test]
fn what_we_write_decodes_to_what_was_written() {
    let mut traces = repo_traces();
    traces.extend(corpus());
    assert!(!traces.is_empty());
    for t in &traces {
        // Host memory and FX frame info (2.13 files) are not written.
        let Ok(src) = import::decode_plain(&plain(t)) else {
            continue;
        };
        if !src.host_segments.is_empty() || src.frames.fx_frame_count() > 0 {
            continue;
        }
        let bytes = snapshot_bytes(&src);
        let back = import::decode_plain(&bytes)
            .unwrap_or_else(|e| panic!("{}: what we wrote does not decode: {e}", t.name));
        let (a, b) = (described(&src), described(&back));
        assert_eq!(a.len(), b.len(), "{}", t.name);
        if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
            panic!("{}: item {i}: {} became {}", t.name, a[i], b[i]);
        }
    }
}

/// Runs `script` with `python3`, the snapshot on stdin; `None` when there is no python3.
fn python(script: &str, arg: &str, stdin: &[u8]) -> Option<String> {
    let mut child = Command::new("python3")
        .args(["-c", script, arg])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

/// `CPython` loads what we write; pickling what it loaded gives our bytes back; the
/// device state, traces and settings equal the real file's (argv[1], when given).
const CPYTHON_CHECK: &str = r"
import gzip, pickle, sys
ours = sys.stdin.buffer.read()
obj = pickle.loads(ours)
print('exact' if pickle.dumps(obj, 4) == ours else 'differs')
if sys.argv[1]:
    real = pickle.loads(gzip.open(sys.argv[1]).read())
    for k in ('segments', 'device_traces', 'allocator_settings'):
        print(k, 'equal' if real[k] == obj[k] else 'differs')
";

#[test]
fn cpython_pickles_what_it_reads_of_ours_into_the_same_bytes() {
    let mut traces: Vec<CorpusTrace> = repo_traces();
    traces.extend(corpus());
    let mut checked = 0;
    for t in &traces {
        let p = plain(t);
        if p.len() > 4 << 20 {
            continue;
        }
        let Ok(src) = import::decode_plain(&p) else {
            continue;
        };
        if !src.host_segments.is_empty() || src.frames.fx_frame_count() > 0 {
            continue;
        }
        let ours = snapshot_bytes(&src);
        let Some(out) = python(CPYTHON_CHECK, "", &ours) else {
            println!("skipped: python3 not found");
            return;
        };
        assert_eq!(out.trim(), "exact", "{}", t.name);
        checked += 1;
    }
    assert!(checked > 0);
    // Real PyTorch 2.11 files: CPython reads back the same dicts and lists.
    for t in corpus()
        .iter()
        .filter(|t| ["mlp_train", "wrapped_history_pub"].contains(&t.name.as_str()))
    {
        let ours = snapshot_bytes(&import::decode_plain(&plain(t)).unwrap());
        let out = python(CPYTHON_CHECK, t.path.to_str().unwrap(), &ours).unwrap();
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            [
                "exact",
                "segments equal",
                "device_traces equal",
                "allocator_settings equal"
            ],
            "{}",
            t.name
        );
    }
}

#[test]
fn a_generated_wrapped_snapshot_replays_exactly() {
    let Some(t) = corpus()
        .into_iter()
        .chain(repo_traces())
        .find(|t| t.name == "mlp_train")
    else {
        println!("skipped: mlp_train not found (../shared/traces)");
        return;
    };
    let src = import::decode_plain(&plain(&t)).unwrap();
    let events = &src.device_traces[0];
    let (a, b) = steady_window(events).expect("a training loop returns to its state");
    assert!(b - a > events.len() / 4, "{a}..{b} of {}", events.len());
    let repeats = 5;
    let total = events.len() + repeats * (b - a);
    // The ring buffer keeps the last entries: the start is mid-step, state unknown.
    let keep = total - events.len() / 2 - 17;
    let it: Box<dyn Iterator<Item = RawEvent>> =
        Box::new((total - keep..total).map(|i| repeated_entry(events, (a, b), repeats, i)));
    let mut bytes = Vec::new();
    write_snapshot_streamed(&src, vec![(keep, it)], &mut bytes).unwrap();
    let v = session::load(&bytes, None).unwrap();
    assert_eq!(v.devices.len(), 1);
    assert!(v.devices[0].exact, "{:?}", v.devices[0]);
    // Every allocator decision of the entries kept (a third of them) compared, and the
    // end state reached.
    assert!(
        v.devices[0].events_compared as usize > keep / 4 && v.devices[0].end_state_matches,
        "{keep} entries: {:?}",
        v.devices[0]
    );
    assert!(
        !v.trace.devices[0].starts_empty(),
        "the ring buffer wrapped"
    );
}

/// A synthetic workload written as a snapshot (`gen_snapshot --workload`): `CPython` reads
/// it and pickles it back into the same bytes, every entry it reads is one of PyTorch's
/// trace entries, and our decoder validates it exactly.
#[test]
fn a_recorded_workload_is_a_snapshot_cpython_reads_back_exactly() {
    let dir = std::env::temp_dir().join(format!("allocsim-write-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvcache.pickle");
    let w = allocsim_tests::generate::write_workload(
        "kvcache:tokens=30,layers=3,requests=2,prompt=100..600",
        &path,
    )
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(bytes.len() as u64, w.bytes);
    let v = session::load(&bytes, None).unwrap();
    assert!(v.exact(), "{:?}", v.devices);
    assert_eq!(v.trace.devices[0].events, w.entries);
    let check = r"
import pickle, sys
ours = sys.stdin.buffer.read()
obj = pickle.loads(ours)
print('exact' if pickle.dumps(obj, 4) == ours else 'differs')
actions = {e['action'] for e in obj['device_traces'][0]}
print(sorted(actions))
print(len(obj['device_traces'][0]), len(obj['segments']), obj['allocator_settings']['max_split_size'])
";
    let Some(out) = python(check, "", &bytes) else {
        println!("skipped: python3 not found");
        return;
    };
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "exact");
    assert_eq!(
        lines[1],
        "['alloc', 'free_completed', 'free_requested', 'segment_alloc']"
    );
    assert_eq!(lines[2], format!("{} {} -1", w.entries, w.segments));
}
