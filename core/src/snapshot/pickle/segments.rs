//! The pre-pass on several threads, over a framed pickle file read where it lies.
//!
//! Protocol 4 writes its opcodes in frames: a `FRAME` opcode with the frame's length,
//! then the frame's opcodes. Python's pickler closes a frame only between opcodes, so
//! each frame's start is an opcode start the pre-pass reaches, and the frames' starts are
//! found from the first by their lengths alone (9 bytes read a frame). The file is cut at
//! some of them into segments, each scanned on a thread of its own
//! ([`Scanner::segment`]): the memo indices read back, the strings memoized and the
//! `MEMOIZE`s counted, the list opcodes written down ([`super::prepass::Log`]). In file
//! order, [`Scanner::absorb`] follows each segment's list opcodes from the marks open
//! before it and takes the rest: the serial pre-pass's result, boundaries aside (each
//! segment's start is one too). A segment whose scan does not end exactly where the next
//! begins (a frame cut inside an opcode: not how Python writes), a read that fails, or
//! notes past their bound give `None`: the caller scans the file serially. So does a
//! segment whose log outgrows half its bytes (hostile input: a snapshot's is about 4 %);
//! and the frames read to find the cuts are bounded ([`Cuts::frames`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::chunked::ReadAt;
use super::opcodes::op;
use super::prepass::{Notes, Scanner, Totals};
use crate::snapshot::error::ImportError;

/// A segment's scan reads pieces of this many bytes.
const PIECE_BYTES: usize = 4 << 20;

/// How a segmented pre-pass cuts its input.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cuts {
    pub(super) threads: usize,
    /// A segment spans at least this many bytes (whole frames).
    pub(super) segment_bytes: u64,
    /// Notes for a parallel second pass: `(batch step, keep the strings' bytes)`.
    pub(super) notes: Option<(u64, bool)>,
    /// Boundary step ([`Scanner::new`]).
    pub(super) step: u64,
    /// Frames read at most (a read each) to find the cuts; the rest of the file is the
    /// last segment.
    pub(super) frames: u64,
}

impl Cuts {
    /// About eight segments a thread (so that the last ones to finish are short), each
    /// between 1 and 256 MiB.
    pub(super) fn for_input(
        len: u64,
        threads: usize,
        notes: Option<(u64, bool)>,
        step: u64,
    ) -> Cuts {
        Cuts {
            threads,
            segment_bytes: (len / (8 * threads.max(1) as u64)).clamp(1 << 20, 256 << 20),
            notes,
            step,
            // Python's frames are about 64 KiB.
            frames: len / (16 << 10) + 1024,
        }
    }
}

/// The segments' starts: 0, then frame starts at least `cuts.segment_bytes` apart. `None`
/// where the input is not framed from its start (protocol 4 and later), or has a single
/// segment.
fn starts(read_at: &ReadAt<'_>, len: u64, cuts: Cuts) -> Option<Vec<u64>> {
    let mut head = [0u8; 11];
    if len < head.len() as u64 {
        return None;
    }
    read_at(0, &mut head).ok()?;
    if head[0] != op::PROTO || head[1] < 4 || head[2] != op::FRAME {
        return None;
    }
    let mut out = vec![0];
    let mut pos = 2u64;
    let mut frame = [0u8; 9];
    let mut left = cuts.frames;
    while pos + frame.len() as u64 <= len && left > 0 {
        left -= 1;
        read_at(pos, &mut frame).ok()?;
        if frame[0] != op::FRAME {
            break;
        }
        if pos - out.last().copied().unwrap_or(0) >= cuts.segment_bytes {
            out.push(pos);
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&frame[1..]);
        pos = pos.checked_add(9)?.checked_add(u64::from_le_bytes(n))?;
    }
    (out.len() > 1).then_some(out)
}

