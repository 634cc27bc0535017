//! Splitting, merging, indexing, allocating and freeing blocks.

use super::{Arena, Block, NIL, State};
use crate::models::common::FreeKey;
use crate::models::{ModelError, ModelEvent};
use crate::snapshot::Action;

impl Arena {
    /// Whether block `i` is in the free index.
    #[must_use]
    pub fn is_indexed(&self, i: u32) -> bool {
        self.b(i).indexed
    }

    /// Splits block `i` (not in the free index) after `first` bytes; the tail is a new block
    /// with the same state, owner and stream, not indexed. Returns the tail.
    pub fn split(&mut self, i: u32, first: u64) -> u32 {
        let (addr, size, seg, next, state, owner, stream) = {
            let b = self.b(i);
            (b.addr, b.size, b.seg, b.next, b.state, b.owner, b.stream)
        };
        debug_assert!(
            first > 0 && first < size,
            "split of a {size}-byte block at {first}"
        );
        let t = self.new_block(Block {
            addr: addr + first,
            size: size - first,
            requested: 0,
            stream,
            seg,
            prev: i,
            next,
            state,
            owner,
            key: FreeKey::default(),
            indexed: false,
        });
        if next != NIL {
            self.bm(next).prev = t;
        }
        let b = self.bm(i);
        b.size = first;
        b.next = t;
        t
    }

    /// Splits free block `i`, which stays in the free index under its key (a model whose keys
    /// do not depend on a block's size saves the re-keying), after `first` bytes. The tail is
    /// returned free and not indexed.
    pub fn split_indexed(&mut self, i: u32, first: u64) -> u32 {
        let size = self.b(i).size;
        debug_assert!(self.b(i).indexed, "split_indexed of an unindexed block");
        self.largest.remove(size);
        self.largest.insert(first);
        self.free_bytes -= size - first;
        self.split(i, first)
    }

    /// Merges the next block (free, not indexed) into free block `i`, which stays in the free
    /// index under its key (see [`Arena::split_indexed`]).
    pub fn absorb_next_indexed(&mut self, i: u32) {
        let size = self.b(i).size;
        debug_assert!(
            self.b(i).indexed,
            "absorb_next_indexed of an unindexed block"
        );
        let add = self.absorb_next(i);
        self.largest.remove(size);
        self.largest.insert(size + add);
        self.free_bytes += add;
    }

    /// Free block `i` (indexed, now `i_old_size` in the counts) leaves the free index and
    /// free block `t` (not indexed) enters it under `key`, in `i`'s slot when the order
    /// allows: one update instead of a removal and an insertion (a split that hands out the
    /// low part of a block whose keys follow addresses).
    pub fn transfer_index(&mut self, i: u32, i_old_size: u64, t: u32, key: FreeKey) {
        let old = self.b(i).key;
        self.largest.remove(i_old_size);
        self.free_bytes -= i_old_size;
        self.bm(i).indexed = false;
        if !self.free.replace(old, key, t) {
            self.free.remove(old);
            let fresh = self.free.insert(key, t);
            debug_assert!(fresh, "free key {key:?} used twice");
        }
        let size = {
            let b = self.bm(t);
            b.state = State::Free;
            b.key = key;
            b.indexed = true;
            b.size
        };
        self.largest.insert(size);
        self.free_bytes += size;
    }

    /// Merges `i`'s next neighbour into `i`. Neither may be in the free index; the next block
    /// must not be live. Returns the bytes absorbed.
    pub fn absorb_next(&mut self, i: u32) -> u64 {
        let n = self.b(i).next;
        let (nsize, nnext) = (self.b(n).size, self.b(n).next);
        if nnext != NIL {
            self.bm(nnext).prev = i;
        }
        let b = self.bm(i);
        b.size += nsize;
        b.next = nnext;
        self.free_block_slots.push(n);
        self.blocks[n as usize].state = State::Unmapped;
        nsize
    }

    /// Puts free block `i` into the free index under `key`.
    pub fn insert_free(&mut self, i: u32, key: FreeKey) {
        let size = {
            let b = self.bm(i);
            debug_assert!(!b.indexed, "block at {:#x} indexed twice", b.addr);
            b.state = State::Free;
            b.key = key;
            b.indexed = true;
            b.size
        };
        let fresh = self.free.insert(key, i);
        debug_assert!(fresh, "free key {key:?} used twice");
        self.largest.insert(size);
        self.free_bytes += size;
    }

    /// Takes free block `i` out of the free index (its state stays `Free` until the caller
    /// allocates or merges it).
    pub fn remove_free(&mut self, i: u32) {
        let (key, size) = (self.b(i).key, self.b(i).size);
        debug_assert!(
            self.b(i).indexed,
            "block at {:#x} is not indexed",
            self.b(i).addr
        );
        self.bm(i).indexed = false;
        self.free.remove(key);
        self.largest.remove(size);
        self.free_bytes -= size;
    }

