//! The stacked-allocation view's geometry: every live allocation as a band whose bottom
//! is the sum of the allocations made before it and still alive, so the top of the stack
//! is the live requested bytes. When an allocation ends, everything above it slides down;
//! a band is cut into a new piece only when it has slid by at least `epsilon` bytes
//! (1/4096 of the peak), which bounds the pieces without a visible difference.

use super::wire::{BandPiece, Bands, NO_OP, OpsTable, op_kind};

/// Pieces beyond which `epsilon` doubles (memory and GPU upload stay bounded).
pub const MAX_PIECES: usize = 6_000_000;

struct Live {
    alloc: u32,
    size: u64,
    /// True bottom: sum of the sizes below.
    y: u64,
    /// Bottom of the piece being drawn, and where it started.
    drawn_y: u64,
    start: u32,
}

/// Pieces an attempt keeps while it cuts (8 MiB of them); past them it only counts, and the
/// pieces are cut again into a vector of exactly their number. A big trace's attempts that
/// overflow [`MAX_PIECES`] so never hold their pieces, nor does a kept vector grow by
/// doubling: in wasm, whose memory never shrinks, that growth was the worker's high-water
/// mark (on the 1 M-event trace, 448 MiB for 4.3 M pieces of 32 bytes).
const KEPT_WHILE_COUNTING: usize = 1 << 18;

/// Builds the bands of `ops` (allocations end at their `end` op).
#[must_use]
pub fn build(ops: &OpsTable) -> Bands {
    let peak = peak_by_links(ops);
    let mut epsilon = (peak / 4096).max(1);
    loop {
        match cut(ops, epsilon, MAX_PIECES, KEPT_WHILE_COUNTING, Vec::new()) {
            None => epsilon *= 2,
            Some(cut_pieces) => {
                let mut pieces = match cut_pieces {
                    Cut::Kept(pieces) => pieces,
                    Cut::Counted(count) => {
                        match cut(ops, epsilon, count, count, Vec::with_capacity(count)) {
                            Some(Cut::Kept(pieces)) => pieces,
                            _ => unreachable!("the same cut twice gives the same pieces"),
                        }
                    }
                };
                sort_by_area(&mut pieces, ops);
                return Bands {
                    pieces,
                    peak_bytes: peak,
                    epsilon_bytes: epsilon,
                };
            }
        }
    }
}

/// Live requested bytes after each op: the top of the stack of live allocations (an
/// allocation is live from its alloc op up to, not including, its end op). This and
/// [`peak_live_bytes`] sum a change per op: the definition the tests hold the app's sums
/// from the ops' links to ([`each_live_bytes_by_links`]), kept apart from them.
#[cfg(test)]
#[must_use]
pub fn live_bytes_per_op(ops: &OpsTable) -> Vec<u64> {
    let mut live = Vec::with_capacity(ops.len());
    each_live_bytes(ops, |b| live.push(b));
    live
}

/// The largest sum of live requested bytes after any op.
#[cfg(test)]
#[must_use]
pub fn peak_live_bytes(ops: &OpsTable) -> u64 {
    let mut peak = 0;
    each_live_bytes(ops, |b| peak = peak.max(b));
    peak
}

/// The largest sum of live requested bytes after any op, from the ops' links
/// ([`each_live_bytes_by_links`]).
pub(crate) fn peak_by_links(ops: &OpsTable) -> u64 {
    let mut peak = 0;
    each_live_bytes_by_links(ops, |b| peak = peak.max(b));
    peak
}

