//! A snapshot pickle decoded from its bytes given in pieces, in two passes over them, so
//! that the caller never holds the whole input: the pre-pass ([`Scanner`]) first, which
//! also notes opcode boundaries every [`WINDOW_STEP`] bytes; then the machine, run over
//! windows that end at those boundaries (an opcode never straddles two windows). The
//! bytes of the strings it keeps are copied out of each window ([`Vm::keep_span`]), so a
//! window is dropped once run. Offsets in errors are those of the whole input.
//!
//! A pickle of known size up to [`SINGLE_PASS_MAX_BYTES`] is first decoded in one pass
//! ([`PickleStream::single_pass`]): the machine runs over each piece as it comes, an
//! opcode cut by a piece's end waiting for the next, with a memo that keeps every slot
//! (no pre-pass said which are read back, [`super::memo::Every`]). What the pre-pass
//! decided ahead is then decided as the machine goes: a container is shared once a `GET`
//! reads it, a converted frame or stack is kept (a later `GET` may read it). The one case
//! it cannot decide ahead, a trace entry converted and freed and then read back by a
//! `GET`, and anything else unexpected (any error: a refused opcode, a truncated file)
//! gives way to the two passes from the start, which decode and report exactly as ever.
//!
//! Both run trace entries as one step ([`Vm::entry`]), handing each to its list ahead of
//! the `APPENDS` that closes the list's mark. An error while such a list is guarded may be
//! the fast path's own (the loop would have held the entries' dicts on the stack there), so
//! the second pass then runs once more from the input's first byte, without the fast path
//! ([`Decode::redo`]): one pass more, and the error or snapshot the loop gives. Only inputs
//! that `pickle.dump` never writes take it.

use super::machine::Vm;
use super::memo::IndexSet;
use super::prepass::{End, Scanner};
use super::value::Value;
use crate::snapshot::RawSnapshot;
use crate::snapshot::error::ImportError;

/// The machine runs over windows of about this many bytes (an opcode boundary every
/// `WINDOW_STEP` bytes or more is noted by the pre-pass).
pub const WINDOW_STEP: u64 = 1 << 20;

/// Plain pickles of a known size up to this are decoded in one pass first
/// ([`PickleStream::single_pass`]). It holds more than the second pass does (a memo slot
/// for every object stored, 20 bytes each; every frame and stack container, converted),
/// which stays below the input's size on real snapshots.
pub const SINGLE_PASS_MAX_BYTES: u64 = 64 << 20;

/// A pickle decoded from pieces of its bytes: [`PickleStream::feed`] them all, then
/// [`PickleStream::end_pass`]; again from the first byte, and `end_pass` gives the
/// snapshot.
#[derive(Debug)]
pub struct PickleStream {
    state: State,
    /// The passes over the input this decode takes (1: the single pass; 2; 3: a single
    /// pass that gave way to two, or a second pass run once more, [`Decode::redo`]; 4:
    /// both), and the one the bytes fed belong to.
    passes: u8,
    pass: u8,
    /// Bytes fed but not scanned (first pass) or not run (second pass): they start an
    /// opcode, or a window, that needs what follows.
    carry: Vec<u8>,
    /// Bytes fed in this pass.
    fed: u64,
}

enum State {
    Single(Box<Single>),
    Scan {
        scanner: Box<Scanner>,
        /// The input's size if known (else the memo's dense bound follows the bytes fed).
        total: Option<u64>,
        /// The carry is scanned again once it is this long (a line opcode's carry is
        /// searched for its end again only once it has doubled).
        rescan_at: usize,
    },
    Decode(Box<Decode>),
    Over,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            State::Single(_) => "Single",
            State::Scan { .. } => "Scan",
            State::Decode(_) => "Decode",
            State::Over => "Over",
        })
    }
}

struct Decode {
    /// The machine between windows (on no bytes); out of it while it runs one.
    vm: Option<Vm<'static>>,
    boundaries: Vec<u64>,
    /// The first boundary not yet reached.
    next: usize,
    /// Where the input the machine needs ends: the whole input's end, or the byte after
    /// the opcode the pre-pass stopped at (`STOP`, a refused or unknown opcode).
    end: u64,
    /// The first pass's size of the input.
    total: u64,
    done: Option<(Value, usize)>,
    /// The pre-pass's hints, for a pass run once more ([`super::machine::Vm::list_hints`]
    /// takes each as it is used).
    hints: Vec<(u64, u64)>,
    /// The machine failed while a list of entries it handed over ahead was guarded: the
    /// rest of this pass is ignored, and `vm` (made afresh, without the fast path) runs
    /// the next one.
    redo: bool,
}

