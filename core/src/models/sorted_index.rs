//! The free index every model keeps its free blocks in: an ordered map from a key the model
//! chooses to a block index, stored as a list of sorted chunks of at most 64 entries
//! with each chunk's first key beside it. A lookup is two binary searches over
//! small contiguous arrays and an update shifts at most one chunk: a few times faster than
//! a node-based tree (`BTreeMap`) for the hundreds to hundreds of thousands of free blocks
//! a model holds, and iteration in key order is a walk over contiguous memory. Keys and
//! values sit in separate arrays of a chunk, so a search reads keys only.
//!
//! The key is any `Ord + Copy` type: [`super::common::FreeKey`] for the models built on the
//! shared arena, `size << 64 | address` per stream for the PyTorch model.

/// Most entries a chunk holds; a full chunk splits in two halves.
const CAP: usize = 64;

/// Where an entry stands (chunk, position), as [`Iter::pos`] reports it: valid until the
/// index next changes. Two `u32`s, so that a search's answer (a position beside a key and
/// a value) is returned in registers rather than copied through the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    c: u32,
    p: u32,
}

impl Pos {
    fn new(c: usize, p: usize) -> Pos {
        // A chunk holds at most `CAP` entries and an index at most `u32::MAX` (the values
        // are `u32` block indexes): both fit.
        Pos {
            c: c as u32,
            p: p as u32,
        }
    }
}

/// `s.partition_point(below)`: the number of leading elements `below` holds for (it holds
/// for a prefix of `s`), without a branch per step: each halving picks the half with a
/// conditional move, so a search costs no mispredicted jumps (a free index's searches
/// land anywhere: a branchy binary search mispredicts about every other step).
#[inline]
fn count_below<K: Copy>(s: &[K], below: impl Fn(K) -> bool) -> usize {
    if s.is_empty() {
        return 0;
    }
    let mut base = 0;
    let mut n = s.len();
    // Invariant: `below` holds for every element before `base` and for none from
    // `base + n` on.
    while n > 1 {
        let half = n / 2;
        // `select_unpredictable`: LLVM would otherwise turn the conditional move back
        // into a jump.
        base = std::hint::select_unpredictable(below(s[base + half]), base + half, base);
        n -= half;
    }
    base + usize::from(below(s[base]))
}

/// One chunk: keys and values in separate arrays, so a search touches only keys.
#[derive(Debug, Clone)]
struct Chunk<K> {
    len: usize,
    keys: [K; CAP],
    vals: [u32; CAP],
}

impl<K: Ord + Copy + Default> Chunk<K> {
    fn new() -> Box<Chunk<K>> {
        Box::new(Chunk {
            len: 0,
            keys: [K::default(); CAP],
            vals: [0; CAP],
        })
    }

    fn keys(&self) -> &[K] {
        &self.keys[..self.len]
    }

    fn entry(&self, p: usize) -> (K, u32) {
        (self.keys[p], self.vals[p])
    }

    /// Position of the first key ≥ `k`.
    fn lower_bound(&self, k: K) -> usize {
        count_below(self.keys(), |x| x < k)
    }

    fn insert_at(&mut self, p: usize, k: K, v: u32) {
        let n = self.len;
        self.keys.copy_within(p..n, p + 1);
        self.vals.copy_within(p..n, p + 1);
        self.keys[p] = k;
        self.vals[p] = v;
        self.len = n + 1;
    }

    fn remove_at(&mut self, p: usize) -> u32 {
        let n = self.len;
        let v = self.vals[p];
        self.keys.copy_within(p + 1..n, p);
        self.vals.copy_within(p + 1..n, p);
        self.len = n - 1;
        v
    }

    /// Entries `from..to`, in order.
    fn iter(&self, from: usize, to: usize) -> impl DoubleEndedIterator<Item = (K, u32)> + '_ {
        (from..to).map(|p| (self.keys[p], self.vals[p]))
    }
}

