//! A trace entry run as one step, in the single pass and in the streamed second pass: the
//! `EMPTY_DICT` of a dict that a list of entries will take, and the opcodes up to its
//! `SETITEMS`, read straight into the entry's fields and converted, with no dict made, no
//! trip through the stack and none through `APPENDS` (the loop spent more on these than on
//! anything else).
//!
//! The entry is handed to its list before the `APPENDS` that would hand it over, so the
//! list and its `MARK` are guarded until then ([`Vm::entry_guard`]): anything else that
//! would see them — another opcode closing the mark, the list appended to or read back by
//! a `GET`, `STOP` — is an error. Whatever the loop does meanwhile (entries left to it,
//! frames) runs above the mark and sees only values it made, so it goes as it would have:
//! the loop's stack is the fast path's with the entries' dicts put back just above the
//! mark, and an opcode that would reach them finds the mark instead and fails (`POP` of a
//! guarded mark is an error too). So any error while the guard holds may be the fast
//! path's own, and the machine's caller runs the input again without it: the single pass
//! gives way to the two passes (as it does for an entry read back after it was freed), the
//! streamed second pass runs once more ([`super::stream`]). Once the `APPENDS` closes the
//! mark the two machines hold the same entries, in the same order.
//!
//! The single pass's memo keeps every slot; the second pass's keeps only those the
//! pre-pass saw read back ([`super::memo::Memo::is_ref`]), and a container stored there is
//! shared from its store on and never freed. There an entry is run as one step only when
//! its own dict's slot is never read back (a dict kept in the memo is not converted by
//! its list, [`Vm::convert_item`]) and its list is not shared, so that no `GET` can bring
//! the list back while it is guarded; the strings and frames list it memoizes are kept
//! where, and only where, the loop keeps them. Its `pool_id` tuple (PyTorch 2.12+) is
//! made nowhere: its slot is taken only where the loop's tuple would be freed unseen
//! ([`Vm::tuple_slots_as_the_loop`]), and its pool is interned when the `APPENDS` comes,
//! where the loop would intern it ([`Vm::intern_pools_ahead`]). The parallel decode's machines (a chunk's
//! `outer` and `region`) never take this path.

use super::fields::scalar;
use super::machine::{Res, Vm, malformed};
use super::opcodes::{le_u32, op};
use super::value::{Container, Kind, Seal, Text, Value};
use crate::snapshot::schema::{EventFields, Key, Pair, Scalar, entry_pool_id};
use crate::snapshot::{FrameId, RawEvent, StackId};

/// The heap id that the single pass's memo slot of an entry run as one step names: none,
/// so a `GET` of it reads "a container consumed before", as it does of an entry converted
/// and freed, and the single pass gives way to the two passes. (The second pass stores
/// nothing there: the slot is never read back.)
const GONE: u32 = u32::MAX;

/// A memo slot an entry run as one step fills, in the order of its `MEMOIZE`s after the
/// entry's own.
#[derive(Clone, Copy)]
pub(super) enum Store {
    /// A string made in the entry: `len` bytes at `rel` in the window.
    Str { len: u32, rel: usize },
    /// The entry's frames list.
    List,
    /// The entry's `pool_id` tuple, its `TUPLE2` at `rel` in the window: a slot naming no
    /// container, as the entry's own ([`GONE`]).
    Tuple { rel: usize },
}

/// Scratch of [`Vm::entry`], kept between entries.
#[derive(Default)]
pub(super) struct EntryScratch {
    /// The memo slots the entry fills after its own.
    stores: Vec<Store>,
    /// Lists of frames converted before that it reads back.
    reads: Vec<u32>,
    /// The frame dicts of the frames list it makes.
    frames: Vec<u32>,
}

/// The list and mark of entries handed over ahead of their `APPENDS` ([`Vm::entry`]).
#[derive(Clone, Copy, Default)]
pub(super) struct Guard {
    /// `marks.len()` while the mark is the last one; 0: none.
    pub(super) depth: usize,
    /// The list's heap id.
    pub(super) list: u32,
    /// The second pass made the list's vector of events for these entries, without the
    /// pre-pass's hint (keyed by the `APPENDS`): it is given its room there
    /// ([`Vm::reserve_late`]).
    pub(super) fresh: bool,
}

