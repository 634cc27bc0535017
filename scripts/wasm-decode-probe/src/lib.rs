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