/// Calls `f` with the live requested bytes after each op, in order (each clamped to
/// `0..=u64::MAX`), found from the ops' links as [`cut`] finds the allocations that end,
/// not from a change per op: nothing held but the running sum. The bands are stacked,
/// and the stacked view's top drawn, when the browser's worker and page hold the most; the
/// 8 bytes an op of the changes (74 MiB on the 1.12 GB snapshot) were made above all they
/// held, and what came next could not go where they had been (wasm memory is never given
/// back).
pub(crate) fn each_live_bytes_by_links(ops: &OpsTable, mut f: impl FnMut(u64)) {
    let mut live = 0i128;
    for k in 0..ops.len() {
        if ops.is_alloc(k) {
            live += i128::from(ops.size_bytes(k));
        }
        let alloc = ops.link[k];
        if matches!(ops.kind[k], op_kind::FREE | op_kind::COMPLETE_FREE)
            && alloc != NO_OP
            && ops.end(alloc as usize) == k as u32
            && ops.is_alloc(alloc as usize)
        {
            live -= i128::from(ops.size_bytes(alloc as usize));
        }
        f(u64::try_from(live.max(0)).unwrap_or(u64::MAX));
    }
}

/// Calls `f` with the live requested bytes after each op, in order, from the change at
/// each op (+size at the alloc op, −size at the end op): 8 bytes an op while it runs,
/// none kept. A change past `i64` (tens of thousands of the largest requests ending at
/// one op, which no recording has) is summed in `i128` instead, 16 bytes an op.
#[cfg(test)]
pub fn each_live_bytes(ops: &OpsTable, mut f: impl FnMut(u64)) {
    match deltas::<i64>(ops) {
        Some(delta) => sum_deltas(&delta, &mut f),
        None => sum_deltas(&deltas::<i128>(ops).unwrap_or_default(), &mut f),
    }
}

/// The change of live requested bytes at each op, or `None` if one does not fit `T`.
#[cfg(test)]
fn deltas<T>(ops: &OpsTable) -> Option<Vec<T>>
where
    T: Copy + Default + TryFrom<u64> + num_add::CheckedAddSub,
{
    let n = ops.len();
    let mut delta = vec![T::default(); n];
    let each = ops.kind.iter().zip(ops.sizes()).zip(ops.ends());
    for (k, ((&kind, size), end)) in each.enumerate() {
        if kind == op_kind::ALLOC {
            let size = T::try_from(size).ok()?;
            delta[k] = delta[k].checked_add(size)?;
            let end = end as usize;
            if end != NO_OP as usize && end < n {
                delta[end] = delta[end].checked_sub(size)?;
            }
        }
    }
    Some(delta)
}

/// Checked `+` and `-` of the two delta types.
#[cfg(test)]
mod num_add {
    pub trait CheckedAddSub: Sized {
        fn checked_add(self, x: Self) -> Option<Self>;
        fn checked_sub(self, x: Self) -> Option<Self>;
    }
    impl CheckedAddSub for i64 {
        fn checked_add(self, x: i64) -> Option<i64> {
            i64::checked_add(self, x)
        }
        fn checked_sub(self, x: i64) -> Option<i64> {
            i64::checked_sub(self, x)
        }
    }
    impl CheckedAddSub for i128 {
        fn checked_add(self, x: i128) -> Option<i128> {
            i128::checked_add(self, x)
        }
        fn checked_sub(self, x: i128) -> Option<i128> {
            i128::checked_sub(self, x)
        }
    }
}

/// The running sum of `delta`, each clamped to `0..=u64::MAX`, passed to `f`.
#[cfg(test)]
fn sum_deltas<T: Copy + Into<i128>>(delta: &[T], f: &mut impl FnMut(u64)) {
    let mut live = 0i128;
    for &d in delta {
        live += d.into();
        f(u64::try_from(live.max(0)).unwrap_or(u64::MAX));
    }
}

/// What an attempt gave: its pieces, or only their number (more than it keeps).
enum Cut {
    Kept(Vec<BandPiece>),
    Counted(usize),
}

