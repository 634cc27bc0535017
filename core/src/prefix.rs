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
//! collection) replayed whole, each split limit forked from it, each threshold forked
//! from its split limit's replay (or from the root) — where a node is forked as soon as
//! it or any setting under it can act (forking earlier than needed is exact too). A
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
}

/// When a setting can first act, as seen on the replay it is watched on.
#[derive(Clone, Copy)]
struct Trigger {
    /// Acts once a segment or a rounded request reaches this many bytes.
    split: u64,
    /// Acts once reserved memory before an op is above this many bytes.
    reserved_above: u64,
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

/// When `t` or any setting under it can first act on the replay of `node`: forking `t`
/// earlier than it needs is exact too, and its children are watched from there.
fn earliest(node: &PyTorchConfig, t: &Target, limit: Option<u64>) -> Trigger {
    t.children.iter().map(|c| earliest(node, c, limit)).fold(
        trigger(node, &t.cfg, limit),
        |a, b| Trigger {
            split: a.split.min(b.split),
            reserved_above: a.reserved_above.min(b.reserved_above),
        },
    )
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

/// Whether `t` or any setting under it decides the malloc `n` sees otherwise than `node`.
fn acts(node: &PyTorchConfig, t: &Target, n: &Next<'_>) -> bool {
    decides_otherwise(node, &t.cfg, n) || t.children.iter().any(|c| acts(node, c, n))
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
    let mut roots: Vec<Target> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let Some(cfg) = forkable(spec, &plain) else {
            done(
                i,
                None,
                session::replay_device(trace, device, spec, capacity, opts),
            );
            continue;
        };
        let same_root = |r: &Target| {
            r.cfg.roundup_power2_divisions == cfg.roundup_power2_divisions
                && r.cfg.expandable_segments == cfg.expandable_segments
        };
        let root = if let Some(r) = roots.iter().position(same_root) {
            r
        } else {
            let mut c = plain.clone();
            c.roundup_power2_divisions = cfg.roundup_power2_divisions;
            c.expandable_segments = cfg.expandable_segments;
            roots.push(Target {
                index: None,
                cfg: c,
                children: Vec::new(),
            });
            roots.len() - 1
        };
        place(&mut roots[root], i, cfg);
    }
    for root in roots {
        let (model, dev, preloaded) = session::pytorch_start(trace, device, &root.cfg, capacity);
        let mut model = model;
        let mut opts = opts;
        opts.preloaded |= preloaded;
        let limit = model.limit_bytes();
        let mut run = ReplayRun::new(
            &mut model,
            dev,
            capacity,
            opts,
            dt.initial_ops,
            Some(dt.ops.len()),
        );
        run.set_pools(&dt.pools);
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

/// Puts setting `cfg` (spec `index`) under `root`: the root itself, a split limit's node,
/// or a threshold under its split limit's node (made if not asked for).
fn place(root: &mut Target, index: usize, cfg: PyTorchConfig) {
    let no_gc = |c: &PyTorchConfig| c.garbage_collection_threshold == 0.0;
    let same_split = |c: &PyTorchConfig| c.max_split_size_bytes == cfg.max_split_size_bytes;
    if same_split(&root.cfg) && no_gc(&cfg) && root.index.is_none() {
        root.index = Some(index);
        root.cfg = cfg;
        return;
    }
    if no_gc(&cfg)
        && let Some(node) = root
            .children
            .iter_mut()
            .find(|c| c.index.is_none() && same_split(&c.cfg) && no_gc(&c.cfg))
    {
        // The node made for its thresholds, asked for itself.
        node.index = Some(index);
        node.cfg = cfg;
        return;
    }
    if same_split(&root.cfg) || no_gc(&cfg) {
        root.children.push(Target {
            index: Some(index),
            cfg,
            children: Vec::new(),
        });
        return;
    }
    // A threshold with a split limit: under the split limit's node.
    let node = if let Some(n) = root
        .children
        .iter()
        .position(|c| no_gc(&c.cfg) && same_split(&c.cfg))
    {
        n
    } else {
        let mut c = cfg.clone();
        c.garbage_collection_threshold = 0.0;
        root.children.push(Target {
            index: None,
            cfg: c,
            children: Vec::new(),
        });
        root.children.len() - 1
    };
    root.children[node].children.push(Target {
        index: Some(index),
        cfg,
        children: Vec::new(),
    });
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
    let mut pending: Vec<(Target, Trigger)> = node
        .children
        .into_iter()
        .map(|c| {
            let t = earliest(&node.cfg, &c, limit);
            (c, t)
        })
        .collect();
    let soonest = |p: &[(Target, Trigger)]| {
        p.iter().fold((u64::MAX, u64::MAX), |(s, r), (_, t)| {
            (s.min(t.split), r.min(t.reserved_above))
        })
    };
    let (mut next_split, mut next_reserved) = soonest(&pending);
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
            // closer only when either setting could act.
            if largest >= next_split
                || reserved > next_reserved
                || run.model().round_size(size_bytes) >= next_split
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
                // A trigger depends on the settings alone: it is recomputed only where
                // a setting left.
                let mut changed = false;
                let mut i = 0;
                while i < pending.len() {
                    // What the look closer was not for: no setting of this subtree can
                    // act before its earliest trigger.
                    let soon = pending[i].1;
                    if largest < soon.split
                        && reserved <= soon.reserved_above
                        && peek.rounded < soon.split
                    {
                        i += 1;
                        continue;
                    }
                    if decides_otherwise(&node.cfg, &pending[i].0.cfg, &next) {
                        let (child, _) = pending.swap_remove(i);
                        fork(dt, k, &run, child, limit, largest, done);
                        changed = true;
                        continue;
                    }
                    // A setting under it that acts here (a threshold) has decided as
                    // this replay so far, its split limit too: it leaves its node,
                    // forked alone from here, and the node is watched on.
                    let c = &mut pending[i].0;
                    let before = c.children.len();
                    let mut j = 0;
                    while j < c.children.len() {
                        if acts(&node.cfg, &c.children[j], &next) {
                            let g = c.children.swap_remove(j);
                            fork(dt, k, &run, g, limit, largest, done);
                        } else {
                            j += 1;
                        }
                    }
                    if c.index.is_none() && c.children.is_empty() {
                        pending.swap_remove(i);
                        changed = true;
                    } else {
                        if c.children.len() != before {
                            pending[i].1 = earliest(&node.cfg, &pending[i].0, limit);
                            changed = true;
                        }
                        i += 1;
                    }
                }
                if changed {
                    (next_split, next_reserved) = soonest(&pending);
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
    for (child, _) in pending {
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
