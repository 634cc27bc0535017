//! The best any allocator could do on a trace: the peak of the live bytes (a lower bound no
//! allocator beats) and a real offline placement that knows every lifetime in advance.
//!
//! Sizes are rounded as PyTorch rounds them by default (to 512 bytes, at least 512);
//! a lifetime runs from the alloc op to the op that completes its free (a `Free` that is
//! not deferred, or the `CompleteFree` of a deferred one), or to the end of the trace. One
//! address space per device: streams, pools and segments are ignored, so the placement's
//! peak is the bound of placement alone.
//!
//! The placement sweeps the ops in order and puts each block in the smallest free gap
//! that holds it (ties: the lowest address), else at the top of the used range; freed
//! blocks merge with the gaps beside them and a gap that reaches the top lowers it. Its
//! peak (the highest address end ever used) is ≥ the live peak by construction (blocks
//! alive together are disjoint) and [`Placement::check`] verifies that no two blocks whose
//! lifetimes intersect overlap in address. `O(n log n)`: a million ops take well under a
//! second.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use crate::trace::{DeviceTrace, Op, OpKind};

/// PyTorch's `kMinBlockSize`: sizes are rounded up to a multiple of it, and to at least it.
pub const ROUND_BYTES: u64 = 512;

/// A request's size as PyTorch's default rounding makes it (`round_size` without
/// `roundup_power2_divisions`): a multiple of 512 bytes, at least 512.
#[must_use]
pub fn rounded_bytes(size_bytes: u64) -> u64 {
    size_bytes.max(1).div_ceil(ROUND_BYTES) * ROUND_BYTES
}

/// One allocation the program held, with its lifetime in op indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// The alloc op (an index into [`DeviceTrace::ops`]); also the first op of the lifetime.
    pub alloc_op: u32,
    /// The rounded size ([`rounded_bytes`]).
    pub size_bytes: u64,
    /// The op that completes its free: the block is free from this op on (the trace's op
    /// count when it is never freed).
    pub end_op: u32,
}

/// The allocations of `trace` the program held (recorded OOMs never were), in op order.
#[must_use]
pub fn lifetimes(trace: &DeviceTrace) -> Vec<Lifetime> {
    let n = u32::try_from(trace.ops.len()).unwrap_or(u32::MAX);
    // Exactly as many as there are (a vector grown by doubling held 128 MiB for the 74 of
    // the 1.12 GB snapshot's 4.8 M, and its old half beside it while it grew).
    let held = |op: &Op| {
        matches!(
            op.kind,
            OpKind::Alloc {
                recorded_oom: false,
                ..
            }
        )
    };
    let mut out: Vec<Lifetime> = Vec::with_capacity(trace.ops.iter().filter(|o| held(o)).count());
    // A free's allocation is found in `out` (in op order) by a search, not through a
    // table of every op's (4 bytes an op: 37 MiB on the 1.12 GB snapshot, made when the
    // browser's worker holds the most, above what it held: its memory is never given back).
    for (k, op) in trace.ops.iter().enumerate() {
        match op.kind {
            OpKind::Alloc {
                size_bytes,
                recorded_oom: false,
                ..
            } => {
                out.push(Lifetime {
                    alloc_op: u32::try_from(k).unwrap_or(u32::MAX),
                    size_bytes: rounded_bytes(size_bytes),
                    end_op: n,
                });
            }
            OpKind::Free {
                alloc,
                deferred: false,
            }
            | OpKind::CompleteFree { alloc } => {
                if let Ok(i) = out.binary_search_by_key(&alloc, |l| l.alloc_op)
                    && let Some(l) = out.get_mut(i)
                    && l.end_op == n
                {
                    l.end_op = u32::try_from(k).unwrap_or(u32::MAX);
                }
            }
            _ => {}
        }
    }
    out
}

/// The peak of the live bytes: the most rounded bytes alive at once (frees of an op
/// before its alloc: each op is one or the other).
#[must_use]
///
/// `lifetimes` in op order ([`lifetimes`]), each ending at or before op `ops`. Walked with
/// their ends in op order ([`Ends`]): what ends at or before an alloc is freed before it
/// counts (no per-op arrays: on the 1.12 GB snapshot two of 74 MiB each, in the browser's
/// worker whose memory is never given back).
pub fn live_peak_bytes(lifetimes: &[Lifetime], ops: usize) -> u64 {
    debug_assert!(lifetimes.iter().all(|l| l.end_op as usize <= ops));
    let mut ends = Ends::default();
    let (mut live, mut peak) = (0u64, 0u64);
    for (i, l) in lifetimes.iter().enumerate() {
        ends.through(l.alloc_op, |j| live -= lifetimes[j].size_bytes);
        live += l.size_bytes;
        peak = peak.max(live);
        ends.push(l, i);
    }
    peak
}

