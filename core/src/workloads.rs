//! Seeded synthetic workloads: a SPEC string becomes a [`Trace`] of requests (allocs,
//! frees, deferred frees and their completions, streams; no recording), replayable by every
//! model. The same SPEC always gives the same trace (`ChaCha8` from the `seed` parameter).
//!
//! SPEC syntax:
//!
//! ```text
//! SPEC  := KIND [ ':' PARAM { ',' PARAM } ]
//! PARAM := KEY '=' VALUE | KEY '=' VALUE '..' VALUE     (a range: drawn per use, inclusive)
//! VALUE := an integer, or for sizes a SIZE (`512`, `64MiB`, `1.5GB`)
//! ```
//!
//! Kinds (defaults in parentheses):
//! - `train` — transformer training steps whose batch and sequence length vary per step
//!   (the shape churn behind the caching allocator's fragmentation): `steps` (50),
//!   `batch` (4..16), `seq` (128..1024), `layers` (6), `hidden` (768), `vocab` (32000),
//!   `comm` (0; 1 puts gradient buckets on a second stream, freed with `record_stream`),
//!   `seed` (1). Weights and Adam states persist; activations are saved in the forward pass
//!   and freed in the backward pass; gradients are freed by `zero_grad(set_to_none=True)`.
//! - `kvcache` — greedy decode with a naively growing KV cache (`torch.cat` per token and
//!   layer, the old cache freed): `requests` (1), `prompt` (128), `tokens` (2000),
//!   `layers` (24), `hidden` (1024), `batch` (1), `seed` (1). `prompt` and `tokens` may be
//!   ranges, drawn per request. `kvcache:tokens=3000` gives over a million events.
//! - `oom-story` — the "CUDA out of memory with gigabytes free" story of the shared
//!   `oom_story` trace: one `block` (2GiB) allocated and freed, carved into `tensor`
//!   (180MiB) tensors, every other one freed, then a `request` (400MiB); replay it with
//!   `--capacity 2.2GiB`.
//! - `churn` — random allocations and frees around a target number of live blocks:
//!   `events` (1000000), `live` (1000), `size` (512..64MiB, log-uniform), `streams` (1),
//!   `seed` (1).
//!
//! Every workload is limited to [`MAX_EVENTS`] events.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::snapshot::StackId;
use crate::trace::{DeviceTrace, Op, OpKind, Trace};
use crate::units::parse_size;

/// The workload kinds, as SPEC spells them.
pub const KINDS: &[&str] = &["train", "kvcache", "oom-story", "churn"];

/// The most events one workload may produce.
pub const MAX_EVENTS: u64 = 20_000_000;

/// A SPEC that cannot be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("workload '{spec}': {message}")]
pub struct WorkloadError {
    pub spec: String,
    pub message: String,
}

/// A parameter value: one number, or a range drawn per use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    lo: u64,
    hi: u64,
}

impl Range {
    fn fixed(v: u64) -> Range {
        Range { lo: v, hi: v }
    }
}