/// An entry read by [`Vm::read_entry`], not yet done.
#[derive(Clone, Copy)]
struct Plan {
    /// Where its `SETITEMS` ends, in the window.
    end: usize,
    event: RawEvent,
    /// Its frames list: where the `EMPTY_LIST` is and, if it has one, its `APPENDS`
    /// (in the window).
    list: Option<(usize, Option<usize>)>,
    /// Whether the entry's stack is that list's (else `event.stack`).
    stack_is_list: bool,
    /// Its `pool_id`, interned when its list's `APPENDS` comes ([`Vm::intern_pools_ahead`]).
    pool: Option<(u64, u64)>,
}

/// The opcode at `i` in `d` past any `FRAME`s, if it is one the fast path reads and whole:
/// its code, where it starts and where the next starts.
#[allow(clippy::inline_always)]
#[inline(always)]
fn token(d: &[u8], i: usize) -> Option<(u8, usize, usize)> {
    let code = *d.get(i)?;
    let len = match code {
        op::BINGET | op::BININT1 => 2,
        op::LONG_BINGET | op::BININT => 5,
        op::MEMOIZE
        | op::MARK
        | op::EMPTY_DICT
        | op::EMPTY_LIST
        | op::SETITEMS
        | op::APPENDS
        | op::APPEND
        | op::TUPLE2
        | op::NONE
        | op::NEWTRUE
        | op::NEWFALSE => 1,
        op::BININT2 => 3,
        op::BINFLOAT => 9,
        op::SHORT_BINUNICODE | op::LONG1 => 2 + usize::from(*d.get(i + 1)?),
        op::BINUNICODE => 5usize.checked_add(usize::try_from(le_u32(d, i + 1)?).ok()?)?,
        op::FRAME => return token_after_frame(d, i),
        _ => return None,
    };
    let next = i.checked_add(len).filter(|&e| e <= d.len())?;
    Some((code, i, next))
}

/// [`token`] past the `FRAME` at `i`.
#[cold]
#[inline(never)]
fn token_after_frame(d: &[u8], i: usize) -> Option<(u8, usize, usize)> {
    let mut i = i;
    while d.get(i) == Some(&op::FRAME) {
        i = i.checked_add(9).filter(|&e| e <= d.len())?;
    }
    token(d, i)
}

/// The memo index a `BINGET` or `LONG_BINGET` at `at` reads.
#[inline]
fn get_index(d: &[u8], code: u8, at: usize) -> Option<u32> {
    if code == op::BINGET {
        d.get(at + 1).map(|&b| u32::from(b))
    } else {
        le_u32(d, at + 1)
    }
}

/// A string opcode's length and where its bytes start.
#[inline]
fn string_at(d: &[u8], code: u8, at: usize) -> Option<(u32, usize)> {
    if code == op::SHORT_BINUNICODE {
        Some((u32::from(*d.get(at + 1)?), at + 2))
    } else {
        Some((le_u32(d, at + 1)?, at + 5))
    }
}

/// After a string of `len` bytes at `rel` that ends at `i`: a `MEMOIZE` of it, if one
/// follows, noted in `stores`; where the next opcode starts.
#[inline]
fn memoized_string(
    d: &[u8],
    i: usize,
    len: u32,
    rel: usize,
    stores: &mut Vec<Store>,
) -> Option<usize> {
    match token(d, i)? {
        (op::MEMOIZE, _, next) => {
            stores.push(Store::Str { len, rel });
            Some(next)
        }
        _ => Some(i),
    }
}

/// The integer that the `BININT1`, `BININT2`, `BININT` or `LONG1` at `at` pushes, where
/// the loop makes a [`Value::Int`] of it with no copy (a `LONG1` of up to 8 bytes,
/// [`Vm::push_le_int`]).
#[inline]
fn int_at(text: &Text<'_>, code: u8, at: usize) -> Option<Value> {
    let d = text.data;
    let v = match code {
        op::BININT1 => i64::from(*d.get(at + 1)?),
        op::BININT2 => i64::from(u16::from_le_bytes(d.get(at + 1..at + 3)?.try_into().ok()?)),
        op::BININT => i64::from(le_u32(d, at + 1)? as i32),
        op::LONG1 => {
            let n = u32::from(*d.get(at + 1)?);
            if n == 0 {
                0
            } else if n <= 8 {
                let w = text.word(n, (at + 2) as u64)?;
                let shift = 64 - 8 * n;
                ((w << shift) as i64) >> shift
            } else {
                return None;
            }
        }
        _ => return None,
    };
    Some(Value::Int(v))
}

