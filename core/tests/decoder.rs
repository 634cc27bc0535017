//! Snapshot decoder tests: every real snapshot of the corpus, hand-built hostile pickles,
//! and round trips through a test-only pickle encoder (protocols 0, 2 and 4, with and
//! without memo sharing).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use allocsim_core::snapshot::import::{self, DecodeOptions, ImportError};
use allocsim_core::snapshot::pickle::{self, PyValue};
use allocsim_core::snapshot::{
    Action, BlockState, Frame, FrameId, OtherAction, RawSnapshot, StackId, decode_snapshot,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Corpus

fn traces_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/traces"));
    dir.is_dir().then_some(dir)
}

fn load(name: &str) -> Option<RawSnapshot> {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return None;
    };
    let path = dir.join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(decode_snapshot(&bytes).unwrap_or_else(|e| panic!("{name}: {e}")))
}

fn stacks_equal(a: &RawSnapshot, sa: StackId, b: &RawSnapshot, sb: StackId) -> bool {
    a.frames.format_stack(sa) == b.frames.format_stack(sb)
}

#[test]
fn every_corpus_file_decodes() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("read traces dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".pickle.gz") || (n.ends_with(".json") && !n.ends_with(".stats.json"))
        })
        .collect();
    names.sort();
    assert!(
        names.len() >= 20,
        "expected the whole corpus, found {}",
        names.len()
    );
    for path in names {
        let bytes = std::fs::read(&path).expect("read");
        let snap = decode_snapshot(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!snap.segments.is_empty(), "{}: no segments", path.display());
        assert!(
            snap.settings.present,
            "{}: no allocator_settings",
            path.display()
        );
        for seg in &snap.segments {
            // Blocks tile their segment (the file states both, so this checks the reading).
            let mut at = seg.address;
            for b in &seg.blocks {
                assert_eq!(b.address, at, "{}: block address", path.display());
                at += b.size;
            }
            assert_eq!(
                at,
                seg.address + seg.total_size,
                "{}: blocks tile",
                path.display()
            );
        }
        for trace in &snap.device_traces {
            for e in trace {
                // Every stack id resolves.
                assert!((e.stack.0 as usize) < snap.frames.stack_count());
            }
        }
    }
}

#[test]
fn big_gpt_counts() {
    let Some(s) = load("big_gpt_long_stacks_s9.pickle.gz") else {
        return;
    };
    assert_eq!(s.device_traces.len(), 1);
    assert_eq!(s.device_traces[0].len(), 372_595);
    assert_eq!(s.segments.len(), 94);
    let with_frames = s.device_traces[0]
        .iter()
        .filter(|e| e.stack != StackId::EMPTY)
        .count();
    // CPython: sum(1 for e in trace if e.get("frames")) == 149792.
    assert_eq!(with_frames, 149_792);
    // Decoded memory is well under the 32 MB of pickle.
    assert!(s.heap_bytes() < 2 * 32_116_383);
}

#[test]
fn two_gpu_pipeline_counts() {
    let Some(s) = load("two_gpu_pipeline.pickle.gz") else {
        return;
    };
    let lens: Vec<usize> = s.device_traces.iter().map(Vec::len).collect();
    assert_eq!(lens, [564, 740]);
    assert!(s.segments.iter().any(|g| g.device == 1));
}

#[test]
fn oom_story_facts() {
    let Some(s) = load("oom_story.pickle.gz") else {
        return;
    };
    let ev = &s.device_traces[0];
    assert_eq!(ev.len(), 38);
    let ooms: Vec<usize> = (0..ev.len())
        .filter(|&i| ev[i].action == Action::Oom)
        .collect();
    assert_eq!(ooms, [27]);
    let oom = ev[27];
    assert_eq!(oom.size, 419_430_400);
    assert_eq!(oom.addr, 147_409_993_728, "oom's addr is device_free");
    // Around the OOM: 12 frees before it (6 pairs), 10 after (5 pairs), the 11 allocs of
    // 180 MiB before those.
    let frees = |r: std::ops::Range<usize>| {
        ev[r]
            .iter()
            .all(|e| matches!(e.action, Action::FreeRequested | Action::FreeCompleted))
    };
    assert!(frees(15..27) && frees(28..38));
    assert!(
        ev[4..15]
            .iter()
            .all(|e| e.action == Action::Alloc && e.size == 188_743_680)
    );
    assert_eq!(
        s.frames.format_stack(oom.stack)[0],
        "oom_story (capture/capture.py:287)"
    );
    assert_eq!(s.settings.max_split_size_bytes, None);
    assert_eq!(s.settings.roundup_power2_divisions, Some([0; 16]));
}

#[test]
fn settings_and_pools_are_read() {
    if let Some(s) = load("gpt_varlen_msplit_s2.pickle.gz") {
        assert_eq!(s.settings.max_split_size_bytes, Some(64 << 20));
        assert_eq!(s.settings.conf, "max_split_size_mb:64");
    }
    if let Some(s) = load("gpt_varlen_pow2_s2.pickle.gz") {
        assert_eq!(s.settings.roundup_power2_divisions, Some([4; 16]));
    }
    if let Some(s) = load("gc_frees.pickle.gz") {
        assert!((s.settings.garbage_collection_threshold - 0.5).abs() < 1e-12);
    }
    if let Some(s) = load("gpt_varlen_expand_s2.pickle.gz") {
        assert!(s.settings.expandable_segments);
        assert!(s.segments.iter().all(|g| g.is_expandable));
        assert!(
            s.device_traces[0]
                .iter()
                .any(|e| e.action == Action::SegmentMap)
        );
    }
    if let Some(s) = load("cuda_graph_train.pickle.gz") {
        assert!(s.segments.iter().any(|g| g.segment_pool_id == (1, 0)));
    }
}

#[test]
fn protocol_5_decodes_like_protocol_4() {
    let (Some(a), Some(b)) = (
        load("mlp_train.pickle.gz"),
        load("mlp_train_proto5.pickle.gz"),
    ) else {
        return;
    };
    assert_same(&a, &b);
}

#[test]
fn json_decodes_like_pickle() {
    let (Some(a), Some(b)) = (load("oom_story.pickle.gz"), load("oom_story_as_json.json")) else {
        return;
    };
    assert_same(&a, &b);
}

/// Identical snapshots, stacks compared as text (ids may be numbered differently).
fn assert_same(a: &RawSnapshot, b: &RawSnapshot) {
    assert_eq!(a.settings, b.settings);
    assert_eq!(a.segments.len(), b.segments.len());
    for (x, y) in a.segments.iter().zip(&b.segments) {
        assert!(stacks_equal(a, x.stack, b, y.stack));
        let strip = |s: &allocsim_core::snapshot::RawSegment| {
            let mut s = s.clone();
            s.stack = StackId::EMPTY;
            for blk in &mut s.blocks {
                blk.stack = StackId::EMPTY;
            }
            s
        };
        assert_eq!(strip(x), strip(y));
        for (p, q) in x.blocks.iter().zip(&y.blocks) {
            assert!(stacks_equal(a, p.stack, b, q.stack));
        }
    }
    assert_eq!(a.device_traces.len(), b.device_traces.len());
    for (ta, tb) in a.device_traces.iter().zip(&b.device_traces) {
        assert_eq!(ta.len(), tb.len());
        for (x, y) in ta.iter().zip(tb) {
            assert!(stacks_equal(a, x.stack, b, y.stack));
            assert_eq!(
                (x.action, x.addr, x.size, x.stream, x.time_us),
                (y.action, y.addr, y.size, y.stream, y.time_us)
            );
        }
    }
    assert_eq!(a.frames.stack_count(), b.frames.stack_count());
}

