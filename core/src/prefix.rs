//! Replays of PyTorch settings that share their common prefix: each setting is replayed
//! as a copy of a replay it agrees with, forked at the first op where it can decide
//! differently (`recommend`'s sweep, [`crate::whatif::Sweep`], natively and on the
//! browser's search workers).
//!
//! Of the settings `recommend` sweeps, two act only where the replay of a setting without
//! them shows in advance (pytorch-allocator.md §4–§5.6; every read of the model's `cfg`):
//!
//! - `max_split_size_mb` M is read by `get_free_block` (a found block of M or more, or a
//!   request of M or more), `should_split` (a request of M or more, for a block of the
//!   large pool without expandable segments, where more than 1 MiB would remain) and,
//!   after a failed `cudaMalloc`, `release_available_cached_blocks` (which frees only
//!   blocks of M or more). Before a malloc whose rounded request or found block reaches M,
//!   or that takes no block while a block of M could exist (a segment of M was made; with
//!   expandable segments, M bytes were reserved), every decision is the one without it.
//! - `garbage_collection_threshold` T under a limit L acts only in a `malloc` that takes
//!   no free block while reserved memory is above `(T × L) as u64`, and only where the
//!   collection releases a block ([`PyTorchModel::peek_collects`]); one that releases
//!   nothing changes nothing. The blocks' ages it reads (`get_free_blocks_call_count`) are
//!   counted under every setting, so a copy carries them.
//!
//! [`PyTorchModel::peek_malloc`] says what the malloc of the next op would find, without
//! changing anything; where a setting could act there, every read of it in that malloc is
//! compared with the watched replay's before it runs (`decides_otherwise`: the oversize
//! rules, `should_split`, the collection, and the release of available blocks where the
//! first `cudaMalloc` may fail), and the setting is forked only where one decides
//! otherwise. `roundup_power2_divisions` (read by `round_size` on every request)
//! and `expandable_segments` (from the first segment) are never forked across: the
//! settings are grouped by them, each group a tree — its root (no split limit, no
//! collection) replayed whole, the split limits a chain under it (the largest watched on
//! the root's replay, each smaller one on the next larger one's: a request or block
//! between two limits is the first thing they can decide otherwise on), each threshold
//! under its split limit (or the root). A setting that decides a malloc otherwise than
//! the replay it is watched on is forked from it there with the settings under it (they
//! agree with it so far); the others stay, and those under them are looked at. A
//! setting that never acts ends as the replay it agrees with, under its own name. Any
//! other setting (another key, the snapshot's own settings, another allocator) is
//! replayed whole. Exact: `core/tests/prefix.rs` replays every candidate of the sweep
//! both ways on every shared trace (the incoming ones too) and two synthetic workloads,
//! at four capacities, and compares the whole results.

use crate::Error;
use crate::models::pytorch::{MallocPeek, PyTorchConfig, PyTorchModel, SMALL_SIZE_BYTES};
use crate::models::{AllocRequest, AllocatorKind, ModelSpec};
use crate::replay::{ReplayOptions, ReplayResult, ReplayRun};
use crate::session;
use crate::snapshot::Action;
use crate::trace::{DeviceTrace, OpKind, Trace};

/// Called as each replay ends: the spec's index, the op its replay was forked at (None:
/// replayed whole from the start), its result.
pub type Done<'a> = dyn FnMut(usize, Option<usize>, Result<ReplayResult, Error>) + 'a;

/// A setting watched on a replay it agrees with so far.
struct Target {
    /// The spec asked for (None: a node kept only for its children).
    index: Option<usize>,
    cfg: PyTorchConfig,
    /// Settings that agree with this one so far, forked from it where they first act.
    children: Vec<Target>,
    /// When it or any setting under it can first act on the replay it is watched on
    /// ([`watch`]).
    soon: Trigger,
}

impl Target {
    fn new(index: Option<usize>, cfg: PyTorchConfig) -> Target {
        Target {
            index,
            cfg,
            children: Vec::new(),
            soon: NEVER,
        }
    }
}

/// When a setting can first act, as seen on the replay it is watched on.
#[derive(Clone, Copy)]
struct Trigger {
    /// Acts once a segment or a rounded request reaches this many bytes.
    split: u64,
    /// Acts once reserved memory before an op is above this many bytes.
    reserved_above: u64,
}

const NEVER: Trigger = Trigger {
    split: u64::MAX,
    reserved_above: u64::MAX,
};

impl Trigger {
    fn min(self, o: Trigger) -> Trigger {
        Trigger {
            split: self.split.min(o.split),
            reserved_above: self.reserved_above.min(o.reserved_above),
        }
    }

