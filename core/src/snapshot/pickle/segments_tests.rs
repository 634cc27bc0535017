//! The segmented pre-pass against the serial one: the same scan, boundaries aside.

use super::super::chunked::tests::read_at;
use super::super::opcodes::op;
use super::super::prepass::{Notes, Scanner};
use super::{Cuts, scan};

/// Notes as the chunked decode's, batches every 256 bytes.
#[allow(clippy::unnecessary_wraps)]
fn notes(keep_bytes: bool) -> Option<(u64, bool)> {
    Some((256, keep_bytes))
}

/// The serial pre-pass over `data` in pieces, as the chunked decode's first pass.
fn serial(data: &[u8], notes: Option<(u64, bool)>) -> Scanner {
    let mut s = Scanner::new(data.len() as u64, 4096);
    s.notes = notes.map(|(step, keep)| {
        let mut n = Notes::new(data.len() as u64, step);
        n.keep_bytes = keep;
        Box::new(n)
    });
    let mut carry = Vec::new();
    for piece in data.chunks(1 << 16) {
        s.scan_carrying(&mut carry, piece, false);
    }
    s.scan(&carry, true);
    s
}

/// The segmented scan of `data` (`None`: not scanned this way), checked against the
/// serial one; the segments' starts are among its boundaries.
fn segmented(
    data: &[u8],
    threads: usize,
    segment_bytes: u64,
    notes: Option<(u64, bool)>,
) -> Option<()> {
    let cuts = Cuts {
        threads,
        segment_bytes,
        notes,
        step: 4096,
        frames: u64::MAX,
    };
    let mut got = scan(&read_at(data), data.len() as u64, cuts, &mut |_| true)?.expect("no cancel");
    let mut want = serial(data, notes);
    assert_eq!(
        got.digest(),
        want.digest(),
        "{threads} threads, segments of {segment_bytes}"
    );
    assert!(got.boundaries.windows(2).all(|w| w[0] < w[1]));
    let starts = opcode_starts(data);
    for b in &got.boundaries {
        assert!(
            starts.binary_search(&(*b as usize)).is_ok(),
            "boundary {b} is not an opcode start"
        );
    }
    Some(())
}

/// Every opcode's start (a boundary at each).
fn opcode_starts(data: &[u8]) -> Vec<usize> {
    let mut s = Scanner::new(data.len() as u64, 1);
    s.next_boundary_at(0);
    s.scan(data, true);
    s.boundaries.iter().map(|&b| b as usize).collect()
}

/// `data` framed anew: its `FRAME`s dropped, the rest cut into frames of 1 to `most`
/// opcodes (lengths drawn from `seed`), zero-length frames among them.
fn reframed(data: &[u8], most: usize, seed: u64) -> Vec<u8> {
    let starts = opcode_starts(data);
    let mut out = data[..2].to_vec();
    let mut rng = seed;
    let mut draw = |n: usize| {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (rng >> 33) as usize % n
    };
    let ops: Vec<&[u8]> = starts
        .iter()
        .zip(starts.iter().skip(1).chain([&data.len()]))
        .filter(|&(&a, _)| a >= 2 && data[a] != op::FRAME)
        .map(|(&a, &b)| &data[a..b])
        .collect();
    let mut i = 0;
    while i < ops.len() {
        if draw(50) == 0 {
            out.push(op::FRAME);
            out.extend_from_slice(&0u64.to_le_bytes());
        }
        let n = (1 + draw(most)).min(ops.len() - i);
        let body: Vec<u8> = ops[i..i + n].concat();
        out.push(op::FRAME);
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        i += n;
    }
    out
}

#[test]
fn the_corpus_scans_the_same_in_segments() {
    let files = super::super::parallel::tests::corpus();
    if files.is_empty() {
        println!("skipped: ../shared/traces is absent");
        return;
    }
    let mut scanned = 0;
    for (p, data) in &files {
        for (threads, segment_bytes) in [(2, 1), (3, 100_000), (8, 1 << 20)] {
            for keep in [true, false] {
                if segmented(data, threads, segment_bytes, notes(keep)).is_some() {
                    scanned += 1;
                } else {
                    // One segment only: less than a segment and a frame (64 KiB).
                    assert!(
                        data.len() < segment_bytes as usize + 70_000,
                        "{p}: not segmented"
                    );
                }
            }
        }
        assert!(
            segmented(data, 2, 1, None).is_some() || data.len() < 70_000,
            "{p}"
        );
    }
    println!("{scanned} segmented scans of {} files", files.len());
    assert!(scanned >= files.len() * 2, "{scanned}");
}