/// An ordered map `K → u32` in sorted chunks. Invariants ([`SortedIndex::check`]): no
/// chunk is empty, keys strictly increase within and across chunks, `mins[c]` is the
/// first key of `chunks[c]`, `len` is the total.
#[derive(Debug, Clone)]
pub struct SortedIndex<K> {
    chunks: Vec<Box<Chunk<K>>>,
    /// `mins[c]` is the first key of `chunks[c]`.
    mins: Vec<K>,
    len: usize,
}

impl<K> Default for SortedIndex<K> {
    fn default() -> Self {
        SortedIndex {
            chunks: Vec::new(),
            mins: Vec::new(),
            len: 0,
        }
    }
}

impl<K: Ord + Copy + Default + std::fmt::Debug> SortedIndex<K> {
    /// Number of entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk that holds (or would hold) `k`.
    fn chunk_for(&self, k: K) -> usize {
        match self.mins.len() {
            0 | 1 => 0,
            _ => count_below(&self.mins, |m| m <= k).saturating_sub(1),
        }
    }

    /// Chunk and position of `k`, if present.
    fn find(&self, k: K) -> Option<(usize, usize)> {
        let c = self.chunk_for(k);
        let ch = self.chunks.get(c)?;
        let p = ch.lower_bound(k);
        (p < ch.len && ch.keys[p] == k).then_some((c, p))
    }

    /// Inserts `k`; false if it was present (nothing changes then).
    pub fn insert(&mut self, k: K, v: u32) -> bool {
        if self.chunks.is_empty() {
            let mut first = Chunk::new();
            first.insert_at(0, k, v);
            self.chunks.push(first);
            self.mins.push(k);
            self.len = 1;
            return true;
        }
        let c = self.chunk_for(k);
        let pos = self.chunks[c].lower_bound(k);
        let chunk = &self.chunks[c];
        if pos < chunk.len && chunk.keys[pos] == k {
            return false;
        }
        self.insert_at(c, pos, k, v);
        true
    }

    /// Puts `k` at position `pos` of chunk `c`, where the order wants it (splitting a full
    /// chunk first).
    fn insert_at(&mut self, c: usize, pos: usize, k: K, v: u32) {
        self.len += 1;
        let chunk = &mut self.chunks[c];
        if chunk.len == CAP {
            // Split first: the upper half moves to a new chunk after this one.
            let half = CAP / 2;
            let mut tail = Chunk::new();
            tail.keys[..CAP - half].copy_from_slice(&chunk.keys[half..]);
            tail.vals[..CAP - half].copy_from_slice(&chunk.vals[half..]);
            tail.len = CAP - half;
            chunk.len = half;
            if pos <= half {
                chunk.insert_at(pos, k, v);
            } else {
                tail.insert_at(pos - half, k, v);
            }
            let tail_min = tail.keys[0];
            self.mins[c] = self.chunks[c].keys[0];
            self.mins.insert(c + 1, tail_min);
            self.chunks.insert(c + 1, tail);
            return;
        }
        chunk.insert_at(pos, k, v);
        if pos == 0 {
            self.mins[c] = k;
        }
    }

    /// Takes out the entry at position `pos` of chunk `c` (dropping the chunk if that
    /// empties it); its value and whether the chunk went.
    fn remove_at(&mut self, c: usize, pos: usize) -> (u32, bool) {
        let chunk = &mut self.chunks[c];
        let v = chunk.remove_at(pos);
        self.len -= 1;
        if chunk.len == 0 {
            self.chunks.remove(c);
            self.mins.remove(c);
            return (v, true);
        }
        if pos == 0 {
            self.mins[c] = chunk.keys[0];
        }
        (v, false)
    }

    /// Removes `k`; its value if it was present.
    pub fn remove(&mut self, k: K) -> Option<u32> {
        let (c, pos) = self.find(k)?;
        Some(self.remove_at(c, pos).0)
    }

    /// Removes the entry at `at` (from [`Iter::pos`], the index unchanged since); its value.
    pub fn remove_at_pos(&mut self, at: Pos) -> u32 {
        self.remove_at(at.c as usize, at.p as usize).0
    }