/// The ends of the lifetimes a sweep in op order has passed and not yet seen end, soonest
/// first (ties: in op order): only the ones alive are held. A vector of every lifetime's
/// end sorted was 8 bytes a lifetime (37 MiB on the 1.12 GB snapshot), made when the
/// browser's worker held the most, above what it held.
#[derive(Default)]
struct Ends(BinaryHeap<Reverse<(u32, u32)>>);

impl Ends {
    /// Lifetime `i`, `l`, has started.
    fn push(&mut self, l: &Lifetime, i: usize) {
        self.0
            .push(Reverse((l.end_op, u32::try_from(i).unwrap_or(u32::MAX))));
    }

    /// Calls `f` with each lifetime that ends at or before op `op`, in end order, and
    /// forgets it.
    fn through(&mut self, op: u32, mut f: impl FnMut(usize)) {
        while let Some(&Reverse((end, j))) = self.0.peek() {
            if end > op {
                break;
            }
            self.0.pop();
            f(j as usize);
        }
    }
}

/// The free address ranges below the top of a placement: best fit by (size, address).
#[derive(Debug, Default)]
struct Gaps {
    /// Start → length; never one that ends at `top` (the top is lowered instead).
    by_addr: BTreeMap<u64, u64>,
    /// (length, start) of every gap in `by_addr`.
    by_size: BTreeSet<(u64, u64)>,
    /// End of the used range.
    top: u64,
}

impl Gaps {
    fn take(&mut self, size: u64) -> u64 {
        if let Some(&(len, start)) = self.by_size.range((size, 0)..).next() {
            self.by_size.remove(&(len, start));
            self.by_addr.remove(&start);
            if len > size {
                self.insert(start + size, len - size);
            }
            return start;
        }
        let at = self.top;
        self.top += size;
        at
    }

    fn insert(&mut self, start: u64, len: u64) {
        self.by_addr.insert(start, len);
        self.by_size.insert((len, start));
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_addr.remove(&start);
        self.by_size.remove(&(len, start));
    }

    fn give_back(&mut self, mut start: u64, mut len: u64) {
        if let Some((&s, &l)) = self.by_addr.range(..start).next_back()
            && s + l == start
        {
            self.remove(s, l);
            start = s;
            len += l;
        }
        if let Some(&l) = self.by_addr.get(&(start + len)) {
            self.remove(start + len, l);
            len += l;
        }
        if start + len == self.top {
            self.top = start;
        } else {
            self.insert(start, len);
        }
    }
}

/// An offline placement of every allocation of a trace's device.
#[derive(Debug, Clone)]
pub struct Placement {
    /// In op order.
    pub lifetimes: Vec<Lifetime>,
    /// The address each lifetime got (its offset in the one address space).
    pub offsets_bytes: Vec<u64>,
    /// [`live_peak_bytes`] of the lifetimes.
    pub live_peak_bytes: u64,
    /// The highest address end the placement ever uses: the memory it needs.
    pub peak_bytes: u64,
}

/// Two blocks alive at the same time that share an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "offline placement: the blocks of alloc ops {first_op} and {second_op} are alive together and overlap at offset {offset_bytes}"
)]
pub struct OverlapError {
    pub first_op: u32,
    pub second_op: u32,
    pub offset_bytes: u64,
}

/// How many (block, block alive at the same time) visits the greedy-by-size placement may
/// make: beyond it (traces of a million ops with thousands alive at once) the sweep alone
/// places the trace, in `O(n log n)`.
pub const GREEDY_BUDGET_VISITS: u64 = 200_000_000;

/// Places every allocation of `trace` (see the module doc).
#[must_use]
pub fn place(trace: &DeviceTrace) -> Placement {
    let lifetimes = lifetimes(trace);
    let live_peak = live_peak_bytes(&lifetimes, trace.ops.len());
    let (mut offsets, mut peak) = place_sweep(&lifetimes);
    if overlap_pairs(&lifetimes) <= GREEDY_BUDGET_VISITS {
        let (o, p) = place_greedy_by_size(&lifetimes);
        if p < peak {
            (offsets, peak) = (o, p);
        }
    }
    Placement {
        lifetimes,
        offsets_bytes: offsets,
        live_peak_bytes: live_peak,
        peak_bytes: peak,
    }
}

/// The sweep: in op order, each block in the smallest gap that holds it (best fit).
fn place_sweep(lifetimes: &[Lifetime]) -> (Vec<u64>, u64) {
    let mut ends = Ends::default();
    let mut offsets = vec![0u64; lifetimes.len()];
    let mut gaps = Gaps::default();
    let mut peak = 0;
    for (i, l) in lifetimes.iter().enumerate() {
        ends.through(l.alloc_op, |j| {
            gaps.give_back(offsets[j], lifetimes[j].size_bytes);
        });
        offsets[i] = gaps.take(l.size_bytes);
        peak = peak.max(gaps.top);
        ends.push(l, i);
    }
    (offsets, peak)
}

