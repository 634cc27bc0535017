//! The memo, storing only the slots the pre-pass saw read back.

use std::collections::{HashMap, HashSet};

use super::value::Value;

/// 8 per input byte, so its memory stays below the input size), a hash set beyond.
#[derive(Debug, Default, Clone)]
pub(super) struct IndexSet {
    pub(super) bits: Vec<u64>,
    pub(super) dense_limit: u32,
    pub(super) sparse: HashSet<u32>,
}

impl IndexSet {
    pub(super) fn new(input_len: usize) -> IndexSet {
        let limit = input_len.saturating_mul(8).clamp(4096, u32::MAX as usize);
        IndexSet {
            bits: Vec::new(),
            dense_limit: u32::try_from(limit).unwrap_or(u32::MAX),
            sparse: HashSet::new(),
        }
    }

    /// Keeps indices dense up to what an input of `input_len` bytes justifies, once that
    /// is at least twice the present bound (so a streamed input raises it a few times);
    /// indices kept sparse below the new bound move to the bits.
    pub(super) fn raise_dense_limit(&mut self, input_len: usize) {
        let limit = input_len.saturating_mul(8).clamp(4096, u32::MAX as usize);
        let limit = u32::try_from(limit).unwrap_or(u32::MAX);
        if limit / 2 < self.dense_limit {
            return;
        }
        self.dense_limit = limit;
        let moved: Vec<u32> = self.sparse.iter().copied().filter(|&i| i < limit).collect();
        for i in moved {
            self.sparse.remove(&i);
            self.insert(i);
        }
    }

    /// Adds `other`'s indices (kept dense up to the same bound).
    pub(super) fn union(&mut self, other: IndexSet) {
        if self.bits.len() < other.bits.len() {
            self.bits.resize(other.bits.len(), 0);
        }
        for (w, o) in self.bits.iter_mut().zip(&other.bits) {
            *w |= o;
        }
        self.sparse.extend(other.sparse);
    }

    /// Inserts; true if it was not there. The pre-pass calls it for every `GET` (half of
    /// a snapshot's opcodes): a bit already allocated is set inline, the rest out of line.
    #[inline]
    pub(super) fn insert(&mut self, i: u32) -> bool {
        if i < self.dense_limit
            && let Some(w) = self.bits.get_mut((i >> 6) as usize)
        {
            let bit = 1u64 << (i & 63);
            let new = *w & bit == 0;
            *w |= bit;
            return new;
        }
        self.insert_beyond(i)
    }

    /// [`IndexSet::insert`] of an index past the bits allocated so far, or sparse.
    #[cold]
    #[inline(never)]
    fn insert_beyond(&mut self, i: u32) -> bool {
        if i >= self.dense_limit {
            return self.sparse.insert(i);
        }
        let word = (i >> 6) as usize;
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        match self.bits.get_mut(word) {
            Some(w) => {
                let bit = 1u64 << (i & 63);
                let new = *w & bit == 0;
                *w |= bit;
                new
            }
            None => false,
        }
    }
}

/// The memo, storing only the slots the pre-pass saw read back.
#[derive(Debug)]
pub(super) struct Memo {
    /// Indices some `GET` reads.
    pub(super) refs: IndexSet,
    /// Per 8 dense indices: `(slots used by lower indices) << 8 | which of the 8 are
    /// referenced`. One load and a 256-byte table find a slot (a rank over 64-bit words
    /// needed a software popcount on baseline x86-64, and a slot per index 4 bytes).
    pub(super) dir: Vec<u64>,
    pub(super) slots: Vec<Option<Value>>,
    pub(super) sparse: HashMap<u32, Value>,
    /// Distinct indices ever stored, tracked from the first explicit `PUT` on (until
    /// then they are exactly `0..len`).
    pub(super) set: Option<IndexSet>,
    /// Python's `len(memo)`: the index `MEMOIZE` uses.
    pub(super) len: u64,
    pub(super) input_len: usize,
    /// A chunk's machine ([`super::parallel`]): the memo index its slot 0 stands for
    /// (indices below are slots put before the chunk); 0 otherwise.
    pub(super) floor: u32,
    /// The single pass ([`super::stream`]): no pre-pass said which slots are read back,
    /// so every one is kept here (and `refs` is empty).
    pub(super) every: Option<Box<Every>>,
}

/// Every memo slot, for a machine run without a pre-pass. A container's slot keeps where
/// it was made (its [`super::value::Container::offset`]), so that a `GET` can tell the
/// container from a later one in its reused heap slot.
#[derive(Debug, Default)]
pub(super) struct Every {
    /// Slots `0..len`, as `MEMOIZE` and in-order `PUT`s fill them.
    values: Vec<Value>,
    born: Vec<u32>,
    /// Slots put past the end of `values`.
    sparse: HashMap<u32, (Value, u32)>,
}

impl Every {
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn store(&mut self, i: u32, v: Value, born: u32) {
        let k = i as usize;
        if let (Some(slot), Some(b)) = (self.values.get_mut(k), self.born.get_mut(k)) {
            *slot = v;
            *b = born;
        } else if k == self.values.len() {
            self.values.push(v);
            self.born.push(born);
        } else {
            self.sparse.insert(i, (v, born));
        }
    }