    /// Moves the entry `old` to key `new` with value `v` (as `remove(old)` then
    /// `insert(new, v)` would), with one search for each key: inside one chunk only the
    /// entries between the two positions shift. False, with nothing changed, when `old`
    /// is absent or `new` is another entry's key.
    pub fn reposition(&mut self, old: K, new: K, v: u32) -> bool {
        let Some((c, p)) = self.find(old) else {
            return false;
        };
        self.reposition_at(Pos::new(c, p), new, v)
    }

    /// [`Self::reposition`] of the entry at `at` (from [`Iter::pos`], the index unchanged
    /// since), without searching for it.
    pub fn reposition_at(&mut self, at: Pos, new: K, v: u32) -> bool {
        let (c, p) = (at.c as usize, at.p as usize);
        let ch = &mut self.chunks[c];
        let old = ch.keys[p];
        // Often the new key still lies between the entry's neighbours in its chunk (a
        // split that leaves the largest block the largest): it changes in place.
        let above_prev = if p > 0 { ch.keys[p - 1] < new } else { c == 0 };
        let below_next = if p + 1 < ch.len {
            new < ch.keys[p + 1]
        } else {
            c + 1 == self.mins.len()
        };
        if above_prev && below_next {
            ch.keys[p] = new;
            ch.vals[p] = v;
            if p == 0 {
                self.mins[c] = new;
            }
            return true;
        }
        let to = self.chunk_for(new);
        if to != c {
            let q = self.chunks[to].lower_bound(new);
            let target = &self.chunks[to];
            if q < target.len && target.keys[q] == new {
                return false;
            }
            let (_, dropped) = self.remove_at(c, p);
            let to = if dropped && c < to { to - 1 } else { to };
            self.insert_at(to, q, new, v);
            return true;
        }
        let ch = &mut self.chunks[c];
        if new < old {
            let q = count_below(&ch.keys[..p], |x| x < new);
            if q < p && ch.keys[q] == new {
                return false;
            }
            ch.keys.copy_within(q..p, q + 1);
            ch.vals.copy_within(q..p, q + 1);
            ch.keys[q] = new;
            ch.vals[q] = v;
        } else {
            let q = p + 1 + count_below(&ch.keys[p + 1..ch.len], |x| x < new);
            if q < ch.len && ch.keys[q] == new {
                return false;
            }
            ch.keys.copy_within(p + 1..q, p);
            ch.vals.copy_within(p + 1..q, p);
            ch.keys[q - 1] = new;
            ch.vals[q - 1] = v;
        }
        self.mins[c] = ch.keys[0];
        true
    }

    /// Replaces `old` by `new` in place when no key lies between them (the order is kept);
    /// false, with nothing changed, otherwise.
    pub fn replace(&mut self, old: K, new: K, v: u32) -> bool {
        let Some((c, pos)) = self.find(old) else {
            return false;
        };
        let chunk = &self.chunks[c];
        let before = if pos > 0 {
            Some(chunk.keys[pos - 1])
        } else if c > 0 {
            let p = &self.chunks[c - 1];
            Some(p.keys[p.len - 1])
        } else {
            None
        };
        let after = if pos + 1 < chunk.len {
            Some(chunk.keys[pos + 1])
        } else {
            self.mins.get(c + 1).copied()
        };
        if before.is_some_and(|b| b >= new) || after.is_some_and(|a| a <= new) {
            return false;
        }
        let chunk = &mut self.chunks[c];
        chunk.keys[pos] = new;
        chunk.vals[pos] = v;
        if pos == 0 {
            self.mins[c] = new;
        }
        true
    }

    /// The value under `k`.
    #[must_use]
    pub fn get(&self, k: K) -> Option<u32> {
        self.find(k).map(|(c, p)| self.chunks[c].vals[p])
    }

    /// Position (chunk, index) of the first key ≥ `k`.
    fn lower_bound(&self, k: K) -> (usize, usize) {
        if self.chunks.is_empty() {
            return (0, 0);
        }
        let c = self.chunk_for(k);
        let pos = self.chunks[c].lower_bound(k);
        if pos == self.chunks[c].len {
            (c + 1, 0)
        } else {
            (c, pos)
        }
    }