/// The fuzz seeds include the same tiny snapshot as `CPython` writes it with protocols 0, 2,
/// 4 and 5, as JSON and gzip'd: all decode to the same thing.
#[test]
fn python_written_protocols_agree() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/seeds"));
    let read = |name: &str| {
        let bytes = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        decode_snapshot(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let reference = read("tiny_p4.pickle");
    assert_eq!(reference.device_traces[0].len(), 4);
    assert_eq!(reference.device_traces[0][3].action, Action::Oom);
    assert_eq!(
        reference
            .frames
            .format_stack(reference.device_traces[0][0].stack),
        ["forward (model.py:12)", "<module> (train.py:99)"]
    );
    for name in [
        "tiny_p0.pickle",
        "tiny_p2.pickle",
        "tiny_p5.pickle",
        "tiny.json",
        "tiny_p4.pickle.gz",
    ] {
        assert_same(&reference, &read(name));
    }
    // Sets, frozensets and bytearrays are pickled with REDUCE below protocol 4: refused.
    let p2 = std::fs::read(dir.join("values_p2.pickle")).expect("read");
    assert!(matches!(
        pickle::decode_value(&p2),
        Err(ImportError::RefusedOpcode { name: "GLOBAL", .. })
    ));
    let p5 = std::fs::read(dir.join("values_p5.pickle")).expect("read");
    let PyValue::List(items) = pickle::decode_value(&p5).expect("protocol 5 values") else {
        panic!("not a list");
    };
    assert_eq!(items[0], PyValue::Int(1 << 64));
    assert_eq!(items[1], PyValue::Str("é".repeat(300)));
    assert_eq!(
        items[3],
        PyValue::Bytes(b"z".to_vec()),
        "BYTEARRAY8 reads as bytes"
    );
}

// ---------------------------------------------------------------------------------------
// Hostile and malformed input

/// A protocol-2 pickle of `body` followed by STOP.
fn p2(body: &[u8]) -> Vec<u8> {
    let mut v = vec![0x80, 2];
    v.extend_from_slice(body);
    v.push(b'.');
    v
}

fn err_of(bytes: &[u8]) -> ImportError {
    match decode_snapshot(bytes) {
        Ok(_) => panic!("decoded {bytes:?}"),
        Err(e) => {
            let text = e.to_string();
            assert!(!text.contains('\n'), "one line: {text}");
            e
        }
    }
}

/// The smallest valid snapshot: `{"segments": []}`.
fn minimal_snapshot() -> Vec<u8> {
    let mut body = vec![b'}', b'X'];
    body.extend_from_slice(&8u32.to_le_bytes());
    body.extend_from_slice(b"segments]s");
    p2(&body)
}

#[test]
fn minimal_snapshot_decodes() {
    let s = decode_snapshot(&minimal_snapshot()).expect("minimal");
    assert!(s.segments.is_empty() && s.device_traces.is_empty() && !s.settings.present);
}

#[test]
fn refused_opcodes_are_named_and_never_run() {
    let cases: &[(u8, &str)] = &[
        (b'c', "GLOBAL"),
        (0x93, "STACK_GLOBAL"),
        (b'R', "REDUCE"),
        (b'b', "BUILD"),
        (b'i', "INST"),
        (b'o', "OBJ"),
        (0x81, "NEWOBJ"),
        (0x92, "NEWOBJ_EX"),
        (0x82, "EXT1"),
        (0x83, "EXT2"),
        (0x84, "EXT4"),
        (b'P', "PERSID"),
        (b'Q', "BINPERSID"),
        (0x97, "NEXT_BUFFER"),
        (0x98, "READONLY_BUFFER"),
    ];
    for &(code, name) in cases {
        // What `pickle.dumps(os.system)` and friends would start with, after a NONE.
        let bytes = p2(&[b'N', code, b'o', b's', b'\n', b's', b'y', b's', b'\n']);
        let e = err_of(&bytes);
        assert_eq!(
            e,
            ImportError::RefusedOpcode {
                offset: 3,
                name,
                reason: match e {
                    ImportError::RefusedOpcode { reason, .. } => reason,
                    _ => "",
                },
            },
            "{name}"
        );
        assert!(
            e.to_string()
                .starts_with(&format!("byte 3: refused pickle opcode {name} (")),
            "{e}"
        );
        assert!(pickle::decode_value(&bytes).is_err());
    }
    let e = err_of(&p2(b"cos\nsystem\n"));
    assert_eq!(
        e.to_string(),
        "byte 2: refused pickle opcode GLOBAL (snapshots never need code execution)"
    );
}

#[test]
fn unknown_opcode_names_byte_and_offset() {
    let e = err_of(&p2(&[b'N', 0xff]));
    assert_eq!(
        e,
        ImportError::UnknownOpcode {
            offset: 3,
            byte: 0xff
        }
    );
    assert_eq!(e.to_string(), "byte 3: unknown pickle opcode 0xff");
    assert_eq!(
        err_of(&p2(&[0x99])),
        ImportError::UnknownOpcode {
            offset: 2,
            byte: 0x99
        }
    );
}

#[test]
fn every_prefix_of_a_valid_pickle_is_an_error() {
    let mut files = vec![minimal_snapshot()];
    if let Some(dir) = traces_dir() {
        let gz = std::fs::read(dir.join("oom_story.pickle.gz")).expect("read");
        // Truncated gzip: an error from every prefix too.
        for n in 0..gz.len() {
            let _ = err_of(&gz[..n]);
        }
        files.push(import::gunzip(&gz, 1 << 30).expect("gunzip"));
    }
    for full in files {
        decode_snapshot(&full).expect("the full pickle decodes");
        for n in 0..full.len() {
            let e = err_of(&full[..n]);
            if n > 0 {
                assert!(
                    matches!(
                        e,
                        ImportError::Truncated { .. } | ImportError::Malformed { .. }
                    ),
                    "prefix {n}: {e}"
                );
            }
        }
    }
}

#[test]
fn every_prefix_of_the_json_is_an_error() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    let full = std::fs::read(dir.join("oom_story_as_json.json")).expect("read");
    for n in (0..full.len()).step_by(7) {
        let e = err_of(&full[..n]);
        if n > 0 {
            assert!(matches!(e, ImportError::Json { .. }), "prefix {n}: {e}");
        }
    }
}

#[test]
fn huge_length_prefixes_are_not_allocated() {
    // BINUNICODE8 claiming 10 GB, followed by 3 bytes.
    let mut body = vec![0x8d];
    body.extend_from_slice(&10_000_000_000u64.to_le_bytes());
    body.extend_from_slice(b"abc");
    let bytes = {
        let mut v = vec![0x80, 4];
        v.extend_from_slice(&body);
        v
    };
    let t = Instant::now();
    let e = err_of(&bytes);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(
        e,
        ImportError::Truncated {
            offset: 2,
            what: "BINUNICODE8",
            missing_bytes: 10_000_000_000 - 3,
        }
    );
    assert_eq!(
        e.to_string(),
        "byte 2: truncated pickle (BINUNICODE8 needs 9999999997 more bytes)"
    );
    // The same for every counted opcode.
    for (code, width) in [
        (0x8eu8, 8usize),
        (0x96, 8),
        (b'X', 4),
        (b'B', 4),
        (0x8b, 4),
        (b'T', 4),
    ] {
        let mut v = vec![0x80, 4, code];
        v.extend_from_slice(&vec![0x7f; width]);
        assert!(
            matches!(err_of(&v), ImportError::Truncated { offset: 2, .. }),
            "{code:#x}"
        );
    }
    // Negative lengths of the signed forms.
    let mut v = vec![0x80, 2, b'T'];
    v.extend_from_slice(&(-5i32).to_le_bytes());
    assert!(err_of(&v).to_string().contains("negative length -5"));
}

