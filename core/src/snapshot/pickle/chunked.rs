//! The parallel second pass ([`super::parallel`]) over a file read where it lies, never
//! held whole (the app and the CLI open large plain files this way, natively).
//!
//! The first pass reads the file in pieces, as the streamed decode does, its notes
//! keeping copies of the memoized strings' bytes. In the second, each chunk's machine
//! reads its chunk's bytes itself (`read_at`), on its thread; this thread runs the
//! serial machine over windows up to each chunk, as the streamed decode does, and merges
//! the chunks in file order as they are done. At most one chunk's bytes per thread are
//! held at a time. Anything unexpected gives `None`: the caller decodes the file the
//! streamed way, which reports as ever.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, mpsc};

use super::machine::Vm;
use super::memo::Memo;
use super::parallel::{Chunk, Done, Plan, Runs, Source, parts, plan_chunks, rooms, run_chunk};
use super::prepass::{End, Notes, Scanner};
use super::segments::{self, Cuts};
use super::stream::WINDOW_STEP;
use crate::snapshot::error::ImportError;
use crate::snapshot::{RawEvent, RawSnapshot};

/// Reads `buf.len()` bytes of the file at an offset.
pub type ReadAt<'a> = dyn Fn(u64, &mut [u8]) -> std::io::Result<()> + Sync + 'a;

/// The first pass reads pieces of this many bytes, up to [`AHEAD`] of them ahead.
const PIECE_BYTES: usize = 4 << 20;
const AHEAD: usize = 4;

/// Decodes the plain pickle file of `len` bytes that `read_at` reads, the second pass on
/// `plan.threads` threads. `progress(pass, bytes done)` returns false to cancel. `None`:
/// not decoded this way (decode it the streamed way); else the result and the chunks
/// merged.
pub(crate) fn decode(
    read_at: &ReadAt<'_>,
    len: u64,
    plan: Plan,
    progress: &mut dyn FnMut(u8, u64) -> bool,
) -> Option<Result<(RawSnapshot, usize), ImportError>> {
    let total = usize::try_from(len).ok()?;
    let cuts = Cuts::for_input(
        len,
        plan.threads,
        Some((plan.batch_step, true)),
        WINDOW_STEP,
    );
    let mut scan = match segments::scan(read_at, len, cuts, &mut |n| progress(1, n)) {
        Some(Ok(scan)) => scan,
        Some(Err(e)) => return Some(Err(e)),
        None => match first_pass(read_at, len, plan, progress)? {
            Ok(scan) => scan,
            Err(e) => return Some(Err(e)),
        },
    };
    let end = match scan.end {
        Some(End::Opcode(at)) => (at + 1).min(len),
        _ => len,
    };
    let notes = scan.notes.take()?;
    if notes.puts || notes.overflow {
        return None;
    }
    let chunks = plan_chunks(&notes, plan.chunk_bytes);
    if chunks.is_empty() || chunks.iter().any(|c| c.end > end) {
        return None;
    }
    let directory = Memo::new(scan.refs.clone(), total);
    let mut vm = Vm::with_refs(&[], scan.refs, total, true);
    vm.list_hints = scan.lengths.hints();
    vm.copy_spans = true;
    vm.last = false;
    let mut rooms = rooms(&mut vm, &chunks)?;
    let mut runs = Runs::of(&rooms);
    let shared = Shared {
        parts: parts(&mut rooms, &chunks)
            .into_iter()
            .map(|p| Mutex::new(Some(p)))
            .collect(),
        read_at,
        total,
        notes: &notes,
        directory: &directory,
        chunks: &chunks,
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        results: Mutex::new(chunks.iter().map(|_| Slot::Pending).collect()),
        ready: Condvar::new(),
    };
    let mut serial = Serial {
        read_at,
        boundaries: &scan.boundaries,
        end,
        window: Vec::new(),
    };
    let merged = std::thread::scope(|s| {
        for _ in 0..plan.threads.clamp(1, 16).min(chunks.len()) {
            s.spawn(|| shared.work());
        }
        let r = serial.merge_all(vm, &mut runs, &shared, progress);
        shared.stop.store(true, Ordering::Relaxed);
        r
    });
    drop(shared);
    let mut vm = match merged? {
        Ok(vm) => vm,
        Err(e) => return Some(Err(e)),
    };
    runs.settle(&mut vm, rooms)?;
    let (vm, done) = serial.run_to(vm, end)?;
    let (root, stop_at) = done?;
    let snap = vm.snapshot(root, stop_at).ok()?;
    Some(Ok((snap, chunks.len())))
}

