//! The ops of a trace being built, each kept as the entry it comes from and what that
//! entry does not say (12 bytes, where an [`Op`] takes 48), made into [`Op`]s once the
//! build is done: written over the entries themselves when the caller hands them over
//! ([`SlimOps::into_ops`]), else copied out ([`SlimOps::ops_from`]).
//!
//! Why: while a trace is built, the decoded entries (48 bytes each) and its ops are alive
//! together. On the 1.12 GB snapshot that is 664 MiB of entries and 443 MiB of ops: the
//! floor of the browser's engine worker, whose wasm memory is never given back. Kept slim,
//! the ops take 111 MiB during the build; written over the entries, none more after it.
//!
//! An op is kept slim only where expanding it from its entry gives the op back exactly
//! (checked as it is pushed); any other op (the blocks alive at the start, which have no
//! entry, or a pool release) is kept whole.
//!
//! [`MadeOps`] is where a build keeps its ops, slim or whole as
//! [`crate::build::OpsMemory`] says.

use std::collections::VecDeque;

use crate::snapshot::RawEvent;
use crate::trace::{Op, OpKind, PoolIx};

/// What an op does, as far as its entry does not say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An alloc of its entry's size, on its stream, at its address; `word` its pool.
    Alloc,
    /// The same, recorded as refused (no address).
    AllocOom,
    /// The same, a block re-created by a checkpoint restore.
    AllocRestored,
    /// A free of op `word`, at its entry's address.
    Free,
    /// The same, deferred.
    FreeDeferred,
    /// A deferred free of op `word` completes, at its entry's address.
    CompleteFree,
    /// An inferred `empty_cache()`.
    EmptyCache,
    /// `whole[word]`.
    Whole,
}

/// One op: its entry's index and what the entry does not say. 12 bytes.
#[derive(Debug, Clone, Copy)]
struct Slim {
    event: u32,
    word: u32,
    kind: Kind,
}

/// The ops of one device's trace as its build makes them, in order.
#[derive(Debug, Clone, Default)]
pub(super) struct SlimOps {
    ops: Vec<Slim>,
    /// The ops kept whole, in order.
    whole: Vec<Op>,
}

impl Slim {
    /// The op this is, `e` its entry (`event`'s), `whole` the ops kept whole.
    #[inline]
    fn expand(self, e: &RawEvent, whole: &[Op]) -> Op {
        let alloc = |recorded_oom, restored| OpKind::Alloc {
            size_bytes: e.size,
            stream: e.stream,
            pool: PoolIx(self.word),
            recorded_oom,
            restored,
        };
        let (kind, recorded_addr) = match self.kind {
            Kind::Alloc => (alloc(false, false), e.addr),
            Kind::AllocOom => (alloc(true, false), 0),
            Kind::AllocRestored => (alloc(false, true), e.addr),
            Kind::Free | Kind::FreeDeferred => (
                OpKind::Free {
                    alloc: self.word,
                    deferred: self.kind == Kind::FreeDeferred,
                },
                e.addr,
            ),
            Kind::CompleteFree => (OpKind::CompleteFree { alloc: self.word }, e.addr),
            Kind::EmptyCache => (OpKind::EmptyCache, 0),
            Kind::Whole => return whole[self.word as usize],
        };
        Op {
            kind,
            event_index: self.event,
            recorded_addr,
            stack: e.stack,
            time_us: e.time_us,
        }
    }

    /// `op` kept slim, if its kind can be (whether its entry says the rest is checked by
    /// the caller).
    fn of(op: &Op) -> Option<Slim> {
        let (kind, word) = match op.kind {
            OpKind::Alloc {
                pool,
                recorded_oom,
                restored,
                ..
            } => (
                match (recorded_oom, restored) {
                    (false, false) => Kind::Alloc,
                    (true, false) => Kind::AllocOom,
                    (false, true) => Kind::AllocRestored,
                    (true, true) => return None,
                },
                pool.0,
            ),
            OpKind::Free { alloc, deferred } => (
                if deferred {
                    Kind::FreeDeferred
                } else {
                    Kind::Free
                },
                alloc,
            ),
            OpKind::CompleteFree { alloc } => (Kind::CompleteFree, alloc),
            OpKind::EmptyCache => (Kind::EmptyCache, 0),
            OpKind::ReleasePool { .. } => return None,
        };
        Some(Slim {
            event: op.event_index,
            word,
            kind,
        })
    }
}

