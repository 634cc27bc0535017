//! The streamed snapshot decode alone in wasm ([`StreamDecoder`], the browser worker's
//! path), fed from JS in pieces, so that the wasm memory's size after it (memory never
//! shrinks) is the decode's peak. Exports: `start(total)`, `buf(n)` (where to copy the next
//! piece), `feed(n)`, `end()` (1: feed the input again, 2: decoded), `entries()`.
use std::cell::RefCell;

use allocsim_core::snapshot::RawSnapshot;
use allocsim_core::snapshot::import::DecodeOptions;
use allocsim_core::snapshot::stream::StreamDecoder;

thread_local! {
    static DEC: RefCell<Option<StreamDecoder>> = const { RefCell::new(None) };
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static SNAP: RefCell<Option<RawSnapshot>> = const { RefCell::new(None) };
}

/// A decode of a file of `total` bytes (a JS number: exact below 2^53).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
#[unsafe(no_mangle)]
pub extern "C" fn start(total: f64) {
    DEC.with(|d| {
        *d.borrow_mut() = Some(StreamDecoder::new(total as u64, DecodeOptions::default()));
    });
}

/// [`start`], a plain pickle decoded in two passes whatever its size (as the browser
/// worker decodes a file it does not read once).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
#[unsafe(no_mangle)]
pub extern "C" fn start_two_pass(total: f64) {
    DEC.with(|d| {
        *d.borrow_mut() = Some(
            StreamDecoder::new(total as u64, DecodeOptions::default()).with_single_pass_max(0),
        );
    });
}

