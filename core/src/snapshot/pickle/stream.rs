//! A snapshot pickle decoded from its bytes given in pieces, in two passes over them, so
//! that the caller never holds the whole input: the pre-pass ([`Scanner`]) first, which
//! also notes opcode boundaries every [`WINDOW_STEP`] bytes; then the machine, run over
//! windows that end at those boundaries (an opcode never straddles two windows). The
//! bytes of the strings it keeps are copied out of each window ([`Vm::keep_span`]), so a
//! window is dropped once run. Offsets in errors are those of the whole input.

use super::machine::Vm;
use super::prepass::{End, Scanner};
use super::value::Value;
use crate::snapshot::RawSnapshot;
use crate::snapshot::error::ImportError;

/// The machine runs over windows of about this many bytes (an opcode boundary every
/// `WINDOW_STEP` bytes or more is noted by the pre-pass).
pub const WINDOW_STEP: u64 = 1 << 20;

/// A pickle decoded from pieces of its bytes: [`PickleStream::feed`] them all, then
/// [`PickleStream::end_pass`]; again from the first byte, and `end_pass` gives the
/// snapshot.
#[derive(Debug)]
pub struct PickleStream {
    state: State,
    /// Bytes fed but not scanned (first pass) or not run (second pass): they start an
    /// opcode, or a window, that needs what follows.
    carry: Vec<u8>,
    /// Bytes fed in this pass.
    fed: u64,
}

enum State {
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
}

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
        }
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
            State::Over => Ok(()),
        }
    }

    /// The end of the input in this pass: after the first, `None` (feed it again from
    /// its start); after the second, the snapshot.
    pub fn end_pass(&mut self) -> Result<Option<RawSnapshot>, ImportError> {
        match std::mem::replace(&mut self.state, State::Over) {
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
                let mut vm = Vm::with_refs(&[], scanner.refs, total_len, true);
                vm.list_hints = hints;
                vm.copy_spans = true;
                vm.last = false;
                self.state = State::Decode(Box::new(Decode {
                    vm: Some(vm),
                    boundaries: scanner.boundaries,
                    next: 0,
                    end,
                    total,
                    done: None,
                }));
                self.fed = 0;
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
        if self.done.is_some() {
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

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
