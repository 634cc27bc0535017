use super::{DesktopLogger, EngineHandle, Request, Response, SaveInPieces};

#[test]
fn rfd_errors_are_kept_as_the_reason_a_dialog_failed_and_winit_noise_is_filtered() {
    use log::Log;
    let logger = DesktopLogger::new(None);
    let meta =
        |target: &'static str, level| log::Metadata::builder().target(target).level(level).build();
    let portal = "rfd::backend::xdg_desktop_portal";
    assert!(logger.enabled(&meta(portal, log::Level::Error)));
    logger.log(
        &log::Record::builder()
            .metadata(meta(portal, log::Level::Error))
            .args(format_args!(
                "Failed to pick file with zenity: No such file"
            ))
            .build(),
    );
    // Only rfd's errors are kept; other lines only go to the terminal.
    logger.log(
        &log::Record::builder()
            .metadata(meta("allocsim", log::Level::Error))
            .args(format_args!("cannot save"))
            .build(),
    );
    assert_eq!(
        super::take_dialog_errors().as_deref(),
        Some("Failed to pick file with zenity: No such file")
    );
    assert_eq!(super::take_dialog_errors(), None, "taken once");
    // XRandR's "certifiably insane" line and the XSETTINGS one are not printed;
    // other warnings are.
    let randr = "winit::platform_impl::linux::x11::util::randr";
    assert!(!logger.prints(&meta(randr, log::Level::Warn)));
    assert!(!logger.prints(&meta(
        "winit::platform_impl::linux::x11::xdisplay",
        log::Level::Warn
    )));
    assert!(logger.prints(&meta("egui_wgpu", log::Level::Warn)));
    assert!(!logger.prints(&meta("egui_wgpu", log::Level::Info)));
    // RUST_LOG still shows everything asked for.
    assert!(DesktopLogger::new(Some("debug")).prints(&meta(randr, log::Level::Warn)));
}

#[test]
#[cfg(target_os = "linux")]
fn a_missing_or_relative_runtime_dir_gets_a_private_one_in_tmp() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = std::env::temp_dir().join(format!("allocsim-rt-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("tmp");
    let good = tmp.join("good");
    std::fs::create_dir_all(&good).expect("dir");
    // A valid one is kept.
    assert_eq!(
        super::runtime_dir_fallback(Some(good.as_os_str()), &tmp),
        None
    );
    // Unset, relative, or not there: a private directory under tmp.
    for current in [None, Some("run/user"), Some("/no/such/runtime/dir")] {
        let dir = super::runtime_dir_fallback(current.map(std::ffi::OsStr::new), &tmp)
            .expect("a fallback");
        assert!(
            dir.starts_with(&tmp) && dir.is_absolute() && dir.is_dir(),
            "{dir:?}"
        );
        let mode = std::fs::metadata(&dir).expect("made").permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{current:?}");
    }
    // One that others can read is not a runtime directory.
    let dir = super::runtime_dir_fallback(None, &tmp).expect("a fallback");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_eq!(super::runtime_dir_fallback(None, &tmp), None);
    std::fs::remove_dir_all(&tmp).expect("clean up");
}

#[test]
fn a_typed_path_is_read_and_a_bad_one_says_why() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/traces/oom_story.pickle.gz"
    );
    let f = super::read_path(&format!("  {path} ")).expect("readable");
    assert_eq!(f.name, "oom_story.pickle.gz");
    assert!(!f.bytes.is_empty());
    let e = super::read_path("/no/such/file.pickle").expect_err("missing");
    assert!(e.starts_with("cannot read /no/such/file.pickle: "), "{e}");
}

/// A thread engine asked to build a synthetic trace (job 1) and replay it (job 2, slot 0).
fn replayed_engine() -> EngineHandle {
    let ctx = egui::Context::default();
    let mut e = EngineHandle::spawn(&ctx);
    e.send(Request::Workload {
        job: 1,
        spec: "kvcache:tokens=500".into(),
    });
    e.send(Request::Replay {
        job: 2,
        slot: 0,
        spec: "pytorch".into(),
        capacity_bytes: None,
    });
    e
}

