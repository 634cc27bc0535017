//! The ops of the device shown as columns ([`OpsTable`]): what the UI draws and prints
//! of each request, and what the engine reads back (sizes, links, ends) to stack bands and
//! index live allocations. One table is made per device; natively the UI and the engine
//! share it, in the browser it crosses to the page, whose wasm memory is never given back,
//! and the engine's worker keeps its own columns. So each column is kept in the fewest
//! bytes that state it exactly: on the 1.12 GB snapshot's 9.67 M ops, 27 bytes an op were
//! 263 MB on each side.

use allocsim_core::metrics::{Column, bytes, exact_vec};
use allocsim_core::trace::{Op, OpKind};
use serde::{Deserialize, Serialize};

/// `u32::MAX`: no op (an allocation never freed, an op that is no allocation).
pub const NO_OP: u32 = u32::MAX;

/// Kinds of op in [`OpsTable::kind`].
pub mod op_kind {
    pub const ALLOC: u8 = 0;
    pub const FREE: u8 = 1;
    pub const COMPLETE_FREE: u8 = 2;
    pub const EMPTY_CACHE: u8 = 3;
    pub const RELEASE_POOL: u8 = 4;
    /// An alloc the recording itself could not serve (the program went on).
    pub const ALLOC_RECORDED_OOM: u8 = 5;
}

/// The trace entry of an op the trace has none of: a block alive when the trace begins
/// (a wrapped ring buffer's), made the first ops so that every model replays it.
pub const NO_ENTRY: u32 = u32::MAX;

/// A size in [`OpsTable`]'s `u32` column that is kept in its list of large sizes.
const LARGE: u32 = u32::MAX;

/// A time as a column's sample: `i64` onto `u64` in the same order (the sign bit
/// flipped), so differences within a block stay those of the times.
const TIME_KEY: u64 = 1 << 63;

/// The requests of one device, column by column (one entry per op). Build it with
/// [`OpsTable::of`] or an [`OpsBuilder`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OpsTable {
    /// An [`op_kind`] constant.
    #[serde(with = "bytes")]
    pub kind: Vec<u8>,
    /// Requested bytes of an alloc (0 for other ops), below 4 GiB; read through
    /// [`OpsTable::size_bytes`].
    #[serde(deserialize_with = "exact_vec")]
    sizes: Vec<u32>,
    /// `(op, bytes)` of the allocs of 4 GiB and more, in op order.
    #[serde(deserialize_with = "exact_vec")]
    large_sizes: Vec<(u32, u64)>,
    /// Alloc: its free op ([`NO_OP`] if never freed). Free, complete-free: its alloc op.
    #[serde(deserialize_with = "exact_vec")]
    pub link: Vec<u32>,
    /// `(alloc, end)` of the allocations whose memory is not the program's from another
    /// op than their free (a free deferred for other streams: its completion, else
    /// [`NO_OP`]), in alloc order; read through [`OpsTable::end`].
    #[serde(deserialize_with = "exact_vec")]
    other_ends: Vec<(u32, u32)>,
    /// Index into the stack table (0: no frames).
    #[serde(deserialize_with = "exact_vec")]
    pub stack: Vec<u32>,
    /// Index of each op's trace entry in `device_traces[d]`, in a compact column (they
    /// rise by about one an op: 1 to 2 bytes an op); read through
    /// [`OpsTable::event_index`].
    events: Column,
    /// `time_us` of the trace entry (0 when the trace has no times), in a compact column
    /// (times move little within 64 ops: 2 to 4 bytes an op where a `Vec<i64>` takes 8);
    /// read through [`OpsTable::time_us`].
    times: Column,
}

impl OpsTable {
    /// The table of `ops` (natively its two halves on two threads: on the 1.12 GB
    /// snapshot's 9.7 M ops the table is on the way to the first full frame).
    #[must_use]
    pub fn of(ops: &[Op]) -> OpsTable {
        let (engine, shown) = super::parallel::join(
            || {
                let mut b = EngineColumns::with_capacity(ops.len());
                for op in ops {
                    b.push(&op.kind);
                }
                b
            },
            || {
                let mut b = ShownColumns::with_capacity(ops.len());
                for op in ops {
                    b.push(op.stack.0, op.event_index, op.time_us);
                }
                b
            },
        );
        OpsBuilder { engine, shown }.finish()
    }

