//! Every input must decode or fail with an error: no panic, no hang, no unbounded memory;
//! a plain file streamed in pieces (a single pass first), to the same snapshot or the same
//! error.
//! A snapshot that decodes is also turned into a replayable trace (the validation pass
//! replays it through the PyTorch model), so hostile traces reach the trace builder too:
//! unknown or double frees, negative or huge sizes, events out of order.
#![no_main]

use allocsim_core::snapshot::import::{DecodeOptions, ImportError, is_gzip};
use allocsim_core::snapshot::stream::StreamDecoder;
use allocsim_core::snapshot::{decode_snapshot, pickle};
use allocsim_core::session;
use libfuzzer_sys::fuzz_target;

/// `data` decoded as the app reads a file, in pieces of 61 bytes (a plain pickle in a
/// single pass first, which gives way to two where it cannot decide; a second pass that
/// met a guarded list of entries runs once more: four passes at most).
fn streamed(data: &[u8]) -> Result<allocsim_core::snapshot::RawSnapshot, ImportError> {
    let mut dec = StreamDecoder::new(data.len() as u64, DecodeOptions::default());
    for _ in 0..4 {
        for piece in data.chunks(61) {
            dec.feed(piece)?;
        }
        if let Some(snap) = dec.end_of_input()? {
            return Ok(snap);
        }
    }
    panic!("a fifth pass asked for");
}

fuzz_target!(|data: &[u8]| {
    let whole = decode_snapshot(data);
    // A plain file streamed: the same snapshot or the same error. (A gzip file's error
    // names the end of the piece its corrupt data was found in, which depends on the
    // pieces.)
    if !is_gzip(data) {
        match (&whole, streamed(data)) {
            (Ok(a), Ok(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}")),
            (Err(a), Err(b)) => assert_eq!(a, &b),
            (a, b) => panic!("whole {:?}, streamed {:?}", a.is_ok(), b.is_ok()),
        }
    }
    match whole {
        Err(e) => {
            // Errors are one line.
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        Ok(_) => {
            if let Err(e) = session::load(data, None) {
                assert!(!e.to_string().contains('\n'), "{e}");
            }
        }
    }
    // The generic decoder shares the machine and adds the tree conversion.
    let _ = pickle::decode_value(data);
    // The same bytes behind a PROTO opcode, so that mutations of the seeds' opcode
    // streams reach the pickle machine without having to rediscover the header.
    if data.first() != Some(&0x80) && data.len() < 1 << 16 {
        let mut with_header = Vec::with_capacity(data.len() + 2);
        with_header.extend_from_slice(&[0x80, 4]);
        with_header.extend_from_slice(data);
        let _ = decode_snapshot(&with_header);
    }
});
