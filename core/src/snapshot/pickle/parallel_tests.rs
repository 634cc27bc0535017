//! The parallel second pass gives the serial decode's snapshot, or its error, exactly.

use super::{Chunk, Plan, decode};
use crate::snapshot::write::snapshot_bytes;
use crate::snapshot::{Action, RawEvent, RawSnapshot, StackId, import};

/// Small chunks, a batch start noted every few hundred bytes: many chunks even for the
/// corpus's small files.
const SMALL: Plan = Plan {
    threads: 4,
    chunk_bytes: 2048,
    batch_step: 256,
};

fn no_tamper(_: &mut Vec<Chunk>) {}

type Tamper<'a> = &'a dyn Fn(&mut Vec<Chunk>);

/// The serial and the parallel decode of `data`: the same snapshot (all of it, tables
/// and their numbering included, compared through `Debug`) or the same error; returns
/// the chunks the parallel one merged.
fn same(data: &[u8], plan: Plan, tamper: &dyn Fn(&mut Vec<Chunk>), what: &str) -> usize {
    let serial = super::super::decode_serial(data);
    let (par, merged) = decode(data, plan, tamper);
    match (serial, par) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.device_traces, b.device_traces, "{what}");
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{what}");
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what}"),
        (a, b) => panic!("{what}: serial {:?}, parallel {:?}", a.err(), b.err()),
    }
    merged
}

/// The shared corpus's pickles (`CPython`'s own, of real snapshots), decompressed.
pub(in crate::snapshot::pickle) fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/traces"));
    let mut files = Vec::new();
    for sub in ["", "incoming"] {
        if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
            files.extend(rd.filter_map(Result::ok).map(|e| e.path()));
        }
    }
    files.retain(|p| p.to_string_lossy().ends_with(".pickle.gz"));
    files.sort();
    files
        .iter()
        .filter_map(|p| {
            let gz = std::fs::read(p).ok()?;
            let data = import::gunzip(&gz, import::decompression_cap(gz.len())).ok()?;
            data.starts_with(&[0x80])
                .then(|| (p.display().to_string(), data))
        })
        .collect()
}

#[test]
fn the_corpus_decodes_the_same_on_several_threads() {
    let files = corpus();
    if files.is_empty() {
        println!("skipped: ../shared/traces is absent");
        return;
    }
    let mut parallel = 0;
    for (name, data) in &files {
        let merged = same(data, SMALL, &no_tamper, name);
        println!("{name}: {merged} chunks");
        if merged > 0 {
            parallel += 1;
        }
        // One thread runs the same chunks.
        let one = Plan {
            threads: 1,
            ..SMALL
        };
        assert_eq!(same(data, one, &no_tamper, name), merged, "{name}");
    }
    println!("{parallel} of {} files decoded in chunks", files.len());
    assert!(parallel >= 5, "{parallel}");
}

/// A written snapshot: entries whose stacks share memoized frame dicts, with notes and
/// pools, over two devices.
pub(in crate::snapshot::pickle) fn written() -> Vec<u8> {
    let mut snap = RawSnapshot::default();
    let t = &mut snap.frames;
    let files: Vec<_> = (0..7)
        .map(|i| t.intern_str(&format!("/src/file_{i}.py")))
        .collect();
    let frames: Vec<_> = (0..40u32)
        .map(|i| {
            let name = t.intern_str(&format!("fn_{}", i % 13));
            t.intern_frame(crate::snapshot::Frame {
                name,
                filename: files[i as usize % files.len()],
                line: i64::from(i) * 3,
                line_text: None,
                fx: 0,
            })
        })
        .collect();
    let stacks: Vec<StackId> = (0..60usize)
        .map(|i| {
            let fs: Vec<_> = (0..=(i % 9))
                .map(|k| frames[(i * 7 + k * 3) % frames.len()])
                .collect();
            t.intern_stack(&fs)
        })
        .collect();
    let note = t.intern_str("a note");
    snap.event_pools = vec![(0, 0), (1, 7)];
    for d in 0..2u64 {
        snap.device_traces.push(
            (0..30_000u64)
                .map(|i| {
                    let mut ev = RawEvent::new(
                        if i % 2 == 0 {
                            Action::Alloc
                        } else {
                            Action::FreeCompleted
                        },
                        0x1000 * (i / 2 + 1),
                        512 * (i % 5 + 1),
                        d,
                    );
                    ev.time_us = i as i64;
                    ev.stack = stacks[(i as usize * 31 + d as usize) % stacks.len()];
                    ev.pool = (i % 3) as u32;
                    if i % 1000 == 7 {
                        ev.user_metadata = note;
                    }
                    ev
                })
                .collect(),
        );
    }
    snapshot_bytes(&snap)
}