    /// The first entry with key ≥ `k`.
    #[must_use]
    pub fn first_from(&self, k: K) -> Option<(K, u32)> {
        let (c, p) = self.lower_bound(k);
        self.chunks.get(c).map(|ch| ch.entry(p))
    }

    /// The last entry with key < `k`.
    #[must_use]
    pub fn last_below(&self, k: K) -> Option<(K, u32)> {
        let c = count_below(&self.mins, |m| m < k).checked_sub(1)?;
        let chunk = &self.chunks[c];
        Some(chunk.entry(chunk.lower_bound(k) - 1))
    }

    /// The entry with the largest key.
    #[must_use]
    pub fn last(&self) -> Option<(K, u32)> {
        self.chunks.last().map(|c| c.entry(c.len - 1))
    }

    /// Entries with keys ≥ `from`, in order.
    #[must_use]
    pub fn iter_from(&self, from: K) -> Iter<'_, K> {
        let (c, p) = self.lower_bound(from);
        Iter {
            chunks: &self.chunks,
            c,
            p,
        }
    }

    /// Entries with keys in `[from, to)`, in order.
    pub fn range(&self, from: K, to: K) -> impl Iterator<Item = (K, u32)> + '_ {
        self.iter_from(from).take_while(move |e| e.0 < to)
    }

    /// Entries with keys < `below`, largest first.
    pub fn iter_below_rev(&self, below: K) -> impl Iterator<Item = (K, u32)> + '_ {
        let (c, p) = self.lower_bound(below);
        // The first `p` entries of chunk `c`, then the chunks before it whole.
        let head = self
            .chunks
            .get(c)
            .into_iter()
            .flat_map(move |ch| ch.iter(0, p).rev());
        let c = c.min(self.chunks.len());
        head.chain(
            self.chunks[..c]
                .iter()
                .rev()
                .flat_map(|ch| ch.iter(0, ch.len).rev()),
        )
    }

    /// Every entry, in order.
    #[must_use]
    pub fn iter(&self) -> Iter<'_, K> {
        Iter {
            chunks: &self.chunks,
            c: 0,
            p: 0,
        }
    }

    /// The index's own structure (see the type's invariants).
    ///
    /// # Errors
    /// What is malformed.
    pub fn check(&self) -> Result<(), String> {
        if self.mins.len() != self.chunks.len()
            || self.chunks.iter().map(|c| c.len).sum::<usize>() != self.len
        {
            return Err("free index: chunk bookkeeping is off".to_string());
        }
        let mut prev: Option<K> = None;
        for (c, ch) in self.chunks.iter().enumerate() {
            if ch.len == 0 || ch.len > CAP || self.mins[c] != ch.keys[0] {
                return Err(format!("free index: chunk {c} is malformed"));
            }
            for &k in ch.keys() {
                if prev.is_some_and(|p| p >= k) {
                    return Err(format!("free index: keys out of order at {k:?}"));
                }
                prev = Some(k);
            }
        }
        Ok(())
    }
}

impl<'a, K: Ord + Copy + Default + std::fmt::Debug> IntoIterator for &'a SortedIndex<K> {
    type Item = (K, u32);
    type IntoIter = Iter<'a, K>;

    fn into_iter(self) -> Iter<'a, K> {
        self.iter()
    }
}

/// An in-order walk over a [`SortedIndex`] from some position; empty by default.
#[derive(Debug, Clone)]
pub struct Iter<'a, K> {
    chunks: &'a [Box<Chunk<K>>],
    /// Next chunk and position in it.
    c: usize,
    p: usize,
}

impl<K> Default for Iter<'_, K> {
    fn default() -> Self {
        Iter {
            chunks: &[],
            c: 0,
            p: 0,
        }
    }
}

impl<K> Iter<'_, K> {
    /// Where the entry the last `next` returned stands.
    #[must_use]
    pub fn pos(&self) -> Pos {
        Pos::new(self.c, self.p.wrapping_sub(1))
    }
}