#[test]
fn deep_nesting_neither_overflows_nor_hangs() {
    const N: usize = 2_000_000;
    // [[[...]]] built with EMPTY_LIST × N, then APPEND × (N − 1).
    let mut body = vec![b']'; N];
    body.extend(std::iter::repeat_n(b'a', N - 1));
    let bytes = p2(&body);
    let t = Instant::now();
    let e = err_of(&bytes);
    assert!(
        e.to_string()
            .contains("segments[0]: expected a segment dict, found a list"),
        "{e}"
    );
    let e = pickle::decode_value(&bytes).expect_err("too deep for a tree");
    assert!(e.to_string().contains("nested deeper than"), "{e}");
    // Nested dicts through SETITEM, and MARKs with nothing to close them.
    let mut body = vec![b'}'];
    for _ in 0..N / 4 {
        body.extend_from_slice(b"K\x01}");
    }
    body.extend(std::iter::repeat_n(b's', N / 4));
    assert!(
        err_of(&p2(&body))
            .to_string()
            .ends_with("snapshot: missing `segments`")
    );
    let _ = err_of(&p2(&vec![b'('; N]));
    // JSON: serde_json's recursion limit answers.
    let json = vec![b'['; N];
    assert!(matches!(err_of(&json), ImportError::Json { .. }));
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn memo_get_of_a_missing_index() {
    let e = err_of(&p2(b"h\x07"));
    assert_eq!(
        e.to_string(),
        "byte 2: malformed pickle: memo index 7 was never stored"
    );
    let e = err_of(&p2(b"j\xff\xff\xff\xff"));
    assert!(
        e.to_string()
            .contains("memo index 4294967295 was never stored"),
        "{e}"
    );
    let e = err_of(b"(g12\n.");
    assert!(e.to_string().contains("memo index 12"), "{e}");
}

#[test]
fn stack_misuse_is_reported() {
    assert!(
        err_of(&p2(b"a"))
            .to_string()
            .contains("APPEND needs 2 value(s)")
    );
    assert!(
        err_of(&p2(b"}K\x01a"))
            .to_string()
            .contains("APPEND onto a dict, expected a list")
    );
    assert!(
        err_of(&p2(b"e"))
            .to_string()
            .contains("APPENDS without a MARK")
    );
    assert!(
        err_of(&p2(b"(K\x01u"))
            .to_string()
            .contains("SETITEMS has no dict below its MARK")
    );
    assert!(err_of(&p2(b"}(K\x01u")).to_string().contains("odd number"));
    assert!(err_of(&p2(b"")).to_string().contains("STOP needs 1 value"));
    assert!(err_of(&[0x80, 2]).to_string().contains("no STOP"));
    assert!(
        err_of(&[0x80, 9, b'N', b'.'])
            .to_string()
            .contains("unsupported pickle protocol 9")
    );
    assert!(
        err_of(&p2(b"0"))
            .to_string()
            .contains("POP on an empty stack")
    );
}

/// `{"segments": [seg], "device_traces": [[entry]]}` with one field of the entry or the
/// segment replaced, as a protocol-4 pickle through the test encoder.
fn snapshot_with(entry: Vec<(&str, PyValue)>, segment_patch: Option<(&str, PyValue)>) -> Vec<u8> {
    let mut seg = vec![
        ("device", int(0)),
        ("address", int(1 << 40)),
        ("total_size", int(2 << 20)),
        ("allocated_size", int(0)),
        ("active_size", int(0)),
        ("requested_size", int(0)),
        ("stream", int(0)),
        ("segment_type", s("small")),
        ("segment_pool_id", PyValue::Tuple(vec![int(0), int(0)])),
        ("is_expandable", PyValue::Bool(false)),
        ("frames", PyValue::List(vec![])),
        (
            "blocks",
            PyValue::List(vec![dict(vec![
                ("address", int(1 << 40)),
                ("size", int(2 << 20)),
                ("requested_size", int(0)),
                ("state", s("inactive")),
                ("frames", PyValue::List(vec![])),
            ])]),
        ),
    ];
    if let Some((k, v)) = segment_patch {
        seg.retain(|(key, _)| *key != k);
        if !matches!(v, PyValue::None) || k == "segment_pool_id" {
            seg.push((k, v));
        }
    }
    let top = dict(vec![
        ("segments", PyValue::List(vec![dict(seg)])),
        (
            "device_traces",
            PyValue::List(vec![PyValue::List(vec![dict(entry)])]),
        ),
    ]);
    encode(&top, Proto::P4, true)
}

fn good_entry() -> Vec<(&'static str, PyValue)> {
    vec![
        ("action", s("alloc")),
        ("addr", int(1 << 40)),
        ("size", int(512)),
        ("stream", int(0)),
        ("time_us", int(17)),
        (
            "frames",
            PyValue::List(vec![dict(vec![
                ("name", s("f")),
                ("filename", s("a.py")),
                ("line", int(3)),
            ])]),
        ),
    ]
}

fn with(
    mut entry: Vec<(&'static str, PyValue)>,
    key: &'static str,
    v: Option<PyValue>,
) -> Vec<(&'static str, PyValue)> {
    entry.retain(|(k, _)| *k != key);
    if let Some(v) = v {
        entry.push((key, v));
    }
    entry
}

#[test]
fn schema_errors_name_the_field() {
    let ok = decode_snapshot(&snapshot_with(good_entry(), None)).expect("good");
    assert_eq!(ok.device_traces[0][0].size, 512);
    assert_eq!(
        ok.frames.format_stack(ok.device_traces[0][0].stack),
        ["f (a.py:3)"]
    );

    let msg = |bytes: Vec<u8>| err_of(&bytes).to_string();
    let m = msg(snapshot_with(
        with(good_entry(), "size", Some(int(-5))),
        None,
    ));
    assert!(
        m.ends_with("device_traces[0][0]: `size` is negative (-5), expected an unsigned integer"),
        "{m}"
    );
    assert!(m.starts_with("byte "), "{m}");
    let m = msg(snapshot_with(
        with(good_entry(), "size", Some(s("12"))),
        None,
    ));
    assert!(
        m.ends_with("device_traces[0][0]: `size` is a string, expected an unsigned integer"),
        "{m}"
    );
    let m = msg(snapshot_with(with(good_entry(), "size", None), None));
    assert!(m.ends_with("device_traces[0][0]: missing `size`"), "{m}");
    let m = msg(snapshot_with(with(good_entry(), "action", None), None));
    assert!(m.ends_with("device_traces[0][0]: missing `action`"), "{m}");
    let m = msg(snapshot_with(
        with(good_entry(), "addr", Some(PyValue::Int(1 << 70))),
        None,
    ));
    assert!(
        m.ends_with("`addr` is an integer that does not fit in 64 bits"),
        "{m}"
    );
    let m = msg(snapshot_with(
        with(good_entry(), "frames", Some(int(3))),
        None,
    ));
    assert!(
        m.contains("`frames` is an integer, expected a list of frame dicts"),
        "{m}"
    );
    let bad_frame = PyValue::List(vec![dict(vec![
        ("name", s("f")),
        ("filename", s("a.py")),
        ("line", s("x")),
    ])]);
    // A frame's line is only displayed: a string is kept, not refused.
    let snap = decode_snapshot(&snapshot_with(
        with(good_entry(), "frames", Some(bad_frame)),
        None,
    ))
    .expect("string line");
    assert_eq!(
        snap.frames.format_stack(snap.device_traces[0][0].stack),
        ["f (a.py:x)"]
    );
    let m = msg(snapshot_with(good_entry(), Some(("address", int(-1)))));
    assert!(
        m.ends_with("segments[0]: `address` is negative (-1), expected an unsigned integer"),
        "{m}"
    );
    let m = msg(snapshot_with(
        good_entry(),
        Some(("total_size", PyValue::None)),
    ));
    assert!(m.ends_with("segments[0]: missing `total_size`"), "{m}");
    let m = msg(snapshot_with(
        good_entry(),
        Some(("segment_type", s("huge"))),
    ));
    assert!(
        m.ends_with("`segment_type` is \"huge\", expected \"large\" or \"small\""),
        "{m}"
    );
    let m = msg(snapshot_with(
        good_entry(),
        Some(("segment_pool_id", int(3))),
    ));
    assert!(
        m.contains("`segment_pool_id` is an integer, expected a pair of integers"),
        "{m}"
    );

    // Absent optional keys take their defaults; unknown keys are ignored.
    let lean = with(
        with(with(good_entry(), "time_us", None), "frames", None),
        "stream",
        None,
    );
    let lean = with(lean, "compile_context", Some(s("N/A")));
    let snap = decode_snapshot(&snapshot_with(
        lean,
        Some(("segment_pool_id", PyValue::None)),
    ))
    .expect("lean");
    let e = snap.device_traces[0][0];
    assert_eq!((e.time_us, e.stream, e.stack), (0, 0, StackId::EMPTY));
    // An oom entry carries device_free instead of addr.
    let oom = with(with(good_entry(), "addr", None), "action", Some(s("oom")));
    let oom = with(oom, "device_free", Some(int(99)));
    let snap = decode_snapshot(&snapshot_with(oom, None)).expect("oom");
    assert_eq!(
        (
            snap.device_traces[0][0].action,
            snap.device_traces[0][0].addr
        ),
        (Action::Oom, 99)
    );
}

/// A one-entry snapshot whose frames have the given `line` values (`None`: no key).
fn frames_with_lines(lines: &[Option<PyValue>]) -> Vec<(&'static str, PyValue)> {
    let frames = lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let mut pairs = vec![("name", s(&format!("f{i}"))), ("filename", s("a.py"))];
            if let Some(line) = line {
                pairs.push(("line", line.clone()));
            }
            dict(pairs)
        })
        .collect();
    with(good_entry(), "frames", Some(PyValue::List(frames)))
}