/// Parsed parameters of one SPEC.
struct Params<'a> {
    spec: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    fn err(&self, message: impl Into<String>) -> WorkloadError {
        WorkloadError {
            spec: self.spec.to_string(),
            message: message.into(),
        }
    }

    fn parse(spec: &'a str, body: &'a str, known: &[&str]) -> Result<Params<'a>, WorkloadError> {
        let mut p = Params {
            spec,
            pairs: Vec::new(),
        };
        for part in body.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((k, v)) = part.split_once('=') else {
                return Err(p.err(format!("expected key=value, got '{part}'")));
            };
            let (k, v) = (k.trim(), v.trim());
            if !known.contains(&k) {
                return Err(p.err(format!(
                    "unknown parameter '{k}' (known: {})",
                    known.join(", ")
                )));
            }
            p.pairs.retain(|(key, _)| *key != k);
            p.pairs.push((k, v));
        }
        Ok(p)
    }

    fn raw(&self, key: &str) -> Option<&'a str> {
        self.pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    /// A count or a range of counts within `[min, max]`.
    fn range(&self, key: &str, default: Range, min: u64, max: u64) -> Result<Range, WorkloadError> {
        self.range_with(key, default, min, max, |v| {
            v.parse::<u64>().map_err(|e| e.to_string())
        })
    }

    /// A size (SIZE syntax) or a range of sizes within `[min, max]`.
    fn size_range(
        &self,
        key: &str,
        default: Range,
        min: u64,
        max: u64,
    ) -> Result<Range, WorkloadError> {
        self.range_with(key, default, min, max, parse_size)
    }

    fn range_with(
        &self,
        key: &str,
        default: Range,
        min: u64,
        max: u64,
        parse: impl Fn(&str) -> Result<u64, String>,
    ) -> Result<Range, WorkloadError> {
        let Some(v) = self.raw(key) else {
            return Ok(default);
        };
        let bad = |e: String| self.err(format!("{key}: {e}"));
        let r = match v.split_once("..") {
            Some((lo, hi)) => Range {
                lo: parse(lo.trim()).map_err(bad)?,
                hi: parse(hi.trim()).map_err(bad)?,
            },
            None => Range::fixed(parse(v).map_err(bad)?),
        };
        if r.lo > r.hi {
            return Err(self.err(format!("{key}: the range {}..{} is empty", r.lo, r.hi)));
        }
        if r.lo < min || r.hi > max {
            return Err(self.err(format!("{key} must be within {min}..{max}, got {v}")));
        }
        Ok(r)
    }

    /// One number within `[min, max]`.
    fn one(&self, key: &str, default: u64, min: u64, max: u64) -> Result<u64, WorkloadError> {
        let r = self.range(key, Range::fixed(default), min, max)?;
        if r.lo != r.hi {
            return Err(self.err(format!("{key} takes one value, not a range")));
        }
        Ok(r.lo)
    }

    fn check_events(&self, bound: u64) -> Result<(), WorkloadError> {
        if bound > MAX_EVENTS {
            return Err(self.err(format!(
                "it would produce up to {bound} events (at most {MAX_EVENTS})"
            )));
        }
        Ok(())
    }
}

/// Uniform integers from `ChaCha8`, without modulo bias (rejection sampling).
struct Rng(ChaCha8Rng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }

    /// Uniform in `[lo, hi]`.
    fn uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let span = (hi - lo).wrapping_add(1);
        if span == 0 {
            return self.0.next_u64();
        }
        let zone = u64::MAX - (u64::MAX - span + 1) % span;
        loop {
            let x = self.0.next_u64();
            if x <= zone {
                return lo + x % span;
            }
        }
    }

    fn draw(&mut self, r: Range) -> u64 {
        self.uniform(r.lo, r.hi)
    }

    /// Log-uniform in `[lo, hi]`: the exponent uniform, then the value uniform within it.
    fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let (elo, ehi) = (lo.max(1).ilog2(), hi.max(1).ilog2());
        let e = self.uniform(u64::from(elo), u64::from(ehi)) as u32;
        let a = (1u64 << e).max(lo);
        let b = if e >= 63 {
            hi
        } else {
            ((1u64 << (e + 1)) - 1).min(hi)
        };
        self.uniform(a, b.max(a))
    }
}

/// Appends ops, with a synthetic clock (1 µs per op).
#[derive(Default)]
struct Builder {
    ops: Vec<Op>,
}

impl Builder {
    fn push(&mut self, kind: OpKind) -> u32 {
        let k = self.ops.len() as u32;
        self.ops.push(Op {
            kind,
            event_index: k,
            recorded_addr: 0,
            stack: StackId::EMPTY,
            time_us: i64::from(k),
        });
        k
    }

    fn alloc_on(&mut self, size_bytes: u64, stream: u64) -> u32 {
        self.push(OpKind::Alloc {
            size_bytes,
            stream,
            pool: crate::trace::PoolIx::DEFAULT,
            recorded_oom: false,
            restored: false,
        })
    }

    fn alloc(&mut self, size_bytes: u64) -> u32 {
        self.alloc_on(size_bytes, 0)
    }