/// The number of pairs of blocks alive at the same time: the work of the greedy placement.
fn overlap_pairs(lifetimes: &[Lifetime]) -> u64 {
    let mut ends = Ends::default();
    let (mut live, mut pairs) = (0u64, 0u64);
    for (i, l) in lifetimes.iter().enumerate() {
        ends.through(l.alloc_op, |_| live -= 1);
        pairs += live;
        live += 1;
        ends.push(l, i);
    }
    pairs
}

/// Greedy by size (largest first, then earliest): each block goes into the smallest gap
/// between the already placed blocks alive at the same time that holds it (ties: the
/// lowest address), else above them all.
fn place_greedy_by_size(lifetimes: &[Lifetime]) -> (Vec<u64>, u64) {
    const UNPLACED: u64 = u64::MAX;
    let n = lifetimes.len();
    // A max-segment tree of end ops over the lifetimes (in op order): the blocks before
    // `i` still alive at its start are those with a larger end than its start.
    let size = n.next_power_of_two().max(1);
    let mut max_end = vec![0u32; 2 * size];
    for (i, l) in lifetimes.iter().enumerate() {
        max_end[size + i] = l.end_op;
    }
    for k in (1..size).rev() {
        max_end[k] = max_end[2 * k].max(max_end[2 * k + 1]);
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(lifetimes[i].size_bytes), i));
    let mut offsets = vec![UNPLACED; n];
    let mut peak = 0;
    let mut near: Vec<(u64, u64)> = Vec::new();
    let mut stack: Vec<usize> = Vec::new();
    for &i in &order {
        let l = lifetimes[i];
        near.clear();
        // Blocks that start during `i`'s lifetime (after it, in op order).
        for (j, m) in lifetimes.iter().enumerate().skip(i + 1) {
            if m.alloc_op >= l.end_op {
                break;
            }
            if offsets[j] != UNPLACED {
                near.push((offsets[j], offsets[j] + m.size_bytes));
            }
        }
        // Blocks before `i` alive at its start: descend where the max end exceeds it.
        stack.clear();
        stack.push(1);
        while let Some(k) = stack.pop() {
            let (lo, hi) = {
                let depth = usize::BITS - 1 - k.leading_zeros();
                let width = size >> depth;
                let lo = (k - (1 << depth)) * width;
                (lo, lo + width)
            };
            if lo >= i || max_end[k] <= l.alloc_op {
                continue;
            }
            if hi - lo == 1 {
                if offsets[lo] != UNPLACED {
                    near.push((offsets[lo], offsets[lo] + lifetimes[lo].size_bytes));
                }
                continue;
            }
            stack.push(2 * k + 1);
            stack.push(2 * k);
        }
        near.sort_unstable();
        let (mut best, mut best_len, mut at) = (None, u64::MAX, 0u64);
        for &(s, e) in &near {
            if s > at && s - at >= l.size_bytes && s - at < best_len {
                best = Some(at);
                best_len = s - at;
            }
            at = at.max(e);
        }
        let off = best.unwrap_or(at);
        offsets[i] = off;
        peak = peak.max(off + l.size_bytes);
    }
    (offsets, peak)
}

impl Placement {
    /// Checks the placement from scratch: no two blocks whose lifetimes intersect overlap
    /// in address, and none ends above [`Placement::peak_bytes`].
    pub fn check(&self) -> Result<(), OverlapError> {
        let mut ends: Vec<(u32, usize)> = self
            .lifetimes
            .iter()
            .enumerate()
            .map(|(i, l)| (l.end_op, i))
            .collect();
        ends.sort_unstable();
        // Offset → lifetime index of the blocks alive now.
        let mut live: BTreeMap<u64, usize> = BTreeMap::new();
        let mut e = 0;
        for (i, l) in self.lifetimes.iter().enumerate() {
            while e < ends.len() && ends[e].0 <= l.alloc_op {
                let j = ends[e].1;
                if live.get(&self.offsets_bytes[j]) == Some(&j) {
                    live.remove(&self.offsets_bytes[j]);
                }
                e += 1;
            }
            let (start, end) = (self.offsets_bytes[i], self.offsets_bytes[i] + l.size_bytes);
            let clash = |j: usize| OverlapError {
                first_op: self.lifetimes[j].alloc_op,
                second_op: l.alloc_op,
                offset_bytes: start.max(self.offsets_bytes[j]),
            };
            if end > self.peak_bytes {
                return Err(clash(i));
            }
            if let Some((&s, &j)) = live.range(..=start).next_back()
                && s + self.lifetimes[j].size_bytes > start
            {
                return Err(clash(j));
            }
            if let Some((&s, &j)) = live.range(start..).next()
                && s < end
            {
                return Err(clash(j));
            }
            live.insert(start, i);
        }
        Ok(())
    }
}

