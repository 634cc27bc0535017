//! The free-block set of a `BlockPool`, ordered as PyTorch's `BlockComparatorSize` orders it:
//! (stream, size, address). Stored as one chunked sorted index per stream keyed by
//! `size << 64 | address` (the shared [`SortedIndex`]: a best-fit lookup is two binary
//! searches comparing one `u128`, an update shifts one small chunk); the streams are kept
//! sorted so a walk over the whole set is in comparator order.

use crate::models::sorted_index::{Iter, Pos, SortedIndex};

fn key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

fn unkey(k: u128) -> (u64, u64) {
    ((k >> 64) as u64, k as u64)
}

/// Free blocks by (stream, size, address) → block index.
#[derive(Debug, Clone, Default)]
pub(super) struct FreeIndex {
    /// Sorted by stream.
    streams: Vec<(u64, SortedIndex<u128>)>,
    len: usize,
}

impl FreeIndex {
    fn find(&self, stream: u64) -> Result<usize, usize> {
        // A walk, not a binary search: a pool sees one stream or a few.
        match self.streams.iter().position(|s| s.0 >= stream) {
            Some(at) if self.streams[at].0 == stream => Ok(at),
            Some(at) => Err(at),
            None => Err(self.streams.len()),
        }
    }

    /// Inserts a block.
    pub(super) fn insert(&mut self, stream: u64, size: u64, addr: u64, i: u32) {
        let at = match self.find(stream) {
            Ok(at) => at,
            Err(at) => {
                self.streams.insert(at, (stream, SortedIndex::default()));
                at
            }
        };
        if self.streams[at].1.insert(key(size, addr), i) {
            self.len += 1;
        }
    }

    /// Removes a block; whether it was there.
    pub(super) fn remove(&mut self, stream: u64, size: u64, addr: u64) -> bool {
        let Ok(at) = self.find(stream) else {
            return false;
        };
        let removed = self.streams[at].1.remove(key(size, addr)).is_some();
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Moves the entry `old` = (size, addr) of `stream` to `new` for block `i` (remove then
    /// insert, in one pass where the order allows); whether `old` was there.
    pub(super) fn reposition(
        &mut self,
        stream: u64,
        old: (u64, u64),
        new: (u64, u64),
        i: u32,
    ) -> bool {
        let Ok(at) = self.find(stream) else {
            return false;
        };
        self.streams[at]
            .1
            .reposition(key(old.0, old.1), key(new.0, new.1), i)
    }

    /// Blocks of `stream` with size ≥ `size`, smallest first (ties: lowest address):
    /// `(size, addr, index)`; [`AtLeast::pos`] tells where the last one stands.
    pub(super) fn at_least(&self, stream: u64, size: u64) -> AtLeast<'_> {
        match self.find(stream) {
            Ok(at) => AtLeast {
                stream_at: at as u32,
                it: self.streams[at].1.iter_from(key(size, 0)),
            },
            Err(_) => AtLeast {
                stream_at: 0,
                it: Iter::default(),
            },
        }
    }

    /// Removes the entry at `at` (the index unchanged since it was found).
    pub(super) fn remove_at(&mut self, at: FreePos) {
        self.streams[at.stream_at as usize].1.remove_at_pos(at.pos);
        self.len -= 1;
    }

    /// Moves the entry at `at` (the index unchanged since it was found) to `new` =
    /// (size, addr) for block `i`; false, with nothing changed, if `new` is taken.
    pub(super) fn reposition_at(&mut self, at: FreePos, new: (u64, u64), i: u32) -> bool {
        self.streams[at.stream_at as usize]
            .1
            .reposition_at(at.pos, key(new.0, new.1), i)
    }

    /// Blocks of `stream` with size < `size`, largest first.
    pub(super) fn below_size_rev(
        &self,
        stream: u64,
        size: u64,
    ) -> impl Iterator<Item = (u64, u64, u32)> + '_ {
        let m = self.find(stream).ok().map(|at| &self.streams[at].1);
        m.into_iter().flat_map(move |m| {
            m.iter_below_rev(key(size, 0)).map(|(k, v)| {
                let (s, a) = unkey(k);
                (s, a, v)
            })
        })
    }

    /// Every block in comparator order: `(stream, size, addr, index)`.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, u64, u64, u32)> + '_ {
        self.streams.iter().flat_map(|(st, m)| {
            m.iter().map(move |(k, v)| {
                let (s, a) = unkey(k);
                (*st, s, a, v)
            })
        })
    }

    /// The block indexes in comparator order.
    pub(super) fn values(&self) -> Vec<u32> {
        self.iter().map(|x| x.3).collect()
    }

    /// The largest free block of any stream.
    pub(super) fn largest(&self) -> u64 {
        self.streams
            .iter()
            .filter_map(|(_, m)| m.last())
            .map(|(k, _)| unkey(k).0)
            .max()
            .unwrap_or(0)
    }

    /// The per-stream indexes' own structure.
    pub(super) fn check(&self) -> Result<(), String> {
        self.streams.iter().try_for_each(|(_, m)| m.check())
    }

    /// Number of blocks.
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

/// Where a free block's entry stands in a [`FreeIndex`], until the index next changes.
#[derive(Debug, Clone, Copy)]
pub(super) struct FreePos {
    stream_at: u32,
    pos: Pos,
}

/// The walk [`FreeIndex::at_least`] returns.
pub(super) struct AtLeast<'a> {
    stream_at: u32,
    it: Iter<'a, u128>,
}

impl AtLeast<'_> {
    /// Where the entry the last `next` returned stands.
    pub(super) fn pos(&self) -> FreePos {
        FreePos {
            stream_at: self.stream_at,
            pos: self.it.pos(),
        }
    }
}

impl Iterator for AtLeast<'_> {
    type Item = (u64, u64, u32);

    fn next(&mut self) -> Option<(u64, u64, u32)> {
        self.it.next().map(|(k, v)| {
            let (s, a) = unkey(k);
            (s, a, v)
        })
    }
}