/// A `pool_id` as PyTorch 2.12+ writes one, from the integer opcode at `at`: two integers
/// ([`int_at`]), `TUPLE2`, and a `MEMOIZE` of the tuple, if one follows, noted in
/// `stores`. Returns the pool as the conversion reads it ([`entry_pool_id`]: none where
/// either is not a `u64`) and where the next opcode starts.
fn read_pool(
    text: &Text<'_>,
    at: usize,
    stores: &mut Vec<Store>,
) -> Option<(Option<(u64, u64)>, usize)> {
    let d = text.data;
    let (code, _, i) = token(d, at)?;
    let a = int_at(text, code, at)?;
    let (code, b_at, i) = token(d, i)?;
    let b = int_at(text, code, b_at)?;
    let (op::TUPLE2, rel, i) = token(d, i)? else {
        return None;
    };
    let heap: &[Container] = &[];
    let pool = entry_pool_id(Pair::Two(scalar(text, heap, a), scalar(text, heap, b)));
    match token(d, i)? {
        (op::MEMOIZE, _, next) => {
            stores.push(Store::Tuple { rel });
            Some((pool, next))
        }
        _ => Some((pool, i)),
    }
}

/// A value of an entry as [`Vm::read_entry`] takes it.
enum Part {
    Scalar(Value),
    /// A list of frames converted before, read back (its heap id).
    Stack(StackId, u32),
    /// The frames list made here.
    List,
    /// A `pool_id` tuple of two integers made here, as the schema reads it.
    Pool(Option<(u64, u64)>),
}

