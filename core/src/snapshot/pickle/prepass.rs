//! The pre-pass: which memo indices are ever read back.

use super::memo::IndexSet;
use super::opcodes::{
    fixed_args, le_u32, length_prefix, line_at, op, parse_memo_index, read_length,
};

// The pre-pass's view of an opcode byte: below 0x80 the number of argument bytes to
// skip, else one of these classes. A table keeps the common case to one load and one
// well-predicted branch (the pass reads ~9 M opcodes for a 32 MB snapshot).
pub(super) const SCAN_GET1: u8 = 0x80;
pub(super) const SCAN_GET4: u8 = 0x81;
pub(super) const SCAN_COUNTED: u8 = 0x82;
pub(super) const SCAN_LINE: u8 = 0x83;
pub(super) const SCAN_GET_LINE: u8 = 0x84;
pub(super) const SCAN_END: u8 = 0xff;

pub(super) static SCAN_TABLE: [u8; 256] = {
    let mut t = [SCAN_END; 256];
    let mut b = 0;
    while b < 256 {
        let code = b as u8;
        t[b] = match code {
            op::STOP => SCAN_END,
            op::BINGET => SCAN_GET1,
            op::LONG_BINGET => SCAN_GET4,
            op::GET => SCAN_GET_LINE,
            op::INT | op::LONG | op::FLOAT | op::STRING | op::UNICODE | op::PUT => SCAN_LINE,
            _ => match fixed_args(code) {
                Some(n) => n as u8,
                None if length_prefix(code).is_some() => SCAN_COUNTED,
                None => SCAN_END,
            },
        };
        b += 1;
    }
    t
};

/// The pre-pass: which memo indices are ever read back. Stops where the machine would
/// stop (STOP, or an opcode it refuses or cannot read), so it never sees further.
pub(super) fn scan_references(data: &[u8]) -> IndexSet {
    let mut refs = IndexSet::new(data.len());
    let mut pos = 0usize;
    while let Some(&code) = data.get(pos) {
        // GETs are half of a snapshot's opcodes: a predicted branch each, so that the
        // next position does not wait for the table load.
        if code == op::LONG_BINGET
            && let Some(i) = le_u32(data, pos + 1)
        {
            refs.insert(i);
            pos += 5;
            continue;
        }
        if code == op::BINGET
            && let Some(&i) = data.get(pos + 1)
        {
            refs.insert(u32::from(i));
            pos += 2;
            continue;
        }
        let class = SCAN_TABLE[code as usize];
        if class < 0x80 {
            // Past the end only ends the loop: the machine reports the truncation.
            pos += 1 + class as usize;
            continue;
        }
        pos += 1;
        match class {
            SCAN_GET1 => match data.get(pos) {
                Some(&i) => {
                    refs.insert(u32::from(i));
                    pos += 1;
                }
                None => break,
            },
            SCAN_GET4 => match le_u32(data, pos) {
                Some(i) => {
                    refs.insert(i);
                    pos += 4;
                }
                None => break,
            },
            SCAN_COUNTED => {
                let Some((width, signed)) = length_prefix(code) else {
                    break;
                };
                let next = match read_length(data, pos, width, signed) {
                    Ok(Some(len)) => usize::try_from(len)
                        .ok()
                        .and_then(|l| l.checked_add(width))
                        .and_then(|n| pos.checked_add(n)),
                    _ => None,
                };
                match next {
                    Some(p) if p <= data.len() => pos = p,
                    _ => break,
                }
            }
            SCAN_LINE | SCAN_GET_LINE => match line_at(data, pos) {
                Some((line, next)) => {
                    if class == SCAN_GET_LINE {
                        match parse_memo_index(line) {
                            Some(i) => refs.insert(i),
                            None => break,
                        };
                    }
                    pos = next;
                }
                None => break,
            },
            _ => break,
        }
    }
    refs
}