/// The pre-pass on this thread, the file read ahead. `None`: a read failed.
fn first_pass(
    read_at: &ReadAt<'_>,
    len: u64,
    plan: Plan,
    progress: &mut dyn FnMut(u8, u64) -> bool,
) -> Option<Result<Scanner, ImportError>> {
    let mut scan = Scanner::new(len, WINDOW_STEP);
    let mut notes = Notes::new(len, plan.batch_step);
    notes.keep_bytes = true;
    scan.notes = Some(Box::new(notes));
    let mut carry: Vec<u8> = Vec::new();
    let first = read_ahead(read_at, len, &mut |buf, pos| {
        scan.scan_carrying(&mut carry, buf, false);
        progress(1, pos)
    })?;
    if !first {
        return Some(Err(ImportError::Cancelled));
    }
    scan.scan(&carry, true);
    Some(Ok(scan))
}

/// Reads the file in pieces of [`PIECE_BYTES`] on a thread of its own, up to
/// [`AHEAD`] pieces ahead (the kernel's copy of the file off the first pass's thread),
/// and hands each to `consume` with the bytes read so far, in order. `None`: a read
/// failed; `Some(false)`: `consume` stopped it.
fn read_ahead(
    read_at: &ReadAt<'_>,
    len: u64,
    consume: &mut dyn FnMut(&[u8], u64) -> bool,
) -> Option<bool> {
    std::thread::scope(|s| {
        let (full, pieces) = mpsc::sync_channel::<Option<(Vec<u8>, usize)>>(AHEAD);
        let (give_back, returned) = mpsc::channel::<Vec<u8>>();
        s.spawn(move || {
            let mut pos = 0u64;
            while pos < len {
                let n = usize::try_from((len - pos).min(PIECE_BYTES as u64)).unwrap_or(0);
                let mut buf = returned.try_recv().unwrap_or_else(|_| vec![0; PIECE_BYTES]);
                let read = buf.get_mut(..n).map(|b| read_at(pos, b));
                // A send fails once the first pass has stopped: so does this thread.
                if !matches!(read, Some(Ok(()))) {
                    let _ = full.send(None);
                    return;
                }
                if full.send(Some((buf, n))).is_err() {
                    return;
                }
                pos += n as u64;
            }
        });
        let mut pos = 0u64;
        for piece in pieces {
            let (buf, n) = piece?;
            pos += n as u64;
            if !consume(buf.get(..n)?, pos) {
                return Some(false);
            }
            let _ = give_back.send(buf);
        }
        (pos == len).then_some(true)
    })
}

/// A chunk's result as the serial machine waits for it.
enum Slot<'a> {
    Pending,
    Failed,
    Done(Box<Done<'a>>),
    Taken,
}

/// What the chunks' threads share.
struct Shared<'a, 'r> {
    read_at: &'a ReadAt<'r>,
    total: usize,
    notes: &'a Notes,
    directory: &'a Memo,
    chunks: &'a [Chunk],
    next: AtomicUsize,
    stop: AtomicBool,
    /// Per chunk, once run.
    results: Mutex<Vec<Slot<'a>>>,
    ready: Condvar,
    /// Per chunk: its part of its run's room, until its machine takes it.
    parts: Vec<Mutex<Option<&'a mut [RawEvent]>>>,
}