impl Vm<'_> {
    /// Where [`Vm::fast_entries`] allows it (the single pass, the streamed second pass),
    /// the `EMPTY_DICT` at `at` and what follows it up to its `SETITEMS`, where they are a trace entry that the list of entries below the last
    /// `MARK` would take when an `APPENDS` closes the mark, run as one step: its keys and
    /// values read from the memo and the opcodes into its fields, converted as the list
    /// would convert it (the frames list made there as [`Vm::frames_list`] makes one,
    /// converted as `SETITEMS` converts it), every memo slot filled as the opcodes fill them
    /// (the entry's own and its `pool_id` tuple's naming no container: read back, they
    /// read as freed; in the second pass they are never read back), and the event handed
    /// to the list as `APPENDS` would hand it, the list and mark guarded until then (see
    /// the module), its `pool_id` interned when the `APPENDS` comes
    /// ([`Vm::intern_pools_ahead`]). Only where that is what the loop would come to: the
    /// machine converting, the list holding nothing but entries and not shared, no value
    /// left above its `MARK`, the whole entry in the window, a `pool_id` (if any) a tuple
    /// of two integers written there ([`read_pool`]), and no `user_metadata` text (the
    /// loop interns it into the strings the frames' share, in its order), so that doing it
    /// before the `APPENDS` changes nothing. Returns false, with nothing done, for anything
    /// else, and the loop runs the opcodes one by one.
    pub(super) fn entry(&mut self, at: usize) -> Res<bool> {
        #[cfg(test)]
        if !FAST_ENTRIES.with(std::cell::Cell::get) {
            return Ok(false);
        }
        if !self.fast_entries
            || !self.eager
            || self.outer.is_some()
            || self.region.is_some()
            || self.memo.set.is_some()
        {
            return Ok(false);
        }
        let Some(list) = self.entry_list() else {
            return Ok(false);
        };
        // One list guarded at a time.
        let g = self.entry_guard;
        if g.depth != 0 && (g.depth != self.marks.len() || g.list != list) {
            return Ok(false);
        }
        let mut scratch = std::mem::take(&mut self.entry_scratch);
        let Some(plan) = self.read_entry(at, &mut scratch) else {
            self.entry_scratch = scratch;
            return Ok(false);
        };
        let r = self.do_entry(at, list, plan, &scratch);
        self.entry_scratch = scratch;
        r?;
        #[cfg(test)]
        ENTRIES_TAKEN.with(|n| n.set(n.get() + 1));
        Ok(true)
    }

    /// The list below the last `MARK`, with nothing above the mark, if `APPENDS` would take
    /// it ([`Vm::target_below`]), it holds no item but entries and it is not shared (so
    /// that in the second pass no `GET` reads it back).
    #[inline]
    fn entry_list(&self) -> Option<u32> {
        let n = self.marks.len();
        let mark = *self.marks.last()?;
        let lower = n
            .checked_sub(2)
            .and_then(|k| self.marks.get(k).copied())
            .unwrap_or(0);
        if self.stack.len() != mark || mark <= lower {
            return None;
        }
        let Value::Obj(id) = *self.stack.get(mark - 1)? else {
            return None;
        };
        let c = self.heap.get(id as usize)?;
        (c.kind == Kind::List && c.seal == Seal::Open && c.items.is_empty() && !c.shared)
            .then_some(id)
    }

    /// Memo slot `index` as `GET` reads it, if it reads it without an error: in the single
    /// pass a container only if it is still the one stored there (not freed since); in the
    /// second pass every container stored is (it is shared from its store on).
    #[inline]
    fn slot(&self, index: u32) -> Option<Value> {
        if u64::from(index) >= self.memo.len {
            return None;
        }
        let Some(every) = self.memo.every.as_deref() else {
            return self.memo.get(index);
        };
        let (v, born) = every.get(index)?;
        if let Value::Obj(id) = v
            && self.heap.get(id as usize)?.offset != u64::from(born)
        {
            return None;
        }
        Some(v)
    }

    /// The frame dict in memo slot `index`, if `GET` reads one there: its heap id and frame.
    #[inline]
    fn frame_slot(&self, index: u32) -> Option<(u32, FrameId)> {
        let Value::Obj(id) = self.slot(index)? else {
            return None;
        };
        let c = self.heap.get(id as usize)?;
        match c.seal {
            Seal::Frame(f) => Some((id, f)),
            _ => None,
        }
    }

    /// The entry from the `EMPTY_DICT` at `at` read and converted, nothing changed but
    /// `scratch`; `None` where the fast path does not take it.
    fn read_entry(&mut self, at: usize, scratch: &mut EntryScratch) -> Option<Plan> {
        let d = self.data;
        let (op::MEMOIZE, _, i) = token(d, self.rel())? else {
            return None;
        };
        let (op::MARK, _, mut i) = token(d, i)? else {
            return None;
        };
        // The dict's own slot, and where the dict would have been made, as the memo keeps
        // them.
        let first = self.memo.len;
        let own = u32::try_from(first).ok()?;
        u32::try_from(at).ok()?;
        // The second pass: a dict kept in the memo is left to the loop.
        if self.memo.every.is_none() && self.memo.is_ref(own) {
            return None;
        }
        scratch.stores.clear();
        scratch.reads.clear();
        scratch.frames.clear();
        let text = Text {
            data: d,
            scratch: &self.scratch,
        };
        let mut fields = EventFields::<Value>::default();
        let mut stack = Some(StackId::EMPTY);
        let mut list = None;
        let mut pool = None;
        loop {
            let (code, k_at, next) = token(d, i)?;
            let key = match code {
                op::SETITEMS => {
                    i = next;
                    break;
                }
                op::BINGET | op::LONG_BINGET => {
                    i = next;
                    match self.slot(get_index(d, code, k_at)?)? {
                        Value::Str { len, off } => (len, off),
                        _ => return None,
                    }
                }
                op::SHORT_BINUNICODE | op::BINUNICODE => {
                    let (len, rel) = string_at(d, code, k_at)?;
                    i = memoized_string(d, next, len, rel, &mut scratch.stores)?;
                    (len, rel as u64)
                }
                _ => return None,
            };
            let key = match text.word(key.0, key.1) {
                Some(w) => Key::from_word(key.0 as usize, w),
                None => Key::from_bytes(text.span(key.0, key.1)),
            };
            let (code, v_at, next) = token(d, i)?;
            i = next;
            let item = match code {
                op::BINGET | op::LONG_BINGET => match self.slot(get_index(d, code, v_at)?)? {
                    Value::Obj(id) => match self.heap.get(id as usize)?.seal {
                        Seal::Stack(s) => Part::Stack(s, id),
                        _ => return None,
                    },
                    Value::Frame(_) | Value::Stack(_) | Value::Event(_) => return None,
                    v => Part::Scalar(v),
                },
                // The entry's `pool_id`: a tuple of two integers made here.
                op::BININT1 | op::BININT2 | op::BININT | op::LONG1 if key == Key::PoolId => {
                    let (pool, end) = read_pool(&text, v_at, &mut scratch.stores)?;
                    i = end;
                    Part::Pool(pool)
                }
                op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => {
                    Part::Scalar(int_at(&text, code, v_at)?)
                }
                op::BINFLOAT => {
                    let b = d.get(v_at + 1..v_at + 9)?;
                    Part::Scalar(Value::Float(f64::from_bits(u64::from_be_bytes(
                        b.try_into().ok()?,
                    ))))
                }
                op::NONE => Part::Scalar(Value::None),
                op::NEWTRUE => Part::Scalar(Value::Bool(true)),
                op::NEWFALSE => Part::Scalar(Value::Bool(false)),
                op::SHORT_BINUNICODE | op::BINUNICODE => {
                    let (len, rel) = string_at(d, code, v_at)?;
                    i = memoized_string(d, next, len, rel, &mut scratch.stores)?;
                    Part::Scalar(Value::Str {
                        len,
                        off: rel as u64,
                    })
                }
                op::EMPTY_LIST if key == Key::Frames && list.is_none() => {
                    let (end, appends) = self.read_frames(d, next, &mut scratch.frames)?;
                    u32::try_from(self.base + v_at).ok()?;
                    i = end;
                    list = Some((v_at, appends));
                    scratch.stores.push(Store::List);
                    Part::List
                }
                _ => return None,
            };
            match (key, item) {
                (Key::Frames, Part::Stack(s, id)) => {
                    scratch.reads.push(id);
                    stack = Some(s);
                }
                (Key::Frames, Part::List) => stack = None,
                // One `pool_id` (a second would leave the first's tuple in the dict).
                (Key::PoolId, Part::Pool(p)) if pool.is_none() => pool = Some(p),
                (Key::Frames | Key::PoolId, _)
                | (_, Part::Stack(..) | Part::List | Part::Pool(_)) => {
                    return None;
                }
                (key, Part::Scalar(v)) => {
                    // Keys no entry reads are left, as the conversion leaves them.
                    let _ = fields.set(key, v);
                }
            }
        }
        // Every slot the entry fills must have an index.
        u32::try_from(first + scratch.stores.len() as u64).ok()?;
        if !self.tuple_slots_as_the_loop(first, &scratch.stores) {
            return None;
        }
        let text = Text {
            data: d,
            scratch: &self.scratch,
        };
        let heap = &self.heap[..];
        let scalars = fields.map(|&v| scalar(&text, heap, v));
        if !scalars.is_event()
            || matches!(scalars.user_metadata, Some(Scalar::Str(b)) if !b.is_empty())
        {
            return None;
        }
        // Pure: no `user_metadata` text to intern, and the `pool_id` is interned later.
        let mut event = self.builder.event(&scalars, StackId::EMPTY, None).ok()?;
        if let Some(s) = stack {
            event.stack = s;
        }
        Some(Plan {
            end: i,
            event,
            list,
            stack_is_list: stack.is_none(),
            pool: pool.flatten(),
        })
    }

    /// Whether the `pool_id` tuple's memo slot (the entry's slots from `first`: its own,
    /// then `stores`) can be filled as [`GONE`] where the loop stores the tuple. The single
    /// pass keeps it with where the tuple was made, which must fit its 32 bits as the
    /// loop's `MEMOIZE` needs; a `GET` of it reads "consumed before" where the loop's, made
    /// before the list's `APPENDS` converted and freed the tuple, would read the tuple: the
    /// single pass gives way to the two passes, as for the entry's own slot. The second
    /// pass stores the tuple only where some `GET` reads it back, and shares it then; there
    /// the entry is left to the loop.
    fn tuple_slots_as_the_loop(&self, first: u64, stores: &[Store]) -> bool {
        let single = self.memo.every.is_some();
        (1u64..).zip(stores).all(|(k, s)| match *s {
            Store::Tuple { rel } if single => u32::try_from(self.base + rel).is_ok(),
            Store::Tuple { .. } => u32::try_from(first + k).is_ok_and(|j| !self.memo.is_ref(j)),
            _ => true,
        })
    }

    /// A frames list from `i` (after its `EMPTY_LIST`): `MEMOIZE`, then frame dicts read back
    /// by `MARK` … `APPENDS` or one and `APPEND`, or none (what follows is then the entry's
    /// next key, whatever it is, as the loop reads it); its frames' heap ids noted in
    /// `frames`. Returns where it ends and where its `APPENDS` is.
    fn read_frames(
        &self,
        d: &[u8],
        i: usize,
        frames: &mut Vec<u32>,
    ) -> Option<(usize, Option<usize>)> {
        let (op::MEMOIZE, _, i) = token(d, i)? else {
            return None;
        };
        let (code, at, next) = token(d, i)?;
        match code {
            op::MARK => {
                let mut i = next;
                loop {
                    let (code, at, next) = token(d, i)?;
                    if code == op::APPENDS {
                        return Some((next, Some(at)));
                    }
                    if !matches!(code, op::BINGET | op::LONG_BINGET) {
                        return None;
                    }
                    let (id, _) = self.frame_slot(get_index(d, code, at)?)?;
                    frames.push(id);
                    i = next;
                }
            }
            op::BINGET | op::LONG_BINGET => match token(d, next)? {
                (op::APPEND, _, after) => {
                    let (id, _) = self.frame_slot(get_index(d, code, at)?)?;
                    frames.push(id);
                    Some((after, None))
                }
                // An empty list, the `GET` the next key's (2.12's `pool_id` follows
                // `frames`).
                _ => Some((i, None)),
            },
            // An empty list.
            _ => Some((i, None)),
        }
    }

    /// `MEMOIZE` of `v` (made at `born`), `v` not on the stack, as the loop does it: the
    /// single pass keeps it, with where it was made; the second pass keeps it only where
    /// the pre-pass saw its slot read back, and a container kept there is shared.
    #[inline]
    fn memoize_value(&mut self, v: Value, born: u64, at: usize) -> Res<()> {
        if self.memo.every.is_none() {
            return match self.memo.memoize(v) {
                Some(true) => {
                    self.mark_shared(v);
                    Ok(())
                }
                Some(false) => Ok(()),
                None => Err(malformed(at, "more than 4 billion memo entries")),
            };
        }
        let i = self
            .memo
            .memoize_index()
            .ok_or_else(|| malformed(at, "more than 4 billion memo entries"))?;
        let born = u32::try_from(born).map_err(|_| malformed(at, "a single pass over 4 GiB"))?;
        self.memo.store_every(i, v, born);
        Ok(())
    }

    /// `MEMOIZE` of the string of `len` bytes at `rel` in the window: its bytes kept
    /// ([`Vm::keep_span`]) only where the memo keeps the slot (the second pass counts the
    /// rest in `len(memo)` and stores them nowhere, as it would have).
    #[inline]
    fn memoize_str(&mut self, len: u32, rel: usize, at: usize) -> Res<()> {
        let kept = self.memo.every.is_some()
            || u32::try_from(self.memo.len).is_ok_and(|i| self.memo.is_ref(i));
        if kept {
            let off = self.keep_span(len, rel);
            return self.memoize_value(Value::Str { len, off }, 0, at);
        }
        self.memo
            .memoize_index()
            .map(|_| ())
            .ok_or_else(|| malformed(at, "more than 4 billion memo entries"))
    }

    /// The `pool_id`s of the entries handed over ahead to `list`, interned now that its
    /// `APPENDS` has come, in their order, as the loop's `APPENDS` would intern them
    /// converting their dicts (before those above the mark, the loop's: [`Vm::entry_list`]
    /// takes an entry only while there are none). Interned when read, they would have gone
    /// ahead of any pool the loop interns meanwhile above the mark (an entry in a list in
    /// an entry left to it), and the table's numbering would not be the loop's. Nothing
    /// else interns a pool while the machine runs: the schema pass converts shared entries
    /// after it ([`super::mapping`]), and the parallel decode, which merges its chunks'
    /// tables, never takes this path.
    pub(super) fn intern_pools_ahead(&mut self, list: u32) {
        let events = self.heap.get(list as usize).map_or(0, |c| c.events) as usize;
        let mut pools = std::mem::take(&mut self.entry_pools);
        for &(k, pool) in &pools {
            let n = self.builder.intern_pool(pool);
            if let Some(e) = events
                .checked_sub(1)
                .and_then(|l| self.event_lists.get_mut(l))
                .and_then(|l| l.get_mut(k))
            {
                e.pool = n;
            }
        }
        pools.clear();
        self.entry_pools = pools;
    }

    /// The number (from 1) of `list`'s vector of events, for an entry handed over ahead:
    /// the single pass's as `APPENDS` makes it ([`Vm::events_of`]: it has no pre-pass's
    /// notes to size it by); the second pass's made without room, given its room by the
    /// pre-pass's hint when the `APPENDS` comes ([`Guard::fresh`]).
    fn events_ahead(&mut self, list: u32) -> u32 {
        let events = self.heap.get(list as usize).map_or(0, |c| c.events);
        if events != 0 || self.memo.every.is_some() {
            return self.events_of(list);
        }
        self.event_lists.push(Vec::new());
        let events = self.event_lists.len() as u32;
        if let Some(c) = self.heap.get_mut(list as usize) {
            c.events = events;
        }
        self.entry_guard.fresh = true;
        events
    }

    /// Does what the loop would have done for the entry [`Vm::read_entry`] read: the list
    /// guarded first (so that an error from here on is one while it is), its memo slots,
    /// its frames list made and converted, the lists it read back shared as the single
    /// pass's `GET` shares them, the event handed to `list` (its vector of events made
    /// first, [`Vm::events_ahead`]), and the machine after the entry's `SETITEMS`.
    fn do_entry(&mut self, at: usize, list: u32, plan: Plan, scratch: &EntryScratch) -> Res<()> {
        let g = self.entry_guard;
        self.entry_guard = Guard {
            depth: self.marks.len(),
            list,
            fresh: g.depth != 0 && g.fresh,
        };
        let single = self.memo.every.is_some();
        self.memoize_value(Value::Obj(GONE), at as u64, at)?;
        let mut made = None;
        for &s in &scratch.stores {
            match s {
                Store::Str { len, rel } => self.memoize_str(len, rel, at)?,
                Store::List => {
                    let Some((rel, _)) = plan.list else { continue };
                    let list_at = self.base + rel;
                    let id = self.alloc(Kind::List, list_at)?;
                    self.memoize_value(Value::Obj(id), list_at as u64, list_at)?;
                    for &f in &scratch.frames {
                        if single {
                            // As `GET` of the single pass: a container read back is shared.
                            self.mark_shared(Value::Obj(f));
                        }
                        let v = match self.heap.get(f as usize).map(|c| c.seal) {
                            Some(Seal::Frame(frame)) => Value::Frame(frame),
                            _ => Value::Obj(f),
                        };
                        if let Some(c) = self.heap.get_mut(id as usize) {
                            c.items.push(v);
                        }
                    }
                    made = Some(id);
                }
                Store::Tuple { rel } => {
                    let tuple_at = self.base + rel;
                    self.memoize_value(Value::Obj(GONE), tuple_at as u64, tuple_at)?;
                }
            }
        }
        if single {
            for &id in &scratch.reads {
                self.mark_shared(Value::Obj(id));
            }
        }
        let mut event = plan.event;
        if let Some(id) = made {
            // As `SETITEMS` converts it; it holds frames only, so it becomes a stack.
            let s = self.convert_stack(id).unwrap_or(StackId::EMPTY);
            if plan.stack_is_list {
                event.stack = s;
            }
        }
        if let Some((_, Some(rel))) = plan.list {
            self.appends_at = self.base + rel;
        }
        let events = self.events_ahead(list);
        if let Some(l) = self.event_lists.get_mut(events as usize - 1) {
            if let Some(pool) = plan.pool {
                self.entry_pools.push((l.len(), pool));
            }
            l.push(event);
        }
        self.pos = self.base + plan.end;
        Ok(())
    }
}

#[cfg(test)]
thread_local! {
    /// Whether `EMPTY_DICT` takes the trace entry's fast path ([`Vm::entry`]); the tests
    /// compare both ways.
    pub(super) static FAST_ENTRIES: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
    /// How many entries took it.
    pub(super) static ENTRIES_TAKEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
#[path = "entry_tests.rs"]
mod tests;
