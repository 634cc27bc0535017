//! `rmm-arena`: RAPIDS RMM's `arena_memory_resource` (after Lin et al.), a global arena
//! handing out superblocks to per-stream arenas, after `rapidsai/rmm:cpp/include/rmm/mr/
//! detail/arena.hpp` and `arena_memory_resource_impl.cpp` (peers.md §B.3).
//!
//! Facts it rests on:
//! - The global arena is one upstream allocation made up front, by default half the free
//!   device memory (aligned down to 256 bytes): reserved memory is constant.
//! - Sizes are aligned up to 256 bytes (size classes are off unless RMM is built with
//!   `RMM_ARENA_USE_SIZE_CLASSES`).
//! - Requests over 1 MiB (`superblock::minimum_size`) are served by the global arena
//!   directly: the first superblock (address order) with a free block that fits; an empty
//!   one at least 1 MiB bigger than needed is split, so a large allocation gets a superblock
//!   of its own size. Smaller requests go to the stream's arena: the first of its
//!   superblocks with a fitting block, else a new superblock from the global arena (1 MiB,
//!   split off an empty superblock, or a non-empty one as it is).
//! - Inside a superblock: address-ordered first fit, the allocation at the low end; freed
//!   blocks coalesce with contiguous free blocks of the same superblock.
//! - A superblock owned by the global arena that becomes empty merges with empty
//!   neighbours; a stream arena keeps its superblocks, empty or not, until a failure.
//! - On failure the resource "defragments": every stream arena returns all its superblocks
//!   to the global arena, and the request is tried once more.
//!
//! Each trace stream has its own arena (RMM's per-stream arenas; the per-thread arena of
//! the per-thread default stream does not arise in a PyTorch trace). Private pools make no
//! difference; `empty_cache` does nothing.
//!
//! Config keys: `arena_size_mb` (unset: half the device memory free at the first request).

use crate::models::common::policy::arena_accessors;
use std::collections::BTreeMap;

use super::AllocatorKind;
use super::common::{self, Arena, FreeKey, State, round_down, round_up};
use super::common::{ArenaPolicy, Block, Refusal};
use super::{AllocRequest, ModelEvent};
use crate::device::Device;
use crate::units::format_size;

/// `superblock::minimum_size`: 1 MiB.
pub const SUPERBLOCK_MIN_BYTES: u64 = 1 << 20;
/// `CUDA_ALLOCATION_ALIGNMENT`.
pub const ALIGNMENT_BYTES: u64 = 256;

/// One superblock: a range of the arena owned by the global arena or one stream's arena.
#[derive(Debug, Clone)]
struct Superblock {
    base: u64,
    size: u64,
    /// `None`: the global arena; `Some(s)`: stream `s`'s arena.
    owner: Option<u64>,
    live: bool,
    /// Σ free block sizes (the superblock is empty when this equals `size`).
    free_bytes: u64,
    /// The largest free block (what `fits` asks).
    max_free: u64,
    /// Number of free blocks.
    free_blocks: u32,
    /// In the global arena's set (a global superblock being handed out is briefly not).
    listed: bool,
    /// The first arena block of the superblock.
    first: u32,
    /// Address-order neighbours (superblocks tile the arena; `NIL` at the ends).
    prev: u32,
    next: u32,
}

/// The RMM arena resource of one device.
#[derive(Debug, Clone)]
pub struct RmmArenaModel {
    arena_bytes_cfg: Option<u64>,
    /// The blocks, keyed by address in the free index: a superblock's free blocks are the
    /// key range of its address range, and a block that grows or shrinks at its high end
    /// keeps its key.
    arena: Arena,
    sbs: Vec<Superblock>,
    free_sb_slots: Vec<u32>,
    /// The global arena's superblocks with a free block, as (base, superblock) sorted by
    /// base (the ones its first fit looks at; the other global superblocks are `listed`
    /// without an entry here). Exactly the listed superblocks with `max_free > 0`.
    global_avail: Vec<(u64, u32)>,
    /// Each stream arena's superblocks as (base, superblock) sorted by base.
    streams: BTreeMap<u64, Vec<(u64, u32)>>,
    /// Set at the first request: the upstream allocation failed.
    init_error: Option<String>,
    initialized: bool,
}