    fn free(&mut self, alloc: u32) {
        self.push(OpKind::Free {
            alloc,
            deferred: false,
        });
    }

    fn free_all(&mut self, allocs: &mut Vec<u32>) {
        for a in allocs.drain(..).rev() {
            self.free(a);
        }
    }

    fn finish(self) -> Trace {
        let events = self.ops.len();
        Trace {
            snapshot: crate::trace::SnapshotInfo::default(),
            devices: vec![DeviceTrace {
                device: 0,
                ops: self.ops,
                pools: Vec::new(),
                start: Vec::new(),
                inferred: Vec::new(),
                events,
                initial_ops: 0,
                segment_events: Vec::new(),
                capacity: crate::capacity::CapacityEvidence::default(),
            }],
        }
    }
}

/// Generates the trace a SPEC describes.
pub fn generate(spec: &str) -> Result<Trace, WorkloadError> {
    let spec = spec.trim();
    let (kind, body) = spec.split_once(':').unwrap_or((spec, ""));
    match kind.trim() {
        "train" => train(spec, body),
        "kvcache" => kvcache(spec, body),
        "oom-story" => oom_story(spec, body),
        "churn" => churn(spec, body),
        other => Err(WorkloadError {
            spec: spec.to_string(),
            message: format!("unknown kind '{other}' (known: {})", KINDS.join(", ")),
        }),
    }
}

const BF16: u64 = 2;
const FP32: u64 = 4;

#[allow(clippy::many_single_char_names)]
fn train(spec: &str, body: &str) -> Result<Trace, WorkloadError> {
    let p = Params::parse(
        spec,
        body,
        &[
            "steps", "batch", "seq", "layers", "hidden", "vocab", "comm", "seed",
        ],
    )?;
    let steps = p.one("steps", 50, 1, 1_000_000)?;
    let batch = p.range("batch", Range { lo: 4, hi: 16 }, 1, 1 << 16)?;
    let seq = p.range("seq", Range { lo: 128, hi: 1024 }, 1, 1 << 20)?;
    let layers = p.one("layers", 6, 1, 1000)?;
    let hidden = p.one("hidden", 768, 64, 1 << 16)?;
    let vocab = p.one("vocab", 32000, 1, 1 << 24)?;
    let comm = p.one("comm", 0, 0, 1)? == 1;
    let seed = p.one("seed", 1, 0, u64::MAX)?;
    let weights_per_layer = 6;
    let per_layer = weights_per_layer as usize;
    p.check_events(
        4 * layers * weights_per_layer
            + steps * (layers * (2 * 14 + 2 * 2 * weights_per_layer + 8) + 20),
    )?;
    let mut rng = Rng::new(seed);
    let mut b = Builder::default();
    let h = hidden;
    let heads = (h / 64).max(1);
    // Weights: qkv, out projection, MLP up and down, two layer norms; plus the embedding.
    let shapes = [3 * h * h, h * h, 4 * h * h, 4 * h * h, h, h];
    let mut weight_sizes: Vec<u64> = vec![vocab * h * BF16];
    for _ in 0..layers {
        weight_sizes.extend(shapes.iter().map(|s| s * BF16));
    }
    for &w in &weight_sizes {
        b.alloc(w);
    }
    let mut adam_ready = false;
    for _ in 0..steps {
        let (bs, s) = (rng.draw(batch), rng.draw(seq));
        let n = bs * s;
        let mut step: Vec<u32> = Vec::new();
        step.push(b.alloc(n * 8)); // input ids (int64)
        step.push(b.alloc(n * 8)); // labels
        let mut x = b.alloc(n * h * BF16); // embedding output
        let mut saved: Vec<Vec<u32>> = Vec::new();
        for _ in 0..layers {
            let mut keep = vec![x];
            keep.push(b.alloc(n * h * BF16)); // ln1 out
            keep.push(b.alloc(n * 2 * FP32)); // ln1 mean and rstd
            keep.push(b.alloc(n * 3 * h * BF16)); // qkv
            keep.push(b.alloc(n * h * BF16)); // attention out
            keep.push(b.alloc(bs * heads * s * FP32)); // softmax log-sum-exp
            let proj = b.alloc(n * h * BF16);
            let x1 = b.alloc(n * h * BF16); // residual
            b.free(proj);
            keep.push(x1);
            keep.push(b.alloc(n * h * BF16)); // ln2 out
            keep.push(b.alloc(n * 2 * FP32));
            keep.push(b.alloc(n * 4 * h * BF16)); // mlp up
            keep.push(b.alloc(n * 4 * h * BF16)); // gelu
            let down = b.alloc(n * h * BF16);
            x = b.alloc(n * h * BF16); // residual
            b.free(down);
            saved.push(keep);
        }
        let logits = b.alloc(n * vocab * BF16);
        let loss = b.alloc(FP32);
        let dlogits = b.alloc(n * vocab * BF16);
        b.free(logits);
        let mut dx = b.alloc(n * h * BF16);
        b.free(dlogits);
        b.free(x);
        let mut grads: Vec<u32> = vec![b.alloc(weight_sizes[0])];
        let mut buckets: Vec<u32> = Vec::new();
        for (l, mut keep) in saved.into_iter().enumerate().rev() {
            let dmlp = b.alloc(n * 4 * h * BF16);
            let layer_weights = &weight_sizes[1 + l * per_layer..=(l + 1) * per_layer];
            for &w in layer_weights {
                grads.push(b.alloc(w));
            }
            let dqkv = b.alloc(n * 3 * h * BF16);
            b.free(dmlp);
            let dnext = b.alloc(n * h * BF16);
            b.free(dqkv);
            b.free(dx);
            dx = dnext;
            b.free_all(&mut keep);
            if comm {
                // The layer's gradient bucket, all-reduced on the communication stream.
                let size: u64 = weight_sizes[1 + l * per_layer..=(l + 1) * per_layer]
                    .iter()
                    .sum();
                buckets.push(b.alloc_on(size, 1));
            }
        }
        b.free(dx);
        for a in buckets.drain(..) {
            b.push(OpKind::Free {
                alloc: a,
                deferred: true,
            });
            b.push(OpKind::CompleteFree { alloc: a });
        }
        if !adam_ready {
            for &w in &weight_sizes {
                b.alloc(w * 2); // exp_avg (fp32)
                b.alloc(w * 2); // exp_avg_sq (fp32)
            }
            adam_ready = true;
        }
        b.free_all(&mut grads);
        b.free(loss);
        b.free_all(&mut step);
    }
    Ok(b.finish())
}