#[test]
fn frame_lines_of_any_size_and_type_decode() {
    // torch.compile's fake_tensor.py frames carry 2^64 - 1 (C++'s -1 as a uint64).
    let lines = [
        Some(u(u64::MAX)),
        Some(int(-1)),
        Some(PyValue::Int(1 << 70)),
        Some(PyValue::Int(-(1 << 70) - 5)),
        Some(PyValue::Int(i128::MAX)),
        Some(int(i64::MIN)),
        Some(int(i64::MAX)),
        Some(PyValue::None),
        None,
        Some(PyValue::Float(2.5)),
        Some(PyValue::Bool(true)),
        Some(PyValue::List(vec![int(1)])),
    ];
    let want = [
        "f0 (a.py:18446744073709551615)",
        "f1 (a.py:-1)",
        "f2 (a.py:1180591620717411303424)",
        "f3 (a.py:-1180591620717411303429)",
        "f4 (a.py:170141183460469231731687303715884105727)",
        "f5 (a.py:-9223372036854775808)",
        "f6 (a.py:9223372036854775807)",
        "f7 (a.py:?)",
        "f8 (a.py:?)",
        "f9 (a.py:2.5)",
        "f10 (a.py:True)",
        "f11 (a.py:?)",
    ];
    let entry = frames_with_lines(&lines);
    for proto in [Proto::P0, Proto::P2, Proto::P4] {
        let top = dict(vec![
            ("segments", PyValue::List(vec![])),
            (
                "device_traces",
                PyValue::List(vec![PyValue::List(vec![dict(entry.clone())])]),
            ),
        ]);
        let snap = decode_snapshot(&encode(&top, proto, true)).expect("frames of any line");
        let stack = snap.device_traces[0][0].stack;
        assert_eq!(snap.frames.format_stack(stack), want, "{proto:?}");
        // What fits in an i64 is kept as a number; the rest as the file's text.
        let frames: Vec<_> = snap
            .frames
            .stack(stack)
            .iter()
            .map(|&f| *snap.frames.frame(f).expect("frame"))
            .collect();
        assert_eq!((frames[1].line, frames[1].line_text), (-1, None));
        assert_eq!(frames[6].line, i64::MAX);
        assert_eq!(frames[0].line, Frame::LINE_UNKNOWN);
        assert_eq!(
            frames[0].line_text.map(|t| snap.frames.str(t)),
            Some("18446744073709551615")
        );
    }
    // The same through the JSON decoder (integers past u64 are floats to serde_json).
    let json = br#"{"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 2,
        "frames": [{"name": "f0", "filename": "a.py", "line": 18446744073709551615},
                   {"name": "f1", "filename": "a.py", "line": -1},
                   {"name": "f2", "filename": "a.py", "line": 1180591620717411303424},
                   {"name": "f3", "filename": "a.py", "line": -9223372036854775808},
                   {"name": "f4", "filename": "a.py", "line": null},
                   {"name": "f5", "filename": "a.py"},
                   {"name": "f6", "filename": "a.py", "line": "12"},
                   {"name": "f7", "filename": "a.py", "line": [1, {"a": 2}]}]}]]}"#;
    let snap = decode_snapshot(json).expect("json frames of any line");
    assert_eq!(
        snap.frames.format_stack(snap.device_traces[0][0].stack),
        [
            "f0 (a.py:18446744073709551615)",
            "f1 (a.py:-1)",
            "f2 (a.py:1180591620717411303424)",
            "f3 (a.py:-9223372036854775808)",
            "f4 (a.py:?)",
            "f5 (a.py:?)",
            "f6 (a.py:12)",
            "f7 (a.py:?)",
        ]
    );
}

#[test]
fn compile_snapshot_with_wide_frame_lines_decodes() {
    let Some(dir) = traces_dir() else {
        println!("skipped: ../shared/traces is absent");
        return;
    };
    let path = dir.join("incoming/compile_reduce_overhead.pickle.gz");
    let Ok(bytes) = std::fs::read(&path) else {
        println!("skipped: {} is absent", path.display());
        return;
    };
    let snap = decode_snapshot(&bytes).expect("compile_reduce_overhead");
    let wide = (0..snap.frames.frame_count())
        .filter_map(|i| snap.frames.frame(FrameId(i as u32)))
        .filter(|f| {
            f.line_text.map(|t| snap.frames.str(t)) == Some("18446744073709551615")
                && snap.frames.str(f.filename).ends_with("fake_tensor.py")
        })
        .count();
    assert!(wide > 0, "fake_tensor.py frames with line 2^64 - 1");
}

#[test]
fn json_errors_give_offset_and_field() {
    let e = err_of(
        br#"{"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": -5}]]}"#,
    );
    let ImportError::Json {
        offset,
        line,
        column,
        message,
    } = &e
    else {
        panic!("{e}");
    };
    assert_eq!((*line, *offset as usize + 1), (1, *column));
    assert_eq!(
        message,
        "device_traces[0][0]: `size` is negative (-5), expected an unsigned integer"
    );
    let e = err_of(b"{\n  \"segments\": [\n    {\"device\": \"zero\"}]}");
    let ImportError::Json {
        offset,
        line: 3,
        column,
        message,
    } = &e
    else {
        panic!("{e}");
    };
    assert_eq!(
        *offset as usize,
        18 + column - 1,
        "line 3 starts at byte 18"
    );
    assert_eq!(
        message,
        "segments[0]: `device` is a string, expected an unsigned integer"
    );
    let e = err_of(br#"{"device_traces": []}"#);
    assert!(
        e.to_string().ends_with("snapshot: missing `segments`"),
        "{e}"
    );
    // Addresses above 2^63 fit.
    let s = decode_snapshot(br#"{"segments": [], "device_traces": [[{"action": "alloc", "addr": 18446744073709551615, "size": 1}]]}"#)
        .expect("u64");
    assert_eq!(s.device_traces[0][0].addr, u64::MAX);
}

#[test]
fn older_snapshot_forms() {
    // No addresses or requested sizes on blocks, no allocator_settings, no traces.
    let seg = dict(vec![
        ("device", int(0)),
        ("address", int(4096)),
        ("total_size", int(300)),
        ("stream", int(0)),
        ("segment_type", s("large")),
        (
            "blocks",
            PyValue::List(vec![
                dict(vec![("size", int(100)), ("state", s("active_allocated"))]),
                dict(vec![("size", int(200)), ("state", s("inactive"))]),
            ]),
        ),
    ]);
    for top in [
        dict(vec![("segments", PyValue::List(vec![seg.clone()]))]),
        PyValue::List(vec![seg]),
    ] {
        for proto in [Proto::P0, Proto::P2, Proto::P4] {
            let snap = decode_snapshot(&encode(&top, proto, true)).expect("old form");
            let g = &snap.segments[0];
            assert_eq!((g.blocks[0].address, g.blocks[1].address), (4096, 4196));
            assert_eq!(
                (g.blocks[0].requested_size, g.blocks[1].requested_size),
                (100, 0)
            );
            assert_eq!(
                (g.allocated_size, g.active_size, g.requested_size),
                (100, 100, 100)
            );
            assert_eq!(g.blocks[0].state, BlockState::ActiveAllocated);
            assert!(snap.device_traces.is_empty() && !snap.settings.present);
        }
    }
}

#[test]
fn hostile_sizes_do_not_overflow() {
    // Block sizes summing past 2^64 (the segment's byte sums are rebuilt from them), and
    // a computed block address past 2^64.
    let block = |addr: Option<u64>| {
        let mut b = vec![("size", u(u64::MAX)), ("state", s("active_allocated"))];
        if let Some(a) = addr {
            b.push(("address", u(a)));
        }
        dict(b)
    };
    let seg = |blocks| {
        dict(vec![
            ("device", int(0)),
            ("address", int(0)),
            ("total_size", u(u64::MAX)),
            ("segment_type", s("large")),
            ("blocks", PyValue::List(blocks)),
        ])
    };
    let top = dict(vec![(
        "segments",
        PyValue::List(vec![seg(vec![block(Some(0)), block(Some(1))])]),
    )]);
    let snap = decode_snapshot(&encode(&top, Proto::P4, false)).expect("saturates");
    assert_eq!(snap.segments[0].allocated_size, u64::MAX);
    let top = dict(vec![(
        "segments",
        PyValue::List(vec![seg(vec![block(Some(1)), block(None)])]),
    )]);
    let m = err_of(&encode(&top, Proto::P4, false)).to_string();
    assert!(
        m.ends_with("segments[0].blocks[1]: `address` is an integer that does not fit in 64 bits"),
        "{m}"
    );
    let json =
        br#"{"segments": [{"device": 0, "address": 0, "total_size": 1, "segment_type": "large",
        "blocks": [{"size": 18446744073709551615, "state": "inactive", "address": 0},
                   {"size": 18446744073709551615, "state": "active_allocated", "address": 0},
                   {"size": 18446744073709551615, "state": "active_allocated", "address": 0}]}]}"#;
    assert_eq!(
        decode_snapshot(json).expect("json saturates").segments[0].active_size,
        u64::MAX
    );
}

#[test]
fn decompression_is_capped() {
    use std::io::Write;
    // 64 MiB of zeros compress to ~64 KiB.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0u8; 64 << 20]).expect("compress");
    let mut enc = gz.finish().expect("compress");
    let e = import::decode_snapshot_with(
        &enc,
        &DecodeOptions {
            max_decompressed_bytes: 1 << 20,
        },
    )
    .expect_err("capped");
    assert_eq!(
        e,
        ImportError::TooLarge {
            limit_bytes: 1 << 20
        }
    );
    assert!(e.to_string().contains("exceeds the limit of 1048576 bytes"));
    // Under the cap it inflates, and the zeros are no snapshot.
    assert!(matches!(decode_snapshot(&enc), Err(ImportError::Format(_))));
    enc.truncate(enc.len() / 2);
    assert!(matches!(
        decode_snapshot(&enc),
        Err(ImportError::Gzip { .. })
    ));
}