impl<K: Copy> Iterator for Iter<'_, K> {
    type Item = (K, u32);

    fn next(&mut self) -> Option<(K, u32)> {
        loop {
            let ch = self.chunks.get(self.c)?;
            if self.p < ch.len {
                let e = (ch.keys[self.p], ch.vals[self.p]);
                self.p += 1;
                return Some(e);
            }
            self.c += 1;
            self.p = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn the_chunked_index_agrees_with_a_btree_map() {
        let mut idx = SortedIndex::default();
        let mut reference: BTreeMap<(u64, u64, u64), u32> = BTreeMap::new();
        let mut x: u64 = 0x9E37_79B9;
        for step in 0..40_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = (x % 3, (x >> 8) % 700, (x >> 20) % 50);
            if x % 5 < 3 {
                assert_eq!(idx.insert(k, step), !reference.contains_key(&k));
                reference.entry(k).or_insert(step);
            } else if x % 5 == 3 {
                if x & 64 == 0 {
                    assert_eq!(idx.remove(k), reference.remove(&k));
                } else if let Some((&at, &v)) = reference.range(k..).next() {
                    // Removed where a search has just found it.
                    let mut it = idx.iter_from(k);
                    assert_eq!(it.next(), Some((at, v)));
                    assert_eq!(idx.remove_at_pos(it.pos()), v);
                    reference.remove(&at);
                }
            } else if let Some((&old, _)) = reference.range(k..).next() {
                // Move an existing entry to a fresh key, as a split or merge does: by its
                // key, or where a search has just found it.
                let new = ((x >> 5) % 3, (x >> 13) % 700, (x >> 29) % 50);
                let moved = if x & 64 == 0 {
                    idx.reposition(old, new, step)
                } else {
                    let mut it = idx.iter_from(k);
                    assert_eq!(it.next().map(|e| e.0), Some(old));
                    let at = it.pos();
                    idx.reposition_at(at, new, step)
                };
                assert_eq!(moved, old == new || !reference.contains_key(&new));
                if moved {
                    reference.remove(&old);
                    reference.insert(new, step);
                }
            }
            let probe = ((x >> 3) % 3, (x >> 11) % 700, 0);
            assert_eq!(
                idx.first_from(probe),
                reference.range(probe..).next().map(|(&k, &v)| (k, v))
            );
            assert_eq!(
                idx.last_below(probe),
                reference.range(..probe).next_back().map(|(&k, &v)| (k, v))
            );
            assert_eq!(
                idx.last(),
                reference.iter().next_back().map(|(&k, &v)| (k, v))
            );
            if step % 97 == 0 {
                let to = (probe.0 + 1, 0, 0);
                let got: Vec<_> = idx.range(probe, to).collect();
                let want: Vec<_> = reference.range(probe..to).map(|(&k, &v)| (k, v)).collect();
                assert_eq!(got, want);
                let got: Vec<_> = idx.iter_below_rev(probe).collect();
                let want: Vec<_> = reference
                    .range(..probe)
                    .rev()
                    .map(|(&k, &v)| (k, v))
                    .collect();
                assert_eq!(got, want);
                let got: Vec<_> = idx.iter().collect();
                let want: Vec<_> = reference.iter().map(|(&k, &v)| (k, v)).collect();
                assert_eq!(got, want);
                idx.check().unwrap();
            }
            assert_eq!(idx.get(k), reference.get(&k).copied());
        }
        assert_eq!(idx.len(), reference.len());
        assert!(idx.len() > 3 * CAP, "the test crosses chunk splits");
    }

    #[test]
    fn replace_keeps_the_order_or_refuses() {
        let mut idx = SortedIndex::default();
        for k in [10u64, 20, 30] {
            idx.insert(k, k as u32);
        }
        assert!(idx.replace(20, 25, 7));
        assert_eq!(idx.get(25), Some(7));
        assert!(!idx.replace(25, 35, 7), "30 lies between");
        assert_eq!(
            idx.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![10, 25, 30]
        );
        idx.check().unwrap();
    }
}