    /// Slot `i` and where its container was made.
    #[inline]
    pub(super) fn get(&self, i: u32) -> Option<(Value, u32)> {
        let k = i as usize;
        match (self.values.get(k), self.born.get(k)) {
            (Some(&v), Some(&b)) => Some((v, b)),
            _ => self.sparse.get(&i).copied(),
        }
    }
}

impl Memo {
    pub(super) fn new(refs: IndexSet, input_len: usize) -> Memo {
        let mut dir = Vec::with_capacity(refs.bits.len() * 8);
        let mut total = 0u64;
        for w in &refs.bits {
            for byte in w.to_le_bytes() {
                dir.push(total << 8 | u64::from(byte));
                total += u64::from(byte.count_ones());
            }
        }
        Memo {
            refs,
            dir,
            slots: vec![None; usize::try_from(total).unwrap_or(0)],
            sparse: HashMap::new(),
            set: None,
            len: 0,
            input_len,
            floor: 0,
            every: None,
        }
    }

    /// A memo that keeps every slot (the single pass: no pre-pass ran).
    pub(super) fn every(input_len: usize) -> Memo {
        let mut memo = Memo::new(IndexSet::new(input_len), input_len);
        // Real snapshots store an object every 30-35 bytes: room for them up front (no
        // doubling, which in wasm copies and keeps the old block).
        let room = input_len / 32;
        memo.every = Some(Box::new(Every {
            values: Vec::with_capacity(room),
            born: Vec::with_capacity(room),
            sparse: HashMap::new(),
        }));
        memo
    }

    /// [`Memo::memoize`] or [`Memo::put`] of the single pass: kept, with where its
    /// container was made (`born`). Nothing is marked shared until a `GET` reads it.
    #[inline]
    pub(super) fn store_every(&mut self, i: u32, v: Value, born: u32) {
        if let Some(every) = &mut self.every {
            every.store(i, v, born);
        }
    }

    #[inline]
    pub(super) fn dense_slot(&self, i: u32) -> Option<usize> {
        static POP8: [u8; 256] = {
            let mut t = [0u8; 256];
            let mut i = 0;
            while i < 256 {
                t[i] = (i as u8).count_ones() as u8;
                i += 1;
            }
            t
        };
        let e = *self.dir.get((i >> 3) as usize)?;
        let bit = 1u64 << (i & 7);
        if e & bit == 0 {
            return None;
        }
        let below = POP8[(e & (bit - 1)) as usize];
        Some((e >> 8) as usize + usize::from(below))
    }

    /// `memo[len(memo)] = v` (`MEMOIZE`); `None` if the memo is full, else whether the
    /// slot is kept (some `GET` reads it).
    #[inline]
    pub(super) fn memoize(&mut self, v: Value) -> Option<bool> {
        let i = self.memoize_index()?;
        Some(self.store(i, v))
    }

    /// The index `MEMOIZE` stores at, counted in `len(memo)`; `None` if the memo is full.
    #[inline]
    pub(super) fn memoize_index(&mut self) -> Option<u32> {
        let i = u32::try_from(self.len).ok()?;
        match &mut self.set {
            None => self.len += 1,
            Some(set) => {
                if set.insert(i) {
                    self.len += 1;
                }
            }
        }
        Some(i)
    }

    /// `memo[i] = v` (`PUT`); true if the slot is kept.
    pub(super) fn put(&mut self, i: u32, v: Value) -> bool {
        self.put_index(i);
        self.store(i, v)
    }

    /// Counts index `i` in `len(memo)` as a `PUT` to it does.
    pub(super) fn put_index(&mut self, i: u32) {
        let len = self.len;
        let set = self.set.get_or_insert_with(|| {
            let mut set = IndexSet::new(self.input_len);
            for k in 0..len {
                set.insert(k as u32);
            }
            set
        });
        if set.insert(i) {
            self.len += 1;
        }
    }

    #[inline]
    pub(super) fn store(&mut self, i: u32, v: Value) -> bool {
        if i >= self.refs.dense_limit {
            if self.refs.sparse.contains(&i) {
                self.sparse.insert(i, v);
                return true;
            }
            return false;
        }
        match self.dense_slot(i).and_then(|s| self.slots.get_mut(s)) {
            Some(slot) => {
                *slot = Some(v);
                true
            }
            None => false,
        }
    }

    /// Whether `i` is read back by some `GET`.
    pub(super) fn is_ref(&self, i: u32) -> bool {
        if i >= self.refs.dense_limit {
            return self.refs.sparse.contains(&i);
        }
        self.dense_slot(i).is_some()
    }

    #[inline]
    pub(super) fn get(&self, i: u32) -> Option<Value> {
        if i >= self.refs.dense_limit {
            return self.sparse.get(&i).copied();
        }
        self.slots.get(self.dense_slot(i)?).copied().flatten()
    }
}