#[test]
fn frames_cut_anywhere_scan_the_same() {
    let data = super::super::parallel::tests::written();
    for (most, seed) in [(1, 1), (3, 2), (40, 3), (400, 4)] {
        let framed = reframed(&data, most, seed);
        let serial_snap = super::super::decode_serial(&data).expect("decodes");
        let framed_snap = super::super::decode_serial(&framed).expect("the reframed decodes");
        assert_eq!(format!("{serial_snap:?}"), format!("{framed_snap:?}"));
        for (threads, segment_bytes) in [(2, 1), (5, 37), (3, 5000)] {
            for keep in [true, false] {
                segmented(&framed, threads, segment_bytes, notes(keep))
                    .unwrap_or_else(|| panic!("frames of {most}: not segmented"));
            }
        }
    }
}

#[test]
fn what_the_segments_cannot_scan_exactly_is_left_to_the_serial_scan() {
    let data = reframed(&super::super::parallel::tests::written(), 30, 9);
    assert!(segmented(&data, 3, 1000, notes(true)).is_some());
    // A frame whose length ends inside an opcode of the next frame, on a byte that reads
    // as `FRAME`: the segment before that cut does not end there.
    let starts = opcode_starts(&data);
    let frame = starts
        .iter()
        .copied()
        .find(|&a| a > data.len() / 2 && data[a] == op::FRAME)
        .expect("a frame");
    let next =
        frame + 9 + u64::from_le_bytes(data[frame + 1..frame + 9].try_into().unwrap()) as usize;
    let inside = (next + 9..next + 4000)
        .find(|&q| starts.binary_search(&q).is_err() && starts.binary_search(&(q - 1)).is_ok())
        .expect("an opcode's argument");
    let mut bad = data.clone();
    bad[inside] = op::FRAME;
    bad[frame + 1..frame + 9].copy_from_slice(&((inside - frame - 9) as u64).to_le_bytes());
    let cuts = Cuts {
        threads: 3,
        segment_bytes: 1,
        notes: notes(true),
        step: 4096,
        frames: u64::MAX,
    };
    assert!(scan(&read_at(&bad), bad.len() as u64, cuts, &mut |_| true).is_none());
    // Not framed (protocol 2), a single segment, a read that fails, a cancel.
    let mut two = data.clone();
    two[1] = 2;
    assert!(scan(&read_at(&two), two.len() as u64, cuts, &mut |_| true).is_none());
    let one = Cuts {
        segment_bytes: u64::MAX,
        ..cuts
    };
    assert!(scan(&read_at(&data), data.len() as u64, one, &mut |_| true).is_none());
    let whole = read_at(&data);
    let failing = |at: u64, buf: &mut [u8]| {
        if at > 1000 {
            Err(std::io::Error::other("gone"))
        } else {
            whole(at, buf)
        }
    };
    assert!(scan(&failing, data.len() as u64, cuts, &mut |_| true).is_none());
    let cancelled = scan(&read_at(&data), data.len() as u64, cuts, &mut |_| false);
    assert!(matches!(
        cancelled,
        Some(Err(crate::snapshot::error::ImportError::Cancelled))
    ));
    // A file of list opcodes and little else: not written down.
    let mut lists = data[..2].to_vec();
    let body: Vec<u8> = std::iter::repeat_n([op::MARK, op::EMPTY_DICT, op::APPENDS], 1 << 20)
        .flatten()
        .collect();
    for frame in body.chunks(1 << 16) {
        lists.push(op::FRAME);
        lists.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        lists.extend_from_slice(frame);
    }
    lists.push(op::STOP);
    let big = Cuts {
        segment_bytes: 1 << 20,
        ..cuts
    };
    assert!(scan(&read_at(&lists), lists.len() as u64, big, &mut |_| true).is_none());
    // Frames past the bound on reading them: the rest is the last segment.
    let few = Cuts { frames: 3, ..cuts };
    let mut got = scan(&read_at(&data), data.len() as u64, few, &mut |_| true)
        .expect("segmented")
        .expect("no cancel");
    assert_eq!(got.digest(), serial(&data, notes(true)).digest());
    // Cut short: ends unreadable, as the serial scan does.
    let cut = &data[..data.len() * 2 / 3];
    assert!(segmented(cut, 3, 1000, notes(true)).is_some());
}