    /// Number of ops.
    #[must_use]
    pub fn len(&self) -> usize {
        self.kind.len()
    }

    /// Whether there are no ops.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.kind.is_empty()
    }

    /// The heap bytes of its columns (their capacity).
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.kind.capacity()
            + 4 * (self.sizes.capacity() + self.link.capacity() + self.stack.capacity())
            + 16 * self.large_sizes.capacity()
            + 8 * self.other_ends.capacity()
            + self.events.capacity_bytes()
            + self.times.capacity_bytes()
    }

    /// Drops the columns only the UI reads (stacks, trace entries, times), keeping those the
    /// engine reads itself (kinds, sizes, links, ends): for an engine whose UI took the
    /// table as its contents ([`Engine`](super::Engine) in the browser's worker).
    pub fn keep_engine_columns(&mut self) {
        self.stack = Vec::new();
        self.events = Column::default();
        self.times = Column::default();
    }

    /// Whether it holds the columns only the UI reads ([`OpsTable::keep_engine_columns`]).
    #[must_use]
    pub fn has_shown_columns(&self) -> bool {
        self.stack.len() == self.len() && self.events.len() == self.len()
    }

    /// Requested bytes of op `k` if an alloc (0 for other ops and past the end).
    #[must_use]
    pub fn size_bytes(&self, k: usize) -> u64 {
        match self.sizes.get(k) {
            Some(&LARGE) => self
                .large_sizes
                .binary_search_by_key(&(k as u32), |&(op, _)| op)
                .map_or(0, |i| self.large_sizes[i].1),
            Some(&s) => u64::from(s),
            None => 0,
        }
    }

    /// Requested bytes of every op, in order.
    pub fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        let mut large = self.large_sizes.iter().map(|&(_, b)| b);
        self.sizes.iter().map(move |&s| {
            if s == LARGE {
                large.next().unwrap_or(0)
            } else {
                u64::from(s)
            }
        })
    }

    /// Alloc `a`: the op after which its memory is no longer the program's (the completion
    /// of a deferred free, else the free; [`NO_OP`] if never). [`NO_OP`] for other ops.
    #[must_use]
    pub fn end(&self, a: usize) -> u32 {
        if let Ok(i) = self
            .other_ends
            .binary_search_by_key(&(a as u32), |&(x, _)| x)
        {
            return self.other_ends[i].1;
        }
        match self.kind.get(a) {
            Some(&(op_kind::ALLOC | op_kind::ALLOC_RECORDED_OOM)) => self.link[a],
            _ => NO_OP,
        }
    }

    /// [`OpsTable::end`] of every op, in order.
    pub fn ends(&self) -> impl Iterator<Item = u32> + '_ {
        let mut other = self.other_ends.iter().peekable();
        self.kind.iter().enumerate().map(move |(a, &kind)| {
            if let Some(&&(x, end)) = other.peek()
                && x as usize == a
            {
                other.next();
                return end;
            }
            match kind {
                op_kind::ALLOC | op_kind::ALLOC_RECORDED_OOM => self.link[a],
                _ => NO_OP,
            }
        })
    }

    /// Index of op `k`'s trace entry (0 past the end, or without the UI's columns).
    #[must_use]
    pub fn event_index(&self, k: usize) -> u32 {
        self.events.get(k).map_or(0, |e| e as u32)
    }

    /// Op `k`'s trace entry as the UI names it: `event N`, or the trace's start for a
    /// block alive before its first event ([`NO_ENTRY`]).
    #[must_use]
    pub fn event_name(&self, k: usize) -> String {
        match self.event_index(k) {
            NO_ENTRY => "the trace's start".into(),
            e => format!("event {e}"),
        }
    }

    /// When op `k` happened, as the UI says it: `at event N`, or `before the trace's first
    /// event` for a block alive when the trace begins ([`NO_ENTRY`]).
    #[must_use]
    pub fn at_event(&self, k: usize) -> String {
        match self.event_index(k) {
            NO_ENTRY => "before the trace's first event".into(),
            e => format!("at event {e}"),
        }
    }

    /// The trace entry of every op, in order.
    pub fn event_indexes(&self) -> impl Iterator<Item = u32> + '_ {
        self.events.iter().map(|e| e as u32)
    }

    /// The number of ops whose trace entry is at most `event`, counting the blocks alive
    /// at the trace's start (the first ops, [`NO_ENTRY`]) as before every entry: the
    /// ops' entries rise after them.
    #[must_use]
    pub fn ops_up_to_event(&self, event: u64) -> usize {
        let (mut lo, mut hi) = (0, self.events.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self
                .events
                .get(mid)
                .is_some_and(|e| e == u64::from(NO_ENTRY) || e <= event)
            {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// `time_us` of op `k`'s trace entry.
    #[must_use]
    pub fn time_us(&self, k: usize) -> Option<i64> {
        self.times.get(k).map(|v| (v ^ TIME_KEY) as i64)
    }

    /// `time_us` of every op, in order.
    pub fn times_us(&self) -> impl Iterator<Item = i64> + '_ {
        self.times.iter().map(|v| (v ^ TIME_KEY) as i64)
    }

    /// Whether the times column holds nothing.
    #[must_use]
    pub fn has_no_times(&self) -> bool {
        self.times.is_empty()
    }

    /// Whether op `k` allocates memory the program held (not a recorded OOM).
    #[must_use]
    pub fn is_alloc(&self, k: usize) -> bool {
        self.kind.get(k) == Some(&op_kind::ALLOC)
    }

    /// Whether allocation `a` is held by the program after ops `0..=op`.
    #[must_use]
    pub fn live_after(&self, a: usize, op: usize) -> bool {
        a <= op && self.is_alloc(a) && {
            let end = self.end(a);
            end == NO_OP || end as usize > op
        }
    }
}

/// An [`OpsTable`] made op by op: [`OpsBuilder::push`], then [`OpsBuilder::finish`].
#[derive(Debug, Default)]
pub struct OpsBuilder {
    engine: EngineColumns,
    shown: ShownColumns,
}

impl OpsBuilder {
    /// Appends the next op: what it does, its stack, trace entry and time.
    pub fn push(&mut self, kind: &OpKind, stack: u32, event_index: u32, time_us: i64) {
        self.engine.push(kind);
        self.shown.push(stack, event_index, time_us);
    }

    /// The table, its columns in exactly their room.
    #[must_use]
    pub fn finish(self) -> OpsTable {
        let EngineColumns {
            mut kind,
            mut sizes,
            mut large_sizes,
            mut link,
            mut other_ends,
        } = self.engine;
        let ShownColumns {
            mut stack,
            mut events,
            mut times,
        } = self.shown;
        // A free deferred, then completed: the completion (pushed after) is the end.
        other_ends.sort_by_key(|&(a, _)| a);
        other_ends.reverse();
        other_ends.dedup_by_key(|&mut (a, _)| a);
        other_ends.reverse();
        for v in [&mut sizes, &mut link, &mut stack] {
            v.shrink_to_fit();
        }
        kind.shrink_to_fit();
        large_sizes.shrink_to_fit();
        other_ends.shrink_to_fit();
        events.shrink_to_fit();
        times.shrink_to_fit();
        OpsTable {
            kind,
            sizes,
            large_sizes,
            link,
            other_ends,
            stack,
            events,
            times,
        }
    }
}

/// The kinds, sizes, links and ends.
#[derive(Debug, Default)]
struct EngineColumns {
    kind: Vec<u8>,
    sizes: Vec<u32>,
    large_sizes: Vec<(u32, u64)>,
    link: Vec<u32>,
    /// As pushed: in the order of the frees and completions, sorted when finished.
    other_ends: Vec<(u32, u32)>,
}

impl EngineColumns {
    fn with_capacity(n: usize) -> Self {
        EngineColumns {
            kind: Vec::with_capacity(n),
            sizes: Vec::with_capacity(n),
            link: Vec::with_capacity(n),
            ..EngineColumns::default()
        }
    }

    fn push(&mut self, kind: &OpKind) {
        let k = self.kind.len() as u32;
        let (code, size, link) = match *kind {
            OpKind::Alloc {
                size_bytes,
                recorded_oom,
                ..
            } => {
                let code = if recorded_oom {
                    op_kind::ALLOC_RECORDED_OOM
                } else {
                    op_kind::ALLOC
                };
                (code, size_bytes, NO_OP)
            }
            OpKind::Free { alloc, deferred } => {
                if let Some(a) = self.link.get_mut(alloc as usize) {
                    *a = k;
                    // A deferred free holds its memory until its completion (if any).
                    if deferred {
                        self.other_ends.push((alloc, NO_OP));
                    }
                }
                (op_kind::FREE, 0, alloc)
            }
            OpKind::CompleteFree { alloc } => {
                if (alloc as usize) < self.kind.len() {
                    self.other_ends.push((alloc, k));
                }
                (op_kind::COMPLETE_FREE, 0, alloc)
            }
            OpKind::EmptyCache => (op_kind::EMPTY_CACHE, 0, NO_OP),
            OpKind::ReleasePool { .. } => (op_kind::RELEASE_POOL, 0, NO_OP),
        };
        self.kind.push(code);
        match u32::try_from(size) {
            Ok(s) if s != LARGE => self.sizes.push(s),
            _ => {
                self.sizes.push(LARGE);
                self.large_sizes.push((k, size));
            }
        }
        self.link.push(link);
    }
}

/// The stacks, trace entries and times.
#[derive(Debug, Default)]
struct ShownColumns {
    stack: Vec<u32>,
    events: Column,
    times: Column,
}

impl ShownColumns {
    fn with_capacity(n: usize) -> Self {
        ShownColumns {
            stack: Vec::with_capacity(n),
            ..ShownColumns::default()
        }
    }

    fn push(&mut self, stack: u32, event_index: u32, time_us: i64) {
        self.stack.push(stack);
        self.events.push(u64::from(event_index));
        self.times.push(time_us as u64 ^ TIME_KEY);
    }
}

#[cfg(test)]
impl OpsTable {
    /// Ops from a script: `('a', size)` allocates, `('f', i)` frees the alloc at op `i`,
    /// `('d', i)` frees it deferred, `('c', i)` completes that free; op `k` at trace entry
    /// `k`, with no stack, at time 0.
    pub(crate) fn from_script(script: &[(char, u64)]) -> OpsTable {
        let mut b = OpsBuilder::default();
        for (k, &(c, v)) in script.iter().enumerate() {
            let kind = match c {
                'a' => OpKind::Alloc {
                    size_bytes: v,
                    stream: 0,
                    pool: allocsim_core::trace::PoolIx(0),
                    recorded_oom: false,
                    restored: false,
                },
                'f' | 'd' => OpKind::Free {
                    alloc: v as u32,
                    deferred: c == 'd',
                },
                'c' => OpKind::CompleteFree { alloc: v as u32 },
                _ => panic!("op {k}: no such op {c:?}"),
            };
            b.push(&kind, 0, k as u32, 0);
        }
        b.finish()
    }

    /// Ops of the given kinds, the allocs ending where `ends` says (`None`: never),
    /// whatever the ops there are.
    pub(crate) fn with_ends(ops: &[(u8, Option<u32>)]) -> OpsTable {
        OpsTable {
            kind: ops.iter().map(|o| o.0).collect(),
            sizes: vec![0; ops.len()],
            link: vec![NO_OP; ops.len()],
            other_ends: (0..)
                .zip(ops)
                .filter_map(|(a, o)| Some((a, o.1?)))
                .collect(),
            ..OpsTable::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded script of allocs (some over 4 GiB), frees (some deferred, some of
    /// those completed) and other ops, with each op's expected size and end.
    fn script(n: usize) -> (Vec<OpKind>, Vec<u64>, Vec<u32>) {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut kinds, mut sizes, mut ends) = (Vec::new(), Vec::new(), Vec::new());
        let mut open: Vec<u32> = Vec::new();
        let mut deferred: Vec<u32> = Vec::new();
        for k in 0..n as u32 {
            let r = next();
            let kind = match r % 7 {
                0..=2 => {
                    let size = if r % 61 == 0 {
                        (5 << 30) + (next() % (1 << 20))
                    } else if r % 67 == 0 {
                        u64::from(u32::MAX)
                    } else {
                        next() % (1 << 28)
                    };
                    open.push(k);
                    OpKind::Alloc {
                        size_bytes: size,
                        stream: 0,
                        pool: allocsim_core::trace::PoolIx(0),
                        recorded_oom: r % 53 == 0,
                        restored: false,
                    }
                }
                3 | 4 if !open.is_empty() => {
                    let a = open.swap_remove((next() % open.len() as u64) as usize);
                    let defer = r % 5 == 0;
                    ends[a as usize] = if defer { NO_OP } else { k };
                    if defer {
                        deferred.push(a);
                    }
                    OpKind::Free {
                        alloc: a,
                        deferred: defer,
                    }
                }
                5 if !deferred.is_empty() => {
                    let a = deferred.swap_remove((next() % deferred.len() as u64) as usize);
                    ends[a as usize] = k;
                    OpKind::CompleteFree { alloc: a }
                }
                _ => OpKind::EmptyCache,
            };
            sizes.push(match kind {
                OpKind::Alloc { size_bytes, .. } => size_bytes,
                _ => 0,
            });
            ends.push(NO_OP);
            kinds.push(kind);
        }
        (kinds, sizes, ends)
    }

    #[test]
    fn sizes_and_ends_read_back_as_pushed_by_op_and_in_order() {
        let (kinds, sizes, ends) = script(20_000);
        let mut b = OpsBuilder::default();
        for (k, kind) in kinds.iter().enumerate() {
            b.push(kind, k as u32 % 7, 3 * k as u32 + 1, 1_000 - k as i64);
        }
        let t = b.finish();
        assert!(t.large_sizes.len() > 10, "sizes of 4 GiB and more");
        assert!(t.other_ends.len() > 100, "deferred frees");
        assert_eq!(t.sizes().collect::<Vec<_>>(), sizes);
        assert_eq!(t.ends().collect::<Vec<_>>(), ends);
        for k in 0..kinds.len() {
            assert_eq!(t.size_bytes(k), sizes[k], "op {k}");
            assert_eq!(t.end(k), ends[k], "op {k}");
            assert_eq!(t.event_index(k), 3 * k as u32 + 1);
            assert_eq!(t.time_us(k), Some(1_000 - k as i64));
            assert_eq!(t.stack[k], k as u32 % 7);
        }
        assert_eq!(t.size_bytes(kinds.len()), 0, "past the end");
        assert_eq!(t.event_indexes().count(), kinds.len());
    }

    #[test]
    fn ops_up_to_an_event_are_counted_by_their_entries() {
        // Entries 0, 2, 4, ...: an op per even entry.
        let mut b = OpsBuilder::default();
        for k in 0..1000u32 {
            b.push(&OpKind::EmptyCache, 0, 2 * k, 0);
        }
        let t = b.finish();
        assert_eq!(t.ops_up_to_event(0), 1);
        assert_eq!(t.ops_up_to_event(1), 1);
        assert_eq!(t.ops_up_to_event(2), 2);
        assert_eq!(t.ops_up_to_event(1997), 999);
        assert_eq!(t.ops_up_to_event(1998), 1000);
        assert_eq!(t.ops_up_to_event(u64::MAX), 1000);
        assert_eq!(OpsTable::default().ops_up_to_event(5), 0);
        // Two blocks alive at the start come first: before every entry.
        let mut b = OpsBuilder::default();
        for e in [NO_ENTRY, NO_ENTRY, 0, 1, 2] {
            b.push(&OpKind::EmptyCache, 0, e, 0);
        }
        let t = b.finish();
        assert_eq!(t.ops_up_to_event(0), 3);
        assert_eq!(t.ops_up_to_event(1), 4);
        assert_eq!(t.ops_up_to_event(7), 5);
        assert_eq!(
            (
                t.event_name(0),
                t.at_event(1),
                t.event_name(2),
                t.at_event(4)
            ),
            (
                "the trace's start".to_string(),
                "before the trace's first event".to_string(),
                "event 0".to_string(),
                "at event 2".to_string()
            )
        );
    }

    #[test]
    fn the_engine_keeps_its_columns_and_drops_the_shown_ones() {
        let (kinds, sizes, ends) = script(3_000);
        let mut b = OpsBuilder::default();
        for (k, kind) in kinds.iter().enumerate() {
            b.push(kind, 1, k as u32, 0);
        }
        let mut t = b.finish();
        assert!(t.has_shown_columns());
        let before = t.heap_bytes();
        t.keep_engine_columns();
        assert!(!t.has_shown_columns() && t.has_no_times());
        assert!(t.heap_bytes() < before);
        assert_eq!(t.sizes().collect::<Vec<_>>(), sizes);
        assert_eq!(t.ends().collect::<Vec<_>>(), ends);
    }
}