/// Hands `e`'s answers to `take` until it says it has what it waited for (a failed job
/// panics; two minutes at most).
fn take_answers(e: &mut EngineHandle, mut take: impl FnMut(Response) -> bool) {
    let start = std::time::Instant::now();
    loop {
        assert!(start.elapsed().as_secs() < 120, "no answer");
        for r in e.poll() {
            if let Response::Failed { job, message } = &r {
                panic!("job {job}: {message}");
            }
            if take(r) {
                return;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn layouts_are_answered_while_a_min_capacity_search_runs() {
    let mut e = replayed_engine();
    // The search replays the trace a dozen times beside the engine; the layout asked
    // after it is answered first.
    e.send(Request::MinCapacity {
        job: 3,
        slot: 0,
        spec: "pytorch".into(),
    });
    e.send(Request::Layout {
        job: 4,
        slot: 0,
        op: 10,
    });
    let mut order = Vec::new();
    take_answers(&mut e, |r| {
        match r {
            Response::Layout { job: 4, layout, .. } => {
                assert_eq!(layout.op, 10);
                order.push(4);
            }
            Response::MinCapacity {
                job: 3,
                bytes,
                slot,
            } => {
                assert_eq!(slot, 0);
                assert!(bytes > 0);
                order.push(3);
            }
            _ => {}
        }
        order.len() == 2
    });
    assert_eq!(order, [4, 3]);
}

#[test]
fn layouts_are_answered_while_a_what_if_runs() {
    let mut e = replayed_engine();
    // The what-if sweeps PyTorch's settings beside the engine.
    e.send(Request::WhatIf {
        job: 3,
        capacity_bytes: None,
    });
    e.send(Request::Layout {
        job: 4,
        slot: 0,
        op: 10,
    });
    let mut order = Vec::new();
    take_answers(&mut e, |r| {
        match r {
            Response::Layout { job: 4, .. } => order.push(4),
            Response::WhatIf { job: 3, answer } => {
                assert!(answer.candidates_tried > 100, "{answer:?}");
                assert!(answer.tradeoffs.iter().all(|r| r.fits), "no capacity");
                order.push(3);
            }
            _ => {}
        }
        order.len() == 2
    });
    assert_eq!(order, [4, 3]);
}

#[test]
fn natively_the_bands_are_stacked_beside_the_engine_from_its_own_table() {
    let ctx = egui::Context::default();
    assert!(!EngineHandle::inline().runs_beside());
    let mut e = EngineHandle::spawn(&ctx);
    assert!(
        e.runs_beside(),
        "a thread engine runs detached work beside it"
    );
    e.send(Request::Workload {
        job: 1,
        spec: "kvcache:tokens=500".into(),
    });
    // Asked before the replay, as the app does: both answer, the bands from the very
    // table the UI was sent.
    e.send(Request::Bands { job: 2 });
    e.send(Request::Replay {
        job: 3,
        slot: 0,
        spec: "pytorch".into(),
        capacity_bytes: None,
    });
    let (mut trace, mut bands, mut replayed) = (None, None, false);
    take_answers(&mut e, |r| {
        match r {
            Response::Loaded { trace: t, .. } => trace = Some(t),
            Response::Bands { job: 2, bands: b } => bands = Some(b),
            Response::Replayed { job: 3, .. } => replayed = true,
            _ => {}
        }
        trace.is_some() && bands.is_some() && replayed
    });
    let (trace, bands) = (trace.expect("loaded"), bands.expect("bands"));
    assert!(!bands.pieces.is_empty());
    assert_eq!(bands.pieces, crate::engine::bands::build(&trace.ops).pieces);
    // The UI's table is shared with the engine: the engine's handle and the one sent.
    assert!(std::sync::Arc::strong_count(&trace.ops) >= 2);
}

/// Every answer the engine gives on a real snapshot (decode, the recorded timeline, the
/// trace, two replays, a layout), for the chunked codec's tests.
fn engine_answers() -> Vec<Response> {
    use crate::engine::{Engine, examples};
    let ex = examples::by_file("kvcache_decode.pickle.gz").expect("built in");
    let mut engine = Engine::new();
    let mut out = Vec::new();
    let mut push = |r: Response| out.push(r);
    engine.handle(
        Request::Load {
            job: 1,
            name: ex.file.into(),
            bytes: ex.bytes.to_vec(),
        },
        &mut push,
    );
    for (slot, spec) in ["pytorch", "pytorch@expandable_segments:True"]
        .iter()
        .enumerate()
    {
        engine.handle(
            Request::Replay {
                job: 2,
                slot: slot as u32,
                spec: (*spec).into(),
                capacity_bytes: None,
            },
            &mut push,
        );
    }
    engine.handle(
        Request::Layout {
            job: 3,
            slot: 0,
            op: 1000,
        },
        &mut push,
    );
    // The trace shared with the search workers (its bytes as serde's bytes).
    engine.handle(Request::ShareTrace { job: 4 }, &mut push);
    out
}

/// The chunks a message was encoded into, kept natively.
#[derive(Default)]
struct VecChunks(Vec<Vec<u8>>);

impl crate::gui::chunked::Sink for VecChunks {
    type Output = Vec<Vec<u8>>;
    fn chunk(&mut self, bytes: &[u8]) {
        self.0.push(bytes.to_vec());
    }
    fn finish(self) -> Vec<Vec<u8>> {
        self.0
    }
}

#[test]
fn chunked_messages_are_the_wire_bytes_and_decode_to_the_same_answers() {
    use crate::engine::wire;
    use crate::gui::chunked::{Joined, decode_from, encode_into, encoded_len};
    let answers = engine_answers();
    let kinds: Vec<String> = answers
        .iter()
        .map(|r| {
            format!("{r:?}")
                .split([' ', '('])
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    for kind in ["Recorded", "Loaded", "Replayed", "Layout", "SharedTrace"] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} among {kinds:?}");
    }
    let mut biggest = 0;
    for r in &answers {
        let whole = wire::encode(r).expect("encodes");
        biggest = biggest.max(whole.len());
        // What the browser's `encode_js` sizes its one JS array by.
        assert_eq!(
            encoded_len(r).expect("counts"),
            whole.len() as u64,
            "the counted length"
        );
        for chunk in [1, 7, 4096, 1 << 20] {
            let chunks = encode_into(r, VecChunks::default(), chunk).expect("encodes");
            assert!(
                chunks.iter().all(|c| !c.is_empty()),
                "no empty chunk is sent"
            );
            if chunk < whole.len() {
                assert!(
                    chunks.len() > 1,
                    "{} bytes in chunks of {chunk}",
                    whole.len()
                );
            }
            assert_eq!(chunks.concat(), whole, "the wire's bytes, chunk {chunk}");
            // Read back across the chunks it was sent in, through windows of another size.
            for window in [3, 4096] {
                let back: Response =
                    decode_from(Joined::new(chunks.clone()), window).expect("decodes");
                assert_eq!(
                    wire::encode(&back).expect("encodes"),
                    whole,
                    "chunk {chunk}, window {window}"
                );
            }
            let back: Response = decode_from(whole.as_slice(), chunk).expect("decodes");
            assert_eq!(
                wire::encode(&back).expect("encodes"),
                whole,
                "chunk {chunk}"
            );
        }
    }
    assert!(biggest > 1 << 20, "a message over a chunk: {biggest} bytes");
}

#[test]
fn a_cut_chunked_message_is_an_error_not_a_panic() {
    use crate::engine::wire;
    use crate::gui::chunked::decode_from;
    let answers = engine_answers();
    let loaded = answers
        .iter()
        .find(|r| matches!(r, Response::Loaded { .. }))
        .expect("loaded");
    let whole = wire::encode(loaded).expect("encodes");
    for cut in [0, 1, whole.len() / 2, whole.len() - 1] {
        for chunk in [1, 4096] {
            let r = decode_from::<Response, _>(&whole[..cut], chunk);
            let e = r.expect_err("a cut message fails");
            assert!(e.starts_with("cannot decode a message"), "{e}");
        }
    }
}

#[test]
fn background_layouts_come_after_the_requests_and_a_new_list_drops_the_old() {
    let mut e = replayed_engine();
    let layout = |job, op| Request::Layout { job, slot: 0, op };
    // Many background layouts, then a request: the request is answered before the
    // background ones not begun when it came.
    e.send_background((0..200).map(|i| layout(100 + i, i as u32)).collect());
    e.send(layout(3, 7));
    // A new list replaces the rest of the old one.
    e.send_background(vec![layout(400, 11)]);
    let mut answered = Vec::new();
    take_answers(&mut e, |r| {
        if let Response::Layout { job, layout, .. } = r {
            if job == 400 {
                assert_eq!(layout.op, 11);
            }
            answered.push(job);
        }
        answered.contains(&400)
    });
    let at = |job| answered.iter().position(|&j| j == job);
    assert!(at(3) < at(400), "{answered:?}");
    let old = answered
        .iter()
        .filter(|&&j| (100..300).contains(&j))
        .count();
    assert!(old < 200, "the old list was dropped: {old} of it answered");
}

/// The shared trace written in pieces ([`crate::gui::chunked::search_trace_into`], the
/// browser's engine worker) is the very message the engine's own answer makes: the
/// `SearchTrace` request of its bytes, as the wire encodes it, its length stated first.
#[test]
fn a_search_trace_written_in_pieces_is_the_wire_message_of_the_shared_trace() {
    use crate::engine::{Engine, wire};
    use crate::gui::chunked::search_trace_into;
    let mut longest = 0;
    for ex in crate::engine::examples::EXAMPLES {
        let mut engine = Engine::new();
        engine.handle(
            Request::Load {
                job: 1,
                name: ex.file.into(),
                bytes: ex.bytes.to_vec(),
            },
            &mut drop,
        );
        let (device, trace) = engine.shared().expect("a trace is loaded");
        let mut shared = None;
        engine.handle(Request::ShareTrace { job: 300 }, &mut |r| {
            if let wire::Response::SharedTrace { trace, .. } = r {
                shared = Some(trace);
            }
        });
        let bytes = shared.expect("the engine shares its trace");
        longest = longest.max(bytes.len());
        let want = wire::encode(&Request::SearchTrace {
            job: 300,
            device,
            trace: bytes,
        })
        .expect("encodes");
        let mut stated = 0;
        let pieces = search_trace_into(300, device, &trace, |len| {
            stated = len;
            Ok(VecChunks::default())
        })
        .expect("written");
        assert!(pieces.len() > 1, "{}: a head and the trace", ex.file);
        assert_eq!(stated, want.len() as u64, "{}: the length stated", ex.file);
        assert_eq!(pieces.concat(), want, "{}", ex.file);
    }
    assert!(
        longest > 1 << 17,
        "a trace of more than one piece, its length 3 bytes"
    );
    assert!(
        Engine::new().shared().is_err(),
        "no trace to share before one is loaded"
    );
}

/// An export saved in pieces is their concatenation at the path asked; one given up (or
/// saved) leaves nothing in the temporary directory.
#[test]
fn a_file_saved_in_pieces_is_their_concatenation_and_leaves_no_temporary_file() {
    let name = format!("pieces-{}.csv", std::process::id());
    let temps = || {
        std::fs::read_dir(std::env::temp_dir())
            .expect("the temporary directory")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(&name))
            .count()
    };
    let mut sink = SaveInPieces::new(&name, 1).expect("a temporary file");
    assert_eq!(temps(), 1);
    let mut want = Vec::new();
    for k in 0..50u32 {
        let piece: Vec<u8> = (0..k * 997).map(|i| (i % 251) as u8).collect();
        sink.push(&piece).expect("written");
        want.extend_from_slice(&piece);
    }
    let dir = std::env::temp_dir().join(format!("allocsim-saved-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let to = dir.join("out.csv");
    sink.finish_to(&to).expect("saved");
    assert_eq!(std::fs::read(&to).expect("read back"), want);
    assert_eq!(temps(), 0);

    let mut given_up = SaveInPieces::new(&name, 1).expect("a temporary file");
    given_up.push(b"op,time_us\n").expect("written");
    drop(given_up);
    assert_eq!(temps(), 0);
    // A path that cannot be written says which.
    let mut bad = SaveInPieces::new(&name, 1).expect("a temporary file");
    bad.push(b"x").expect("written");
    let err = bad
        .finish_to(&dir.join("no-such-dir").join("out.csv"))
        .expect_err("no such directory");
    assert!(err.contains("no-such-dir"), "{err}");
    assert_eq!(temps(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}
