//! Structure-aware fuzzing (issue 19): the input drives a generator that writes a
//! snapshot pickle from its schema — devices, segments with blocks, trace entries of every
//! action, sizes and addresses near the limits (2^47, 2^56, 2^63, 2^64 − 1), huge device
//! ids, shared references (one memoised entry or list referenced many times), a missing
//! `device_traces` or the legacy list-of-segments form. Byte mutations rarely reach these;
//! here every run is a well-formed snapshot.
//!
//! Invariants: an error is one line; the decoded snapshot stays within the element budget
//! (shared references cannot amplify memory); every device of a trace that loads replays
//! under every model with peak reserved ≥ final reserved and ≥ peak allocated, and a
//! request above `MAX_REQUEST_BYTES` is never served.
#![no_main]

use allocsim_core::models::common::rounding::MAX_REQUEST_BYTES;
use allocsim_core::models::{AllocatorKind, ModelSpec};
use allocsim_core::replay::{Outcome, ReplayOptions};
use allocsim_core::session;
use allocsim_core::snapshot::{decode_snapshot, pickle};
use allocsim_core::trace::OpKind;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

const BASE: u64 = 0x7f00_0000_0000;
const MIB: u64 = 1 << 20;

/// A protocol-2 pickle writer with the opcodes snapshots use.
struct P {
    b: Vec<u8>,
    memo: u32,
}

impl P {
    fn op(&mut self, o: u8) {
        self.b.push(o);
    }
    fn s(&mut self, s: &str) {
        self.b.push(b'X');
        self.b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.b.extend_from_slice(s.as_bytes());
    }
    fn int(&mut self, v: u64) {
        // LONG1 with 9 bytes: any u64 as a non-negative integer.
        self.b.push(0x8a);
        self.b.push(9);
        self.b.extend_from_slice(&v.to_le_bytes());
        self.b.push(0);
    }
    fn put(&mut self) -> u32 {
        let i = self.memo;
        self.memo += 1;
        self.b.push(b'r');
        self.b.extend_from_slice(&i.to_le_bytes());
        i
    }
    fn get(&mut self, i: u32) {
        self.b.push(b'j');
        self.b.extend_from_slice(&i.to_le_bytes());
    }
}

fn size(u: &mut Unstructured) -> Result<u64> {
    Ok(match u.int_in_range(0..=13)? {
        0 => 0,
        1 => 512,
        2 => 2 * MIB,
        3 => 20 * MIB,
        4 => MAX_REQUEST_BYTES,
        5 => MAX_REQUEST_BYTES + 1,
        6 => 1 << 56,
        7 => 1 << 63,
        8 => u64::MAX - 511,
        9 => u64::MAX,
        10 => u64::from(u.arbitrary::<u32>()?),
        _ => u64::from(u.int_in_range(1u32..=64)?) * 512,
    })
}

fn addr(u: &mut Unstructured) -> Result<u64> {
    Ok(match u.int_in_range(0..=9)? {
        0 => u64::MAX - 4095,
        1 => (1 << 56) - MIB,
        2 => u.arbitrary()?,
        _ => BASE + u64::from(u.int_in_range(0u32..=15)?) * 2 * MIB,
    })
}

fn event(p: &mut P, u: &mut Unstructured) -> Result<()> {
    const ACTIONS: [&str; 9] = [
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "oom",
        "snapshot",
    ];
    let action = *u.choose(&ACTIONS)?;
    p.op(b'}');
    p.op(b'(');
    p.s("action");
    p.s(action);
    p.s(if action == "oom" {
        "device_free"
    } else {
        "addr"
    });
    p.int(addr(u)?);
    p.s("size");
    p.int(size(u)?);
    p.s("stream");
    p.int(u.int_in_range(0..=2)?);
    p.s("frames");
    p.op(b']');
    p.op(b'u');
    Ok(())
}

fn segment(p: &mut P, u: &mut Unstructured) -> Result<()> {
    let device = *u.choose(&[0u64, 0, 0, 1, 127, 128, u64::from(u32::MAX)])?;
    let (a, s) = (addr(u)?, size(u)?);
    let used = u.arbitrary::<bool>()?;
    p.op(b'}');
    p.op(b'(');
    for (k, v) in [
        ("device", device),
        ("address", a),
        ("total_size", s),
        ("allocated_size", if used { s } else { 0 }),
        ("active_size", if used { s } else { 0 }),
        ("requested_size", if used { s } else { 0 }),
        ("stream", 0),
    ] {
        p.s(k);
        p.int(v);
    }
    p.s("segment_type");
    p.s(if s <= 2 * MIB { "small" } else { "large" });
    p.s("blocks");
    p.op(b']');
    p.op(b'(');
    p.op(b'}');
    p.op(b'(');
    p.s("address");
    p.int(a);
    p.s("size");
    p.int(s);
    p.s("state");
    p.s(if used { "active_allocated" } else { "inactive" });
    p.op(b'u');
    p.op(b'e');
    p.op(b'u');
    Ok(())
}