/// The pre-pass over the file of `len` bytes that `read_at` reads, on `cuts.threads`
/// threads; `progress(bytes scanned)` returns false to cancel (`Some(Err(Cancelled))`).
/// `None`: not scanned this way (scan it serially).
pub(super) fn scan(
    read_at: &ReadAt<'_>,
    len: u64,
    cuts: Cuts,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Option<Result<Scanner, ImportError>> {
    if cuts.threads < 2 {
        return None;
    }
    let starts = starts(read_at, len, cuts)?;
    let mut whole = Scanner::new(len, cuts.step);
    whole.notes = cuts.notes.map(|(batch_step, keep_bytes)| {
        let mut n = Notes::new(len, batch_step);
        n.keep_bytes = keep_bytes;
        Box::new(n)
    });
    let next = AtomicUsize::new(0);
    let scanned = AtomicU64::new(0);
    let totals = Arc::new(Totals::default());
    let stop = AtomicBool::new(false);
    let (done, results) = mpsc::channel::<(usize, Option<Scanner>)>();
    let count = starts.len();
    let starts = &starts;
    let segment = |i: usize, buf: &mut Vec<u8>| -> Option<Scanner> {
        let start = *starts.get(i)?;
        let end = starts.get(i + 1).copied().unwrap_or(len);
        scan_segment(
            read_at,
            (start, end, len),
            cuts,
            &totals,
            buf,
            &scanned,
            &stop,
        )
    };
    std::thread::scope(|s| {
        for _ in 0..cuts.threads.min(count) {
            let done = done.clone();
            let (next, stop, segment) = (&next, &stop, &segment);
            s.spawn(move || {
                let mut buf = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    // A send fails once the scan has stopped taking them.
                    if done.send((i, segment(i, &mut buf))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(done);
        let r = absorb_in_order(&mut whole, &results, count, &scanned, progress);
        stop.store(true, Ordering::Relaxed);
        r
    })
    .map(|r| r.map(|()| whole))
}

/// Takes the segments' scans into `whole` in file order as they come.
fn absorb_in_order(
    whole: &mut Scanner,
    results: &mpsc::Receiver<(usize, Option<Scanner>)>,
    count: usize,
    scanned: &AtomicU64,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Option<Result<(), ImportError>> {
    let mut waiting = BTreeMap::new();
    let mut next = 0;
    while next < count && whole.end.is_none() {
        match results.recv_timeout(Duration::from_millis(100)) {
            Ok((i, seg)) => {
                waiting.insert(i, seg?);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        }
        while let Some(seg) = waiting.remove(&next) {
            if !whole.absorb(seg) {
                return None;
            }
            next += 1;
        }
        if !progress(scanned.load(Ordering::Relaxed)) {
            return Some(Err(ImportError::Cancelled));
        }
    }
    whole.end.is_some().then_some(Ok(()))
}

/// Scans `[start, end)` of the input of `len` bytes in pieces read into `buf`; `None` if
/// a read fails, the scan is stopped, or it does not end exactly at `end` (short of the
/// input's end).
fn scan_segment(
    read_at: &ReadAt<'_>,
    (start, end, len): (u64, u64, u64),
    cuts: Cuts,
    totals: &Arc<Totals>,
    buf: &mut Vec<u8>,
    scanned: &AtomicU64,
    stop: &AtomicBool,
) -> Option<Scanner> {
    let mut scan = Scanner::segment(len, start, cuts.step, cuts.notes, totals);
    let want = usize::try_from((end - start).min(PIECE_BYTES as u64)).ok()?;
    if buf.len() < want {
        buf.resize(want, 0);
    }
    let mut carry: Vec<u8> = Vec::new();
    let mut pos = start;
    while pos < end && scan.end.is_none() {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let n = usize::try_from((end - pos).min(PIECE_BYTES as u64)).ok()?;
        let piece = buf.get_mut(..n)?;
        read_at(pos, piece).ok()?;
        pos += n as u64;
        scan.scan_carrying(&mut carry, piece, pos == len);
        scanned.fetch_add(n as u64, Ordering::Relaxed);
        // A snapshot's list opcodes are a few in a hundred bytes; a file of little else is
        // scanned serially rather than written down.
        if scan.log_bytes() > (pos - start) / 2 + (1 << 20) {
            return None;
        }
    }
    if let Some(n) = scan.notes.as_deref_mut()
        && n.share()
    {
        n.overflow = true;
    }
    (scan.end.is_some() || (carry.is_empty() && scan.pos == end)).then_some(scan)
}

#[cfg(test)]
#[path = "segments_tests.rs"]
mod tests;