#[test]
fn not_a_snapshot() {
    assert_eq!(err_of(b""), ImportError::Format("the file is empty".into()));
    assert!(
        err_of(b"hello")
            .to_string()
            .starts_with("not a PyTorch snapshot: starts with 68 65 6c 6c")
    );
    assert!(err_of(b" \n ").to_string().contains("only whitespace"));
    let e = err_of(&p2(b"K\x05"));
    assert!(
        e.to_string()
            .contains("the pickle holds an integer, expected a dict with `segments`"),
        "{e}"
    );
}

#[test]
fn text_opcodes_of_protocol_0() {
    // STRING with escapes, UNICODE with \u escapes, INT bools, LONG with a trailing L.
    let v = pickle::decode_value(b"(S'a\\'b\\x41\\n'\nVcaf\\u00e9 \\U0001f600\nI01\nI-7\nL123456789012345678901234567890L\nF-2.5\nt.")
        .expect("protocol 0");
    assert_eq!(
        v,
        PyValue::Tuple(vec![
            s("a'bA\n"),
            s("café 😀"),
            PyValue::Bool(true),
            int(-7),
            PyValue::Int(123_456_789_012_345_678_901_234_567_890),
            PyValue::Float(-2.5),
        ])
    );
    // Beyond 128 bits, text and binary forms agree.
    let big = "-1".to_owned() + &"0".repeat(60);
    let text = pickle::decode_value(format!("L{big}L\n.").as_bytes()).expect("big");
    let PyValue::BigInt(bytes) = &text else {
        panic!("{text:?}")
    };
    let mut bin = vec![0x80, 2, 0x8a, bytes.len() as u8];
    bin.extend_from_slice(bytes);
    bin.push(b'.');
    assert_eq!(pickle::decode_value(&bin).expect("bin"), text);
    assert!(
        pickle::decode_value(format!("I{}\n.", "9".repeat(5000)).as_bytes())
            .expect_err("too many digits")
            .to_string()
            .contains("Python's limit is 4300")
    );
}

#[test]
fn memo_mutation_after_use_is_refused() {
    // frames = [frame]; entry uses it; then APPEND to the shared list again.
    let frame = dict(vec![
        ("name", s("f")),
        ("filename", s("a.py")),
        ("line", int(3)),
    ]);
    let mut e = Encoder::new(Proto::P2, false);
    e.out.extend_from_slice(&[0x80, 2, b'}', b'(']);
    e.str("segments");
    e.out.push(b']');
    e.str("device_traces");
    e.out.extend_from_slice(b"](]"); // device_traces, MARK, trace list
    e.out.extend_from_slice(b"}("); // entry
    for (k, v) in [("action", s("alloc")), ("addr", int(1)), ("size", int(2))] {
        e.str(k);
        e.value(&v);
    }
    e.str("frames");
    e.out.extend_from_slice(b"]q\x01"); // the frames list, memo 1
    e.value(&frame);
    e.out.extend_from_slice(b"aua"); // APPEND frame, SETITEMS, APPEND entry
    e.out.extend_from_slice(b"h\x01"); // the frames list again
    e.value(&frame);
    e.out.extend_from_slice(b"a0eu."); // APPEND to it: refused
    let m = err_of(&e.out).to_string();
    assert!(m.contains("APPEND changes the list made at byte"), "{m}");
}

// ---------------------------------------------------------------------------------------
// A test-only pickle encoder

fn int(v: i64) -> PyValue {
    PyValue::Int(i128::from(v))
}

fn s(v: &str) -> PyValue {
    PyValue::Str(v.to_owned())
}