/// The free-index key of the free block at `addr`.
fn key(addr: u64) -> FreeKey {
    FreeKey::new(0, 0, addr)
}

/// Inserts (base, sb) into a list sorted by base (replacing an entry with that base).
fn sorted_insert(v: &mut Vec<(u64, u32)>, base: u64, sb: u32) {
    match v.binary_search_by_key(&base, |e| e.0) {
        Ok(p) => v[p].1 = sb,
        Err(p) => v.insert(p, (base, sb)),
    }
}

/// Removes the entry with `base` from a list sorted by base, if there is one.
fn sorted_remove(v: &mut Vec<(u64, u32)>, base: u64) {
    if let Ok(p) = v.binary_search_by_key(&base, |e| e.0) {
        v.remove(p);
    }
}

impl RmmArenaModel {
    /// Parses `arena_size_mb`.
    pub fn new(conf: &str) -> Result<RmmArenaModel, common::ConfigError> {
        let kv = common::parse_config(AllocatorKind::RmmArena, conf, &["arena_size_mb"])?;
        let mut arena_bytes_cfg = None;
        for (k, v) in kv {
            let b = common::parse_mib(AllocatorKind::RmmArena, k, v)?;
            if b < SUPERBLOCK_MIN_BYTES {
                return Err(common::ConfigError::Inconsistent {
                    model: AllocatorKind::RmmArena,
                    reason: "Arena size smaller than minimum superblock size.",
                });
            }
            arena_bytes_cfg = Some(b);
        }
        Ok(RmmArenaModel {
            arena_bytes_cfg,
            arena: Arena::new(),
            sbs: Vec::new(),
            free_sb_slots: Vec::new(),
            global_avail: Vec::new(),
            streams: BTreeMap::new(),
            init_error: None,
            initialized: false,
        })
    }

    fn new_sb(&mut self, sb: Superblock) -> u32 {
        if let Some(i) = self.free_sb_slots.pop() {
            self.sbs[i as usize] = sb;
            i
        } else {
            self.sbs.push(sb);
            (self.sbs.len() - 1) as u32
        }
    }

    fn drop_sb(&mut self, i: u32) {
        self.sbs[i as usize].live = false;
        self.free_sb_slots.push(i);
    }

    fn sb_empty(&self, i: u32) -> bool {
        let s = &self.sbs[i as usize];
        s.free_bytes == s.size
    }

    /// The free-index key range of superblock `sb`'s blocks.
    fn sb_keys(&self, sb: u32) -> (FreeKey, FreeKey) {
        let s = &self.sbs[sb as usize];
        (key(s.base), key(s.base + s.size))
    }

    /// Recomputes a superblock's largest free block.
    fn refresh(&mut self, sb: u32) {
        let (from, to) = self.sb_keys(sb);
        let m = self
            .arena
            .free_range(from, to)
            .map(|(_, i)| self.arena.b(i).size)
            .max()
            .unwrap_or(0);
        self.set_max_free(sb, m);
    }

    /// Sets a superblock's largest free block, keeping the global first-fit set in step
    /// (a listed superblock is in it exactly while its largest free block is not 0).
    fn set_max_free(&mut self, sb: u32, m: u64) {
        let s = &mut self.sbs[sb as usize];
        let old = s.max_free;
        s.max_free = m;
        if s.listed && (old == 0) != (m == 0) {
            let base = s.base;
            if m > 0 {
                sorted_insert(&mut self.global_avail, base, sb);
            } else {
                sorted_remove(&mut self.global_avail, base);
            }
        }
    }

    /// Puts superblock `sb` into the global arena's set.
    fn global_insert(&mut self, sb: u32) {
        let s = &mut self.sbs[sb as usize];
        s.owner = None;
        s.listed = true;
        if s.max_free > 0 {
            let base = s.base;
            sorted_insert(&mut self.global_avail, base, sb);
        }
    }

    /// Takes superblock `sb` (listed) out of the global arena's set.
    fn global_remove(&mut self, sb: u32) {
        let s = &mut self.sbs[sb as usize];
        s.listed = false;
        if s.max_free > 0 {
            let base = s.base;
            sorted_remove(&mut self.global_avail, base);
        }
    }

