//! Every input must decode or fail with an error: no panic, no hang, no unbounded memory.
//! A snapshot that decodes is also turned into a replayable trace (the validation pass
//! replays it through the PyTorch model), so hostile traces reach the trace builder too:
//! unknown or double frees, negative or huge sizes, events out of order.
#![no_main]

use allocsim_core::snapshot::{decode_snapshot, pickle};
use allocsim_core::session;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode_snapshot(data) {
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