    /// The first free block with key ≥ `from`.
    #[must_use]
    pub fn first_free_from(&self, from: FreeKey) -> Option<(FreeKey, u32)> {
        self.free.first_from(from)
    }

    /// The last free block with key < `below`.
    #[must_use]
    pub fn last_free_below(&self, below: FreeKey) -> Option<(FreeKey, u32)> {
        self.free.last_below(below)
    }

    /// Free blocks with keys in `[from, to)`, in key order.
    #[must_use = "an iterator does nothing unless used"]
    pub fn free_range(
        &self,
        from: FreeKey,
        to: FreeKey,
    ) -> impl Iterator<Item = (FreeKey, u32)> + '_ {
        self.free.range(from, to)
    }

    /// Marks block `i` (out of the free index) as allocated for a request of `requested`
    /// bytes on `stream`, and emits `alloc`.
    pub fn allocate(&mut self, i: u32, requested: u64, stream: u64, out: &mut Vec<ModelEvent>) {
        let b = self.bm(i);
        b.state = State::Allocated;
        b.requested = requested;
        b.stream = stream;
        let (addr, size) = (b.addr, b.size);
        self.allocated_bytes += size;
        self.requested_bytes += requested;
        self.live.insert(addr, i);
        out.push(ModelEvent {
            action: Action::Alloc,
            addr,
            size: requested,
            stream,
        });
    }

    /// The program frees `addr`: emits `free_requested`; with `deferred` the block becomes
    /// pending and `Ok(None)` is returned, else it is released (see [`Arena::complete`]).
    pub fn release(
        &mut self,
        addr: u64,
        deferred: bool,
        out: &mut Vec<ModelEvent>,
    ) -> Result<Option<u32>, ModelError> {
        let i = self
            .live_block(addr)
            .ok_or(ModelError::UnknownAddress(addr))?;
        if self.b(i).state != State::Allocated {
            return Err(ModelError::UnknownAddress(addr));
        }
        let (size, req, stream) = (self.b(i).size, self.b(i).requested, self.b(i).stream);
        self.allocated_bytes -= size;
        out.push(ModelEvent {
            action: Action::FreeRequested,
            addr,
            size: req,
            stream,
        });
        self.bm(i).state = State::Pending;
        if deferred {
            return Ok(None);
        }
        self.complete(addr, out).map(Some)
    }

    /// A pending free completes: emits `free_completed` and returns the block, now `Free`
    /// but neither merged nor indexed (the model does both).
    pub fn complete(&mut self, addr: u64, out: &mut Vec<ModelEvent>) -> Result<u32, ModelError> {
        let i = self.live_block(addr).ok_or(ModelError::NotPending(addr))?;
        if self.b(i).state != State::Pending {
            return Err(ModelError::NotPending(addr));
        }
        self.live.remove(&addr);
        let b = self.bm(i);
        let (req, stream) = (b.requested, b.stream);
        b.state = State::Free;
        b.requested = 0;
        self.requested_bytes -= req;
        out.push(ModelEvent {
            action: Action::FreeCompleted,
            addr,
            size: req,
            stream,
        });
        Ok(i)
    }

    /// Merges free block `i` (not indexed) with its free neighbours for which
    /// `can_merge(neighbour)` holds; merged neighbours leave the free index. Returns the
    /// surviving block (not indexed).
    pub fn coalesce(&mut self, i: u32, can_merge: impl Fn(&Block) -> bool) -> u32 {
        let mut cur = i;
        let n = self.b(cur).next;
        if n != NIL && self.b(n).indexed && can_merge(self.b(n)) {
            self.remove_free(n);
            self.absorb_next(cur);
        }
        let p = self.b(cur).prev;
        if p != NIL && self.b(p).indexed && can_merge(self.b(p)) {
            self.remove_free(p);
            self.absorb_next(p);
            cur = p;
        }
        cur
    }

    /// Merges adjacent `Unmapped` neighbours into unmapped block `i`. Returns the survivor.
    pub fn coalesce_unmapped(&mut self, i: u32) -> u32 {
        let mut cur = i;
        let n = self.b(cur).next;
        if n != NIL && self.b(n).state == State::Unmapped {
            self.absorb_next(cur);
        }
        let p = self.b(cur).prev;
        if p != NIL && self.b(p).state == State::Unmapped {
            self.absorb_next(p);
            cur = p;
        }
        cur
    }

    /// Turns free block `i` (not indexed) into unmapped address space.
    pub fn set_unmapped(&mut self, i: u32) {
        self.bm(i).state = State::Unmapped;
    }
}