    fn start(&mut self, dev: &mut dyn Device, stream: u64, out: &mut Vec<ModelEvent>) {
        self.initialized = true;
        let size = self
            .arena_bytes_cfg
            .unwrap_or_else(|| round_down(dev.free_bytes() / 2, ALIGNMENT_BYTES));
        if size < SUPERBLOCK_MIN_BYTES {
            self.init_error = Some("Arena size smaller than minimum superblock size.".to_string());
            return;
        }
        match self.arena.dev_malloc(dev, size, stream, out) {
            Ok(addr) => {
                let b = self.arena.add_free_segment(addr, size, stream, 0);
                let sb = self.new_sb(Superblock {
                    base: addr,
                    size,
                    owner: None,
                    live: true,
                    free_bytes: size,
                    max_free: size,
                    free_blocks: 1,
                    listed: false,
                    first: b,
                    prev: common::NIL,
                    next: common::NIL,
                });
                self.arena.bm(b).owner = u64::from(sb);
                self.arena.insert_free(b, key(addr));
                self.global_insert(sb);
            }
            Err(_) => {
                self.init_error = Some(format!(
                    "the global arena of {} could not be allocated ({} free)",
                    format_size(size),
                    format_size(dev.free_bytes())
                ));
            }
        }
    }

    /// `superblock::first_fit`: the first free block (address order) that fits, split.
    fn sb_first_fit(&mut self, sb: u32, size: u64) -> Option<u32> {
        let s = &self.sbs[sb as usize];
        let i = if s.free_blocks == 1 && self.arena.b(s.first).indexed {
            // The only free block is the first one (a fresh or empty superblock).
            Some(s.first).filter(|&f| self.arena.b(f).size >= size)?
        } else {
            let (from, to) = self.sb_keys(sb);
            self.arena
                .free_range(from, to)
                .find(|&(_, i)| self.arena.b(i).size >= size)?
                .1
        };
        let taken = self.arena.b(i).size;
        if taken > size {
            // The remainder takes the block's place in the address-ordered index.
            let t = self.arena.split(i, size);
            let a = self.arena.b(t).addr;
            self.arena.transfer_index(i, taken, t, key(a));
        } else {
            self.arena.remove_free(i);
            self.sbs[sb as usize].free_blocks -= 1;
        }
        self.sbs[sb as usize].free_bytes -= size;
        // Only taking from the largest free block can lower the largest; with one free
        // block left the remainder is the largest.
        let s = &self.sbs[sb as usize];
        if taken == s.max_free {
            match s.free_blocks {
                0 => self.set_max_free(sb, 0),
                1 if taken > size => self.set_max_free(sb, taken - size),
                _ => self.refresh(sb),
            }
        }
        Some(i)
    }

    /// Merges a run of contiguous free blocks, listed from low to high address, into the
    /// first; every block but one (the one just freed) is in the free index. Keys are
    /// addresses, so the survivor keeps the first block's entry, or takes over its right
    /// neighbour's when the first is the unindexed one (nothing lies between the two): at
    /// most one index update besides the removal of the others. Returns the survivor.
    fn merge_run(&mut self, run: &[u32]) -> u32 {
        let head = run[0];
        let mut rest = &run[1..];
        if !self.arena.b(head).indexed {
            let addr = self.arena.b(head).addr;
            let Some((&n, more)) = rest.split_first() else {
                self.arena.insert_free(head, key(addr));
                return head;
            };
            let n_size = self.arena.b(n).size;
            self.arena.transfer_index(n, n_size, head, key(addr));
            self.arena.absorb_next_indexed(head);
            rest = more;
        }
        for &b in rest {
            if self.arena.b(b).indexed {
                self.arena.remove_free(b);
            }
            self.arena.absorb_next_indexed(head);
        }
        head
    }