    /// Whether nothing it stands for can act before a malloc that sees blocks of up to
    /// `largest` bytes, `reserved` bytes reserved and a request rounded to `rounded`.
    fn not_yet(self, largest: u64, reserved: u64, rounded: u64) -> bool {
        largest < self.split && reserved <= self.reserved_above && rounded < self.split
    }
}

fn trigger(node: &PyTorchConfig, cfg: &PyTorchConfig, limit: Option<u64>) -> Trigger {
    let split = if cfg.max_split_size_bytes == node.max_split_size_bytes {
        u64::MAX
    } else {
        cfg.max_split_size_bytes.min(node.max_split_size_bytes)
    };
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let reserved_above = match limit {
        // As `garbage_collect` computes it.
        Some(l)
            if cfg.garbage_collection_threshold.to_bits()
                != node.garbage_collection_threshold.to_bits() =>
        {
            (cfg.garbage_collection_threshold * l as f64) as u64
        }
        _ => u64::MAX,
    };
    Trigger {
        split,
        reserved_above,
    }
}

/// Sets `t.soon` (and its children's) to when `t` or any setting under it can first act
/// on the replay of `node`, and returns it: forking `t` earlier than it needs is exact
/// too, and its children are watched from there.
fn watch(node: &PyTorchConfig, t: &mut Target, limit: Option<u64>) -> Trigger {
    let mut soon = trigger(node, &t.cfg, limit);
    for c in &mut t.children {
        soon = soon.min(watch(node, c, limit));
    }
    t.soon = soon;
    soon
}

/// What the next malloc of the replay of a node meets, read before it runs.
struct Next<'a> {
    model: &'a PyTorchModel,
    req: &'a AllocRequest,
    peek: MallocPeek,
    /// `alloc_block`'s first try certainly gets a segment (where no block is taken).
    fits: bool,
    /// Reserved memory before the malloc.
    reserved: u64,
    limit: Option<u64>,
}

/// Whether `cfg` decides the malloc `n` sees otherwise than `node` does, every read of
/// the two settings in it compared (malloc.rs, blocks.rs, release.rs, gc.rs):
/// `get_free_block`'s oversize rules on the block found, `should_split`'s `size <
/// max_split_size` (on the block found or the new segment), and where no block is taken,
/// the collection (reserved memory above `cfg`'s threshold) and, where the new segment
/// may not be had, `release_available_cached_blocks` (which, where it releases nothing
/// under either limit, answers as without one).
fn decides_otherwise(node: &PyTorchConfig, cfg: &PyTorchConfig, n: &Next<'_>) -> bool {
    let t = trigger(node, cfg, n.limit);
    let p = &n.peek;
    if t.split != u64::MAX {
        let (m, m0) = (cfg.max_split_size_bytes, node.max_split_size_bytes);
        if p.found.is_some_and(|b| {
            n.model.oversize_refuses(p.rounded, b, m) != n.model.oversize_refuses(p.rounded, b, m0)
        }) || split_otherwise(n, m, m0)
            || (!p.taken
                && !n.fits
                && (n.model.peek_releases(n.req, m) || n.model.peek_releases(n.req, m0)))
        {
            return true;
        }
    }
    !p.taken && n.reserved > t.reserved_above && n.model.peek_collects()
}

/// Whether `should_split` answers otherwise under the split limits `m` and `m0` for the
/// block the malloc `n` sees will split, where the oversize rules took the same course
/// under both: the block found where it is taken, else the new segment
/// (`get_allocation_size`: after a collection or a release too, where those decide
/// alike). It reads the limit only for a large block without expandable segments, and
/// only where more than `kSmallSize` would remain (blocks.rs): a request of the size of
/// its block, or within 1 MiB of it, is not split under either limit.
fn split_otherwise(n: &Next<'_>, m: u64, m0: u64) -> bool {
    let p = &n.peek;
    if (p.rounded < m) == (p.rounded < m0)
        || n.model.config().expandable_segments
        || p.rounded <= SMALL_SIZE_BYTES
    {
        return false;
    }
    let block = match p.found {
        Some(b) if p.taken => b,
        _ => n.model.allocation_size(p.rounded),
    };
    block.saturating_sub(p.rounded) > SMALL_SIZE_BYTES
}

/// Takes out of `ts` (settings watched on the replay of `node`) into `forks` every one
/// that decides the malloc `n` sees otherwise, with the settings under it (they agree
/// with it so far), and looks under each that does not; skips those whose `soon` is not
/// reached (`largest`: the largest block that can exist). Returns whether `ts` changed
/// (its `soon`s are kept true).
fn take_acting(
    node: &PyTorchConfig,
    ts: &mut Vec<Target>,
    n: &Next<'_>,
    largest: u64,
    forks: &mut Vec<Target>,
) -> bool {
    let mut changed = false;
    let mut i = 0;
    while i < ts.len() {
        if ts[i].soon.not_yet(largest, n.reserved, n.peek.rounded) {
            i += 1;
            continue;
        }
        if decides_otherwise(node, &ts[i].cfg, n) {
            forks.push(ts.swap_remove(i));
            changed = true;
            continue;
        }
        let t = &mut ts[i];
        if take_acting(node, &mut t.children, n, largest, forks) {
            changed = true;
            if t.index.is_none() && t.children.is_empty() {
                ts.swap_remove(i);
                continue;
            }
            // A trigger depends on the settings alone: recomputed only where one left.
            t.soon = t
                .children
                .iter()
                .fold(trigger(node, &t.cfg, n.limit), |a, c| a.min(c.soon));
        }
        i += 1;
    }
    changed
}