#[test]
fn written_snapshots_decode_the_same_in_chunks_of_any_size() {
    let bytes = written();
    for chunk_bytes in [1, 700, 4096, 100_000] {
        let plan = Plan {
            chunk_bytes,
            ..SMALL
        };
        let merged = same(
            &bytes,
            plan,
            &no_tamper,
            &format!("chunks of {chunk_bytes}"),
        );
        assert!(merged > 0, "chunks of {chunk_bytes}");
    }
}

#[test]
fn a_truncated_file_gives_the_serial_error() {
    let bytes = written();
    for cut in [bytes.len() / 3, bytes.len() / 2 + 1, bytes.len() - 2] {
        let part = &bytes[..cut];
        same(part, SMALL, &no_tamper, &format!("cut at {cut}"));
    }
}

/// A `GET` of a slot never stored, inside a chunk, gives the serial error (and the
/// byte offset of that `GET`).
#[test]
fn a_bad_get_inside_a_chunk_gives_the_serial_error() {
    let bytes = written();
    let (_, merged) = decode(&bytes, SMALL, &no_tamper);
    assert!(merged > 4);
    // The last BINGET / LONG_BINGET in the middle third: point it past every slot.
    let mid = bytes.len() / 2;
    let at = (mid..bytes.len())
        .find(|&i| bytes[i] == b'j' && bytes.get(i + 5) == Some(&b'('))
        .or_else(|| (mid..bytes.len()).find(|&i| bytes[i] == b'j'))
        .expect("a LONG_BINGET");
    let mut bad = bytes.clone();
    bad[at + 1..at + 5].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
    let serial = super::super::decode_serial(&bad).expect_err("refused");
    assert!(serial.to_string().contains("was never stored"), "{serial}");
    same(&bad, SMALL, &no_tamper, "bad GET");
}

/// Chunk boundaries noted wrong (off by a byte, a memo length or an entry count off by
/// one, a chunk left out) never change the answer: the decode notices and runs serially.
#[test]
fn misnoted_chunks_change_nothing() {
    let bytes = written();
    assert!(same(&bytes, SMALL, &no_tamper, "as noted") > 3);
    let tampers: [(&str, Tamper<'_>); 7] = [
        // The chunks' entries go where the pre-pass counted them: a run's chunks follow
        // each other, or none is decoded apart.
        ("a chunk left out", &|cs| {
            if cs.len() > 3 {
                cs.remove(2);
            }
        }),
        ("start + 1", &|cs| {
            if let Some(c) = cs.get_mut(2) {
                c.start += 1;
            }
        }),
        ("end - 1", &|cs| {
            if let Some(c) = cs.get_mut(1) {
                c.end -= 1;
            }
        }),
        ("memo length + 1", &|cs| {
            for c in cs.iter_mut().skip(1) {
                c.start_len += 1;
            }
        }),
        ("memo length - 1 at the end", &|cs| {
            if let Some(c) = cs.get_mut(0) {
                c.end_len -= 1;
            }
        }),
        ("entries before the first chunk + 1", &|cs| {
            for c in cs.iter_mut() {
                c.first += 1;
                c.last += 1;
            }
        }),
        ("a chunk's entries - 1", &|cs| {
            if let Some(i) = cs.len().checked_sub(2) {
                cs[i].last -= 1;
                cs[i + 1].first -= 1;
            }
        }),
    ];
    for (what, t) in tampers {
        assert_eq!(
            same(&bytes, SMALL, t, what),
            0,
            "{what}: fell back to serial"
        );
    }
}

/// The chunks write their entries into the list they stay in: a device trace decoded in
/// chunks is as long as its room, reserved once (no list grown or copied at the merge).
#[test]
fn chunks_fill_the_trace_list_in_place() {
    let bytes = written();
    let (snap, merged) = decode(&bytes, SMALL, &no_tamper);
    assert!(merged > 3, "{merged}");
    let snap = snap.expect("decodes");
    let long: Vec<_> = snap
        .device_traces
        .iter()
        .filter(|t| t.len() >= super::super::prepass::MIN_RUN as usize)
        .collect();
    assert!(!long.is_empty());
    for t in long {
        assert_eq!(t.capacity(), t.len());
    }
}
