//! Every input must decode or fail with an error: no panic, no hang, no unbounded memory.
#![no_main]

use allocsim_core::snapshot::{decode_snapshot, pickle};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = decode_snapshot(data) {
        // Errors are one line.
        assert!(!e.to_string().contains('\n'), "{e}");
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