fn dict(pairs: Vec<(&str, PyValue)>) -> PyValue {
    PyValue::Dict(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Proto {
    P0,
    P2,
    P4,
}

struct Encoder {
    out: Vec<u8>,
    proto: Proto,
    memo: bool,
    next: u32,
    /// Values already written in full, with their memo index: written again as GET, as
    /// the pickler does for the same object.
    seen: Vec<(PyValue, u32)>,
}

fn encode(v: &PyValue, proto: Proto, memo: bool) -> Vec<u8> {
    let mut e = Encoder::new(proto, memo);
    match proto {
        Proto::P0 => {}
        Proto::P2 => e.out.extend_from_slice(&[0x80, 2]),
        Proto::P4 => e
            .out
            .extend_from_slice(&[0x80, 4, 0x95, 0, 0, 0, 0, 0, 0, 0, 0]),
    }
    e.value(v);
    e.out.push(b'.');
    if proto == Proto::P4 {
        let n = (e.out.len() - 11) as u64;
        e.out[3..11].copy_from_slice(&n.to_le_bytes());
    }
    e.out
}

impl Encoder {
    fn new(proto: Proto, memo: bool) -> Encoder {
        Encoder {
            out: Vec::new(),
            proto,
            memo,
            next: 0,
            seen: Vec::new(),
        }
    }

    fn put(&mut self) -> u32 {
        let i = self.next;
        self.next += 1;
        if !self.memo {
            return i;
        }
        match self.proto {
            Proto::P0 => self.out.extend_from_slice(format!("p{i}\n").as_bytes()),
            Proto::P2 if i < 256 => self.out.extend_from_slice(&[b'q', i as u8]),
            Proto::P2 => {
                self.out.push(b'r');
                self.out.extend_from_slice(&i.to_le_bytes());
            }
            Proto::P4 => self.out.push(0x94),
        }
        i
    }

    fn get(&mut self, i: u32) {
        match self.proto {
            Proto::P0 => self.out.extend_from_slice(format!("g{i}\n").as_bytes()),
            _ if i < 256 => self.out.extend_from_slice(&[b'h', i as u8]),
            _ => {
                self.out.push(b'j');
                self.out.extend_from_slice(&i.to_le_bytes());
            }
        }
    }

    fn done(&mut self, v: &PyValue, i: u32) {
        if self.memo {
            self.seen.push((v.clone(), i));
        }
    }

    fn str(&mut self, text: &str) {
        match self.proto {
            Proto::P0 => {
                self.out.push(b'V');
                for c in text.chars() {
                    let u = c as u32;
                    if u >= 256 || matches!(c, '\\' | '\0' | '\n' | '\r' | '\x1a') {
                        let esc = if u > 0xffff {
                            format!("\\U{u:08x}")
                        } else {
                            format!("\\u{u:04x}")
                        };
                        self.out.extend_from_slice(esc.as_bytes());
                    } else {
                        self.out.push(u as u8);
                    }
                }
                self.out.push(b'\n');
            }
            Proto::P2 => {
                self.out.push(b'X');
                self.out
                    .extend_from_slice(&(text.len() as u32).to_le_bytes());
                self.out.extend_from_slice(text.as_bytes());
            }
            Proto::P4 if text.len() < 256 => {
                self.out.extend_from_slice(&[0x8c, text.len() as u8]);
                self.out.extend_from_slice(text.as_bytes());
            }
            Proto::P4 => {
                self.out.push(0x8d);
                self.out
                    .extend_from_slice(&(text.len() as u64).to_le_bytes());
                self.out.extend_from_slice(text.as_bytes());
            }
        }
    }

    fn long_bytes(&mut self, bytes: &[u8]) {
        if bytes.len() < 256 {
            self.out.extend_from_slice(&[0x8a, bytes.len() as u8]);
        } else {
            self.out.push(0x8b);
            self.out
                .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(bytes);
    }

    fn items(&mut self, items: &[PyValue]) {
        for v in items {
            self.value(v);
        }
    }

    fn value(&mut self, v: &PyValue) {
        if self.memo
            && let Some(&(_, i)) = self.seen.iter().find(|(w, _)| w == v)
        {
            self.get(i);
            return;
        }
        let p0 = self.proto == Proto::P0;
        match v {
            PyValue::None => self.out.push(b'N'),
            PyValue::Bool(b) if p0 => {
                self.out
                    .extend_from_slice(if *b { b"I01\n" } else { b"I00\n" });
            }
            PyValue::Bool(b) => self.out.push(if *b { 0x88 } else { 0x89 }),
            PyValue::Int(i) if p0 => {
                let text = if i32::try_from(*i).is_ok() {
                    format!("I{i}\n")
                } else {
                    format!("L{i}L\n")
                };
                self.out.extend_from_slice(text.as_bytes());
            }
            PyValue::Int(i) => match *i {
                0..=0xff => self.out.extend_from_slice(&[b'K', *i as u8]),
                0x100..=0xffff => {
                    self.out.push(b'M');
                    self.out.extend_from_slice(&(*i as u16).to_le_bytes());
                }
                _ if i32::try_from(*i).is_ok() => {
                    self.out.push(b'J');
                    self.out.extend_from_slice(&(*i as i32).to_le_bytes());
                }
                _ => {
                    let b = i.to_le_bytes();
                    let n = minimal(&b);
                    self.long_bytes(&b[..n]);
                }
            },
            PyValue::BigInt(bytes) => self.long_bytes(bytes),
            PyValue::Float(f) if p0 => self.out.extend_from_slice(format!("F{f:?}\n").as_bytes()),
            PyValue::Float(f) => {
                self.out.push(b'G');
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            PyValue::Str(text) => {
                self.str(text);
                let i = self.put();
                self.done(v, i);
            }
            PyValue::Bytes(b) => {
                if b.len() < 256 {
                    self.out.extend_from_slice(&[b'C', b.len() as u8]);
                } else {
                    self.out
                        .push(if self.proto == Proto::P4 { 0x8e } else { b'B' });
                    if self.proto == Proto::P4 {
                        self.out.extend_from_slice(&(b.len() as u64).to_le_bytes());
                    } else {
                        self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                    }
                }
                self.out.extend_from_slice(b);
                let i = self.put();
                self.done(v, i);
            }
            PyValue::List(items) => {
                if p0 {
                    self.out.extend_from_slice(b"(l");
                } else {
                    self.out.push(b']');
                }
                let i = self.put();
                for chunk in items.chunks(1000) {
                    if p0 || chunk.len() == 1 {
                        for x in chunk {
                            self.value(x);
                            self.out.push(b'a');
                        }
                    } else {
                        self.out.push(b'(');
                        self.items(chunk);
                        self.out.push(b'e');
                    }
                }
                self.done(v, i);
            }
            PyValue::Tuple(items) => {
                match (self.proto, items.len()) {
                    (_, 0) => self.out.push(b')'),
                    (Proto::P2 | Proto::P4, n @ 1..=3) => {
                        self.items(items);
                        self.out.push(0x85 + (n as u8 - 1));
                    }
                    _ => {
                        self.out.push(b'(');
                        self.items(items);
                        self.out.push(b't');
                    }
                }
                let i = self.put();
                self.done(v, i);
            }
            PyValue::Dict(pairs) => {
                if p0 {
                    self.out.extend_from_slice(b"(d");
                } else {
                    self.out.push(b'}');
                }
                let i = self.put();
                for chunk in pairs.chunks(1000) {
                    if p0 || chunk.len() == 1 {
                        for (k, x) in chunk {
                            self.value(k);
                            self.value(x);
                            self.out.push(b's');
                        }
                    } else {
                        self.out.push(b'(');
                        for (k, x) in chunk {
                            self.value(k);
                            self.value(x);
                        }
                        self.out.push(b'u');
                    }
                }
                self.done(v, i);
            }
            PyValue::Set(items) => {
                self.out.push(0x8f);
                let i = self.put();
                if !items.is_empty() {
                    self.out.push(b'(');
                    self.items(items);
                    self.out.push(0x90);
                }
                self.done(v, i);
            }
            PyValue::FrozenSet(items) => {
                self.out.push(b'(');
                self.items(items);
                self.out.push(0x91);
                let i = self.put();
                self.done(v, i);
            }
        }
    }
}

/// Minimal length of little-endian two's complement bytes.
fn minimal(b: &[u8]) -> usize {
    let mut n = b.len();
    while n >= 2 {
        let (top, below) = (b[n - 1], b[n - 2]);
        if (top == 0 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0) {
            n -= 1;
        } else {
            break;
        }
    }
    if n == 1 && b[0] == 0 { 0 } else { n }
}

// ---------------------------------------------------------------------------------------
// Property tests

fn big_int() -> impl Strategy<Value = PyValue> {
    // Beyond 128 bits: minimal little-endian two's complement of 17..40 bytes.
    proptest::collection::vec(any::<u8>(), 17..40).prop_map(|mut b| {
        let n = minimal(&b);
        b.truncate(n);
        if b.len() <= 16 {
            let neg = b.last().is_some_and(|x| x & 0x80 != 0);
            let mut full = if neg { [0xff; 16] } else { [0; 16] };
            full[..b.len()].copy_from_slice(&b);
            PyValue::Int(i128::from_le_bytes(full))
        } else {
            PyValue::BigInt(b)
        }
    })
}

fn py_value() -> impl Strategy<Value = PyValue> {
    let leaf = prop_oneof![
        Just(PyValue::None),
        any::<bool>().prop_map(PyValue::Bool),
        (-300i128..300).prop_map(PyValue::Int),
        any::<i64>().prop_map(|i| PyValue::Int(i128::from(i))),
        any::<u64>().prop_map(|i| PyValue::Int(i128::from(i))),
        any::<i128>().prop_map(PyValue::Int),
        big_int(),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(PyValue::Float),
        "[a-c]{0,3}".prop_map(PyValue::Str),
        any::<String>().prop_map(PyValue::Str),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(PyValue::Bytes),
    ];
    leaf.prop_recursive(5, 96, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(PyValue::List),
            proptest::collection::vec(inner.clone(), 0..5).prop_map(PyValue::Tuple),
            proptest::collection::vec((inner.clone(), inner.clone()), 0..6).prop_map(PyValue::Dict),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(PyValue::Set),
            proptest::collection::vec(inner, 0..4).prop_map(PyValue::FrozenSet),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn values_round_trip(v in py_value(), proto in prop_oneof![Just(Proto::P0), Just(Proto::P2), Just(Proto::P4)], memo: bool) {
        let bytes = encode(&v, proto, memo);
        let back = pickle::decode_value(&bytes).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(back, v);
        // The snapshot decoder never panics on it either.
        let _ = decode_snapshot(&bytes);
    }

    #[test]
    fn long_lists_round_trip(n in 0usize..2500, proto in prop_oneof![Just(Proto::P2), Just(Proto::P4)]) {
        // Batches of 1000 (APPENDS/SETITEMS), memo indices past 255 (LONG_BINPUT/GET).
        let v = PyValue::List((0..n).map(|i| PyValue::Str(format!("s{}", i % 700))).collect());
        prop_assert_eq!(pickle::decode_value(&encode(&v, proto, true)).expect("decode"), v);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_snapshot(&bytes);
        let mut p = vec![0x80, 4];
        p.extend_from_slice(&bytes);
        let _ = decode_snapshot(&p);
        let _ = pickle::decode_value(&p);
    }
}

// Random snapshots through the encoder: memo sharing (equal frames, stacks and entries are
// written once and referenced with GET, as PyTorch's pickles do) and both conversion
// paths of the decoder (on the fly, and the schema pass for shared entries).

#[derive(Debug, Clone)]
struct MEvent {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: Option<i64>,
    frames: Option<Vec<(String, String, i64)>>,
}

fn frame_pool() -> impl Strategy<Value = (String, String, i64)> {
    (
        prop_oneof![
            Just("forward"),
            Just("backward"),
            Just("<module>"),
            Just("é")
        ],
        prop_oneof![Just("a.py"), Just("b/c.py")],
        0i64..4,
    )
        .prop_map(|(n, f, l)| (n.to_owned(), f.to_owned(), l))
}

fn m_event() -> impl Strategy<Value = MEvent> {
    (
        prop_oneof![
            Just("alloc"),
            Just("free_requested"),
            Just("free_completed"),
            Just("segment_alloc"),
            Just("oom"),
            Just("snapshot"),
            Just("user_defined"),
        ],
        prop_oneof![Just(0u64), Just(1 << 40), any::<u64>()],
        prop_oneof![Just(512u64), any::<u64>()],
        prop_oneof![Just(0u64), Just(7)],
        proptest::option::of(any::<i64>()),
        proptest::option::of(proptest::collection::vec(frame_pool(), 0..4)),
    )
        .prop_map(|(action, addr, size, stream, time_us, frames)| MEvent {
            action,
            addr,
            size,
            stream,
            time_us,
            frames,
        })
}

fn frames_value(frames: &[(String, String, i64)]) -> PyValue {
    PyValue::List(
        frames
            .iter()
            .map(|(n, f, l)| dict(vec![("name", s(n)), ("filename", s(f)), ("line", int(*l))]))
            .collect(),
    )
}

fn u(v: u64) -> PyValue {
    PyValue::Int(i128::from(v))
}

fn event_value(e: &MEvent) -> PyValue {
    let mut pairs = vec![("action", s(e.action))];
    pairs.push((
        if e.action == "oom" {
            "device_free"
        } else {
            "addr"
        },
        u(e.addr),
    ));
    pairs.push(("size", u(e.size)));
    pairs.push(("stream", u(e.stream)));
    if let Some(t) = e.time_us {
        pairs.push(("time_us", int(t)));
    }
    pairs.push(("compile_context", s("N/A")));
    if let Some(f) = &e.frames {
        pairs.push(("frames", frames_value(f)));
    }
    dict(pairs)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn snapshots_round_trip(
        traces in proptest::collection::vec(proptest::collection::vec(m_event(), 0..30), 0..3),
        proto in prop_oneof![Just(Proto::P0), Just(Proto::P2), Just(Proto::P4)],
        memo: bool,
        seg_frames in proptest::collection::vec(frame_pool(), 0..3),
    ) {
        let segment = dict(vec![
            ("device", int(0)),
            ("address", u(1 << 40)),
            ("total_size", int(1024)),
            ("allocated_size", int(512)),
            ("active_size", int(512)),
            ("requested_size", int(500)),
            ("stream", int(0)),
            ("segment_type", s("large")),
            ("segment_pool_id", PyValue::Tuple(vec![int(1), int(0)])),
            ("is_expandable", PyValue::Bool(false)),
            ("frames", frames_value(&seg_frames)),
            ("blocks", PyValue::List(vec![
                dict(vec![("address", u(1 << 40)), ("size", int(512)), ("requested_size", int(500)),
                          ("state", s("active_allocated")), ("frames", frames_value(&seg_frames))]),
                dict(vec![("address", u((1 << 40) + 512)), ("size", int(512)), ("requested_size", int(0)),
                          ("state", s("inactive")), ("frames", PyValue::List(vec![]))]),
            ])),
        ]);
        let top = dict(vec![
            ("segments", PyValue::List(vec![segment])),
            ("device_traces", PyValue::List(traces.iter().map(|t| PyValue::List(t.iter().map(event_value).collect())).collect())),
            ("allocator_settings", dict(vec![("PYTORCH_CUDA_ALLOC_CONF", s("x:1")), ("max_split_size", int(-1)),
                ("garbage_collection_threshold", PyValue::Float(0.25)), ("expandable_segments", PyValue::Bool(true)),
                ("roundup_power2_divisions", dict(vec![("1", int(1)), ("4", int(4)), ("32768", int(8)), ("3", int(9))]))])),
        ]);
        let snap = decode_snapshot(&encode(&top, proto, memo)).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let fmt = |f: &[(String, String, i64)]| f.iter().map(|(n, file, l)| format!("{n} ({file}:{l})")).collect::<Vec<_>>();
        prop_assert_eq!(snap.device_traces.len(), traces.len());
        for (got, want) in snap.device_traces.iter().zip(&traces) {
            prop_assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                prop_assert_eq!(g.action.as_str(), if w.action == "user_defined" { "other" } else { w.action });
                prop_assert_eq!((g.addr, g.size, g.stream, g.time_us), (w.addr, w.size, w.stream, w.time_us.unwrap_or(0)));
                prop_assert_eq!(snap.frames.format_stack(g.stack), fmt(w.frames.as_deref().unwrap_or(&[])));
            }
        }
        let g = &snap.segments[0];
        prop_assert_eq!(snap.frames.format_stack(g.stack), fmt(&seg_frames));
        prop_assert_eq!(snap.frames.format_stack(g.blocks[0].stack), fmt(&seg_frames));
        prop_assert_eq!((g.segment_pool_id, g.requested_size, g.blocks.len()), ((1, 0), 500, 2));
        let mut table = [0u32; 16];
        table[0] = 1;
        table[2] = 4;
        table[15] = 8;
        prop_assert_eq!(&snap.settings.conf, "x:1");
        prop_assert_eq!(snap.settings.roundup_power2_divisions, Some(table));
        prop_assert!(snap.settings.expandable_segments && snap.settings.max_split_size_bytes.is_none());
    }
}

/// A snapshot with what PyTorch 2.12/2.13 add, the keys as those versions write them:
/// `pool_id`, `user_metadata`, `compile_context` and the `annotate` action on entries; FX
/// fields and a 2^64 − 1 line on frames; `trace_alloc_*` and a key of a newer PyTorch in
/// `allocator_settings`; `host_segments` / `host_traces` of the pinned host allocator.
fn snapshot_2_13(proto: Proto) -> Vec<u8> {
    encode(&snapshot_2_13_value(), proto, true)
}

fn snapshot_2_13_value() -> PyValue {
    let fx_frame = dict(vec![
        ("name", s("forward")),
        ("filename", s("torch/_subclasses/fake_tensor.py")),
        ("line", u(u64::MAX)),
        ("fx_node_op", s("call_function")),
        ("fx_node_name", s("addmm")),
        ("fx_node_target", s("aten.addmm.default")),
        (
            "fx_original_trace",
            s("File \"model.py\", line 9, in forward"),
        ),
    ]);
    let entry = |action: &str, addr: i64, size: i64, pool: (i64, i64), meta: &str| {
        dict(vec![
            ("action", s(action)),
            ("addr", int(addr)),
            ("size", int(size)),
            ("stream", int(0)),
            ("pool_id", PyValue::Tuple(vec![int(pool.0), int(pool.1)])),
            ("compile_context", s("N/A")),
            ("user_metadata", s(meta)),
            ("frames", PyValue::List(vec![fx_frame.clone()])),
            ("time_us", int(5)),
        ])
    };
    let base = 1 << 40;
    let trace = vec![
        entry("segment_alloc", base, 2 << 20, (0, 0), ""),
        entry("alloc", base, 512, (0, 0), "step 1"),
        entry("annotate", base, 512, (0, 0), "activations"),
        entry("free_requested", base, 512, (0, 0), ""),
        entry("free_completed", base, 512, (0, 0), ""),
        entry("alloc", base, 512, (1, 3), ""),
    ];
    let host_entry = dict(vec![
        ("action", s("alloc")),
        ("addr", int(7 << 32)),
        ("size", int(4096)),
        ("stream", int(0)),
        ("time_us", int(1)),
    ]);
    dict(vec![
        (
            "segments",
            PyValue::List(vec![dict(vec![
                ("device", int(0)),
                ("address", int(base)),
                ("total_size", int(2 << 20)),
                ("allocated_size", int(512)),
                ("active_size", int(512)),
                ("requested_size", int(512)),
                ("stream", int(0)),
                ("segment_type", s("small")),
                ("segment_pool_id", PyValue::Tuple(vec![int(0), int(0)])),
                ("is_expandable", PyValue::Bool(false)),
                ("registration_counter", int(1)),
                ("frames", PyValue::List(vec![])),
                (
                    "blocks",
                    PyValue::List(vec![
                        dict(vec![
                            ("address", int(base)),
                            ("size", int(512)),
                            ("requested_size", int(512)),
                            ("state", s("active_allocated")),
                            ("frames", PyValue::List(vec![fx_frame.clone()])),
                        ]),
                        dict(vec![
                            ("address", int(base + 512)),
                            ("size", int((2 << 20) - 512)),
                            ("requested_size", int(0)),
                            ("state", s("inactive")),
                            ("frames", PyValue::List(vec![])),
                        ]),
                    ]),
                ),
            ])]),
        ),
        ("device_traces", PyValue::List(vec![PyValue::List(trace)])),
        (
            "allocator_settings",
            dict(vec![
                (
                    "PYTORCH_CUDA_ALLOC_CONF",
                    s("throw_on_cudamalloc_oom:True,a_2_14_key:4"),
                ),
                ("max_split_size", int(-1)),
                ("garbage_collection_threshold", PyValue::Float(0.0)),
                ("expandable_segments", PyValue::Bool(false)),
                ("pinned_num_register_threads", int(1)),
                ("release_lock_on_cudamalloc", PyValue::Bool(false)),
                ("pinned_use_cuda_host_register", PyValue::Bool(false)),
                ("roundup_power2_divisions", dict(vec![("1", int(0))])),
                ("graph_capture_record_stream_reuse", PyValue::Bool(false)),
                (
                    "trace_alloc_overflowed",
                    PyValue::List(vec![PyValue::Bool(true)]),
                ),
                ("trace_alloc_max_entries", PyValue::List(vec![int(6)])),
                ("pinned_reserve_segment_size_mb", int(0)),
            ]),
        ),
        ("external_annotations", PyValue::List(vec![])),
        (
            "host_segments",
            PyValue::List(vec![
                dict(vec![
                    ("address", int(7 << 32)),
                    ("total_size", int(1 << 20)),
                    ("allocated_size", int(4096)),
                    ("blocks", PyValue::List(vec![])),
                ]),
                s("not a segment"),
            ]),
        ),
        ("host_traces", PyValue::List(vec![host_entry, int(3)])),
    ])
}

#[test]
fn pytorch_2_13_snapshot_fields_are_kept() {
    for proto in [Proto::P0, Proto::P2, Proto::P4] {
        let snap = decode_snapshot(&snapshot_2_13(proto)).expect("2.13 snapshot");
        let t = &snap.device_traces[0];
        assert_eq!(t.len(), 6, "{proto:?}");
        assert_eq!(
            (t[2].action, t[2].other),
            (Action::Other, OtherAction::Annotate)
        );
        assert_eq!(t[1].other, OtherAction::Plain);
        assert_eq!(snap.frames.str(t[1].user_metadata), "step 1");
        assert_eq!(snap.frames.str(t[2].user_metadata), "activations");
        assert_eq!(snap.frames.str(t[3].user_metadata), "");
        assert_eq!(snap.pool_id(&t[1]), Some((0, 0)));
        assert_eq!(snap.pool_id(&t[5]), Some((1, 3)));
        // Frames: the wide line kept as text, the FX node information kept.
        let f = *snap
            .frames
            .frame(snap.frames.stack(t[1].stack)[0])
            .expect("frame");
        assert_eq!(snap.frames.line_label(&f), "18446744073709551615");
        let fx = snap.frames.fx(&f).expect("fx info");
        assert_eq!(
            [fx.node_op, fx.node_name, fx.node_target, fx.node_info].map(|i| snap.frames.str(i)),
            ["call_function", "addmm", "aten.addmm.default", ""]
        );
        // Settings: the per-device ring buffer facts, the keys kept for the report.
        assert_eq!(snap.settings.trace_alloc_overflowed, [true]);
        assert_eq!(snap.settings.trace_alloc_max_entries, [6]);
        assert_eq!(snap.settings.other_keys, ["pinned_reserve_segment_size_mb"]);
        // Host memory: kept apart, what is not of the shape skipped and counted.
        assert_eq!(snap.host_segments.len(), 1);
        assert_eq!(snap.host_segments[0].total_size, 1 << 20);
        assert_eq!(snap.host_traces.len(), 1);
        assert_eq!(snap.host_traces[0].size, 4096);
        assert_eq!(snap.host_items_skipped, 2);
        let x = snap.extras();
        assert_eq!(
            (
                x.host_segments.count,
                x.host_segments.total_bytes,
                x.host_trace_entries
            ),
            (1, 1 << 20, 1)
        );
        assert_eq!((x.annotate_entries, x.user_metadata_entries), (1, 2));
        assert_eq!(x.entry_private_pools, [(1, 3)]);
        assert_eq!(x.fx_frames, 1);
        // The device side is exactly what it was; the host segment is not device memory.
        assert_eq!(snap.segments.len(), 1);
        assert_eq!(snap.segments[0].total_size, 2 << 20);
        // Validation takes it: the config's unknown key is kept, not refused.
        let v = allocsim_core::session::load(&snapshot_2_13(proto), None).expect("validates");
        assert_eq!(v.devices.len(), 1);
        let cfg =
            allocsim_core::models::pytorch::PyTorchConfig::from_settings(&snap.settings).unwrap();
        assert!(cfg.throw_on_cudamalloc_oom);
        assert_eq!(cfg.unknown_keys, ["a_2_14_key"]);
    }
}

/// `v` as JSON (tuples as lists), as `json.dump` of the same snapshot writes it.
fn to_json(v: &PyValue) -> String {
    let list = |items: &[PyValue]| {
        let items: Vec<String> = items.iter().map(to_json).collect();
        format!("[{}]", items.join(", "))
    };
    match v {
        PyValue::None => "null".into(),
        PyValue::Bool(b) => b.to_string(),
        PyValue::Int(i) => i.to_string(),
        PyValue::Float(f) => format!("{f:?}"),
        PyValue::Str(t) => serde_json::to_string(t).expect("string"),
        PyValue::List(items) | PyValue::Tuple(items) => list(items),
        PyValue::Dict(pairs) => {
            let pairs: Vec<String> = pairs
                .iter()
                .map(|(k, v)| format!("{}: {}", to_json(k), to_json(v)))
                .collect();
            format!("{{{}}}", pairs.join(", "))
        }
        other => panic!("no JSON for {other:?}"),
    }
}

/// A frame as text: every field, strings resolved (ids may be numbered differently).
fn frame_text(s: &RawSnapshot, f: FrameId) -> String {
    let fr = s.frames.frame(f).expect("frame");
    let fx = s.frames.fx(fr).map(|x| {
        [
            x.node_op,
            x.node_name,
            x.node_target,
            x.original_trace,
            x.node_info,
        ]
        .map(|i| s.frames.str(i).to_owned())
    });
    format!(
        "{}|{}|{}|{:?}|{:?}",
        s.frames.str(fr.name),
        s.frames.str(fr.filename),
        fr.line,
        fr.line_text.map(|t| s.frames.str(t)),
        fx
    )
}

fn stack_text(s: &RawSnapshot, id: StackId) -> Vec<String> {
    s.frames
        .stack(id)
        .iter()
        .map(|&f| frame_text(s, f))
        .collect()
}

/// The same snapshot decoded twice, compared field by field (stacks, strings and pool ids
/// through their tables, since ids may be numbered differently).
fn assert_same_fields(a: &RawSnapshot, b: &RawSnapshot) {
    assert_eq!(a.settings, b.settings);
    assert_eq!(a.segments.len(), b.segments.len());
    for (x, y) in a.segments.iter().zip(&b.segments) {
        assert_eq!(stack_text(a, x.stack), stack_text(b, y.stack));
        let strip = |s: &allocsim_core::snapshot::RawSegment| {
            let mut s = s.clone();
            s.stack = StackId::EMPTY;
            for blk in &mut s.blocks {
                blk.stack = StackId::EMPTY;
            }
            s
        };
        assert_eq!(strip(x), strip(y));
        for (p, q) in x.blocks.iter().zip(&y.blocks) {
            assert_eq!(stack_text(a, p.stack), stack_text(b, q.stack));
        }
    }
    let events = |s: &RawSnapshot, e: &allocsim_core::snapshot::RawEvent| {
        (
            (e.action, e.other, e.addr, e.size, e.stream, e.time_us),
            stack_text(s, e.stack),
            s.pool_id(e),
            s.frames.str(e.user_metadata).to_owned(),
        )
    };
    assert_eq!(a.device_traces.len(), b.device_traces.len());
    for (ta, tb) in a.device_traces.iter().zip(&b.device_traces) {
        let ea: Vec<_> = ta.iter().map(|e| events(a, e)).collect();
        let eb: Vec<_> = tb.iter().map(|e| events(b, e)).collect();
        assert_eq!(ea, eb);
    }
    assert_eq!(a.host_segments, b.host_segments);
    let ha: Vec<_> = a.host_traces.iter().map(|e| events(a, e)).collect();
    let hb: Vec<_> = b.host_traces.iter().map(|e| events(b, e)).collect();
    assert_eq!(ha, hb);
    assert_eq!(a.host_items_skipped, b.host_items_skipped);
    assert_eq!(a.extras(), b.extras());
    assert_eq!(a.frames.stack_count(), b.frames.stack_count());
    assert_eq!(a.frames.frame_count(), b.frames.frame_count());
    assert_eq!(a.frames.fx_frame_count(), b.frames.fx_frame_count());
}

/// The JSON decoder keeps what the pickle decoder keeps: the same 2.13 snapshot as a pickle
/// and as JSON decodes to the same `RawSnapshot`, the 2.12/2.13 fields included.
#[test]
fn pickle_and_json_of_one_snapshot_decode_alike() {
    let value = snapshot_2_13_value();
    let json = to_json(&value);
    let from_json = decode_snapshot(json.as_bytes()).expect("2.13 snapshot as JSON");
    // The new fields are there, not only equal.
    let t = &from_json.device_traces[0];
    assert_eq!(t[2].other, OtherAction::Annotate);
    assert_eq!(from_json.frames.str(t[1].user_metadata), "step 1");
    assert_eq!(from_json.pool_id(&t[5]), Some((1, 3)));
    assert_eq!(from_json.settings.trace_alloc_max_entries, [6]);
    assert_eq!(from_json.host_segments.len(), 1);
    assert_eq!(from_json.host_traces.len(), 1);
    assert_eq!(from_json.frames.fx_frame_count(), 1);
    for proto in [Proto::P0, Proto::P2, Proto::P4] {
        let from_pickle = decode_snapshot(&encode(&value, proto, true)).expect("pickle");
        assert_same_fields(&from_pickle, &from_json);
    }
    // Real recordings: oom_story saved both ways, and the fuzz seeds.
    if let (Some(a), Some(b)) = (load("oom_story.pickle.gz"), load("oom_story_as_json.json")) {
        assert_same_fields(&a, &b);
    }
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/seeds"));
    let read = |name: &str| decode_snapshot(&std::fs::read(dir.join(name)).expect("seed"));
    assert_same_fields(
        &read("tiny_p4.pickle").expect("p4"),
        &read("tiny.json").expect("json"),
    );
}