/// The two bounds of a trace's device, as `compare` and `explain` report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BestPossible {
    /// The most rounded bytes alive at once: no allocator needs less.
    pub live_peak_bytes: u64,
    /// The peak of the offline placement ([`place`]): what knowing every lifetime in
    /// advance achieves.
    pub offline_peak_bytes: u64,
}

/// [`BestPossible`] of `trace`.
#[must_use]
pub fn best_possible(trace: &DeviceTrace) -> BestPossible {
    let p = place(trace);
    BestPossible {
        live_peak_bytes: p.live_peak_bytes,
        offline_peak_bytes: p.peak_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::StackId;
    use crate::trace::Op;

    fn op(kind: OpKind) -> Op {
        Op {
            kind,
            event_index: 0,
            recorded_addr: 0,
            stack: StackId::EMPTY,
            time_us: 0,
        }
    }

    fn alloc(size_bytes: u64) -> Op {
        op(OpKind::Alloc {
            size_bytes,
            stream: 0,
            pool: crate::trace::PoolIx::DEFAULT,
            recorded_oom: false,
            restored: false,
        })
    }

    fn free(alloc: u32) -> Op {
        op(OpKind::Free {
            alloc,
            deferred: false,
        })
    }

    /// The live peak is the most bytes alive after any op, as a walk over every op counts
    /// them (frees at an op before its alloc), on lifetimes of many shapes.
    #[test]
    fn the_live_peak_is_the_most_bytes_alive_after_any_op() {
        let mut seed = 7u64;
        let mut next = |m: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % m
        };
        for ops in [1usize, 2, 10, 300, 5_000] {
            // Each op an alloc or the free of an earlier live alloc; some never freed.
            let (mut lifetimes, mut live) = (Vec::<Lifetime>::new(), Vec::<usize>::new());
            for k in 0..ops {
                if !live.is_empty() && next(3) == 0 {
                    let i = live.swap_remove(next(live.len() as u64) as usize);
                    lifetimes[i].end_op = k as u32;
                } else {
                    live.push(lifetimes.len());
                    lifetimes.push(Lifetime {
                        alloc_op: k as u32,
                        size_bytes: 512 * (1 + next(1 << 12)),
                        end_op: ops as u32,
                    });
                }
            }
            let walked = (0..ops)
                .map(|k| {
                    lifetimes
                        .iter()
                        .filter(|l| l.alloc_op as usize <= k && k < l.end_op as usize)
                        .map(|l| l.size_bytes)
                        .sum::<u64>()
                })
                .max()
                .unwrap_or(0);
            assert_eq!(live_peak_bytes(&lifetimes, ops), walked, "{ops} ops");
        }
    }

    #[test]
    fn rounding_is_pytorchs_default() {
        assert_eq!(rounded_bytes(0), 512);
        assert_eq!(rounded_bytes(1), 512);
        assert_eq!(rounded_bytes(512), 512);
        assert_eq!(rounded_bytes(513), 1024);
    }

    #[test]
    fn a_freed_hole_is_reused_and_deferred_frees_wait_for_completion() {
        // a(1000) b(2048) c(512); free a; d(1024) fits a's hole; b deferred-freed,
        // completed only after e(2048) is placed: e cannot use b's range.
        let trace = DeviceTrace {
            ops: vec![
                alloc(1000),
                alloc(2048),
                alloc(512),
                free(0),
                alloc(1024),
                op(OpKind::Free {
                    alloc: 1,
                    deferred: true,
                }),
                alloc(2048),
                op(OpKind::CompleteFree { alloc: 1 }),
            ],
            ..DeviceTrace::default()
        };
        let p = place(&trace);
        p.check().unwrap();
        assert_eq!(p.offsets_bytes, vec![0, 1024, 3072, 0, 3584]);
        assert_eq!(p.lifetimes[1].end_op, 7);
        assert_eq!(p.live_peak_bytes, 1024 + 2048 + 512 + 2048);
        assert_eq!(p.peak_bytes, 3584 + 2048);
    }

    #[test]
    fn the_check_finds_an_overlap() {
        let trace = DeviceTrace {
            ops: vec![alloc(512), alloc(512)],
            ..DeviceTrace::default()
        };
        let mut p = place(&trace);
        p.check().unwrap();
        p.offsets_bytes[1] = 256;
        assert_eq!(
            p.check(),
            Err(OverlapError {
                first_op: 0,
                second_op: 1,
                offset_bytes: 256
            })
        );
    }
}