/// The pieces sliding by `epsilon` cuts, in the order they are cut: kept in `kept` while
/// there are at most `keep` of them, then only counted; `None` past `max_pieces`.
fn cut(
    ops: &OpsTable,
    epsilon: u64,
    max_pieces: usize,
    keep: usize,
    kept: Vec<BandPiece>,
) -> Option<Cut> {
    let n = ops.len() as u32;
    let mut live: Vec<Live> = Vec::new();
    let mut out = Pieces {
        kept: Some(kept),
        keep,
        count: 0,
    };
    let mut top = 0u64;
    for k in 0..n {
        let ku = k as usize;
        let size = ops.size_bytes(ku);
        if ops.is_alloc(ku) && size > 0 {
            live.push(Live {
                alloc: k,
                size,
                y: top,
                drawn_y: top,
                start: k,
            });
            top += size;
        }
        // Sample k (the state after op k) is drawn over x in k..k + 1: an allocation that
        // ends at op k is drawn up to x = k. An allocation ends at its free or at the
        // completion of its deferred free, each linked to it: no list of ends is needed.
        let alloc = ops.link[ku];
        let ends_here = matches!(ops.kind[ku], op_kind::FREE | op_kind::COMPLETE_FREE)
            && alloc != NO_OP
            && ops.end(alloc as usize) == k;
        if ends_here {
            let Ok(i) = live.binary_search_by_key(&alloc, |l| l.alloc) else {
                continue;
            };
            let gone = live.remove(i);
            out.push(gone.start, k, gone.drawn_y, gone.size, gone.alloc);
            top -= gone.size;
            for l in &mut live[i..] {
                l.y -= gone.size;
                if l.drawn_y - l.y >= epsilon {
                    out.push(l.start, k, l.drawn_y, l.size, l.alloc);
                    l.start = k;
                    l.drawn_y = l.y;
                }
            }
            if out.count > max_pieces {
                return None;
            }
        }
    }
    for l in live {
        out.push(l.start, n, l.drawn_y, l.size, l.alloc);
    }
    if out.count > max_pieces {
        return None;
    }
    Some(match out.kept {
        Some(pieces) => Cut::Kept(pieces),
        None => Cut::Counted(out.count),
    })
}

/// Largest area first; ties (none between two pieces: an allocation's pieces start at
/// different ops) by allocation and start.
fn sort_by_area(pieces: &mut [BandPiece], ops: &OpsTable) {
    pieces.sort_unstable_by(|a, b| {
        area(b, ops)
            .total_cmp(&area(a, ops))
            .then(a.alloc.cmp(&b.alloc))
            .then(a.x0.cmp(&b.x0))
    });
}

/// The pieces an attempt has cut: kept up to `keep`, counted always.
struct Pieces {
    kept: Option<Vec<BandPiece>>,
    keep: usize,
    count: usize,
}

impl Pieces {
    fn push(&mut self, x0: u32, x1: u32, y0: u64, h: u64, alloc: u32) {
        if x1 <= x0 || h == 0 {
            return;
        }
        self.count += 1;
        if self.count > self.keep {
            self.kept = None;
        }
        if let Some(kept) = &mut self.kept {
            kept.push(BandPiece::new(x0, x1, y0, alloc));
        }
    }
}

