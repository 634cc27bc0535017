//! The loop: runs the opcodes to `STOP`.

use super::machine::{Res, Vm, guarded, malformed, truncated};
use super::opcodes::{le_u32, op, parse_memo_index, refusal};
use super::text::{escape_decode, raw_unicode_decode};
use super::value::{Kind, Seal, Value};
use crate::snapshot::error::ImportError;
use crate::snapshot::schema::lossy;

impl Vm<'_> {
    /// Runs to `STOP`; returns the pickled value and the offset of `STOP`.
    pub(super) fn run(&mut self) -> Res<(Value, usize)> {
        match self.run_window()? {
            Some(done) => Ok(done),
            None => Err(truncated(self.pos, "next opcode (no STOP)", 1)),
        }
    }

    /// Runs to `STOP` or to the end of the window (`None`: a window that is not the last
    /// ends at an opcode boundary; the machine goes on with the next one).
    pub(super) fn run_window(&mut self) -> Res<Option<(Value, usize)>> {
        if self.memo.every.is_some() {
            self.run_window_as::<true>()
        } else {
            self.run_window_as::<false>()
        }
    }

    /// [`Vm::run_window`], its memo operations those of the single pass (`SINGLE`: the
    /// memo keeps every slot, [`Vm::get_every`]) or of a pass after the pre-pass, each
    /// inlined in its own loop.
    fn run_window_as<const SINGLE: bool>(&mut self) -> Res<Option<(Value, usize)>> {
        loop {
            let at = self.pos;
            let Some(&code) = self.data.get(at.wrapping_sub(self.base)) else {
                if !self.last {
                    return Ok(None);
                }
                return Err(truncated(at, "next opcode (no STOP)", 1));
            };
            self.pos = at + 1;
            // The three most frequent opcodes of a snapshot (≈ 60 % of them) get a
            // predictable branch each before the jump table.
            if code == op::LONG_BINGET {
                let i = self.arg_u32(at, "LONG_BINGET")?;
                self.get_as::<SINGLE>(i, at)?;
                continue;
            }
            if code == op::BINGET {
                let i = self.arg_u8(at, "BINGET")?;
                self.get_as::<SINGLE>(u32::from(i), at)?;
                continue;
            }
            if code == op::MEMOIZE {
                self.memoize_as::<SINGLE>(at)?;
                continue;
            }
            match code {
                op::BINGET => {
                    let i = self.arg_u8(at, "BINGET")?;
                    self.get_as::<SINGLE>(u32::from(i), at)?;
                }
                op::LONG_BINGET => {
                    let i = self.arg_u32(at, "LONG_BINGET")?;
                    self.get_as::<SINGLE>(i, at)?;
                }
                op::GET => {
                    let line = self.arg_line(at, "GET")?;
                    let i = parse_memo_index(line)
                        .ok_or_else(|| malformed(at, format!("GET index {:?}", lossy(line))))?;
                    self.get_as::<SINGLE>(i, at)?;
                }
                op::MEMOIZE => self.memoize_as::<SINGLE>(at)?,
                op::BINPUT => {
                    let i = self.arg_u8(at, "BINPUT")?;
                    self.put_as::<SINGLE>(u32::from(i), at, "BINPUT")?;
                }
                op::LONG_BINPUT => {
                    let i = self.arg_u32(at, "LONG_BINPUT")?;
                    self.put_as::<SINGLE>(i, at, "LONG_BINPUT")?;
                }
                op::PUT => {
                    let line = self.arg_line(at, "PUT")?;
                    let i = parse_memo_index(line)
                        .ok_or_else(|| malformed(at, format!("PUT index {:?}", lossy(line))))?;
                    self.put_as::<SINGLE>(i, at, "PUT")?;
                }
                op::MARK => self.marks.push(self.stack.len()),
                op::EMPTY_DICT => {
                    if self.entry(at)? {
                        continue;
                    }
                    let id = self.alloc(Kind::Dict, at)?;
                    self.stack.push(Value::Obj(id));
                }
                op::EMPTY_LIST => {
                    if self.frames_list::<SINGLE>(at)? {
                        continue;
                    }
                    let id = self.alloc(Kind::List, at)?;
                    self.stack.push(Value::Obj(id));
                }
                op::EMPTY_TUPLE => {
                    let v = self.new_container(Kind::Tuple, &[], at)?;
                    self.stack.push(v);
                }
                op::EMPTY_SET => {
                    let id = self.alloc(Kind::Set, at)?;
                    self.stack.push(Value::Obj(id));
                }
                op::SETITEMS => {
                    let mark = self.pop_mark(at, "SETITEMS")?;
                    let dict = self.target_below(mark, at, "SETITEMS", Kind::Dict)?;
                    let mut stack = self.take_stack();
                    let r = self.set_items(
                        dict,
                        stack.get_mut(mark..).unwrap_or(&mut []),
                        at,
                        "SETITEMS",
                    );
                    self.restore_stack(stack, mark);
                    r?;
                }
                op::SETITEM => {
                    self.need(3, at, "SETITEM")?;
                    let v = self.pop(at, "SETITEM")?;
                    let k = self.pop(at, "SETITEM")?;
                    let dict =
                        self.expect_kind(self.top(at, "SETITEM")?, at, "SETITEM", Kind::Dict)?;
                    self.set_items(dict, &mut [k, v], at, "SETITEM")?;
                }
                op::APPENDS => {
                    let mark = self.pop_mark(at, "APPENDS")?;
                    let list = self.target_below(mark, at, "APPENDS", Kind::List)?;
                    if self.is_guarded(list) {
                        return Err(guarded(at));
                    }
                    self.appends_at = at;
                    let stack = self.take_stack();
                    for &v in stack.get(mark..).unwrap_or(&[]) {
                        self.append(list, v);
                    }
                    self.restore_stack(stack, mark);
                }
                op::APPEND => {
                    self.need(2, at, "APPEND")?;
                    let v = self.pop(at, "APPEND")?;
                    let list =
                        self.expect_kind(self.top(at, "APPEND")?, at, "APPEND", Kind::List)?;
                    if self.is_guarded(list) {
                        return Err(guarded(at));
                    }
                    self.append(list, v);
                }
                op::ADDITEMS => {
                    let mark = self.pop_mark(at, "ADDITEMS")?;
                    let set = self.target_below(mark, at, "ADDITEMS", Kind::Set)?;
                    if let (Some(c), Some(items)) =
                        (self.heap.get_mut(set as usize), self.stack.get(mark..))
                    {
                        c.items.extend_from_slice(items);
                    }
                    self.stack.truncate(mark);
                }
                op::LIST => {
                    let mark = self.pop_mark(at, "LIST")?;
                    let id = self.alloc(Kind::List, at)?;
                    let stack = self.take_stack();
                    for &v in stack.get(mark..).unwrap_or(&[]) {
                        self.append(id, v);
                    }
                    self.restore_stack(stack, mark);
                    self.stack.push(Value::Obj(id));
                }
                op::DICT => {
                    let mark = self.pop_mark(at, "DICT")?;
                    let id = self.alloc(Kind::Dict, at)?;
                    let mut stack = self.take_stack();
                    let r =
                        self.set_items(id, stack.get_mut(mark..).unwrap_or(&mut []), at, "DICT");
                    self.restore_stack(stack, mark);
                    r?;
                    self.stack.push(Value::Obj(id));
                }
                op::TUPLE | op::FROZENSET => {
                    let name = if code == op::TUPLE {
                        "TUPLE"
                    } else {
                        "FROZENSET"
                    };
                    let kind = if code == op::TUPLE {
                        Kind::Tuple
                    } else {
                        Kind::FrozenSet
                    };
                    let mark = self.pop_mark(at, name)?;
                    let stack = self.take_stack();
                    let r = self.new_container(kind, stack.get(mark..).unwrap_or(&[]), at);
                    self.restore_stack(stack, mark);
                    self.stack.push(r?);
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1) + 1;
                    self.need(n, at, "TUPLEn")?;
                    let mark = self.stack.len() - n;
                    let stack = self.take_stack();
                    let r = self.new_container(Kind::Tuple, stack.get(mark..).unwrap_or(&[]), at);
                    self.restore_stack(stack, mark);
                    self.stack.push(r?);
                }
                op::BININT1 => {
                    let b = self.arg_u8(at, "BININT1")?;
                    self.stack.push(Value::Int(i64::from(b)));
                }
                op::BININT2 => {
                    let b = self.take(2, at, "BININT2")?;
                    let v = b.first().copied().map_or(0, u16::from)
                        | b.get(1).copied().map_or(0, u16::from) << 8;
                    self.stack.push(Value::Int(i64::from(v)));
                }
                op::BININT => {
                    let v = self.arg_u32(at, "BININT")?;
                    self.stack.push(Value::Int(i64::from(v as i32)));
                }
                op::LONG1 | op::LONG4 => {
                    let name = if code == op::LONG1 { "LONG1" } else { "LONG4" };
                    let (len, rel) = self.arg_counted(code, at, name)?;
                    self.push_le_int(len, rel);
                }
                op::SHORT_BINUNICODE | op::BINUNICODE | op::BINUNICODE8 => {
                    let name = match code {
                        op::SHORT_BINUNICODE => "SHORT_BINUNICODE",
                        op::BINUNICODE => "BINUNICODE",
                        _ => "BINUNICODE8",
                    };
                    let (len, rel) = self.arg_counted(code, at, name)?;
                    let off = self.keep_span(len, rel);
                    self.stack.push(Value::Str { len, off });
                }
                op::SHORT_BINSTRING | op::BINSTRING => {
                    // Python 2 `str`: Python 3 reads it as text (ASCII by default).
                    let name = if code == op::BINSTRING {
                        "BINSTRING"
                    } else {
                        "SHORT_BINSTRING"
                    };
                    let (len, rel) = self.arg_counted(code, at, name)?;
                    let off = self.keep_span(len, rel);
                    self.stack.push(Value::Str { len, off });
                }
                op::SHORT_BINBYTES | op::BINBYTES | op::BINBYTES8 | op::BYTEARRAY8 => {
                    let name = match code {
                        op::SHORT_BINBYTES => "SHORT_BINBYTES",
                        op::BINBYTES => "BINBYTES",
                        op::BINBYTES8 => "BINBYTES8",
                        _ => "BYTEARRAY8",
                    };
                    let (len, rel) = self.arg_counted(code, at, name)?;
                    let off = self.keep_span(len, rel);
                    self.stack.push(Value::Bytes { len, off });
                }
                op::NEWTRUE => self.stack.push(Value::Bool(true)),
                op::NEWFALSE => self.stack.push(Value::Bool(false)),
                op::NONE => self.stack.push(Value::None),
                op::BINFLOAT => {
                    let b = self.take(8, at, "BINFLOAT")?;
                    let bits = b.try_into().map_or(0, u64::from_be_bytes);
                    self.stack.push(Value::Float(f64::from_bits(bits)));
                }
                op::FLOAT => {
                    let line = self.arg_line(at, "FLOAT")?;
                    let f = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| {
                            malformed(at, format!("FLOAT argument {:?}", lossy(line)))
                        })?;
                    self.stack.push(Value::Float(f));
                }
                op::INT => {
                    let line = self.arg_line(at, "INT")?;
                    match line {
                        b"00" => self.stack.push(Value::Bool(false)),
                        b"01" => self.stack.push(Value::Bool(true)),
                        _ => self.push_decimal(line, at, "INT")?,
                    }
                }
                op::LONG => {
                    let line = self.arg_line(at, "LONG")?;
                    let digits = line.strip_suffix(b"L").unwrap_or(line);
                    self.push_decimal(digits, at, "LONG")?;
                }
                op::STRING => {
                    let line = self.arg_line(at, "STRING")?;
                    let body = match line {
                        [q @ (b'\'' | b'"'), body @ .., end] if q == end => body,
                        _ => return Err(malformed(at, "STRING argument is not quoted")),
                    };
                    let (len, off) = self.scratch_span(at, |s| escape_decode(body, s))?;
                    self.stack.push(Value::Str { len, off });
                }
                op::UNICODE => {
                    let line = self.arg_line(at, "UNICODE")?;
                    let (len, off) = self.scratch_span(at, |s| raw_unicode_decode(line, s))?;
                    self.stack.push(Value::Str { len, off });
                }
                op::POP => {
                    if self.stack.len() > self.base() {
                        self.stack.pop();
                    } else if self.marks.len() == self.entry_guard.depth && !self.marks.is_empty() {
                        return Err(guarded(at));
                    } else if self.marks.pop().is_none() {
                        return Err(malformed(at, "POP on an empty stack"));
                    }
                }
                op::POP_MARK => {
                    let mark = self.pop_mark(at, "POP_MARK")?;
                    self.stack.truncate(mark);
                }
                op::DUP => {
                    let v = self.top(at, "DUP")?;
                    // Two references now: never convert-and-free it.
                    self.mark_shared(v);
                    self.stack.push(v);
                }
                op::PROTO => {
                    let p = self.arg_u8(at, "PROTO")?;
                    if p > 5 {
                        return Err(malformed(at, format!("unsupported pickle protocol {p}")));
                    }
                }
                op::FRAME => {
                    // Framing only groups opcodes for buffered reads: nothing to do.
                    self.take(8, at, "FRAME")?;
                }
                op::STOP => {
                    if self.entry_guard.depth != 0 {
                        return Err(guarded(at));
                    }
                    let v = self.pop(at, "STOP")?;
                    return Ok(Some((v, at)));
                }
                _ => {
                    return Err(Box::new(match refusal(code) {
                        Some((name, reason)) => ImportError::RefusedOpcode {
                            offset: at as u64,
                            name,
                            reason,
                        },
                        None => ImportError::UnknownOpcode {
                            offset: at as u64,
                            byte: code,
                        },
                    }));
                }
            }
        }
    }

    // Half of all opcodes of a snapshot are GETs: keep this in the loop.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn get_as<const SINGLE: bool>(&mut self, i: u32, at: usize) -> Res<()> {
        if SINGLE {
            return self.get_every(i, at);
        }
        let Some(i) = i.checked_sub(self.memo.floor) else {
            return self.get_outer(i, at);
        };
        match self.memo.get(i) {
            Some(v) => {
                self.stack.push(v);
                Ok(())
            }
            None => Err(malformed(at, format!("memo index {i} was never stored"))),
        }
    }

    /// `GET` in the single pass (its memo, [`Memo::every`], keeps every slot). A container
    /// read back is shared from here on; one released since it was stored (a trace entry
    /// converted and freed) is an error, and the single pass gives way to the two passes.
    ///
    /// [`Memo::every`]: super::memo::Memo::every
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn get_every(&mut self, i: u32, at: usize) -> Res<()> {
        let Some((v, born)) = self.memo.every.as_deref().and_then(|e| e.get(i)) else {
            return Err(malformed(at, format!("memo index {i} was never stored")));
        };
        if let Value::Obj(id) = v {
            if self.is_guarded(id) {
                return Err(guarded(at));
            }
            if self
                .heap
                .get(id as usize)
                .is_none_or(|c| c.offset != u64::from(born))
            {
                return Err(malformed(
                    at,
                    format!("memo index {i} reads a container consumed before"),
                ));
            }
            self.mark_shared(v);
        }
        self.stack.push(v);
        Ok(())
    }

    /// The `EMPTY_LIST` at `at` and what follows it where they are a list of frames as
    /// the pickler writes one (`MEMOIZE`, `MARK`, a `BINGET` or `LONG_BINGET` of each
    /// frame dict, `APPENDS`), run as one step: the list made and memoized as those
    /// opcodes make it, each frame read from the memo as `GET` reads it and appended as
    /// `APPENDS` appends it, without a trip through the stack or the loop for each (a
    /// trace entry's frames are a quarter of a snapshot's opcodes). Returns false, with
    /// nothing done, for anything else — another opcode, a slot that holds no frame, a
    /// window that ends before the `APPENDS`, the machine not converting — and the loop
    /// runs the opcodes one by one, as it would have.
    fn frames_list<const SINGLE: bool>(&mut self, at: usize) -> Res<bool> {
        #[cfg(test)]
        if !FAST_FRAMES.with(std::cell::Cell::get) {
            return Ok(false);
        }
        if !self.eager {
            return Ok(false);
        }
        let d = self.data;
        let mut i = self.rel();
        if d.get(i..i + 2) != Some(&[op::MEMOIZE, op::MARK][..]) {
            return Ok(false);
        }
        i += 2;
        let mut objs = std::mem::take(&mut self.frame_objs);
        objs.clear();
        let found = loop {
            let index = match d.get(i) {
                Some(&op::BINGET) => d.get(i + 1).map(|&b| (u32::from(b), 2)),
                Some(&op::LONG_BINGET) => le_u32(d, i + 1).map(|v| (v, 5)),
                Some(&op::APPENDS) => break !objs.is_empty(),
                _ => None,
            };
            let Some((index, width)) = index else {
                break false;
            };
            i += width;
            let obj = if SINGLE {
                match self.memo.every.as_deref().and_then(|e| e.get(index)) {
                    Some((Value::Obj(id), born)) => self
                        .heap
                        .get(id as usize)
                        .filter(|c| c.offset == u64::from(born))
                        .map(|c| (id, c.seal)),
                    _ => None,
                }
            } else {
                match index
                    .checked_sub(self.memo.floor)
                    .and_then(|j| self.memo.get(j))
                {
                    Some(Value::Obj(id)) => self.heap.get(id as usize).map(|c| (id, c.seal)),
                    _ => None,
                }
            };
            match obj {
                Some((id, Seal::Frame(_))) => objs.push(id),
                _ => break false,
            }
        };
        if !found {
            self.frame_objs = objs;
            return Ok(false);
        }
        let list = self.alloc(Kind::List, at)?;
        self.stack.push(Value::Obj(list));
        self.pos = at + 2;
        self.memoize_as::<SINGLE>(at + 1)?;
        for &id in &objs {
            if SINGLE {
                // As `GET` of the single pass: a container read back is shared.
                self.mark_shared(Value::Obj(id));
            }
            let frame = match self.heap.get(id as usize).map(|c| c.seal) {
                Some(Seal::Frame(f)) => Value::Frame(f),
                _ => Value::Obj(id),
            };
            if let Some(c) = self.heap.get_mut(list as usize) {
                c.items.push(frame);
            }
        }
        self.frame_objs = objs;
        #[cfg(test)]
        FAST_TAKEN.with(|n| n.set(n.get() + 1));
        self.appends_at = self.base + i;
        self.pos = self.base + i + 1;
        Ok(true)
    }

    /// `MEMOIZE` or `PUT` (`index`) of the single pass: every slot kept, with where its
    /// container was made.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn store_every(&mut self, index: Option<u32>, at: usize, what: &'static str) -> Res<()> {
        let v = self.top(at, what)?;
        let i = match index {
            Some(i) => {
                self.memo.put_index(i);
                i
            }
            None => self
                .memo
                .memoize_index()
                .ok_or_else(|| malformed(at, "more than 4 billion memo entries"))?,
        };
        let born = match v {
            Value::Obj(id) => self.heap.get(id as usize).map_or(u64::MAX, |c| c.offset),
            _ => 0,
        };
        let born = u32::try_from(born).map_err(|_| malformed(at, "a single pass over 4 GiB"))?;
        self.memo.store_every(i, v, born);
        Ok(())
    }

    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn memoize_as<const SINGLE: bool>(&mut self, at: usize) -> Res<()> {
        if SINGLE {
            return self.store_every(None, at, "MEMOIZE");
        }
        let v = self.top(at, "MEMOIZE")?;
        match self.memo.memoize(v) {
            Some(true) => self.mark_shared(v),
            Some(false) => {}
            None => return Err(malformed(at, "more than 4 billion memo entries")),
        }
        Ok(())
    }

    fn put_as<const SINGLE: bool>(&mut self, i: u32, at: usize, what: &'static str) -> Res<()> {
        if SINGLE {
            return self.store_every(Some(i), at, what);
        }
        let v = self.top(at, what)?;
        if self.memo.put(i, v) {
            self.mark_shared(v);
        }
        Ok(())
    }
}

#[cfg(test)]
thread_local! {
    /// Whether `EMPTY_LIST` takes the frames list's fast path ([`Vm::frames_list`]); the
    /// tests compare both ways.
    pub(super) static FAST_FRAMES: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
    /// How many frames lists took it.
    pub(super) static FAST_TAKEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
#[path = "run_tests.rs"]
pub(super) mod tests;