/// The single pass: the machine between pieces.
struct Single {
    /// `None` once it gave way (an error, or a container read after it was freed).
    vm: Option<Vm<'static>>,
    total: u64,
    window_step: u64,
    done: Option<(Value, usize)>,
    /// The input ended inside an opcode (or before `STOP`): the error the two passes
    /// report too, at the same offset, so it is reported without them.
    truncated: Option<ImportError>,
}

/// An opcode cut by the end of a piece is run again on its bytes (the carry) and this
/// many of the next piece's at least (its carry's length at most: an argument of many
/// pieces takes a few tries, each copying twice as much).
const CARRY_STEP: usize = 64 << 10;

impl PickleStream {
    /// A stream of a pickle of `total` bytes, or of a size known only at its end, run
    /// over windows of about `window_step` bytes ([`WINDOW_STEP`]).
    #[must_use]
    pub fn new(total: Option<u64>, window_step: u64) -> PickleStream {
        PickleStream {
            state: State::Scan {
                scanner: Box::new(Scanner::new(total.unwrap_or(0), window_step.max(1))),
                total,
                rescan_at: 0,
            },
            carry: Vec::new(),
            fed: 0,
            passes: 2,
            pass: 1,
        }
    }

    /// A stream of a pickle of `total` bytes decoded in one pass where it can be, else
    /// in two after it ([`end_pass`](PickleStream::end_pass) then asks for the input
    /// again); run over windows of about `window_step` bytes in the two.
    #[must_use]
    pub fn single_pass(total: u64, window_step: u64) -> PickleStream {
        let total_len = usize::try_from(total).unwrap_or(usize::MAX);
        let mut vm = Vm::with_refs(&[], super::memo::IndexSet::default(), total_len, true);
        vm.memo = super::memo::Memo::every(total_len);
        vm.fast_entries = true;
        vm.copy_spans = true;
        vm.last = false;
        PickleStream {
            state: State::Single(Box::new(Single {
                vm: Some(vm),
                total,
                window_step,
                done: None,
                truncated: None,
            })),
            carry: Vec::new(),
            fed: 0,
            passes: 1,
            pass: 1,
        }
    }

    /// The passes over the input this decode takes, as far as it knows (1, 2, 3 for a
    /// single pass that gave way to two or a second pass run once more, 4 for both), and
    /// the pass the bytes fed now belong to.
    #[must_use]
    pub fn passes(&self) -> (u8, u8) {
        (self.pass, self.passes)
    }

    /// Whether the first pass is over (the input is to be fed again from its start).
    #[must_use]
    pub fn second_pass(&self) -> bool {
        !matches!(self.state, State::Scan { .. })
    }

    /// The next piece of the input, in order.
    pub fn feed(&mut self, piece: &[u8]) -> Result<(), ImportError> {
        let start = self.fed;
        self.fed += piece.len() as u64;
        match &mut self.state {
            State::Scan {
                scanner,
                total,
                rescan_at,
            } => {
                if total.is_none() {
                    scanner.raise_limit(self.fed);
                }
                if self.carry.is_empty() {
                    let read = scanner.scan(piece, false);
                    self.carry
                        .extend_from_slice(piece.get(read..).unwrap_or(&[]));
                } else {
                    self.carry.extend_from_slice(piece);
                    if self.carry.len() < *rescan_at {
                        return Ok(());
                    }
                    let read = scanner.scan(&self.carry, false);
                    self.carry.drain(..read.min(self.carry.len()));
                }
                *rescan_at = self.carry.len().saturating_mul(2);
                Ok(())
            }
            State::Decode(d) => d.feed(&mut self.carry, piece, start, self.fed),
            State::Single(one) => {
                one.feed(&mut self.carry, piece, start);
                Ok(())
            }
            State::Over => Ok(()),
        }
    }