/// The events of one device's trace, some of them one memoised entry repeated.
fn trace(p: &mut P, u: &mut Unstructured) -> Result<()> {
    p.op(b']');
    p.op(b'(');
    for _ in 0..u.int_in_range(0..=48)? {
        if u.ratio(1, 16)? {
            event(p, u)?;
            let e = p.put();
            for _ in 0..u.int_in_range(1..=20_000)? {
                p.get(e);
            }
        } else {
            event(p, u)?;
        }
    }
    p.op(b'e');
    Ok(())
}

fn snapshot(u: &mut Unstructured) -> Result<Vec<u8>> {
    let mut p = P {
        b: vec![0x80, 2],
        memo: 0,
    };
    let legacy = u.ratio(1, 16)?;
    if !legacy {
        p.op(b'}');
        p.op(b'(');
        p.s("segments");
    }
    p.op(b']');
    p.op(b'(');
    for _ in 0..u.int_in_range(0..=4)? {
        segment(&mut p, u)?;
    }
    p.op(b'e');
    if !legacy {
        if !u.ratio(1, 8)? {
            p.s("device_traces");
            p.op(b']');
            p.op(b'(');
            for _ in 0..u.int_in_range(0..=3)? {
                trace(&mut p, u)?;
                if u.ratio(1, 8)? {
                    // One device's list shared by many devices.
                    let l = p.put();
                    for _ in 0..u.int_in_range(1..=400)? {
                        p.get(l);
                    }
                }
            }
            p.op(b'e');
        }
        p.op(b'u');
    }
    p.op(b'.');
    Ok(p.b)
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(bytes) = snapshot(&mut u) else {
        return;
    };
    // Reproducing a finding: ALLOCSIM_FUZZ_DUMP=FILE writes the snapshot this input makes.
    if let Some(path) = std::env::var_os("ALLOCSIM_FUZZ_DUMP") {
        let _ = std::fs::write(path, &bytes);
    }
    let snap = match decode_snapshot(&bytes) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "{e}");
            return;
        }
    };
    let elements = snap.device_traces.len()
        + snap.device_traces.iter().map(Vec::len).sum::<usize>()
        + snap.segments.len()
        + snap.segments.iter().map(|s| s.blocks.len()).sum::<usize>();
    let budget = bytes.len() as u64 / pickle::BYTES_PER_ELEMENT + pickle::ELEMENT_SLACK;
    assert!(
        elements as u64 <= budget,
        "{elements} elements from {} bytes",
        bytes.len()
    );
    let capacity = if u.arbitrary::<bool>().unwrap_or(false) {
        Some(80 << 30)
    } else {
        None
    };
    let v = match session::load(&bytes, None) {
        Ok(v) => v,
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "{e}");
            return;
        }
    };
    for (d, dt) in v.trace.devices.iter().enumerate() {
        if dt.ops.is_empty() {
            continue;
        }
        for kind in AllocatorKind::ALL {
            let opts = ReplayOptions {
                check_every: 1,
                ..ReplayOptions::default()
            };
            let r = match session::replay_device(&v.trace, d, &ModelSpec::new(kind), capacity, opts)
            {
                Ok(r) => r,
                Err(e) => {
                    assert!(!e.to_string().contains('\n'), "{e}");
                    continue;
                }
            };
            assert!(
                r.invariant_error.is_none(),
                "{kind:?}: {:?}",
                r.invariant_error
            );
            assert!(r.peak_reserved_bytes >= r.final_reserved_bytes, "{kind:?}");
            assert!(r.peak_reserved_bytes >= r.peak_allocated_bytes, "{kind:?}");
            for (op, out) in dt.ops.iter().zip(r.outcomes.iter()) {
                if let (
                    OpKind::Alloc {
                        size_bytes,
                        restored: false,
                        ..
                    },
                    Outcome::Served(_),
                ) = (op.kind, out)
                {
                    assert!(
                        size_bytes <= MAX_REQUEST_BYTES,
                        "{kind:?} served {size_bytes}"
                    );
                }
            }
        }
    }
});