impl SlimOps {
    /// Room for `n` ops.
    pub(super) fn with_capacity(n: usize) -> SlimOps {
        SlimOps {
            ops: Vec::with_capacity(n),
            whole: Vec::new(),
        }
    }

    /// How many ops.
    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Adds `op`, made from `events[op.event_index]` (if it is an entry's).
    pub(super) fn push(&mut self, op: Op, events: &[RawEvent]) {
        let slim = Slim::of(&op).filter(|s| {
            events
                .get(op.event_index as usize)
                .is_some_and(|e| s.expand(e, &[]) == op)
        });
        self.ops.push(slim.unwrap_or_else(|| {
            self.whole.push(op);
            Slim {
                event: op.event_index,
                word: (self.whole.len() - 1) as u32,
                kind: Kind::Whole,
            }
        }));
    }

    /// Ops `from..` into `out` (cleared first), `events` the entries they were made from.
    pub(super) fn copy_from(&self, from: usize, events: &[RawEvent], out: &mut Vec<Op>) {
        out.clear();
        out.extend(
            self.ops
                .get(from..)
                .unwrap_or(&[])
                .iter()
                .map(|s| self.expand(*s, events)),
        );
    }

    fn expand(&self, s: Slim, events: &[RawEvent]) -> Op {
        match s.kind {
            Kind::Whole => self.whole[s.word as usize],
            _ => s.expand(&events[s.event as usize], &self.whole),
        }
    }

    /// Renames the ops' pools: an alloc's `PoolIx(k + 1)` becomes `new_ix[k]`, a pool
    /// release's pool `resolve(pool)`.
    pub(super) fn rename_pools(
        &mut self,
        new_ix: &[PoolIx],
        resolve: impl Fn(crate::trace::PoolId) -> crate::trace::PoolId,
    ) {
        let renamed = |ix: PoolIx| match ix.0.checked_sub(1) {
            Some(k) => new_ix[k as usize],
            None => ix,
        };
        for s in &mut self.ops {
            if matches!(s.kind, Kind::Alloc | Kind::AllocOom | Kind::AllocRestored) {
                s.word = renamed(PoolIx(s.word)).0;
            }
        }
        rename_whole(&mut self.whole, new_ix, resolve);
    }

    /// The entries an inferred `empty_cache()` was placed at, in op order.
    fn empty_cache_at(&self) -> Vec<u32> {
        self.ops
            .iter()
            .filter(|s| match s.kind {
                Kind::EmptyCache => true,
                Kind::Whole => self.whole[s.word as usize].kind == OpKind::EmptyCache,
                _ => false,
            })
            .map(|s| s.event)
            .collect()
    }

    /// Gives the room not used back.
    fn shrink_to_fit(&mut self) {
        self.ops.shrink_to_fit();
        self.whole.shrink_to_fit();
    }

    /// The ops, copied out of `events`, the entries they were made from.
    pub(super) fn ops_from(&self, events: &[RawEvent]) -> Vec<Op> {
        let mut ops = Vec::new();
        self.copy_from(0, events, &mut ops);
        ops
    }

    /// The ops, written over `entries` (the entries they were made from): the entries'
    /// memory becomes the ops'. An op is written once the entry it comes from has been
    /// read, so an op never overwrites an entry still to be read: each entry gives way to
    /// at most one op, and the ops an entry makes beyond its first (and those kept whole
    /// ahead of the first entry's, the blocks alive at the start) wait in order for the
    /// entries that make none. `Vec`'s in-place collect reuses `entries`' memory for
    /// the ops (an [`Op`] and a [`RawEvent`] are of one size and alignment;
    /// `ops_are_written_over_their_entries` checks it); past the entries' room, the ops
    /// still waiting are added as to any vector.
    pub(super) fn into_ops(self, entries: Vec<RawEvent>) -> Vec<Op> {
        // The entries are read once, in order: every op kept slim must come from an entry
        // not before the last's.
        let mut last = 0;
        let in_order = self.ops.iter().filter(|s| s.kind != Kind::Whole).all(|s| {
            let ok = s.event >= last && (s.event as usize) < entries.len();
            last = s.event;
            ok
        });
        if !in_order {
            return self.ops_from(&entries);
        }
        let SlimOps { ops, whole } = self;
        let mut next = ops.into_iter().peekable();
        let mut waiting = VecDeque::new();
        let mut at = 0u32;
        let mut out: Vec<Op> = entries
            .into_iter()
            .filter_map(|e| {
                while let Some(s) = next.next_if(|s| s.kind == Kind::Whole || s.event == at) {
                    waiting.push_back(s.expand(&e, &whole));
                }
                at += 1;
                waiting.pop_front()
            })
            .collect();
        out.extend(waiting);
        // Past the last entry only ops kept whole are left (every slim op's entry is one
        // of `entries`: checked above).
        out.extend(next.map(|s| whole[s.word as usize]));
        out.shrink_to_fit();
        out
    }
}

/// [`SlimOps::rename_pools`] of ops kept whole.
fn rename_whole(
    ops: &mut [Op],
    new_ix: &[PoolIx],
    resolve: impl Fn(crate::trace::PoolId) -> crate::trace::PoolId,
) {
    for op in ops {
        match &mut op.kind {
            OpKind::Alloc { pool, .. } => {
                if let Some(k) = pool.0.checked_sub(1) {
                    *pool = new_ix[k as usize];
                }
            }
            OpKind::ReleasePool { pool } => *pool = resolve(*pool),
            _ => {}
        }
    }
}

/// Where a build keeps the ops it makes, in order ([`crate::build::OpsMemory`]).
#[derive(Debug)]
pub(super) enum MadeOps {
    /// Whole, as made.
    Whole(Vec<Op>),
    /// Slim, made whole at the end.
    Slim(SlimOps),
}

impl MadeOps {
    /// Room for `n` ops, slim or whole.
    pub(super) fn with_capacity(slim: bool, n: usize) -> MadeOps {
        if slim {
            MadeOps::Slim(SlimOps::with_capacity(n))
        } else {
            MadeOps::Whole(Vec::with_capacity(n))
        }
    }