    /// The end of the input in this pass: after the first, `None` (feed it again from
    /// its start); after the second, the snapshot.
    pub fn end_pass(&mut self) -> Result<Option<RawSnapshot>, ImportError> {
        self.pass += 1;
        match std::mem::replace(&mut self.state, State::Over) {
            State::Single(mut one) => {
                if let (Some(vm), Some((root, stop_at))) = (one.vm.take(), one.done.take())
                    && let Ok(snap) = vm.snapshot(root, stop_at)
                {
                    return Ok(Some(snap));
                }
                if let Some(e) = one.truncated.take() {
                    return Err(e);
                }
                // The two passes, from the input's first byte.
                self.state = State::Scan {
                    scanner: Box::new(Scanner::new(one.total, one.window_step.max(1))),
                    total: Some(one.total),
                    rescan_at: 0,
                };
                self.carry = Vec::new();
                self.fed = 0;
                self.passes = 3;
                Ok(None)
            }
            State::Scan { mut scanner, .. } => {
                let total = self.fed;
                scanner.raise_limit(total);
                scanner.scan(&self.carry, true);
                self.carry = Vec::new();
                let end = match scanner.end {
                    Some(End::Opcode(at)) => (at + 1).min(total),
                    _ => total,
                };
                let total_len = usize::try_from(total).map_err(|_| too_big(total))?;
                let hints = scanner.lengths.hints();
                let vm = decode_machine(scanner.refs, hints.clone(), total_len, true);
                self.state = State::Decode(Box::new(Decode {
                    vm: Some(vm),
                    boundaries: scanner.boundaries,
                    next: 0,
                    end,
                    total,
                    done: None,
                    hints,
                    redo: false,
                }));
                self.fed = 0;
                Ok(None)
            }
            State::Decode(mut d) if d.redo => {
                d.redo = false;
                self.state = State::Decode(d);
                self.carry = Vec::new();
                self.fed = 0;
                self.passes += 1;
                Ok(None)
            }
            State::Decode(mut d) => {
                if d.done.is_none() {
                    return Err(changed(d.total, self.fed));
                }
                match (d.vm.take(), d.done.take()) {
                    (Some(vm), Some((root, stop_at))) => {
                        vm.snapshot(root, stop_at).map(Some).map_err(|e| *e)
                    }
                    _ => Err(changed(d.total, self.fed)),
                }
            }
            State::Over => Err(ImportError::Format(
                "the decoder was used after its end".into(),
            )),
        }
    }
}

/// The second pass's machine over an input of `total_len` bytes whose pre-pass found
/// `refs` and `hints`; `fast`: trace entries may run as one step.
fn decode_machine(
    refs: IndexSet,
    hints: Vec<(u64, u64)>,
    total_len: usize,
    fast: bool,
) -> Vm<'static> {
    let mut vm = Vm::with_refs(&[], refs, total_len, true);
    vm.list_hints = hints;
    vm.fast_entries = fast;
    vm.copy_spans = true;
    vm.last = false;
    vm
}

/// The pre-pass's `refs` and the input's size that a machine was made with; the rest of
/// it is dropped here, before a machine is made again from them.
fn notes_of(vm: Vm<'static>) -> (IndexSet, usize) {
    (vm.memo.refs, vm.input_len)
}

fn too_big(total: u64) -> ImportError {
    ImportError::Format(format!(
        "{total} bytes of pickle: more than this machine's address space"
    ))
}

fn changed(was: u64, now: u64) -> ImportError {
    ImportError::Format(format!(
        "the file changed while it was read ({was} bytes at the first reading, {now} at the second)"
    ))
}