/// Area of a piece in ops × bytes (the level-of-detail order).
#[must_use]
pub fn area(p: &BandPiece, ops: &OpsTable) -> f64 {
    f64::from(p.x1 - p.x0) * p.height_bytes(ops) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ops from a tiny script: `a(size)` allocates, `f(i)` frees the i-th alloc op.
    fn ops(script: &[(char, u64)]) -> OpsTable {
        OpsTable::from_script(script)
    }

    /// The stack height at op k from the pieces: every live byte covered exactly once.
    fn covered(t: &OpsTable, b: &Bands, k: u32) -> u64 {
        b.pieces
            .iter()
            .filter(|p| p.x0 <= k && k < p.x1)
            .map(|p| p.height_bytes(t))
            .sum()
    }

    #[test]
    fn a_freed_allocation_lets_the_ones_above_slide_down() {
        // 100 at the bottom, 50 above; free the 100: the 50 slides to 0.
        let t = ops(&[('a', 100), ('a', 50), ('f', 0), ('a', 10)]);
        let b = build(&t);
        assert_eq!(b.peak_bytes, 150);
        let of = |alloc: u32| {
            let mut v: Vec<_> = b
                .pieces
                .iter()
                .filter(|p| p.alloc == alloc)
                .map(|p| (p.x0, p.x1, p.y0_bytes()))
                .collect();
            v.sort_unstable();
            v
        };
        assert_eq!(of(0), vec![(0, 2, 0)]);
        assert_eq!(of(1), vec![(1, 2, 100), (2, 4, 0)]);
        assert_eq!(of(3), vec![(3, 4, 50)]);
        assert_eq!(covered(&t, &b, 1), 150);
        assert_eq!(covered(&t, &b, 2), 50);
        assert_eq!(covered(&t, &b, 3), 60);
    }

    #[test]
    fn pieces_come_largest_area_first() {
        let t = ops(&[('a', 10), ('a', 1000), ('f', 0), ('a', 5)]);
        let b = build(&t);
        assert!(
            b.pieces
                .windows(2)
                .all(|w| area(&w[0], &t) >= area(&w[1], &t))
        );
        assert_eq!(b.pieces[0].alloc, 1);
    }

    /// A trace whose pieces outnumber what an attempt keeps: cut again into a vector of
    /// exactly their number, they are the pieces a kept attempt gives; past a maximum the
    /// attempt gives up.
    #[test]
    fn counted_pieces_are_cut_again_exactly() {
        let mut script = Vec::new();
        for i in 0..300u64 {
            script.push(('a', 1 + (i * 7919) % 1000));
            if i % 3 == 2 {
                // Free an older allocation: those above it slide down.
                let alloc = script
                    .iter()
                    .take(script.len() / 2)
                    .position(|&(c, _)| c == 'a');
                if let Some(a) = alloc.filter(|_| i % 2 == 0) {
                    script.push(('f', a as u64));
                }
            }
        }
        // Each alloc freed at most once.
        let mut freed = std::collections::BTreeSet::new();
        script.retain(|&(c, v)| c == 'a' || freed.insert(v));
        let t = ops(&script);
        let Some(Cut::Kept(all)) = cut(&t, 1, usize::MAX, usize::MAX, Vec::new()) else {
            panic!("kept")
        };
        assert!(all.len() > 300);
        let Some(Cut::Counted(count)) = cut(&t, 1, usize::MAX, 10, Vec::new()) else {
            panic!("counted")
        };
        assert_eq!(count, all.len());
        let Some(Cut::Kept(again)) = cut(&t, 1, count, count, Vec::with_capacity(count)) else {
            panic!("kept again")
        };
        assert_eq!(again, all);
        assert_eq!(again.capacity(), count);
        assert!(cut(&t, 1, count - 1, 10, Vec::new()).is_none());
    }

    #[test]
    fn small_slides_are_drawn_late_but_every_live_byte_is_drawn() {
        // A huge allocation above a tiny one: freeing the tiny one moves it by less than
        // epsilon, so no new piece.
        let t = ops(&[('a', 1), ('a', 1 << 30), ('f', 0)]);
        let b = build(&t);
        assert_eq!(b.pieces.iter().filter(|p| p.alloc == 1).count(), 1);
        assert_eq!(covered(&t, &b, 1), (1 << 30) + 1);
        assert_eq!(covered(&t, &b, 2), 1 << 30);
    }

    /// Live bytes by their definition: the sizes of the allocs live after op `k`.
    fn live_by_definition(t: &OpsTable, k: usize) -> u64 {
        let live = (0..=k)
            .filter(|&a| t.is_alloc(a) && (t.end(a) == NO_OP || t.end(a) as usize > k))
            .map(|a| u128::from(t.size_bytes(a)))
            .sum::<u128>();
        u64::try_from(live).unwrap_or(u64::MAX)
    }

    #[test]
    fn live_bytes_are_the_sizes_of_the_live_allocations_even_past_64_bits() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // Ordinary sizes (the i64 sums), then requests so large their sum passes 2^63
        // and 2^64 (summed in i128, clamped to u64::MAX), then freed again.
        let mut script = Vec::new();
        for (n, bits) in [(300, 30), (6, 63), (40, 20)] {
            for _ in 0..n {
                let allocs: Vec<usize> = (0..script.len())
                    .filter(|&i| {
                        let (c, _) = script[i];
                        c == 'a' && !script.iter().any(|&(c2, v)| c2 == 'f' && v == i as u64)
                    })
                    .collect();
                if next() % 3 == 0 && !allocs.is_empty() {
                    let i = allocs[(next() as usize) % allocs.len()];
                    script.push(('f', i as u64));
                } else {
                    script.push(('a', (1u64 << (bits - 1)) + next() % (1u64 << (bits - 1))));
                }
            }
            if bits == 63 {
                // One request past i64 itself.
                script.push(('a', u64::MAX - 5));
            }
        }
        let t = ops(&script);
        // The pieces' order is the one order: no two share an allocation and a start.
        let b = build(&ops(&script[..300]));
        let mut keys: Vec<(u32, u32)> = b.pieces.iter().map(|p| (p.alloc, p.x0)).collect();
        keys.sort_unstable();
        assert!(b.pieces.len() > 100);
        assert!(keys.windows(2).all(|w| w[0] != w[1]));
        let live = live_bytes_per_op(&t);
        assert_eq!(live.len(), t.len());
        for (k, &b) in live.iter().enumerate() {
            assert_eq!(b, live_by_definition(&t, k), "op {k}");
        }
        assert!(live.contains(&u64::MAX), "the sum passed 64 bits");
        assert_eq!(peak_live_bytes(&t), u64::MAX);
        assert_eq!(peak_by_links(&t), u64::MAX);
        let mut by_links = Vec::new();
        each_live_bytes_by_links(&t, |b| by_links.push(b));
        assert_eq!(by_links, live, "past 64 bits");
        assert!(deltas::<i64>(&t).is_none(), "summed in i128");
        // Without the huge requests the i64 path answers alone, the same way.
        let small = ops(&script[..300]);
        assert!(deltas::<i64>(&small).is_some());
        assert_eq!(
            live_bytes_per_op(&small),
            (0..300)
                .map(|k| live_by_definition(&small, k))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            peak_live_bytes(&small),
            *live_bytes_per_op(&small).iter().max().unwrap()
        );
        assert_eq!(peak_by_links(&small), peak_live_bytes(&small));
    }

    #[test]
    fn the_peak_from_the_links_is_the_peak_of_the_live_bytes() {
        // Frees, deferred frees completed or not, frees of freed allocations, and the
        // peak reached at different ops.
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..40 {
            let mut script: Vec<(char, u64)> = Vec::new();
            let (mut open, mut deferred) = (Vec::new(), Vec::new());
            for k in 0..(50 + round * 20) as u64 {
                let r = next();
                match r % 6 {
                    0..=2 => {
                        open.push(k);
                        script.push(('a', next() % (1 << (10 + round % 30))));
                    }
                    3 if !open.is_empty() => {
                        let a = open.swap_remove((next() % open.len() as u64) as usize);
                        if r % 4 == 0 {
                            deferred.push(a);
                            script.push(('d', a));
                        } else {
                            script.push(('f', a));
                        }
                    }
                    4 if !deferred.is_empty() => {
                        let a = deferred.swap_remove((next() % deferred.len() as u64) as usize);
                        script.push(('c', a));
                    }
                    _ => script.push(('a', 0)),
                }
            }
            let t = ops(&script);
            let mut by_links = Vec::new();
            each_live_bytes_by_links(&t, |b| by_links.push(b));
            assert_eq!(by_links, live_bytes_per_op(&t), "round {round}");
            let want = (0..t.len())
                .map(|k| live_by_definition(&t, k))
                .max()
                .unwrap_or(0);
            assert_eq!(peak_live_bytes(&t), want, "round {round}");
            assert_eq!(peak_by_links(&t), want, "round {round}");
            assert_eq!(build(&t).peak_bytes, want, "round {round}");
        }
    }
}