    /// `global_arena::first_fit` and `superblock::first_fit` in the superblock it picks:
    /// the first global superblock that fits `size`, split when it is empty and big
    /// enough. Returns the superblock and the block allocated. With `stay` the superblock
    /// stays in the global arena, else it leaves the global set (for a stream arena).
    fn global_alloc(&mut self, size: u64, stay: bool) -> Option<(u32, Option<u32>)> {
        let pos = self
            .global_avail
            .iter()
            .position(|&(_, sb)| self.sbs[sb as usize].max_free >= size)?;
        let sb = self.global_avail[pos].1;
        let min = SUPERBLOCK_MIN_BYTES.max(size);
        if !(self.sb_empty(sb) && self.sbs[sb as usize].size >= min + SUPERBLOCK_MIN_BYTES) {
            // Taking the superblock out of the global set and putting it back after, as RMM
            // does, leaves the set as keeping it there does.
            if !stay {
                self.sbs[sb as usize].listed = false;
                self.global_avail.remove(pos);
            }
            return Some((sb, self.sb_first_fit(sb, size)));
        }
        let b = self.sbs[sb as usize].first;
        let (base, total, next) = {
            let s = &self.sbs[sb as usize];
            (s.base, s.size, s.next)
        };
        // The tail superblock's block takes the head's entry in the index, the tail
        // superblock the head's entry in the global set (nothing lies between).
        let t = self.arena.split(b, min);
        self.arena.transfer_index(b, total, t, key(base + min));
        let tail = self.new_sb(Superblock {
            base: base + min,
            size: total - min,
            owner: None,
            live: true,
            free_bytes: total - min,
            max_free: total - min,
            free_blocks: 1,
            listed: true,
            first: t,
            prev: sb,
            next,
        });
        if next != common::NIL {
            self.sbs[next as usize].prev = tail;
        }
        self.arena.bm(t).owner = u64::from(tail);
        self.global_avail[pos] = (base + min, tail);
        // The allocation at the low end of the head; the rest of the head stays free.
        let left = min - size;
        if left > 0 {
            let r = self.arena.split(b, size);
            self.arena.insert_free(r, key(base + size));
        }
        let s = &mut self.sbs[sb as usize];
        s.size = min;
        s.free_bytes = left;
        s.max_free = left;
        s.free_blocks = u32::from(left > 0);
        s.next = tail;
        s.listed = stay;
        if stay && left > 0 {
            sorted_insert(&mut self.global_avail, base, sb);
        }
        Some((sb, Some(b)))
    }

    /// `global_arena::coalesce`: a superblock joins the global arena, merging with empty
    /// contiguous neighbours when it is empty itself.
    fn global_coalesce(&mut self, sb: u32) {
        self.sbs[sb as usize].owner = None;
        let mut cur = sb;
        if self.sb_empty(cur) {
            let p = self.sbs[cur as usize].prev;
            if p != common::NIL && self.sbs[p as usize].listed && self.sb_empty(p) {
                self.global_remove(p);
                self.merge_sbs(p, cur);
                cur = p;
            }
            let n = self.sbs[cur as usize].next;
            if n != common::NIL && self.sbs[n as usize].listed && self.sb_empty(n) {
                self.global_remove(n);
                self.merge_sbs(cur, n);
            }
        }
        self.global_insert(cur);
    }

    /// Merges empty superblock `n` into the empty superblock `p` just before it.
    fn merge_sbs(&mut self, p: u32, n: u32) {
        let (pb, nb) = (self.sbs[p as usize].first, self.sbs[n as usize].first);
        self.arena.remove_free(nb);
        self.arena.absorb_next_indexed(pb);
        let (add, after) = (self.sbs[n as usize].size, self.sbs[n as usize].next);
        if after != common::NIL {
            self.sbs[after as usize].prev = p;
        }
        let s = &mut self.sbs[p as usize];
        s.size += add;
        s.free_bytes = s.size;
        s.max_free = s.size;
        s.next = after;
        self.drop_sb(n);
    }

    /// One attempt to allocate `size` bytes for `stream`.
    fn try_allocate(&mut self, size: u64, stream: u64) -> Option<u32> {
        if size > SUPERBLOCK_MIN_BYTES {
            return self.global_alloc(size, true)?.1;
        }
        let found = self.streams.get(&stream).and_then(|v| {
            v.iter()
                .map(|&(_, sb)| sb)
                .find(|&sb| self.sbs[sb as usize].max_free >= size)
        });
        if let Some(sb) = found {
            return self.sb_first_fit(sb, size);
        }
        let (sb, blk) = self.global_alloc(size, false)?;
        self.sbs[sb as usize].owner = Some(stream);
        let b = self.sbs[sb as usize].base;
        sorted_insert(self.streams.entry(stream).or_default(), b, sb);
        blk
    }