impl<'a> Shared<'a, '_> {
    fn work(&self) {
        // One buffer a thread, for all its chunks (a fresh one each time was a page
        // fault per 4 KiB read).
        let mut bytes = Vec::new();
        while !self.stop.load(Ordering::Relaxed) {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&c) = self.chunks.get(i) else { break };
            let done = self.run(i, c, &mut bytes);
            if let Ok(mut results) = self.results.lock()
                && let Some(slot) = results.get_mut(i)
            {
                *slot = done.map_or(Slot::Failed, |d| Slot::Done(Box::new(d)));
            }
            self.ready.notify_all();
        }
    }

    fn run(&self, i: usize, c: Chunk, bytes: &mut Vec<u8>) -> Option<Done<'a>> {
        let part = self.parts.get(i)?.lock().ok()?.take()?;
        bytes.resize(usize::try_from(c.end.checked_sub(c.start)?).ok()?, 0);
        (self.read_at)(c.start, bytes).ok()?;
        let src = Source {
            window: bytes,
            base: usize::try_from(c.start).ok()?,
            input_len: self.total,
            string_bytes: Some(&self.notes.string_bytes),
        };
        run_chunk(&src, self.directory, &self.notes.strings, c, part)
    }

    /// Chunk `i`'s machine's result, once it is there.
    fn wait(&self, i: usize) -> Option<Done<'a>> {
        let mut results = self.results.lock().ok()?;
        loop {
            let slot = results.get_mut(i)?;
            match std::mem::replace(slot, Slot::Taken) {
                Slot::Done(done) => return Some(*done),
                Slot::Failed | Slot::Taken => return None,
                Slot::Pending => *slot = Slot::Pending,
            }
            results = self.ready.wait(results).ok()?;
        }
    }
}

/// The serial machine's part: windows up to each chunk, the merges, the rest.
struct Serial<'a, 'r> {
    read_at: &'a ReadAt<'r>,
    boundaries: &'a [u64],
    end: u64,
    window: Vec<u8>,
}

impl Serial<'_, '_> {
    /// Windows up to each chunk, each chunk merged as it is done.
    fn merge_all(
        &mut self,
        mut vm: Vm<'static>,
        runs: &mut Runs,
        shared: &Shared<'_, '_>,
        progress: &mut dyn FnMut(u8, u64) -> bool,
    ) -> Option<Result<Vm<'static>, ImportError>> {
        for (i, c) in shared.chunks.iter().enumerate() {
            vm = self.run_to(vm, c.start)?.0;
            let done = shared.wait(i)?;
            runs.merge(&mut vm, c, done)?;
            if !progress(2, c.end) {
                return Some(Err(ImportError::Cancelled));
            }
        }
        Some(Ok(vm))
    }

    /// Runs the machine over windows to `to` (at the input's end, to `STOP`).
    #[allow(clippy::type_complexity)]
    fn run_to(
        &mut self,
        mut vm: Vm<'static>,
        to: u64,
    ) -> Option<(Vm<'static>, Option<(super::value::Value, usize)>)> {
        while (vm.pos as u64) < to {
            let from = vm.pos as u64;
            let k = self.boundaries.partition_point(|&b| b <= from);
            let next = self.boundaries.get(k).copied().unwrap_or(u64::MAX).min(to);
            let last = next == self.end;
            self.window.resize(usize::try_from(next - from).ok()?, 0);
            (self.read_at)(from, &mut self.window).ok()?;
            let at = vm.pos;
            let mut on = vm.reseat(&self.window, at, last);
            let r = on.run_window();
            let pos = on.pos;
            vm = on.reseat(&[], pos, false);
            match r {
                Ok(Some(done)) if last => return Some((vm, Some(done))),
                Ok(None) if !last && pos as u64 == next => {}
                _ => return None,
            }
        }
        Some((vm, None))
    }
}

#[cfg(test)]
#[path = "chunked_tests.rs"]
pub(super) mod tests;