    /// How many ops.
    pub(super) fn len(&self) -> usize {
        match self {
            MadeOps::Whole(ops) => ops.len(),
            MadeOps::Slim(ops) => ops.len(),
        }
    }

    /// Adds `op`, made from `events[op.event_index]` (if it is an entry's).
    pub(super) fn push(&mut self, op: Op, events: &[RawEvent]) {
        match self {
            MadeOps::Whole(ops) => ops.push(op),
            MadeOps::Slim(ops) => ops.push(op, events),
        }
    }

    /// Ops `from..`, `events` the entries they were made from; made whole in `piece` if
    /// they are slim.
    pub(super) fn since<'a>(
        &'a self,
        from: usize,
        events: &[RawEvent],
        piece: &'a mut Vec<Op>,
    ) -> &'a [Op] {
        match self {
            MadeOps::Whole(ops) => ops.get(from..).unwrap_or(&[]),
            MadeOps::Slim(ops) => {
                ops.copy_from(from, events, piece);
                piece
            }
        }
    }

    /// [`SlimOps::rename_pools`].
    pub(super) fn rename_pools(
        &mut self,
        new_ix: &[PoolIx],
        resolve: impl Fn(crate::trace::PoolId) -> crate::trace::PoolId,
    ) {
        match self {
            MadeOps::Whole(ops) => rename_whole(ops, new_ix, resolve),
            MadeOps::Slim(ops) => ops.rename_pools(new_ix, resolve),
        }
    }

    /// The entries an inferred `empty_cache()` was placed at, in op order.
    pub(super) fn empty_cache_at(&self) -> Vec<u32> {
        match self {
            MadeOps::Whole(ops) => ops
                .iter()
                .filter(|o| o.kind == OpKind::EmptyCache)
                .map(|o| o.event_index)
                .collect(),
            MadeOps::Slim(ops) => ops.empty_cache_at(),
        }
    }

    /// Gives the room not used back.
    pub(super) fn shrink_to_fit(&mut self) {
        match self {
            MadeOps::Whole(ops) => ops.shrink_to_fit(),
            MadeOps::Slim(ops) => ops.shrink_to_fit(),
        }
    }

    /// The ops, whole; `events` the entries they were made from.
    pub(super) fn copied(self, events: &[RawEvent]) -> Vec<Op> {
        match self {
            MadeOps::Whole(ops) => ops,
            MadeOps::Slim(ops) => ops.ops_from(events),
        }
    }

    /// The ops, whole; `entries` the entries they were made from, given up (slim ops are
    /// written over them, [`SlimOps::into_ops`]).
    pub(super) fn written_over(self, entries: Vec<RawEvent>) -> Vec<Op> {
        match self {
            MadeOps::Whole(ops) => ops,
            MadeOps::Slim(ops) => ops.into_ops(entries),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Action, StackId};
    use crate::trace::{OpKind, PoolIx};

    fn entry(i: u64) -> RawEvent {
        RawEvent {
            time_us: i as i64 * 10,
            stack: StackId(i as u32 % 7),
            ..RawEvent::new(Action::Alloc, 0x1000 * (i + 1), 512 + i, 7)
        }
    }

    /// An alloc made from entry `i` of `entries`.
    fn alloc(entries: &[RawEvent], i: usize, pool: u32) -> Op {
        let e = &entries[i];
        Op {
            kind: OpKind::Alloc {
                size_bytes: e.size,
                stream: e.stream,
                pool: PoolIx(pool),
                recorded_oom: false,
                restored: false,
            },
            event_index: i as u32,
            recorded_addr: e.addr,
            stack: e.stack,
            time_us: e.time_us,
        }
    }

    fn whole_op(event_index: u32, size_bytes: u64) -> Op {
        Op {
            kind: OpKind::Alloc {
                size_bytes,
                stream: 3,
                pool: PoolIx::DEFAULT,
                recorded_oom: false,
                restored: false,
            },
            event_index,
            recorded_addr: 0xdead_0000,
            stack: StackId::EMPTY,
            time_us: 0,
        }
    }

    /// Ops as a build makes them: `start` whole ones first, then per entry `i` the number
    /// of ops `per(i)` says (0, 1 or more), some of them of kinds kept whole.
    fn made(entries: &[RawEvent], start: usize, per: impl Fn(usize) -> usize) -> Vec<Op> {
        let mut ops: Vec<Op> = (0..start).map(|k| whole_op(u32::MAX, k as u64)).collect();
        for i in 0..entries.len() {
            for k in 0..per(i) {
                let op = match (i + k) % 5 {
                    0 => Op {
                        kind: OpKind::EmptyCache,
                        recorded_addr: 0,
                        ..alloc(entries, i, 0)
                    },
                    1 => Op {
                        kind: OpKind::Free {
                            alloc: k as u32,
                            deferred: i % 2 == 0,
                        },
                        ..alloc(entries, i, 0)
                    },
                    2 => Op {
                        kind: OpKind::ReleasePool {
                            pool: crate::trace::PoolId(1, i as u64),
                        },
                        recorded_addr: 0,
                        ..alloc(entries, i, 0)
                    },
                    3 => whole_op(i as u32, 99),
                    _ => alloc(entries, i, (i % 3) as u32),
                };
                ops.push(op);
            }
        }
        ops
    }

    fn slim(ops: &[Op], entries: &[RawEvent]) -> SlimOps {
        let mut s = SlimOps::with_capacity(ops.len());
        for op in ops {
            s.push(*op, entries);
        }
        s
    }

    #[test]
    fn ops_come_back_exactly_copied_or_written_over_their_entries() {
        let entries: Vec<RawEvent> = (0..2_000).map(entry).collect();
        let shapes: [(usize, &dyn Fn(usize) -> usize); 5] = [
            (0, &|i| usize::from(i % 3 != 0)),
            (40, &|i| usize::from(i % 2 == 0)),
            (5, &|i| [0, 1, 3, 0, 2][i % 5]),
            (0, &|_| 2),
            (3_000, &|i| i % 2),
        ];
        for (start, per) in shapes {
            let ops = made(&entries, start, per);
            let s = slim(&ops, &entries);
            assert_eq!(s.len(), ops.len());
            assert_eq!(s.ops_from(&entries), ops, "copied, start {start}");
            let mut piece = Vec::new();
            s.copy_from(ops.len() / 2, &entries, &mut piece);
            assert_eq!(piece, ops[ops.len() / 2..]);
            assert_eq!(s.into_ops(entries.clone()), ops, "in place, start {start}");
        }
    }

    #[test]
    fn ops_are_written_over_their_entries() {
        // One op for two entries in three, 100 blocks alive at the start: the ops take the
        // entries' memory and give back what they do not use.
        let entries: Vec<RawEvent> = (0..30_000).map(entry).collect();
        let ops = made(&entries, 100, |i| usize::from(i % 3 != 0));
        let s = slim(&ops, &entries);
        let memory = entries.as_ptr() as usize;
        let out = s.into_ops(entries);
        assert_eq!(out.as_ptr() as usize, memory);
        assert_eq!(out.capacity(), ops.len());
        assert_eq!(out, ops);
    }

    #[test]
    fn only_what_an_entry_does_not_say_is_kept_whole() {
        let entries: Vec<RawEvent> = (0..1_000).map(entry).collect();
        let ops = made(&entries, 10, |_| 1);
        let s = slim(&ops, &entries);
        // Start blocks, pool releases and the ops given another address than their
        // entry's: 10 + 2 in 5 of the entries'.
        assert_eq!(s.whole.len(), 10 + 400);
        // An alloc whose size is not its entry's is kept whole, and comes back.
        let mut s = SlimOps::default();
        let mut op = alloc(&entries, 4, 1);
        if let OpKind::Alloc { size_bytes, .. } = &mut op.kind {
            *size_bytes += 1;
        }
        s.push(op, &entries);
        assert_eq!(s.whole.len(), 1);
        assert_eq!(s.ops_from(&entries), vec![op]);
    }

    #[test]
    fn ops_out_of_entry_order_are_copied() {
        let entries: Vec<RawEvent> = (0..100).map(entry).collect();
        let ops = vec![alloc(&entries, 50, 0), alloc(&entries, 10, 0)];
        let s = slim(&ops, &entries);
        assert_eq!(s.into_ops(entries), ops);
    }

    #[test]
    fn renamed_pools_reach_slim_and_whole_ops() {
        let entries: Vec<RawEvent> = (0..10).map(entry).collect();
        let mut ops = vec![alloc(&entries, 1, 2), alloc(&entries, 2, 0), whole_op(3, 5)];
        ops.push(Op {
            kind: OpKind::ReleasePool {
                pool: crate::trace::PoolId(1, 1),
            },
            recorded_addr: 0,
            ..alloc(&entries, 4, 0)
        });
        let mut s = slim(&ops, &entries);
        let new_ix = [PoolIx(2), PoolIx(1)];
        s.rename_pools(&new_ix, |p| crate::trace::PoolId(p.0, p.1 + 10));
        let out = s.into_ops(entries);
        assert!(matches!(
            out[0].kind,
            OpKind::Alloc {
                pool: PoolIx(1),
                ..
            }
        ));
        assert!(matches!(
            out[1].kind,
            OpKind::Alloc {
                pool: PoolIx(0),
                ..
            }
        ));
        assert_eq!(
            out[3].kind,
            OpKind::ReleasePool {
                pool: crate::trace::PoolId(1, 11)
            }
        );
    }
}