#[allow(clippy::many_single_char_names)]
fn kvcache(spec: &str, body: &str) -> Result<Trace, WorkloadError> {
    let p = Params::parse(
        spec,
        body,
        &[
            "requests", "prompt", "tokens", "layers", "hidden", "batch", "seed",
        ],
    )?;
    let requests = p.one("requests", 1, 1, 100_000)?;
    let prompt = p.range("prompt", Range::fixed(128), 1, 1 << 20)?;
    let tokens = p.range("tokens", Range::fixed(2000), 1, 1 << 24)?;
    let layers = p.one("layers", 24, 1, 1000)?;
    let hidden = p.one("hidden", 1024, 64, 1 << 16)?;
    let batch = p.one("batch", 1, 1, 1 << 16)?;
    let seed = p.one("seed", 1, 0, u64::MAX)?;
    p.check_events(requests * (tokens.hi + 1) * (layers * 16 + 4))?;
    let mut rng = Rng::new(seed);
    let mut b = Builder::default();
    let h = hidden;
    let heads = (h / 64).max(1);
    let kv_token = batch * h * BF16;
    for _ in 0..requests {
        let (p0, t) = (rng.draw(prompt), rng.draw(tokens));
        let mut caches: Vec<(u32, u32)> = Vec::new();
        for _ in 0..layers {
            caches.push((b.alloc(p0 * kv_token), b.alloc(p0 * kv_token)));
        }
        for step in 0..t {
            let len = p0 + step + 1;
            let x = b.alloc(kv_token);
            for cache in &mut caches {
                let q = b.alloc(kv_token);
                // torch.cat((cache, new)): a new tensor, the old one freed.
                let k = b.alloc(len * kv_token);
                b.free(cache.0);
                let v = b.alloc(len * kv_token);
                b.free(cache.1);
                *cache = (k, v);
                let scores = b.alloc(batch * heads * len * FP32);
                let out = b.alloc(kv_token);
                b.free(scores);
                b.free(q);
                let up = b.alloc(batch * 4 * h * BF16);
                let down = b.alloc(kv_token);
                b.free(up);
                b.free(out);
                b.free(down);
            }
            let logits = b.alloc(batch * 32000 * FP32);
            b.free(logits);
            b.free(x);
        }
        for (k, v) in caches.drain(..).rev() {
            b.free(v);
            b.free(k);
        }
    }
    Ok(b.finish())
}