impl Single {
    /// Runs the machine over `piece` (the input from `start`), after the carry of an
    /// opcode the last piece cut; keeps what an opcode cut again needs in `carry`.
    fn feed(&mut self, carry: &mut Vec<u8>, piece: &[u8], start: u64) {
        if self.done.is_some() {
            return;
        }
        let Some(mut vm) = self.vm.take() else {
            return;
        };
        let mut used = 0usize;
        while used < piece.len() {
            let base = vm.pos;
            let window: &[u8] = if carry.is_empty() {
                let rest = piece.get(used..).unwrap_or(&[]);
                used = piece.len();
                rest
            } else {
                let take = carry.len().max(CARRY_STEP).min(piece.len() - used);
                carry.extend_from_slice(piece.get(used..used + take).unwrap_or(&[]));
                used += take;
                carry
            };
            if window.is_empty() {
                break;
            }
            let end = base as u64 + window.len() as u64;
            if carry.is_empty() && base as u64 != start + (used - window.len()) as u64 {
                // The machine does not stand where this piece starts: not this input.
                return;
            }
            let last = end >= self.total;
            let mut on_window = vm.reseat(window, base, last);
            let r = on_window.run_window();
            let pos = match &r {
                Err(e) if !last && let ImportError::Truncated { offset, .. } = **e => {
                    usize::try_from(offset).unwrap_or(usize::MAX)
                }
                _ => on_window.pos,
            };
            on_window.pos = pos;
            vm = on_window.reseat(&[], pos, false);
            match r {
                Ok(Some(done)) => {
                    self.done = Some(done);
                    self.vm = Some(vm);
                    return;
                }
                Ok(None) => carry.clear(),
                Err(e) if !last && matches!(*e, ImportError::Truncated { .. }) => {
                    // The opcode at `pos` needs bytes of the next piece.
                    let Some(rest) = window.get(pos.wrapping_sub(base)..).map(<[u8]>::to_vec)
                    else {
                        return;
                    };
                    *carry = rest;
                }
                Err(e) if last && matches!(*e, ImportError::Truncated { .. }) => {
                    self.truncated = Some(*e);
                    return;
                }
                // Gives way to the two passes ([`PickleStream::end_pass`]).
                Err(_) => return,
            }
        }
        self.vm = Some(vm);
    }
}

impl Decode {
    /// Runs the machine over each window that `piece` (the input from `start` to `fed`)
    /// completes; keeps the rest in `carry`.
    fn feed(
        &mut self,
        carry: &mut Vec<u8>,
        piece: &[u8],
        start: u64,
        fed: u64,
    ) -> Result<(), ImportError> {
        if self.done.is_some() || self.redo {
            return Ok(());
        }
        let Some(mut vm) = self.vm.take() else {
            return Ok(());
        };
        let mut used = 0usize;
        loop {
            // The farthest window end the input fed reaches.
            let mut to = None;
            while let Some(&b) = self.boundaries.get(self.next)
                && b <= fed
                && b < self.end
            {
                if b > vm.pos as u64 {
                    to = Some(b);
                }
                self.next += 1;
            }
            let last = to.is_none() && fed >= self.end;
            let to = match to {
                Some(b) => b,
                None if last => self.end,
                None => break,
            };
            let upto = usize::try_from(to.saturating_sub(start))
                .unwrap_or(usize::MAX)
                .min(piece.len());
            let base = vm.pos;
            let window: &[u8] = if carry.is_empty() {
                piece.get(used..upto).unwrap_or(&[])
            } else {
                carry.extend_from_slice(piece.get(used..upto).unwrap_or(&[]));
                carry
            };
            used = upto;
            let mut on_window = vm.reseat(window, base, last);
            let r = on_window.run_window();
            let pos = on_window.pos;
            vm = on_window.reseat(&[], pos, false);
            carry.clear();
            match r {
                Ok(Some(done)) => {
                    self.done = Some(done);
                    self.vm = Some(vm);
                    return Ok(());
                }
                Ok(None) if last => return Err(changed(self.total, fed)),
                Ok(None) => {}
                Err(_) if vm.entry_guard.depth != 0 => {
                    self.run_again(vm);
                    return Ok(());
                }
                Err(e) => return Err(*e),
            }
            if pos as u64 != to {
                return Err(changed(self.total, fed));
            }
        }
        carry.extend_from_slice(piece.get(used..).unwrap_or(&[]));
        self.vm = Some(vm);
        Ok(())
    }
}

impl Decode {
    /// The machine `failed` while a list of entries it handed over ahead was guarded: the
    /// error may be the fast path's, so the pass runs once more without it, from the
    /// pre-pass's notes as they were (its memo's `refs` are never changed by a run).
    fn run_again(&mut self, failed: Vm<'static>) {
        let (refs, total_len) = notes_of(failed);
        self.vm = Some(decode_machine(refs, self.hints.clone(), total_len, false));
        self.next = 0;
        self.redo = true;
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