/// Replays `specs` on device `device` of `trace` at `capacity` with `opts`, sharing
/// prefixes as the module says; `done` is called once per spec as its replay ends (in no
/// set order). Each result is the one [`session::replay_device`] gives.
pub fn replay_sharing(
    trace: &Trace,
    device: usize,
    specs: &[ModelSpec],
    capacity: Option<u64>,
    opts: ReplayOptions,
    done: &mut Done<'_>,
) -> Result<(), Error> {
    let dt = trace
        .devices
        .get(device)
        .ok_or(Error::Query(crate::QueryError::NoDevice { device }))?;
    let plain = PyTorchConfig::parse("").map_err(|e| Error::Config(e.into()))?;
    // Per group of divisions: its root and the settings under it.
    // Per group of divisions: its base (no split limit, no collection) and the settings
    // in it.
    let mut groups: Vec<(PyTorchConfig, Vec<(usize, PyTorchConfig)>)> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let Some(cfg) = forkable(spec, &plain) else {
            done(
                i,
                None,
                session::replay_device(trace, device, spec, capacity, opts),
            );
            continue;
        };
        let same_root = |(b, _): &(PyTorchConfig, _)| {
            b.roundup_power2_divisions == cfg.roundup_power2_divisions
                && b.expandable_segments == cfg.expandable_segments
        };
        if let Some(g) = groups.iter_mut().find(|g| same_root(g)) {
            g.1.push((i, cfg));
        } else {
            let mut base = plain.clone();
            base.roundup_power2_divisions = cfg.roundup_power2_divisions;
            base.expandable_segments = cfg.expandable_segments;
            groups.push((base, vec![(i, cfg)]));
        }
    }
    let roots = groups
        .into_iter()
        .map(|(base, settings)| tree(&base, &settings));
    for root in roots {
        let (model, dev, preloaded) = session::pytorch_start(trace, device, &root.cfg, capacity);
        let mut model = model;
        let mut opts = opts;
        opts.preloaded |= preloaded;
        let limit = model.limit_bytes();
        let run = ReplayRun::over(dt, &mut model, dev, capacity, opts);
        let largest = if root.cfg.expandable_segments {
            // A mapped block is never larger than the memory reserved.
            run.model().reserved_bytes()
        } else {
            // A block is never larger than its segment.
            dt.start.iter().map(|s| s.size_bytes).max().unwrap_or(0)
        };
        drive(dt, 0, run, root, limit, largest, done);
    }
    Ok(())
}

/// The setting of `spec` where it is PyTorch's defaults but for the settings this module
/// forks (`plain`: the defaults).
fn forkable(spec: &ModelSpec, plain: &PyTorchConfig) -> Option<PyTorchConfig> {
    let cfg = match (spec.kind, &spec.config) {
        (AllocatorKind::Pytorch, Some(c)) => PyTorchConfig::parse(c).ok()?,
        _ => return None,
    };
    cfg.same_but_swept(plain).then_some(cfg)
}

/// A root's settings: divisions and expandable segments (None: replayed whole).
type Root = Option<([u32; 16], bool)>;

/// `specs` shared out into at least `groups` parts (indices into `specs`, none empty)
/// for [`replay_sharing`] calls that run apart (threads, workers): the settings of one
/// root (divisions and expandable segments alike) together, the largest part split in
/// two while there are fewer than `groups`; the largest part first.
#[must_use]
pub fn share(specs: &[ModelSpec], groups: usize) -> Vec<Vec<usize>> {
    let Ok(plain) = PyTorchConfig::parse("") else {
        return vec![(0..specs.len()).collect()];
    };
    let mut keyed: Vec<(Root, Vec<usize>)> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let key =
            forkable(spec, &plain).map(|c| (c.roundup_power2_divisions, c.expandable_segments));
        match keyed.iter_mut().find(|(k, _)| key.is_some() && *k == key) {
            Some((_, v)) => v.push(i),
            None => keyed.push((key, vec![i])),
        }
    }
    let mut parts: Vec<Vec<usize>> = keyed.into_iter().map(|(_, v)| v).collect();
    loop {
        parts.sort_by_key(|p| std::cmp::Reverse(p.len()));
        if parts.len() >= groups || parts.first().is_none_or(|p| p.len() < 2) {
            return parts;
        }
        let largest = parts.remove(0);
        let (a, b) = largest.split_at(largest.len() / 2);
        parts.push(a.to_vec());
        parts.push(b.to_vec());
    }
}

