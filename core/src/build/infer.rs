//! The inference of what the snapshot leaves implicit, one recorded group at a time: which
//! pool a malloc used (the default, a private one, a pool renamed once its end-state segment
//! names it) and whether an `empty_cache()` preceded it — the candidates tried on a copy of
//! the model, the one that reproduces the recording kept —, CUDA-graph checkpoint restores,
//! and `empty_cache()` points outside any malloc.

use super::recorded::RecordedDevice;
use super::{Annotator, Creation};
use crate::device::SimulatedDevice;
use crate::models::pytorch::{MIN_BLOCK_BYTES, PyTorchModel};
use crate::models::{AllocRequest, Allocator, ModelEvent, PoolId};
use crate::snapshot::{Action, RawEvent};
use crate::trace::{Inference, OpKind};
use crate::validate::events_match;

/// The pools a malloc group is tried in, most likely first (at most three: the scope's
/// private pool, the default pool, a new private pool), kept off the heap: the build
/// makes one per malloc.
#[derive(Default)]
struct Pools {
    pools: [PoolId; 3],
    len: usize,
}

impl Pools {
    fn push(&mut self, p: PoolId) {
        self.pools[self.len] = p;
        self.len += 1;
    }

    fn as_slice(&self) -> &[PoolId] {
        &self.pools[..self.len]
    }
}

/// How a group of recorded events with leading segment releases is explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interp {
    /// The malloc itself released them (GC or the OOM ladder).
    Ladder,
    /// An `empty_cache()` released them, then the malloc ran.
    EmptyFirst,
}