#[unsafe(no_mangle)]
pub extern "C" fn buf(n: usize) -> *mut u8 {
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < n {
            b.resize(n, 0);
        }
        b.as_mut_ptr()
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn feed(n: usize) -> i32 {
    BUF.with(|b| {
        DEC.with(|d| match d.borrow_mut().as_mut() {
            Some(dec) => match dec.feed(&b.borrow()[..n]) {
                Ok(()) => 0,
                Err(_) => -1,
            },
            None => -2,
        })
    })
}

/// 1: feed the input again; 2: decoded; negative: an error.
#[unsafe(no_mangle)]
pub extern "C" fn end() -> i32 {
    DEC.with(|d| match d.borrow_mut().as_mut() {
        Some(dec) => match dec.end_of_input() {
            Ok(None) => 1,
            Ok(Some(s)) => {
                SNAP.with(|x| *x.borrow_mut() = Some(s));
                2
            }
            Err(_) => -1,
        },
        None => -2,
    })
}

/// Trace entries decoded, all devices (a JS number).
#[allow(clippy::cast_precision_loss)]
#[unsafe(no_mangle)]
pub extern "C" fn entries() -> f64 {
    SNAP.with(|x| {
        x.borrow()
            .as_ref()
            .map_or(0, |s| s.device_traces.iter().map(Vec::len).sum::<usize>()) as f64
    })
}

// ---- The engine worker's open after the decode, stage by stage (`open()`). ----

use allocsim_app::engine::Engine;
use allocsim_app::engine::wire::{MainReplay, Request, Response};
use allocsim_app::heap;

/// The system allocator, counting the bytes live and their highest mark since the last
/// stage recorded.
#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

thread_local! {
    static REPORT: RefCell<String> = const { RefCell::new(String::new()) };
    /// The host's clock at the last stage line.
    static LAST_MS: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

#[link(wasm_import_module = "env")]
unsafe extern "C" {
    /// Milliseconds of the host's clock (`performance.now()`).
    fn now_ms() -> f64;
}

#[allow(clippy::cast_precision_loss)]
fn mib(b: usize) -> f64 {
    (b as f64 / 1_048_576.0 * 10.0).round() / 10.0
}

/// One line of the report: the stage, the bytes live after it and their highest mark
/// during it, the wasm memory's size after it, and the message it emitted (bytes).
fn stage(what: &str, message: usize) {
    // SAFETY: the host's clock (probe.mjs's `env.now_ms`), no arguments, no memory.
    let now = unsafe { now_ms() };
    let ms = now - LAST_MS.with(|l| l.replace(now));
    let live = heap::live();
    let peak = heap::restart_peak();
    let memory = core::arch::wasm32::memory_size::<0>() * 65536;
    REPORT.with(|r| {
        r.borrow_mut().push_str(&format!(
            "{{\"stage\":\"{what}\",\"ms\":{ms:.1},\"live_mib\":{},\"peak_live_mib\":{},\"wasm_memory_mib\":{},\"message_mib\":{}}}\n",
            mib(live),
            mib(peak),
            mib(memory),
            mib(message)
        ));
    });
}

fn kind(r: &Response) -> &'static str {
    match r {
        Response::Progress { fraction, .. } if *fraction > 0.5 => "Progress",
        Response::Progress { .. } => "",
        Response::Recorded { .. } => "Recorded",
        Response::Loaded { .. } => "Loaded",
        Response::Replayed { .. } => "Replayed",
        Response::Layout { .. } => "Layout",
        Response::Bands { .. } => "Bands",
        Response::Bounds { .. } => "Bounds",
        Response::Failed { .. } => "Failed",
        _ => "other",
    }
}

fn emit(r: Response) {
    let k = kind(&r);
    if k.is_empty() {
        return;
    }
    // SAFETY: as in `stage`.
    let t0 = unsafe { now_ms() };
    let bytes = allocsim_app::engine::wire::encode(&r).unwrap_or_default();
    let t1 = unsafe { now_ms() };
    let back = allocsim_app::engine::wire::decode::<Response>(&bytes);
    let t2 = unsafe { now_ms() };
    drop(back);
    // The encode and the page's decode, apart from the stage's time.
    LAST_MS.with(|l| l.set(l.get() + (t2 - t0)));
    REPORT.with(|x| {
        x.borrow_mut().push_str(&format!(
            "{{\"message\":\"{k}\",\"encode_ms\":{:.1},\"decode_ms\":{:.1}}}\n",
            t1 - t0,
            t2 - t1
        ));
    });
    if let Response::Failed { message, .. } = &r {
        REPORT.with(|x| x.borrow_mut().push_str(&format!("failed: {message}\n")));
    }
    stage(&format!("emitted {k}"), bytes.len());
}

/// The worker's open after its decode, as the page drives it: the recorded timeline, the
/// trace's build, the ops table, the main replay ahead; then the page's requests (the
/// main replay and its start layout, the second configuration and its layout, then the
/// bands and the bounds). Each stage's line is in the report (`report_ptr`, `report_len`).
#[unsafe(no_mangle)]
pub extern "C" fn open() {
    // SAFETY: as in `stage`.
    LAST_MS.with(|l| l.set(unsafe { now_ms() }));
    stage("decoded", 0);
    let Some(snap) = SNAP.with(|x| x.borrow_mut().take()) else {
        return;
    };
    BUF.with(|b| *b.borrow_mut() = Vec::new());
    DEC.with(|d| *d.borrow_mut() = None);
    stage("decoder dropped", 0);
    let mut engine = Engine::new();
    let main = MainReplay {
        spec: "pytorch".into(),
        capacity_bytes: None,
        as_recorded: true,
        // Asked below, as before the page's jobs were sent with the file.
        answer: None,
    };
    engine.open_decoded_replaying(1, "big.pickle".into(), Ok(snap), Some(&main), &mut |r| {
        emit(r);
    });
    stage("opened, main replayed ahead", 0);
    let reqs = [
        Request::Replay {
            job: 2,
            slot: 0,
            spec: "pytorch".into(),
            capacity_bytes: None,
        },
        Request::StartLayout {
            job: 3,
            slot: 0,
            otherwise: 0,
        },
        Request::Replay {
            job: 4,
            slot: 1,
            spec: "pytorch@expandable_segments:True".into(),
            capacity_bytes: None,
        },
        Request::StartLayout {
            job: 5,
            slot: 1,
            otherwise: 0,
        },
        Request::Bands { job: 6 },
        Request::Bounds { job: 7 },
    ];
    for req in reqs {
        engine.handle(req, &mut |r| emit(r));
    }
    stage("end", 0);
}

#[unsafe(no_mangle)]
pub extern "C" fn report_ptr() -> *const u8 {
    REPORT.with(|r| r.borrow().as_ptr())
}

#[unsafe(no_mangle)]
pub extern "C" fn report_len() -> usize {
    REPORT.with(|r| r.borrow().len())
}