/// The tree of one group's `settings` (spec index, setting) on its `base`: the root
/// (no split limit) holds the largest split limit's node, each split limit's node the
/// next smaller one's (a smaller limit decides as a larger one until a request or block
/// between the two comes: `max_split_size_mb:256` is watched on the replay of 512, not
/// of the defaults), and each node its collection thresholds (leaves) and a setting asked
/// twice. A node no spec asks for itself is kept only for the settings under it.
fn tree(base: &PyTorchConfig, settings: &[(usize, PyTorchConfig)]) -> Target {
    let mut limits: Vec<u64> = settings
        .iter()
        .map(|(_, c)| c.max_split_size_bytes)
        .filter(|&m| m != u64::MAX)
        .collect();
    limits.sort_unstable();
    limits.dedup();
    // From the smallest limit up to the root, each node holding the one below it.
    let mut below: Option<Target> = None;
    for m in limits.into_iter().chain([u64::MAX]) {
        let mut cfg = base.clone();
        cfg.max_split_size_bytes = m;
        let mut node = Target::new(None, cfg);
        for (i, c) in settings.iter().filter(|(_, c)| c.max_split_size_bytes == m) {
            if c.garbage_collection_threshold == 0.0 && node.index.is_none() {
                node.index = Some(*i);
                node.cfg = c.clone();
            } else {
                node.children.push(Target::new(Some(*i), c.clone()));
            }
        }
        node.children.extend(below.take());
        below = Some(node);
    }
    below.unwrap_or_else(|| Target::new(None, base.clone()))
}

/// Replays `ops[from..]` on `run` (the replay of `node`'s setting), forking each child
/// where it can first act; reports `node`'s own result at the end where it was asked for.
fn drive(
    dt: &DeviceTrace,
    from: usize,
    mut run: ReplayRun<'_, PyTorchModel>,
    node: Target,
    limit: Option<u64>,
    mut largest: u64,
    done: &mut Done<'_>,
) {
    let mut pending: Vec<Target> = node.children;
    let soonest = |p: &[Target]| p.iter().fold(NEVER, |a, t| a.min(t.soon));
    for c in &mut pending {
        watch(&node.cfg, c, limit);
    }
    let mut soon = soonest(&pending);
    for (k, op) in dt.ops.iter().enumerate().skip(from) {
        if pending.is_empty() && node.index.is_none() {
            return;
        }
        if let OpKind::Alloc {
            size_bytes,
            stream,
            pool,
            ..
        } = op.kind
            && !pending.is_empty()
        {
            let reserved = run.model().reserved_bytes();
            // A block of the split limit exists only once `largest` reaches it: look
            // closer only when some setting could act.
            if largest >= soon.split
                || reserved > soon.reserved_above
                || run.model().round_size(size_bytes) >= soon.split
            {
                let req = AllocRequest {
                    size_bytes,
                    stream,
                    pool: dt.pool(pool),
                };
                let peek = run.model().peek_malloc(&req);
                let next = Next {
                    model: run.model(),
                    req: &req,
                    peek,
                    fits: peek.taken || run.model().first_segment_fits(peek.rounded, run.device()),
                    reserved,
                    limit,
                };
                let mut forks = Vec::new();
                if take_acting(&node.cfg, &mut pending, &next, largest, &mut forks) {
                    soon = soonest(&pending);
                }
                for g in forks {
                    fork(dt, k, &run, g, limit, largest, done);
                }
            }
        }
        run.push(op);
        if node.cfg.expandable_segments {
            largest = largest.max(run.model().reserved_bytes());
        } else {
            for e in run.last_events() {
                if e.action == Action::SegmentAlloc {
                    largest = largest.max(e.size);
                }
            }
        }
    }
    // What never acted ends as this replay, under its own name.
    let len = dt.ops.len();
    for child in pending {
        fork(dt, len, &run, child, limit, largest, done);
    }
    if let Some(i) = node.index {
        done(i, Some(from), Ok(run.finish()));
    }
}

/// `child` forked from `run` before op `at`, then driven to the end.
fn fork(
    dt: &DeviceTrace,
    at: usize,
    run: &ReplayRun<'_, PyTorchModel>,
    child: Target,
    limit: Option<u64>,
    largest: u64,
    done: &mut Done<'_>,
) {
    let mut model = run.model().clone();
    model.set_config(child.cfg.clone());
    let forked = run.fork(&mut model);
    drive(dt, at, forked, child, limit, largest, done);
}