impl Annotator<'_, '_> {
    /// Runs one interpretation of a malloc group on `model`, the recorded device handing
    /// out `group`; the result, and the synthetic device as it left it
    /// ([`RecordedDevice::into_synth`]), for the caller to keep if it keeps `model`.
    fn run_malloc(
        model: &mut PyTorchModel,
        mut dev: RecordedDevice<'_>,
        interp: Interp,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> (Result<u64, ()>, Option<SimulatedDevice>) {
        if interp == Interp::EmptyFirst {
            model.empty_cache(&mut dev, out);
        }
        let r = model.malloc(&mut dev, req, out).map_err(|_| ());
        (r, dev.into_synth())
    }

    /// Keeps the synthetic device a group's device left (`Some`: it changed), so that the
    /// synthetic segments the model holds stay taken.
    pub(super) fn keep_synth(&mut self, synth: Option<SimulatedDevice>) {
        if let Some(s) = synth {
            self.synth = s;
        }
    }

    fn end_state_pool(&self, addr: u64) -> Option<PoolId> {
        self.snap
            .segments
            .iter()
            .filter(|s| s.device == self.device)
            .find(|s| addr >= s.address && addr < s.address + s.total_size.max(1))
            .map(|s| PoolId(s.segment_pool_id.0, s.segment_pool_id.1))
    }

    pub(super) fn release_private_pools_in(&mut self, i: usize, group: &[RawEvent]) {
        let mut seen = Vec::new();
        for e in group
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentFree | Action::SegmentUnmap))
        {
            if let Some((pool, _, _)) = self.model.segment_of(e.addr)
                && pool.is_private()
                && !seen.contains(&pool)
            {
                seen.push(pool);
            }
        }
        for pool in seen {
            self.model.release_pool(pool);
            self.op(i, OpKind::ReleasePool { pool }, 0);
            self.inferred.push(Inference {
                event_index: i as u32,
                kind: "pool_released",
                detail: format!("private pool {pool:?} was released before event {i} (its cached segments are freed there)"),
            });
        }
    }

    pub(super) fn malloc_group(&mut self, i: usize, j: usize) {
        let last = self.events[j];
        let is_oom = last.action == Action::Oom;
        let group_all = &self.events[i..=j];
        let seg_events = self.segment_group(i, j + 1);
        let leading_free = matches!(
            self.events[i].action,
            Action::SegmentFree | Action::SegmentUnmap
        );
        let first_new = seg_events
            .iter()
            .find(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
            .copied();
        let stream = last.stream;
        // A replay steps a malloc group as one malloc, from the state before it.
        if is_oom || leading_free {
            self.ride_off();
        } else {
            self.ride_begin(true);
        }
        let scope = self.scope.get(&stream).copied().unwrap_or(PoolId::DEFAULT);
        // Which pools to try, most likely first.
        let mut pools = Pools::default();
        let mut known_from_end: Option<PoolId> = None;
        if !is_oom && first_new.is_none() {
            pools.push(self.model.segment_of(last.addr).map_or(scope, |s| s.0));
        } else if let Some(n) = first_new {
            match self.end_state_pool(n.addr) {
                Some(p) if p.is_private() => {
                    known_from_end = Some(p);
                    pools.push(p);
                }
                _ => {
                    if scope.is_private() {
                        pools.push(scope);
                    }
                    if !self.revised.contains_key(&j) {
                        pools.push(PoolId::DEFAULT);
                    }
                    pools.push(PoolId(u64::MAX, self.next_provisional));
                }
            }
        } else {
            pools.push(scope);
        }
        if let Some(p) = known_from_end {
            // The private pool the scope was using gets its real name now.
            if scope.is_private() && scope.0 == u64::MAX && !self.model.private_pools().contains(&p)
            {
                self.model.rename_pool(scope, p);
                self.renames.insert(scope, p);
                self.ride_off();
                self.inferred.push(Inference {
                    event_index: j as u32,
                    kind: "private_pool",
                    detail: format!("the private pool used since earlier on stream {stream:#x} is {p:?} (its segment survives to the end)"),
                });
            }
        }
        let pools = pools.as_slice();
        let interps: &[Interp] = if !leading_free {
            &[Interp::Ladder]
        } else if is_oom || self.capacity.is_some() {
            &[Interp::Ladder, Interp::EmptyFirst]
        } else {
            &[Interp::EmptyFirst, Interp::Ladder]
        };
        if leading_free {
            self.release_private_pools_in(i, group_all);
        }
        let combos = interps
            .iter()
            .flat_map(|&it| pools.iter().map(move |&p| (it, p)));
        let req_for = |p: PoolId| AllocRequest {
            size_bytes: last.size,
            stream,
            pool: p,
        };
        let mut chosen = (interps[0], pools[0]);
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        let result;
        let oracle = self.capacity.is_none();
        if interps.len() * pools.len() == 1 {
            let dev = RecordedDevice::new(&seg_events, oracle, &self.synth);
            let (r, synth) =
                Self::run_malloc(&mut self.model, dev, chosen.0, &req_for(chosen.1), &mut out);
            result = r;
            self.keep_synth(synth);
        } else {
            let mut found = None;
            for (it, p) in combos {
                let mut trial = self.model.clone();
                let mut o = Vec::new();
                let dev = RecordedDevice::new(&seg_events, oracle, &self.synth);
                let (r, synth) = Self::run_malloc(&mut trial, dev, it, &req_for(p), &mut o);
                if events_match(group_all, &o) {
                    found = Some((it, p, trial, o, r, synth));
                    break;
                }
            }
            if let Some((it, p, trial, o, r, synth)) = found {
                chosen = (it, p);
                self.model = trial;
                self.keep_synth(synth);
                out = o;
                result = r;
            } else {
                let dev = RecordedDevice::new(&seg_events, oracle, &self.synth);
                let (r, synth) =
                    Self::run_malloc(&mut self.model, dev, chosen.0, &req_for(chosen.1), &mut out);
                result = r;
                self.keep_synth(synth);
            }
        }
        let (interp, pool) = chosen;
        let default_over_private =
            pool == PoolId::DEFAULT && pools.last().is_some_and(|p| p.is_private());
        for e in seg_events
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
        {
            self.creations.push(Creation {
                group_end: j,
                segment_addr: e.addr,
                default_over_private,
            });
        }
        let revision = self.revised.get(&j).copied().filter(|_| pool.is_private());
        let new_pool = pool.0 == u64::MAX && pool.1 == self.next_provisional;
        if new_pool {
            self.next_provisional += 1;
        }
        if let Some(r) = revision {
            self.inferred.push(Inference {
                event_index: j as u32,
                kind: "private_pool",
                detail: format!(
                    "the request of {} on stream {stream:#x} used a private pool (MemPool or CUDA graph): the default pool explains its own events as well, but then release_cached_blocks, which frees the default pools' cached segments before any private pool's, would free its segment {:#x} at event {} where the recording frees another",
                    crate::units::format_size(last.size),
                    r.segment_addr,
                    r.release_at
                ),
            });
        } else if new_pool {
            self.inferred.push(Inference {
                event_index: j as u32,
                kind: "private_pool",
                detail: format!(
                    "the request of {} on stream {stream:#x} cannot have come from the default pool: it used a private pool (MemPool or CUDA graph)",
                    crate::units::format_size(last.size)
                ),
            });
        }
        if interp == Interp::EmptyFirst {
            self.op(i, OpKind::EmptyCache, 0);
            self.inferred.push(Inference {
                event_index: i as u32,
                kind: "empty_cache",
                detail: format!("empty_cache() was called before event {i} (segment releases outside the malloc's own path)"),
            });
        }
        let dev = self.device;
        let hint = if leading_free && self.capacity.is_none() {
            if self.model.config().garbage_collection_threshold > 0.0 {
                "; unknown: the memory cap (not recorded in the snapshot) — the recording released only some cached segments, which garbage_collection_threshold does under a cap: pass --capacity"
            } else {
                "; unknown: the memory cap (not recorded in the snapshot): pass --capacity if the program set one"
            }
        } else {
            ""
        };
        let ctx = move || {
            format!(
                "device {dev}: malloc of {} ({} bytes) on stream {stream:#x}, pool {pool:?}{}{hint}",
                crate::units::format_size(last.size),
                last.size,
                if interp == Interp::EmptyFirst {
                    ", after an inferred empty_cache()"
                } else {
                    ""
                }
            )
        };
        self.cmp.compare(i, group_all, &out, &ctx);
        self.out = out;
        // The stream's scope changes only where the pool does (most groups keep it).
        if !is_oom && pool != scope {
            self.scope.insert(stream, pool);
        }
        let pool_ix = self.pools.intern(pool);
        let op = self.op(
            j,
            OpKind::Alloc {
                size_bytes: last.size,
                stream,
                pool: pool_ix,
                recorded_oom: is_oom,
                restored: false,
            },
            if is_oom { 0 } else { last.addr },
        );
        if !is_oom {
            self.live.insert(last.addr, op);
        }
        match result {
            Ok(a) => self.ride_end(Some(a)),
            Err(()) => self.ride_off(),
        }
        if result.is_ok() == is_oom {
            // Already counted as a divergence by the comparison.
        }
        self.note_peak();
    }

    /// A CUDA-graph checkpoint restore of one segment (`setCheckpointPoolState` →
    /// `setSegmentStateToCheckpoint`, which records only ordinary `alloc`s and `free`s):
    /// from event `i`, allocs with nothing between them that tile a wholly free segment of
    /// a private pool from its base, each where the previous one ended, in block sizes —
    /// which mallocs do not reproduce. Returns the end of the run (exclusive), the pool and
    /// the stream.
    pub(super) fn restore_run(&self, i: usize) -> Option<(usize, PoolId, u64)> {
        let first = self.events[i];
        if first.action != Action::Alloc {
            return None;
        }
        let (pool, stream, _) = self.model.segment_of(first.addr)?;
        if !pool.is_private() || stream != first.stream {
            return None;
        }
        let (segment_bytes, whole) = self.model.free_block_at(first.addr)?;
        if !whole {
            return None;
        }
        let end_addr = first.addr + segment_bytes;
        let mut at = first.addr;
        let mut end = i;
        while at < end_addr {
            let e = self.events.get(end)?;
            if e.action != Action::Alloc
                || e.addr != at
                || e.stream != stream
                || e.size == 0
                || e.size % MIN_BLOCK_BYTES != 0
            {
                return None;
            }
            at += e.size;
            end += 1;
        }
        if at != end_addr {
            return None;
        }
        // Mallocs first: a restore only where they cannot explain the run.
        let mut trial = self.model.clone();
        let mut dev = RecordedDevice::new(&[], self.capacity.is_none(), &self.synth);
        let mut out = Vec::new();
        for e in &self.events[i..end] {
            out.clear();
            let req = AllocRequest {
                size_bytes: e.size,
                stream,
                pool,
            };
            let _ = trial.malloc(&mut dev, &req, &mut out);
            if !events_match(std::slice::from_ref(e), &out) {
                return Some((end, pool, stream));
            }
        }
        None
    }

    /// Applies the restore run `i..end` found by [`Self::restore_run`]: each block taken in
    /// place ([`Allocator::alloc_at`]).
    pub(super) fn restore_segment(&mut self, i: usize, end: usize, pool: PoolId, stream: u64) {
        self.ride_off();
        let events = self.events;
        let base = events[i].addr;
        for (x, e) in events.iter().enumerate().take(end).skip(i) {
            let req = AllocRequest {
                size_bytes: e.size,
                stream,
                pool,
            };
            let mut out = Vec::new();
            let mut dev = RecordedDevice::new(&[], self.capacity.is_none(), &self.synth);
            // The run was checked to fit: `alloc_at` takes the block in place.
            let _ = self.model.alloc_at(&mut dev, &req, e.addr, &mut out);
            self.keep_synth(dev.into_synth());
            let dev_n = self.device;
            self.cmp
                .compare(x, std::slice::from_ref(e), &out, &move || {
                    format!(
                        "device {dev_n}: block {x} of the checkpoint restore of segment {base:#x}"
                    )
                });
            let pool_ix = self.pools.intern(pool);
            let op = self.op(
                x,
                OpKind::Alloc {
                    size_bytes: e.size,
                    stream,
                    pool: pool_ix,
                    recorded_oom: false,
                    restored: true,
                },
                e.addr,
            );
            self.live.insert(e.addr, op);
        }
        self.scope.insert(stream, pool);
        self.note_peak();
        self.inferred.push(Inference {
            event_index: i as u32,
            kind: "checkpoint_restore",
            detail: format!(
                "events {i}..{} re-create the blocks of segment {base:#x} of private pool {pool:?} as a CUDA-graph checkpoint held them (setCheckpointPoolState): each taken in place, in the segment's own pool, split wherever bytes remain — not by malloc",
                end - 1
            ),
        });
    }

    pub(super) fn empty_cache_group(&mut self, i: usize, j: usize) {
        self.ride_off();
        let events = self.events;
        let group = &events[i..j];
        self.release_private_pools_in(i, group);
        let seg_events = self.segment_group(i, j);
        let mut dev = RecordedDevice::new(&seg_events, self.capacity.is_none(), &self.synth);
        let mut out = Vec::new();
        self.model.empty_cache(&mut dev, &mut out);
        self.keep_synth(dev.into_synth());
        let dev_n = self.device;
        self.cmp.compare(i, group, &out, &move || {
            format!("device {dev_n}: empty_cache() inferred before event {i}")
        });
        self.op(i, OpKind::EmptyCache, 0);
        self.inferred.push(Inference {
            event_index: i as u32,
            kind: "empty_cache",
            detail: format!(
                "empty_cache() was called before event {i} (segment releases outside any malloc)"
            ),
        });
    }
}