fn oom_story(spec: &str, body: &str) -> Result<Trace, WorkloadError> {
    const GIB: u64 = 1 << 30;
    let p = Params::parse(spec, body, &["block", "tensor", "request"])?;
    let block = p.size_range("block", Range::fixed(2 * GIB), 1, 1 << 50)?;
    let tensor = p.size_range("tensor", Range::fixed(180 << 20), 1, 1 << 50)?;
    let request = p.size_range("request", Range::fixed(400 << 20), 1, 1 << 50)?;
    let (block, tensor, request) = (block.hi, tensor.hi, request.hi);
    if tensor > block {
        return Err(p.err("tensor must not exceed block"));
    }
    let count = block / tensor;
    p.check_events(2 * count + 3)?;
    let mut b = Builder::default();
    let big = b.alloc(block);
    b.free(big);
    let parts: Vec<u32> = (0..count).map(|_| b.alloc(tensor)).collect();
    for &a in parts.iter().step_by(2) {
        b.free(a);
    }
    b.alloc(request);
    Ok(b.finish())
}

#[allow(clippy::many_single_char_names)]
fn churn(spec: &str, body: &str) -> Result<Trace, WorkloadError> {
    let p = Params::parse(spec, body, &["events", "live", "size", "streams", "seed"])?;
    let events = p.one("events", 1_000_000, 1, MAX_EVENTS)?;
    let live_target = p.one("live", 1000, 1, 1 << 24)?;
    let size = p.size_range(
        "size",
        Range {
            lo: 512,
            hi: 64 << 20,
        },
        1,
        1 << 40,
    )?;
    let streams = p.one("streams", 1, 1, 64)?;
    let seed = p.one("seed", 1, 0, u64::MAX)?;
    let mut rng = Rng::new(seed);
    let mut b = Builder::default();
    let mut live: Vec<u32> = Vec::new();
    while (b.ops.len() as u64) < events {
        // Allocate with probability live_target / (live + live_target): the live count
        // hovers around the target.
        let n = live.len() as u64;
        if n == 0 || rng.uniform(0, n + live_target - 1) < live_target {
            let stream = rng.uniform(0, streams - 1);
            live.push(b.alloc_on(rng.log_uniform(size.lo, size.hi), stream));
        } else {
            let i = rng.uniform(0, n - 1) as usize;
            let a = live.swap_remove(i);
            b.free(a);
        }
    }
    Ok(b.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(t: &Trace) -> Vec<u64> {
        t.devices[0]
            .ops
            .iter()
            .filter_map(|o| match o.kind {
                OpKind::Alloc { size_bytes, .. } => Some(size_bytes),
                _ => None,
            })
            .collect()
    }

    /// Every free names an earlier alloc that is still live; completions follow deferred frees.
    fn well_formed(t: &Trace) {
        let ops = &t.devices[0].ops;
        let mut state = vec![0u8; ops.len()]; // 1 live, 2 pending, 3 freed
        for (k, o) in ops.iter().enumerate() {
            assert_eq!(o.event_index as usize, k);
            match o.kind {
                OpKind::Alloc { .. } => state[k] = 1,
                OpKind::Free { alloc, deferred } => {
                    assert_eq!(state[alloc as usize], 1, "op {k} frees a dead alloc");
                    state[alloc as usize] = if deferred { 2 } else { 3 };
                }
                OpKind::CompleteFree { alloc } => {
                    assert_eq!(state[alloc as usize], 2, "op {k} completes no pending free");
                    state[alloc as usize] = 3;
                }
                _ => {}
            }
        }
    }

    #[test]
    #[allow(clippy::many_single_char_names)]
    fn the_same_spec_gives_the_same_trace_and_the_seed_changes_it() {
        for spec in [
            "train:steps=5",
            "kvcache:tokens=20,requests=3,prompt=10..50,tokens=5..30",
            "churn:events=5000",
            "oom-story",
        ] {
            let a = generate(spec).unwrap();
            let b = generate(spec).unwrap();
            assert_eq!(a.devices[0].ops, b.devices[0].ops, "{spec}");
            well_formed(&a);
        }
        let a = generate("train:steps=5,seed=1").unwrap();
        let b = generate("train:steps=5,seed=2").unwrap();
        assert_ne!(sizes(&a), sizes(&b));
    }

    #[test]
    fn train_shapes_vary_within_their_ranges() {
        let t =
            generate("train:steps=30,batch=2..4,seq=100..200,layers=2,hidden=64,vocab=10").unwrap();
        // The embedding output is the third alloc of each step: n·h·2 bytes.
        let widths: std::collections::BTreeSet<u64> = sizes(&t)
            .into_iter()
            .filter(|&s| s % (64 * 2) == 0 && s / 128 >= 200 && s / 128 <= 800)
            .collect();
        assert!(widths.len() > 5, "batch × seq varies: {widths:?}");
        let with_comm = generate("train:steps=2,layers=2,hidden=64,comm=1").unwrap();
        well_formed(&with_comm);
        assert!(
            with_comm.devices[0]
                .ops
                .iter()
                .any(|o| matches!(o.kind, OpKind::Alloc { stream: 1, .. }))
        );
    }

    #[test]
    fn oom_story_matches_the_recorded_one() {
        let t = generate("oom-story").unwrap();
        let s = sizes(&t);
        assert_eq!(s[0], 2 << 30);
        assert_eq!(s.len(), 1 + 11 + 1);
        assert!(s[1..12].iter().all(|&x| x == 180 << 20));
        assert_eq!(s[12], 400 << 20);
        let frees = t.devices[0]
            .ops
            .iter()
            .filter(|o| matches!(o.kind, OpKind::Free { .. }))
            .count();
        assert_eq!(frees, 1 + 6);
    }

    #[test]
    fn kvcache_reaches_a_million_events() {
        let t = generate("kvcache:tokens=3000").unwrap();
        assert!(t.devices[0].events >= 1_000_000, "{}", t.devices[0].events);
        well_formed(&t);
    }

    #[test]
    fn bad_specs_are_rejected_with_the_reason() {
        let e = |s: &str| generate(s).unwrap_err().to_string();
        assert!(e("nope").contains("unknown kind 'nope'"));
        assert!(e("train:steps=0").contains("steps must be within"));
        assert!(e("train:bogus=1").contains("unknown parameter 'bogus'"));
        assert!(e("train:batch=8..4").contains("empty"));
        assert!(e("train:steps").contains("expected key=value"));
        assert!(e("train:steps=1..3").contains("one value"));
        assert!(e("churn:size=1XB").contains("unknown unit"));
        assert!(e("kvcache:tokens=10000000,requests=100").contains("at most"));
        assert!(e("oom-story:tensor=3GiB").contains("must not exceed"));
        assert_eq!(
            generate("churn:events=10,size=1MiB..2MiB").unwrap().devices[0]
                .ops
                .len(),
            10
        );
    }

    #[test]
    fn uniform_draws_stay_in_range_and_cover_it() {
        let mut r = Rng::new(7);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let x = r.uniform(3, 7);
            assert!((3..=7).contains(&x));
            seen[(x - 3) as usize] = true;
            let y = r.log_uniform(512, 64 << 20);
            assert!((512..=64 << 20).contains(&y));
        }
        assert!(seen.iter().all(|&s| s));
    }
}