    /// `defragment`: every stream arena returns all its superblocks to the global arena.
    fn defragment(&mut self) {
        let streams = std::mem::take(&mut self.streams);
        for (_, sbs) in streams {
            for (_, sb) in sbs {
                self.global_coalesce(sb);
            }
        }
    }
}

impl ArenaPolicy for RmmArenaModel {
    const KIND: AllocatorKind = AllocatorKind::RmmArena;

    arena_accessors!();

    fn canonical_config(&self) -> String {
        self.arena_bytes_cfg
            .map(|b| format!("arena_size_mb:{}", common::fmt_mib(b)))
            .unwrap_or_default()
    }

    #[inline]
    fn find(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, Refusal> {
        let stream = req.stream;
        if !self.initialized {
            self.start(dev, stream, out);
        }
        let size = round_up(req.size_bytes.max(1), ALIGNMENT_BYTES);
        let mut found = None;
        if self.init_error.is_none() {
            found = self.try_allocate(size, stream);
            if found.is_none() {
                self.defragment();
                found = self.try_allocate(size, stream);
            }
        }
        found.ok_or_else(|| {
            let reason = match &self.init_error {
                Some(e) => e.clone(),
                None => format!(
                    "Maximum pool size exceeded (failed to allocate {}): No room in arena.",
                    format_size(size)
                ),
            };
            Refusal::new(size, size, reason)
        })
    }

    /// `superblock::coalesce` of freed block `i`, and `global_arena::coalesce` when that
    /// empties a global superblock (it merges with empty global neighbours).
    fn put_back(&mut self, _dev: &mut dyn Device, i: u32, _out: &mut Vec<ModelEvent>) {
        let sb = self.arena.b(i).owner as u32;
        let owner = u64::from(sb);
        let (size, before, after) = {
            let b = self.arena.b(i);
            (b.size, b.prev, b.next)
        };
        let mergeable =
            |x: u32| x != common::NIL && self.arena.b(x).indexed && self.arena.b(x).owner == owner;
        let (merge_before, merge_after) = (mergeable(before), mergeable(after));
        let s = &self.sbs[sb as usize];
        let mut run = [common::NIL; 5];
        let mut n = 0;
        let mut push = |b: u32| {
            run[n] = b;
            n += 1;
        };
        if !(s.listed && s.free_bytes + size == s.size) {
            if merge_before {
                push(before);
            }
            push(i);
            if merge_after {
                push(after);
            }
            let s = &mut self.sbs[sb as usize];
            s.free_blocks = s.free_blocks + 1 - u32::from(merge_before) - u32::from(merge_after);
            s.free_bytes += size;
            let m = self.merge_run(&run[..n]);
            // A merge only grows the largest free block.
            let merged = self.arena.b(m).size;
            if merged > self.sbs[sb as usize].max_free {
                self.set_max_free(sb, merged);
            }
            return;
        }
        // The last allocation of a global superblock: it becomes one free block and merges
        // with the empty global superblocks on either side (the other blocks of an emptying
        // superblock are free and merged already, so they are `before` and `after`).
        let (p, nx) = (s.prev, s.next);
        let empty_global =
            |x: u32| x != common::NIL && self.sbs[x as usize].listed && self.sb_empty(x);
        let (with_prev, with_next) = (empty_global(p), empty_global(nx));
        if with_prev {
            push(self.sbs[p as usize].first);
        }
        if merge_before {
            push(before);
        }
        push(i);
        if merge_after {
            push(after);
        }
        if with_next {
            push(self.sbs[nx as usize].first);
        }
        self.merge_run(&run[..n]);
        // The first-fit set: the survivor keeps its entry or takes the next one's (nothing
        // lies between), the others leave it.
        let (base, had_entry) = {
            let s = &self.sbs[sb as usize];
            (s.base, s.max_free > 0)
        };
        let avail = &mut self.global_avail;
        if with_prev && had_entry {
            sorted_remove(avail, base);
        }
        if with_next {
            let nb = self.sbs[nx as usize].base;
            let at = avail.binary_search_by_key(&nb, |e| e.0);
            match at {
                Ok(p) if !with_prev && !had_entry => avail[p] = (base, sb),
                Ok(p) => {
                    avail.remove(p);
                }
                Err(_) if !with_prev && !had_entry => sorted_insert(avail, base, sb),
                Err(_) => {}
            }
        } else if !with_prev && !had_entry {
            sorted_insert(avail, base, sb);
        }
        let cur = if with_prev { p } else { sb };
        let mut total = self.sbs[sb as usize].size;
        let mut end = nx;
        if with_prev {
            total += self.sbs[p as usize].size;
            self.drop_sb(sb);
        }
        if with_next {
            total += self.sbs[nx as usize].size;
            end = self.sbs[nx as usize].next;
            self.drop_sb(nx);
        }
        if end != common::NIL {
            self.sbs[end as usize].prev = cur;
        }
        let s = &mut self.sbs[cur as usize];
        s.size = total;
        s.free_bytes = total;
        s.max_free = total;
        s.free_blocks = 1;
        s.next = end;
        s.owner = None;
        s.listed = true;
    }

    fn adjacent_free_ok(&self, a: &Block, b: &Block) -> bool {
        a.owner != b.owner
    }

    fn check_policy(&self) -> Result<(), String> {
        let Some((seg, segment)) = self.arena.segments().next() else {
            return if self.sbs.iter().any(|s| s.live) {
                Err("superblocks without an arena".to_string())
            } else {
                Ok(())
            };
        };
        let mut live: Vec<(u64, u32)> = self
            .sbs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live)
            .map(|(i, s)| (s.base, i as u32))
            .collect();
        live.sort_unstable();
        let mut at = segment.base;
        for &(base, sb) in &live {
            let s = &self.sbs[sb as usize];
            if base != at {
                return Err(format!(
                    "superblock at {base:#x} does not follow the previous one (expected {at:#x})"
                ));
            }
            if s.size < SUPERBLOCK_MIN_BYTES {
                return Err(format!("superblock at {base:#x} is smaller than 1 MiB"));
            }
            at += s.size;
            let listed = match s.owner {
                None => s.listed,
                Some(st) => {
                    !s.listed
                        && self
                            .streams
                            .get(&st)
                            .is_some_and(|v| v.binary_search(&(base, sb)).is_ok() && v.is_sorted())
                }
            };
            if !listed {
                return Err(format!("superblock at {base:#x} is not in its owner's set"));
            }
        }
        if at != segment.base + segment.size {
            return Err("superblocks do not tile the arena".to_string());
        }
        let in_global = live
            .iter()
            .filter(|&&(_, sb)| self.sbs[sb as usize].listed)
            .count();
        let listed = in_global + self.streams.values().map(Vec::len).sum::<usize>();
        for w in live.windows(2) {
            let (a, b) = (w[0].1, w[1].1);
            if self.sbs[a as usize].next != b || self.sbs[b as usize].prev != a {
                return Err(format!("superblock links at {:#x} are broken", w[1].0));
            }
        }
        if let (Some(f), Some(l)) = (live.first(), live.last())
            && (self.sbs[f.1 as usize].prev != common::NIL
                || self.sbs[l.1 as usize].next != common::NIL)
        {
            return Err("the superblock list does not end at the arena's ends".to_string());
        }
        for &(base, sb) in &live {
            if self.arena.b(self.sbs[sb as usize].first).addr != base {
                return Err(format!(
                    "superblock at {base:#x} names the wrong first block"
                ));
            }
        }
        if listed != live.len() {
            return Err(format!("{listed} superblocks listed, {} live", live.len()));
        }
        let mut free = vec![0u64; self.sbs.len()];
        let mut max = vec![0u64; self.sbs.len()];
        let mut count = vec![0u32; self.sbs.len()];
        for b in self.arena.seg_blocks(seg) {
            let blk = self.arena.b(b);
            let sb = blk.owner as usize;
            let Some(s) = self.sbs.get(sb).filter(|s| s.live) else {
                return Err(format!(
                    "block at {:#x} belongs to no live superblock",
                    blk.addr
                ));
            };
            if blk.addr < s.base || blk.addr + blk.size > s.base + s.size {
                return Err(format!(
                    "block at {:#x} crosses the edge of its superblock",
                    blk.addr
                ));
            }
            if blk.state == State::Free {
                if blk.key != key(blk.addr) {
                    return Err(format!(
                        "free block at {:#x} is not keyed by its address",
                        blk.addr
                    ));
                }
                free[sb] += blk.size;
                max[sb] = max[sb].max(blk.size);
                count[sb] += 1;
            }
        }
        for &(base, sb) in &live {
            let s = &self.sbs[sb as usize];
            if s.free_bytes != free[sb as usize]
                || s.max_free != max[sb as usize]
                || s.free_blocks != count[sb as usize]
            {
                return Err(format!(
                    "superblock at {base:#x}: free bytes or largest free block miscounted"
                ));
            }
        }
        let avail: Vec<(u64, u32)> = live
            .iter()
            .filter(|&&(_, sb)| self.sbs[sb as usize].listed && self.sbs[sb as usize].max_free > 0)
            .copied()
            .collect();
        if avail != self.global_avail {
            return Err("the set of global superblocks with free space is stale".to_string());
        }
        let mut prev: Option<u32> = None;
        for sb in live
            .iter()
            .map(|&(_, sb)| sb)
            .filter(|&sb| self.sbs[sb as usize].listed)
        {
            if let Some(p) = prev {
                let ps = &self.sbs[p as usize];
                if ps.base + ps.size == self.sbs[sb as usize].base
                    && self.sb_empty(p)
                    && self.sb_empty(sb)
                {
                    return Err(format!(
                        "empty global superblocks at {:#x} and {:#x} should have merged",
                        ps.base, self.sbs[sb as usize].base
                    ));
                }
            }
            prev = Some(sb);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::Allocator;
    use crate::models::common::testing::Run;

    const MIB: u64 = 1 << 20;

    impl Run<RmmArenaModel> {
        fn with(conf: &str, cap: Option<u64>) -> Self {
            Run::new(RmmArenaModel::new(conf).unwrap(), cap)
        }
    }

    #[test]
    fn the_arena_is_half_the_free_memory_up_front() {
        let mut r = Run::with("", Some(1024 * MIB));
        r.alloc_on(1000, 0).unwrap();
        assert_eq!(r.m.stats().reserved_bytes, 512 * MIB);
        assert_eq!(r.m.stats().allocated_bytes, 1024);
    }

    #[test]
    fn small_requests_share_a_stream_superblock_large_ones_get_their_own() {
        let mut r = Run::with("arena_size_mb:64", None);
        let a = r.alloc_on(1000, 1).unwrap();
        let b = r.alloc_on(1000, 1).unwrap();
        assert_eq!(b, a + 1024, "first fit inside stream 1's 1 MiB superblock");
        let c = r.alloc_on(1000, 2).unwrap();
        assert_eq!(c, a + MIB, "stream 2 gets the next superblock");
        let big = r.alloc_on(3 * MIB, 1).unwrap();
        assert_eq!(
            big,
            a + 2 * MIB,
            "served by the global arena, split to its size"
        );
        r.free(big);
        // Back in the global arena, merged with the empty tail: one 62 MiB free block.
        assert_eq!(r.m.stats().largest_free_bytes, 62 * MIB);
        r.free(a);
        r.free(b);
        // Stream 1 keeps its empty superblock.
        assert_eq!(r.m.stats().largest_free_bytes, 62 * MIB);
        assert_eq!(r.m.stats().free_holes, 3);
    }

    #[test]
    fn a_failure_defragments_the_stream_arenas_first() {
        let mut r = Run::with("arena_size_mb:4", None);
        let small: Vec<u64> = (0..4)
            .map(|s| r.alloc_on(1000, s))
            .collect::<Result<_, _>>()
            .unwrap();
        // Four streams hold the four 1 MiB superblocks.
        for a in small {
            r.free(a);
        }
        // A 3 MiB request fits only after the stream arenas return their (now empty)
        // superblocks and they merge.
        r.alloc_on(3 * MIB, 9).unwrap();
        assert!(
            r.alloc_on(2 * MIB, 9)
                .unwrap_err()
                .reason
                .contains("No room in arena")
        );
    }
}
